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
    assert f"{option}=" in message and "GiB available" in message and "\n" not in message


@pytest.mark.parametrize("name", sorted(HUGE))
def test_huge_sizes_fail_on_this_machine_at_once(name: str) -> None:
    if workloads.available_memory_bytes() is None:
        pytest.skip("no /proc/meminfo here")
    with pytest.raises(ConfigError, match="needs about"):
        get_workload(name, **HUGE[name]).build(1)
