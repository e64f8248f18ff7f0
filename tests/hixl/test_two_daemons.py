"""``hixl`` engines in worker processes on two real daemons (and embedded): transfers byte-exact, refusals whole,
async requests, AutoConnect, notifies, connection statuses, a killed peer, and an LLM-DataDist engine beside a HIXL
engine in one worker."""

from __future__ import annotations

import pytest

import hixl
from tests.daemonproc import free_port
from tests.harness import ROOT
from tests.hixl.ops import pattern
from tests.workerproc import WorkerProcess

pytestmark = pytest.mark.integration

IP = "127.0.0.1"
SIZE = 1 << 20


class HixlWorker(WorkerProcess):
    """A worker running ``tests.hixl.ops``."""

    def __init__(self, env: dict[str, str]) -> None:
        super().__init__("tests.hixl.ops", env, path=str(ROOT), on_exit="finalize")


@pytest.fixture
def workers():  # noqa: ANN201
    made: list[HixlWorker] = []

    def make(daemon=None) -> HixlWorker:  # noqa: ANN001
        w = HixlWorker({"DATADIST_DAEMON": daemon.target} if daemon is not None else {})
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()


def _engines(server: HixlWorker, client: HixlWorker, options: dict | None = None) -> tuple[str, int, int]:
    """Initialize both (the server listening), register "mem" (1 MiB) in each: the server's a pattern, the client's
    zeros. Returns (the server's engine string, the server's and the client's base address)."""
    remote = f"{IP}:{free_port()}"
    assert server.call("init", remote) == hixl.SUCCESS
    assert client.call("init", f"{IP}:{free_port()}", options or {}) == hixl.SUCCESS
    sb = server.call("alloc", "mem", SIZE, 1)
    cb = client.call("alloc", "mem", SIZE)
    for w in (server, client):
        status, handle = w.call("register", "mem")
        assert status == hixl.SUCCESS and handle != 0
    return remote, sb, cb


@pytest.fixture
def pair(daemon_factory, workers):  # noqa: ANN001, ANN201
    ds, dc = daemon_factory.many("s", "c")
    server, client = workers(ds), workers(dc)
    remote, sb, cb = _engines(server, client)
    return server, client, remote, sb, cb, ds


def test_read_and_write_10000_extents_byte_exact(pair) -> None:  # noqa: ANN001
    server, client, remote, sb, cb, _ = pair
    data = pattern(1, SIZE)
    n, step = 10_000, 100
    rows = [(cb + i * step + 3, sb + i * step, 37) for i in range(n)]
    assert client.call("transfer_sync", remote, "READ", rows) == hixl.NOT_CONNECTED
    assert client.call("call", "connect", remote, 5000) == hixl.SUCCESS
    assert client.call("call", "connect", remote, 5000) == hixl.ALREADY_CONNECTED
    assert client.call("transfer_sync", remote, "READ", rows) == hixl.SUCCESS
    got = client.call("read", "mem")
    want = bytearray(SIZE)
    for i in range(n):
        want[i * step + 3:i * step + 40] = data[i * step:i * step + 37]
    assert got == bytes(want)
    rows = [(cb + i * step, sb + SIZE - i * step - 50, 50) for i in range(n)]   # WRITE, 10,000 extents again
    assert client.call("transfer_sync", remote, "WRITE", rows) == hixl.SUCCESS
    expect = bytearray(data)
    for i in range(n):
        expect[SIZE - i * step - 50:SIZE - i * step] = got[i * step:i * step + 50]
    assert server.call("read", "mem") == bytes(expect)


def test_256_requests_in_flight_from_one_thread(pair) -> None:  # noqa: ANN001
    server, client, remote, sb, cb, _ = pair
    assert client.call("call", "connect", remote, 5000) == hixl.SUCCESS
    batches = [[(cb + i * 4096, sb + i * 4096, 4096)] for i in range(256)]
    out = client.call("many_async", remote, "READ", batches, timeout=120)
    assert out["starts"] == [hixl.SUCCESS] * 256 and out["reqs"] == 256
    assert sorted(out["finals"]) == list(range(1000, 1256))   # each reported once, finished
    assert set(out["finals"].values()) == {"COMPLETED"}
    assert client.call("read", "mem") == pattern(1, SIZE)[:256 * 4096] + bytes(SIZE - 256 * 4096)
    assert client.call("call", "get_all_transfer_status") == [hixl.SUCCESS, []]   # reported ones are forgotten


