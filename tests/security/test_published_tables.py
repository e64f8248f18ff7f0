"""Pulls over nixl read the table the owner published to the link: the legitimate use
beside the abuse.

In process (``tests/unit/test_links.py``'s ``Pair`` with ``[transport] name = "nixl"``: two nodes, real NIXL
agents over UCX on loopback): the owner publishes each remotely accessible cache to the link once; a pull is one
READ by the puller and no owner call (a CacheKey pull: one, the RELEASE that consumes the key). The other end reads
rows outside the entry, caches not remotely accessible or of another engine, a withdrawn handle, a deallocated
cache whose pages another cache took, and after the unlink.
"""

from __future__ import annotations

import asyncio
import os
import time

os.environ.setdefault("UCX_TLS", "tcp")
os.environ.setdefault("UCX_NET_DEVICES", "lo")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from datadist.status import LLMStatusCode as S  # noqa: E402
from datadistd.core.errors import DataDistError  # noqa: E402
from datadistd.core.plan import TransferKind, TransferOrder  # noqa: E402
from datadistd.core.types import (  # noqa: E402
    BlocksKeyRef,
    CacheDesc,
    CacheKeyRef,  # noqa: E402
    DType,
    Placement,
    ReadMode,
    RemoteSpec,
    Role,
)
from datadistd.engine.engine import tensors_of  # noqa: E402
from datadistd.links import ClusterSpec, LinkManager  # noqa: E402
from datadistd.links.wire import ownerwire  # noqa: E402
from datadistd.memory.base import Segment  # noqa: E402
from datadistd.node.node import Node  # noqa: E402
from datadistd.ops.config import Config  # noqa: E402
from datadistd.transport.base import CONTROL_CALL, Channel  # noqa: E402
from tests.fakes import ArrayHandle, pulled, worker_session  # noqa: E402
from tests.unit.test_links import BLOCK, BLOCKS, POOL, Pair, _bytes, _order, _until  # noqa: E402
from tests.unit.test_transport_nixl import needs_nixl  # noqa: E402

pytestmark = [pytest.mark.timeout(120), needs_nixl]

P, D = 1, 2
NIXL = {"transport.name": "nixl", "transport.nixl_fabric_trusted": True}


class NixlPair(Pair):
    async def __aenter__(self) -> "NixlPair":
        self.p = Node(Config().with_overrides({"peer.secret": self.secrets[0], **NIXL}))
        self.d = Node(Config().with_overrides({"peer.secret": self.secrets[1], **NIXL}),
                      peer_connector=self._connect)
        opts = {"llm.MemPoolConfig": POOL, "llm.EnableRemoteCacheAccessible": "1"}
        self.ps = await self.p.init_engine(P, Role.PROMPT, opts, worker_session(self.p))
        self.ds = await self.d.init_engine(D, Role.DECODER, opts, worker_session(self.d))
        return self


def _spec(blocks: tuple[int, ...], cluster: int = P, nbytes: int | None = None) -> RemoteSpec:
    """Blocks of both tensors of ``cluster``'s model-0 cache."""
    return RemoteSpec(BlocksKeyRef(cluster, 0), ReadMode.BLOCKS, blocks, -1, 0, 0, 0,
                      2 * BLOCK * len(blocks) if nbytes is None else nbytes)


def _channel(pair: NixlPair) -> Channel:
    table = pair.ds.links.table
    (link,) = table.links.values()
    channel = table.channel_of(link)
    assert channel is not None
    return channel


def _read(pair: NixlPair, channel: Channel, handle: int, dst: int, blocks: list[int], seconds: float = 5.0) -> None:
    """The puller's READ of blocks of both tensors of published ``handle`` into the same blocks of its ``dst``,
    straight by the transport: what a peer that skips every check of its own daemon can do."""
    published = pair.ds.links.table.published
    assert published is not None
    entry = pair.ds.engine.entry(dst)
    segs = [Segment(seg.handle, seg.offset + b * BLOCK, BLOCK) for seg in tensors_of(entry) for b in blocks]
    spans = np.array([(t, b * BLOCK, BLOCK) for t in range(2) for b in blocks], dtype=np.int64)
    published.tables.read_rows(channel, handle, spans, segs, time.monotonic() + seconds)


