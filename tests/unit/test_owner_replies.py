"""Which answers of the owner wait behind the link's reads being sent (``Owner.queued_control``): a read's REPLY
only. Two in-process engines linked over real loopback TCP (``test_links.Pair``)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

from datadistd.engine.engine import tensors_of
from tests.fakes import pulled, start_pull
from tests.unit.test_links import (
    BIG_POOL,
    BIG_ROW,
    BLOCK,
    BLOCKS,
    P,
    Pair,
    _bytes,
    _order,
    _until,
    linked_big_caches,
)

pytestmark = pytest.mark.timeout(60)


def test_a_ping_is_answered_while_the_links_read_is_being_sent() -> None:
    """A read too big for the loop's send is held in its sender (``channel.send`` of the link's queue, released by
    the test) while the linking end pings: the ping is answered meanwhile -- not queued behind the read's bytes
    (before: every REPLY of the link went behind the reads being sent, so a 256 MB read held the heartbeat's
    answer for seconds and the serving end dropped the link as silent; CI: test_z_outsized... under load). Once
    released the pull ends byte-exact, its REPLY after its source's unpin."""
    rows = 8                                              # 8 blocks of 64 KiB: 4 frames (``BIG_FRAME``)

    async def main() -> None:
        async with Pair(pool=BIG_POOL) as pair:
            serving, linking = pair.links
            src, dst, pattern, channel = await linked_big_caches(pair)
            entered, release = threading.Event(), threading.Event()
            send = channel.send

            def held(*args: Any, **kwargs: Any) -> None:
                entered.set()
                release.wait(30)    # bounded: the test releases it at once after the ping
                send(*args, **kwargs)

            channel.send = held  # type: ignore[method-assign]
            loop = asyncio.get_running_loop()
            ended: asyncio.Future[Any] = loop.create_future()
            remote = list(range(rows))[::-1]
            start_pull(linking, _order(P, int(dst.cache_id), remote, list(range(rows))), ended.set_result)
            try:
                assert await asyncio.to_thread(entered.wait, 10), "the read never reached its sender"
                assert serving.owner._sends, "the read is not on the link's queue"
                await linking.links[P].calls.ping(5)       # raises LLM_TIMEOUT when its answer waits for the read
                assert not ended.done()                     # the read is still held: the answer came around it
            finally:
                release.set()
            assert await asyncio.wait_for(ended, 30) == (rows * BIG_ROW, "tcp")
            (out,) = tensors_of(dst)
            buf = np.zeros(out.length, np.uint8)
            out.handle.read_into(out.offset, memoryview(buf).cast("B"))
            assert (buf.reshape(-1, BIG_ROW)[:rows] == pattern[remote]).all()
            assert serving.engine.entry(src.cache_id).pins == 0 and linking.engine.entry(dst.cache_id).pins == 0
            assert await _until(lambda: not serving.owner._sends)   # the queue goes with its last send

    asyncio.run(main())


def test_a_call_with_a_long_block_list_is_decoded_off_the_loop_and_a_small_one_on_it(monkeypatch) -> None:  # noqa: ANN001
    """Issue 44: a call frame whose decode reads over ``_OFF_LOOP`` bytes (here a read of 1,000 blocks) is decoded on
    the daemon's threads as the link's peer, never on the event loop; a small one (a ping) on the loop, no thread
    hop. The long list's refusal names its first bad block, as the plain check does."""
    from datadist.status import LLMStatusCode as S
    from datadistd.core.errors import DataDistError
    from datadistd.core.types import BlocksKeyRef, ReadMode, RemoteSpec
    from datadistd.links import calls
    from datadistd.links.wire import ownerwire
    from tests.fakes import read_inline

    decoded: list[tuple[str, int]] = []
    decode = ownerwire.decode_call

    def watched(data: bytes) -> Any:
        decoded.append((threading.current_thread().name, len(data)))
        return decode(data)

    monkeypatch.setattr(ownerwire, "decode_call", watched)

    async def main() -> None:
        async with Pair() as pair:
            assert await pair.link() == (0, [0])
            pair.caches()
            out = pair.links[1].links[P]
            await out.calls.ping(5)
            blocks = tuple([1, 2] * 450 + [3] * 99 + [BLOCKS])   # the last one past the cache's end
            spec = RemoteSpec(BlocksKeyRef(P, 0), ReadMode.BLOCKS, blocks, -1, 0, 0, 0, 2 * BLOCK)
            with pytest.raises(DataDistError) as info:
                await read_inline(out.calls, spec, 5.0)
            assert info.value.code == S.LLM_PARAM_INVALID and f"src_blocks[999] = {BLOCKS}" in info.value.message

    asyncio.run(main())
    small = [name for name, size in decoded if size <= calls._OFF_LOOP]
    large = [name for name, size in decoded if size > calls._OFF_LOOP]
    assert small and all(name == "MainThread" for name in small), decoded
    assert len(large) == 1 and large[0].startswith("datadist-io"), decoded


