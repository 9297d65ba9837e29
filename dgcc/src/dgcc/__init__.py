"""dgcc: a distributed in-memory transaction engine with dependency-graph concurrency control.

Public API: stored procedures as pieces (``Procedure``, ``Piece``), requests and outcomes,
tables, the protocol registry, and the exceptions of ``dgcc.errors`` (the network and log ones
live in ``dgcc.net`` and ``dgcc.wal``). See ``docs/architecture.md``.
"""

from dgcc import debug
from dgcc.api import (
    Outcome,
    Piece,
    PieceContext,
    Procedure,
    ProcedureRegistry,
    Protocol,
    Status,
    TxnRequest,
)
from dgcc.errors import (
    BadParams,
    BadPlan,
    BadRequest,
    ConfigError,
    DgccError,
    ProcedureError,
    UnknownProcedure,
)
from dgcc.protocols import PROTOCOLS, get_protocol
from dgcc.storage import Database, Index, Table

__all__ = [
    "PROTOCOLS",
    "BadParams",
    "BadPlan",
    "BadRequest",
    "ConfigError",
    "Database",
    "DgccError",
    "Index",
    "Outcome",
    "Piece",
    "PieceContext",
    "Procedure",
    "ProcedureError",
    "ProcedureRegistry",
    "Protocol",
    "Status",
    "Table",
    "TxnRequest",
    "UnknownProcedure",
    "debug",
    "get_protocol",
]