class Calls:
    """The owner calls ``links`` answers (CALL frames of the other end, by type), heartbeat pings left out."""

    def __init__(self, links: LinkManager) -> None:
        self.seen: list[str] = []
        real = links.calls._on_control

        def on_control(link: object, kind: int, payload: bytes, *rest: object) -> None:
            if kind == CONTROL_CALL:
                name = type(ownerwire.decode_call(payload)).__name__
                if name != "PingCmd":
                    self.seen.append(name)
            real(link, kind, payload, *rest)   # type: ignore[arg-type]

        links.calls._on_control = on_control   # type: ignore[method-assign]


def _published(links: LinkManager, channel: Channel) -> dict[int, bytes]:
    published = links.table.published
    assert published is not None
    return published.tables.table_of(channel, -1)[1] or {}


async def _linked(pair: NixlPair) -> tuple[LinkManager, LinkManager, int, int, Channel]:
    """``pair`` linked, a blocks cache on each side, the prompt's published on the decoder's link."""
    assert await pair.link() == (0, [0])
    serving, linking = pair.links
    src, dst = pair.caches()
    channel = _channel(pair)
    assert await _until(lambda: _handle(serving, src) in _published(linking, channel))
    return serving, linking, src, dst, channel


def _handle(links: LinkManager, cache_id: int) -> int:
    published = links.table.published
    assert published is not None
    return published._handles[cache_id][0]


def test_a_pull_reads_the_published_table_with_no_owner_call() -> None:
    async def main() -> None:
        async with NixlPair() as pair:
            assert await pair.link() == (0, [0])
            serving, linking = pair.links
            asked_p, asked_d = Calls(serving), Calls(linking)
            src, dst = pair.caches()
            owner_t, puller_t = serving.table.transport, linking.table.transport
            assert serving.table.published is not None   # decided once, at build
            assert await _until(lambda: _handle(serving, src) in _published(linking, _channel(pair)))
            nbytes, _ = await pulled(linking, _order(P, dst, [1, 3, 6], [0, 2, 5]))
            assert nbytes == 3 * 2 * BLOCK
            got, want = _bytes(pair.ds, dst), _bytes(pair.ps, src)
            for t in range(2):
                np.testing.assert_array_equal(got[t][[0, 2, 5]], want[t][[1, 3, 6]])
            assert owner_t.bytes_sent == 0 and puller_t.bytes_received == nbytes   # one READ, by the puller
            assert asked_p.seen == []                                             # no owner call, before or after
            assert await _until(lambda: owner_t.bytes_read_by_peers == nbytes)   # told by notification
            assert pair.ps.engine.entry(src).pins == 0                            # nothing held for it
            # the other way: the serving end pulls from the linking end's table, no call either
            n2, _ = await pulled(serving, _order(D, src, [0], [7]))
            assert owner_t.bytes_received == n2 and puller_t.bytes_sent == 0
            assert _bytes(pair.ps, src)[1][7].tolist() == _bytes(pair.ds, dst)[1][0].tolist()
            assert asked_d.seen == [] and asked_p.seen == []

    asyncio.run(main())


def test_a_cache_key_pull_makes_one_owner_call_the_release_that_consumes_the_key() -> None:
    async def main() -> None:
        async with NixlPair() as pair:
            assert await pair.link() == (0, [0])
            serving, linking = pair.links
            asked = Calls(serving)
            desc = CacheDesc(2, (4, BLOCK), DType.DT_UINT8, Placement.DEVICE)
            src = pair.ps.engine.allocate_cache(desc, is_blocks=False, keys=[CacheKeyRef(P, req_id=5)])
            for seg in tensors_of(src):
                seg.handle.write_from(seg.offset, bytes([9]) * seg.length)
            dst = pair.ds.engine.allocate_cache(desc, is_blocks=False)
            order = TransferOrder(TransferKind.CACHE, CacheKeyRef(P, req_id=5), int(dst.cache_id))
            nbytes, _ = await pulled(linking, order)
            assert nbytes == 2 * BLOCK and asked.seen == ["ReleaseCmd"]
            assert bytes(tensors_of(dst)[1].handle.view()[tensors_of(dst)[1].offset:][:BLOCK]) == bytes([9]) * BLOCK
            with pytest.raises(DataDistError) as info:   # consumed: the key left the table
                await pulled(linking, order)
            assert info.value.code == S.LLM_KV_CACHE_NOT_EXIST
            assert asked.seen == ["ReleaseCmd"]

    asyncio.run(main())


