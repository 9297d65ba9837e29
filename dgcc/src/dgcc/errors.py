"""The dgcc exception tree (the network and log classes live beside the code raising them).

    DgccError
     ├── BadRequest           a client's call is wrong; only that transaction fails
     │    ├── UnknownProcedure
     │    └── BadParams
     ├── ConfigError          a setting, CLI flag or config file is wrong
     ├── ProcedureError       a procedure's definition breaks the piece contract (a bug in it)
     ├── NetError             dgcc.net: a transport failure or a peer breaking the wire protocol
     │    ├── FrameError      bytes off the wire are not a valid frame or message
     │    ├── HandshakeError  version, role or shared secret mismatch
     │    ├── ConnectionLost  the other side closed or reset the connection
     │    │    └── FrameRefused  a node refused a client's frame (its calls did not run)
     │    └── CallTimeout     no answer within the caller's timeout
     ├── WalCorrupt           dgcc.wal: a log or checkpoint damaged where no crash could leave it
     ├── RejoinError          dgcc.wal.rejoin: a restarted node cannot rejoin its running peers
     └── DrillFailure         dgcc.wal.trials: a recovered state broke a durability promise

``make_dir`` turns a folder a setting names but that cannot be one into a ConfigError.

A logic abort (an overdraft, TPC-C's invalid item) is an Outcome, never an exception; so is a
procedure whose plan or piece raises (an ERROR outcome for that call alone), except that with
``debug.check_invariants`` on a broken piece contract raises ProcedureError, and that a plan
raising for a call several cluster nodes plan stops the node (``dgcc.api.plan_batch``: a peer
may have planned it fine and committed its share).
"""

from __future__ import annotations

import errno
import reprlib
from pathlib import Path


class DgccError(Exception):
    """Base of every error dgcc raises on purpose."""


class BadRequest(DgccError):
    """A client request cannot be executed as sent."""


class UnknownProcedure(BadRequest):
    def __init__(self, name: object, known: list[str]) -> None:
        super().__init__(f"unknown procedure {brief(name)}; registered: {', '.join(sorted(known))}")
        self.name = name


class BadParams(BadRequest):
    """Parameters missing, unexpected, or of the wrong type."""


class BadPlan(BadRequest):
    """A procedure's plan breaks the piece rules (``api._check_plan``): the call fails alone,
    alike on every node that plans it (plans are deterministic)."""


class ConfigError(DgccError):
    """A setting is invalid; the message names the value and what is allowed."""


class ProcedureError(DgccError):
    """A procedure broke the piece contract (undeclared access, write before abort, ...)."""


def make_dir(path: Path, message: str) -> Path:
    """Create the folder ``path`` (with its parents) if it is missing; where it cannot be one
    (a file of that name, no permission), ConfigError with ``message`` formatted with ``path``
    (as a str) and ``why`` (the system's reason). ``path`` itself is returned."""
    try:
        if path.exists() and not path.is_dir():  # (mkdir would say "File exists")
            raise NotADirectoryError(errno.ENOTDIR, "Not a directory")
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        why = error.strerror or str(error)
        raise ConfigError(message.format(path=str(path), why=why)) from None
    return path


# Values off the wire can be nested deeper than Python's recursion limit or be megabytes long:
# a plain repr of one in an error message could raise RecursionError (stopping a node) or make
# a reason larger than the frame that carried the value. These bounds keep both in check.
_BRIEF = reprlib.Repr()
_BRIEF.maxlevel, _BRIEF.maxstring, _BRIEF.maxother, _BRIEF.maxlong = 3, 60, 60, 40
_BRIEF.maxlist = _BRIEF.maxtuple = _BRIEF.maxdict = _BRIEF.maxset = 6
REASON_CHARS_MAX = 1000  # the longest error reason a call's outcome carries


def brief(value: object, limit: int = 80) -> str:
    """A repr of ``value`` for an error message: at most 3 levels deep, 6 items a level and
    ``limit`` characters, whatever ``value`` holds."""
    try:
        text = _BRIEF.repr(value)
    except Exception:  # a repr that raises (an object off a buggy procedure)
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def clip(reason: str, limit: int = REASON_CHARS_MAX) -> str:
    """``reason`` cut to ``limit`` characters (marked), for an outcome or a log line."""
    return reason if len(reason) <= limit else f"{reason[: limit - 30]}... ({len(reason):,} chars)"
