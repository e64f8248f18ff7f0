"""A small push in one owner call carrying its bytes (``WriteCmd``): answered by the owner's data reader thread when
the engine's published view settles it (``readview.write``, ``OwnerCalls._write_here``), else by the general path
(``Owner.write_small``, ``prepare_write``); the same status codes, messages and destination bytes either way for
every request, good or hostile; and never a byte in memory the peer may not write -- not a cache it may not write,
not memory a deallocate gave another cache."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from datadist.status import LLMStatusCode as S
from datadistd.core.errors import DataDistError
from datadistd.core.types import BlocksKeyRef, CacheDesc, CacheKeyRef, DType, Placement, ReadMode, RemoteSpec
from datadistd.engine import readview
from datadistd.engine.engine import tensors_of
from datadistd.links.wire import ownerwire
from datadistd.links.wire.ownercalls import INLINE_READ_MAX, OwnerReply, WriteCmd
from datadistd.memory.copy import BufferHandle
from datadistd.ops.metrics import DaemonMetrics
from tests.fakes import pulled, pushed

from .test_links import BLOCK, BLOCKS, D, P, Pair, _bytes, _order, general_reads_only
from .test_readview import _answer, _fill

pytestmark = pytest.mark.timeout(60)

_CID = 1 << 41   # command ids of hand-made frames: far from the link's own
_NAMES = ("tag", "op", "flags", "timeout", "cid", "kind", "r1", "r2", "a", "b", "c", "d", "mode", "r3",
          "blocks_field", "size", "offset", "tensor_start", "tensor_count", "expected")


def _written(serving: Any, at_least: int = 0) -> int:
    """Bytes the reader threads wrote (waiting a moment for ``at_least``: they count after the copy)."""
    limit = time.monotonic() + 5
    while True:
        n = sum(link.reader_bytes_in for link in serving.table.served.values())
        if n >= at_least or time.monotonic() > limit:
            return n
        time.sleep(0.001)


def _frame(spec: RemoteSpec, data: bytes, cid: int, **fields: int) -> bytes:
    """The WRITE frame of ``spec`` carrying ``data`` (``ownerwire.encode_call``), fields of its fixed part
    overwritten by name (a hostile peer's frame)."""
    frame = bytearray(ownerwire.encode_call(WriteCmd(cid, spec, 5000, data)))
    values = list(ownerwire.WRITE.unpack_from(frame))
    for name, value in fields.items():
        values[_NAMES.index(name)] = value
    ownerwire.WRITE.pack_into(frame, 0, *values)
    return bytes(frame)


def _pattern(n: int, nbytes: int) -> bytes:
    return bytes((n * 7 + i) % 251 + 1 for i in range(nbytes))


def test_the_wire_carries_a_write_and_refuses_one_whose_bytes_are_not_its_spec() -> None:
    spec = RemoteSpec(BlocksKeyRef(P, 4), ReadMode.BLOCKS, (3, 1), expected_bytes=4 * BLOCK)
    cmd = WriteCmd(9, spec, 700, _pattern(1, 4 * BLOCK))
    frame = ownerwire.encode_call(cmd)
    assert ownerwire.decode_call(frame) == cmd
    reply = ownerwire.encode_reply(OwnerReply(9, nbytes=4 * BLOCK))
    assert ownerwire.small_call(frame, P) == (True, 9, 4, 0, 0, (3, 1), 4 * BLOCK, ownerwire.WRITE.size + 16, reply)
    assert ownerwire.small_call(frame, D) is None   # another cluster's key: the general path refuses it
    for bad in (frame[:-1], frame + b"\0", _frame(spec, cmd.data, 9, expected=INLINE_READ_MAX + 1)):
        assert ownerwire.small_call(bad, P) is None
        with pytest.raises(DataDistError) as info:
            ownerwire.decode_call(bad)
        assert info.value.code == S.LLM_PARAM_INVALID and getattr(info.value, "command_id", None) == 9


def test_a_small_push_is_one_call_written_by_the_reader_thread_byte_exact() -> None:
    """``push`` of a few blocks: one WRITE, written by the owner's reader thread (its loop counted no bytes, no
    transfer was opened), counted in ``serve_write`` and the link's bytes received; the bytes exact, nothing pinned."""
    async def main() -> None:
        async with Pair() as pair:
            serving, linking = pair.links
            pair.p.metrics = metrics = DaemonMetrics()
            await pair.link()
            src, dst = pair.caches()
            _fill(pair.ds, dst, 0x5A)
            await pushed(linking, _order(P, dst, [0], [0]))    # the first by the loop, which publishes the view
            assert readview.current(serving.engine)
            counted = metrics.bound("serve_write", str(P), str(D))
            nbytes, before = counted.nbytes, _written(serving)
            link = next(iter(serving.table.served.values()))
            loop_in = link.bytes_in
            for _ in range(3):
                await pushed(linking, _order(P, dst, [2, 6], [1, 4]))
            assert _written(serving, before + 3 * 4 * BLOCK) == before + 3 * 4 * BLOCK
            assert link.bytes_in == loop_in   # no transfer committed (that counts here): the reader thread wrote
            assert link.bytes_received == link.bytes_in + link.reader_bytes_in
            assert counted.nbytes - nbytes == 3 * 4 * BLOCK
            for t, tensor in enumerate(_bytes(pair.ps, src)):
                assert (tensor[[0, 2, 6]] == 0x5A).all() and (tensor[[1, 3, 4, 5, 7]] == t + 1).all()
            assert serving.engine.entry(src).pins == 0 and linking.table.engine.entry(dst).pins == 0

    asyncio.run(main())


def test_a_push_past_the_inline_limit_still_opens_sends_and_commits() -> None:
    async def main() -> None:
        async with Pair() as pair:
            serving, linking = pair.links
            await pair.link()
            big = CacheDesc(2, (BLOCKS, 16 << 10), DType.DT_UINT8, Placement.DEVICE)
            src = serving.engine.allocate_cache(big, is_blocks=True, blocks_key=BlocksKeyRef(P, 0))
            dst = linking.table.engine.allocate_cache(big, is_blocks=True, blocks_key=BlocksKeyRef(D, 0))
            _fill(pair.ds, int(dst.cache_id), 0x33)
            link = next(iter(serving.table.served.values()))
            await pushed(linking, _order(P, int(dst.cache_id), [1, 2, 3], [1, 2, 3]))   # 96 KiB
            assert link.bytes_in == 3 * 2 * (16 << 10) and link.reader_bytes_in == 0
            for seg in tensors_of(src):
                got = np.zeros(seg.length, np.uint8)
                seg.handle.read_into(seg.offset, memoryview(got).cast("B"))
                rows = got.reshape(BLOCKS, 16 << 10)
                assert (rows[1:4] == 0x33).all() and not rows[[0, 4, 5, 6, 7]].any()

    asyncio.run(main())


_K = BlocksKeyRef(P, 0)
_GOOD = {   # request -> (spec, frame fields): written
    "one block": (RemoteSpec(_K, ReadMode.BLOCKS, (1,), expected_bytes=2 * BLOCK), {}),
    "first and last": (RemoteSpec(_K, ReadMode.BLOCKS, (0, BLOCKS - 1), expected_bytes=4 * BLOCK), {}),
    "a block twice": (RemoteSpec(_K, ReadMode.BLOCKS, (3, 3, 2), expected_bytes=6 * BLOCK), {}),
    "one tensor": (RemoteSpec(_K, ReadMode.BLOCKS, (4,), tensor_start=1, tensor_count=1, expected_bytes=BLOCK), {}),
    "no blocks": (RemoteSpec(_K, ReadMode.BLOCKS, (), expected_bytes=0), {}),
    "64 blocks": (RemoteSpec(_K, ReadMode.BLOCKS, tuple((i * 3) % BLOCKS for i in range(64)),
                             expected_bytes=2 * 64 * BLOCK), {}),
    "65 blocks": (RemoteSpec(_K, ReadMode.BLOCKS, tuple((i * 5) % BLOCKS for i in range(65)),
                             expected_bytes=2 * 65 * BLOCK), {}),
}
#: bytes of the good requests the reader threads write (more blocks than ``ownerwire.SMALL_READ_BLOCKS`` take the
#: general path)
_BY_VIEW = sum(s.expected_bytes for n, (s, _) in _GOOD.items() if n != "65 blocks")
_ONE = RemoteSpec(_K, ReadMode.BLOCKS, (1,), expected_bytes=2 * BLOCK)
_BAD: dict[str, tuple[RemoteSpec, dict[str, int], int, S]] = {   # -> (spec, frame fields, bytes carried, status)
    "key field b set": (RemoteSpec(_K, ReadMode.BLOCKS, (5,), expected_bytes=2 * BLOCK), {"b": 5}, 2 * BLOCK,
                        S.LLM_PARAM_INVALID),
    "block out of range": (RemoteSpec(_K, ReadMode.BLOCKS, (BLOCKS,), expected_bytes=2 * BLOCK), {}, 2 * BLOCK,
                           S.LLM_PARAM_INVALID),
    "block 2**64-1": (RemoteSpec(_K, ReadMode.BLOCKS, ((1 << 64) - 1,), expected_bytes=2 * BLOCK), {}, 2 * BLOCK,
                      S.LLM_PARAM_INVALID),
    "a byte count the blocks do not hold": (RemoteSpec(_K, ReadMode.BLOCKS, (1,), expected_bytes=2 * BLOCK + 1),
                                            {}, 2 * BLOCK + 1, S.LLM_PARAM_INVALID),
    "fewer bytes carried than the spec's": (_ONE, {}, 2 * BLOCK - 1, S.LLM_PARAM_INVALID),
    "more bytes carried than the spec's": (_ONE, {}, 2 * BLOCK + 1, S.LLM_PARAM_INVALID),
    "huge byte count": (_ONE, {"expected": (1 << 63) - 1}, 2 * BLOCK, S.LLM_PARAM_INVALID),
    "past the inline limit": (RemoteSpec(_K, ReadMode.BLOCKS, (1,), expected_bytes=INLINE_READ_MAX + 2 * BLOCK),
                              {}, INLINE_READ_MAX + 2 * BLOCK, S.LLM_PARAM_INVALID),
    "unknown model": (RemoteSpec(BlocksKeyRef(P, 7), ReadMode.BLOCKS, (1,), expected_bytes=2 * BLOCK), {},
                      2 * BLOCK, S.LLM_KV_CACHE_NOT_EXIST),
    "not remotely accessible": (RemoteSpec(BlocksKeyRef(P, 3), ReadMode.BLOCKS, (1,), expected_bytes=2 * BLOCK),
                                {}, 2 * BLOCK, S.LLM_KV_CACHE_NOT_EXIST),
    "tensor range": (RemoteSpec(_K, ReadMode.BLOCKS, (1,), tensor_start=1, tensor_count=2,
                                expected_bytes=2 * BLOCK), {}, 2 * BLOCK, S.LLM_PARAM_INVALID),
    "a key of another cluster": (RemoteSpec(BlocksKeyRef(D, 0), ReadMode.BLOCKS, (1,), expected_bytes=2 * BLOCK),
                                 {}, 2 * BLOCK, S.LLM_KV_CACHE_NOT_EXIST),
    "slot mode": (RemoteSpec(_K, ReadMode.SLOT, (), expected_bytes=2 * BLOCK), {}, 2 * BLOCK, S.LLM_PARAM_INVALID),
    "a CacheKey": (RemoteSpec(CacheKeyRef(P, 5, 0, 0), ReadMode.SLOT, (), expected_bytes=2 * BLOCK), {},
                   2 * BLOCK, S.LLM_KV_CACHE_NOT_EXIST),
    "key reserved bits": (_ONE, {"r1": 1}, 2 * BLOCK, S.LLM_PARAM_INVALID),
    "spec reserved bits": (_ONE, {"r3": 0x80}, 2 * BLOCK, S.LLM_PARAM_INVALID),
    "a flag": (_ONE, {"flags": 1}, 2 * BLOCK, S.LLM_PARAM_INVALID),
    "unknown mode": (_ONE, {"mode": 9}, 2 * BLOCK, S.LLM_PARAM_INVALID),
    "a block count past the frame": (RemoteSpec(_K, ReadMode.BLOCKS, (1, 2), expected_bytes=4 * BLOCK),
                                     {"blocks_field": 3}, 4 * BLOCK, S.LLM_PARAM_INVALID),
    "a block count short of the frame": (RemoteSpec(_K, ReadMode.BLOCKS, (1, 2), expected_bytes=4 * BLOCK),
                                         {"blocks_field": 1}, 4 * BLOCK, S.LLM_PARAM_INVALID),
}


def _expected_rows() -> list[np.ndarray]:
    """The serving cache after the good writes (in table order) over its pattern (tensor t: t + 1)."""
    rows = [np.full((BLOCKS, BLOCK), t + 1, np.uint8) for t in range(2)]
    for n, (spec, _) in enumerate(_GOOD.values()):
        data = np.frombuffer(_pattern(n, spec.expected_bytes), np.uint8)
        at = 0
        for t in range(spec.tensor_start, spec.tensor_start + (spec.tensor_count or 2)):
            for b in spec.blocks:
                rows[t][b] = data[at:at + BLOCK]
                at += BLOCK
    return rows


def test_the_view_and_the_general_path_answer_every_write_alike() -> None:
    """Each write of a table -- good ones, and refusals a hostile peer can send: out of range, a byte count the
    blocks do not hold, bytes carried that are not the spec's, a key of another cluster, caches it may not write,
    reserved bits, a block count the frame does not hold -- answered by an owner whose small writes go by the
    published view (the default) and by one that publishes none (``general_reads_only``: the general path only):
    the same status and message, and the same bytes in the destination (the good writes', nothing of the bad
    ones'). The view wrote the good ones from the reader threads, and none of the bad ones."""
    async def answers(by_view: bool) -> tuple[dict[str, tuple[int, str]], int, list[np.ndarray]]:
        async with Pair() as pair:
            serving, linking = pair.links
            if not by_view:
                general_reads_only(serving)
            await pair.link()
            src, dst = pair.caches()
            hidden = CacheDesc(2, (BLOCKS, BLOCK), DType.DT_UINT8, Placement.HOST)
            hidden_bufs = [bytearray(BLOCKS * BLOCK) for _ in range(2)]
            serving.engine.register_cache(hidden, is_blocks=True, blocks_key=BlocksKeyRef(P, 3),
                                          handles=[BufferHandle(b) for b in hidden_bufs], remote_accessible=False)
            await pulled(linking, _order(P, dst, [0], [0]))   # the view is published (when there is one)
            link = linking.table.links[P]
            out: dict[str, tuple[int, str]] = {}
            before = _written(serving)
            for n, (name, (spec, fields)) in enumerate(_GOOD.items()):
                out[name] = (await _answer(link, _frame(spec, _pattern(n, spec.expected_bytes), _CID + n, **fields),
                                           _CID + n))[:2]
            good = _written(serving, before + (_BY_VIEW if by_view else 0)) - before
            for n, (name, (spec, fields, carried, _)) in enumerate(_BAD.items()):
                cid = _CID + 100 + n
                out[name] = (await _answer(link, _frame(spec, b"\xee" * carried, cid, **fields), cid))[:2]
            assert _written(serving) - before == good   # no refusal is ever the view's
            assert not any(any(b) for b in hidden_bufs)   # the cache the peer may not write: untouched
            assert serving.engine.entry(src).pins == 0
            return out, good, _bytes(pair.ps, src)

    async def main() -> None:
        by_view, fast, rows_view = await answers(True)
        general, slow, rows_general = await answers(False)
        assert by_view == general
        assert (fast, slow) == (_BY_VIEW, 0)
        want = _expected_rows()
        for t in range(2):
            np.testing.assert_array_equal(rows_view[t], want[t])
            np.testing.assert_array_equal(rows_general[t], want[t])
        for name in _GOOD:
            assert general[name] == (S.LLM_SUCCESS, ""), (name, general[name])
        for name, (_, _, _, code) in _BAD.items():
            assert general[name][0] == code, (name, general[name])

    asyncio.run(main())


def test_deallocations_racing_reader_thread_writes_never_land_in_another_caches_memory() -> None:
    """Pushes into model 0 in flight (written by the owner's reader threads) while the event loop deallocates its
    cache and allocates another from the same pool -- its memory, likely -- filled with another pattern and bound
    to model 1: every push succeeds or ends LLM_KV_CACHE_NOT_EXIST, and the other cache keeps its bytes."""
    async def main() -> None:
        async with Pair() as pair:
            serving, linking = pair.links
            await pair.link()
            src, dst = pair.caches()
            _fill(pair.ds, dst, 0x5A)
            engine = serving.engine
            desc = CacheDesc(2, (BLOCKS, BLOCK), DType.DT_UINT8, Placement.DEVICE)
            await pushed(linking, _order(P, dst, [0], [0]))
            outcomes = {"written": 0, "refused": 0}
            for _ in range(30):
                pushes = [asyncio.ensure_future(pushed(linking, _order(P, dst, [i % BLOCKS], [i % BLOCKS])))
                          for i in range(8)]
                await asyncio.sleep(0)
                engine.deallocate_cache(src, is_blocks=True)
                other = engine.allocate_cache(desc, is_blocks=True, blocks_key=BlocksKeyRef(P, 1))
                _fill(pair.ps, int(other.cache_id), 0xB2)
                for result in await asyncio.gather(*pushes, return_exceptions=True):
                    if isinstance(result, DataDistError):
                        assert result.code == S.LLM_KV_CACHE_NOT_EXIST, result
                        outcomes["refused"] += 1
                    else:
                        assert not isinstance(result, BaseException), result
                        outcomes["written"] += 1
                for tensor in _bytes(pair.ps, int(other.cache_id)):
                    assert (tensor == 0xB2).all()
                engine.deallocate_cache(int(other.cache_id), is_blocks=True)
                src = int(engine.allocate_cache(desc, is_blocks=True, blocks_key=BlocksKeyRef(P, 0)).cache_id)
                await pushed(linking, _order(P, dst, [0], [0]))   # the view republished for the next round
            assert outcomes["written"] + outcomes["refused"] == 30 * 8

    asyncio.run(main())


def test_a_key_re_pointed_to_a_cache_the_peer_may_not_write_is_not_written_by_the_reader_thread() -> None:
    """Blocks key model 0 re-pointed (register, overwrite) to a cache that is not remotely accessible, the old cache
    still allocated: the registry's generation moves, so the reader thread's view is stale and writes nothing --
    neither into the old cache (no longer the key's) nor the new one; the loop refuses: LLM_KV_CACHE_NOT_EXIST."""
    async def main() -> None:
        async with Pair() as pair:
            serving, linking = pair.links
            await pair.link()
            src, dst = pair.caches()
            _fill(pair.ds, dst, 0x5A)
            await pushed(linking, _order(P, dst, [0], [0]))
            assert readview.current(serving.engine)
            desc = CacheDesc(2, (BLOCKS, BLOCK), DType.DT_UINT8, Placement.HOST)
            bufs = [bytearray(BLOCKS * BLOCK) for _ in range(2)]
            serving.engine.register_cache(desc, is_blocks=True, handles=[BufferHandle(b) for b in bufs],
                                          blocks_key=BlocksKeyRef(P, 0), remote_accessible=False)
            written = _written(serving)
            with pytest.raises(DataDistError) as info:
                await pushed(linking, _order(P, dst, [2], [2]))
            assert info.value.code == S.LLM_KV_CACHE_NOT_EXIST
            assert _written(serving) == written and not any(any(b) for b in bufs)
            for t, tensor in enumerate(_bytes(pair.ps, src)):
                assert (tensor[2] == t + 1).all()   # the old cache: not the key's any more, untouched

    asyncio.run(main())
