from __future__ import annotations

import os

import pytest

#: set by ``make bench-check``: the tests marked ``bench_run`` (runs of the benchmark) run instead of being skipped
BENCH_CHECK_ENV = "DATADIST_BENCH_CHECK"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if os.environ.get(BENCH_CHECK_ENV) == "1":
        return
    skip = pytest.mark.skip(reason="a run of the benchmark: make bench-check runs it (CI does, after make test)")
    for item in items:
        if item.get_closest_marker("bench_run") is not None:
            item.add_marker(skip)
