"""The TCP data plane: two transports in one process on 127.0.0.1, real sockets, byte-exact transfers.

Memory is faked with two small in-test handles over numpy buffers: ``ArrayHandle`` (mapped: ``view()``
gives a memoryview, so bytes land with zero-copy ``recv_into``/``sendmsg``) and ``CopyHandle`` (no
view: ``read_into``/``write_from`` copies, with a ``delay`` knob to make a sender slow).
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from datadist.status import LLMStatusCode as S
from datadistd.core.errors import DataDistError
from datadistd.guard.admission import AdmissionLimits
from datadistd.memory.base import MemoryHandle, Segment
from datadistd.transport import get_transport
from datadistd.transport.base import CONTROL_REPLY
from datadistd.transport.tcp import HEADER, HELLO, TcpTransport
from datadistd.transport.tcp.reactor import THREAD_PREFIX, reactor

pytestmark = pytest.mark.timeout(60)

LOOPBACK = "127.0.0.1"
TOKEN = b"t" * 32


# ---- fake memory --------------------------------------------------------------------------------

from tests.fakes import ArrayHandle  # noqa: E402


class CopyHandle(ArrayHandle):
    """Memory without a mapping (like cross-memory attach): only copies.

    Knobs: ``delay`` seconds per read (a slow source); ``fail`` raised by every read and write.
    """

    def __init__(self, size: int, seed: int | None = None, delay: float = 0.0,
                 fail: Exception | None = None) -> None:
        super().__init__(size, seed)
        self.delay = delay
        self.fail = fail
        self.reads = self.writes = 0

    def view(self) -> memoryview | None:
        return None

    def read_into(self, offset: int, dst: memoryview) -> None:
        self.reads += 1
        if self.fail is not None:
            raise self.fail
        if self.delay:
            time.sleep(self.delay)
        super().read_into(offset, dst)

    def write_from(self, offset: int, src: memoryview | bytes) -> None:
        self.writes += 1
        if self.fail is not None:
            raise self.fail
        super().write_from(offset, src)


def test_fake_handles_satisfy_protocol() -> None:
    assert isinstance(ArrayHandle(4), MemoryHandle) and isinstance(CopyHandle(4), MemoryHandle)


def gather(segments: list[Segment]) -> np.ndarray:
    parts = [seg.handle.arr[seg.offset:seg.offset + seg.length] for seg in segments]  # type: ignore[attr-defined]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint8)


def one(handle: ArrayHandle, offset: int = 0, length: int | None = None) -> list[Segment]:
    return [Segment(handle, offset, handle.size - offset if length is None else length)]


def deadline(seconds: float = 10.0) -> float:
    return time.monotonic() + seconds


# ---- fixtures -------------------------------------------------------------------------------------

class Pair:
    """Transport ``a`` connected to ``b`` with ``streams`` connections: ``out`` on a, ``inb`` on b.

    Unless told otherwise every transfer is striped over all ``streams`` (the daemon's default
    stripe width depends on the CPU count)."""

    def __init__(self, streams: int = 2, **kwargs: object) -> None:
        kwargs.setdefault("stripe", streams)
        self.a = TcpTransport(LOOPBACK, **kwargs)  # type: ignore[arg-type]
        self.b = TcpTransport(LOOPBACK, **kwargs)  # type: ignore[arg-type]
        self.a.start()
        self.b.start()
        self.b.allow(TOKEN)
        self.out = self.a.connect(self.b.endpoint, TOKEN, streams, deadline(5))
        inb = self.b.channel(TOKEN)
        assert inb is not None and inb.streams == streams
        self.inb = inb

    def a_to_b(self, src: list[Segment], dst: list[Segment], seconds: float = 10.0) -> None:
        receipt = self.b.expect(dst, channel=self.inb)
        self.out.send(receipt.transfer_id, src, deadline(seconds))
        receipt.wait(deadline(seconds))
        assert receipt.received == receipt.expected

    def b_to_a(self, src: list[Segment], dst: list[Segment], seconds: float = 10.0) -> None:
        receipt = self.a.expect(dst, channel=self.out)
        self.inb.send(receipt.transfer_id, src, deadline(seconds))
        receipt.wait(deadline(seconds))

    def stop(self) -> None:
        self.a.stop()
        self.b.stop()


@pytest.fixture
def pair():
    p = Pair()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def small_chunks():
    """Tiny chunks (1000 bytes) over 3 streams, so chunks span several segments and stripe widely."""
    p = Pair(streams=3, chunk_size=1000)
    yield p
    p.stop()


def closed_without_reply(s: socket.socket, timeout: float = 3.0) -> bool:
    """The peer closed ``s`` without sending a byte (EOF, or a reset when our bytes were left unread)."""
    s.settimeout(timeout)
    try:
        data = s.recv(16)
    except ConnectionResetError:
        data = b""
    finally:
        s.close()
    return data == b""


def raw_hello(endpoint: str, token: bytes, index: int = 0, count: int = 1, version: int = 1) -> socket.socket:
    """A hand-made authenticated connection (to play a misbehaving peer)."""
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(HELLO.pack(b"DDHL", version, len(token), index, count) + token)
    assert sock.recv(1) == b"\x01"
    return sock


# ---- byte-exact transfers -------------------------------------------------------------------------

def layout(data, total: int, handles: list[ArrayHandle], what: str) -> list[Segment]:  # noqa: ANN001
    """Cut ``total`` bytes into segments laid out with gaps over ``handles`` (no two overlap)."""
    cuts = sorted(data.draw(st.lists(st.integers(1, max(1, total - 1)), max_size=8, unique=True), label=f"{what} cuts"))
    lengths = [b - a for a, b in itertools.pairwise([0, *cuts, total]) if b > a]
    cursor = {id(h): 0 for h in handles}
    segments = []
    for n in lengths:
        h = handles[data.draw(st.integers(0, len(handles) - 1), label=f"{what} handle")]
        gap = data.draw(st.integers(0, 64), label=f"{what} gap")
        segments.append(Segment(h, cursor[id(h)] + gap, n))
        cursor[id(h)] += gap + n
    # the zero-length segment is legal and moves nothing
    if data.draw(st.booleans(), label=f"{what} empty segment"):
        segments.insert(data.draw(st.integers(0, len(segments))), Segment(handles[0], 0, 0))
    return segments


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_segment_lists_byte_exact(small_chunks: Pair, data) -> None:  # noqa: ANN001
    total = data.draw(st.integers(1, 12_000), label="total")
    size = total + 9 * 64
    src_handles = [ArrayHandle(size, seed=1), CopyHandle(size, seed=2)]
    dst_handles = [ArrayHandle(size), CopyHandle(size)]
    src = layout(data, total, src_handles, "src")
    dst = layout(data, total, dst_handles, "dst")
    oracle = [h.arr.copy() for h in dst_handles]
    stream = gather(src)
    pos = 0
    for seg in dst:  # the numpy oracle: the concatenated source, scattered over the destination
        oracle[dst_handles.index(seg.handle)][seg.offset:seg.offset + seg.length] = stream[pos:pos + seg.length]
        pos += seg.length
    if data.draw(st.booleans(), label="a to b"):
        small_chunks.a_to_b(src, dst)
    else:
        small_chunks.b_to_a(src, dst)
    for h, want in zip(dst_handles, oracle, strict=True):
        np.testing.assert_array_equal(h.arr, want)


def test_both_directions_at_once_over_one_channel(pair: Pair) -> None:
    n = 3 << 20
    a_src, b_src = ArrayHandle(n, seed=3), CopyHandle(n, seed=4)
    a_dst, b_dst = CopyHandle(n), ArrayHandle(n)
    errors: list[BaseException] = []

    def run(fn, *args) -> None:  # noqa: ANN001
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(pair.a_to_b, one(a_src), one(b_dst))),
               threading.Thread(target=run, args=(pair.b_to_a, one(b_src), one(a_dst)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors
    np.testing.assert_array_equal(b_dst.arr, a_src.arr)
    np.testing.assert_array_equal(a_dst.arr, b_src.arr)
    assert pair.out.stats()["bytes_sent"] == n and pair.out.stats()["bytes_received"] == n


def test_several_concurrent_transfers_interleave() -> None:
    p = Pair(streams=2, chunk_size=64 << 10)
    try:
        sizes = [1, 1000, 64 << 10, (64 << 10) + 1, 1 << 20, 3 << 20, 5_000_000, 17]
        srcs = [ArrayHandle(s, seed=i) if i % 2 else CopyHandle(s, seed=i) for i, s in enumerate(sizes)]
        dsts = [CopyHandle(s) if i % 3 == 0 else ArrayHandle(s) for i, s in enumerate(sizes)]
        receipts = [p.b.expect(one(d), channel=p.inb) for d in dsts]
        assert len({r.transfer_id for r in receipts}) == len(receipts)
        errors: list[BaseException] = []

        def send(i: int) -> None:
            try:
                p.out.send(receipts[i].transfer_id, one(srcs[i]), deadline())
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(sizes))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        for r in receipts:
            r.wait(deadline())
        assert not errors
        for s, d in zip(srcs, dsts, strict=True):
            np.testing.assert_array_equal(d.arr, s.arr)
        assert p.b.stats()["pending_receipts"] == 0
    finally:
        p.stop()


def test_small_transfer_is_not_stuck_behind_a_big_one() -> None:
    """Chunk-granular interleaving: a one-chunk transfer finishes while a slow 64-chunk one is mid-way."""
    p = Pair(streams=1, chunk_size=64 << 10)
    try:
        big_src = CopyHandle(64 * (64 << 10), seed=5, delay=0.01)  # ~10 ms per chunk to read: >= 0.64 s in all
        big_dst = ArrayHandle(big_src.size)
        big = p.b.expect(one(big_dst), channel=p.inb)
        sender = threading.Thread(target=p.out.send, args=(big.transfer_id, one(big_src), deadline()))
        sender.start()
        time.sleep(0.1)
        small_src, small_dst = ArrayHandle(4096, seed=6), ArrayHandle(4096)
        p.a_to_b(one(small_src), one(small_dst), seconds=5)
        in_flight = big.received < big.expected
        big.wait(deadline())
        sender.join(10)
        assert in_flight, "the small transfer waited for the whole big one"
        np.testing.assert_array_equal(small_dst.arr, small_src.arr)
        np.testing.assert_array_equal(big_dst.arr, big_src.arr)
    finally:
        p.stop()


def test_64mib_over_4_streams_uses_every_connection() -> None:
    p = Pair(streams=4)
    try:
        n = 64 << 20
        src, dst = ArrayHandle(n, seed=7), ArrayHandle(n)
        p.a_to_b(one(src), one(dst))
        assert np.array_equal(dst.arr, src.arr)
        sent = [c["bytes_sent"] for c in p.out.stats()["connections"]]  # type: ignore[union-attr]
        received = [c["bytes_received"] for c in p.inb.stats()["connections"]]  # type: ignore[union-attr]
        assert len(sent) == 4 and all(s > 0 for s in sent) and sum(sent) == n, sent
        assert len(received) == 4 and all(r > 0 for r in received) and sum(received) == n, received
        assert p.a.stats()["bytes_sent"] == n and p.b.stats()["bytes_received"] == n
        assert p.a.stats()["connections"] == 4 and p.b.stats()["channels"] == 1
    finally:
        p.stop()


def test_zero_length_transfer_and_empty_lists(pair: Pair) -> None:
    receipt = pair.b.expect([])
    receipt.wait(time.monotonic())  # already complete, even at a passed deadline
    assert receipt.expected == 0
    pair.out.send(receipt.transfer_id, [Segment(ArrayHandle(4), 2, 0)], deadline())


def test_segments_outside_their_memory_are_refused_before_anything_moves(pair: Pair) -> None:
    h = ArrayHandle(100)
    with pytest.raises(DataDistError) as err:
        pair.b.expect([Segment(h, 90, 20)])
    assert err.value.code == S.LLM_PARAM_INVALID
    with pytest.raises(DataDistError) as err:
        pair.out.send(123, [Segment(h, -1, 5)], deadline())
    assert err.value.code == S.LLM_PARAM_INVALID
    assert pair.out.stats()["bytes_sent"] == 0


# ---- authentication and a hostile network ---------------------------------------------------------

def test_wrong_token_is_refused_and_no_bytes_land(pair: Pair, caplog: pytest.LogCaptureFixture) -> None:
    wrong = b"w" * 32
    before = pair.b.stats()
    with caplog.at_level(logging.WARNING, logger="datadistd.transport.tcp"):
        with pytest.raises(DataDistError) as err:
            pair.a.connect(pair.b.endpoint, wrong, 2, deadline(5))
    assert err.value.code == S.LLM_LINK_FAILED and pair.b.endpoint in err.value.message
    assert pair.b.channel(wrong) is None
    after = pair.b.stats()
    assert after["bytes_received"] == before["bytes_received"] and after["channels"] == 1
    refusals = [r.getMessage() for r in caplog.records if "token not accepted" in r.getMessage()]
    assert refusals and all("127.0.0.1:" in m for m in refusals)
    assert not any("w" * 8 in r.getMessage() or repr(wrong) in r.getMessage() for r in caplog.records)


def test_revoked_token_closes_the_channel_and_refuses_reconnects(pair: Pair) -> None:
    pair.a_to_b(one(ArrayHandle(1234, seed=19)), one(ArrayHandle(1234)))
    pair.b.revoke(TOKEN)
    assert pair.b.stats()["bytes_received"] == 1234  # counters outlive the channel
    assert pair.b.channel(TOKEN) is None
    limit = deadline(3)
    while not pair.out.broken and time.monotonic() < limit:  # the peer's readers see EOF
        time.sleep(0.01)
    assert pair.out.broken
    with pytest.raises(DataDistError) as err:
        pair.out.send(1, one(ArrayHandle(10)), deadline())
    assert err.value.code == S.LLM_LINK_FAILED
    with pytest.raises(DataDistError) as err:
        pair.a.connect(pair.b.endpoint, TOKEN, 1, deadline(5))
    assert err.value.code == S.LLM_LINK_FAILED


def test_a_data_port_that_never_answers_names_data_ports_the_address_and_the_firewall() -> None:
    """Issue 44, trip 7: a data port behind a firewall that drops (here: a listener that never accepts nor answers
    the hello) failed with "not established by the deadline" and no word of the fix."""
    a = TcpTransport(LOOPBACK, connect_timeout=0.2)
    a.start()
    silent = socket.socket()
    try:
        silent.bind((LOOPBACK, 0))
        silent.listen(1)
        address = f"{LOOPBACK}:{silent.getsockname()[1]}"
        for seconds, code in ((10, S.LLM_LINK_FAILED), (0.2, S.LLM_TIMEOUT)):   # the connect timeout, the deadline
            with pytest.raises(DataDistError) as err:
                a.connect(f"tcp://{address}", TOKEN, 1, deadline(seconds))
            assert err.value.code == code
            for part in (address, "[transport] data_ports", "firewall", 'docs/operations.md "Ports"'):
                assert part in err.value.message, err.value.message
    finally:
        silent.close()
        a.stop()


def test_garbage_on_the_data_port_does_not_break_the_listener() -> None:
    b = TcpTransport(LOOPBACK, connect_timeout=0.5)
    a = TcpTransport(LOOPBACK)
    b.start()
    a.start()
    try:
        b.allow(TOKEN)
        host, port = LOOPBACK, b.port
        hostile = []
        for payload in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 4,       # not a hello at all
                        HELLO.pack(b"DDHL", 99, 4, 0, 1) + b"abcd",      # future protocol version
                        HELLO.pack(b"DDHL", 1, 0, 0, 1),                 # empty token
                        HELLO.pack(b"DDHL", 1, 200, 0, 1),               # token too long
                        HELLO.pack(b"DDHL", 1, 4, 5, 2) + b"abcd",       # stream index >= count
                        HELLO.pack(b"DDHL", 1, 32, 0, 1)[:5],            # truncated, then silence
                        b""):                                           # silence (no hello before timeout)
            s = socket.create_connection((host, port), timeout=5)
            s.sendall(payload)
            hostile.append(s)
        for s in hostile:  # each is closed with no reply, the silent ones after connect_timeout
            assert closed_without_reply(s)
        ch = a.connect(b.endpoint, TOKEN, 2, deadline(5))
        src, dst = ArrayHandle(100_000, seed=8), ArrayHandle(100_000)
        r = b.expect(one(dst))
        ch.send(r.transfer_id, one(src), deadline())
        r.wait(deadline())
        np.testing.assert_array_equal(dst.arr, src.arr)
    finally:
        a.stop()
        b.stop()


def test_malformed_frame_breaks_only_that_channel(pair: Pair) -> None:
    other = b"o" * 16
    pair.b.allow(other)
    evil = raw_hello(pair.b.endpoint, other)
    evil_channel = pair.b.channel(other)
    assert evil_channel is not None
    dst = ArrayHandle(1000)
    waiting = pair.b.expect(one(dst), channel=evil_channel)
    t0 = time.monotonic()
    evil.sendall(b"\xff" * HEADER.size)
    with pytest.raises(DataDistError) as err:
        waiting.wait(deadline(5))
    assert err.value.code == S.LLM_LINK_FAILED and time.monotonic() - t0 < 1.0
    assert evil_channel.broken and closed_without_reply(evil)
    src, ok = ArrayHandle(5000, seed=9), ArrayHandle(5000)
    pair.a_to_b(one(src), one(ok))  # the other channel is untouched
    np.testing.assert_array_equal(ok.arr, src.arr)


def test_overlapping_frames_fail_the_receipt_as_invalid(pair: Pair) -> None:
    other = b"x" * 16
    pair.b.allow(other)
    evil = raw_hello(pair.b.endpoint, other)
    dst = ArrayHandle(100)
    r = pair.b.expect(one(dst))
    frame = HEADER.pack(b"DDFR", 1, r.transfer_id, 0, 60) + b"a" * 60
    overlap = HEADER.pack(b"DDFR", 1, r.transfer_id, 50, 50) + b"b" * 50
    evil.sendall(frame + overlap)
    with pytest.raises(DataDistError) as err:
        r.wait(deadline(5))
    assert err.value.code == S.LLM_PARAM_INVALID and "overlaps" in err.value.message
    assert closed_without_reply(evil)  # a protocol error closes the connection

    pair.b.allow(b"y" * 16)
    evil = raw_hello(pair.b.endpoint, b"y" * 16)
    r = pair.b.expect(one(dst))
    evil.sendall(HEADER.pack(b"DDFR", 1, r.transfer_id, 90, 20) + b"c" * 20)  # runs past the end
    with pytest.raises(DataDistError) as err:
        r.wait(deadline(5))
    assert err.value.code == S.LLM_PARAM_INVALID and "outside" in err.value.message
    evil.close()


# ---- deadlines, breakage, abort ------------------------------------------------------------------

def test_receipt_times_out_within_its_deadline_and_late_bytes_are_discarded(pair: Pair) -> None:
    dst = ArrayHandle(10_000)
    r = pair.b.expect(one(dst), channel=pair.inb)
    t0 = time.monotonic()
    with pytest.raises(DataDistError) as err:
        r.wait(t0 + 0.3)
    elapsed = time.monotonic() - t0
    assert err.value.code == S.LLM_TIMEOUT and 0.3 <= elapsed < 0.8, elapsed
    with pytest.raises(DataDistError) as again:  # the verdict sticks
        r.wait(deadline())
    assert again.value.code == S.LLM_TIMEOUT
    before = pair.b.stats()["bytes_discarded"]
    pair.out.send(r.transfer_id, one(ArrayHandle(10_000, seed=10)), deadline())
    limit = deadline(3)
    while pair.b.stats()["bytes_discarded"] < before + 10_000 and time.monotonic() < limit:
        time.sleep(0.01)
    assert pair.b.stats()["bytes_discarded"] == before + 10_000
    assert not dst.arr.any() and not pair.inb.broken  # nothing landed; the channel is still good


def test_cancelled_receipt_discards_its_bytes(pair: Pair) -> None:
    dst = ArrayHandle(50_000)
    r = pair.b.expect(one(dst))
    r.cancel()
    pair.out.send(r.transfer_id, one(ArrayHandle(50_000, seed=11)), deadline())
    src, ok = ArrayHandle(10, seed=12), ArrayHandle(10)
    pair.a_to_b(one(src), one(ok))  # frames are in order per connection, so the discard is over by now
    assert not dst.arr.any()


def test_cancelled_receipt_is_never_written_after_cancel_returns() -> None:
    """wait()/cancel() return only after every reader left the destination: the memory is free to reuse."""
    p = Pair(streams=2, chunk_size=64 << 10)
    try:
        src = CopyHandle(8 << 20, seed=16, delay=0.005)
        dst = ArrayHandle(src.size)
        r = p.b.expect(one(dst), channel=p.inb)
        sender = threading.Thread(target=p.out.send, args=(r.transfer_id, one(src), deadline()))
        sender.start()
        limit = deadline(5)
        while r.received < (1 << 20) and time.monotonic() < limit:
            time.sleep(0.005)
        r.cancel()
        snapshot = dst.arr.copy()
        sender.join(20)
        assert 0 < np.count_nonzero(snapshot) < src.size
        np.testing.assert_array_equal(dst.arr, snapshot)
        assert not p.inb.broken and p.b.stats()["bytes_discarded"] > 0
    finally:
        p.stop()


def test_memory_errors_fail_the_transfer_not_the_channel(pair: Pair) -> None:
    bad_dst = CopyHandle(10_000, fail=DataDistError(S.LLM_DEVICE_MEM_ERROR, "destination gone"))
    r = pair.b.expect(one(bad_dst), channel=pair.inb)
    pair.out.send(r.transfer_id, one(ArrayHandle(10_000, seed=17)), deadline())
    with pytest.raises(DataDistError) as err:
        r.wait(deadline(5))
    assert err.value.code == S.LLM_DEVICE_MEM_ERROR and "destination gone" in err.value.message

    bad_src = CopyHandle(10_000, fail=DataDistError(S.LLM_DEVICE_MEM_ERROR, "source gone"))
    r = pair.b.expect(one(ArrayHandle(10_000)), channel=pair.inb)
    with pytest.raises(DataDistError) as err:
        pair.out.send(r.transfer_id, one(bad_src), deadline())
    assert err.value.code == S.LLM_DEVICE_MEM_ERROR
    with pytest.raises(DataDistError) as err:  # the receiver learns it by ABORT, with the same code
        r.wait(deadline(5))
    assert err.value.code == S.LLM_DEVICE_MEM_ERROR

    assert not pair.out.broken and not pair.inb.broken
    src, ok = ArrayHandle(1000, seed=18), ArrayHandle(1000)
    pair.a_to_b(one(src), one(ok))
    np.testing.assert_array_equal(ok.arr, src.arr)


def test_abort_propagates_the_status_code(pair: Pair) -> None:
    for code in (S.LLM_KV_CACHE_NOT_EXIST, S.LLM_UNKNOWN_ERROR, S.LLM_FAILED):
        r = pair.b.expect(one(ArrayHandle(100)), channel=pair.inb)
        t0 = time.monotonic()
        pair.out.abort(r.transfer_id, code)
        with pytest.raises(DataDistError) as err:
            r.wait(deadline(5))
        assert err.value.code == code and time.monotonic() - t0 < 1.0
    r = pair.a.expect(one(ArrayHandle(100)))  # and the other way
    pair.inb.abort(r.transfer_id, S.LLM_TIMEOUT)
    with pytest.raises(DataDistError) as err:
        r.wait(deadline(5))
    assert err.value.code == S.LLM_TIMEOUT


def test_peer_closing_mid_transfer_fails_the_receipt_quickly(pair: Pair) -> None:
    other = b"m" * 16
    pair.b.allow(other)
    evil = raw_hello(pair.b.endpoint, other)
    n = 1 << 20
    dst = ArrayHandle(n)
    r = pair.b.expect(one(dst))  # no channel given: learned from the first frame
    evil.sendall(HEADER.pack(b"DDFR", 1, r.transfer_id, 0, n) + b"z" * 1000)
    limit = deadline(3)
    while r.received == 0 and dst.arr[999] == 0 and time.monotonic() < limit:
        time.sleep(0.01)
    t0 = time.monotonic()
    evil.close()
    with pytest.raises(DataDistError) as err:
        r.wait(deadline(10))
    assert err.value.code == S.LLM_LINK_FAILED and time.monotonic() - t0 < 1.0


def test_sender_going_away_fails_waiting_receipts_quickly() -> None:
    p = Pair(streams=2, chunk_size=64 << 10)
    try:
        src = CopyHandle(8 << 20, seed=13, delay=0.01)  # slow: ~1.3 s for the whole transfer
        dst = ArrayHandle(src.size)
        r = p.b.expect(one(dst), channel=p.inb)
        sender = threading.Thread(target=lambda: pytest.raises(DataDistError, p.out.send, r.transfer_id,
                                                                 one(src), deadline()))
        sender.start()
        time.sleep(0.2)
        t0 = time.monotonic()
        p.a.stop()  # the sending daemon dies mid-transfer
        with pytest.raises(DataDistError) as err:
            r.wait(deadline(10))
        assert err.value.code == S.LLM_LINK_FAILED and time.monotonic() - t0 < 1.5
        sender.join(10)
        assert p.inb.broken
    finally:
        p.stop()


def test_receiver_going_away_fails_the_send_quickly() -> None:
    p = Pair(streams=2, chunk_size=64 << 10)
    try:
        src = CopyHandle(8 << 20, seed=14, delay=0.01)
        r = p.b.expect(one(ArrayHandle(src.size)))
        outcome: list[BaseException] = []

        def send() -> None:
            try:
                p.out.send(r.transfer_id, one(src), deadline(20))
            except BaseException as exc:  # noqa: BLE001
                outcome.append(exc)

        t = threading.Thread(target=send)
        t.start()
        time.sleep(0.2)
        t0 = time.monotonic()
        p.b.stop()
        t.join(10)
        assert time.monotonic() - t0 < 1.5
        assert len(outcome) == 1 and isinstance(outcome[0], DataDistError)
        assert outcome[0].code == S.LLM_LINK_FAILED
        assert p.out.broken
    finally:
        p.stop()


class Tarpit:
    """A fake data plane that says hello back (optionally) and then never reads a byte."""

    def __init__(self, ack: bool = True) -> None:
        self.listener = socket.create_server((LOOPBACK, 0))
        self.listener.settimeout(0.1)
        self.endpoint = f"tcp://{LOOPBACK}:{self.listener.getsockname()[1]}"
        self.ack = ack
        self.conns: list[socket.socket] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                s, _ = self.listener.accept()
            except TimeoutError:
                continue
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            self.conns.append(s)
            if self.ack:
                s.settimeout(2)
                s.recv(HELLO.size + len(TOKEN))
                s.sendall(b"\x01")

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(2)
        for s in self.conns:
            s.close()
        self.listener.close()


def test_send_to_a_stalled_peer_times_out_at_its_deadline() -> None:
    pit = Tarpit()
    a = TcpTransport(LOOPBACK, sndbuf=64 << 10)
    a.start()
    try:
        ch = a.connect(pit.endpoint, TOKEN, 2, deadline(5))
        t0 = time.monotonic()
        with pytest.raises(DataDistError) as err:
            ch.send(7, one(ArrayHandle(64 << 20)), t0 + 0.5)
        elapsed = time.monotonic() - t0
        assert err.value.code == S.LLM_TIMEOUT and elapsed < 1.0, elapsed
        assert ch.broken  # a half-written frame makes the stream unusable
    finally:
        a.stop()
        pit.close()


def test_connect_failures() -> None:
    a = TcpTransport(LOOPBACK)
    a.start()
    pit = Tarpit(ack=False)
    try:
        with socket.socket() as s:
            s.bind((LOOPBACK, 0))
            closed_port = s.getsockname()[1]
        closed = f"tcp://{LOOPBACK}:{closed_port}"
        with pytest.raises(DataDistError) as err:
            a.connect(closed, TOKEN, 1, deadline(5))
        assert err.value.code == S.LLM_LINK_FAILED and closed in err.value.message
        t0 = time.monotonic()
        with pytest.raises(DataDistError) as err:
            a.connect(pit.endpoint, TOKEN, 2, t0 + 0.3)  # never acknowledged
        assert err.value.code == S.LLM_TIMEOUT and time.monotonic() - t0 < 0.8
        with pytest.raises(DataDistError) as err:
            a.connect(closed, TOKEN, 1, time.monotonic() - 1)
        assert err.value.code == S.LLM_TIMEOUT
        for bad_endpoint, bad_token, streams in (("udp://x:1", TOKEN, 1), (closed, b"", 1), (closed, b"x" * 65, 1),
                                                 (closed, TOKEN, 0)):
            with pytest.raises(DataDistError) as err:
                a.connect(bad_endpoint, bad_token, streams, deadline(5))
            assert err.value.code == S.LLM_PARAM_INVALID
    finally:
        a.stop()
        pit.close()


def test_stop_is_bounded_and_idempotent(pair: Pair) -> None:
    pending = pair.b.expect(one(ArrayHandle(10)))
    t0 = time.monotonic()
    pair.a.stop()
    pair.b.stop()
    pair.b.stop()
    assert time.monotonic() - t0 < 3.0
    with pytest.raises(DataDistError) as err:
        pending.wait(deadline())
    assert err.value.code == S.LLM_LINK_FAILED
    assert not [t for t in threading.enumerate() if t.name.startswith("datadist-tcp") and t.is_alive()
                and str(pair.b.port) in t.name]


def _readers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX) and t.is_alive()]


def test_connections_share_a_pool_of_readers_not_a_thread_each() -> None:
    """64 channels of 2 connections (256 sockets over both ends) are read by the process's reactor threads, at most
    ``reactor().size`` of them whatever the number of connections (before: a reader thread per connection, 256),
    and every connection still carries its bytes and control frames."""
    pairs: list[Pair] = []
    try:
        for _ in range(64):
            pairs.append(Pair(streams=2))
        for k, p in enumerate(pairs):
            src, dst = ArrayHandle(8192, seed=k), ArrayHandle(8192)
            p.a_to_b(one(src), one(dst))
            np.testing.assert_array_equal(dst.arr, src.arr)
            got = threading.Event()
            p.out.on_control(lambda kind, payload, got=got: got.set())
            p.inb.send_control(CONTROL_REPLY, b"hi", deadline())
            assert got.wait(5)
        assert sum(p.out.streams + p.inb.streams for p in pairs) == 256
        assert len(_readers()) == reactor().size <= 32
    finally:
        for p in pairs:
            p.stop()


def test_a_connection_is_read_by_one_thread_for_its_life_and_links_spread_over_the_pool() -> None:
    """Each reader thread has its own epoll and share of the data connections (edge-triggered, read dry at each report,
    no re-arm): every control frame of a connection is handed over on the same thread, turn after turn, and the
    connections of several links spread over the pool's threads but the first (which reads the one-shot sockets:
    hellos, attach connections)."""
    pairs = [Pair(streams=1) for _ in range(6)]
    try:
        seen: list[set[str]] = []
        for p in pairs:
            names: set[str] = set()
            got = threading.Semaphore(0)

            def handler(kind: int, payload: bytes, names: set[str] = names, got: threading.Semaphore = got) -> None:
                names.add(threading.current_thread().name)
                got.release()

            p.out.on_control(handler)
            for k in range(20):   # one frame at a time: a turn each
                p.inb.send_control(CONTROL_REPLY, b"x%d" % k, deadline())
                assert got.acquire(timeout=5)
            seen.append(names)
        assert all(len(names) == 1 for names in seen)
        used = set().union(*seen)
        if reactor().size > 1:
            assert f"{THREAD_PREFIX}#1" not in used and len(used) > 1
    finally:
        for p in pairs:
            p.stop()


def test_idle_connections_wake_no_reader_and_a_close_still_ends_them(pair: Pair) -> None:
    """An idle connection waits for its next frame in the reactor's epoll without a timeout: over a second of rest
    no turn runs (before, a reader per connection woke five times a second); a frame wakes one, and stopping the
    transport ends every connection's reading."""
    dst = ArrayHandle(64 << 10)
    pair.a_to_b(one(ArrayHandle(64 << 10, seed=3)), one(dst))   # a frame into mapped memory: _POLL in the frame
    r = reactor()
    before = r.wakeups
    time.sleep(1.0)
    assert r.wakeups == before
    got = threading.Event()
    pair.out.on_control(lambda kind, payload: got.set())
    pair.inb.send_control(CONTROL_REPLY, b"wake", deadline())
    assert got.wait(5)
    assert r.wakeups > before
    conns = pair.out._conns + pair.inb._conns
    pair.a.stop()
    pair.b.stop()
    assert all(c.ended.is_set() for c in conns)