def test_refused_extents_move_nothing(pair) -> None:  # noqa: ANN001
    server, client, remote, sb, cb, _ = pair
    assert client.call("call", "connect", remote, 5000) == hixl.SUCCESS
    before, server_before = client.call("read", "mem"), server.call("read", "mem")
    for rows in ([(cb, sb, 16), (cb + 16, sb + SIZE - 8, 16)], [(cb, sb - 4096, 16)], [(cb + SIZE - 8, sb, 16)]):
        for op in ("READ", "WRITE"):
            assert client.call("transfer_sync", remote, op, rows) == hixl.PARAM_INVALID, (op, rows)
            assert client.call("read", "mem") == before and server.call("read", "mem") == server_before
    assert client.call("transfer_sync", remote, "READ", [(0, sb, 16)]) == hixl.PARAM_INVALID   # null address
    assert client.call("transfer_sync", remote, "READ", []) == hixl.PARAM_INVALID
    assert client.call("transfer_sync", remote, "READ", [(cb, sb, 16)], 0) == hixl.PARAM_INVALID
    # the server deregisters (it has no connection of its own): the same extents are refused
    _, handle = server.call("register", "mem")   # the same range again: its handle
    assert server.call("call", "deregister_mem", handle) == hixl.SUCCESS
    assert client.call("transfer_sync", remote, "READ", [(cb, sb, 16)]) == hixl.PARAM_INVALID
    assert client.call("read", "mem") == before
    # the client, connected, may not deregister (HIXL: disconnect first)
    _, mine = client.call("register", "mem")
    assert client.call("call", "deregister_mem", mine) == hixl.FAILED


def test_auto_connect(daemon_factory, workers) -> None:  # noqa: ANN001
    ds, dc = daemon_factory.many("s", "c")
    server, client = workers(ds), workers(dc)
    remote, sb, cb = _engines(server, client, {hixl.OPTION_AUTO_CONNECT: "1"})
    assert client.call("transfer_sync", remote, "READ", [(cb, sb, 4096)]) == hixl.SUCCESS
    assert client.call("read", "mem", 0, 4096) == pattern(1, SIZE)[:4096]
    assert client.call("call", "connect", remote, 5000) == hixl.ALREADY_CONNECTED
    assert client.call("call", "disconnect", remote, 5000) == hixl.SUCCESS
    status, req = client.call("transfer_async", remote, "WRITE", [(cb, sb, 8)])   # connects again
    assert status == hixl.SUCCESS
    assert client.call("wait_all", [req]) == {req: "COMPLETED"}


def test_notifies_in_order_and_bounded(pair) -> None:  # noqa: ANN001
    server, client, remote, _, _, _ = pair
    assert client.call("send_notify", remote, "a", "b") == hixl.NOT_CONNECTED
    assert client.call("call", "connect", remote, 5000) == hixl.SUCCESS
    for i in range(5):
        assert client.call("send_notify", remote, f"n{i}", "m" * i) == hixl.SUCCESS
    assert server.call("get_notifies") == [hixl.SUCCESS, [[f"n{i}", "m" * i] for i in range(5)]]
    assert server.call("get_notifies") == [hixl.SUCCESS, []]
    assert client.call("send_notify", remote, "x" * 1025, "") == hixl.PARAM_INVALID
    assert client.call("send_notify", remote, "x", "y" * 1025) == hixl.PARAM_INVALID
    assert client.call("send_notify", remote, "x", "y", 0) == hixl.PARAM_INVALID
    assert client.call("send_many", remote, "q", 4096) == [hixl.SUCCESS] * 4096   # the queue's bound
    assert client.call("send_notify", remote, "q", "over") == hixl.RESOURCE_EXHAUSTED
    status, got = server.call("get_notifies")
    assert status == hixl.SUCCESS and [m for _, m in got] == [str(i) for i in range(4096)]


