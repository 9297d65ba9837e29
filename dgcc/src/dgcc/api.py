"""Stored procedures as pieces, transaction requests and outcomes, and the protocol interface.

A transaction is a registered procedure plus parameters. Before a batch runs, each procedure's
``plan`` turns its parameters into an ordered list of pieces (the DGCC model, see
docs/architecture.md): every piece declares the conflict keys it reads and writes, computed
from the parameters alone, so a protocol can order pieces without running them. Keys are opaque
hashables; a table maps each of its records to one (see ``storage.Table.conflict_key``), and a key
may stand for a coarse "virtual record" such as a district's whole order sequence.

The piece contract, checked when ``debug.check_invariants`` is on:
  * a piece touches only records whose conflict keys it declared (writes only ``writes`` keys);
  * a piece that may logic-abort does so before any write of its transaction, so an abort never
    exposes dirty data (protocols make every later writing piece wait for the decision);
  * a piece reads other pieces' outputs only through ``ctx.input(name)`` and names them in
    ``after`` (the logical edges of the dependency graph).
"""

from __future__ import annotations

import enum
import functools
import types
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from dgcc import debug
from dgcc.errors import (
    BadParams,
    BadPlan,
    BadRequest,
    ProcedureError,
    UnknownProcedure,
    brief,
    clip,
)
from dgcc.storage import Database, Index, ReadView, Table

__all__ = [
    "RETRY_PREFIX",
    "Outcome",
    "Piece",
    "PieceContext",
    "PlannedTxn",
    "Procedure",
    "ProcedureRegistry",
    "Protocol",
    "Status",
    "TxnRequest",
    "committed_outcome",
    "plan_batch",
    "raised",
    "run_piece",
]

Key = Hashable
Row = Mapping[str, Any]
_AS_LIST = {tuple: list}  # a type as the signature check compares it (``Procedure.signature``)


class LogicAbort(Exception):  # control flow inside the engine; never escapes it
    """Raised by ``PieceContext.abort``; the executor turns it into an ABORTED outcome."""

    def __init__(self, reason: str) -> None:
        reason = reason if type(reason) is str else str(reason)  # (an int, a tuple: its text)
        super().__init__(reason)
        self.reason = reason


class Status(enum.Enum):
    COMMITTED = "committed"
    ABORTED = "aborted"  # a logic abort decided by the procedure; nothing was written
    ERROR = "error"  # a bad request (never executed) or a procedure that raised


RETRY_PREFIX = "retry"  # an ABORTED reason starting so: concurrency control gave up, not logic


@dataclass(frozen=True, slots=True)
class TxnRequest:
    """One call: a procedure name and its parameters."""

    procedure: str
    params: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Outcome:
    status: Status
    result: Any = None
    reason: str = ""

    @property
    def committed(self) -> bool:
        return self.status is Status.COMMITTED

    @property
    def gave_up(self) -> bool:
        """A concurrency-control give-up (ABORTED, reason starting with ``RETRY_PREFIX``: undone
        after the protocol's retry budget ran out), not a logic abort; callers may resubmit."""
        return self.status is Status.ABORTED and self.reason.startswith(RETRY_PREFIX)


@dataclass(slots=True)  # not frozen: a frozen __init__ costs ~1 us per piece on the hot path
class Piece:
    """One action of a transaction: a function and the conflict keys it declares.

    Treated as immutable once planned; protocols only read it.
    """

    name: str
    run: Callable[[PieceContext], Any]
    reads: tuple[Key, ...] = ()
    writes: tuple[Key, ...] = ()
    after: tuple[str, ...] = ()
    may_abort: bool = False


