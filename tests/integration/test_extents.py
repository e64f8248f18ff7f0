"""The daemon's side of HIXL (docs/hixl.md): ``TransferExtents``, ``SendNotify``/``GetNotifies`` between two real
daemons (and two engines of one), called as the clients call them. Every remote extent is resolved by its owner
against the owner's registrations: one not wholly inside one, of a registration withdrawn, or of memory registered
not remotely accessible is refused with ``LLM_PARAM_INVALID`` and nothing is read or written."""

from __future__ import annotations

import os

import pytest

from tests.harness import free_port, over_planes

pytestmark = pytest.mark.integration

OPS = "tests.integration.extent_ops"
IP = "127.0.0.1"
SIZE = 1 << 20


def run(worker, op: str, *args, **kw):  # noqa: ANN001, ANN002, ANN003, ANN201
    return worker.call("run", OPS, op, *args, **kw)


@pytest.fixture
def pair(daemon_factory, worker_factory):  # noqa: ANN001, ANN201
    """A serving engine (cluster 1, listening) and a linking one (cluster 2) on two daemons, each with one
    registration of 1 MiB ("mem"); the server's filled with a pattern, the client's zero."""
    ds, dc = daemon_factory.many("s", "c")
    server, client = worker_factory(ds), worker_factory(dc)
    port = free_port()
    server.call("init", "PROMPT", 1, listen=f"{IP}:{port}", mem_pool=1 << 20)
    client.call("init", "DECODER", 2)
    for w in (server, client):
        w.call("register_cache", "mem", 1, (1, SIZE), dtype="uint8", remote_accessible=True)
    pattern = os.urandom(SIZE)
    run(server, "put", "mem", 0, pattern)
    assert client.call("link", 1, IP, port)[0] == 0
    return server, client, pattern


@over_planes("tcp", "nixl-ucx-tcp", "acl-hccl")
def test_read_and_write_10000_extents_byte_exact(pair) -> None:
    server, client, pattern = pair
    sb, cb = run(server, "base", "mem"), run(client, "base", "mem")
    n, step = 10_000, 100    # extent i: 37 bytes of server offset i*step into client offset i*step + 3
    rows = [(cb + i * step + 3, sb + i * step, 37) for i in range(n)]
    assert run(client, "extents", 1, False, rows) == "LLM_SUCCESS"
    got = run(client, "get", "mem")
    for i in (0, 1, 4999, n - 1):
        assert got[i * step + 3:i * step + 40] == pattern[i * step:i * step + 37]
    assert got[:3] == bytes(3) and got[40:103] == bytes(63)   # nothing outside the extents
    # WRITE: the client's first 64 KiB to the server's last 64 KiB, in 16 extents of 4 KiB
    rows = [(cb + k * 4096, sb + SIZE - 65536 + k * 4096, 4096) for k in range(16)]
    assert run(client, "extents", 1, True, rows) == "LLM_SUCCESS"
    assert run(server, "get", "mem", SIZE - 65536, 65536) == got[:65536]


def test_extents_outside_a_registration_are_refused_whole(pair) -> None:
    server, client, pattern = pair
    sb, cb = run(server, "base", "mem"), run(client, "base", "mem")
    before = run(client, "get", "mem")
    cases = [
        [(cb, sb, 16), (cb + 16, sb + SIZE - 8, 16)],        # the second runs 8 bytes past the registration's end
        [(cb, sb - 4096, 16)],                                # below it
        [(cb + SIZE - 8, sb, 16)],                            # the local one runs past the client's registration
        [(cb, sb, 0)],                                        # an empty extent
    ]
    for rows in cases:
        assert run(client, "extents", 1, False, rows) == "LLM_PARAM_INVALID", rows
        assert run(client, "get", "mem") == before            # nothing read, not even the valid first extent
    server.call("allocate", "pool", 1, (4, 64), dtype="uint8", blocks=True)   # memory of no worker address
    assert run(client, "extents", 1, False, [(cb, 0x1000, 16)]) == "LLM_PARAM_INVALID"
    server_before = run(server, "get", "mem")
    assert run(client, "extents", 1, True, cases[0]) == "LLM_PARAM_INVALID"
    assert run(server, "get", "mem") == server_before         # nothing written
    # withdrawn: the server deregisters; the same extents are then refused
    run(server, "withdraw", "mem")
    assert run(client, "extents", 1, False, [(cb, sb, 16)]) == "LLM_PARAM_INVALID"
    assert run(client, "extents", 7, False, [(cb, sb, 16)]) == "LLM_NOT_YET_LINK"


def test_notifies_in_order_and_bounded(pair) -> None:
    server, client, _ = pair
    for i in range(3):
        assert run(client, "notify", 1, b"n%d" % i, b"m" * i) == "LLM_SUCCESS"
    assert run(server, "notifies") == [(b"n0", b""), (b"n1", b"m"), (b"n2", b"mm")]
    assert run(server, "notifies") == []
    assert run(client, "notify", 1, b"x" * 1025, b"") == "LLM_PARAM_INVALID"
    assert run(client, "notify", 1, b"x", b"y" * 1025) == "LLM_PARAM_INVALID"
    assert run(client, "notify", 9, b"x", b"") == "LLM_NOT_YET_LINK"


