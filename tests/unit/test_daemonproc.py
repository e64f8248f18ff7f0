"""``tests.daemonproc``: the daemon child process and port helper shared by tests, bench and demo."""

from __future__ import annotations

import os
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.daemonproc import DaemonProcess, _ephemeral_range, free_port, port_pool, xdist_share


def test_free_ports_are_distinct_bindable_and_outside_the_ephemeral_range() -> None:
    low, high = _ephemeral_range()
    ports = [free_port() for _ in range(64)]
    assert len(set(ports)) == len(ports)
    assert not [p for p in ports if low <= p <= high], (low, high, ports)
    for port in ports[:8]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


@given(st.integers(1024, 65535), st.integers(0, 65535))
def test_port_pool_is_everything_from_10000_but_the_ephemeral_range(low: int, span: int) -> None:
    high = min(65535, low + span)
    pool = port_pool((low, high))
    assert set(pool) == {p for p in range(10000, 65536) if p < low or p > high}
    assert pool == sorted(pool)


def test_parallel_test_workers_draw_ports_from_disjoint_shares() -> None:
    """Under pytest-xdist each worker hands out ports of its own share only: two workers never pick the same one."""
    shares = [xdist_share({"PYTEST_XDIST_WORKER": f"gw{i}", "PYTEST_XDIST_WORKER_COUNT": "2"}) for i in range(2)]
    assert shares == [(0, 2), (1, 2)]
    pools = [set(port_pool((32768, 60999), share)) for share in shares]
    assert not pools[0] & pools[1] and pools[0] | pools[1] == set(port_pool((32768, 60999)))
    for env in ({}, {"PYTEST_XDIST_WORKER": "master"}, {"PYTEST_XDIST_WORKER": "gw1"}):
        assert xdist_share(env) == (0, 1)


def test_ephemeral_range_falls_back_to_linux_default(tmp_path) -> None:
    assert _ephemeral_range(str(tmp_path / "missing")) == (32768, 60999)
    bad = tmp_path / "bad"
    bad.write_text("not numbers\n")
    assert _ephemeral_range(str(bad)) == (32768, 60999)
    good = tmp_path / "good"
    good.write_text("20000\t40000\n")
    assert _ephemeral_range(str(good)) == (20000, 40000)


def test_a_daemon_that_cannot_start_says_why_and_leaves_nothing() -> None:
    d = DaemonProcess("bad", args=["--no-such-flag"])
    with pytest.raises(RuntimeError, match="exited with 2") as info:
        d.start(timeout=30, attempts=2)
    assert "--no-such-flag" in str(info.value)   # the log tail names the cause
    assert d.proc is not None and d.proc.returncode == 2
    assert not os.path.exists(d.dir)


def test_a_kept_directory_survives_stop_and_restart_and_goes_with_discard() -> None:
    d = DaemonProcess("keep", keep_dir=True).start(timeout=30)
    try:
        first = d.pid
        assert d.stop() == 0 and os.path.isdir(d.dir)     # SIGTERM: a clean exit, the directory stays
        d.start(timeout=30)
        assert d.pid != first and d.serving()
    finally:
        d.discard()
    assert not d.serving() and not os.path.exists(d.dir)


def test_start_all_starts_daemons_together_and_a_failure_takes_all_down() -> None:
    good = DaemonProcess.start_all([DaemonProcess("all-a"), DaemonProcess("all-b")], timeout=30)
    try:
        assert len({d.pid for d in good}) == 2 and all(d.serving() for d in good)
    finally:
        for d in good:
            d.discard()
    ok, bad = DaemonProcess("all-ok"), DaemonProcess("all-bad", args=["--no-such-flag"])
    with pytest.raises(RuntimeError, match="all-bad exited with 2") as info:
        DaemonProcess.start_all([ok, bad], timeout=30)
    assert "--no-such-flag" in str(info.value)
    assert ok.proc is not None and ok.proc.poll() is not None       # the good one was not left running
    assert not os.path.exists(ok.dir) and not os.path.exists(bad.dir)


def test_the_demo_progress_bar_counts_in_the_summary_units() -> None:
    """The bar said 101M where the summary said 96 MiB."""
    import io

    from tqdm import tqdm

    from bench.demo import progress_bar

    out = io.StringIO()
    bar = progress_bar(tqdm, 96 * 2**20, file=out)
    bar.update(96 * 2**20)
    bar.close()
    assert "96.0MiB/96.0MiB" in out.getvalue() and "101M" not in out.getvalue()