@dataclass(frozen=True)
class Procedure:
    """A stored procedure.

    Args:
        name: the registry name clients call.
        params: parameter name -> expected type (``int`` accepts ints, ``float`` accepts ints
            and floats, ``list``/``tuple`` accept either sequence kind).
        plan: ``plan(params, view) -> pieces``; ``view`` is read-only state at the start of the
            batch, for reconnaissance of data-dependent keys. Raising ``BadParams`` rejects the
            call; any other exception fails it alike (an ERROR outcome naming the procedure
            and the exception) where one node plans the call, and stops the node where several
            do (``plan_batch``). It must be deterministic: every node that plans a call must
            reach the same pieces, or the same ``BadParams``.
        result: builds the client's result from the piece outputs (name -> value); by default
            the outputs dict itself.
        replay: ``replay(db, params)`` redoes the writes of a call that committed, straight on
            ``db`` at its serial position, with no plan, pieces or result: dependency-log
            recovery knows the decision from the log. It must leave the state the plan's pieces
            leave. None: recovery re-plans the call and runs its writing pieces.
    """

    name: str
    params: Mapping[str, type]
    plan: Callable[[Mapping[str, Any], ReadView], Sequence[Piece]]
    result: Callable[[dict[str, Any]], Any] | None = None
    replay: Callable[[Database, Mapping[str, Any]], None] | None = None
    # The parameter names and their types with tuple read as list (``_check_params``' fast
    # path compares a call's against them in one go).
    signature: tuple[tuple[str, ...], tuple[type, ...]] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ProcedureError(f"a procedure's name must be a non-empty str, got {self.name!r}")
        if not isinstance(self.params, Mapping):
            raise ProcedureError(f"{self.name}: params must map names to types")
        bad = {name: kind for name, kind in self.params.items()
               if not isinstance(kind, type | types.UnionType)}  # fmt: skip
        if bad or not all(isinstance(name, str) for name in self.params):
            raise ProcedureError(
                f"{self.name}: params must map str names to types (int, float, str, list, "
                f"int | None, ...), got {bad or dict(self.params)}"
            )
        kinds = tuple(self.params.values())
        signature = (tuple(self.params), tuple(map(_AS_LIST.get, kinds, kinds)))
        object.__setattr__(self, "signature", signature)


class ProcedureRegistry:
    """Procedures by name; a workload registers its own, and users add theirs."""

    def __init__(self, procedures: Sequence[Procedure] = ()) -> None:
        self._procedures: dict[str, Procedure] = {}
        for procedure in procedures:
            self.register(procedure)

    def register(self, procedure: Procedure) -> None:
        if procedure.name in self._procedures:
            raise ProcedureError(f"procedure {procedure.name!r} is already registered")
        self._procedures[procedure.name] = procedure

    def get(self, name: object) -> Procedure:
        procedure = self._procedures.get(name) if isinstance(name, str) else None
        if procedure is None:
            raise UnknownProcedure(name, list(self._procedures))
        return procedure

    def names(self) -> list[str]:
        return sorted(self._procedures)


def _check_params(procedure: Procedure, params: object) -> None:
    # Every call of every protocol is checked here: exact types and plain dicts skip the slow
    # paths (an ABC isinstance, per-name list building) that only a bad call needs.
    if type(params) is not dict and not isinstance(params, Mapping):
        raise BadParams(f"{procedure.name}: params must be a mapping, got {type(params).__name__}")
    types = procedure.params
    names, expected_kinds = procedure.signature
    if len(params) == len(names):
        try:
            kinds = tuple(map(type, map(params.__getitem__, names)))
        except KeyError:
            pass  # a missing name: named below
        else:
            if tuple(map(_AS_LIST.get, kinds, kinds)) == expected_kinds:
                return  # exact types (a tuple for a list): every call of a good client
    if len(params) != len(types) or not types.keys() <= params.keys():
        missing = [name for name in types if name not in params]
        extra = [name for name in params if name not in types]
        named = [f"missing params {missing}"] * bool(missing)
        named += [f"unexpected params {brief(extra)}"] * bool(extra)
        raise BadParams(f"{procedure.name}: {', '.join(named)}")
    for name, expected in types.items():
        value = params[name]
        kind = type(value)
        if kind is expected or (kind in _SEQUENCES and expected in _SEQUENCES):
            continue  # lists arrive as tuples off the wire: the common case, kept cheap
        if not _type_ok(value, expected):
            raise BadParams(
                f"{procedure.name}: param {name!r} must be "
                f"{getattr(expected, '__name__', expected)}, "
                f"got {type(value).__name__} {brief(value)}"
            )


_SEQUENCES = (list, tuple)  # either kind satisfies a list or tuple parameter


def _type_ok(value: object, expected: type) -> bool:
    if isinstance(value, bool) and expected is not bool:
        return False
    if expected is float:
        return isinstance(value, int | float)
    if expected in (list, tuple):
        return isinstance(value, list | tuple)
    return isinstance(value, expected)


@dataclass(slots=True)
class PlannedTxn:
    """A request turned into pieces, ready for a protocol to order and run."""

    index: int  # position in the batch = position in the serial order
    procedure: Procedure
    params: Mapping[str, Any]
    pieces: Sequence[Piece]
    outputs: dict[str, Any] = field(default_factory=dict)
    abort_reason: str | None = None
    error: str | None = None

    def outcome(self) -> Outcome:
        if self.error is not None:
            return Outcome(Status.ERROR, reason=self.error)
        if self.abort_reason is not None:
            return Outcome(Status.ABORTED, reason=self.abort_reason)
        # Outputs in piece order, whatever order a protocol ran the pieces in.
        outputs = self.outputs
        ordered = {p.name: outputs[p.name] for p in self.pieces if p.name in outputs}
        return committed_outcome(self.procedure, ordered)


