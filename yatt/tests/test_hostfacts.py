"""The host facts every yatt bench script records beside its numbers."""

import re

from yatt.common.hostfacts import cpu_model, describe, git_commit, host_facts


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