def _runs(thread: threading.Thread) -> int:
    """How many times the kernel has run ``thread`` (``/proc/self/task/<tid>/schedstat``: its third field)."""
    with open(f"/proc/self/task/{thread.native_id}/schedstat") as f:
        return int(f.read().split()[2])


def test_an_idle_listener_sleeps_until_a_newcomer_or_a_hellos_deadline() -> None:
    """The accept loop has nothing periodic: with no newcomer its thread sleeps in ``accept`` (before, it woke
    five times a second, in every engine that listens); a newcomer wakes it, and it then wakes again at that
    hello's deadline to close it -- and after it, sleeps again."""
    t = TcpTransport(LOOPBACK, connect_timeout=0.5)
    t.start()
    try:
        accept = next(th for th in threading.enumerate() if th.name == f"datadist-tcp-accept:{t.port}")
        time.sleep(0.2)   # the loop reached accept
        before = _runs(accept)
        time.sleep(1.0)
        assert _runs(accept) - before <= 1
        stranger = socket.create_connection((LOOPBACK, t.port))
        try:
            stranger.settimeout(10)
            assert stranger.recv(1) == b""   # closed at its deadline: the loop woke for it
        finally:
            stranger.close()
        time.sleep(0.2)
        before = _runs(accept)
        time.sleep(1.0)
        assert _runs(accept) - before <= 1
    finally:
        t.stop()
    assert not accept.is_alive()


