"""yatt/bench/checkpointing.py: each (length, setting) runs in its own process, the report
pairs them, and gradient checkpointing leaves the update's gradients alone."""

import json

import pytest


def test_the_checkpointing_bench_pairs_each_length_with_and_without(bench_script, tmp_path):
    bench = bench_script("checkpointing")
    argv = ["--model", "tiny", "--tokens", "8,24", "--rows", "2", "--updates", "1",
            "--out-dir", str(tmp_path)]  # fmt: skip
    assert bench.main(argv) == 0
    results = json.loads((tmp_path / "yatt_checkpointing.json").read_text())["results"]
    assert [(r["tokens"], r["checkpointing"]) for r in results] == [
        (8, False), (8, True), (24, False), (24, True),
    ]  # fmt: skip
    for plain, checked in bench._pairs(results):  # the same update, recomputed or kept
        assert checked["grad_norms"] == pytest.approx(plain["grad_norms"], rel=1e-4)
        assert plain["working_mb"] > 0 and checked["working_mb"] > 0
    markdown = (tmp_path / "yatt_checkpointing.md").read_text()
    assert "| 24 | on |" in markdown and "- 24 response tokens: checkpointing needs" in markdown
    assert (tmp_path / "yatt_checkpointing.png").stat().st_size > 0


@pytest.mark.parametrize(
    "argv, problem",
    [(["--tokens", "128,x"], "expected lengths"), (["--tokens", "0"], "must be >= 1"),
     (["--rows", "0"], "must be >= 1")],
)  # fmt: skip
def test_the_checkpointing_bench_refuses_bad_arguments(bench_script, capsys, argv, problem):
    with pytest.raises(SystemExit):
        bench_script("checkpointing").main(argv)
    assert problem in capsys.readouterr().err