def committed_outcome(procedure: Procedure, outputs: dict[str, Any]) -> Outcome:
    """A committed call's outcome: ``procedure.result(outputs)`` (the outputs themselves when
    it has no builder). A builder that raises makes the call's outcome an ERROR naming it, as
    a raising piece does (its writes stand)."""
    build = procedure.result
    if build is None:
        return Outcome(Status.COMMITTED, outputs)
    try:
        return Outcome(Status.COMMITTED, build(outputs))
    except Exception as error:
        return Outcome(Status.ERROR, reason=raised(procedure.name, "result", error))


def result_raised(outcome: Outcome) -> bool:
    """Whether ``outcome`` is ``committed_outcome``'s ERROR for a result builder that raised:
    the call committed (its writes stand) though it answers ERROR."""
    return outcome.status is Status.ERROR and ".result raised " in (outcome.reason or "")


def raised(name: str, part: str, error: Exception) -> str:
    """The reason of a call whose procedure's ``part`` (plan, result) raised ``error``."""
    return clip(f"{name}.{part} raised {type(error).__name__}: {error}")


def plan_batch(
    registry: ProcedureRegistry,
    db: Database,
    batch: Sequence[TxnRequest],
    shared: Callable[[int], bool] | None = None,
) -> list[PlannedTxn | Outcome]:
    """Plan every request against the state at the start of the batch.

    A request that cannot be planned (unknown procedure, bad params, malformed) becomes an ERROR
    outcome in its slot; the rest of the batch is unaffected. Every protocol plans this way, so
    reconnaissance sees the same state under each of them. A plan function that raises anything
    else fails its call alike, unless ``shared(i)``: request i is planned on several nodes, each
    against its own rows, and only a ``BadRequest`` is known to be every node's decision (the
    workload's contract); another exception there is raised as a ``ProcedureError`` (loud: a
    node must never commit its share of a call that another node failed).
    """
    view = db.read_view()
    planned: list[PlannedTxn | Outcome] = []
    for index, request in enumerate(batch):
        try:
            planned.append(_plan_one(registry, view, index, request))
        except BadRequest as error:
            planned.append(Outcome(Status.ERROR, reason=str(error)))
        except _PlanRaised as error:
            if shared is not None and shared(index):  # asked only of a plan that raised
                raise ProcedureError(f"{error} (a call planned on several nodes)") from error
            planned.append(Outcome(Status.ERROR, reason=str(error)))
    return planned


class _PlanRaised(Exception):
    """A plan function raised something other than BadRequest (its message names both)."""


def _plan_one(
    registry: ProcedureRegistry, view: ReadView, index: int, request: object
) -> PlannedTxn:
    if not isinstance(request, TxnRequest):
        raise BadRequest(
            f"malformed request {brief(request)}: expected TxnRequest(procedure, params)"
        )
    procedure = registry.get(request.procedure)
    _check_params(procedure, request.params)
    try:
        pieces = tuple(procedure.plan(request.params, view))
    except (BadRequest, MemoryError, RecursionError):  # the last two: this process's limits
        raise
    except Exception as error:  # a bug in the procedure: this call fails, as in ``run_piece``
        raise _PlanRaised(raised(procedure.name, "plan", error)) from error
    _check_plan(procedure, pieces)
    return PlannedTxn(index, procedure, request.params, pieces)


def _check_plan(procedure: Procedure, pieces: Sequence[Piece]) -> None:
    """Raise BadPlan unless the plan is one every protocol runs alike: pieces, unique piece
    names, ``after`` naming earlier pieces only, no piece that may abort after one that wrote
    (no protocol undoes a committed piece's write). Every call is checked (about 2 us for a
    TPC-C call): a bad plan would otherwise stall or half-apply DGCC's batch graph. The
    verdict depends on the pieces alone, so every node that plans a call reaches it."""
    seen: set[str] = set()
    add, wrote = seen.add, False
    bad = f"{procedure.name}.plan gave a bad plan: "
    for piece in pieces:
        if not isinstance(piece, Piece):
            raise BadPlan(f"{bad}{brief(piece)} is not a Piece")
        after = piece.after
        if after.__class__ is str:  # a name, not a sequence of names (checked per letter)
            raise BadPlan(f"{bad}piece {piece.name!r} has after={after!r}: a tuple of names")
        if after and not seen.issuperset(after):
            unknown = [name for name in after if name not in seen]
            raise BadPlan(
                f"{bad}piece {piece.name!r} comes after unknown, later or its own pieces {unknown}"
            )
        if wrote and piece.may_abort:
            raise BadPlan(f"{bad}piece {piece.name!r} may abort after an earlier piece wrote")
        if piece.writes:
            wrote = True
        name = piece.name
        if name in seen:
            raise BadPlan(f"{bad}duplicate piece name {name!r}")
        add(name)


