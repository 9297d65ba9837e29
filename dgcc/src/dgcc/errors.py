"""The dgcc exception tree.

    DgccError
     ├── BadRequest           a client's call is wrong; only that transaction fails
     │    ├── UnknownProcedure
     │    └── BadParams
     ├── ConfigError          a setting, CLI flag or config file is wrong
     └── ProcedureError       a procedure's definition breaks the piece contract (a bug in it)

A logic abort (an overdraft, TPC-C's invalid item) is an Outcome, never an exception.
"""


class DgccError(Exception):
    """Base of every error dgcc raises on purpose."""


class BadRequest(DgccError):
    """A client request cannot be executed as sent."""


class UnknownProcedure(BadRequest):
    def __init__(self, name: object, known: list[str]) -> None:
        super().__init__(f"unknown procedure {name!r}; registered: {', '.join(sorted(known))}")
        self.name = name


class BadParams(BadRequest):
    """Parameters missing, unexpected, or of the wrong type."""


class ConfigError(DgccError):
    """A setting is invalid; the message names the value and what is allowed."""


class ProcedureError(DgccError):
    """A procedure broke the piece contract (undeclared access, write before abort, ...)."""