def test_only_remotely_accessible_caches_of_this_engine_are_in_the_table_and_rows_stay_inside() -> None:
    async def main() -> None:
        async with NixlPair() as pair:
            serving, linking, src, dst, channel = await _linked(pair)
            assert await _until(lambda: _handle(serving, src) in _published(linking, channel))
            # a cache the owner's engine did not make remotely accessible is never published
            hidden = [ArrayHandle(BLOCKS * BLOCK, seed=3) for _ in range(2)]
            private = pair.ps.engine.register_cache(CacheDesc(2, (BLOCKS, BLOCK), DType.DT_UINT8, Placement.HOST),
                                                    is_blocks=True, handles=hidden, blocks_key=BlocksKeyRef(P, 4),
                                                    remote_accessible=False)
            assert int(private.cache_id) not in serving.table.published._handles
            refused = {
                "not remotely accessible": (_order_of(4, dst, [1]), S.LLM_KV_CACHE_NOT_EXIST),
                "block out of bounds": (_order(P, dst, [BLOCKS], [0]), S.LLM_PARAM_INVALID),
            }
            before = _bytes(pair.ds, dst)
            for what, (order, code) in refused.items():
                with pytest.raises(DataDistError) as info:
                    await pulled(linking, order)
                assert info.value.code == code, what
            # a cache of another engine of the owner's daemon (cluster 3) is not in this link's table
            other = await pair.p.init_engine(3, Role.PROMPT, {"llm.MemPoolConfig": POOL,
                                                              "llm.EnableRemoteCacheAccessible": "1"},
                                             worker_session(pair.p))
            theirs = other.engine.allocate_cache(CacheDesc(2, (BLOCKS, BLOCK), DType.DT_UINT8, Placement.DEVICE),
                                                 is_blocks=True, blocks_key=BlocksKeyRef(3, 0))
            assert other.links.table.published is not None
            their_handle = _handle(other.links, int(theirs.cache_id))
            with pytest.raises(DataDistError) as info:
                linking.table.published.resolve(channel, channel.token, P, _spec((1,), cluster=3))
            assert info.value.code == S.LLM_KV_CACHE_NOT_EXIST
            # read straight by the transport, skipping the daemon's checks: rows outside the entry, another
            # engine's handle, a handle never published
            for handle, blocks, code in ((_handle(serving, src), [BLOCKS], S.LLM_PARAM_INVALID),
                                         (their_handle, [1], S.LLM_KV_CACHE_NOT_EXIST),
                                         (_handle(serving, src) + 1000, [1], S.LLM_KV_CACHE_NOT_EXIST)):
                with pytest.raises(DataDistError) as info:
                    await asyncio.to_thread(_read, pair, channel, handle, dst, blocks)
                assert info.value.code == code
            for t in range(2):
                np.testing.assert_array_equal(_bytes(pair.ds, dst)[t], before[t])

    asyncio.run(main())


def _addresses(tensors: list[Segment]) -> list[int]:
    return [int(np.frombuffer(seg.handle.view(), np.uint8).ctypes.data) + seg.offset for seg in tensors]


def _order_of(model: int, local_cache: int, blocks: list[int]) -> TransferOrder:
    return TransferOrder(TransferKind.BLOCKS, BlocksKeyRef(P, model), local_cache, tuple(blocks), tuple(blocks))