class PieceContext:
    """What a running piece sees: its transaction's params and inputs, and the tables.

    Every access names a table and a primary key; with ``debug.check_invariants`` on, the
    record's conflict key must be one the piece declared, and rows come back read-only.
    """

    __slots__ = ("_db", "_piece", "_tables", "_txn", "_wrote")

    def __init__(self, db: Database, txn: PlannedTxn) -> None:
        self._db = db
        self._tables = db.tables  # every record access starts here
        self._txn = txn
        self._piece: Piece | None = None
        self._wrote = False

    @property
    def params(self) -> Mapping[str, Any]:
        return self._txn.params

    def input(self, piece_name: str) -> Any:
        """The output of an earlier piece of this transaction named in ``after``."""
        if debug.check_invariants:
            assert self._piece is not None
            if piece_name not in self._piece.after:
                raise ProcedureError(
                    f"piece {self._piece.name!r} reads {piece_name!r} without declaring it in after"
                )
        return self._txn.outputs[piece_name]

    def abort(self, reason: str) -> None:
        """Logic-abort the transaction; no write of it may have happened yet. A reason that is
        not text is taken as its ``str`` (every node and the log then carry the same text)."""
        if self._wrote:
            raise ProcedureError(f"logic abort {reason!r} after the transaction wrote")
        raise LogicAbort(reason)

    # -- record access -------------------------------------------------------------------

    def get(self, table: str, pk: Hashable) -> Mapping[str, Any] | None:
        if debug.check_invariants:
            t = self._tables[table]
            self._check_record(t, pk, write=False)
            row = t.rows.get(pk)
            return None if row is None else debug.frozen(row)
        return self._tables[table].rows.get(pk)

    def getter(self, table: str) -> Callable[[Hashable], Mapping[str, Any] | None]:
        """``get`` of one table as a function of the primary key alone, for pieces that read
        many rows of it: the table's own ``rows.get`` (one C call per row instead of a method
        call and a table lookup), unless invariant checks or a subclass's ``get`` must see
        each access."""
        if debug.check_invariants or type(self) is not PieceContext:  # checks or overrides
            return functools.partial(self.get, table)
        return self._tables[table].rows.get

    def inserter(self, table: str) -> Callable[[Hashable, dict[str, Any]], None]:
        """``insert`` into one table as a function of the primary key and row (see
        ``getter``); taking one counts as a write of the piece."""
        self._wrote = True
        if debug.check_invariants or type(self) is not PieceContext:  # checks or overrides
            return functools.partial(self.insert, table)
        return self._tables[table].insert

    def updater(self, table: str) -> Callable[[Hashable, Mapping[str, Any]], None]:
        """``update`` of one table as a function of the primary key and changes (see
        ``getter``); taking one counts as a write of the piece."""
        self._wrote = True
        if debug.check_invariants or type(self) is not PieceContext:  # checks or overrides
            return functools.partial(self.update, table)
        return self._tables[table].update

    def update(self, table: str, pk: Hashable, changes: Mapping[str, Any]) -> None:
        t = self._tables[table]
        if debug.check_invariants:
            self._check_record(t, pk, write=True)
            row = t.rows.get(pk)
            if row is not None:
                self._check_index_entries(t, pk, row, {**row, **changes})
        self._wrote = True
        t.update(pk, changes)

    def insert(self, table: str, pk: Hashable, row: dict[str, Any]) -> None:
        """Insert ``row`` under ``pk``: the dict becomes the table's own row (not copied, as
        this is every NewOrder's hot path), so the piece must neither change it later nor
        return it as an output."""
        t = self._tables[table]
        if debug.check_invariants:
            self._check_record(t, pk, write=True)
            self._check_index_entries(t, pk, None, row)
        self._wrote = True
        t.insert(pk, row)

    def delete(self, table: str, pk: Hashable) -> None:
        t = self._tables[table]
        if debug.check_invariants:
            self._check_record(t, pk, write=True)
            self._check_index_entries(t, pk, t.rows.get(pk), None)
        self._wrote = True
        t.delete(pk)

    def lookup(self, table: str, index: str, index_key: Hashable) -> list[Hashable]:
        """Primary keys under ``index_key`` in a secondary index, in key order.

        The caller must have declared the conflict keys of the records it then reads; the
        index itself is guarded by the conflict key ``(table, index, index_key)`` unless the
        table maps index entries to a coarser key (see ``Table.index_conflict_key``).
        """
        return self._index(table, index, index_key).lookup(index_key)

    def first(self, table: str, index: str, index_key: Hashable) -> Hashable | None:
        """The smallest primary key under ``index_key``, or None."""
        return self._index(table, index, index_key).first(index_key)

    def last(self, table: str, index: str, index_key: Hashable) -> Hashable | None:
        """The largest primary key under ``index_key``, or None."""
        return self._index(table, index, index_key).last(index_key)

    def _index(self, table: str, index: str, index_key: Hashable) -> Index:
        t = self._tables[table]
        if debug.check_invariants:
            self._check_declared(t.index_conflict_key(index, index_key), write=False)
        return t.indexes[index]

    def _check_index_entries(
        self, t: Table, pk: Hashable, before: Row | None, after: Row | None
    ) -> None:
        """A write that adds or removes a secondary-index entry writes that entry's conflict
        key: a piece that looks the index up there reads it, and no protocol orders the two
        unless the writer declares it too (the reader would see a phantom, or miss a row)."""
        for index in t.indexes.values():
            old = None if before is None else index.index_key(pk, before)
            new = None if after is None else index.index_key(pk, after)
            if before is not None and after is not None and old == new:
                continue  # the entry stays where it was
            for index_key, row in ((old, before), (new, after)):
                if row is not None:
                    self._check_declared(t.index_conflict_key(index.name, index_key), write=True)

    def _check_record(self, t: Table, pk: Hashable, *, write: bool) -> None:
        group = None if t.group_key is None else t.group_key(pk)
        self._check_declared(t.conflict_key(pk), write=write, group=group)

    def _check_declared(self, key: Key, *, write: bool, group: Key | None = None) -> None:
        """``key`` (or the ``group`` key covering it, see ``Table``) is declared for the access;
        a record touched under its own key needs its group key declared too."""
        piece = self._piece
        assert piece is not None
        declared = (*piece.reads, *piece.writes)
        allowed = piece.writes if write else declared
        if group is not None and group in allowed:
            return
        if key not in allowed:
            kind = "write" if write else "read"
            raise ProcedureError(
                f"piece {piece.name!r} of {self._txn.procedure.name} did a {kind} under "
                f"undeclared conflict key {key!r}"
            )
        if group is not None and group not in declared:
            raise ProcedureError(
                f"piece {piece.name!r} of {self._txn.procedure.name} declared {key!r} but not "
                f"its group key {group!r}, so no protocol orders it against a piece that "
                f"declares the whole group"
            )


