"""A small read answered by the owner's data reader thread (``readview``, ``OwnerCalls._answer_here``): bytes
exact with no event-loop hop, and never the bytes of a cache the peer may not read -- a deallocate racing a
read waits for the read's copy, a read after it falls back and is refused as before."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np
import pytest

from datadist.status import LLMStatusCode as S
from datadistd.core.errors import DataDistError
from datadistd.core.types import BlocksKeyRef, CacheDesc, DType, Placement, ReadMode, RemoteSpec
from datadistd.links.wire.ownercalls import ReadCmd
from datadistd.memory.copy import BufferHandle
from datadistd.state import readview
from datadistd.state.engine import tensors_of
from datadistd.state.metrics import DaemonMetrics

from .test_links import BLOCK, BLOCKS, D, P, Pair, _bytes, _order

pytestmark = pytest.mark.timeout(60)


def _fill(slot: Any, cache_id: int, value: int) -> None:
    for seg in tensors_of(slot.engine.entry(cache_id)):
        seg.handle.write_from(seg.offset, memoryview(np.full(seg.length, value, np.uint8)).cast("B"))


async def _warm(pair: Pair, dst: int) -> None:
    """The first inline read goes by the event loop, which publishes the view; the next one is the reader's."""
    serving, linking = pair.links
    await linking.pull(_order(P, dst, [0], [0]))
    assert readview.current(serving.engine)


def _reads(serving: Any, at_least: int = 0) -> int:
    """Reads the reader threads answered (waiting a moment for ``at_least``: they count after the reply)."""
    limit = time.monotonic() + 5
    while True:
        n = sum(link.reader_reads for link in serving.table.served.values())
        if n >= at_least or time.monotonic() > limit:
            return n
        time.sleep(0.001)


def test_a_small_read_is_answered_by_the_reader_thread_byte_exact_without_the_loop() -> None:
    async def main() -> None:
        async with Pair() as pair:
            serving, linking = pair.links
            pair.p.metrics = metrics = DaemonMetrics()
            await pair.link()
            src, dst = pair.caches()
            await _warm(pair, dst)
            frames, before = serving.calls.loop_frames, _reads(serving)
            counted = metrics.bound("serve_read", str(P), str(D))
            nbytes, nblocks = counted.bytes()._value.get(), counted.blocks()._value.get()
            for _ in range(5):
                assert await linking.pull(_order(P, dst, [1, 4], [2, 7])) == (4 * BLOCK, "tcp")
            assert serving.calls.loop_frames == frames       # the owner's event loop saw none of them
            assert _reads(serving, before + 5) == before + 5
            for t, tensor in enumerate(_bytes(pair.ds, dst)):
                assert (tensor[[0, 2, 7]] == t + 1).all() and (tensor[[1, 3, 4, 5, 6]] == 0).all()
            link = next(iter(serving.table.served.values()))
            assert link.bytes_sent == link.bytes_out + link.reader_bytes_out >= 5 * 4 * BLOCK
            assert counted.bytes()._value.get() - nbytes == 5 * 4 * BLOCK   # serve_read counts them as the loop did
            assert counted.blocks()._value.get() - nblocks == 5 * 2
            assert serving.engine.entry(src).pins == 0

    asyncio.run(main())


def test_a_link_doing_only_reader_thread_reads_stays_alive() -> None:
    """The reader thread refreshes ``last_seen`` as the loop does: the sweeper keeps the link."""
    async def main() -> None:
        async with Pair() as pair:
            serving, linking = pair.links
            await pair.link()
            _, dst = pair.caches()
            await _warm(pair, dst)
            link = next(iter(serving.table.served.values()))
            link.last_seen = time.monotonic() - 3600           # as if nothing came for an hour
            frames = serving.calls.loop_frames
            await linking.pull(_order(P, dst, [3], [3]))
            assert serving.calls.loop_frames == frames
            assert time.monotonic() - link.last_seen < 5

    asyncio.run(main())