def test_connect_statuses(pair) -> None:  # noqa: ANN001
    server, client, remote, _, _, _ = pair
    me = f"{IP}:{free_port()}"
    assert client.call("call", "disconnect", remote, 1000) == hixl.NOT_CONNECTED
    assert client.call("call", "connect", remote, 0) == hixl.PARAM_INVALID
    assert client.call("call", "connect", IP, 1000) == hixl.PARAM_INVALID          # no port: it does not listen
    assert client.call("call", "connect", "not-an-ip:1", 1000) == hixl.PARAM_INVALID
    assert client.call("call", "connect", me, 1000) != hixl.SUCCESS                  # nothing listens there
    assert client.call("call", "connect_async", remote, 5000) == hixl.SUCCESS
    assert client.call("until_async_status", remote, "CONNECTED") == "CONNECTED"
    assert client.call("call", "get_all_async_connect_status") == [hixl.SUCCESS, {remote: "CONNECTED"}]
    assert client.call("call", "connect_async", me, 1000) == hixl.SUCCESS
    assert client.call("until_async_status", me, "CONNECT_FAILED") == "CONNECT_FAILED"
    assert client.call("call", "disconnect_async", remote, 5000) == hixl.SUCCESS
    assert client.call("until_async_status", remote, "NOT_CONNECT") == "NOT_CONNECT"
    assert client.call("call", "connect_async", remote, 0) == hixl.PARAM_INVALID
    assert client.call("call", "get_transfer_status", 12345) == [hixl.PARAM_INVALID, "FAILED"]
    assert client.call("call", "get_transfer_status", 0) == [hixl.FAILED, "FAILED"]
    assert client.call("init", f"{IP}:{free_port()}") == hixl.SUCCESS   # a new engine of the worker: fine


def test_killed_peer_fails_requests_in_flight(pair) -> None:  # noqa: ANN001
    server, client, remote, sb, cb, ds = pair
    assert client.call("call", "connect", remote, 5000) == hixl.SUCCESS
    ds.proc.kill()   # kill -9 the peer's daemon
    ds.proc.wait(10)
    reqs = client.call("start_async", remote, "READ", [[(cb + i * 64, sb + i * 64, 64)] for i in range(64)])
    finals = client.call("wait_all", [r for r in reqs if r], timeout=120)
    assert finals and set(finals.values()) <= {"FAILED", "TIMEOUT"}, finals
    assert client.call("transfer_sync", remote, "READ", [(cb, sb, 64)]) not in (hixl.SUCCESS,)


def test_embedded_pair(workers) -> None:  # noqa: ANN001
    """Two workers, each with its own embedded daemon (no DATADIST_DAEMON): connect and READ between them."""
    w = workers()
    a, b = f"{IP}:{free_port()}", f"{IP}:{free_port()}"
    assert w.call("init", a) == hixl.SUCCESS
    ab = w.call("alloc", "mem", 8192, 3)
    assert w.call("register", "mem")[0] == hixl.SUCCESS
    other = workers()
    assert other.call("init", b) == hixl.SUCCESS
    bb = other.call("alloc", "mem", 8192)
    assert other.call("register", "mem")[0] == hixl.SUCCESS
    assert other.call("call", "connect", a, 5000) == hixl.SUCCESS
    assert other.call("transfer_sync", a, "READ", [(bb, ab, 8192)]) == hixl.SUCCESS
    assert other.call("read", "mem") == pattern(3, 8192)


def test_llm_datadist_beside_hixl(daemon_factory, workers) -> None:  # noqa: ANN001
    """An LLM-DataDist engine and a HIXL engine of one worker, on one daemon, side by side."""
    d = daemon_factory()
    w = workers(d)
    assert w.call("init", f"{IP}:{free_port()}") == hixl.SUCCESS
    assert w.call("llm_datadist_beside") == "ok"
