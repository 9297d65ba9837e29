"""The TPC-C soak script passes a clean run and fails a corrupted one.

Method: load ``dgcc/bench/tpcc_soak.py`` from its path, run it for about a second at a tiny
scale with a serial shadow, then again with ``--canary`` (a planted D_YTD corruption), which
must make it exit 1.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "tpcc_soak.py"
TINY = ["--items", "300", "--customers", "30", "--orders", "30", "--warehouses", "2"]
QUICK = ["--minutes", "0.015", "--batch", "100", "--check-every-s", "0.2", "--report-dir", ""]


@pytest.fixture(scope="module")
def soak() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("tpcc_soak", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_clean_soak_passes(soak: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert soak.main([*TINY, *QUICK, "--shadow", "serial"]) == 0
    summary = [line for line in capsys.readouterr().out.splitlines() if "[summary]" in line]
    assert "problems=0" in summary[0]


def test_canary_soak_fails(soak: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert soak.main([*TINY, *QUICK, "--canary"]) == 1
    assert "cond 1:" in capsys.readouterr().out


def test_soak_writes_its_report(soak: ModuleType, tmp_path: Path) -> None:
    quick = [arg if arg else str(tmp_path) for arg in QUICK]
    assert soak.main([*TINY, *quick]) == 0
    report = (tmp_path / "tpcc_soak.md").read_text()
    assert "TPC-C consistency soak" in report
    assert (
        f"`python -O dgcc/bench/tpcc_soak.py {' '.join([*TINY, *quick])}`" in report
    )  # rerunnable
    assert (tmp_path / "tpcc_soak.json").exists()


def test_quick_writes_no_report(soak: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    args = soak._parse(["--quick", "--report-dir", "somewhere"])
    assert (args.minutes, args.report_dir, args.items) == (0.25, "", 10_000)
