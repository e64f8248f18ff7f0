"""Owner calls' records (``datadistd.links.wire.ownercalls``) and ``FrameCalls`` (``framecalls``): every command
kind survives the wire, and any number of calls in flight are answered by id, in any order."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace

import pytest

from datadistd.core.errors import DataDistError, StatusCode
from datadistd.core.types import BlocksKeyRef, CacheKeyRef, IdIndexRef, ReadMode, RemoteSpec
from datadistd.links.wire import ownerwire
from datadistd.links.wire.framecalls import FrameCalls
from datadistd.links.wire.ownercalls import (
    MAX_OPEN_PER_CALL,
    CommitWriteCmd,
    OpenWriteCmd,
    OwnerCall,
    OwnerReply,
    PingCmd,
    ReadCmd,
    RefusedCall,
    ReleaseCmd,
    UnlinkCmd,
)
from tests.fakes import read_call

SPEC = RemoteSpec(BlocksKeyRef(7, 1), ReadMode.BLOCKS, (3, 1, 4), -1, 0, 2, 4, 4096)


class Hub:
    """``FrameCalls`` whose frames land in a queue (the other end, played by the test, answers by id)."""

    def __init__(self) -> None:
        self.sent: asyncio.Queue[OwnerCall] = asyncio.Queue()

        async def send(payload: bytes, deadline: float) -> None:
            self.sent.put_nowait(ownerwire.decode_call(payload))

        self.calls = FrameCalls(2, send)

    async def next_command(self) -> OwnerCall:
        return await asyncio.wait_for(self.sent.get(), 5.0)


@pytest.mark.parametrize("cmd", [
    OpenWriteCmd(1, (SPEC,), 500),
    OpenWriteCmd(1, (SPEC, replace(SPEC, tensor_start=4), replace(SPEC, blocks=(9,))), 500, 8000),
    CommitWriteCmd(2, (99,), 500),
    CommitWriteCmd(2, (99, 100, 7), 500),
    ReadCmd(3, 42, RemoteSpec(IdIndexRef(7, 2, 1), ReadMode.SLOT, (), 128, 64, 0, 0, 512), 700),
    ReleaseCmd(4, CacheKeyRef(7, 11, 0), 0, 6),
    UnlinkCmd(5),
    PingCmd(6),
])
def test_every_command_kind_round_trips(cmd) -> None:  # noqa: ANN001
    assert ownerwire.decode_call(ownerwire.encode_call(cmd)) == cmd


def test_reply_round_trips_and_unknown_commands_are_refused() -> None:
    for reply in (OwnerReply(9, 0, "", (5,), 4096, True), OwnerReply(9, transfer_ids=(5, 6, 11)),
                  OwnerReply(9, nbytes=3)):
        assert ownerwire.decode_reply(ownerwire.encode_reply(reply)) == reply
    unknown = bytearray(ownerwire.encode_call(UnlinkCmd(6)))
    unknown[1] = 99   # a call this daemon does not know
    with pytest.raises(RefusedCall) as refused:   # refused by id, so the caller gets an answer
        ownerwire.decode_call(bytes(unknown))
    assert refused.value.command_id == 6 and refused.value.code == StatusCode.LLM_PARAM_INVALID


def test_concurrent_calls_are_matched_by_id_answered_in_reverse_order() -> None:
    async def main() -> list:
        hub = Hub()
        calls = [asyncio.ensure_future(read_call(hub.calls, tid, SPEC, 5.0)) for tid in range(12)]
        commands = [await hub.next_command() for _ in calls]
        for cmd in reversed(commands):  # the other end answers in any order
            assert isinstance(cmd, ReadCmd)
            hub.calls.on_reply(OwnerReply(cmd.command_id, nbytes=cmd.transfer_id * 10, release_needed=True))
        results = await asyncio.wait_for(asyncio.gather(*calls), 5.0)
        failing = asyncio.ensure_future(hub.calls.unlink(5.0))
        cmd = await hub.next_command()
        hub.calls.on_reply(OwnerReply(cmd.command_id, int(StatusCode.LLM_NOT_YET_LINK), "gone"))
        with pytest.raises(DataDistError) as info:
            await failing
        assert info.value.code == StatusCode.LLM_NOT_YET_LINK
        return results

    assert asyncio.run(main()) == [(tid * 10, True) for tid in range(12)]


def test_closed_calls_fail_the_calls_in_flight_at_once() -> None:
    async def main() -> None:
        hub = Hub()
        call = asyncio.ensure_future(hub.calls.open_write([SPEC], 30.0))
        await hub.next_command()
        hub.calls.close("the link was dropped")
        with pytest.raises(DataDistError) as info:
            await asyncio.wait_for(call, 5.0)
        assert info.value.code == StatusCode.LLM_LINK_FAILED
        with pytest.raises(DataDistError) as info:   # and every later call at once
            await hub.calls.ping(5.0)
        assert info.value.code == StatusCode.LLM_LINK_FAILED

    asyncio.run(main())


def test_an_open_write_of_too_many_pieces_is_refused_before_decoding() -> None:
    """A hostile peer cannot make the owner open (and pin caches for) an unbounded number of transfers."""
    frame = ownerwire.encode_call(OpenWriteCmd(1, (SPEC,) * MAX_OPEN_PER_CALL, 500))
    assert len(ownerwire.decode_call(frame).specs) == MAX_OPEN_PER_CALL
    with pytest.raises(RefusedCall) as info:
        ownerwire.decode_call(ownerwire.encode_call(OpenWriteCmd(1, (SPEC,) * (MAX_OPEN_PER_CALL + 1), 500)))
    assert info.value.code == StatusCode.LLM_PARAM_INVALID and info.value.command_id == 1


def test_an_answer_with_the_wrong_number_of_transfers_fails_the_open() -> None:
    async def main() -> None:
        hub = Hub()
        call = asyncio.ensure_future(hub.calls.open_write([SPEC, SPEC], 5.0))
        cmd = await hub.next_command()
        hub.calls.on_reply(OwnerReply(cmd.command_id, transfer_ids=(4,)))   # an owner that opened only the first
        with pytest.raises(DataDistError) as info:
            await asyncio.wait_for(call, 5.0)
        assert info.value.code == StatusCode.LLM_FAILED

    asyncio.run(main())


# ---- deadlines: one sweep timer; fast calls answered on the reader thread ------------------------------------


def test_calls_time_out_by_one_sweep_that_is_armed_only_while_calls_are_pending() -> None:
    """A call past its deadline fails with LLM_TIMEOUT (the message of before); a call added later with an earlier
    deadline re-arms the sweep for itself (it does not wait for the first one's); once nothing is pending the sweep
    stays unarmed -- an idle link never wakes."""
    async def main() -> None:
        hub = Hub()
        calls = hub.calls
        assert not calls.sweep_armed
        slow = asyncio.ensure_future(calls.ping(30.0))
        await hub.next_command()
        assert calls.sweep_armed and calls.pending == 1
        with pytest.raises(DataDistError) as late:
            await asyncio.wait_for(calls.ping(0.05), 10.0)   # fails at its own deadline, not at the 30 s one
        assert late.value.code == StatusCode.LLM_TIMEOUT
        assert late.value.message == "cluster 2 did not answer an owner call in time"
        assert calls.pending == 1 and not slow.done() and calls.sweep_armed
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        assert calls.pending == 0
        with pytest.raises(DataDistError):
            await calls.ping(0.01)
        assert calls.pending == 0 and not calls.sweep_armed   # the sweep that failed it found nothing else
        calls.close("test over")

    asyncio.run(main())


def _reply_frame(command_id: int, data: bytes, status: int = 0, message: str = "") -> bytes:
    return ownerwire.encode_reply(OwnerReply(command_id, status, message, nbytes=len(data), data=data))


def test_a_fast_call_lands_on_the_reader_thread_and_anything_else_goes_to_the_loop() -> None:
    """``register_fast``: the whole, successful reply with the expected bytes goes to ``land`` (here: the test's
    thread) and never to the loop's answer; a failure status, a wrong byte count, an unknown id are left to the
    loop (``take_reply`` False), where ``on_reply`` answers with the general path's error; a reply the landing
    refuses (a stale view) is answered on the loop with the same reply; each call is answered exactly once."""
    async def main() -> None:
        calls = Hub().calls
        landed: list[tuple[bytes, object]] = []
        answered: list[tuple[object, object]] = []

        def land(payload: bytes, ctx: object) -> bool:
            landed.append((payload[ownerwire.REPLY.size:], ctx))
            return ctx != "stale"

        def answer(result: object, ctx: object) -> None:
            answered.append((result, ctx))

        deadline = asyncio.get_running_loop().time() + 30.0
        good = calls.register_fast(deadline, answer, land, "good", 4)
        refused = calls.register_fast(deadline, answer, land, "refused", 4)
        short = calls.register_fast(deadline, answer, land, "short", 4)
        stale = calls.register_fast(deadline, answer, land, "stale", 4)
        assert await asyncio.to_thread(calls.take_reply, _reply_frame(good, b"abcd"))
        assert landed == [(b"abcd", "good")] and answered == []
        assert not calls.take_reply(_reply_frame(good, b"abcd"))         # answered: the loop drops it (unknown id)
        assert not calls.take_reply(_reply_frame(refused, b"", int(StatusCode.LLM_KV_CACHE_NOT_EXIST), "gone"))
        assert not calls.take_reply(_reply_frame(short, b"abc"))
        assert not calls.take_reply(b"\xff")                              # not even a head
        calls.on_reply(ownerwire.decode_reply(_reply_frame(refused, b"", int(StatusCode.LLM_KV_CACHE_NOT_EXIST),
                                                           "gone")))
        (error, ctx), = answered
        assert ctx == "refused" and isinstance(error, DataDistError)
        assert error.code == StatusCode.LLM_KV_CACHE_NOT_EXIST and error.message == "gone"
        assert await asyncio.to_thread(calls.take_reply, _reply_frame(stale, b"wxyz"))
        await asyncio.sleep(0)   # the stale one is handed to the loop (call_soon_threadsafe)
        await asyncio.sleep(0)
        assert answered[1][1] == "stale" and isinstance(answered[1][0], OwnerReply)
        assert answered[1][0].data == b"wxyz"
        calls.close("link went")
        assert [c for _, c in answered] == ["refused", "stale", "short"]   # the one left: failed by close, once
        assert answered[2][0].code == StatusCode.LLM_LINK_FAILED and calls.pending == 0
        with pytest.raises(DataDistError):
            calls.register_fast(deadline, answer, land, "late", 4)   # closed: nothing registered

    asyncio.run(main())


def test_a_fast_call_past_its_deadline_is_answered_once_whoever_comes_second() -> None:
    """The sweep and a reader thread's ``take_reply`` race for an entry: the one that pops it answers; the
    other finds nothing (a late reply is dropped, never landed)."""
    async def main() -> None:
        calls = Hub().calls
        landed: list[object] = []
        answered: list[object] = []
        loop = asyncio.get_running_loop()
        cid = calls.register_fast(loop.time() + 0.01, lambda r, c: answered.append(r),
                                  lambda p, c: landed.append(c) or True, "x", 2)
        while calls.pending:
            await asyncio.sleep(0.01)
        assert len(answered) == 1 and answered[0].code == StatusCode.LLM_TIMEOUT
        assert not calls.take_reply(_reply_frame(cid, b"ok")) and landed == []
        assert not calls.sweep_armed
        calls.close("over")

    asyncio.run(main())


def test_answering_the_last_call_disarms_the_sweep() -> None:
    """A call answered on the loop leaves no timer behind when it was the last one pending (a link whose heartbeat
    ping is answered does not wake for its deadline)."""
    async def main() -> None:
        hub = Hub()
        ping = asyncio.ensure_future(hub.calls.ping(30.0))
        command = await hub.next_command()
        assert hub.calls.sweep_armed
        hub.calls.on_reply(OwnerReply(command.command_id))
        await ping
        assert not hub.calls.sweep_armed and hub.calls.pending == 0
        hub.calls.close("over")

    asyncio.run(main())


class CountingLoop(asyncio.SelectorEventLoop):
    """An event loop that counts what other threads ask of it (``call_soon_threadsafe``)."""

    posts = 0

    def call_soon_threadsafe(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        self.posts += 1
        return super().call_soon_threadsafe(*args, **kwargs)


def test_a_fast_call_registered_off_the_loop_asks_it_for_a_sweep_only_when_none_is_due_by_its_deadline() -> None:
    """``register_fast`` from another thread (an attach connection's reactor thread): with no sweep due by its
    deadline it asks the loop for one (once; the loop arms it and the call times out there); a call with a later
    deadline asks nothing -- the loop is not woken; nor after the calls closed (refused, nothing pending)."""
    async def main() -> None:
        calls = Hub().calls
        loop = asyncio.get_running_loop()
        assert isinstance(loop, CountingLoop)
        answered: list[tuple[object, object]] = []

        def off_loop(deadline: float, ctx: str, out: list) -> None:
            try:
                calls.register_fast(deadline, lambda r, c: answered.append((r, c)), lambda p, c: True, ctx, 0,
                                    on_loop=False)
            except DataDistError as exc:
                out.append(exc)

        def register(deadline: float, ctx: str) -> list:
            out: list = []
            t = threading.Thread(target=off_loop, args=(deadline, ctx, out))
            t.start()
            t.join(10)
            return out

        before = loop.posts
        assert register(time.monotonic() + 0.2, "soon") == [] and loop.posts == before + 1
        assert not calls.sweep_armed          # asked, not armed yet: the loop arms it when it runs
        await asyncio.sleep(0)
        assert calls.sweep_armed
        assert register(time.monotonic() + 30, "later") == [] and loop.posts == before + 1   # not woken
        while not answered:
            await asyncio.sleep(0.01)
        (error, ctx), = answered
        assert ctx == "soon" and isinstance(error, DataDistError) and error.code == StatusCode.LLM_TIMEOUT
        assert calls.pending == 1 and calls.sweep_armed      # "later" is left, its sweep armed by the loop
        calls.close("over")
        assert [c for _, c in answered] == ["soon", "later"]
        refused = register(time.monotonic() + 0.1, "closed")
        assert len(refused) == 1 and refused[0].code == StatusCode.LLM_LINK_FAILED and calls.pending == 0

    loop = CountingLoop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
