"""The reverse path's records and hub (``datadistd.reverse``): every command kind survives the wire, and any
number of calls in flight are answered by id, in any order."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from datadistd.core.errors import DataDistError, StatusCode
from datadistd.core.types import BlocksKeyRef, CacheKeyRef, IdIndexRef, ReadMode, RemoteSpec
from datadistd.reverse import (
    MAX_OPEN_PER_CALL,
    CommitWriteCmd,
    OpenWriteCmd,
    ReadCmd,
    ReleaseCmd,
    ReverseHub,
    ReverseReply,
    UnlinkCmd,
)
from datadistd.rpc import convert

SESSION = b"s" * 16
SPEC = RemoteSpec(BlocksKeyRef(7, 1), ReadMode.BLOCKS, (3, 1, 4), -1, 0, 2, 4, 4096)


@pytest.mark.parametrize("cmd", [
    OpenWriteCmd(1, SESSION, (SPEC,), 500),
    OpenWriteCmd(1, SESSION, (SPEC, replace(SPEC, tensor_start=4), replace(SPEC, blocks=(9,))), 500, 8000),
    CommitWriteCmd(2, SESSION, (99,), 500),
    CommitWriteCmd(2, SESSION, (99, 100, 7), 500),
    ReadCmd(3, SESSION, 42, RemoteSpec(IdIndexRef(7, 2, 1), ReadMode.SLOT, (), 128, 64, 0, 0, 512), 700),
    ReleaseCmd(4, SESSION, CacheKeyRef(7, 11, 0), 0, 6),
    UnlinkCmd(5, SESSION),
])
def test_every_command_kind_round_trips(cmd) -> None:  # noqa: ANN001
    assert convert.reverse_command_from_pb(convert.reverse_command_to_pb(cmd)) == cmd


def test_reply_round_trips_and_unknown_commands_are_refused() -> None:
    for reply in (ReverseReply(9, 0, "", (5,), 4096, True), ReverseReply(9, transfer_ids=(5, 6, 11)),
                  ReverseReply(9, nbytes=3)):
        assert convert.reverse_reply_from_pb(convert.reverse_reply_to_pb(reply)) == reply
    empty = convert.reverse_command_to_pb(UnlinkCmd(6, SESSION))
    empty.ClearField("unlink")
    with pytest.raises(DataDistError) as info:
        convert.reverse_command_from_pb(empty)
    assert info.value.code == StatusCode.LLM_PARAM_INVALID


def test_concurrent_calls_are_matched_by_id_answered_in_reverse_order() -> None:
    async def main() -> list:
        hub = ReverseHub(2)
        hub.attach()
        calls = [asyncio.ensure_future(hub.read(SESSION, tid, SPEC, 5.0)) for tid in range(12)]
        commands = [await asyncio.wait_for(hub.next_command(), 5.0) for _ in calls]
        for cmd in reversed(commands):  # the linking side answers in any order
            hub.on_reply(ReverseReply(cmd.command_id, nbytes=cmd.transfer_id * 10, release_needed=True))
        results = await asyncio.wait_for(asyncio.gather(*calls), 5.0)
        failing = asyncio.ensure_future(hub.unlink(SESSION, 5.0))
        cmd = await asyncio.wait_for(hub.next_command(), 5.0)
        hub.on_reply(ReverseReply(cmd.command_id, int(StatusCode.LLM_NOT_YET_LINK), "gone"))
        with pytest.raises(DataDistError) as info:
            await failing
        assert info.value.code == StatusCode.LLM_NOT_YET_LINK
        return results

    assert asyncio.run(main()) == [(tid * 10, True) for tid in range(12)]


def test_a_closed_hub_fails_the_calls_in_flight_at_once() -> None:
    async def main() -> None:
        hub = ReverseHub(2)
        hub.attach()
        call = asyncio.ensure_future(hub.open_write(SESSION, [SPEC], 30.0))
        await asyncio.wait_for(hub.next_command(), 5.0)
        hub.close("the link was dropped")
        with pytest.raises(DataDistError) as info:
            await asyncio.wait_for(call, 5.0)
        assert info.value.code == StatusCode.LLM_LINK_FAILED
        assert await hub.next_command() is None

    asyncio.run(main())


def test_an_open_write_of_too_many_pieces_is_refused_before_decoding() -> None:
    """A hostile peer cannot make the owner open (and pin caches for) an unbounded number of transfers."""
    msg = convert.reverse_command_to_pb(OpenWriteCmd(1, SESSION, (SPEC,) * MAX_OPEN_PER_CALL, 500))
    assert len(convert.reverse_command_from_pb(msg).specs) == MAX_OPEN_PER_CALL
    msg.open_write.more.append(msg.open_write.more[0])
    with pytest.raises(DataDistError) as info:
        convert.reverse_command_from_pb(msg)
    assert info.value.code == StatusCode.LLM_PARAM_INVALID


def test_an_answer_with_the_wrong_number_of_transfers_fails_the_open() -> None:
    async def main() -> None:
        hub = ReverseHub(2)
        hub.attach()
        call = asyncio.ensure_future(hub.open_write(SESSION, [SPEC, SPEC], 5.0))
        cmd = await asyncio.wait_for(hub.next_command(), 5.0)
        hub.on_reply(ReverseReply(cmd.command_id, transfer_ids=(4,)))   # an owner that opened only the first
        with pytest.raises(DataDistError) as info:
            await asyncio.wait_for(call, 5.0)
        assert info.value.code == StatusCode.LLM_FAILED

    asyncio.run(main())