def test_a_deallocate_racing_a_read_waits_for_its_copy_and_a_later_read_is_refused() -> None:
    """The reader passed the view check and holds the read lock: the event loop's deallocate blocks in
    ``Engine._free`` until the copy is done, so the bytes are the old cache's though a new cache of another
    pattern takes the same memory at once; a read after the deallocate falls back: LLM_KV_CACHE_NOT_EXIST."""
    async def main() -> None:
        async with Pair() as pair:
            serving, linking = pair.links
            await pair.link()
            src, dst = pair.caches()
            await _warm(pair, dst)
            old = tensors_of(serving.engine.entry(src))
            paused, go = threading.Event(), threading.Event()

            def pause() -> None:
                readview.PAUSE = None
                paused.set()
                go.wait(10)

            readview.PAUSE = pause
            try:
                ended: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                linking.start_pull(_order(P, dst, [5], [5]), ended.set_result)
                assert await asyncio.get_running_loop().run_in_executor(None, paused.wait, 10)
                threading.Timer(0.3, go.set).start()
                started = time.monotonic()
                serving.engine.deallocate_cache(src, is_blocks=True)   # blocks until the reader's copy is done
                waited = time.monotonic() - started
                desc = CacheDesc(2, (BLOCKS, BLOCK), DType.DT_UINT8, Placement.DEVICE)
                again = serving.engine.allocate_cache(desc, is_blocks=True)   # no key: nobody may read it
                where = [(repr(s.handle), s.offset) for s in tensors_of(again)]
                assert where == [(repr(s.handle), s.offset) for s in old]   # the same memory
                _fill(pair.ps, int(again.cache_id), 0xEE)
                assert await asyncio.wait_for(ended, 10) == (2 * BLOCK, "tcp")
            finally:
                readview.PAUSE = None
                go.set()
            assert waited >= 0.2
            for t, tensor in enumerate(_bytes(pair.ds, dst)):
                assert (tensor[5] == t + 1).all()          # the old cache's bytes, never 0xEE
            reads, frames = _reads(serving), serving.calls.loop_frames
            with pytest.raises(DataDistError) as info:
                await linking.pull(_order(P, dst, [6], [6]))
            assert info.value.code == S.LLM_KV_CACHE_NOT_EXIST
            assert _reads(serving) == reads and serving.calls.loop_frames > frames
            for tensor in _bytes(pair.ds, dst):
                assert (tensor[6] == 0).all()

    asyncio.run(main())


def test_a_cache_not_remotely_accessible_is_not_read_by_the_reader_thread() -> None:
    """A blocks key re-pointed (register, overwrite) to a cache that is not remotely accessible: the
    registry's generation moves, the reader falls back, the loop refuses with LLM_KV_CACHE_NOT_EXIST."""
    async def main() -> None:
        async with Pair() as pair:
            serving, linking = pair.links
            await pair.link()
            _, dst = pair.caches()
            await _warm(pair, dst)
            desc = CacheDesc(2, (BLOCKS, BLOCK), DType.DT_UINT8, Placement.HOST)
            handles = [BufferHandle(bytearray(BLOCKS * BLOCK)) for _ in range(2)]
            serving.engine.register_cache(desc, is_blocks=True, handles=handles, blocks_key=BlocksKeyRef(P, 0),
                                          remote_accessible=False)
            reads = _reads(serving)
            with pytest.raises(DataDistError) as info:
                await linking.pull(_order(P, dst, [2], [2]))
            assert info.value.code == S.LLM_KV_CACHE_NOT_EXIST
            assert _reads(serving) == reads
            view = serving.engine.read_view
            assert isinstance(view, readview.ReadView) and 0 not in view.blocks

    asyncio.run(main())


@pytest.mark.parametrize("case", ["block out of range", "wrong byte count", "unknown key", "tensor range",
                                  "other cluster"])
