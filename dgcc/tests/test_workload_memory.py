"""Loading more data than the machine can hold is refused up front with one line naming the
option, instead of the process being killed mid-load. Method: each workload's estimate is
checked against what a small build really allocates (tracemalloc), then against a machine
reporting little memory (``available_memory_bytes`` patched) and the real one."""

from __future__ import annotations

import tracemalloc

import pytest

from dgcc import workloads
from dgcc.errors import ConfigError
from dgcc.workloads import get_workload

SMALL = {
    "tpcc": {"items": 2000, "customers_per_district": 60, "orders_per_district": 60},
    "ycsb": {"records": 5000, "fields": 4},
    "smallbank": {"accounts": 5000},
}
HUGE = {
    "tpcc": {"warehouses": 100_000},
    "ycsb": {"records": 10**10},
    "smallbank": {"accounts": 10**10},
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_the_estimate_is_within_a_third_of_what_a_build_allocates(name: str) -> None:
    workload = get_workload(name, **SMALL[name])
    tracemalloc.start()
    try:
        db = workload.build(1)
        allocated, _ = tracemalloc.get_traced_memory()
        assert db.tables
    finally:
        tracemalloc.stop()
    estimate, _ = workload.data_bytes()
    assert 0.67 * allocated < estimate < 1.5 * allocated, (estimate, allocated)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_data_that_cannot_fit_is_refused_before_loading(name: str, monkeypatch) -> None:
    monkeypatch.setattr(workloads, "available_memory_bytes", lambda: 1024)
    with pytest.raises(ConfigError) as info:
        get_workload(name, **SMALL[name]).build(1)
    message = str(info.value)
    option = next(iter(SMALL[name]))
    assert f"{option}=" in message and "GiB is available here" in message
    assert "\n" not in message


@pytest.mark.parametrize("name", sorted(HUGE))
def test_huge_sizes_fail_on_this_machine_at_once(name: str) -> None:
    if workloads.available_memory_bytes() is None:
        pytest.skip("no /proc/meminfo here")
    with pytest.raises(ConfigError, match="needs about"):
        get_workload(name, **HUGE[name]).build(1)


def _cgroup(root, files: dict[str, str]):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


V2 = {"cgroup.controllers": "memory pids\n"}  # marks a cgroup v2 mount


@pytest.mark.parametrize(
    ("files", "membership", "headroom"),
    [
        # cgroup v2 at the mount's root (a container): 4 GiB limit, 3 GiB used of which
        # 1 GiB is reclaimable file cache
        (
            V2 | {"memory.max": "4294967296\n", "memory.current": "3221225472\n",
                  "memory.stat": "anon 1\ninactive_file 1073741824\n"},
            "0::/\n",
            2 * 2**30,
        ),
        (V2 | {"memory.max": "max\n", "memory.current": "1\n"}, "0::/\n", None),  # no limit
        # cgroup v2 without a namespace: this process's cgroup and the one above it are
        # limited (the host root has no memory.max); the tighter headroom counts
        (
            V2 | {"a/memory.max": "1000\n", "a/memory.current": "100\n",
                  "a/b/memory.max": "5000\n", "a/b/memory.current": "4500\n"},
            "0::/a/b\n",
            500,
        ),
        # cgroup v1: 2 GiB limit, 1.5 GiB used, no stat file; the membership's path is not
        # mounted here (a container sees its own cgroup as the root)
        (
            {"memory/memory.limit_in_bytes": "2147483648\n",
             "memory/memory.usage_in_bytes": "1610612736\n"},
            "4:memory:/elsewhere\n1:cpu:/\n",
            2**29,
        ),
        (
            {"memory/memory.limit_in_bytes": "9223372036854771712\n",
             "memory/memory.usage_in_bytes": "5\n"},
            "4:memory:/\n",
            None,
        ),  # v1, no limit
        (V2 | {"memory.max": "garbled\n"}, "0::/\n", None),  # unreadable: no cap, no error
        ({}, "", None),
    ],
)  # fmt: skip
def test_a_memory_cgroup_limit_caps_the_available_memory(
    tmp_path, monkeypatch, files, membership, headroom
) -> None:
    root = _cgroup(tmp_path / "cgroup", files)
    (tmp_path / "membership").write_text(membership)
    assert workloads._cgroup_headroom(root, tmp_path / "membership") == headroom
    monkeypatch.setattr(workloads, "_meminfo_available", lambda: 3 * 2**30)
    monkeypatch.setattr(workloads, "_cgroup_headroom", lambda root: headroom)
    expected = 3 * 2**30 if headroom is None else min(3 * 2**30, headroom)
    assert workloads.available_memory_bytes() == expected


def test_long_ycsb_values_count_in_the_estimate(monkeypatch) -> None:
    # The rows share 256 values of field_chars characters each: a billion characters a value
    # is 256 GB, refused at once (it was estimated from the row count alone, then built).
    monkeypatch.setattr(workloads, "available_memory_bytes", lambda: 16 * 2**30)
    with pytest.raises(ConfigError, match=r"field_chars=1000000000 needs about 2\d\d(\.\d)? GiB"):
        get_workload("ycsb", records=10, field_chars=10**9).build(1)
