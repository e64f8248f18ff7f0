"""One principal cannot fill the daemon's threads (issue 27, attack 8 and "What to build" 2).

The attack: 200 owner calls of one authenticated peer that never complete filled all 128 threads of the
node-wide executor, and another tenant's purely local ``CopyBlocks`` missed its deadline. Now every blocking
job runs for a principal (``executor.Threads``: a uid's local work, or one peer address's owner calls over all
its links) that holds at most ``[quota] threads_per_principal`` threads; the rest wait on the event loop.

In process (``tests/unit/test_links.py``'s ``Pair``, real loopback data planes): the per-link cap is lifted
so that only the thread share stands between the peer and the executor; its commits of writes whose bytes
never come hang in worker threads. No timing threshold: the peer's share is counted, and the local copy must
end while every hanging call still hangs (a generous deadline only bounds the failure: without the shares
the copy waits for a thread until the hog's calls time out, a minute later).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import numpy as np
import pytest

from datadistd.core.types import BlocksKeyRef, ReadMode, RemoteSpec
from datadistd.engine.engine import tensors_of
from datadistd.guard.executor import EXECUTOR_THREADS, Threads
from datadistd.guard.quota import LinkLimits
from tests.fakes import pulled
from tests.unit.test_links import BIG_POOL, BIG_ROW, BLOCK, BLOCKS, D, Pair, _order, _until, big_caches

pytestmark = pytest.mark.timeout(180)

P = 1
HOG = EXECUTOR_THREADS + 72     # more hanging calls than the executor has threads


def test_8_one_peer_at_its_thread_share_leaves_a_local_copy_alone() -> None:
    async def main() -> None:
        async with Pair() as pair:
            threads = pair.p.threads
            assert threads.workers == EXECUTOR_THREADS and 0 < threads.share < threads.workers
            # no per-link cap: only the thread share holds the peer back (its links together are one principal)
            pair.p.link_limits = LinkLimits(calls_in_flight=0, open_writes=4096, pinned_bytes=1 << 30,
                                            max_wait_ms=60_000)
            assert await pair.link() == (0, [0])
            serving, _ = pair.links
            src, _ = pair.caches()
            (link,) = serving.served.values()
            piece = RemoteSpec(BlocksKeyRef(P, 0), ReadMode.BLOCKS, (1,), -1, 0, 0, 0, 2 * BLOCK)
            tids = await serving.owner.open_write_for(link, [piece] * HOG, 60_000, 60_000)
            hog = [asyncio.ensure_future(serving.owner.commit_write_for(link, [tid], 60_000)) for tid in tids]
            share = threads.share
            assert await _until(lambda: threads.held(link.principal) == (share, HOG - share))
            # the tenant's own CopyBlocks on the same engine, while the peer waits for threads it may not take
            copied = await asyncio.wait_for(serving.engine.copy_blocks(src, {0: [BLOCKS - 1]}), 50)
            assert copied == 2 * BLOCK and not any(t.done() for t in hog)
            assert threads.held(link.principal) == (share, HOG - share)      # the peer still at its share
            for t in hog:
                t.cancel()
            serving.table.drop_writes(list(serving.table.writes))

    asyncio.run(main())


def test_a_principal_waits_for_its_turn_in_order_and_is_forgotten_when_idle() -> None:
    async def main() -> None:
        import threading

        threads = Threads(4, 1)             # one thread per principal: its jobs run strictly one after another
        release = threading.Event()
        order: list[int] = []

        def job(n: int) -> int:
            release.wait(30)
            order.append(n)
            return n

        hog = [asyncio.ensure_future(threads.run("peer a", job, n)) for n in range(4)]
        assert await _until(lambda: threads.held("peer a") == (1, 3))
        assert await asyncio.wait_for(threads.run("uid 7", lambda: 7), 30) == 7   # another principal: a thread
        hog[2].cancel()                                                          # a waiting job gives up
        assert await _until(lambda: threads.held("peer a") == (1, 2))
        release.set()
        assert await asyncio.gather(hog[0], hog[1], hog[3]) == [0, 1, 3]
        assert order == [0, 1, 3]                       # the waiting jobs ran in the order they came
        assert threads.held("peer a") == (0, 0) and not threads._shares
        threads.shutdown()

    asyncio.run(main())


def test_reads_behind_a_stalled_send_hold_one_thread_of_the_peer_not_one_each() -> None:
    """A peer whose reads are sent slowly (here: its link's one connection stalls in the first send) gets the rest
    queued on its link, holding no thread: one executor thread per connection of the link sends them in turn
    (``Owner._queued``), so however many reads it keeps in flight, one peer's link holds one thread -- not one per
    read up to its whole share. Once the send goes on, every read completes, byte-exact, nothing left queued."""
    async def main() -> None:
        async with Pair(pool=BIG_POOL) as pair:
            serving, linking = pair.links
            assert await pair.link() == (0, [0])
            src, dst, pattern = big_caches(pair)
            link = serving.table.served[D]
            channel = serving.table.channel_of(link)
            go, send = threading.Event(), channel.send

            def stalled(*args: object, **kwargs: object) -> None:
                assert go.wait(30)
                send(*args, **kwargs)

            channel.send = stalled  # type: ignore[method-assign]
            threads = pair.p.threads
            # 6 reads of 5 rows of 64 KiB (320 KiB: more than the event loop sends itself) in flight at once
            remote = [[10 * k + 9 - i for i in range(5)] for k in range(6)]
            orders = [dataclasses.replace(_order(P, int(dst.cache_id), r, list(range(5 * k, 5 * k + 5))),
                                          timeout_ms=30_000) for k, r in enumerate(remote)]
            pulls = [asyncio.ensure_future(pulled(linking, o)) for o in orders]
            queued = lambda: len(getattr(getattr(serving.owner, "_sends", {}).get(id(link)), "jobs", ()))  # noqa: E731
            assert await _until(lambda: queued() == 5)   # one is in the stalled send, the rest wait for it
            assert threads.held(link.principal) == (1, 0)
            go.set()
            got = await asyncio.wait_for(asyncio.gather(*pulls), 30)
            assert got == [(5 * BIG_ROW, "tcp")] * 6
            (out,) = tensors_of(dst)
            buf = np.zeros(out.length, np.uint8)
            out.handle.read_into(out.offset, memoryview(buf).cast("B"))
            assert (buf.reshape(-1, BIG_ROW)[:30] == pattern[[b for r in remote for b in r]]).all()
            assert await _until(lambda: threads.held(link.principal) == (0, 0) and not serving.owner._sends)

    asyncio.run(main())
