"""Pulls by READ over the one-sided transports (issue 28, item 3): the legitimate use beside the abuse.

In process (``tests/unit/test_links.py``'s ``Pair`` with ``[transport] name = "nixl"``: two nodes, real NIXL
agents over UCX on loopback): a pull is a grant by the owner (``Owner.grant_read_for``, the ``grant_read`` owner
call) and one READ by the puller; the owner's agent posts no WRITE. The other end of a link, hostile, asks grants
out of bounds, of another engine's cache, of a cache not remotely accessible, past the link's caps, and never
ends them; it reads after the unlink; the owner deallocates a cache a grant holds.
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
from datadistd.core.types import BlocksKeyRef, CacheDesc, DType, Placement, ReadMode, RemoteSpec, Role  # noqa: E402
from datadistd.guard.quota import LinkLimits  # noqa: E402
from datadistd.links import ClusterSpec, LinkState  # noqa: E402
from datadistd.memory.base import Segment  # noqa: E402
from datadistd.node.node import Node  # noqa: E402
from datadistd.state.config import Config  # noqa: E402
from datadistd.state.engine import tensors_of  # noqa: E402
from datadistd.transport.base import Channel  # noqa: E402
from tests.fakes import pulled, worker_session
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


def _held(pair: NixlPair, src: int) -> tuple[int, int, int, int]:
    """What the other end holds at the owner: grants, pins of ``src``, the link's open transfers and bytes."""
    (link,) = pair.ps.links.served.values()
    return len(pair.ps.links.table.grants), pair.ps.engine.entry(src).pins, link.usage.writes, link.usage.pinned


def _channel(pair: NixlPair) -> Channel:
    table = pair.ds.links.table
    (link,) = table.links.values()
    channel = table.channel_of(link)
    assert channel is not None
    return channel


def _read(pair: NixlPair, channel: Channel, grant: bytes, dst: int, blocks: list[int], seconds: float = 5.0) -> None:
    """The puller's READ of ``grant`` into blocks of its cache ``dst`` (as ``Requester._read_pull`` does)."""
    table = pair.ds.links.table
    assert table.reads is not None
    entry = pair.ds.engine.entry(dst)
    segs = [Segment(seg.handle, seg.offset + b * BLOCK, BLOCK) for seg in tensors_of(entry) for b in blocks]
    table.reads.read(channel, grant, segs, time.monotonic() + seconds)


def test_a_pull_is_a_read_by_the_puller_and_the_owner_writes_nothing() -> None:
    async def main() -> None:
        async with NixlPair() as pair:
            assert await pair.link() == (0, [0])
            serving, linking = pair.links
            src, dst = pair.caches()
            owner_t, puller_t = serving.table.transport, linking.table.transport
            assert serving.table.reads is owner_t and linking.table.reads is puller_t   # decided once, at build
            nbytes, _ = await pulled(linking, _order(P, dst, [1, 3, 6], [0, 2, 5]))
            assert nbytes == 3 * 2 * BLOCK
            got, want = _bytes(pair.ds, dst), _bytes(pair.ps, src)
            for t in range(2):
                np.testing.assert_array_equal(got[t][[0, 2, 5]], want[t][[1, 3, 6]])
            assert owner_t.bytes_sent == 0                       # the owner's agent posted no WRITE
            assert puller_t.bytes_received == nbytes              # the puller's READ moved every byte
            assert await _until(lambda: _held(pair, src) == (0, 0, 0, 0))   # the grant ended after the pull
            # the other way: the serving end pulls from the linking end, by READ too
            n2, _ = await pulled(serving, _order(D, src, [0], [7]))
            assert owner_t.bytes_received == n2 and puller_t.bytes_sent == 0
            assert _bytes(pair.ps, src)[1][7].tolist() == _bytes(pair.ds, dst)[1][0].tolist()

    asyncio.run(main())


def test_grants_out_of_bounds_of_another_engine_or_not_remote_are_refused_before_a_pin() -> None:
    async def main() -> None:
        async with NixlPair() as pair:
            assert await pair.link() == (0, [0])
            serving, _ = pair.links
            src, _ = pair.caches()
            (link,) = serving.served.values()
            owner = serving.owner
            refused = {
                "block out of bounds": (_spec((BLOCKS,)), S.LLM_PARAM_INVALID),
                "byte count not the owner's": (_spec((1,), nbytes=2 * BLOCK + 1), S.LLM_PARAM_INVALID),
                "another model's cache": (RemoteSpec(BlocksKeyRef(P, 9), ReadMode.BLOCKS, (1,), -1, 0, 0, 0,
                                                     2 * BLOCK), S.LLM_KV_CACHE_NOT_EXIST),
                "tensors out of range": (RemoteSpec(BlocksKeyRef(P, 0), ReadMode.BLOCKS, (1,), -1, 0, 1, 5,
                                                    5 * BLOCK), S.LLM_PARAM_INVALID),
            }
            for what, (spec, code) in refused.items():
                with pytest.raises(DataDistError) as info:
                    owner.grant_read_for(link, spec, 1000)
                assert info.value.code == code, what
                assert _held(pair, src) == (0, 0, 0, 0), what
            # the put-for-pull path is gone on a transport that reads: a read call is refused, nothing is sent
            with pytest.raises(DataDistError) as info:
                await owner.read_for(link, 1, _spec((1,)), 1000)
            assert info.value.code == S.LLM_PARAM_INVALID and serving.table.transport.bytes_sent == 0
            assert _held(pair, src) == (0, 0, 0, 0)
            # a cache of another engine of the owner's daemon (cluster 3) is not this link's to read
            other = await pair.p.init_engine(3, Role.PROMPT, {"llm.MemPoolConfig": POOL,
                                                              "llm.EnableRemoteCacheAccessible": "1"},
                                             worker_session(pair.p))
            other.engine.allocate_cache(CacheDesc(2, (BLOCKS, BLOCK), DType.DT_UINT8, Placement.DEVICE),
                                        is_blocks=True, blocks_key=BlocksKeyRef(3, 0))
            with pytest.raises(DataDistError) as info:
                owner.grant_read_for(link, _spec((1,), cluster=3), 1000)
            assert info.value.code == S.LLM_KV_CACHE_NOT_EXIST
            # a cache not remotely accessible
            pair.ps.engine.entry(src).remote_accessible = False
            with pytest.raises(DataDistError) as info:
                owner.grant_read_for(link, _spec((1,)), 1000)
            assert info.value.code == S.LLM_KV_CACHE_NOT_EXIST
            assert _held(pair, src) == (0, 0, 0, 0)

    asyncio.run(main())


