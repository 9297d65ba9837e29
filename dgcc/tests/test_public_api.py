"""The dgcc package's public API: ``__all__`` lists exactly the public names, all importable.

Method: compare ``__all__`` of the package and its public modules with what they define, so an
export cannot be added or dropped by accident.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

import dgcc

EXPECTED = {
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
    "UnknownProcedure",
    "get_protocol",
}


def test_package_all_is_exactly_the_public_api() -> None:
    assert set(dgcc.__all__) >= EXPECTED
    assert len(dgcc.__all__) == len(set(dgcc.__all__))
    for name in dgcc.__all__:
        assert getattr(dgcc, name) is not None
    # Every public non-module attribute of the package is exported on purpose.
    public = {
        name
        for name in dir(dgcc)
        if not name.startswith("_") and not inspect.ismodule(getattr(dgcc, name))
    }
    assert public <= set(dgcc.__all__), public - set(dgcc.__all__)


def test_package_exports_every_core_exception() -> None:
    import dgcc.errors

    defined = {
        name
        for name, value in vars(dgcc.errors).items()
        if isinstance(value, type) and issubclass(value, Exception)
    }
    assert defined <= set(dgcc.__all__), defined - set(dgcc.__all__)


@pytest.mark.parametrize(
    "module_name",
    [
        "dgcc.api",
        "dgcc.storage",
        "dgcc.protocols",
        "dgcc.protocols.dgcc",
        "dgcc.workloads",
        "dgcc.workloads.ycsb",
        "dgcc.workloads.smallbank",
        "dgcc.bench",
        "dgcc.cli",
    ],
)
def test_module_all_names_exist(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert module.__all__, module_name
    for name in module.__all__:
        assert hasattr(module, name), f"{module_name}.__all__ lists missing {name}"
        assert not name.startswith("_")


def test_protocol_registry_names_match_modules() -> None:
    for name, cls in dgcc.PROTOCOLS.items():
        assert cls.name == name
        assert cls.__module__ == f"dgcc.protocols.{name}"
        assert isinstance(cls.deterministic, bool)


def test_core_never_imports_torch_or_yatt() -> None:
    import subprocess
    import sys

    code = (
        "import sys, dgcc, dgcc.protocols.dgcc, dgcc.workloads.ycsb, dgcc.workloads.smallbank,"
        " dgcc.bench, dgcc.cli; print(sorted(m for m in ('torch', 'yatt') if m in sys.modules))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert completed.stdout.strip() == "[]"
