"""The TCP reader's turn (``conn.DataConn.turn``) against a hand-made peer on loopback. A control frame's payload
is read with the next frame's header in one receive, and behind control frames in a row a header is read with up to
``_READ_AHEAD`` bytes: what was read ahead is carried over to whoever reads the stream next. These tests fail when
the carry-over is wrong: frames split at every byte, coalesced, a DATA frame right behind control frames (its
payload must land whole: mapped, staged, discarded), a turn's frame bound, and hostile bytes right behind a good
frame (each check of the reader still holds: magic, kind, bounds, EOF inside a frame, the stall)."""

from __future__ import annotations

import queue
import socket
import threading
import time

import numpy as np
import pytest

from datadistd.transport.base import CONTROL_CALL, CONTROL_DOWN, CONTROL_REPLY, CONTROL_TRANSPORT
from datadistd.transport.tcp import HEADER, MAX_CONTROL
from datadistd.transport.tcp.channel import TcpChannel
from datadistd.transport.tcp.reactor import reactor
from datadistd.transport.tcp.wire import _READ_AHEAD, _TURN_FRAMES, KIND_DATA, KIND_PING
from tests.fakes import ArrayHandle
from tests.reliability.common import wait_until
from tests.unit.test_transport_tcp import CopyHandle, Pair, closed_without_reply, deadline, one, raw_hello

pytestmark = pytest.mark.timeout(60)

EVIL = b"e" * 16


@pytest.fixture
def pair():
    p = Pair(streams=1)
    yield p
    p.stop()


def frame(kind: int, payload: bytes = b"", tid: int = 0, offset: int = 0, length: int | None = None) -> bytes:
    return HEADER.pack(b"DDFR", kind, tid, offset, len(payload) if length is None else length) + payload


def peer(pair: Pair) -> tuple[socket.socket, TcpChannel, queue.Queue]:
    """A hand-made connection to ``pair.b`` whose channel's control frames go to a queue (the fast path)."""
    pair.b.allow(EVIL)
    sock = raw_hello(pair.b.endpoint, EVIL)
    channel = pair.b.channel(EVIL)
    assert channel is not None
    got: queue.Queue = queue.Queue()
    channel.on_control(lambda kind, payload: got.put((kind, bytes(payload))))
    return sock, channel, got


def take(got: queue.Queue, n: int) -> list[tuple[int, bytes]]:
    return [got.get(timeout=5) for _ in range(n)]


def test_control_frames_split_at_every_byte_arrive_whole_and_in_order(pair: Pair) -> None:
    """Three control frames (one without a payload) sent in two parts, cut at every byte: the reader gets the first
    part (waiting for the frames it completes), then the rest; every frame is handed on whole, in order."""
    sock, _, got = peer(pair)
    frames = [(CONTROL_CALL, b"first"), (CONTROL_REPLY, b""), (CONTROL_TRANSPORT, bytes(range(40)))]
    stream = b"".join(frame(k, p) for k, p in frames)
    ends = np.cumsum([HEADER.size + len(p) for _, p in frames])
    for cut in range(1, len(stream)):
        sock.sendall(stream[:cut])
        whole = int((ends <= cut).sum())
        early = take(got, whole)
        time.sleep(0.002)   # the reader takes the part of the frame it has (the test holds either way)
        sock.sendall(stream[cut:])
        assert early + take(got, len(frames) - whole) == frames, cut
    assert got.empty()


