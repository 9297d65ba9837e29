"""dgcc: a distributed in-memory transaction engine with dependency-graph concurrency control.

Public API: stored procedures as pieces (``Procedure``, ``Piece``), requests and outcomes,
tables, and the protocol registry. See ``docs/architecture.md``.
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
from dgcc.errors import BadParams, BadRequest, ConfigError, DgccError, ProcedureError
from dgcc.protocols import PROTOCOLS, get_protocol
from dgcc.storage import Database, Index, Table

__all__ = [
    "PROTOCOLS",
    "BadParams",
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
    "debug",
    "get_protocol",
]
