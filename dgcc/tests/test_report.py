"""``dgcc report``: scripts run in order, ``--quick`` is passed on, failures are reported.

Method: a fake checkout in a temp folder whose ``dgcc/bench`` scripts are tiny Python programs
(print a ``[summary]`` line and their argv, fail, or hang), and whose stitch tool writes a marker
file; the real report code runs them as real child processes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from dgcc import cli
from dgcc.errors import ConfigError
from dgcc.report import SCRIPTS, ReportConfig, repo_root, run_report

OK_SCRIPT = """
import sys
print("[summary] name={name} argv=" + ",".join(sys.argv[1:]))
"""
FAILING_SCRIPT = """
import sys
print("something broke")
sys.exit(3)
"""
HANGING_SCRIPT = """
import time
time.sleep(30)
"""
STITCH = """
from pathlib import Path
Path("docs").mkdir(exist_ok=True)
Path("docs/benchmarks.md").write_text("stitched")
print("docs/benchmarks.md: 0 sections")
"""


def _checkout(tmp_path: Path, scripts: dict[str, str]) -> Path:
    (tmp_path / "dgcc" / "bench").mkdir(parents=True)
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "stitch_benchmarks.py").write_text(STITCH)
    for name, body in scripts.items():
        text = textwrap.dedent(body).replace("{name}", name)
        (tmp_path / "dgcc" / "bench" / f"{name}.py").write_text(text)
    return tmp_path


def test_runs_scripts_in_order_and_stitches(tmp_path: Path) -> None:
    repo = _checkout(
        tmp_path, {"postgres": OK_SCRIPT, "engine": OK_SCRIPT, "cluster": FAILING_SCRIPT}
    )
    seen: list[str] = []
    config = ReportConfig(repo=repo, stitch=True, log_dir=tmp_path / "logs")
    results = run_report(config, lambda name, done, total: seen.append(name))
    assert [r.name for r in results] == [*SCRIPTS, "stitch"]
    assert seen == [*SCRIPTS, "stitch", "done"]
    status = {r.name: r.status for r in results}
    assert status == {
        "engine": "ok",
        "cluster": "failed",
        "protocols": "skipped",
        "protocols_nodes": "skipped",
        "protocols_cpu": "skipped",
        "wal_logging": "skipped",
        "postgres": "ok",
        "tpcc_soak": "skipped",
        "stitch": "ok",
    }
    by_name = {r.name: r for r in results}
    assert by_name["engine"].summary == ("[summary] name=engine argv=",)
    assert "exit status 3" in by_name["cluster"].detail
    assert "something broke" in by_name["cluster"].detail
    assert (repo / "docs" / "benchmarks.md").read_text() == "stitched"


def test_quick_is_passed_through_and_leaves_docs_alone(tmp_path: Path) -> None:
    repo = _checkout(tmp_path, {"engine": OK_SCRIPT})
    results = run_report(
        ReportConfig(repo=repo, quick=True, only=("engine",), log_dir=tmp_path / "logs")
    )
    assert [(r.name, r.status) for r in results] == [("engine", "ok")]
    assert results[0].summary == ("[summary] name=engine argv=--quick",)
    assert not (repo / "docs" / "benchmarks.md").exists()


def test_a_hanging_script_times_out(tmp_path: Path) -> None:
    repo = _checkout(tmp_path, {"engine": HANGING_SCRIPT})
    config = ReportConfig(
        repo=repo, only=("engine",), stitch=False, timeout_s=1.0, log_dir=tmp_path / "logs"
    )
    (result,) = run_report(config)
    assert result.status == "timeout"


def test_a_script_stopped_on_timeout_cleans_up_what_it_started(tmp_path: Path) -> None:
    """As Ctrl-C would: a bench script's clusters and servers stop in its cleanup (a SIGKILL
    left them running, holding ports and the CPU the next script measures on)."""
    marker = tmp_path / "cleaned"
    cleaning = f"""
    import time
    try:
        time.sleep(30)
    finally:
        open({str(marker)!r}, "w").close()
    """
    repo = _checkout(tmp_path, {"engine": cleaning})
    config = ReportConfig(
        repo=repo, only=("engine",), stitch=False, timeout_s=1.0, log_dir=tmp_path / "logs"
    )
    (result,) = run_report(config)
    assert result.status == "timeout" and marker.exists()
    # one line, not the tail of the traceback the interrupt left in the script's output
    assert result.detail == f"no result after 1 s (its output: {result.log})"


def test_bad_config_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'nope'"):
        ReportConfig(repo=repo_root(), only=("nope",))
    with pytest.raises(ConfigError, match="not a dgcc source checkout"):
        ReportConfig(repo=tmp_path)
    with pytest.raises(ConfigError, match="timeout_s"):
        ReportConfig(repo=repo_root(), timeout_s=0)


def test_cli_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = _checkout(tmp_path, {"engine": OK_SCRIPT, "postgres": FAILING_SCRIPT})
    logs = ["--log-dir", str(tmp_path / "logs")]  # not the default temp folder (it is kept)
    argv = ["report", "--repo", str(repo), "--only", "engine", "--no-stitch", *logs]
    assert cli.main(argv) == 0
    assert "name=engine" in capsys.readouterr().out
    argv = ["report", "--repo", str(repo), "--only", "postgres", "--no-stitch", *logs]
    assert cli.main(argv) == 1
    assert cli.main(["report", "--repo", str(repo), "--only", "bogus", *logs]) == 2
    assert "unknown benchmark" in capsys.readouterr().err


TABLE_SCRIPT = """
from rich.console import Console
from rich.table import Table