def run_piece(ctx: PieceContext, txn: PlannedTxn, piece: Piece) -> None:
    """Run one piece of ``txn`` (never raises for abort or procedure failure).

    Once the transaction has aborted or failed, its remaining pieces are skipped; protocols
    still release their successors in the graph. A piece that aborts without ``may_abort``
    fails its transaction (ERROR naming it): no protocol ordered other pieces after its
    decision, so some may have run.
    """
    if txn.abort_reason is not None or txn.error is not None:
        return
    ctx._piece = piece
    try:
        txn.outputs[piece.name] = piece.run(ctx)
    except LogicAbort as abort:
        if piece.may_abort:
            txn.abort_reason = abort.reason
        else:  # no protocol waits for its decision: other pieces may have run, here or on peers
            txn.error = (
                f"{txn.procedure.name}.{piece.name} aborted ({abort.reason}) but is not declared "
                "may_abort=True: only a piece so declared may abort"
            )
    except Exception as error:  # a procedure bug: the transaction reports ERROR; which of its
        # other pieces already ran may differ between protocols (see protocols/dgcc.py)
        if debug.check_invariants and isinstance(error, ProcedureError):
            raise
        txn.error = raised(txn.procedure.name, piece.name, error)
    finally:
        ctx._piece = None


class Protocol(ABC):
    """A concurrency-control protocol: runs batches of requests against a database.

    Subclasses live one per module in ``dgcc.protocols`` and register under ``name``.
    """

    name: ClassVar[str]
    deterministic: ClassVar[bool]  # equal to the serial executor in batch order

    def __init__(self, db: Database, registry: ProcedureRegistry) -> None:
        self.db = db
        self.registry = registry

    @abstractmethod
    def run_batch(self, batch: Sequence[TxnRequest]) -> list[Outcome]:
        """Execute a batch; one outcome per request, in request order."""
