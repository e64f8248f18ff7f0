"""An authenticated peer cannot make the owner hold without bound (issue 27, attack 8).

In process (``tests/unit/test_links.py``'s ``Pair``: two nodes, real loopback data planes): the link's other
end opens writes of 2,048 parts with a hold time of 2^32-1 ms, and keeps owner calls waiting; per-link caps
(``[quota] link_*``) refuse the excess with ``LLM_LINK_BUSY``, the hold is cut to ``link_max_wait_ms``, and
another link to the same engine pulls meanwhile.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from datadist.status import LLMStatusCode as S
from datadistd.core.errors import DataDistError
from datadistd.core.types import BlocksKeyRef, ReadMode, RemoteSpec, Role
from datadistd.guard.quota import LinkLimits
from datadistd.links import ClusterSpec
from tests.fakes import pulled, read_inline, worker_session
from tests.unit.test_links import BLOCK, BLOCKS, POOL, Pair, _order, _until

pytestmark = pytest.mark.timeout(120)

P, D = 1, 2
HUGE = 2**32 - 1


def test_8_one_peer_is_held_to_its_links_caps():
    async def main() -> None:
        async with Pair() as pair:
            pair.p.link_limits = LinkLimits(calls_in_flight=4, open_writes=4096, pinned_bytes=1 << 30,
                                            max_wait_ms=2000, calls_queued=2)
            assert await pair.link() == (0, [0])
            serving, _ = pair.links
            src, _ = pair.caches()
            (link,) = serving.served.values()
            part = RemoteSpec(BlocksKeyRef(P, 0), ReadMode.BLOCKS, (1,), -1, 0, 0, 0, 2 * BLOCK)
            # 150 open writes of 2,048 parts, held "forever": two fit the per-link cap, the rest are refused
            opened, refused = [], 0
            for _ in range(150):
                try:
                    opened.append(await serving.owner.open_write_for(link, [part] * 2048, HUGE, HUGE))
                except DataDistError as exc:
                    assert exc.code == S.LLM_LINK_BUSY and "link_open_writes" in exc.message
                    refused += 1
            assert len(opened) == 2 and refused == 148
            assert link.usage.writes == 4096
            assert all(pw.deadline <= time.monotonic() + 2.0 for pw in serving.table.writes.values())   # hold cut
            # owner calls kept hanging (commits of writes whose bytes never come): 4 run (4 executor threads),
            # 2 wait for a turn holding no thread, the 7th is refused
            stuck = [asyncio.ensure_future(serving.owner.commit_write_for(link, [tid], HUGE)) for tid in opened[0][:7]]
            await asyncio.sleep(0.2)
            busy = [t for t in stuck if t.done()]
            assert link.usage.calls == 4 and link.usage.waiting == 2
            assert len(busy) == 1 and isinstance(busy[0].exception(), DataDistError)
            assert busy[0].exception().code == S.LLM_LINK_BUSY
            # another engine's link to the same owner is not slowed: it links and pulls meanwhile
            other = await pair.d.init_engine(3, Role.DECODER, {"llm.MemPoolConfig": POOL,
                                                               "llm.EnableRemoteCacheAccessible": "1"},
                                             worker_session(pair.d))
            assert await other.links.link_clusters([ClusterSpec(P, "127.0.0.1", 1)], 3000) == (0, [0])
            from datadistd.core.types import CacheDesc, DType, Placement
            dst = other.engine.allocate_cache(CacheDesc(2, (BLOCKS, BLOCK), DType.DT_UINT8, Placement.DEVICE),
                                              is_blocks=True, blocks_key=BlocksKeyRef(3, 0))
            nbytes, _ = await pulled(other.links, _order(P, int(dst.cache_id), [1], [0]))
            assert nbytes == 2 * BLOCK     # one block of each of the two tensors
            # the stuck ones end at the cut hold time, not in 49 days; what they held is given back
            for t in stuck:
                try:
                    await asyncio.wait_for(t, 10)
                except DataDistError:
                    pass
            serving.table.drop_writes(list(serving.table.writes))
            assert link.usage.writes == 0 and link.usage.pinned == 0 and link.usage.calls == 0
            assert await _until(lambda: serving.engine.entry(src).pins == 0)
            assert await serving.owner.open_write_for(link, [part], 1000)     # the legitimate use goes on

    asyncio.run(main())


def test_8b_small_reads_answered_inline_are_checked_capped_and_pin_nothing():
    """The peer protocol answers a small read with its bytes in the reply. The other end cannot use that to make
    the owner copy out more than ``INLINE_READ_MAX`` per call, to hold more replies than its link's call cap,
    or to keep a cache pinned: the copy ends before the reply goes out."""
    from datadistd.links.wire.ownercalls import INLINE_READ_MAX

    async def main() -> None:
        async with Pair() as pair:
            pair.p.link_limits = LinkLimits(calls_in_flight=2, open_writes=64, pinned_bytes=1 << 30,
                                            max_wait_ms=5000, calls_queued=1)
            assert await pair.link() == (0, [0])
            serving, linking = pair.links
            src, _ = pair.caches()
            (link,) = serving.served.values()
            out = linking.links[P]
            spec = RemoteSpec(BlocksKeyRef(P, 0), ReadMode.BLOCKS, (1, 3), -1, 0, 0, 0, 4 * BLOCK)
            data, release = await read_inline(out.calls, spec, 5.0)   # the legitimate use, over the wire
            assert data == bytes([1]) * 2 * BLOCK + bytes([2]) * 2 * BLOCK and not release
            assert serving.engine.entry(src).pins == 0 and link.usage.calls == 0
            for bad, code in [(RemoteSpec(BlocksKeyRef(P, 0), ReadMode.BLOCKS, (1,), -1, 0, 0, 0, INLINE_READ_MAX + 1),
                               S.LLM_PARAM_INVALID),     # more than an inline reply may carry: refused unread
                              (RemoteSpec(BlocksKeyRef(P, 0), ReadMode.BLOCKS, (BLOCKS,), -1, 0, 0, 0, 2 * BLOCK),
                               S.LLM_PARAM_INVALID),     # a block past the cache's end
                              (RemoteSpec(BlocksKeyRef(P, 0), ReadMode.BLOCKS, (1,), -1, 0, 0, 0, 3 * BLOCK),
                               S.LLM_PARAM_INVALID),     # a byte count that is not what the blocks hold
                              (RemoteSpec(BlocksKeyRef(P, 9), ReadMode.BLOCKS, (1,), -1, 0, 0, 0, 2 * BLOCK),
                               S.LLM_KV_CACHE_NOT_EXIST)]:   # a key the owner does not have
                with pytest.raises(DataDistError) as info:
                    await read_inline(out.calls, bad, 5.0)
                assert info.value.code == code, (bad, info.value)
            assert serving.engine.entry(src).pins == 0 and link.usage.calls == 0
            # the link's two turns taken: one more inline read waits for a turn, the next is refused at once
            limits = pair.p.link_limits
            for _ in range(2):
                await link.usage.enter_call(limits, time.monotonic() + 5)
            waiting = asyncio.ensure_future(read_inline(out.calls, spec, 5.0))
            assert await _until(lambda: link.usage.waiting == 1)
            with pytest.raises(DataDistError) as info:
                await read_inline(out.calls, spec, 5.0)
            assert info.value.code == S.LLM_LINK_BUSY
            link.usage.exit_call()
            assert (await asyncio.wait_for(waiting, 5))[0] == data    # served once a turn is free
            link.usage.exit_call()
            assert await _until(lambda: link.usage.calls == 0) and serving.engine.entry(src).pins == 0

    asyncio.run(main())
