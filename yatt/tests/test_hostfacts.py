"""The host facts every yatt bench script records beside its numbers."""

import re
from pathlib import Path

from yatt.common.hostfacts import StealMeter, cpu_model, describe, git_commit, host_facts


def test_host_facts_name_the_machine_versions_and_commit():
    facts = host_facts()
    assert facts["cpus"] >= 1 and facts["load_avg_1m"] >= 0
    assert facts["torch"].startswith("2.") and facts["python"].count(".") == 2
    assert facts["processor"] == cpu_model() and facts["processor"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", facts["time_utc"])
    assert facts["git_commit"] == git_commit()


def test_git_commit_is_this_checkout_or_says_unknown():
    short, full = git_commit(), git_commit(short=False)
    if full == "unknown":  # a copy of the sources without .git
        assert short == "unknown"
    else:
        assert re.fullmatch(r"[0-9a-f]{40}", full) and full.startswith(short)


def test_describe_says_what_a_run_stored_and_nothing_it_did_not():
    facts = host_facts()
    text = describe(facts)
    assert text.startswith(" Host: ") and f"{facts['cpus']} CPUs" in text
    assert f"commit {facts['git_commit']}" in text and "load average" in text
    assert describe({"git_commit": "abc1234"}) == " Host: commit abc1234."
    assert describe(None) == describe({}) == ""  # a run stored before the facts were


def test_steal_meter_reads_the_share_of_cpu_time_the_hypervisor_took(tmp_path):
    stat = tmp_path / "stat"
    #                user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 0 50 800 0 0 0 50 0 0\ncpu0 1 2 3\n")
    meter = StealMeter(stat)
    stat.write_text("cpu  160 0 70 900 0 0 0 70 0 0\ncpu0 1 2 3\n")
    assert meter.lap() == 20 / 200  # 20 of the 200 ticks since the first reading
    assert meter.lap() is None  # no tick since the last reading
    stat.write_text("cpu  1 2 3\n")  # a kernel without the steal field
    assert meter.lap() is None
    stat.write_text("cpu  1 2 3 4 5 6 7 x 9\n")  # garbled
    assert meter.lap() is None
    assert StealMeter(tmp_path / "absent").lap() is None


def test_steal_meter_reads_this_machine():
    meter = StealMeter()
    sum(range(3_000_000))  # let some ticks pass
    share = meter.lap()
    if Path("/proc/stat").is_file():  # Linux counts steal (0 on bare metal)
        assert share is not None and 0.0 <= share <= 1.0
    else:
        assert share is None