def test_grants_are_held_to_the_links_caps_and_end_only_by_their_link() -> None:
    async def main() -> None:
        async with NixlPair() as pair:
            pair.p.link_limits = LinkLimits(open_writes=3, pinned_bytes=5 * 2 * BLOCK)
            assert await pair.link() == (0, [0])
            serving, _ = pair.links
            src, _ = pair.caches()
            (link,) = serving.served.values()
            owner = serving.owner
            g1, _, _ = owner.grant_read_for(link, _spec((0, 1)), 60_000)
            g2, _, _ = owner.grant_read_for(link, _spec((2, 3, 4)), 60_000)
            with pytest.raises(DataDistError) as info:        # 6 blocks pinned > 5
                owner.grant_read_for(link, _spec((5,)), 60_000)
            assert info.value.code == S.LLM_LINK_BUSY and "link_pinned_bytes" in info.value.message
            assert _held(pair, src) == (2, 2, 2, 5 * 2 * BLOCK)
            with pytest.raises(DataDistError) as info:        # not this link's grant / unknown
                owner.done_read_for(pair.ds.links.table.links[P], g1, True)
            assert info.value.code == S.LLM_PARAM_INVALID
            with pytest.raises(DataDistError):
                owner.done_read_for(link, g2 + 100, True)
            owner.done_read_for(link, g1, False)
            owner.done_read_for(link, g2, True)
            with pytest.raises(DataDistError):               # ended once
                owner.done_read_for(link, g2, True)
            assert _held(pair, src) == (0, 0, 0, 0)
            for _ in range(3):
                owner.grant_read_for(link, _spec((0,)), 60_000)
            with pytest.raises(DataDistError) as info:        # a 4th open transfer
                owner.grant_read_for(link, _spec((0,)), 60_000)
            assert info.value.code == S.LLM_LINK_BUSY and "link_open_writes" in info.value.message

    asyncio.run(main())


def test_a_grant_never_ended_severs_the_link_before_the_owner_unpins() -> None:
    async def main() -> None:
        async with NixlPair() as pair:
            pair.p.link_limits = LinkLimits(max_wait_ms=300)    # the grant's hold is cut to this
            assert await pair.link() == (0, [0])
            serving, linking = pair.links
            src, dst = pair.caches()
            (dlink,) = linking.table.links.values()
            (slink,) = serving.served.values()
            channel = _channel(pair)
            _, grant, _ = await dlink.calls.grant_read(_spec((1, 2)), 60.0)   # asks for "a minute"
            assert _held(pair, src)[:2] == (1, 1)
            # never ended: at the cut hold (0.3 s) the owner severs the link, then unpins
            assert await _until(lambda: not serving.table.grants, 6.0)
            assert slink.state == LinkState.BROKEN and P not in [*serving.served]
            assert await _until(lambda: pair.ps.engine.entry(src).pins == 0)
            assert await _until(lambda: channel.broken)
            # the end that kept the grant reads with it: its channel is gone, nothing is read
            before = _bytes(pair.ds, dst)[0].copy()
            with pytest.raises(DataDistError) as info:
                await asyncio.to_thread(_read, pair, channel, grant, dst, [3, 4])
            assert info.value.code == S.LLM_LINK_FAILED
            np.testing.assert_array_equal(_bytes(pair.ds, dst)[0], before)

    asyncio.run(main())


def test_unlink_ends_the_grants_and_a_deallocated_cache_waits_for_them() -> None:
    async def main() -> None:
        async with NixlPair() as pair:
            assert await pair.link() == (0, [0])
            serving, linking = pair.links
            src, dst = pair.caches()
            (dlink,) = linking.table.links.values()
            channel = _channel(pair)
            _, grant, _ = await dlink.calls.grant_read(_spec((1, 2)), 60.0)
            # the owner deallocates the cache the grant holds: its memory waits for the grant (pinned)
            pair.ps.engine.deallocate_cache(src, is_blocks=True)
            entry = next(iter(pair.ps.engine.registry._draining.values()))
            assert entry.pins == 1
            # the legitimate read still sees the cache's bytes
            await asyncio.to_thread(_read, pair, channel, grant, dst, [3, 4])
            assert _bytes(pair.ds, dst)[1][3].tolist() == [2] * BLOCK
            await linking.unlink_clusters([ClusterSpec(P, "127.0.0.1", 1)], 3000, False)
            assert await _until(lambda: not serving.table.grants and entry.pins == 0)
            assert not pair.ps.engine.registry._draining           # freed once the grant went with its link
            with pytest.raises(DataDistError):                      # nothing is read after the unlink
                await asyncio.to_thread(_read, pair, channel, grant, dst, [5, 6])

    asyncio.run(main())