def test_a_deallocated_cache_is_withdrawn_and_deregistered_before_another_takes_its_pages() -> None:
    async def main() -> None:
        async with NixlPair() as pair:
            serving, linking, src, dst, channel = await _linked(pair)
            old = _handle(serving, src)
            old_tensors = _addresses(tensors_of(pair.ps.engine.entry(src)))
            assert await _until(lambda: old in _published(linking, channel))
            await pulled(linking, _order(P, dst, [1], [1]))
            owner_t = serving.table.transport
            published = serving.table.published
            assert published is not None and owner_t._agent().published() == 1
            # the engine runs the withdrawal before the pages go back to the pool
            seen: list[tuple[int, int]] = []

            def watch() -> None:
                seen.append((pair.ps.engine.pool_usage()[0][2], owner_t._agent().published()))
                published.sync()

            pair.ps.engine.watch = watch
            used = pair.ps.engine.pool_usage()[0][2]
            pair.ps.engine.deallocate_cache(src, is_blocks=True)
            pair.ps.engine.watch = published.sync
            assert seen[0][0] == used and owner_t._agent().published() == 0   # withdrawn while still allocated
            assert pair.ps.engine.pool_usage()[0][2] < used
            # another cache takes the same pages, filled with what the old reader must never see
            again = pair.ps.engine.allocate_cache(CacheDesc(2, (BLOCKS, BLOCK), DType.DT_UINT8, Placement.DEVICE),
                                                  is_blocks=True, blocks_key=BlocksKeyRef(P, 7))
            assert _addresses(tensors_of(again)) == old_tensors   # the very same pages
            for seg in tensors_of(again):
                seg.handle.write_from(seg.offset, b"\xee" * seg.length)
            new = _handle(serving, int(again.cache_id))
            assert new != old
            assert await _until(lambda: old not in _published(linking, channel) and new in _published(linking, channel))
            before = _bytes(pair.ds, dst)
            with pytest.raises(DataDistError) as info:        # the old key: its cache is gone
                await pulled(linking, _order(P, dst, [2], [2]))
            assert info.value.code == S.LLM_KV_CACHE_NOT_EXIST
            with pytest.raises(DataDistError) as info:        # the old handle, read straight by the transport
                await asyncio.to_thread(_read, pair, channel, old, dst, [2, 3])
            assert info.value.code == S.LLM_KV_CACHE_NOT_EXIST
            for t in range(2):
                np.testing.assert_array_equal(_bytes(pair.ds, dst)[t], before[t])
            await pulled(linking, _order_of(7, dst, [2]))     # the new cache, by its own key: its bytes
            assert _bytes(pair.ds, dst)[0][2].tolist() == [0xEE] * BLOCK

    asyncio.run(main())


def test_after_the_unlink_nothing_is_read() -> None:
    async def main() -> None:
        async with NixlPair() as pair:
            serving, linking, src, dst, channel = await _linked(pair)
            handle = _handle(serving, src)
            assert await _until(lambda: handle in _published(linking, channel))
            await linking.unlink_clusters([ClusterSpec(P, "127.0.0.1", 1)], 3000, False)
            before = _bytes(pair.ds, dst)
            with pytest.raises(DataDistError) as info:
                await asyncio.to_thread(_read, pair, channel, handle, dst, [5, 6])
            assert info.value.code in (S.LLM_LINK_FAILED, S.LLM_KV_CACHE_NOT_EXIST)
            for t in range(2):
                np.testing.assert_array_equal(_bytes(pair.ds, dst)[t], before[t])

    asyncio.run(main())


