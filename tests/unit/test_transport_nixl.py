"""The ``nixl`` transport: two real NIXL agents (UCX) in this process, over a real tcp channel on loopback.

Skipped when NIXL is not installed (``make test`` installs it: ``make nixl``). UCX runs over TCP on the
loopback device here (``UCX_TLS=tcp``, ``UCX_NET_DEVICES=lo``, set before NIXL loads); the integration
suite runs daemons over UCX's shared-memory transports too.
"""

from __future__ import annotations

import os
import struct
import threading
import time

os.environ.setdefault("UCX_TLS", "tcp")
os.environ.setdefault("UCX_NET_DEVICES", "lo")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from datadist.status import LLMStatusCode as S  # noqa: E402
from datadistd.core.errors import DataDistError  # noqa: E402
from datadistd.core.types import TransferId  # noqa: E402
from datadistd.memory.base import Segment  # noqa: E402
from datadistd.transport.base import CONTROL_CALL, CONTROL_TRANSPORT  # noqa: E402
from datadistd.transport.onesided.pairing import pair_extents  # noqa: E402
from tests.fakes import ArrayHandle  # noqa: E402

TOKEN = b"n" * 32


def nixl_installed() -> bool:
    from datadistd.transport.nixl.ucx import load_api
    try:
        load_api()
    except DataDistError:
        return False
    return True


needs_nixl = pytest.mark.skipif(not nixl_installed(), reason="NIXL is not installed (make nixl)")


def deadline(seconds: float = 10.0) -> float:
    return time.monotonic() + seconds


class Pair:
    """Transport ``a`` linked to ``b``: ``out`` is a's channel, ``inb`` b's."""

    def __init__(self) -> None:
        from datadistd.transport import get_transport
        self.a = get_transport("nixl", host="127.0.0.1", port=0)
        self.b = get_transport("nixl", host="127.0.0.1", port=0)
        self.a.start()
        self.b.start()
        self.b.allow(TOKEN)
        self.out = self.a.connect(self.b.endpoint, TOKEN, 1, deadline(10))
        inb = self.b.channel(TOKEN)
        assert inb is not None
        self.inb = inb

    def a_to_b(self, src: list[Segment], dst: list[Segment]) -> None:
        receipt = self.b.expect(dst, channel=self.inb)
        self.out.send(receipt.transfer_id, src, deadline())
        receipt.wait(deadline())
        assert receipt.received == receipt.expected

    def stop(self) -> None:
        self.a.stop()
        self.b.stop()


@pytest.fixture
def pair():
    p = Pair()
    yield p
    p.stop()