def test_strangers_hold_no_thread_and_leave_at_their_deadline() -> None:
    """Pre-auth connections are read by the reactor too: 40 strangers that send nothing, or half a hello, add no
    thread (before: a thread each until its deadline); the accept loop closes each at its deadline."""
    t = TcpTransport(LOOPBACK, connect_timeout=1.0, admission=AdmissionLimits(per_source=64, preauth_total=64))
    t.start()
    strangers: list[socket.socket] = []
    try:
        threads = threading.active_count()
        for k in range(40):
            s = socket.create_connection((LOOPBACK, t.port))
            if k % 2:
                s.sendall(HELLO.pack(b"DDHL", 1, 32, 0, 1)[:5])
            strangers.append(s)
        limit = time.monotonic() + 10
        while t.admission_stats().get("preauth", 0) < 40 and time.monotonic() < limit:
            time.sleep(0.01)
        assert t.admission_stats()["preauth"] == 40
        assert threading.active_count() <= threads + reactor().size
        for s in strangers:   # closed by the listener at its deadline: EOF
            s.settimeout(10)
            assert s.recv(1) == b""
        assert t.admission_stats()["preauth"] == 0
    finally:
        for s in strangers:
            s.close()
        t.stop()


def test_a_peer_stalling_in_the_middle_of_a_frame_loses_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection that sent a frame's header and then nothing does not hold a reactor thread for ever: after
    ``_STALL`` seconds without a byte of the frame the connection is dropped and its channel broken."""
    from datadistd.transport.tcp import conn as conn_mod

    monkeypatch.setattr(conn_mod, "_STALL", 0.5)
    b = TcpTransport(LOOPBACK)
    b.start()
    b.allow(TOKEN)
    s = socket.create_connection((LOOPBACK, b.port))
    try:
        s.sendall(HELLO.pack(b"DDHL", 1, len(TOKEN), 0, 1) + TOKEN)
        s.settimeout(5)
        assert s.recv(1) == b"\x01"
        s.sendall(HEADER.pack(b"DDFR", CONTROL_REPLY, 0, 0, 100) + b"x" * 10)   # 10 of 100 bytes, then silence
        assert s.recv(1) == b""   # the data plane closed it
        channel = b.channel(TOKEN)
        assert channel is not None
        assert channel._conns[0].ended.wait(5)   # its reading ended: the channel heard of it first
        assert channel.broken and "sent nothing of a frame" in channel.reason
    finally:
        s.close()
        b.stop()


def test_registry_loads_tcp_by_name() -> None:
    t = get_transport("tcp", host=LOOPBACK, port=0, chunk_size=1 << 20, connect_timeout=1.0)
    assert isinstance(t, TcpTransport) and t.name == "tcp"
    t.start()
    try:
        assert t.endpoint == f"tcp://{LOOPBACK}:{t.port}" and t.port > 0
    finally:
        t.stop()


def test_stripe_width_bounds_the_connections_one_transfer_uses() -> None:
    """``stripe=1``: a transfer goes over one connection; successive transfers rotate over all of them."""
    p = Pair(streams=3, chunk_size=64 << 10, stripe=1)
    try:
        for k in range(3):
            src, dst = ArrayHandle(1 << 20, seed=20 + k), ArrayHandle(1 << 20)
            before = [c["bytes_sent"] for c in p.out.stats()["connections"]]  # type: ignore[union-attr]
            p.a_to_b(one(src), one(dst))
            after = [c["bytes_sent"] for c in p.out.stats()["connections"]]  # type: ignore[union-attr]
            assert sum(a != b for a, b in zip(after, before, strict=True)) == 1
            np.testing.assert_array_equal(dst.arr, src.arr)
        assert all(c["bytes_sent"] > 0 for c in p.out.stats()["connections"])  # type: ignore[union-attr]
        with pytest.raises(DataDistError):
            TcpTransport(LOOPBACK, stripe=-1)
    finally:
        p.stop()


def test_try_send_small_transfers_inline_and_declines_without_side_effects(pair: Pair) -> None:
    """``try_send`` (the event loop's path for small reads): byte-exact when it sends; False and no bytes when
    the transfer is too big or every connection is busy."""
    from datadistd.transport import tcp

    for src in (ArrayHandle(3000, seed=31), CopyHandle(3000, seed=32)):  # mapped, and through staging
        dst = ArrayHandle(3000)
        r = pair.b.expect(one(dst), channel=pair.inb)
        assert pair.out.try_send(r.transfer_id, one(src), deadline())
        r.wait(deadline())
        np.testing.assert_array_equal(dst.arr, src.arr)
    big = ArrayHandle(tcp._INLINE_MAX + 1, seed=33)
    sent = pair.out.stats()["bytes_sent"]
    assert not pair.out.try_send(12345, one(big), deadline())
    conns = pair.out._live()
    for c in conns:
        assert c.lock.acquire(timeout=1)
    try:
        assert not pair.out.try_send(12345, one(ArrayHandle(10, seed=34)), deadline())
    finally:
        for c in conns:
            c.lock.release()
    assert pair.out.stats()["bytes_sent"] == sent
    assert pair.out.try_send(12345, [], deadline())  # nothing to send is done at once


def test_stripe_senders_are_bounded_and_leave_when_the_channel_is_idle() -> None:
    """Striped sends run on the channel's own sender threads (bounded by the pool, not by the sends), and an idle
    channel keeps none: they leave when the last striped send ended (before: kept until the channel closed)."""
    p = Pair(streams=3, chunk_size=4096)
    try:
        mine = f"datadist-tcp-send:{p.out.peer}_"   # only this channel's: other tests' channels may linger
        seen: set[str] = set()

        def senders() -> set[str]:
            return {t.name for t in threading.enumerate() if t.name.startswith(mine) and t.is_alive()}

        slow = CopyHandle(64 * 1024, seed=1, delay=0.001)   # each chunk read takes a while: threads seen running
        sends = [threading.Thread(target=p.a_to_b, args=(one(slow), one(ArrayHandle(64 * 1024)))) for _ in range(4)]
        for t in sends:
            t.start()
        while any(t.is_alive() for t in sends):
            seen |= senders()
            time.sleep(0.001)
        assert 0 < len(seen) <= 4 * (3 - 1), seen
        assert p.out._pool is None
        limit = time.monotonic() + 5
        while senders() and time.monotonic() < limit:   # shut down: each leaves as its last share returns
            time.sleep(0.02)
        assert not senders()
    finally:
        p.stop()


def test_data_ports_bind_the_first_free_port_of_the_range() -> None:
    """[transport] data_ports: a firewall opens exactly the configured ports (issue 29, finding 4)."""
    from tests.daemonproc import free_port

    first = free_port()
    taken = socket.socket()
    made: list[TcpTransport] = []
    try:
        taken.bind(("127.0.0.1", first))          # someone else holds the first port of the range
        t = TcpTransport("127.0.0.1", ports=(first, first + 1))
        made.append(t)
        t.start()
        assert t.endpoint == f"tcp://127.0.0.1:{first + 1}"
        full = TcpTransport("127.0.0.1", ports=(first, first + 1))
        with pytest.raises(DataDistError) as info:
            full.start()
        assert info.value.code == S.LLM_LINK_FAILED
        assert f"every port of [transport] data_ports {first}-{first + 1} is in use" in info.value.message
    finally:
        taken.close()
        for t in made:
            t.stop()


def test_try_control_parts_sends_views_as_one_frame_and_lets_go_once(pair: Pair) -> None:
    """``try_control_parts`` (an owner's small read answered from a reader thread): header and parts in one frame,
    byte-exact; ``unlock`` called exactly once and the parts list emptied, whether it sent or declined (every
    connection busy: False, nothing sent)."""
    got: list[tuple[int, bytes]] = []
    arrived = threading.Event()

    def handler(kind: int, payload: bytes) -> None:
        got.append((kind, payload))
        arrived.set()

    pair.inb.on_control(handler)
    memory = np.arange(4096, dtype=np.uint8)
    calls: list[int] = []
    parts: list = [b"head", memoryview(memory)[100:300], memoryview(memory)[1000:1001]]
    assert pair.out.try_control_parts(CONTROL_REPLY, parts, lambda: calls.append(len(parts)))
    assert arrived.wait(5)
    assert got == [(CONTROL_REPLY, b"head" + memory[100:300].tobytes() + memory[1000:1001].tobytes())]
    assert calls == [0] and parts == []
    conns = pair.out._live()
    for c in conns:
        assert c.lock.acquire(timeout=1)
    try:
        sent = pair.out.stats()["frames_sent"]
        parts = [b"head", memoryview(memory)]
        assert not pair.out.try_control_parts(CONTROL_REPLY, parts, lambda: calls.append(len(parts)))
        assert calls == [0, 0] and parts == [] and pair.out.stats()["frames_sent"] == sent
    finally:
        for c in conns:
            c.lock.release()


def test_try_control_parts_lets_go_of_the_memory_before_it_waits_for_a_stalled_peer() -> None:
    """A frame the full socket of a peer that stopped reading took only in part: its rest is copied and ``unlock``
    called (the parts emptied) before the rest is finished with blocking sends -- which time out, closing the
    channel (``LLM_TIMEOUT``); the caller's memory is not read after ``unlock``."""
    pit = Tarpit()
    a = TcpTransport(LOOPBACK, sndbuf=64 << 10)
    a.start()
    try:
        ch = a.connect(pit.endpoint, TOKEN, 1, deadline(5))
        memory = bytearray(8 << 20)
        parts: list = [b"head", memoryview(memory)]
        seen: list[tuple[int, bool]] = []
        with pytest.raises(DataDistError) as err:
            ch.try_control_parts(CONTROL_REPLY, parts, lambda: seen.append((len(parts), ch.broken)))
        assert seen == [(0, False)]           # once, the parts gone, before the wait that broke the channel
        assert err.value.code == S.LLM_TIMEOUT and ch.broken
        memory.extend(b"x")                    # no view of the memory is left (a resize would raise BufferError)
    finally:
        a.stop()
        pit.close()


def test_try_control_finishes_a_frame_cut_short_or_breaks_the_channel_at_its_bound() -> None:
    """``try_control``'s flat path when the socket takes a frame only in part (a peer that stopped reading): the
    rest is finished by blocking sends within ``_INLINE_FINISH``, which time out here: the channel breaks and the
    send raises ``LLM_TIMEOUT``, as the general path does."""
    pit = Tarpit()
    a = TcpTransport(LOOPBACK, sndbuf=64 << 10)
    a.start()
    try:
        ch = a.connect(pit.endpoint, TOKEN, 1, deadline(5))
        with pytest.raises(DataDistError) as err:
            ch.try_control(CONTROL_REPLY, bytes(8 << 20), deadline(5))
        assert err.value.code == S.LLM_TIMEOUT and ch.broken
    finally:
        a.stop()
        pit.close()


def test_try_send_soon_sends_a_frame_from_the_loop_and_finishes_what_the_socket_took_in_part() -> None:
    """``try_send_soon`` (the event loop's path for a read of one frame): a frame larger than the sockets hold
    goes out in part at once and the rest from the loop as the receiver drains it (``LoopFinish``) -- the loop
    keeps running meanwhile -- byte-exact; declined, with no side effect, past ``chunk_size``, for memory without
    a mapping and when every connection is busy."""
    import asyncio

    from datadistd.transport.tcp.loopsend import LoopFinish

    p = Pair(streams=1, chunk_size=8 << 20, sndbuf=64 << 10, rcvbuf=64 << 10)
    try:
        src, dst = ArrayHandle(6 << 20, seed=41), ArrayHandle(6 << 20)
        r = p.b.expect(one(dst), channel=p.inb)

        async def run() -> tuple[object, int]:
            sent = p.out.try_send_soon(r.transfer_id, one(src), deadline())
            ticks = 0
            if isinstance(sent, LoopFinish):
                waiting = asyncio.ensure_future(sent.wait())
                while not waiting.done():   # the loop is not blocked by the frame's rest
                    ticks += 1
                    await asyncio.sleep(0)
                await waiting
            return sent, ticks

        sent, ticks = asyncio.run(run())
        assert isinstance(sent, LoopFinish) and ticks > 0
        r.wait(deadline())
        np.testing.assert_array_equal(dst.arr, src.arr)
        conn = p.out._live()[0]
        assert not conn.lock.locked and conn.frames_sent == 1 and conn.bytes_sent == 6 << 20

        async def declined() -> list[object]:
            out = [p.out.try_send_soon(12345, one(ArrayHandle((8 << 20) + 1)), deadline()),
                   p.out.try_send_soon(12345, one(CopyHandle(1 << 20)), deadline())]
            assert conn.lock.acquire(timeout=1)
            try:
                out.append(p.out.try_send_soon(12345, one(ArrayHandle(1 << 20)), deadline()))
            finally:
                conn.lock.release()
            return out

        assert asyncio.run(declined()) == [False, False, False]
        assert p.out.stats()["bytes_sent"] == 6 << 20 and not p.out.broken
    finally:
        p.stop()


def test_try_send_soon_declines_a_frame_of_more_buffers_than_one_sendmsg_takes() -> None:
    """A read of one frame whose blocks lie apart needs a buffer each: past the iovec limit (1,024 with the header)
    ``try_send_soon`` declines with no side effect -- ``sendmsg`` would fail with EMSGSIZE and, taken for a socket
    error, break the channel -- and the thread's ``send`` moves it byte-exact."""
    import asyncio

    p = Pair(streams=1, chunk_size=8 << 20)
    try:
        src, dst = ArrayHandle(1100 * 1024, seed=43), ArrayHandle(1100 * 512)
        scattered = [Segment(src, i * 1024, 512) for i in range(1100)]   # 550 KB in 1,100 pieces, none adjacent
        r = p.b.expect(one(dst), channel=p.inb)

        async def soon() -> object:
            return p.out.try_send_soon(r.transfer_id, scattered, deadline())

        assert asyncio.run(soon()) is False
        assert not p.out.broken and p.out.stats()["bytes_sent"] == 0
        p.out.send(r.transfer_id, scattered, deadline())
        r.wait(deadline())
        np.testing.assert_array_equal(dst.arr, src.arr.reshape(1100, 1024)[:, :512].reshape(-1))
    finally:
        p.stop()


@pytest.mark.parametrize("how", ["deadline", "cancelled"])
def test_try_send_soon_to_a_stalled_peer_gives_the_frame_up_and_breaks_the_channel(how: str) -> None:
    """The rest of a frame a stalled peer never takes: at its deadline (``LLM_TIMEOUT``) or when its waiter is
    cancelled, the frame is given up before ``wait`` returns -- the connection is shut (its stream is cut mid-frame),
    the channel broken and the send lock given back -- so the caller may let the source go."""
    import asyncio

    from datadistd.transport.tcp.loopsend import LoopFinish

    pit = Tarpit()
    a = TcpTransport(LOOPBACK, sndbuf=64 << 10)
    a.start()
    try:
        ch = a.connect(pit.endpoint, TOKEN, 1, deadline(5))

        async def run() -> BaseException:
            sent = ch.try_send_soon(7, one(ArrayHandle(2 << 20)), time.monotonic() + 0.3)
            assert isinstance(sent, LoopFinish)
            waiting = asyncio.ensure_future(sent.wait())
            if how == "cancelled":
                await asyncio.sleep(0.05)
                waiting.cancel()
            try:
                await waiting
            except BaseException as exc:  # noqa: BLE001 - what the wait ended with
                return exc
            raise AssertionError("a frame nobody reads went out")

        exc = asyncio.run(run())
        if how == "deadline":
            assert isinstance(exc, DataDistError) and exc.code == S.LLM_TIMEOUT
        else:
            assert isinstance(exc, asyncio.CancelledError)
        conn = ch._conns[0]
        assert ch.broken and conn.closed
        assert conn.ended.wait(5) and not conn.lock.locked   # its reader closed it: the lock was given back
    finally:
        a.stop()
        pit.close()


@pytest.mark.parametrize("sent", range(0, 10))
def test_drop_sent_leaves_exactly_the_bytes_not_yet_sent(sent: int) -> None:
    """``drop_sent`` (what a partial ``sendmsg`` of a frame leaves): at a buffer's boundary, inside one, and across
    empty buffers -- what is left is the frame's bytes from ``sent`` on, with no empty buffer in front."""
    from datadistd.transport.tcp.wire import drop_sent

    frame = b"abcdefghi"
    bufs = [memoryview(b"abc"), memoryview(b""), memoryview(b"def"), memoryview(b""), memoryview(b"ghi"),
            memoryview(b"")]
    drop_sent(bufs, sent)
    assert b"".join(bufs) == frame[sent:]
    assert not bufs or len(bufs[0]) > 0


def test_a_peers_end_that_came_with_its_last_bytes_is_read_to() -> None:
    """A data connection is edge-triggered and its turn takes a short receive for "drained" (``DataConn.turn``). When
    the peer's last bytes and its end arrive before the reader wakes, they make one event: the turn reads the bytes
    short and returns -- and no edge comes for the end. The reactor runs such a turn once more, so it meets the end
    (a channel whose peer closed right after its last frame tells its link at once, not at the next heartbeat)."""
    ours, theirs = socket.socketpair()
    theirs.sendall(b"last bytes")
    theirs.close()            # both are there before the socket is registered: one event, IN and RDHUP
    seen: list[bytes] = []
    ended = threading.Event()
    pool = reactor()   # the process's: a pool of its own would leave threads a link-count test counts

    def turn() -> bool:
        data = ours.recv(4096, socket.MSG_DONTWAIT)   # short: "drained", as a data connection's turn takes it
        seen.append(data)
        if not data:
            pool.remove(ours.fileno())
            ended.set()
        return False

    pool.add_stream(ours.fileno(), turn)
    try:
        assert ended.wait(5), f"the end was never read: {seen}"
        assert seen == [b"last bytes", b""]
    finally:
        ours.close()
