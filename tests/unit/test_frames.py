"""Owner calls as control frames on a data channel (the hot-path issue, item 1): CALL/REPLY frames on
real loopback TCP channels, ``FrameCalls`` over them with ``ownerwire``'s frames, and what a hostile
(authenticated) peer can do with control frames: break only its own channel."""

from __future__ import annotations

import asyncio
import queue
import threading

import pytest

from datadist.status import LLMStatusCode as S
from datadistd.core.errors import DataDistError
from datadistd.core.types import BlocksKeyRef, ReadMode, RemoteSpec
from datadistd.links.wire import ownerwire
from datadistd.links.wire.framecalls import FrameCalls
from datadistd.links.wire.ownercalls import OwnerReply, ReadCmd
from datadistd.transport.base import CONTROL_CALL, CONTROL_DOWN, CONTROL_REPLY, EARLY_FRAMES_MAX, EarlyFrames
from datadistd.transport.tcp import HEADER, MAX_CONTROL
from tests.fakes import read_call
from tests.reliability.common import wait_until
from tests.unit.test_transport_tcp import TOKEN, Pair, closed_without_reply, deadline, raw_hello

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def pair():
    p = Pair(streams=2)
    yield p
    p.stop()


def collector() -> tuple[queue.Queue, object]:
    got: queue.Queue = queue.Queue()
    return got, lambda kind, payload: got.put((kind, payload, threading.current_thread().name))


def test_frames_both_ways_reach_the_handlers_in_reader_threads(pair: Pair) -> None:
    got_b, on_b = collector()
    got_a, on_a = collector()
    pair.b.on_control(TOKEN, on_b)
    pair.out.on_control(on_a)
    sent = [b"ask", b"x" * 100_000]
    if not pair.out.try_control(CONTROL_CALL, sent[0], deadline()):   # declines only when every connection is busy
        pair.out.send_control(CONTROL_CALL, sent[0], deadline())
    pair.out.send_control(CONTROL_CALL, sent[1], deadline())
    pair.inb.send_control(CONTROL_REPLY, b"answer", deadline())
    received = sorted(got_b.get(timeout=5)[:2] for _ in sent)   # two connections: either order
    assert received == sorted((CONTROL_CALL, p) for p in sent)
    kind, payload, thread = got_a.get(timeout=5)
    assert (kind, payload) == (CONTROL_REPLY, b"answer") and thread.startswith("datadist-tcp-read")


def test_frames_before_the_handler_wait_for_it(pair: Pair) -> None:
    for i in range(5):
        pair.inb.send_control(CONTROL_CALL, bytes([i]), deadline())
    assert wait_until(lambda: pair.out.stats()["frames_received"] >= 5, 5)
    got, on = collector()
    pair.out.on_control(on)
    assert sorted(got.get(timeout=5)[1] for _ in range(5)) == [bytes([i]) for i in range(5)]


def test_early_frames_wait_in_order_and_are_bounded() -> None:
    """The one backlog of both channel kinds (tcp's and the one-sided transports'): frames before the handler reach
    it in arrival order when it is set, later ones at once; one frame past the bound is refused, not kept."""
    early = EarlyFrames(limit=3)
    got: list[tuple[int, bytes]] = []
    assert all(early.deliver(CONTROL_CALL, bytes([i])) for i in range(3))
    assert not early.deliver(CONTROL_REPLY, b"one too many")
    early.set_handler(lambda kind, payload: got.append((kind, payload)))
    assert got == [(CONTROL_CALL, bytes([i])) for i in range(3)]
    assert all(early.deliver(CONTROL_REPLY, b"x") for _ in range(5))   # no bound once a handler takes them
    assert got[3:] == [(CONTROL_REPLY, b"x")] * 5


def test_the_channel_tells_its_handler_once_that_it_went_down_after_its_frames(pair: Pair) -> None:
    """The other end closes (a dead peer's kernel does): this end's handler gets the frames sent before, then
    ``CONTROL_DOWN`` with the reason, once; closing this end afterwards tells it nothing more. The other end's
    handler hears of its own close too."""
    got_a, on_a = collector()
    got_b, on_b = collector()
    pair.out.on_control(on_a)
    pair.b.on_control(TOKEN, on_b)
    for i in range(3):
        pair.inb.send_control(CONTROL_REPLY, bytes([i]), deadline())
    assert wait_until(lambda: pair.out.stats()["frames_received"] >= 3, 5)
    pair.inb.close()
    events = [got_a.get(timeout=5)[:2] for _ in range(4)]
    assert sorted(events[:3]) == [(CONTROL_REPLY, bytes([i])) for i in range(3)]
    assert events[3][0] == CONTROL_DOWN and b"closed" in events[3][1]
    assert pair.out.broken
    pair.out.close()
    assert got_b.get(timeout=5)[:2] == (CONTROL_DOWN, b"closed locally")
    assert got_a.empty() and got_b.empty()