def test_two_engines_of_one_daemon_copy(daemon_factory, worker_factory) -> None:
    d = daemon_factory()
    a, b = worker_factory(d), worker_factory(d)
    port = free_port()
    a.call("init", "PROMPT", 1, listen=f"{IP}:{port}")
    b.call("init", "DECODER", 2)
    for w in (a, b):
        w.call("register_cache", "mem", 1, (1, 65536), dtype="uint8", remote_accessible=True)
    data = os.urandom(65536)
    run(a, "put", "mem", 0, data)
    assert b.call("link", 1, IP, port)[0] == 0
    ab, bb = run(a, "base", "mem"), run(b, "base", "mem")
    assert run(b, "extents", 1, False, [(bb + 8, ab, 100), (bb, ab + 1000, 8)]) == "LLM_SUCCESS"
    assert run(b, "get", "mem", 0, 108) == data[1000:1008] + data[:100]
    assert run(b, "extents", 1, False, [(bb, ab + 65530, 8)]) == "LLM_PARAM_INVALID"
    assert run(b, "notify", 1, b"hi", b"there") == "LLM_SUCCESS"
    assert run(a, "notifies") == [(b"hi", b"there")]


@over_planes("tcp", "nixl-ucx-tcp")
def test_one_transfer_across_several_registrations(daemon_factory, worker_factory) -> None:
    """The extents of one transfer touch two registrations at each end, interleaved: each lands where it names
    (over nixl one READ per owner registration); the registrations are let go at the end (unregistered at once)."""
    ds, dc = daemon_factory.many("s", "c")
    server, client = worker_factory(ds), worker_factory(dc)
    port = free_port()
    server.call("init", "PROMPT", 1, listen=f"{IP}:{port}")
    client.call("init", "DECODER", 2)
    data = {}
    for w, names in ((server, "ab"), (client, "xy")):
        for name in names:
            w.call("register_cache", name, 1, (1, 8192), dtype="uint8", remote_accessible=True)
    for name in "ab":
        data[name] = os.urandom(8192)
        run(server, "put", name, 0, data[name])
    assert client.call("link", 1, IP, port)[0] == 0
    a, b = run(server, "base", "a"), run(server, "base", "b")
    x, y = run(client, "base", "x"), run(client, "base", "y")
    rows = [(x, b + 100, 50), (y + 10, a, 20), (x + 50, a + 8000, 192), (y, b, 10)]
    assert run(client, "extents", 1, False, rows) == "LLM_SUCCESS"
    assert run(client, "get", "x", 0, 242) == data["b"][100:150] + data["a"][8000:8192]
    assert run(client, "get", "y", 0, 30) == data["b"][:10] + data["a"][:20]
    for name in "ab":
        run(server, "withdraw", name)
    for name in "xy":
        run(client, "withdraw", name)


@over_planes("tcp", "nixl-ucx-tcp", "acl-hccl")
def test_a_registration_made_after_the_link(daemon_factory, worker_factory, data_plane) -> None:
    """HIXL wants every registration made before Connect (its RegisterMem constraint); the daemon takes one made
    after the link where its fabric can (docs/choices.md): over tcp and nixl it is read and written at once, from
    either end, and one withdrawn is refused at once; over HCCL, which binds memory before the link is prepared,
    the transfer is refused as CANN's HCCL refuses it (UNSUPPORTED to HIXL's callers)."""
    ds, dc = daemon_factory.many("s", "c")
    server, client = worker_factory(ds), worker_factory(dc)
    port = free_port()
    server.call("init", "PROMPT", 1, listen=f"{IP}:{port}")
    client.call("init", "DECODER", 2)
    assert client.call("link", 1, IP, port)[0] == 0
    for w in (server, client):
        w.call("register_cache", "late", 1, (1, 65536), dtype="uint8", remote_accessible=True)
    data = os.urandom(65536)
    run(server, "put", "late", 0, data)
    sb, cb = run(server, "base", "late"), run(client, "base", "late")
    if data_plane.get("DATADISTD_TRANSPORT_NAME") == "hccl":
        assert run(client, "extents", 1, False, [(cb, sb, 65536)]) == "LLM_FEATURE_NOT_ENABLED"
        assert run(client, "get", "late") == bytes(65536)
        return
    assert run(client, "extents", 1, False, [(cb, sb, 65536)]) == "LLM_SUCCESS"
    assert run(client, "get", "late") == data
    run(client, "put", "late", 0, b"\x5a" * 100)
    assert run(client, "extents", 1, True, [(cb, sb + 1000, 100)]) == "LLM_SUCCESS"
    assert run(server, "get", "late", 1000, 100) == b"\x5a" * 100
    run(server, "withdraw", "late")
    assert run(client, "extents", 1, False, [(cb, sb, 16)]) == "LLM_PARAM_INVALID"
