"""YCSB as multi-key transactions (Cooper et al. 2010; the Deneva variant of Harding et al. 2017).

One table ``usertable`` of ``records`` rows with ``fields`` string fields and a ``counter``.
A transaction touches ``ops_per_txn`` distinct keys drawn from a zipfian distribution (Gray et
al., "Quickly generating billion-record synthetic databases", SIGMOD 1994); each access is a
read (returns the counter) or, with probability ``1 - read_ratio``, a read-modify-write that
increments the counter and rewrites one field. One piece per access, so pieces of one
transaction run independently under DGCC. Invariant: every record's counter equals the number
of committed increments of it, taken from the committed results passed to ``observe``.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Hashable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

from dgcc.api import Outcome, Piece, PieceContext, Procedure, ProcedureRegistry, TxnRequest
from dgcc.errors import BadParams, ConfigError, brief
from dgcc.storage import Database, ReadView, Table
from dgcc.workloads import Workload, register_workload

__all__ = ["YcsbWorkload", "ZipfianGenerator"]

TABLE = "usertable"
THETA_MAX = 0.99
YCSB_ROW_BYTES_BASE, YCSB_FIELD_BYTES = 64, 44  # measured: 10 fields, ~550 bytes a row
YCSB_POOL_VALUES, YCSB_STR_BYTES_BASE = 256, 49  # the values rows share; a str's own bytes
DISTINCT_DRAWS_MAX = 64  # zipf draws per key before falling back to the next unused key


class ZipfianGenerator:
    """Integers in ``[0, items)`` with P(i) close to 1 / (i + 1) ** theta / zeta(items, theta).

    Gray et al.'s constant-time approximation, as YCSB's own generator: ``zeta(items, theta)``
    is summed once, then each draw costs one uniform variate. Ranks 0 and 1 are drawn with their
    exact probabilities; later ranks approximately (at theta 0.99, rank 2 some 18% too often).
    ``theta == 0`` is uniform. Deterministic from ``seed``.

    Raises:
        ConfigError: items < 1, or theta outside [0, 0.99].
    """

    def __init__(self, items: int, theta: float, seed: int) -> None:
        if isinstance(items, bool) or not isinstance(items, int) or items < 1:
            raise ConfigError(f"zipfian items must be an int >= 1, got {items!r}")
        if isinstance(theta, bool) or not isinstance(theta, int | float):
            raise ConfigError(f"zipfian theta must be a number, got {theta!r}")
        if not 0.0 <= theta <= THETA_MAX:
            raise ConfigError(f"zipfian theta must be in [0, {THETA_MAX}], got {theta}")
        self.items = items
        self.theta = float(theta)
        self._random = random.Random(seed).random
        self.zeta_n = _zeta(items, self.theta)
        zeta_2 = _zeta(min(items, 2), self.theta)
        self._alpha = 1.0 / (1.0 - self.theta)
        self._half_pow_theta = 0.5**self.theta
        self._eta = (
            (1.0 - (2.0 / items) ** (1.0 - self.theta)) / (1.0 - zeta_2 / self.zeta_n)
            if items > 2
            else 1.0
        )

    def next(self) -> int:
        u = self._random()
        uz = u * self.zeta_n
        if uz < 1.0:
            return 0
        if uz < 1.0 + self._half_pow_theta:
            return min(1, self.items - 1)
        value = int(self.items * (self._eta * u - self._eta + 1.0) ** self._alpha)
        return min(value, self.items - 1)

    def probability(self, item: int) -> float:
        """The target distribution's probability of ``item`` (exact for the zipfian law;
        ``next`` draws ranks from 2 on only approximately so)."""
        return 1.0 / ((item + 1) ** self.theta * self.zeta_n)


def _zeta(items: int, theta: float) -> float:
    return math.fsum(1.0 / (i**theta) for i in range(1, items + 1))


@register_workload
class YcsbWorkload(Workload):
    """Multi-key YCSB transactions over one table.

    Args:
        records: rows in the table.
        fields: string fields per row (besides ``counter``).
        field_chars: length of each field's value.
        ops_per_txn: distinct keys per transaction.
        read_ratio: probability that an access is a plain read.
        theta: zipfian skew in [0, 0.99]; 0 is uniform. The request stream scatters the
            zipfian's ranks over the keys with a fixed permutation (rank r is key
            ``r * stride % records``, ``stride`` coprime to ``records`` near 0.618 of it), as
            YCSB scrambles its zipfian: the hot keys are spread over every range partition.

    Raises:
        ConfigError: an option of the wrong type or out of range.
    """

    name = "ycsb"

    def __init__(
        self,
        *,
        records: int = 100_000,
        fields: int = 10,
        field_chars: int = 10,
        ops_per_txn: int = 10,
        read_ratio: float = 0.5,
        theta: float = 0.0,
    ) -> None:
        for option, value, low in (
            ("records", records, 1),
            ("fields", fields, 1),
            ("field_chars", field_chars, 1),
            ("ops_per_txn", ops_per_txn, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"ycsb {option} must be an int >= {low}, got {value!r}")
        if ops_per_txn > records:
            raise ConfigError(f"ycsb ops_per_txn={ops_per_txn} exceeds records={records}")
        if isinstance(read_ratio, bool) or not isinstance(read_ratio, int | float):
            raise ConfigError(f"ycsb read_ratio must be a number, got {read_ratio!r}")
        if not 0.0 <= read_ratio <= 1.0:
            raise ConfigError(f"ycsb read_ratio must be in [0, 1], got {read_ratio}")
        if isinstance(theta, bool) or not isinstance(theta, int | float):
            raise ConfigError(f"ycsb theta must be a number, got {theta!r}")
        if not 0.0 <= theta <= THETA_MAX:
            raise ConfigError(f"ycsb theta must be in [0, {THETA_MAX}], got {theta}")
        self.records = records
        self.fields = fields
        self.field_chars = field_chars
        self.ops_per_txn = ops_per_txn
        self.read_ratio = float(read_ratio)
        self.theta = float(theta)
        self._field_names = tuple(f"field{i}" for i in range(fields))
        self._increments: Counter[int] = Counter()

    def describe(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "fields": self.fields,
            "field_chars": self.field_chars,
            "ops_per_txn": self.ops_per_txn,
            "read_ratio": self.read_ratio,
            "theta": self.theta,
        }

    def schema(self) -> Database:
        return Database((Table(TABLE),))

    def data_bytes(self) -> tuple[int, str]:
        # A row is a dict of its fields and a counter; field values share a pool of strings.
        row_bytes = YCSB_ROW_BYTES_BASE + YCSB_FIELD_BYTES * (len(self._field_names) + 1)
        pool_bytes = YCSB_POOL_VALUES * (YCSB_STR_BYTES_BASE + self.field_chars)  # shared values
        return (
            self.records * row_bytes + pool_bytes,
            f"records={self.records}, field_chars={self.field_chars}",
        )

    def build(self, seed: int) -> Database:
        self.check_fits_memory()
        rng = random.Random(seed)
        alphabet = "abcdefghijklmnopqrstuvwxyz"
        # Fields share a pool of values: rows are independent dicts, the strings need not be.
        pool = ["".join(rng.choices(alphabet, k=self.field_chars)) for _ in range(YCSB_POOL_VALUES)]
        db = self.schema()
        rows = db[TABLE].rows
        names = self._field_names
        for pk in range(self.records):
            row: dict[str, Any] = {name: pool[rng.randrange(YCSB_POOL_VALUES)] for name in names}
            row["counter"] = 0
            rows[pk] = row
        self._increments = Counter()
        return db

    def registry(self) -> ProcedureRegistry:
        return ProcedureRegistry(
            [Procedure("ycsb_txn", {"keys": list, "rmw": list}, self._plan, _ycsb_result)]
        )

    def _plan(self, params: Mapping[str, Any], view: ReadView) -> list[Piece]:
        keys, rmw = params["keys"], params["rmw"]
        count = len(keys)
        if count != len(rmw) or not count:
            raise BadParams(
                f"ycsb_txn: keys and rmw must be equally long and non-empty: {brief(params)}"
            )
        records, fields = self.records, self._field_names
        field_count = len(fields)
        read_names, write_names = _piece_names(count)
        pieces: list[Piece] = []
        append = pieces.append
        # Every call of every protocol plans here: positional Piece(name, run, reads, writes),
        # names built once per position, no enumerate.
        for position, key, write in zip(range(count), keys, rmw):
            if type(key) is not int or not 0 <= key < records:  # bool is not int here
                raise BadParams(f"ycsb_txn: key must be an int in [0, {records}), got {brief(key)}")
            if write is True:
                run = partial(_read_modify_write, key, fields[position % field_count])
                append(Piece(write_names[position], run, (), ((TABLE, key),)))
            elif write is False:
                append(Piece(read_names[position], partial(_read, key), ((TABLE, key),)))
            else:
                raise BadParams(f"ycsb_txn: rmw flags must be bools, got {brief(write)}")
        return pieces

    def requests(self, seed: int) -> Iterator[TxnRequest]:
        rng = random.Random(seed)
        zipf = ZipfianGenerator(self.records, self.theta, rng.randrange(2**63))
        read_ratio, ops, records = self.read_ratio, self.ops_per_txn, self.records
        stride = scatter_stride(records)
        while True:
            keys = [rank * stride % records for rank in _distinct_keys(zipf, ops, records)]
            rmw = [rng.random() >= read_ratio for _ in range(ops)]
            yield TxnRequest("ycsb_txn", {"keys": keys, "rmw": rmw})

    def observe(self, batch: Sequence[object], outcomes: Sequence[Outcome]) -> None:
        """Record the increments of committed transactions, for ``check``."""
        increments = self._increments
        for outcome in outcomes:
            if outcome.committed:
                increments.update(outcome.result["incremented"])

    def check(self, db: Database) -> list[str]:
        problems = []
        rows = db[TABLE].rows
        if len(rows) != self.records:
            problems.append(f"usertable has {len(rows)} rows, expected {self.records}")
        total = 0
        for pk, row in rows.items():
            counter = row["counter"]
            total += counter
            if counter != self._increments.get(pk, 0) and len(problems) < 10:
                problems.append(
                    f"record {pk}: counter {counter} != {self._increments.get(pk, 0)} committed "
                    "increments"
                )
        expected = sum(self._increments.values())
        if total != expected:
            problems.append(f"sum of counters {total} != {expected} committed increments")
        return problems

    def check_state(self, db: Database) -> list[str]:
        """Row count and non-negative integer counters (their sum needs the observed history)."""
        rows = db[TABLE].rows
        problems = []
        if len(rows) != self.records:
            problems.append(f"usertable has {len(rows)} rows, expected {self.records}")
        bad = [
            pk for pk, row in rows.items() if type(row["counter"]) is not int or row["counter"] < 0
        ]
        if bad:
            problems.append(f"records with a bad counter: {bad[:10]}")
        return problems

    def partition_of(self, key: Hashable, partitions: int) -> int:
        """Range partitioning: record ``pk`` lives on partition ``pk * partitions // records``."""
        if not isinstance(key, tuple) or len(key) != 2 or key[0] != TABLE:
            raise ConfigError(f"ycsb: not a usertable conflict key: {key!r}")
        return key[1] * partitions // self.records

    def route_keys(self, procedure: str, params: Mapping[str, Any]) -> list[Hashable] | None:
        """Every record key the transaction reads or writes."""
        if procedure != "ycsb_txn":
            return None
        return [(TABLE, key) for key in params["keys"]]

    def route_partitions(
        self, procedure: str, params: Mapping[str, Any], partitions: int
    ) -> set[int] | None:
        """The partitions of ``route_keys`` by arithmetic (``partition_of``'s range map)."""
        if procedure != "ycsb_txn":
            return None
        keys, records = params["keys"], self.records
        if not keys:
            return set()
        low, high = min(keys) * partitions // records, max(keys) * partitions // records
        if not 0 <= low <= high < partitions:
            raise ValueError(f"ycsb_txn: a key outside [0, {records}) in {keys!r}")
        if high - low <= 1:  # ranges are ordered: nothing lies between the first and the last
            return {low, high}
        return {key * partitions // records for key in keys}


def scatter_stride(records: int) -> int:
    """The multiplier of ``YcsbWorkload.requests``' key permutation: the first integer from
    ``records`` times the golden ratio's fraction up that is coprime to ``records``."""
    stride = max(1, round(records * 0.6180339887498949))
    while math.gcd(stride, records) != 1:
        stride += 1
    return stride


def _distinct_keys(zipf: ZipfianGenerator, count: int, records: int) -> list[int]:
    keys: list[int] = []
    seen: set[int] = set()
    for _ in range(count):
        for _ in range(DISTINCT_DRAWS_MAX):
            key = zipf.next()
            if key not in seen:
                break
        else:  # extremely skewed and tiny tables only; stays deterministic
            key = next(k for k in range(records) if k not in seen)
        seen.add(key)
        keys.append(key)
    return keys


def _read(key: int, ctx: PieceContext) -> tuple[int, int]:
    return key, ctx.get(TABLE, key)["counter"]


def _read_modify_write(key: int, field: str, ctx: PieceContext) -> tuple[int, int]:
    counter = ctx.get(TABLE, key)["counter"] + 1
    ctx.update(TABLE, key, {"counter": counter, field: f"v{counter}"})
    return key, counter


def _piece_names(count: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The piece names of positions ``< count``: ``r<p>`` for a read, ``w<p>`` for a RMW."""
    global _NAMES  # grown by rebinding a new pair: a caller always sees a consistent one
    names = _NAMES
    if len(names[0]) < count:
        size = max(count, 2 * len(names[0]), 16)
        names = _NAMES = (
            tuple(f"r{position}" for position in range(size)),
            tuple(f"w{position}" for position in range(size)),
        )
    return names


_NAMES: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
_ABSENT = object()


def _ycsb_result(outputs: dict[str, Any]) -> dict[str, Any]:
    """Keys read (with their counters) and keys incremented (with their new counters), in
    access order: ``{"read": [(key, counter)], "incremented": [key], "counters": [(key,
    counter)]}``.

    Looked up by position: a protocol may fill ``outputs`` in any topological order, and a
    committed call has one output per position (``r<p>`` or ``w<p>``).
    """
    read_names, write_names = _piece_names(len(outputs))
    get = outputs.get
    read, written = [], []
    for position in range(len(outputs)):
        value = get(read_names[position], _ABSENT)
        if value is _ABSENT:
            written.append(outputs[write_names[position]])
        else:
            read.append(value)
    return {"read": read, "incremented": [key for key, _ in written], "counters": written}