def test_a_channel_that_went_down_before_its_handler_tells_it_when_set(pair: Pair) -> None:
    pair.inb.send_control(CONTROL_REPLY, b"last words", deadline())
    assert wait_until(lambda: pair.out.stats()["frames_received"] >= 1, 5)
    pair.inb.close()
    assert wait_until(lambda: pair.out.broken, 5)
    got, on = collector()
    pair.out.on_control(on)
    assert [got.get(timeout=5)[0] for _ in range(2)] == [CONTROL_REPLY, CONTROL_DOWN]
    pair.out.close()
    assert got.empty()


def test_not_a_control_frame_is_refused(pair: Pair) -> None:
    for kind, payload in ((1, b"x"), (CONTROL_CALL, b"x" * (MAX_CONTROL + 1))):
        with pytest.raises(DataDistError) as info:
            pair.out.send_control(kind, payload, deadline())
        assert info.value.code == S.LLM_PARAM_INVALID


@pytest.mark.parametrize("frame", ["oversized", "with a transfer id", "flood before the link is ready"])
def test_a_hostile_peer_breaks_only_its_own_channel(pair: Pair, frame: str) -> None:
    other = b"h" * 16
    pair.b.allow(other)
    evil = raw_hello(pair.b.endpoint, other)
    if frame == "oversized":
        evil.sendall(HEADER.pack(b"DDFR", CONTROL_CALL, 0, 0, MAX_CONTROL + 1))
    elif frame == "with a transfer id":
        evil.sendall(HEADER.pack(b"DDFR", CONTROL_CALL, 7, 0, 1) + b"x")
    else:   # nobody set a handler for this token: the backlog is bounded
        for _ in range(EARLY_FRAMES_MAX + 1):
            evil.sendall(HEADER.pack(b"DDFR", CONTROL_CALL, 0, 0, 3) + b"abc")
    assert closed_without_reply(evil, timeout=5)
    evil_channel = pair.b.channel(other)
    # the reader shuts the socket first, then marks its channel: wait (bounded) for the second step
    assert evil_channel is None or wait_until(lambda: evil_channel.broken, 5)
    got, on = collector()
    pair.b.on_control(TOKEN, on)
    pair.out.send_control(CONTROL_CALL, b"still here", deadline())   # the honest channel is untouched
    assert got.get(timeout=5)[:2] == (CONTROL_CALL, b"still here")


def test_frame_calls_read_round_trip_over_a_real_channel(pair: Pair) -> None:
    """One end asks with ``FrameCalls.read``; the other decodes the command and answers with a REPLY frame."""
    spec = RemoteSpec(BlocksKeyRef(1, 3), ReadMode.BLOCKS, (1, 2, 3), 0, 0, 0, 2, 4096)

    def serve(kind: int, payload: bytes) -> None:   # the owner end, in its reader thread
        cmd = ownerwire.decode_call(payload)
        assert kind == CONTROL_CALL and isinstance(cmd, ReadCmd) and cmd.spec == spec
        reply = OwnerReply(cmd.command_id, nbytes=cmd.spec.expected_bytes, release_needed=True)
        pair.inb.send_control(CONTROL_REPLY, ownerwire.encode_reply(reply), deadline())

    pair.b.on_control(TOKEN, serve)

    async def main() -> tuple[int, bool]:
        loop = asyncio.get_running_loop()

        async def send(payload: bytes, dl: float) -> None:
            pair.out.send_control(CONTROL_CALL, payload, dl)

        calls = FrameCalls(2, send)
        pair.out.on_control(lambda kind, payload: loop.call_soon_threadsafe(
            calls.on_reply, ownerwire.decode_reply(payload)))
        answers = await asyncio.gather(*(read_call(calls, 10 + i, spec, 5.0) for i in range(20)))
        assert set(answers) == {(4096, True)}
        calls.close("done")
        with pytest.raises(DataDistError) as info:
            await read_call(calls, 99, spec, 5.0)
        assert info.value.code == S.LLM_LINK_FAILED
        return answers[0]

    assert asyncio.run(main()) == (4096, True)


def test_frame_calls_time_out_when_nobody_answers(pair: Pair) -> None:
    spec = RemoteSpec(BlocksKeyRef(1, 3), ReadMode.BLOCKS, (1,), 0, 0, 0, 1, 8)
    pair.b.on_control(TOKEN, lambda kind, payload: None)   # an owner that never answers

    async def main() -> None:
        async def send(payload: bytes, dl: float) -> None:
            pair.out.send_control(CONTROL_CALL, payload, dl)

        calls = FrameCalls(2, send)
        with pytest.raises(DataDistError) as info:
            await read_call(calls, 1, spec, 0.3)
        assert info.value.code == S.LLM_TIMEOUT

    asyncio.run(main())


def test_the_codec_refuses_garbage() -> None:
    for data in (b"\xff\xff\xff", b"\x0a\x05abc", b"\x0a" * 40):
        with pytest.raises(DataDistError) as info:
            ownerwire.decode_call(data)
        assert info.value.code == S.LLM_PARAM_INVALID
