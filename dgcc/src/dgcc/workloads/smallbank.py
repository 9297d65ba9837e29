"""Smallbank (Cahill et al., "Serializable isolation for snapshot databases", SIGMOD 2008).

Three tables keyed by customer id: ``accounts`` (name), ``savings`` and ``checking`` (balance
in integer cents, so money is exact). The six transactions at the OLTP-Bench mix: Amalgamate
15%, Balance 15%, DepositChecking 15%, SendPayment 25%, TransactSavings 15%, WriteCheck 15%.
Logic aborts: a negative deposit, savings that would go negative, a payment beyond the payer's
checking balance. A hotspot option sends ``hot_fraction`` of accesses to ``hot_accounts``
customers. Invariant (money conservation): total money = initial total + the external flows
(deposits in, checks out) reported by committed transactions and fed to ``observe``.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Any

from dgcc.api import Outcome, Piece, PieceContext, Procedure, ProcedureRegistry, TxnRequest
from dgcc.errors import BadParams, ConfigError, brief
from dgcc.storage import Database, ReadView, Table
from dgcc.workloads import Workload, register_workload

__all__ = ["SmallbankWorkload"]

BALANCE_MIN_CENTS = 10_000
BALANCE_MAX_CENTS = 50_000
AMOUNT_MAX_CENTS = 5_000
AMOUNT_LIMIT_CENTS = 10**12  # the largest amount a call may move (the generator's: above)
OVERDRAFT_PENALTY_CENTS = 100
HOT_ACCOUNTS_DEFAULT = 100
SMALLBANK_ACCOUNT_BYTES = 870  # measured: three rows (accounts, savings, checking) a customer
MIX = (
    ("amalgamate", 15),
    ("balance", 15),
    ("deposit_checking", 15),
    ("send_payment", 25),
    ("transact_savings", 15),
    ("write_check", 15),
)
_PROCEDURES = frozenset(name for name, _ in MIX)
TWO_CUSTOMERS = ("amalgamate", "send_payment")  # the calls that name a second customer
TWO_CUSTOMER_SHARE = sum(w for n, w in MIX if n in TWO_CUSTOMERS) / sum(w for _, w in MIX)


def _savings(customer: int) -> tuple[str, int]:
    return ("savings", customer)


def _checking(customer: int) -> tuple[str, int]:
    return ("checking", customer)


@register_workload
class SmallbankWorkload(Workload):
    """The Smallbank banking benchmark.

    Args:
        accounts: number of customers.
        hot_accounts: size of the hotspot (customers ``j * accounts // hot_accounts`` for
            ``j < hot_accounts``: spread evenly over the customers, so every range partition
            of a cluster holds its share of it); by default 100, or every customer when there
            are fewer.
        hot_fraction: probability that a customer is drawn from the hotspot; 0 is uniform.

    Raises:
        ConfigError: an option of the wrong type or out of range.
    """

    name = "smallbank"

    def __init__(
        self,
        *,
        accounts: int = 10_000,
        hot_accounts: int | None = None,
        hot_fraction: float = 0.0,
    ) -> None:
        if isinstance(accounts, bool) or not isinstance(accounts, int) or accounts < 2:
            raise ConfigError(f"smallbank accounts must be an int >= 2, got {accounts!r}")
        if hot_accounts is None:
            hot_accounts = min(HOT_ACCOUNTS_DEFAULT, accounts)
        if isinstance(hot_accounts, bool) or not isinstance(hot_accounts, int):
            raise ConfigError(f"smallbank hot_accounts must be an int, got {hot_accounts!r}")
        if not 2 <= hot_accounts <= accounts:
            raise ConfigError(
                f"smallbank hot_accounts must be in [2, accounts={accounts}], got {hot_accounts}"
            )
        if isinstance(hot_fraction, bool) or not isinstance(hot_fraction, int | float):
            raise ConfigError(f"smallbank hot_fraction must be a number, got {hot_fraction!r}")
        if not 0.0 <= hot_fraction <= 1.0:
            raise ConfigError(f"smallbank hot_fraction must be in [0, 1], got {hot_fraction}")
        self.accounts = accounts
        self.hot_accounts = hot_accounts
        self.hot_fraction = float(hot_fraction)
        self._initial_cents = 0
        self._flow_cents = 0

    def describe(self) -> dict[str, Any]:
        return {
            "accounts": self.accounts,
            "hot_accounts": self.hot_accounts,
            "hot_fraction": self.hot_fraction,
        }

    def schema(self) -> Database:
        return Database((Table("accounts"), Table("savings"), Table("checking")))

    def data_bytes(self) -> tuple[int, str]:
        return self.accounts * SMALLBANK_ACCOUNT_BYTES, f"accounts={self.accounts}"

    def build(self, seed: int) -> Database:
        self.check_fits_memory()
        rng = random.Random(seed)
        db = self.schema()
        accounts, savings, checking = db["accounts"], db["savings"], db["checking"]
        for customer in range(self.accounts):
            accounts.rows[customer] = {"name": f"customer{customer:08d}"}
            savings.rows[customer] = {"bal": rng.randint(BALANCE_MIN_CENTS, BALANCE_MAX_CENTS)}
            checking.rows[customer] = {"bal": rng.randint(BALANCE_MIN_CENTS, BALANCE_MAX_CENTS)}
        self._initial_cents = _total_cents(db)
        self._flow_cents = 0
        return db

    def registry(self) -> ProcedureRegistry:
        one = {"customer": int}
        two = {"source": int, "target": int}
        return ProcedureRegistry(
            [
                Procedure("amalgamate", two, self._checked(_plan_amalgamate), _flow_result),
                Procedure("balance", one, self._checked(_plan_balance), _balance_result),
                Procedure(
                    "deposit_checking",
                    {**one, "amount": int},
                    self._checked(_plan_deposit_checking),
                    _flow_result,
                ),
                Procedure(
                    "send_payment",
                    {**two, "amount": int},
                    self._checked(_plan_send_payment),
                    _flow_result,
                ),
                Procedure(
                    "transact_savings",
                    {**one, "amount": int},
                    self._checked(_plan_transact_savings),
                    _flow_result,
                ),
                Procedure(
                    "write_check",
                    {**one, "amount": int},
                    self._checked(_plan_write_check),
                    _flow_result,
                ),
            ]
        )

    def _checked(self, plan):
        """Wrap a plan so unknown customers are rejected as bad params before planning."""
        accounts = self.accounts

        def checked_plan(params: Mapping[str, Any], view: ReadView) -> list[Piece]:
            for name in ("customer", "source", "target"):
                if name in params and not 0 <= params[name] < accounts:
                    raise BadParams(f"smallbank: unknown {name} {brief(params[name])}")
            if "amount" in params and not -AMOUNT_LIMIT_CENTS <= params["amount"] <= (
                AMOUNT_LIMIT_CENTS
            ):  # balances are 64-bit on the wire and in logs: keep sums far from that
                raise BadParams(
                    f"smallbank: amount={brief(params['amount'])} outside "
                    f"-{AMOUNT_LIMIT_CENTS:,}..{AMOUNT_LIMIT_CENTS:,} cents"
                )
            return plan(params)

        return checked_plan

    def requests(self, seed: int) -> Iterator[TxnRequest]:
        rng = random.Random(seed)
        names = [name for name, _ in MIX]
        weights = [weight for _, weight in MIX]
        while True:
            (name,) = rng.choices(names, weights)
            first = self.draw_customer(rng)
            if name in TWO_CUSTOMERS:
                second = self.draw_customer(rng)
                while second == first:
                    second = self.draw_customer(rng)
                params: dict[str, int] = {"source": first, "target": second}
                if name == "send_payment":
                    params["amount"] = rng.randint(1, AMOUNT_MAX_CENTS)
            elif name == "balance":
                params = {"customer": first}
            elif name == "transact_savings":
                amount = rng.randint(-AMOUNT_MAX_CENTS, AMOUNT_MAX_CENTS)
                params = {"customer": first, "amount": amount}
            else:
                params = {"customer": first, "amount": rng.randint(1, AMOUNT_MAX_CENTS)}
            yield TxnRequest(name, params)

    def draw_customer(self, rng: random.Random) -> int:
        """One customer, as the mix draws them (the hotspot with ``hot_fraction``)."""
        if self.hot_fraction and rng.random() < self.hot_fraction:
            return self.hot_customer(rng.randrange(self.hot_accounts))
        return rng.randrange(self.accounts)

    def hot_customer(self, j: int) -> int:
        """The customer that is the hotspot's ``j``-th (see ``hot_accounts``)."""
        return j * self.accounts // self.hot_accounts

    def observe(self, batch: Sequence[object], outcomes: Sequence[Outcome]) -> None:
        """Add the external money flows of committed transactions, for ``check``."""
        for outcome in outcomes:
            if outcome.committed:
                self._flow_cents += outcome.result["flow_cents"]

    def check(self, db: Database) -> list[str]:
        problems = self.check_state(db)
        total = _total_cents(db)
        expected = self._initial_cents + self._flow_cents
        if total != expected:
            problems.append(
                f"money not conserved: total {total} cents != initial {self._initial_cents} "
                f"+ committed flows {self._flow_cents}"
            )
        return problems

    def check_state(self, db: Database) -> list[str]:
        """Row counts and no negative savings (conservation needs the observed money flows)."""
        problems = []
        for table in ("accounts", "savings", "checking"):
            if len(db[table]) != self.accounts:
                problems.append(f"{table} has {len(db[table])} rows, expected {self.accounts}")
        negative = [pk for pk, row in db["savings"].items() if row["bal"] < 0]
        if negative:
            problems.append(f"negative savings for customers {negative[:10]}")
        return problems

    def partition_of(self, key: Hashable, partitions: int) -> int:
        """By customer range: customer ``c`` lives on partition ``c * partitions // accounts``."""
        if not isinstance(key, tuple) or len(key) != 2 or not isinstance(key[1], int):
            raise ConfigError(f"smallbank: not a customer conflict key: {key!r}")
        return key[1] * partitions // self.accounts

    def route_keys(self, procedure: str, params: Mapping[str, Any]) -> list[Hashable] | None:
        """The customers a call names (one, or source and target)."""
        if procedure not in _PROCEDURES:
            return None
        return [_checking(params[n]) for n in ("customer", "source", "target") if n in params]