def test_a_data_frame_right_behind_a_control_frame_lands_whole(pair: Pair) -> None:
    """A control frame, a DATA frame and another control frame, in one segment and then cut at every byte: the DATA
    frame's payload lands byte-exact in its destination (the reader never read it with the control frame) and the
    control frames are handed on, in order."""
    sock, channel, got = peer(pair)
    payload = bytes(range(256)) * 2
    for cut in [None, *range(1, 2 * HEADER.size + 8 + len(payload))]:
        dst = ArrayHandle(len(payload))
        receipt = pair.b.expect(one(dst), channel=channel)
        stream = (frame(CONTROL_CALL, b"ask") + frame(KIND_DATA, payload, tid=receipt.transfer_id)
                  + frame(CONTROL_REPLY, b"done"))
        if cut is None:
            sock.sendall(stream)
        else:
            sock.sendall(stream[:cut])
            time.sleep(0.001)
            sock.sendall(stream[cut:])
        receipt.wait(deadline(5))
        assert dst.arr.tobytes() == payload, cut
        assert take(got, 2) == [(CONTROL_CALL, b"ask"), (CONTROL_REPLY, b"done")], cut
    assert not channel.broken


def test_frames_coalesced_past_a_turns_bound_are_all_handed_on(pair: Pair) -> None:
    """More frames in one segment than a turn reads (``_TURN_FRAMES``), the last ones without a payload: the frame
    that ends a turn reads no further than itself, so no whole header is left behind in the reader's buffer with
    nothing in the socket to wake it; then PINGs, and frames of every size around the header's."""
    sock, channel, got = peer(pair)
    sock.sendall(frame(CONTROL_CALL, b"x") * (_TURN_FRAMES - 1) + frame(CONTROL_REPLY) * 2)
    assert take(got, _TURN_FRAMES + 1) == [(CONTROL_CALL, b"x")] * (_TURN_FRAMES - 1) + [(CONTROL_REPLY, b"")] * 2
    sizes = range(2 * HEADER.size + 2)
    sock.sendall(b"".join(frame(KIND_PING) + frame(CONTROL_CALL, bytes([n % 256]) * n) for n in sizes))
    assert take(got, len(sizes)) == [(CONTROL_CALL, bytes([n % 256]) * n) for n in sizes]
    assert got.empty() and not channel.broken


BAD = {
    "bad magic": HEADER.pack(b"XXFR", CONTROL_CALL, 0, 0, 1) + b"x",
    "unknown kind": frame(99, b"x"),
    "control frame with a transfer id": frame(CONTROL_CALL, b"x", tid=7),
    "oversized control frame": HEADER.pack(b"DDFR", CONTROL_CALL, 0, 0, MAX_CONTROL + 1),
    "PING with a payload": frame(KIND_PING, b"x"),
}


@pytest.mark.parametrize("bad", sorted(BAD))
def test_a_bad_header_right_behind_a_good_frame_drops_the_connection(pair: Pair, bad: str) -> None:
    """The header read with the previous frame's payload gets every check a header read alone gets."""
    sock, channel, got = peer(pair)
    sock.sendall(frame(CONTROL_CALL, b"good") + BAD[bad])
    assert take(got, 1) == [(CONTROL_CALL, b"good")]
    assert closed_without_reply(sock, timeout=5)
    assert wait_until(lambda: channel.broken, 5) and "protocol error" in channel.reason


@pytest.mark.parametrize("cut", [1, HEADER.size - 1, HEADER.size + 3])
def test_eof_inside_the_frame_behind_a_good_one_breaks_the_channel(pair: Pair, cut: int) -> None:
    """The peer closes inside the next frame's header (part of it carried over) or its payload: the good frame is
    handed on, then the connection is lost as one cut short, not closed cleanly."""
    sock, channel, got = peer(pair)
    sock.sendall(frame(CONTROL_CALL, b"good") + frame(CONTROL_REPLY, b"0123456789")[:cut])
    assert take(got, 1) == [(CONTROL_CALL, b"good")]
    sock.shutdown(socket.SHUT_WR)
    assert wait_until(lambda: channel.broken, 5)
    assert "in the middle of a frame" in channel.reason, channel.reason
    sock.close()