def scattered(handle: ArrayHandle, rng: np.random.Generator, pieces: int, size: int) -> list[Segment]:
    starts = rng.choice(handle.size // size, pieces, replace=False) * size
    return [Segment(handle, int(s), size) for s in starts]


@needs_nixl
def test_scattered_blocks_both_ways_byte_exact(pair) -> None:
    rng = np.random.default_rng(1)
    src, dst = ArrayHandle(1 << 20, seed=1), ArrayHandle(1 << 20)
    for _ in range(6):
        s = scattered(src, rng, 16, 4096)
        d = scattered(dst, rng, 16, 4096)
        pair.a_to_b(s, d)
        for a, b in zip(s, d, strict=True):
            np.testing.assert_array_equal(dst.arr[b.offset:b.offset + 4096], src.arr[a.offset:a.offset + 4096])
    # and back: b sends, a receives (a link is two-way)
    back = ArrayHandle(64 << 10)
    receipt = pair.a.expect([Segment(back, 0, 64 << 10)], channel=pair.out)
    pair.inb.send(receipt.transfer_id, [Segment(src, 4096, 64 << 10)], deadline())
    receipt.wait(deadline())
    np.testing.assert_array_equal(back.arr, src.arr[4096:4096 + (64 << 10)])


@needs_nixl
def test_cut_differently_on_each_side(pair) -> None:
    """One source range lands on three destination ranges, and three sources on one."""
    src, dst = ArrayHandle(300, seed=2), ArrayHandle(1000)
    pair.a_to_b([Segment(src, 0, 300)], [Segment(dst, 0, 100), Segment(dst, 500, 150), Segment(dst, 900, 50)])
    np.testing.assert_array_equal(dst.arr[0:100], src.arr[0:100])
    np.testing.assert_array_equal(dst.arr[500:650], src.arr[100:250])
    np.testing.assert_array_equal(dst.arr[900:950], src.arr[250:300])


@needs_nixl
def test_links_report_the_backend_and_agents_stay_apart(pair) -> None:
    assert pair.a.label.startswith("nixl:UCX(UCX_TLS=")
    assert pair.a.endpoint.startswith("nixl+tcp://127.0.0.1:")
    assert pair.b.agent_name != pair.a.agent_name


@needs_nixl
def test_a_tcp_peer_is_refused_by_name() -> None:
    from datadistd.transport import get_transport
    a = get_transport("nixl", host="127.0.0.1", port=0)
    b = get_transport("tcp", host="127.0.0.1", port=0)
    a.start()
    b.start()
    try:
        b.allow(TOKEN)
        with pytest.raises(DataDistError) as err:
            a.connect(b.endpoint, TOKEN, 1, deadline(5))
        assert err.value.code == S.LLM_LINK_FAILED and "same [transport] name" in err.value.message
        with pytest.raises(DataDistError) as err:
            b.connect(a.endpoint, TOKEN, 1, deadline(5))   # and the other way: the tcp side refuses the scheme
        assert "tcp://host:port" in err.value.message
    finally:
        a.stop()
        b.stop()


ROWS, ROW = 16, 4096


def _entry(t, channel, handle: int, seconds: float = 5.0) -> bool:
    """Whether ``handle`` is in the table published on ``channel``'s link (waited for: ``P`` travels)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        _, infos = t.table_of(channel, -1)
        if handle in infos:
            return True
        time.sleep(0.01)
    return False


def _gone(t, channel, handle: int, seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        _, infos = t.table_of(channel, -1)
        if handle not in infos:
            return True
        time.sleep(0.01)
    return False


def _publish(t, pool: ArrayHandle, at: int = 0, tensors: int = 2, info: bytes = b"cache") -> tuple[int, list[Segment]]:
    """A cache of ``tensors`` tensors of ``ROWS`` rows of ``ROW`` bytes at ``at`` of ``pool``, published by ``t``."""
    cache = [Segment(pool, at + i * ROWS * ROW, ROWS * ROW) for i in range(tensors)]
    return t.publish(cache, ROW, ROWS, info), cache


def _table_rows(*rows: tuple[int, int]) -> np.ndarray:
    return np.array([(t, r * ROW, ROW) for t, r in rows], dtype=np.int64).reshape(-1, 3)


@needs_nixl
def test_a_pull_reads_published_rows_by_one_prepared_read(pair) -> None:
    """b publishes a cache of a pool once; a reads scattered rows of it into ranges cut differently, by row index
    of the list it prepared when the entry came: byte-exact, b's agent posted nothing, and b hears of each READ
    by its notification only (never asked)."""
    from datadistd.transport.base import ReadTables
    assert isinstance(pair.a, ReadTables)
    pool = ArrayHandle(4 * ROWS * ROW, seed=7)
    handle, cache = _publish(pair.b, pool, at=ROWS * ROW)
    assert _entry(pair.a, pair.out, handle)
    assert pair.a.table_of(pair.out, -1)[1] == {handle: b"cache"}
    dst = ArrayHandle(1 << 20)
    for rows in [((0, 1), (1, 3), (0, 15)), ((1, 0), (1, 1), (1, 2), (0, 7))]:
        d = [Segment(dst, 0, ROW), Segment(dst, 100_000, (len(rows) - 1) * ROW)]
        pair.a.read_rows(pair.out, handle, _table_rows(*rows), d, deadline())
        got = np.concatenate([dst.arr[0:ROW], dst.arr[100_000:100_000 + (len(rows) - 1) * ROW]])
        want = np.concatenate([pool.arr[cache[t].offset + r * ROW:cache[t].offset + (r + 1) * ROW] for t, r in rows])
        np.testing.assert_array_equal(got, want)
    assert pair.b.bytes_sent == 0 and pair.a.bytes_received == 7 * ROW
    end = time.monotonic() + 5
    while pair.b.bytes_read_by_peers < 7 * ROW and time.monotonic() < end:
        time.sleep(0.01)
    assert pair.b.bytes_read_by_peers == 7 * ROW
    # a new link gets the whole table when it comes up: b's entry reaches a second puller too
    from datadistd.transport import get_transport
    c = get_transport("nixl", host="127.0.0.1", port=0)
    c.start()
    try:
        pair.b.allow(b"c" * 32)
        out = c.connect(pair.b.endpoint, b"c" * 32, 1, deadline(10))
        assert _entry(c, out, handle)
    finally:
        c.stop()


@needs_nixl
def test_rows_outside_the_entry_are_refused_and_the_pool_beside_it_is_unreachable(pair) -> None:
    """The entry bounds the rows (tensor, offset); and b registered and described to a only the cache itself:
    a READ of the pool's bytes beside it -- even by a's agent directly, as a peer that skips every check of
    ours would -- is refused by NIXL, since a never got that memory's registration."""
    pool = ArrayHandle(4 * ROWS * ROW, seed=3)
    handle, cache = _publish(pair.b, pool, at=ROWS * ROW)
    assert _entry(pair.a, pair.out, handle)
    dst = ArrayHandle(ROW)
    for spans in (_table_rows((2, 0)), np.array([(0, ROWS * ROW, ROW)]), np.array([(1, ROWS * ROW - 8, 16)])):
        with pytest.raises(DataDistError) as err:
            pair.a.read_rows(pair.out, handle, spans, [Segment(dst, 0, int(spans[0, 2]))], deadline(2))
        assert err.value.code == S.LLM_PARAM_INVALID
    base = int(pool.arr.ctypes.data)
    peer = pair.a._peers[TOKEN].agent_name
    local, _, _ = pair.a._agent().addresses([Segment(dst, 0, ROW)])
    for outside in (base, base + 3 * ROWS * ROW):   # the pool's rows before and after the cache
        with pytest.raises(DataDistError) as err:
            pair.a._agent().read(local, np.array([[outside, ROW]], dtype=np.uint64), peer, deadline(2))
        assert err.value.code == S.LLM_FAILED
    assert not dst.arr.any() and pair.a.bytes_received == 0


@needs_nixl
def test_a_few_rows_are_posted_from_the_loop_and_ended_by_the_progress_thread(pair) -> None:
    """``start_rows`` (what a pull of a few blocks takes on the event loop): the READ is posted there and the
    progress thread settles its future -- byte-exact, nothing left in flight, the destination's rows prepared once
    for its registration and used again by the next READ; rows outside the entry and a withdrawn handle are refused
    at once with the codes ``read_rows`` gives; more rows than the int path takes go to a worker thread (None)."""
    import asyncio
    pool = ArrayHandle(4 * ROWS * ROW, seed=11)
    handle, cache = _publish(pair.b, pool, at=ROWS * ROW)
    assert _entry(pair.a, pair.out, handle)
    dst = ArrayHandle(8 * ROW)
    agent = pair.a._agent()

    async def pulls() -> None:
        loop = asyncio.get_running_loop()
        for rows in [((0, 3), (1, 5)), ((1, 15), (0, 0))]:
            d = [Segment(dst, 2 * ROW, ROW), Segment(dst, 5 * ROW, ROW)]
            posted = pair.a.start_rows(pair.out, handle, _table_rows(*rows), d, deadline(), loop)
            assert posted is not None
            await asyncio.wait_for(posted, 10)
            got = np.concatenate([dst.arr[2 * ROW:3 * ROW], dst.arr[5 * ROW:6 * ROW]])
            want = np.concatenate([pool.arr[cache[t].offset + r * ROW:cache[t].offset + (r + 1) * ROW]
                                   for t, r in rows])
            np.testing.assert_array_equal(got, want)
        assert not pair.a._reading
        assert [len(lists) for lists in agent._local.values()] == [1]   # one list for the registration, reused
        with pytest.raises(DataDistError) as outside:
            pair.a.start_rows(pair.out, handle, _table_rows((2, 0)), [Segment(dst, 0, ROW)], deadline(), loop)
        assert outside.value.code == S.LLM_PARAM_INVALID
        many = np.array([(0, r * ROW, ROW) for r in range(ROWS)] * 5, dtype=np.int64)
        assert pair.a.start_rows(pair.out, handle, many, [Segment(ArrayHandle(len(many) * ROW), 0, len(many) * ROW)],
                                 deadline(), loop) is None
        pair.b.withdraw(handle)
        end = time.monotonic() + 5
        while pair.a.table_of(pair.out, -1)[1] and time.monotonic() < end:
            await asyncio.sleep(0.01)
        with pytest.raises(DataDistError) as gone:
            pair.a.start_rows(pair.out, handle, _table_rows((0, 0)), [Segment(dst, 0, ROW)], deadline(), loop)
        assert gone.value.code == S.LLM_KV_CACHE_NOT_EXIST

    asyncio.run(pulls())
    assert pair.a.bytes_received == 4 * ROW


@needs_nixl
def test_a_withdrawn_handle_reads_nothing_and_its_memory_is_deregistered(pair) -> None:
    """withdraw returns with the cache's registration gone at b (before b may reuse the pages); a's table loses
    the entry and a read of it is LLM_KV_CACHE_NOT_EXIST; a cache published later on the same pages is another
    handle; after the link closed nothing is read."""
    pool = ArrayHandle(2 * ROWS * ROW, seed=4)
    handle, cache = _publish(pair.b, pool)
    assert _entry(pair.a, pair.out, handle)
    assert pair.b._agent().published() == 1
    pair.b.withdraw(handle)
    assert pair.b._agent().published() == 0   # deregistered when withdraw returned
    assert _gone(pair.a, pair.out, handle)
    dst = ArrayHandle(ROW)
    with pytest.raises(DataDistError) as err:
        pair.a.read_rows(pair.out, handle, _table_rows((0, 0)), [Segment(dst, 0, ROW)], deadline(2))
    assert err.value.code == S.LLM_KV_CACHE_NOT_EXIST
    pool.arr[:] = 0xEE                       # the pages reused by another cache: a new handle
    again, _ = _publish(pair.b, pool)
    assert again != handle and _entry(pair.a, pair.out, again)
    with pytest.raises(DataDistError) as err:
        pair.a.read_rows(pair.out, handle, _table_rows((0, 0)), [Segment(dst, 0, ROW)], deadline(2))
    assert err.value.code == S.LLM_KV_CACHE_NOT_EXIST and not dst.arr.any()
    pair.out.close()
    with pytest.raises(DataDistError) as err:
        pair.a.read_rows(pair.out, again, _table_rows((0, 0)), [Segment(dst, 0, ROW)], deadline(2))
    assert err.value.code in (S.LLM_LINK_FAILED, S.LLM_KV_CACHE_NOT_EXIST)
    assert not dst.arr.any()


@needs_nixl
def test_a_push_into_a_published_cache_hands_the_pusher_no_key_beyond_it(pair) -> None:
    """b receives a push into a published cache that lies in a larger handle: its destination list names the
    cache's own registration (a had it from the P) and ships no metadata, so a's agent -- even used directly --
    cannot READ the handle's bytes beside the cache."""
    pool = ArrayHandle(4 * ROWS * ROW)
    handle, cache = _publish(pair.b, pool, at=ROWS * ROW)
    assert _entry(pair.a, pair.out, handle)
    src = ArrayHandle(ROW, seed=13)
    pair.a_to_b([Segment(src, 0, ROW)], [Segment(pool, cache[1].offset + 2 * ROW, ROW)])
    np.testing.assert_array_equal(pool.arr[cache[1].offset + 2 * ROW:cache[1].offset + 3 * ROW], src.arr)
    assert pair.b._peers[TOKEN].shipped == set()             # no registration of the handle went out
    base = int(pool.arr.ctypes.data)
    local, _, _ = pair.a._agent().addresses([Segment(src, 0, ROW)])
    for outside in (base, base + 3 * ROWS * ROW):
        with pytest.raises(DataDistError) as err:
            pair.a._agent().read(local, np.array([[outside, ROW]], dtype=np.uint64), pair.a._peers[TOKEN].agent_name,
                                 deadline(2))
        assert err.value.code == S.LLM_FAILED


@needs_nixl
def test_a_publication_that_overtook_its_withdrawal_is_ignored(pair) -> None:
    """Control frames are spread over a link's connections, so b's P of a handle may arrive after its W: a's table
    ignores it (handles are never reused) and the handle stays unreadable."""
    pool = ArrayHandle(2 * ROWS * ROW, seed=6)
    handle, _ = _publish(pair.b, pool)
    late = pair.b._published[handle].message + struct.pack("<I", 5) + b"cache"
    assert _entry(pair.a, pair.out, handle)
    pair.b.withdraw(handle)
    assert _gone(pair.a, pair.out, handle)
    _raw(pair.inb).send_control(CONTROL_TRANSPORT, late, deadline())
    after, _ = _publish(pair.b, pool)          # on the same connection, after the stale P
    assert _entry(pair.a, pair.out, after)
    assert handle not in pair.a.table_of(pair.out, -1)[1]
    dst = ArrayHandle(ROW)
    with pytest.raises(DataDistError) as err:
        pair.a.read_rows(pair.out, handle, _table_rows((0, 0)), [Segment(dst, 0, ROW)], deadline(2))
    assert err.value.code == S.LLM_KV_CACHE_NOT_EXIST and not dst.arr.any()


@needs_nixl
def test_a_handle_of_another_link_or_engine_is_not_in_this_links_table(pair) -> None:
    """Tables are per link: a handle engine c published to its own link with a is unknown on a's link to b,
    whatever the number; so is a handle b never published."""
    from datadistd.transport import get_transport
    c = get_transport("nixl", host="127.0.0.1", port=0)
    c.start()
    try:
        c.allow(b"c" * 32)
        to_c = pair.a.connect(c.endpoint, b"c" * 32, 1, deadline(10))
        handle, _ = _publish(c, ArrayHandle(2 * ROWS * ROW, seed=5))
        assert _entry(pair.a, to_c, handle)
        dst = ArrayHandle(ROW)
        for other in (handle, handle + 1, 0):
            with pytest.raises(DataDistError) as err:
                pair.a.read_rows(pair.out, other, _table_rows((0, 0)), [Segment(dst, 0, ROW)], deadline(2))
            assert err.value.code == S.LLM_KV_CACHE_NOT_EXIST
        assert not dst.arr.any()
        pair.a.read_rows(to_c, handle, _table_rows((0, 0)), [Segment(dst, 0, ROW)], deadline(2))
        assert dst.arr.any()
    finally:
        c.stop()


@needs_nixl
def test_timeout_then_cancel_confirms_nothing_more_lands(pair) -> None:
    """The sender never sends: the receiver times out; cancel asks the sender, which confirms at once,
    and a late send of that transfer is refused instead of writing."""
    dst = ArrayHandle(4096)
    receipt = pair.b.expect([Segment(dst, 0, 4096)], channel=pair.inb)
    with pytest.raises(DataDistError) as err:
        receipt.wait(deadline(0.3))
    assert err.value.code == S.LLM_TIMEOUT
    t0 = time.monotonic()
    receipt.cancel()
    assert time.monotonic() - t0 < 0.9   # confirmed by FIN, not by waiting out the quiesce bound
    assert not pair.inb.broken
    with pytest.raises(DataDistError) as err:
        pair.out.send(receipt.transfer_id, [Segment(ArrayHandle(4096, seed=3), 0, 4096)], deadline(2))
    assert err.value.code == S.LLM_FAILED and "cancelled" in err.value.message
    assert not dst.arr.any()
    pair.a_to_b([Segment(ArrayHandle(4096, seed=4), 0, 4096)], [Segment(dst, 0, 4096)])   # the link still works


@needs_nixl
def test_size_mismatch_fails_both_ends(pair) -> None:
    dst = ArrayHandle(4096)
    receipt = pair.b.expect([Segment(dst, 0, 4096)], channel=pair.inb)
    with pytest.raises(DataDistError) as err:
        pair.out.send(receipt.transfer_id, [Segment(ArrayHandle(100, seed=5), 0, 100)], deadline(2))
    assert err.value.code == S.LLM_PARAM_INVALID
    with pytest.raises(DataDistError) as err:
        receipt.wait(deadline(2))
    assert err.value.code == S.LLM_PARAM_INVALID
    assert not dst.arr.any()


@needs_nixl
def test_channel_closed_mid_wait_fails_the_receipt(pair) -> None:
    receipt = pair.b.expect([Segment(ArrayHandle(4096), 0, 4096)], channel=pair.inb)
    threading.Timer(0.2, pair.out.close).start()
    with pytest.raises(DataDistError) as err:
        receipt.wait(deadline(5))
    assert err.value.code == S.LLM_LINK_FAILED


@needs_nixl
def test_control_frames_of_the_link_pass_through(pair) -> None:
    got: list[tuple[int, bytes]] = []
    arrived = threading.Event()
    pair.b.on_control(TOKEN, lambda kind, payload: (got.append((kind, payload)), arrived.set()))
    pair.out.send_control(CONTROL_CALL, b"hello", deadline())
    assert arrived.wait(5) and got == [(CONTROL_CALL, b"hello")]


@needs_nixl
def test_registrations_are_made_once_per_handle_and_go_with_it(pair) -> None:
    src = ArrayHandle(64 << 10, seed=6)
    dst = ArrayHandle(64 << 10)
    for _ in range(5):
        pair.a_to_b([Segment(src, 0, 4096)], [Segment(dst, 0, 4096)])
    assert pair.a._agent().registered() == 1 and pair.b._agent().registered() == 1
    del dst
    import gc
    gc.collect()
    assert pair.b._agent().registered() == 0


@needs_nixl
def test_unmapped_memory_is_refused_with_the_spec_code(pair) -> None:
    class FileOnly(ArrayHandle):
        def view(self) -> memoryview | None:
            return None

    with pytest.raises(DataDistError) as err:
        pair.b.expect([Segment(FileOnly(4096), 0, 4096)], channel=pair.inb)
    assert err.value.code == S.LLM_FEATURE_NOT_ENABLED


# -- a hostile or broken peer (it holds the link's token: the tcp hello let it in) --

def _raw(channel) -> object:  # noqa: ANN001
    """The tcp channel under a nixl channel: what a peer that speaks its own messages would write to."""
    return channel._peer.channel()


@needs_nixl
def test_a_forged_fin_never_completes_a_receipt(pair) -> None:
    """Only NIXL's notification -- delivered after the WRITE's bytes -- completes a receipt; a FIN saying
    'success' (what a confused or hostile peer could send) can only fail it."""
    from datadistd.transport.onesided.wire import CODE as _CODE
    from datadistd.transport.onesided.wire import FIN as _FIN
    from datadistd.transport.onesided.wire import ID as _ID
    receipt = pair.b.expect([Segment(ArrayHandle(4096), 0, 4096)], channel=pair.inb)
    _raw(pair.out).send_control(CONTROL_TRANSPORT, _ID.pack(_FIN, receipt.transfer_id) + _CODE.pack(0), deadline())
    with pytest.raises(DataDistError) as err:
        receipt.wait(deadline(2))
    assert err.value.code == S.LLM_FAILED and not receipt.done and receipt.received == 0
    receipt.cancel()


@needs_nixl
def test_a_destination_outside_the_peers_registrations_is_refused(pair) -> None:
    """A peer names memory of its own it never registered: NIXL refuses the WRITE, nothing moves."""
    from datadistd.transport.onesided.wire import DESCS as _DESCS
    from datadistd.transport.onesided.wire import ID as _ID
    from datadistd.transport.onesided.wire import MD_LEN as _MD_LEN
    elsewhere = np.zeros(4096, np.uint8)
    extents = np.array([[elsewhere.ctypes.data, 4096]], dtype=np.uint64)
    _raw(pair.inb).send_control(CONTROL_TRANSPORT, _ID.pack(_DESCS, 77) + _MD_LEN.pack(0) + extents.tobytes(),
                                deadline())
    with pytest.raises(DataDistError) as err:
        pair.out.send(TransferId(77), [Segment(ArrayHandle(4096, seed=8), 0, 4096)], deadline(3))
    assert err.value.code == S.LLM_FAILED
    assert not elsewhere.any()
    pair.a_to_b([Segment(ArrayHandle(64, seed=9), 0, 64)], [Segment(ArrayHandle(64), 0, 64)])   # link unharmed


@needs_nixl
def test_a_peer_publishing_more_rows_than_a_link_holds_is_dropped(pair, monkeypatch) -> None:
    """The rows a peer may make this side prepare are bounded per link: past the bound its channel goes."""
    from datadistd.transport.onesided import tables
    monkeypatch.setattr(tables, "MAX_ROWS_LINK", 3 * ROWS)
    pool = ArrayHandle(4 * ROWS * ROW)
    handle, _ = _publish(pair.b, pool, tensors=2)
    assert _entry(pair.a, pair.out, handle)
    _publish(pair.b, pool, at=2 * ROWS * ROW, tensors=2)     # 4 x ROWS rows in all: over
    end = deadline(5)
    while not pair.inb.broken and time.monotonic() < end:
        time.sleep(0.02)
    assert pair.inb.broken and pair.a.agent_name is not None


@needs_nixl
@pytest.mark.parametrize("message", [
    b"Z", b"D\x01", b"M\x00\x05\x00ab", b"F" + b"\x00" * 3, b"P\x01", b"W\x02",
    struct.pack("<cQQQII", b"P", 1, 1, 4096, 1 << 20, 4096),            # more rows than a table may hold
    struct.pack("<cQQQII", b"P", 1, 1, 4096, 4, 1) + bytes(8) + struct.pack("<I", 99),   # truncated metadata
    struct.pack("<cQQQII", b"P", 1, 1, 0, 4, 1) + bytes(8) + bytes(8)])   # rows of no bytes
def test_a_malformed_message_drops_the_channel_not_the_daemon(pair, message: bytes) -> None:
    _raw(pair.out).send_control(CONTROL_TRANSPORT, message, deadline())
    end = deadline(5)
    while not pair.inb.broken and time.monotonic() < end:
        time.sleep(0.02)
    assert pair.inb.broken
    assert pair.b.agent_name is not None   # the transport (and its agent) lives on for its other links


@needs_nixl
def test_a_peer_claiming_our_own_agent_name_is_refused(pair) -> None:
    from datadistd.transport.onesided.wire import META as _META
    from datadistd.transport.onesided.wire import META_HEAD as _META_HEAD
    name = pair.b.agent_name.encode()
    _raw(pair.out).send_control(CONTROL_TRANSPORT, _META_HEAD.pack(_META, 0, len(name)) + name + b"junk",
                                deadline())
    end = deadline(5)
    while not pair.inb.broken and time.monotonic() < end:
        time.sleep(0.02)
    assert pair.inb.broken


def test_missing_wheel_names_the_package(monkeypatch) -> None:
    import builtins

    from datadistd.transport.nixl import ucx
    real = builtins.__import__

    def no_nixl(name, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        if name.split(".")[0] in ucx.MODULES:
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_nixl)
    monkeypatch.setattr(ucx.importlib, "import_module", lambda name: no_nixl(name))
    with pytest.raises(DataDistError) as err:
        ucx.load_api()
    assert err.value.code == S.LLM_FEATURE_NOT_ENABLED and ucx.PACKAGE in err.value.message


@pytest.mark.parametrize("text,seconds", [
    ("3s", 3.5), ("3", 3.5), (" 4S ", 4.5), ("500ms", 1.0), ("250000us", 0.75), ("2m", 120.5),
    ("inf", 0.0), ("auto", 0.0), ("", 0.0), ("soon", 0.0), ("-1s", 0.0), ("0s", 0.0), ("2h", 0.0), ("90m", 0.0)])
def test_the_fence_is_ucx_user_timeout_and_the_kernel_timer(text: str, seconds: float) -> None:
    """How long a transfer past its deadline is waited for: UCX_TCP_USER_TIMEOUT in UCX's time syntax and half a
    second; nothing (0: given up at the deadline) when it bounds nothing or cannot be read."""
    from datadistd.transport.nixl.ucx import fence_seconds
    assert fence_seconds({"UCX_TCP_USER_TIMEOUT": text}) == pytest.approx(seconds)
    assert fence_seconds({}) == 0.0


# -- pairing extents: property tests (pure arithmetic) --

def _rows(draw, total: int, base: int) -> np.ndarray:
    cuts = sorted(set(draw(st.lists(st.integers(1, total - 1), max_size=8)))) if total > 1 else []
    bounds = [0, *cuts, total]
    gaps = draw(st.lists(st.integers(0, 3), min_size=len(bounds) - 1, max_size=len(bounds) - 1))
    extents, at = [], base
    for (lo, hi), gap in zip(zip(bounds[:-1], bounds[1:], strict=True), gaps, strict=True):
        extents.append((at, hi - lo))
        at += hi - lo + gap
    return np.array(extents, dtype=np.uint64)


@st.composite
def two_sides(draw):  # noqa: ANN001, ANN201
    total = draw(st.integers(1, 200))
    return total, _rows(draw, total, 1000), _rows(draw, total, 100_000)


def _bytes_of(extents: np.ndarray) -> list[int]:
    return [int(a) + k for a, n in extents for k in range(int(n))]


@given(two_sides())
@settings(max_examples=200, deadline=None)
def test_pair_extents_covers_the_same_bytes_in_order(case) -> None:
    total, src, dst = case
    s, d = pair_extents(src, dst)
    assert len(s) == len(d) and (s[:, 1] == d[:, 1]).all() and (s[:, 1] > 0).all()
    assert int(s[:, 1].sum()) == total
    assert _bytes_of(s) == _bytes_of(src) and _bytes_of(d) == _bytes_of(dst)
    for k in range(1, len(s)):   # merged: no extent continues its predecessor on both sides
        assert not (s[k, 0] == s[k - 1, 0] + s[k - 1, 1] and d[k, 0] == d[k - 1, 0] + d[k - 1, 1])


def test_pair_extents_refuses_lengths_that_wrap_the_sum_around() -> None:
    """A peer's extents whose 64-bit sum wraps to this side's total: refused, not cut into moves past our extents."""
    with pytest.raises(ValueError, match="2\\*\\*64"):
        pair_extents(np.array([[0x1000, 2**63], [0x9000, 2**63 + 4096]], np.uint64),
                     np.array([[0x5000, 4096]], np.uint64))
    # the same lengths one for one on both sides (the one-to-one case, checked in fewer steps): refused alike
    with pytest.raises(ValueError, match="2\\*\\*64"):
        pair_extents(np.array([[0x1000, 2**63], [0x9000, 2**63]], np.uint64),
                     np.array([[0x5000, 2**63], [0x7000, 2**63]], np.uint64))


def test_pair_extents_refuses_different_totals() -> None:
    with pytest.raises(ValueError):
        pair_extents(np.array([[0, 10]]), np.array([[0, 11]]))
    s, d = pair_extents(np.empty((0, 2)), np.array([[5, 0]]))
    assert len(s) == len(d) == 0