def _total_cents(db: Database) -> int:
    return sum(row["bal"] for row in db["savings"].rows.values()) + sum(
        row["bal"] for row in db["checking"].rows.values()
    )


def _flow_result(outputs: dict[str, Any]) -> dict[str, Any]:
    """The money that entered (positive) or left (negative) the bank, in cents."""
    return {"flow_cents": sum(value for name, value in outputs.items() if name.startswith("flow"))}


def _balance_result(outputs: dict[str, Any]) -> dict[str, Any]:
    return {"balance_cents": outputs["savings"] + outputs["checking"], "flow_cents": 0}


# -- the six procedures, as pieces -------------------------------------------------------------


def _plan_balance(params: Mapping[str, Any]) -> list[Piece]:
    customer = params["customer"]

    def read_savings(ctx: PieceContext) -> int:
        return ctx.get("savings", customer)["bal"]

    def read_checking(ctx: PieceContext) -> int:
        return ctx.get("checking", customer)["bal"]

    return [
        Piece("savings", read_savings, reads=(_savings(customer),)),
        Piece("checking", read_checking, reads=(_checking(customer),)),
    ]


def _plan_deposit_checking(params: Mapping[str, Any]) -> list[Piece]:
    customer, amount = params["customer"], params["amount"]

    def deposit(ctx: PieceContext) -> int:
        if amount < 0:
            ctx.abort("negative deposit")
        balance = ctx.get("checking", customer)["bal"]
        ctx.update("checking", customer, {"bal": balance + amount})
        return amount

    return [Piece("flow_in", deposit, writes=(_checking(customer),), may_abort=True)]