def test_the_segments_of_a_read_of_a_long_block_list_are_worked_out_off_the_loop(monkeypatch) -> None:  # noqa: ANN001
    """Issue 44: a valid read of 2^20 blocks costs tens of ms of array arithmetic (``segments_of``); over
    ``owner._LOOP_BLOCKS`` blocks it runs on the link's peer's threads, not the event loop. The pull is byte-exact."""
    from datadistd.links import owner

    seen: list[tuple[str, int]] = []
    real = owner.segments_of

    def watched(tensors: Any, spans: Any) -> Any:
        seen.append((threading.current_thread().name, len(spans.blocks)))
        return real(tensors, spans)

    monkeypatch.setattr(owner, "segments_of", watched)

    async def main() -> None:
        async with Pair() as pair:
            assert await pair.link() == (0, [0])
            src, dst = pair.caches()
            serving, linking = pair.links
            for remote, local in (([1, 2], [3, 4]), ([1, 2] * 2100 + [5], [3, 4] * 2100 + [6])):
                await pulled(linking, _order(P, dst, remote, local))
                got, want = _bytes(pair.ds, dst), _bytes(pair.ps, src)
                for t in range(2):
                    assert (got[t][local[-2:]] == want[t][remote[-2:]]).all()

    asyncio.run(main())
    assert len(seen) == 1 and seen[0][1] == 4201 and seen[0][0].startswith("datadist-io"), seen   # a small one:
    # answered inline (``readview``), no segments of a general read


def test_the_segments_of_an_open_write_of_many_blocks_are_worked_out_off_the_loop(monkeypatch) -> None:  # noqa: ANN001
    """As a read's: an open write whose parts name more than ``owner._LOOP_BLOCKS`` blocks in all has their segments
    worked out on the link's peer's threads (a refused or maximal one cost ~0.16 s of loop per frame: 2,048 parts of
    1,000 blocks); a small one on the loop. All or none as before: the pins and caps come back when the writes go."""
    from datadistd.core.types import BlocksKeyRef, ReadMode, RemoteSpec
    from datadistd.links import owner

    seen: list[str] = []
    real = owner.segments_of

    def watched(tensors: Any, spans: Any) -> Any:
        seen.append(threading.current_thread().name)
        return real(tensors, spans)

    monkeypatch.setattr(owner, "segments_of", watched)

    async def main() -> None:
        async with Pair() as pair:
            assert await pair.link() == (0, [0])
            src, _ = pair.caches()
            serving, _ = pair.links
            (link,) = serving.served.values()
            small = RemoteSpec(BlocksKeyRef(P, 0), ReadMode.BLOCKS, (1, 2), -1, 0, 0, 0, 2 * 2 * BLOCK)
            large = RemoteSpec(BlocksKeyRef(P, 0), ReadMode.BLOCKS, (1, 2) * 1100, -1, 0, 0, 0, 2 * 2200 * BLOCK)
            assert len(await serving.owner.open_write_for(link, [small], 1000)) == 1
            assert seen == ["MainThread"]
            assert len(await serving.owner.open_write_for(link, [large, large], 1000)) == 2
            assert len(seen) == 3 and all(name.startswith("datadist-io") for name in seen[1:]), seen
            assert serving.engine.entry(src).pins == 3 and link.usage.writes == 3
            serving.table.drop_writes(list(serving.table.writes))
            assert await _until(lambda: serving.engine.entry(src).pins == 0) and link.usage.writes == 0

    asyncio.run(main())