def test_a_pull_by_raw_worker_address_reads_only_published_caches() -> None:
    """A raw address (CANN ``dst_addrs``) is resolved by the table as the owner resolves it: inside a remotely
    accessible cache's tensor, within its bounds; any other address is ``LLM_PARAM_INVALID``, the owner's code."""
    from datadistd.core.plan import AddrRef

    async def main() -> None:
        async with NixlPair() as pair:
            assert await pair.link() == (0, [0])
            serving, linking = pair.links
            desc = CacheDesc(1, (4, BLOCK), DType.DT_UINT8, Placement.HOST)
            shown, hidden = ArrayHandle(4 * BLOCK, seed=11), ArrayHandle(4 * BLOCK, seed=12)
            base, secret = 0x7000_0000, 0x9000_0000
            cache = pair.ps.engine.register_cache(desc, is_blocks=False, handles=[shown], remote_accessible=True)
            pair.ps.engine.set_worker_addrs(int(cache.cache_id), [base])
            private = pair.ps.engine.register_cache(desc, is_blocks=False, handles=[hidden], remote_accessible=False,
                                                    worker_addrs=[secret])
            assert int(private.cache_id) not in serving.table.published._handles
            dst = pair.ds.engine.allocate_cache(CacheDesc(1, (4, BLOCK), DType.DT_UINT8, Placement.DEVICE),
                                                is_blocks=False)
            asked = Calls(serving)

            def order(addr: int) -> TransferOrder:
                return TransferOrder(TransferKind.CACHE, AddrRef(P, addr), int(dst.cache_id))

            nbytes, _ = await pulled(linking, order(base + BLOCK))       # row 1 of the published cache
            assert nbytes == BLOCK and asked.seen == []
            seg = tensors_of(dst)[0]
            got = np.frombuffer(seg.handle.view(), np.uint8)[seg.offset:seg.offset + BLOCK]
            np.testing.assert_array_equal(got, shown.arr[BLOCK:2 * BLOCK])
            for addr in (secret, secret + BLOCK, base + 4 * BLOCK, base - 1):
                with pytest.raises(DataDistError) as info:
                    await pulled(linking, order(addr))
                assert info.value.code == S.LLM_PARAM_INVALID, hex(addr)
            with pytest.raises(DataDistError) as info:                   # runs past the tensor's end
                await pulled(linking, order(base + 3 * BLOCK + 1))
            assert info.value.code == S.LLM_PARAM_INVALID

    asyncio.run(main())



def test_a_peer_whose_socket_is_full_is_dropped_at_a_withdrawal_not_waited_for() -> None:
    """Issue 44, attack 3: the owner withdraws a cache on its event loop, before the cache's memory goes back to the
    pool. A peer that stopped reading (its first connection's socket full) used to hold that loop -- and every
    tenant and link it answers -- for 5 s per peer; now the ``W`` that cannot go out at once drops the peer with its
    channel, so it never reads a row it was not told is gone, and the withdrawal goes on at once."""
    import socket
    import threading

    from datadistd.transport.base import CONTROL_TRANSPORT
    from datadistd.transport.onesided.link import _CONTROL_TIMEOUT

    async def main() -> None:
        async with NixlPair() as pair:
            serving, linking, src, dst, channel = await _linked(pair)
            await pulled(linking, _order(P, dst, [1], [1]))
            (owner_peer,) = serving.table.transport._peers.values()
            (puller_peer,) = linking.table.transport._peers.values()
            # the puller stops reading its first connection: its reader thread held in the frame "Z" (bounded)
            stalled, resume = threading.Event(), threading.Event()
            real = puller_peer._on_message

            def on_message(payload: bytes) -> None:
                if payload[:1] == b"Z":
                    stalled.set()
                    resume.wait(4 * _CONTROL_TIMEOUT)
                    return
                real(payload)

            puller_peer._on_message = on_message
            tcp = owner_peer.channel()
            assert tcp.try_control_first(CONTROL_TRANSPORT, b"Z", time.monotonic() + 5)
            assert await asyncio.to_thread(stalled.wait, 10)
            sock = tcp._conns[0].sock
            try:   # ... and the owner's socket to it fills up
                for _ in range(100_000):
                    sock.send(b"\0" * 65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                pass
            try:
                began = time.monotonic()
                pair.ps.engine.deallocate_cache(src, is_blocks=True)   # on the loop: withdraws the cache
                took = time.monotonic() - began
                assert owner_peer.broken and not serving.table.transport._peers   # that peer is dropped
                assert serving.table.transport._agent().published() == 0         # and the cache deregistered
                # it was not waited for: the loop went on before a send to that socket could even time out
                assert took < _CONTROL_TIMEOUT, took
                print(f"\nthe withdrawal took {took * 1000:.1f} ms with a peer whose socket is full")
            finally:
                resume.set()

    asyncio.run(main())