def _plan_transact_savings(params: Mapping[str, Any]) -> list[Piece]:
    customer, amount = params["customer"], params["amount"]

    def transact(ctx: PieceContext) -> int:
        balance = ctx.get("savings", customer)["bal"] + amount
        if balance < 0:
            ctx.abort("savings would go negative")
        ctx.update("savings", customer, {"bal": balance})
        return amount

    return [Piece("flow", transact, writes=(_savings(customer),), may_abort=True)]


def _plan_write_check(params: Mapping[str, Any]) -> list[Piece]:
    customer, amount = params["customer"], params["amount"]

    def read_savings(ctx: PieceContext) -> int:
        return ctx.get("savings", customer)["bal"]

    def cash_check(ctx: PieceContext) -> int:
        checking = ctx.get("checking", customer)["bal"]
        overdrawn = checking + ctx.input("savings") < amount
        debit = amount + OVERDRAFT_PENALTY_CENTS if overdrawn else amount
        ctx.update("checking", customer, {"bal": checking - debit})
        return -debit

    return [
        Piece("savings", read_savings, reads=(_savings(customer),)),
        Piece("flow_out", cash_check, writes=(_checking(customer),), after=("savings",)),
    ]


def _plan_amalgamate(params: Mapping[str, Any]) -> list[Piece]:
    source, target = params["source"], params["target"]

    def empty(table: str):
        def take_all(ctx: PieceContext) -> int:
            balance = ctx.get(table, source)["bal"]
            ctx.update(table, source, {"bal": 0})
            return balance

        return take_all

    def credit(ctx: PieceContext) -> int:
        balance = ctx.get("checking", target)["bal"]
        moved = ctx.input("savings") + ctx.input("checking")
        ctx.update("checking", target, {"bal": balance + moved})
        return 0

    return [
        Piece("savings", empty("savings"), writes=(_savings(source),)),
        Piece("checking", empty("checking"), writes=(_checking(source),)),
        Piece("credit", credit, writes=(_checking(target),), after=("savings", "checking")),
    ]


def _plan_send_payment(params: Mapping[str, Any]) -> list[Piece]:
    source, target, amount = params["source"], params["target"], params["amount"]
    if amount <= 0:
        raise BadParams(f"send_payment: amount must be positive, got {amount}")

    def check_funds(ctx: PieceContext) -> int:
        balance = ctx.get("checking", source)["bal"]
        if balance < amount:
            ctx.abort("insufficient funds")
        return balance

    def debit(ctx: PieceContext) -> int:
        balance = ctx.get("checking", source)["bal"]
        ctx.update("checking", source, {"bal": balance - amount})
        return 0

    def credit(ctx: PieceContext) -> int:
        balance = ctx.get("checking", target)["bal"]
        ctx.update("checking", target, {"bal": balance + amount})
        return 0

    return [
        Piece("check", check_funds, reads=(_checking(source),), may_abort=True),
        Piece("debit", debit, writes=(_checking(source),)),
        Piece("credit", credit, writes=(_checking(target),)),
    ]