console = Console(width=100)
table = Table(title="runs")
table.add_column("run")
table.add_row("one")
console.print(table)
for n in range(3):
    print(f"[summary] run={n}")
for n in range(15):
    print(f"scenario {n}: DistDGCC / rival = {n}.00x")
console.print("wrote out/{name}.{json,md,png}")
"""


def test_the_table_shows_what_each_script_found_and_where_it_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It showed the first 4 raw summary lines, cut, and hid the results and the output files.
    repo = _checkout(tmp_path, {"engine": TABLE_SCRIPT, "cluster": OK_SCRIPT})
    logs = ["--log-dir", str(tmp_path / "logs")]
    argv = ["report", "--repo", str(repo), "--only", "engine", "cluster", "--no-stitch", *logs]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLUMNS", "300")
        assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "scenario 0: DistDGCC / rival = 0.00x" in out
    assert "scenario 11: DistDGCC / rival = 11.00x" in out
    assert "scenario 12:" not in out and "(+3 more result lines in " in out
    assert "wrote out/engine.{json,md,png}" in out
    assert "run=0" not in out  # its own results stand in for its summary lines
    assert "name=cluster" in out  # a script that states none: its summary lines


def test_a_relative_repo_runs_its_scripts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The scripts run in the checkout: a relative --repo once named its path twice.
    repo = _checkout(tmp_path, {"engine": OK_SCRIPT})
    monkeypatch.chdir(repo.parent)
    logs = ["--log-dir", str(tmp_path / "logs")]
    argv = ["report", "--repo", repo.name, "--only", "engine", "--no-stitch", *logs]
    assert cli.main(argv) == 0
    assert "name=engine" in capsys.readouterr().out


def test_a_log_dir_that_cannot_be_used_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = _checkout(tmp_path, {"engine": OK_SCRIPT})
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    for log_dir in (a_file, a_file / "below"):
        argv = ["report", "--repo", str(repo), "--only", "engine", "--log-dir", str(log_dir)]
        assert cli.main([*argv, "--no-stitch"]) == 2
        captured = capsys.readouterr()
        message = f"dgcc: error: cannot use {str(log_dir)!r} as the log dir: Not a directory\n"
        assert captured.err == message
        assert not captured.out.strip()  # refused before any script runs
    config = ReportConfig(repo=repo, only=("engine",), stitch=False, log_dir=a_file)
    with pytest.raises(ConfigError, match="as the log dir: Not a directory"):
        run_report(config)


def test_repo_root_is_this_checkout() -> None:
    root = repo_root()
    assert (root / "dgcc" / "bench" / "engine.py").is_file()


def test_the_real_stitch_tool_refuses_a_report_with_holes(tmp_path: Path, capsys) -> None:
    # It silently dropped a missing section, kept a link to a deleted plot and appended stray
    # files.
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "stitch_benchmarks", repo_root() / "tools" / "stitch_benchmarks.py"
    )
    assert spec is not None and spec.loader is not None
    stitch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stitch)
    bench = tmp_path / "bench"
    bench.mkdir()
    required = [name for name in stitch.ORDER if name not in stitch.OPTIONAL]
    for name in required:
        (bench / f"{name}.md").write_text(f"## {name}\n\n![plot]({name}.png)\n")
        (bench / f"{name}.png").write_bytes(b"png")
    (bench / "notes.md").write_text("scratch")
    assert stitch.main(tmp_path) == 0
    report = (tmp_path / "benchmarks.md").read_text()
    assert "scratch" not in report and f"](bench/{required[0]}.png)" in report
    assert "left out docs/bench/notes.md" in capsys.readouterr().err
    (bench / f"{required[0]}.png").unlink()
    (bench / f"{required[1]}.md").unlink()
    assert stitch.main(tmp_path) == 1
    err = capsys.readouterr().err
    assert f"{required[1]}.md is missing" in err and f"links {required[0]}.png" in err
    assert (tmp_path / "benchmarks.md").read_text() == report  # nothing written


def _stitch_module():
    spec = importlib.util.spec_from_file_location(
        "stitch_benchmarks", Path(__file__).resolve().parents[2] / "tools" / "stitch_benchmarks.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_stitched_report_marks_sections_measured_before_their_code_changed(tmp_path) -> None:
    stitch = _stitch_module()
    repo = tmp_path
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | {
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
    }

    def git(*args: str) -> str:
        command = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo), *args]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    git("init", "-q")
    (repo / "dgcc" / "src").mkdir(parents=True)
    (repo / "dgcc" / "src" / "a.py").write_text("x = 1\n")
    git("add", "-A")
    git("commit", "-qm", "one")
    first = git("rev-parse", "HEAD")
    (repo / "dgcc" / "src" / "a.py").write_text("x = 2\n")
    git("commit", "-qam", "two")
    bench = repo / "docs" / "bench"
    bench.mkdir(parents=True)
    facts = {"host": {"git_commit": first}, "reused": {"commit": "abcdef1"}}
    (bench / "dgcc_engine.json").write_text(json.dumps(facts))
    (bench / "dgcc_cluster.json").write_text(json.dumps({"git_commit": git("rev-parse", "HEAD")}))
    (bench / "tpcc_soak.json").write_text("{not json")
    (bench / "protocols.json").write_text(json.dumps({"host": {"git_commit": "unknown"}}))
    (bench / "yatt_step.json").write_text(json.dumps({"host": {"git_commit": "0badc0de"}}))
    names = ["dgcc_engine", "dgcc_cluster", "tpcc_soak", "protocols", "yatt_step"]
    rows = stitch.freshness(bench, repo, names)
    assert rows[2:] == [
        f"| dgcc_engine | {first[:8]} | **1** |",
        f"| dgcc_cluster | {git('rev-parse', 'HEAD')[:8]} | 0 |",
        "| tpcc_soak | not recorded | ? |",
        "| protocols | not recorded | ? |",  # the run could not tell: no reused commit instead
        "| yatt_step | 0badc0de | ? |",  # a commit this clone lacks
    ]
