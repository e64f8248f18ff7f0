"""Owner calls' records (``datadistd.links.wire.ownercalls``) and ``FrameCalls`` (``framecalls``): every command
kind survives the wire, and any number of calls in flight are answered by id, in any order."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from datadistd.core.errors import DataDistError, StatusCode
from datadistd.core.types import BlocksKeyRef, CacheKeyRef, IdIndexRef, ReadMode, RemoteSpec
from datadistd.links.wire import ownerwire
from datadistd.links.wire.framecalls import FrameCalls
from datadistd.links.wire.ownercalls import (
    MAX_OPEN_PER_CALL,
    CommitWriteCmd,
    DoneReadCmd,
    GrantReadCmd,
    OpenWriteCmd,
    OwnerCall,
    OwnerReply,
    PingCmd,
    ReadCmd,
    RefusedCall,
    ReleaseCmd,
    UnlinkCmd,
)

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
    GrantReadCmd(7, SPEC, 900),
    DoneReadCmd(8, 12, True),
    DoneReadCmd(8, 13, False),
])
def test_every_command_kind_round_trips(cmd) -> None:  # noqa: ANN001
    assert ownerwire.decode_call(ownerwire.encode_call(cmd)) == cmd


def test_reply_round_trips_and_unknown_commands_are_refused() -> None:
    for reply in (OwnerReply(9, 0, "", (5,), 4096, True), OwnerReply(9, transfer_ids=(5, 6, 11)),
                  OwnerReply(9, nbytes=3), OwnerReply(9, transfer_ids=(4,), grant=b"\0rows")):
        assert ownerwire.decode_reply(ownerwire.encode_reply(reply)) == reply
    unknown = bytearray(ownerwire.encode_call(UnlinkCmd(6)))
    unknown[1] = 99   # a call this daemon does not know
    with pytest.raises(RefusedCall) as refused:   # refused by id, so the caller gets an answer
        ownerwire.decode_call(bytes(unknown))
    assert refused.value.command_id == 6 and refused.value.code == StatusCode.LLM_PARAM_INVALID


def test_concurrent_calls_are_matched_by_id_answered_in_reverse_order() -> None:
    async def main() -> list:
        hub = Hub()
        calls = [asyncio.ensure_future(hub.calls.read(tid, SPEC, 5.0)) for tid in range(12)]
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
