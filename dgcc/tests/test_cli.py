"""The ``dgcc`` command line and the benchmark driver.

Method: run ``main`` in-process with short windows on small workloads (the JSON record, the
summary line and exit codes are checked), and ``python -m dgcc`` once as a real process.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dgcc import ConfigError, cli
from dgcc.bench import BenchConfig, run_benchmark, run_side_by_side, summary_line
from dgcc.cli import main

SMALL_YCSB = ["--workload", "ycsb", "--records", "500", "--theta", "0.9"]
SHORT = ["--seconds", "0.3", "--warmup-s", "0.1", "--batch-size", "50"]


def test_bench_writes_json_and_prints_a_summary(tmp_path, capsys) -> None:
    path = tmp_path / "out" / "run.json"
    code = main(["bench", *SMALL_YCSB, *SHORT, "--executors", "2", "--json", str(path)])
    assert code == 0
    out = capsys.readouterr().out
    summary = next(line for line in out.splitlines() if line.startswith("[summary] "))
    fields = dict(item.split("=", 1) for item in summary.split()[1:])
    assert fields["workload"] == "ycsb"
    assert fields["protocol"] == "dgcc"
    assert float(fields["commits_per_s"]) > 0
    assert "build_graph_s" in fields
    record = json.loads(path.read_text())
    assert record["config"]["protocol_options"] == {"executors": 2}
    assert record["workload"]["theta"] == 0.9
    assert record["metrics"]["txn/committed"] > 0
    assert record["violations"] == []
    assert {"platform", "cpus", "python"} <= set(record["host"])
    assert record["git_commit"]


def test_bench_counts_logic_aborts_by_cause(capsys) -> None:
    args = ["bench", "--workload", "smallbank", "--accounts", "50", "--hot-fraction", "0.9"]
    assert main([*args, *SHORT, "--protocol", "serial"]) == 0
    out = capsys.readouterr().out
    assert "insufficient funds" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "--bogus"], "unrecognized arguments: --bogus"),
        (["bench", "--protocol", "nope"], "invalid choice: 'nope'"),
        (["bench", "--workload", "nope", *SHORT], "unknown workload 'nope'"),
        (["bench", "--workload", "smallbank", "--theta", "0.5", *SHORT], "theta"),
        (["bench", *SMALL_YCSB, "--seconds", "-1"], "seconds must be in"),
        (["bench", *SMALL_YCSB, "--batch-size", "0"], "batch_size must be in"),
        (["bench", "--workload", "ycsb", "--theta", "2", *SHORT], "theta must be in"),
        (["bench", *SMALL_YCSB, "-o", "nokey"], "key=value"),
        (["bench", *SMALL_YCSB, "--seconds", "abc"], "invalid float value"),
        (["bench", *SMALL_YCSB, "--inflight", "40"], "--inflight applies only to a cluster run"),
        (["bench", *SMALL_YCSB, "--durable"], "--durable applies only to a cluster run"),
        (
            ["bench", *SMALL_YCSB, "--epoch-ms", "2", "--distributed-fraction", "0.1"],
            "--distributed-fraction, --epoch-ms apply only to a cluster run",
        ),
        (["bench", *SMALL_YCSB, "--nodes", "2", "--batch-size", "9"], "in-process run"),
        (["bench", *SMALL_YCSB, "--nodes", "2", "--check-invariants"], "in-process run"),
        (["bench", *SMALL_YCSB, "--protocol", "occ", "--executors", "2"], "--protocol dgcc"),
        (["bench", "--workload", "ycsb", "--records", str(10**11)], "GiB of memory"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_flags_give_one_line_and_exit_2(argv, message, capsys) -> None:
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("dgcc: error: ")
    assert message in err
    assert captured.out == ""  # (no progress bar began, to leave a blank line behind)


def test_top_level_help_gives_the_whole_summary_sentence(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    summary = cli.__doc__.split("\n\n")[0]
    assert summary.endswith(".")
    assert " ".join(summary.split()) in " ".join(capsys.readouterr().out.split())


def test_bench_config_validation() -> None:
    with pytest.raises(ConfigError, match="unknown protocol"):
        BenchConfig(workload="ycsb", protocol="nope")
    with pytest.raises(ConfigError, match="does not take"):
        BenchConfig(workload="ycsb", protocol="serial", protocol_options={"executors": 2})
    # 2PL and OCC pass **options on to their base class: its options are the ones checked
    for protocol in ("no_wait", "wait_die", "occ"):
        with pytest.raises(ConfigError, match=r"'bogus'\]; it takes: inflight, record_history"):
            BenchConfig(workload="ycsb", protocol=protocol, protocol_options={"bogus": 1})
        BenchConfig(workload="ycsb", protocol=protocol, protocol_options={"inflight": 4})


def test_run_benchmark_library_call() -> None:
    config = BenchConfig(
        workload="ycsb",
        protocol="dgcc",
        seconds=0.2,
        warmup_s=0,
        batch_size=20,
        workload_options={"records": 100},
    )
    record = run_benchmark(config)
    metrics = record["metrics"]
    assert metrics["txn/latency_ms_p50"] <= metrics["txn/latency_ms_p99"]
    assert metrics["timing_s/build_graph"] > 0
    assert summary_line(record).startswith("[summary] workload=ycsb protocol=dgcc")


def test_python_dash_m_runs() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "dgcc", "bench", *SMALL_YCSB, *SHORT, "--protocol", "serial"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "[summary] workload=ycsb protocol=serial" in completed.stdout


def test_run_side_by_side_alternates_and_returns_one_record_each() -> None:
    configs = [
        BenchConfig(
            workload="ycsb",
            protocol=protocol,
            seconds=0.2,
            warmup_s=0.05,
            batch_size=20,
            workload_options={"records": 100},
        )
        for protocol in ("dgcc", "serial")
    ]
    steps: list[str] = []
    records = run_side_by_side(configs, rounds=2, progress=steps.append)
    assert [record["config"]["protocol"] for record in records] == ["dgcc", "serial"]
    assert sum("round" in step for step in steps) == 4
    assert all(record["metrics"]["txn/committed"] > 0 for record in records)
    with pytest.raises(ConfigError, match="rounds"):
        run_side_by_side(configs, rounds=0)


@pytest.mark.slow
def test_demo_runs_dgcc_and_serial(capsys) -> None:
    assert main(["demo", "--seconds", "0.4", "--warmup-s", "0.1", "--batch-size", "100"]) == 0
    out = capsys.readouterr().out
    assert "[summary] workload=tpcc protocol=dgcc" in out
    assert "[summary] workload=tpcc protocol=serial" in out


def test_a_bare_dgcc_prints_its_usage(capsys) -> None:
    from dgcc.cli import main

    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: dgcc") and "cluster" in err and "bench" in err