def test_a_clean_close_right_behind_a_frame_is_clean(pair: Pair) -> None:
    sock, channel, got = peer(pair)
    sock.sendall(frame(CONTROL_CALL, b"bye") + frame(CONTROL_REPLY))
    sock.shutdown(socket.SHUT_WR)
    assert take(got, 2) == [(CONTROL_CALL, b"bye"), (CONTROL_REPLY, b"")]
    assert wait_until(lambda: channel.broken, 5) and "the peer closed the connection" in channel.reason
    assert "middle" not in channel.reason
    sock.close()


def test_a_peer_stalling_inside_a_handled_control_frame_loses_the_connection(
        pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stall deadline holds on the handled (fast) path too: a frame's header and part of its payload behind a
    good frame, then silence."""
    from datadistd.transport.tcp import conn as conn_mod

    monkeypatch.setattr(conn_mod, "_STALL", 0.5)
    sock, channel, got = peer(pair)
    sock.sendall(frame(CONTROL_CALL, b"good") + frame(CONTROL_REPLY, b"x" * 100)[:HEADER.size + 10])
    assert take(got, 1) == [(CONTROL_CALL, b"good")]
    sock.settimeout(5)
    assert sock.recv(1) == b""   # the reader closed it
    assert wait_until(lambda: channel.broken, 5) and "sent nothing of a frame" in channel.reason
    assert [kind for kind, _ in take(got, 1)] == [CONTROL_DOWN]   # and nothing of the frame cut short
    sock.close()


def two_in_a_row(sock: socket.socket, channel: TcpChannel, got: queue.Queue) -> None:
    """Control frames in a row: from now on the reader reads ahead (``_READ_AHEAD`` bytes per header)."""
    sock.sendall(frame(CONTROL_CALL, b"1") + frame(CONTROL_CALL, b"2"))
    assert take(got, 2) == [(CONTROL_CALL, b"1"), (CONTROL_CALL, b"2")]
    assert channel._conns[0]._controls >= 2


@pytest.mark.parametrize("size", [100, _READ_AHEAD + 5000])
@pytest.mark.parametrize("into", ["mapped", "copied", "unknown transfer", "cancelled"])
def test_a_data_frame_read_ahead_behind_control_frames_lands_whole(pair: Pair, into: str, size: int) -> None:
    """Behind control frames in a row the reader reads ahead: a DATA frame there (whole, or its start when longer
    than the read-ahead) gets its bytes read ahead first, then the socket's -- into mapped memory, through the
    staging buffer (memory without a view), or discarded (no such transfer, a cancelled one) -- and the frames
    behind it are handed on whole, in order."""
    sock, channel, got = peer(pair)
    two_in_a_row(sock, channel, got)
    payload = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    dst = CopyHandle(size) if into == "copied" else ArrayHandle(size)
    receipt = pair.b.expect(one(dst), channel=channel)
    if into == "cancelled":
        receipt.cancel()
    tid = 999_999 if into == "unknown transfer" else receipt.transfer_id
    discarded = pair.b.stats()["bytes_discarded"]
    sock.sendall(frame(CONTROL_CALL, b"a") + frame(KIND_DATA, payload, tid=tid) + frame(CONTROL_REPLY, b"b")
                 + frame(CONTROL_REPLY, b"c" * 40))
    assert take(got, 3) == [(CONTROL_CALL, b"a"), (CONTROL_REPLY, b"b"), (CONTROL_REPLY, b"c" * 40)]
    if into in ("mapped", "copied"):
        receipt.wait(deadline(5))
        assert dst.arr.tobytes() == payload
    else:
        assert pair.b.stats()["bytes_discarded"] == discarded + size and not dst.arr.any()
    assert not channel.broken


def test_control_frames_around_the_read_ahead_size_arrive_whole(pair: Pair) -> None:
    """Behind control frames in a row, frames a little shorter and longer than the read-ahead, and much longer, all
    in the socket: each is handed on whole and in order, whether it was read ahead whole, in part (its rest read
    alone, being too long, or with the next header) or not at all."""
    sock, channel, got = peer(pair)
    two_in_a_row(sock, channel, got)
    sizes = [*range(_READ_AHEAD - 3 * HEADER.size, _READ_AHEAD + 2 * HEADER.size, 7), 3 * _READ_AHEAD, 5, 0]
    frames = [(CONTROL_REPLY, bytes([n % 251]) * n) for n in sizes]
    for _ in range(2):   # the second time the reader starts in the read-ahead mode the first left
        sock.sendall(b"".join(frame(k, p) for k, p in frames))
        assert take(got, len(frames)) == frames
    assert not channel.broken


def test_a_turn_ends_at_its_frame_bound(
        pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """Control frames of more than half the read-ahead, all in the socket: what a read-ahead leaves of one is read
    with the next header, but not past the turn's frame bound -- the turn ends there (the others' turn) and the next
    one goes on."""
    from datadistd.transport.tcp import conn as conn_mod

    monkeypatch.setattr(conn_mod, "_TURN_FRAMES", 2)
    sock, channel, _ = peer(pair)
    release = threading.Event()
    got: queue.Queue = queue.Queue()

    def handler(kind: int, payload: bytes) -> None:   # the first frame holds the reader until all are sent
        release.wait(5)
        got.put((kind, payload))

    channel.on_control(handler)
    frames = [(CONTROL_CALL, bytes([n]) * (_READ_AHEAD // 2 + 1000)) for n in range(12)]
    wakeups = reactor().wakeups
    sock.sendall(b"".join(frame(k, p) for k, p in frames))
    release.set()
    assert take(got, len(frames)) == frames
    assert reactor().wakeups - wakeups >= len(frames) // 2


def test_connections_sharing_a_reader_thread_keep_their_own_header_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The read-ahead buffer is the reader thread's, lent to one turn at a time: a turn that ends with the start of a
    header leaves it with its connection. Two connections on one reader thread, each ending a turn inside a header
    while the other's turn runs in between: every frame arrives whole, on its own channel."""
    from datadistd.transport.tcp import reactor as reactor_mod

    monkeypatch.setattr(reactor_mod, "THREAD_PREFIX", "test-one-reader")   # (not counted as the process's pool)
    monkeypatch.setattr(reactor_mod, "_reactor", reactor_mod.Reactor(size=1))
    p = Pair(streams=1)
    try:
        ends = []
        for token in (b"1" * 16, b"2" * 16):
            p.b.allow(token)
            sock = raw_hello(p.b.endpoint, token)
            channel = p.b.channel(token)
            assert channel is not None and channel._conns[0]._reactor.size == 1
            got: queue.Queue = queue.Queue()
            channel.on_control(lambda kind, payload, got=got: got.put((kind, bytes(payload))))
            two_in_a_row(sock, channel, got)
            ends.append((sock, channel, got))
        streams = [frame(CONTROL_CALL, b"one") + frame(CONTROL_REPLY, bytes(range(50))),
                   frame(CONTROL_CALL, b"two" * 9) + frame(CONTROL_TRANSPORT, b"z" * 70)]
        cuts = [len(streams[0]) - 50 - 20, len(streams[1]) - 70 - 5]   # inside the second frame's header
        for (sock, _, got), stream, cut in zip(ends, streams, cuts, strict=True):
            sock.sendall(stream[:cut])
            assert take(got, 1)[0][0] == CONTROL_CALL
            time.sleep(0.01)   # its turn ends with the header's start (the test holds either way)
        for (sock, _, _), stream, cut in zip(ends, streams, cuts, strict=True):
            sock.sendall(stream[cut:])
        assert take(ends[0][2], 1) == [(CONTROL_REPLY, bytes(range(50)))]
        assert take(ends[1][2], 1) == [(CONTROL_TRANSPORT, b"z" * 70)]
        assert not any(channel.broken for _, channel, _ in ends)
        for sock, _, _ in ends:
            sock.close()
    finally:
        p.stop()
