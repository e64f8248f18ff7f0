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
from tests.fakes import pulled

from .test_links import BLOCK, BLOCKS, D, P, Pair, _bytes, _order

pytestmark = pytest.mark.timeout(60)


def _fill(slot: Any, cache_id: int, value: int) -> None:
    for seg in tensors_of(slot.engine.entry(cache_id)):
        seg.handle.write_from(seg.offset, memoryview(np.full(seg.length, value, np.uint8)).cast("B"))


async def _warm(pair: Pair, dst: int) -> None:
    """The first inline read goes by the event loop, which publishes the view; the next one is the reader's."""
    serving, linking = pair.links
    await pulled(linking, _order(P, dst, [0], [0]))
    assert readview.current(serving.engine)


def _reads(serving: Any, at_least: int = 0) -> int:
    """Bytes the reader threads answered reads with (waiting a moment for ``at_least``: they count after the
    reply)."""
    limit = time.monotonic() + 5
    while True:
        n = sum(link.reader_bytes_out for link in serving.table.served.values())
        if n >= at_least or time.monotonic() > limit:
            return n
        time.sleep(0.001)


def _loop_bytes(serving: Any) -> int:
    """Bytes the owner's event loop sent (reads it answered: by reply or on the data channel)."""
    return sum(link.bytes_out for link in serving.table.served.values())


def test_a_small_read_is_answered_by_the_reader_thread_byte_exact_without_the_loop() -> None:
    async def main() -> None:
        async with Pair() as pair:
            serving, linking = pair.links
            pair.p.metrics = metrics = DaemonMetrics()
            await pair.link()
            src, dst = pair.caches()
            await _warm(pair, dst)
            loop_out, before = _loop_bytes(serving), _reads(serving)
            counted = metrics.bound("serve_read", str(P), str(D))
            nbytes, nblocks = counted.nbytes, counted.nblocks
            for _ in range(5):
                assert await pulled(linking, _order(P, dst, [1, 4], [2, 7])) == (4 * BLOCK, "tcp")
            assert _reads(serving, before + 5 * 4 * BLOCK) == before + 5 * 4 * BLOCK   # the reader threads'
            assert _loop_bytes(serving) == loop_out          # the owner's event loop answered none of them
            for t, tensor in enumerate(_bytes(pair.ds, dst)):
                assert (tensor[[0, 2, 7]] == t + 1).all() and (tensor[[1, 3, 4, 5, 6]] == 0).all()
            link = next(iter(serving.table.served.values()))
            assert link.bytes_sent == link.bytes_out + link.reader_bytes_out >= 5 * 4 * BLOCK
            assert counted.nbytes - nbytes == 5 * 4 * BLOCK   # serve_read counts them as the loop did
            assert counted.nblocks - nblocks == 5 * 2
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
            loop_out, before = _loop_bytes(serving), _reads(serving)
            await pulled(linking, _order(P, dst, [3], [3]))
            assert _reads(serving, before + 1) > before and _loop_bytes(serving) == loop_out
            assert time.monotonic() - link.last_seen < 5

    asyncio.run(main())


class _Pause:
    """Where a reader thread stops once: taking the view of a cache's memory while the engine's read lock is
    held, i.e. between the read view's generation check and its copy (``readview.read_now``)."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self.armed = False
        self.paused, self.go = threading.Event(), threading.Event()

    def here(self) -> None:
        if self.armed and self.lock.locked() and threading.current_thread() is not threading.main_thread():
            self.armed = False
            self.paused.set()
            self.go.wait(10)


class _PausingMemory(BufferHandle):
    """Worker memory handed to the daemon (a fake injected by registration) whose view can stop a reader."""

    def __init__(self, buf: bytearray, pause: _Pause) -> None:
        super().__init__(buf)
        self.pause = pause

    def view(self) -> memoryview | None:
        self.pause.here()
        return super().view()


def test_a_deregistration_racing_a_read_waits_for_its_copy_and_a_later_read_is_refused() -> None:
    """The reader passed the view check and holds the read lock: the event loop's unregister blocks in
    ``Engine._free`` until the copy is done, so the bytes are the old ones though the worker overwrites its
    memory the moment the cache is gone; a read after it falls back: LLM_KV_CACHE_NOT_EXIST."""
    async def main() -> None:
        async with Pair() as pair:
            serving, linking = pair.links
            await pair.link()
            _, dst = pair.caches()
            pause = _Pause(serving.engine.read_lock)
            bufs = [bytearray(bytes([t + 1]) * (BLOCKS * BLOCK)) for t in range(2)]
            desc = CacheDesc(2, (BLOCKS, BLOCK), DType.DT_UINT8, Placement.DEVICE)
            registered = serving.engine.register_cache(desc, is_blocks=True,
                                                       handles=[_PausingMemory(b, pause) for b in bufs],
                                                       blocks_key=BlocksKeyRef(P, 0), remote_accessible=True)
            await _warm(pair, dst)   # the key now names the registered cache; the view is published
            pause.armed = True
            try:
                ended: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                linking.start_pull(_order(P, dst, [5], [5]), ended.set_result)
                assert await asyncio.get_running_loop().run_in_executor(None, pause.paused.wait, 10)
                threading.Timer(0.3, pause.go.set).start()
                started = time.monotonic()
                serving.engine.unregister_cache(int(registered.cache_id))   # blocks until the reader's copy is done
                waited = time.monotonic() - started
                for buf in bufs:                                  # the worker reuses its memory at once
                    buf[:] = b"\xee" * len(buf)
                assert await asyncio.wait_for(ended, 10) == (2 * BLOCK, "tcp")
            finally:
                pause.go.set()
            assert waited >= 0.2
            for t, tensor in enumerate(_bytes(pair.ds, dst)):
                assert (tensor[5] == t + 1).all()          # the registered cache's bytes, never 0xEE
            reads = _reads(serving, 2 * BLOCK)   # the paused read's, counted once its reply is out
            with pytest.raises(DataDistError) as info:
                await pulled(linking, _order(P, dst, [6], [6]))
            assert info.value.code == S.LLM_KV_CACHE_NOT_EXIST   # the loop's refusal: a reader thread never refuses
            assert _reads(serving) == reads
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
                await pulled(linking, _order(P, dst, [2], [2]))
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
                await link.calls._call(lambda cid, ms: ReadCmd(cid, 0, spec, ms, inline=True), 5)
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