def test_every_refusal_has_the_status_it_had(case: str) -> None:
    """Refusals are the event loop's: the same status with and without the reader-thread path."""
    spec = {
        "block out of range": RemoteSpec(BlocksKeyRef(P, 0), ReadMode.BLOCKS, (BLOCKS,), expected_bytes=2 * BLOCK),
        "wrong byte count": RemoteSpec(BlocksKeyRef(P, 0), ReadMode.BLOCKS, (1,), expected_bytes=2 * BLOCK + 1),
        "unknown key": RemoteSpec(BlocksKeyRef(P, 7), ReadMode.BLOCKS, (1,), expected_bytes=2 * BLOCK),
        "tensor range": RemoteSpec(BlocksKeyRef(P, 0), ReadMode.BLOCKS, (1,), tensor_start=1, tensor_count=2,
                                   expected_bytes=2 * BLOCK),
        "other cluster": RemoteSpec(BlocksKeyRef(D, 0), ReadMode.BLOCKS, (1,), expected_bytes=2 * BLOCK),
    }[case]

    async def status(fast: bool) -> tuple[int, int]:
        async with Pair() as pair:
            serving, linking = pair.links
            await pair.link()
            _, dst = pair.caches()
            await _warm(pair, dst)
            if not fast:
                serving.calls._answer_here = lambda *a: False   # type: ignore[method-assign]
            link = linking.table.links[P]
            reads = _reads(serving)
            try:
                await link.calls._call(lambda cid, ms: ReadCmd(cid, link.session, 0, spec, ms, inline=True), 5)
                code = int(S.LLM_SUCCESS)
            except DataDistError as exc:
                code = int(exc.code)
            return code, _reads(serving) - reads

    async def main() -> None:
        slow, _ = await status(False)
        fast, reads = await status(True)
        assert fast == slow != int(S.LLM_SUCCESS) and reads == 0

    asyncio.run(main())


def test_the_registry_generation_moves_with_what_a_peer_may_read_and_not_with_pins() -> None:
    """Every change a published view must not outlive bumps it (before any entry is returned to be freed);
    pin and unpin -- every transfer -- do not."""
    from datadistd.core.registry import CacheRegistry
    from datadistd.core.types import UINT64_MAX, OwnerKey

    r = CacheRegistry()
    desc = CacheDesc(2, (BLOCKS, BLOCK), DType.DT_UINT8, Placement.DEVICE)
    seen = [r.generation]

    def moved() -> bool:
        seen.append(r.generation)
        return seen[-1] > seen[-2]

    blocks = r.add(desc, is_blocks=True, owned=True, remote_accessible=True, memory=None)
    assert moved()
    r.bind_blocks_key(blocks.cache_id, 0, overwrite=False)
    assert moved()
    r.pin(blocks.cache_id)
    r.unpin(blocks.cache_id)
    assert not moved()
    other = r.add(desc, is_blocks=True, owned=False, remote_accessible=False, memory=None)
    assert moved()
    r.bind_blocks_key(other.cache_id, 0, overwrite=True)     # re-pointed: the view must not keep the old one
    assert moved()
    r.pin(blocks.cache_id)
    assert r.remove_cache(blocks.cache_id) == [] and moved()  # retired while pinned: unreadable at once
    assert r.unpin(blocks.cache_id) == [blocks] and not moved()   # freed later: the bump came before
    slots = r.add(CacheDesc(1, (2, BLOCK), DType.DT_UINT8, Placement.DEVICE), is_blocks=False, owned=True,
                  remote_accessible=True, memory=None)
    key = OwnerKey.from_cache_key(7, UINT64_MAX, 0)
    assert key is not None
    r.bind_keys(slots.cache_id, [key])
    assert moved()
    assert r.release_id(slots.cache_id) == [] and not moved()   # its key still holds it: nothing a peer sees
    assert r.consume_pulled(key, [0]) == [slots] and moved()     # the key consumed and the cache freed
    r.clear()
    assert moved()
