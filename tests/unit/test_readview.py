"""A small read answered by the engine's published read view (``readview``, ``OwnerCalls._read_here``): from the
owner's data reader thread, bytes exact with no event-loop hop; the same bytes and the same status codes and
messages as the general path (``Owner.read_small``) for every request, good or hostile; and never the bytes of a
cache the peer may not read -- a deallocate racing a read waits for the read's copy, a read after it is refused."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from typing import Any

import numpy as np
import pytest

from datadist.status import LLMStatusCode as S
from datadistd.core.errors import DataDistError
from datadistd.core.types import BlocksKeyRef, CacheDesc, CacheKeyRef, DType, Placement, ReadMode, RemoteSpec
from datadistd.engine import readview
from datadistd.engine.engine import tensors_of
from datadistd.engine.extents import ExtentOrder
from datadistd.links.wire import ownerwire
from datadistd.links.wire.ownercalls import INLINE_READ_MAX, ReadCmd
from datadistd.memory.base import FdPiece
from datadistd.memory.copy import BufferHandle
from datadistd.memory.imported import MappedFdHandle
from datadistd.ops.metrics import DaemonMetrics
from datadistd.transport.base import CONTROL_CALL
from tests.fakes import _Ended, pulled, start_pull

from .test_links import BLOCK, BLOCKS, D, P, Pair, _bytes, _order, general_reads_only

pytestmark = pytest.mark.timeout(60)


def _fill(slot: Any, cache_id: int, value: int) -> None:
    for seg in tensors_of(slot.engine.entry(cache_id)):
        seg.handle.write_from(seg.offset, memoryview(np.full(seg.length, value, np.uint8)).cast("B"))


async def _warm(pair: Pair, dst: int) -> None:
    """A first read (the view is published with the caches, ``LinkTable.changed``: the reader thread answers it),
    waited for until the owner counted it -- it counts after its reply, which the puller may see first."""
    serving, linking = pair.links
    await pulled(linking, _order(P, dst, [0], [0]))
    assert readview.current(serving.engine)
    limit = time.monotonic() + 5
    while sum(link.bytes_sent for link in serving.table.served.values()) < 2 * BLOCK and time.monotonic() < limit:
        await asyncio.sleep(0.001)


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


_REGISTRATION = CacheDesc(1, (1, 8192), DType.DT_UINT8, Placement.HOST)   # one HIXL registration: a row of 8 KiB


def _registrations(serving: Any, linking: Any) -> tuple[bytearray, bytearray, Any]:
    """One HIXL registration at each end: the owner's of random bytes at worker address 0x10000 (remotely
    accessible), the requester's of zeros at 0x20000; (their bytes, and the requester's registry entry)."""
    src, dst = bytearray(os.urandom(8192)), bytearray(8192)
    serving.engine.register_cache(_REGISTRATION, is_blocks=False, handles=[BufferHandle(src)], remote_accessible=True,
                                  worker_addrs=[0x10000])
    mine = linking.engine.register_cache(_REGISTRATION, is_blocks=False, handles=[BufferHandle(dst)],
                                         worker_addrs=[0x20000])
    return src, dst, mine


def test_a_small_extents_read_is_answered_by_the_reader_thread_byte_exact() -> None:
    """HIXL's few extents by address (``ReadMode.EXTENTS``) are a small read the published view answers too: the
    owner's registrations by worker address, each extent wholly inside one, its bytes straight from the memory; the
    owner's event loop answers none, and an extent outside every registration is still refused there."""
    async def main() -> None:
        async with Pair() as pair:
            serving, linking = pair.links
            await pair.link()
            src, dst, _ = _registrations(serving, linking)
            ext = np.array([[0x20000 + 8, 0x10000 + 100, 50], [0x20000, 0x10000 + 4000, 8]], dtype=np.uint64)
            loop_out, before = _loop_bytes(serving), _reads(serving)
            for _ in range(3):
                assert await pulled(linking, ExtentOrder(P, False, ext)) == (58, "tcp")
            assert _reads(serving, before + 3 * 58) == before + 3 * 58 and _loop_bytes(serving) == loop_out
            assert dst[8:58] == src[100:150] and dst[:8] == src[4000:4008]
            outside = np.array([[0x20000, 0x10000 + 8190, 8]], dtype=np.uint64)
            with pytest.raises(DataDistError) as info:
                await pulled(linking, ExtentOrder(P, False, outside))
            assert info.value.code == S.LLM_PARAM_INVALID and "not inside one memory registration" in info.value.message

    asyncio.run(main())


def test_a_small_extents_read_takes_the_quick_shape_at_both_ends() -> None:
    """The attach frame's few extents started off the loop (``on_loop=False``, as a reactor thread starts them): the
    quick shape takes them (True) -- local rows by the published pull view, no pin -- and the bytes land byte-exact;
    a registry change before the reply lands them by the view of then, on the loop; more extents than ``FEW``, or a
    local extent outside every registration, are declined (False, nothing done) for the order to answer."""
    async def main() -> None:
        async with Pair() as pair:
            serving, linking = pair.links
            await pair.link()
            src, dst, mine = _registrations(serving, linking)
            nums = (0x20000 + 8, 0x10000 + 100, 50, 0x20000, 0x10000 + 4000, 8)
            loop = asyncio.get_running_loop()

            async def quick(numbers: tuple[int, ...], on_loop: bool) -> tuple[bool, object]:
                ended: asyncio.Future[object] = loop.create_future()
                ends = _Ended(lambda result: ended.done() or ended.set_result(result))
                took = await asyncio.to_thread(linking.transfer, False, P, -1, 0, ends, None, extents=numbers,
                                               on_loop=on_loop) if not on_loop else \
                    linking.transfer(False, P, -1, 0, ends, None, extents=numbers, on_loop=True)
                return took, (await asyncio.wait_for(ended, 10) if took else None)

            assert await quick(nums, False) == (True, (58, "tcp"))
            assert dst[8:58] == src[100:150] and dst[:8] == src[4000:4008]
            assert linking.engine.entry(mine.cache_id).pins == 0
            dst[:] = bytes(8192)
            assert await quick(nums, True) == (True, (58, "tcp"))
            assert dst[8:58] == src[100:150]
            dst[:] = bytes(8192)   # a registration right after the start: the reply finds the view stale (mostly)
            ended: asyncio.Future[object] = loop.create_future()
            ends = _Ended(lambda result: ended.done() or ended.set_result(result))
            assert linking.transfer(False, P, -1, 0, ends, None, extents=nums, on_loop=True)
            linking.engine.register_cache(_REGISTRATION, is_blocks=False, handles=[BufferHandle(bytearray(8192))],
                                          worker_addrs=[0x40000])
            assert await asyncio.wait_for(ended, 10) == (58, "tcp") and dst[8:58] == src[100:150]
            assert await quick((0x30000, 0x10000, 8), False) == (False, None)   # no local registration there
            assert await quick(tuple(x for _ in range(17) for x in (0x20000, 0x10000, 8)), False) == (False, None)

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
    """Where a copy stops once: in an executor thread reading unmapped memory block by block, the engine's read
    lock held -- between the read view's check and the end of its copy (``readview.read``)."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self.armed = False
        self.paused, self.go = threading.Event(), threading.Event()

    def here(self) -> None:
        if self.armed and self.lock.locked() and threading.current_thread() is not threading.main_thread():
            self.armed = False
            self.paused.set()
            self.go.wait(10)


class _UnmappedMemory(BufferHandle):
    """Worker memory handed to the daemon that it does not map (as a raw handle or device memory: a fake injected
    by registration): read block by block with ``read_into``, which can stop a copy."""

    def __init__(self, buf: bytearray, pause: _Pause) -> None:
        super().__init__(buf)
        self.pause = pause

    def view(self) -> memoryview | None:
        return None

    def read_into(self, offset: int, dst: memoryview) -> None:
        self.pause.here()
        super().read_into(offset, dst)


def test_a_deregistration_racing_a_read_waits_for_its_copy_and_a_later_read_is_refused() -> None:
    """Memory the daemon does not map is copied by the view in an executor thread, the read lock held: the event
    loop's unregister blocks in ``Engine._free`` until the copy is done, so the bytes are the old ones though the
    worker overwrites its memory the moment the cache is gone; a read after it is refused: LLM_KV_CACHE_NOT_EXIST."""
    async def main() -> None:
        async with Pair() as pair:
            serving, linking = pair.links
            await pair.link()
            _, dst = pair.caches()
            pause = _Pause(serving.engine.read_lock)
            bufs = [bytearray(bytes([t + 1]) * (BLOCKS * BLOCK)) for t in range(2)]
            desc = CacheDesc(2, (BLOCKS, BLOCK), DType.DT_UINT8, Placement.DEVICE)
            registered = serving.engine.register_cache(desc, is_blocks=True,
                                                       handles=[_UnmappedMemory(b, pause) for b in bufs],
                                                       blocks_key=BlocksKeyRef(P, 0), remote_accessible=True)
            await _warm(pair, dst)   # the key now names the registered cache; the view is published
            view = serving.engine.read_view
            assert isinstance(view, readview.ReadView) and not view.blocks[0].mapped
            pause.armed = True
            try:
                ended: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                start_pull(linking, _order(P, dst, [5], [5]), ended.set_result)
                assert await asyncio.get_running_loop().run_in_executor(None, pause.paused.wait, 10)
                threading.Timer(0.3, pause.go.set).start()
                started = time.monotonic()
                serving.engine.unregister_cache(int(registered.cache_id))   # blocks until the copy is done
                waited = time.monotonic() - started
                for buf in bufs:                                  # the worker reuses its memory at once
                    buf[:] = b"\xee" * len(buf)
                assert await asyncio.wait_for(ended, 10) == (2 * BLOCK, "tcp")
            finally:
                pause.go.set()
            assert waited >= 0.2
            now = serving.engine.read_view   # republished without the cache (the old one's views released) before
            assert isinstance(now, readview.ReadView) and now is not view and 0 not in now.blocks   # the memory went
            for t, tensor in enumerate(_bytes(pair.ds, dst)):
                assert (tensor[5] == t + 1).all()          # the registered cache's bytes, never 0xEE
            with pytest.raises(DataDistError) as info:
                await pulled(linking, _order(P, dst, [6], [6]))
            assert info.value.code == S.LLM_KV_CACHE_NOT_EXIST
            for tensor in _bytes(pair.ds, dst):
                assert (tensor[6] == 0).all()

    asyncio.run(main())


def test_deallocations_racing_reader_thread_reads_never_give_another_caches_bytes() -> None:
    """Pulls of model 0 in flight (answered by the owner's reader threads, straight from the memory) while the
    event loop deallocates its cache and allocates another from the same pool -- its memory, likely -- filled with
    another pattern and bound to model 1: every pull ends with model 0's bytes or LLM_KV_CACHE_NOT_EXIST, never
    the other cache's."""
    async def main() -> None:
        async with Pair() as pair:
            serving, linking = pair.links
            await pair.link()
            src, dst = pair.caches()
            engine = serving.engine
            desc = CacheDesc(2, (BLOCKS, BLOCK), DType.DT_UINT8, Placement.DEVICE)
            await _warm(pair, dst)
            outcomes = {"bytes": 0, "refused": 0}
            for round_ in range(30):
                ends: list[asyncio.Future[Any]] = []
                for i in range(8):
                    ended: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                    start_pull(linking, _order(P, dst, [i % BLOCKS], [i % BLOCKS]), ended.set_result)
                    ends.append(ended)
                await asyncio.sleep(0)
                engine.deallocate_cache(src, is_blocks=True)
                other = engine.allocate_cache(desc, is_blocks=True, blocks_key=BlocksKeyRef(P, 1))
                _fill(pair.ps, int(other.cache_id), 0xB2)
                for ended in ends:
                    result = await asyncio.wait_for(ended, 10)
                    if isinstance(result, DataDistError):
                        assert result.code == S.LLM_KV_CACHE_NOT_EXIST, result
                        outcomes["refused"] += 1
                    else:
                        assert result == (2 * BLOCK, "tcp")
                        outcomes["bytes"] += 1
                    for t, tensor in enumerate(_bytes(pair.ds, dst)):
                        assert not (tensor == 0xB2).any(), (round_, t)
                engine.deallocate_cache(int(other.cache_id), is_blocks=True)
                fresh = engine.allocate_cache(desc, is_blocks=True, blocks_key=BlocksKeyRef(P, 0))
                src = int(fresh.cache_id)
                for t, seg in enumerate(tensors_of(fresh)):
                    seg.handle.write_from(seg.offset, memoryview(np.full(seg.length, t + 1, np.uint8)).cast("B"))
                await pulled(linking, _order(P, dst, [0], [0]))   # the view republished for the next round
            assert outcomes["bytes"] + outcomes["refused"] == 30 * 8

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


_CID = 1 << 40   # command ids of hand-made frames: far from the link's own


def _frame(spec: RemoteSpec, cid: int, **fields: int) -> bytes:
    """The inline READ frame of ``spec`` (``ownerwire.encode_call``), fields of its fixed part overwritten by
    name (a hostile peer's frame), or ``blocks_field`` naming more blocks than the frame holds."""
    frame = bytearray(ownerwire.encode_call(ReadCmd(cid, 0, spec, 5000, inline=True)))
    names = ("tag", "op", "flags", "timeout", "cid", "tid", "kind", "r1", "r2", "a", "b", "c", "d", "mode", "r3",
             "blocks_field", "size", "offset", "tensor_start", "tensor_count", "expected")
    values = list(ownerwire.READ.unpack_from(frame))
    for name, value in fields.items():
        values[names.index(name)] = value
    ownerwire.READ.pack_into(frame, 0, *values)
    return bytes(frame)


async def _answer(link: Any, frame: bytes, cid: int) -> tuple[int, str, bytes, bool]:
    """What the owner answered ``frame`` with: (status, message, data, release_needed)."""
    ended: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    # the link's reply matching delivers it: (deadline, answer(result, ctx), land, ctx, expected bytes)
    link.calls._pending[cid] = (time.monotonic() + 10, lambda result, done: done(result), None, ended.set_result, 0)
    await asyncio.get_running_loop().run_in_executor(None, link.channel.send_control, CONTROL_CALL, frame,
                                                     time.monotonic() + 5)
    result = await asyncio.wait_for(ended, 10)
    if isinstance(result, DataDistError):
        return int(result.code), result.message, b"", False
    return result.status, result.message, bytes(result.data), result.release_needed


_K = BlocksKeyRef(P, 0)
_GOOD = {   # request -> (spec, frame fields): answered with bytes
    "one block": (RemoteSpec(_K, ReadMode.BLOCKS, (1,), expected_bytes=2 * BLOCK), {}),
    "first and last": (RemoteSpec(_K, ReadMode.BLOCKS, (0, BLOCKS - 1), expected_bytes=4 * BLOCK), {}),
    "a block twice": (RemoteSpec(_K, ReadMode.BLOCKS, (3, 3, 2), expected_bytes=6 * BLOCK), {}),
    "one tensor": (RemoteSpec(_K, ReadMode.BLOCKS, (4,), tensor_start=1, tensor_count=1, expected_bytes=BLOCK), {}),
    "no blocks": (RemoteSpec(_K, ReadMode.BLOCKS, (), expected_bytes=0), {}),
    "64 blocks": (RemoteSpec(_K, ReadMode.BLOCKS, tuple(i % BLOCKS for i in range(64)),
                             expected_bytes=2 * 64 * BLOCK), {}),
    "65 blocks": (RemoteSpec(_K, ReadMode.BLOCKS, tuple(i % BLOCKS for i in range(65)),
                             expected_bytes=2 * 65 * BLOCK), {}),
    "a transfer id": (RemoteSpec(_K, ReadMode.BLOCKS, (2,), expected_bytes=2 * BLOCK), {"tid": 9}),
}
#: bytes of the good requests the reader threads answer (more blocks than ``ownerwire.SMALL_READ_BLOCKS``, and a
#: transfer id set, take the general path)
_BY_VIEW = sum(s.expected_bytes for n, (s, _) in _GOOD.items() if n not in ("65 blocks", "a transfer id"))
_BAD = {   # request -> (spec, frame fields, status): refused
    "key field b set": (RemoteSpec(_K, ReadMode.BLOCKS, (2,), expected_bytes=2 * BLOCK), {"b": 5},
                        S.LLM_PARAM_INVALID),
    "block out of range": (RemoteSpec(_K, ReadMode.BLOCKS, (BLOCKS,), expected_bytes=2 * BLOCK), {},
                           S.LLM_PARAM_INVALID),
    "block 2**64-1": (RemoteSpec(_K, ReadMode.BLOCKS, ((1 << 64) - 1,), expected_bytes=2 * BLOCK), {},
                      S.LLM_PARAM_INVALID),
    "wrong byte count": (RemoteSpec(_K, ReadMode.BLOCKS, (1,), expected_bytes=2 * BLOCK + 1), {},
                         S.LLM_PARAM_INVALID),
    "huge byte count": (RemoteSpec(_K, ReadMode.BLOCKS, (1,), expected_bytes=(1 << 63) - 1), {},
                        S.LLM_PARAM_INVALID),
    "past the inline limit": (RemoteSpec(_K, ReadMode.BLOCKS, (1,), expected_bytes=INLINE_READ_MAX + 2 * BLOCK),
                              {}, S.LLM_PARAM_INVALID),
    "unknown model": (RemoteSpec(BlocksKeyRef(P, 7), ReadMode.BLOCKS, (1,), expected_bytes=2 * BLOCK), {},
                      S.LLM_KV_CACHE_NOT_EXIST),
    "not remotely accessible": (RemoteSpec(BlocksKeyRef(P, 3), ReadMode.BLOCKS, (1,), expected_bytes=2 * BLOCK),
                                {}, S.LLM_KV_CACHE_NOT_EXIST),
    "tensor range": (RemoteSpec(_K, ReadMode.BLOCKS, (1,), tensor_start=1, tensor_count=2,
                                expected_bytes=2 * BLOCK), {}, S.LLM_PARAM_INVALID),
    "tensor start past the end": (RemoteSpec(_K, ReadMode.BLOCKS, (1,), tensor_start=2, expected_bytes=0), {},
                                  S.LLM_PARAM_INVALID),
    "a key of another cluster": (RemoteSpec(BlocksKeyRef(D, 0), ReadMode.BLOCKS, (1,), expected_bytes=2 * BLOCK),
                                 {}, S.LLM_KV_CACHE_NOT_EXIST),
    "slot mode": (RemoteSpec(_K, ReadMode.SLOT, (), expected_bytes=2 * BLOCK), {}, S.LLM_PARAM_INVALID),
    "a CacheKey": (RemoteSpec(CacheKeyRef(P, 5, 0, 0), ReadMode.SLOT, (), expected_bytes=2 * BLOCK), {},
                   S.LLM_KV_CACHE_NOT_EXIST),
    "key reserved bits": (RemoteSpec(_K, ReadMode.BLOCKS, (1,), expected_bytes=2 * BLOCK), {"r1": 1},
                          S.LLM_PARAM_INVALID),
    "spec reserved bits": (RemoteSpec(_K, ReadMode.BLOCKS, (1,), expected_bytes=2 * BLOCK), {"r3": 0x80},
                           S.LLM_PARAM_INVALID),
    "unknown flag": (RemoteSpec(_K, ReadMode.BLOCKS, (1,), expected_bytes=2 * BLOCK), {"flags": 3},
                     S.LLM_PARAM_INVALID),
    "unknown mode": (RemoteSpec(_K, ReadMode.BLOCKS, (1,), expected_bytes=2 * BLOCK), {"mode": 9},
                     S.LLM_PARAM_INVALID),
    "a block count past the frame": (RemoteSpec(_K, ReadMode.BLOCKS, (1, 2), expected_bytes=4 * BLOCK),
                                     {"blocks_field": 3}, S.LLM_PARAM_INVALID),
    "a block count short of the frame": (RemoteSpec(_K, ReadMode.BLOCKS, (1, 2), expected_bytes=4 * BLOCK),
                                         {"blocks_field": 1}, S.LLM_PARAM_INVALID),
}


def test_the_view_and_the_general_path_answer_every_request_alike() -> None:
    """Each request of a table -- good ones, and refusals a hostile peer can send: out of range, huge counts, a
    key of another cluster, caches it may not read, reserved bits, a block count the frame does not hold --
    answered by an owner whose small reads go by the published view (the default) and by one that publishes no
    view (``general_reads_only``: the general path only): the same status, message and bytes. The view answered
    the good ones from the reader threads, and none of the bad ones."""
    async def answers(by_view: bool) -> tuple[dict[str, tuple[int, str, bytes, bool]], int]:
        async with Pair() as pair:
            serving, linking = pair.links
            if not by_view:
                general_reads_only(serving)
            await pair.link()
            _, dst = pair.caches()
            hidden = CacheDesc(2, (BLOCKS, BLOCK), DType.DT_UINT8, Placement.HOST)
            serving.engine.register_cache(hidden, is_blocks=True, blocks_key=BlocksKeyRef(P, 3),
                                          handles=[BufferHandle(bytearray(BLOCKS * BLOCK)) for _ in range(2)],
                                          remote_accessible=False)
            await pulled(linking, _order(P, dst, [0], [0]))   # the view is published (when there is one)
            link = linking.table.links[P]
            out: dict[str, tuple[int, str, bytes, bool]] = {}
            # that pull's bytes, counted after its reply went (by the view: 1 block of 2 tensors), before ours
            before = _reads(serving, 2 * BLOCK if by_view else 0)
            for n, (name, (spec, fields)) in enumerate(_GOOD.items()):
                out[name] = await _answer(link, _frame(spec, _CID + n, **fields), _CID + n)
            good = _reads(serving, before + (_BY_VIEW if by_view else 0)) - before
            for n, (name, (spec, fields, _)) in enumerate(_BAD.items()):
                out[name] = await _answer(link, _frame(spec, _CID + 100 + n, **fields), _CID + 100 + n)
            assert _reads(serving) - before == good   # no refusal is ever the view's
            return out, good

    async def main() -> None:
        by_view, fast = await answers(True)
        general, slow = await answers(False)
        assert by_view == general
        assert (fast, slow) == (_BY_VIEW, 0)
        for name, (spec, _) in _GOOD.items():
            status, _, data, release = general[name]
            assert (status, len(data), release) == (S.LLM_SUCCESS, spec.expected_bytes, False), name
            rows = [bytes([t + 1]) * BLOCK for t in range(spec.tensor_start, spec.tensor_start +
                                                           (spec.tensor_count or 2)) for _ in spec.blocks]
            assert data == b"".join(rows), name
        for name, (_, _, code) in _BAD.items():
            assert general[name][0] == code, (name, general[name])

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


def test_a_mapping_the_view_read_by_closes_when_its_cache_goes(caplog: pytest.LogCaptureFixture) -> None:
    """The published view keeps byte views of mapped worker memory; ``Engine._free`` drops and releases them
    before the memory goes, so the worker's mapping closes at once (not left to the garbage collector with a
    warning) and the next read is refused."""
    async def main() -> None:
        async with Pair() as pair:
            serving, linking = pair.links
            await pair.link()
            _, dst = pair.caches()
            fds = [os.memfd_create(f"t{t}") for t in range(2)]
            for t, fd in enumerate(fds):
                os.write(fd, bytes([t + 1]) * (BLOCKS * BLOCK))
            handles = [MappedFdHandle(FdPiece(fd, 0, BLOCKS * BLOCK), 0, BLOCKS * BLOCK) for fd in fds]
            desc = CacheDesc(2, (BLOCKS, BLOCK), DType.DT_UINT8, Placement.HOST)
            registered = serving.engine.register_cache(desc, is_blocks=True, handles=handles,
                                                       blocks_key=BlocksKeyRef(P, 0), remote_accessible=True)
            await _warm(pair, dst)
            before = _reads(serving)
            await pulled(linking, _order(P, dst, [2], [2]))
            assert _reads(serving, before + 2 * BLOCK) == before + 2 * BLOCK   # read through the view's bytes
            with caplog.at_level(logging.WARNING, "datadistd.memory.imported"):
                serving.engine.unregister_cache(int(registered.cache_id))
            assert all(h._mm is None for h in handles) and not caplog.records
            with pytest.raises(DataDistError) as info:
                await pulled(linking, _order(P, dst, [3], [3]))
            assert info.value.code == S.LLM_KV_CACHE_NOT_EXIST
            for fd in fds:
                os.close(fd)

    asyncio.run(main())
