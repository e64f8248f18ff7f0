"""The link manager without gRPC or daemons: two engines of one in-process ``Node`` each, the linking
side reaching the serving side through ``InProcessPeer`` (a ``PeerClient`` that calls the serving
``LinkManager`` directly, with failures injectable), bytes over real loopback TCP data planes.
Milliseconds per test, and a failure points at the link code, not at a process or a socket file.

After the handshake the data connection carries everything (owner calls, unlink, heartbeat as
CALL/REPLY frames): ``InProcessPeer`` serves only ``challenge`` and ``handshake``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import threading
import time
from typing import Any

import numpy as np
import pytest

from datadist.status import LLMStatusCode as S
from datadistd.core.errors import DataDistError
from datadistd.core.plan import LayerTarget, LayerTask, TransferKind, TransferOrder
from datadistd.core.types import BlocksKeyRef, CacheDesc, DType, Placement, ReadMode, RemoteSpec, Role
from datadistd.engine.engine import tensors_of
from datadistd.links import ClusterSpec, InboundLink, LinkManager, LinkState, OutboundLink
from datadistd.links.layerwise import LayerPush
from datadistd.links.wire import ownerwire
from datadistd.links.wire.ownercalls import OwnerReply, UnlinkCmd
from datadistd.links.wire.peering import PROTOCOL_VERSION, HandshakeAnswer, HandshakeOffer, make_offer, offer_mac
from datadistd.node.node import Node
from datadistd.ops.config import Config
from datadistd.transport.base import CONTROL_CALL, CONTROL_DOWN, CONTROL_REPLY
from datadistd.transport.tcp.reactor import THREAD_PREFIX, reactor
from tests.fakes import pulled, pushed, start_pull, worker_session

pytestmark = pytest.mark.timeout(60)

P, D = 1, 2
BLOCKS, BLOCK = 8, 256
POOL = '{"memory_size": 1048576}'


class InProcessPeer:
    """``PeerClient`` of a serving ``LinkManager`` in the same process; ``fail[method]`` raises once."""

    def __init__(self, server: LinkManager, address: str) -> None:
        self.server = server
        self.address = address
        self.fail: dict[str, DataDistError] = {}
        self.calls: list[str] = []
        self.offers: list[HandshakeOffer] = []    # what an eavesdropper on the control plane would have seen

    def _check(self, what: str) -> None:
        self.calls.append(what)
        exc = self.fail.pop(what, None)
        if exc is not None:
            raise exc

    async def challenge(self, client: int, server: int, timeout: float) -> bytes:
        self._check("challenge")
        return self.server.serve_challenge(client, server)

    async def handshake(self, offer: HandshakeOffer, timeout: float) -> HandshakeAnswer:
        self._check("handshake")
        self.offers.append(offer)
        return await self.server.serve_handshake(offer)

    async def close(self) -> None:
        pass


class Pair:
    """A serving engine (cluster P) on node ``p`` and a linking engine (cluster D) on node ``d``."""

    def __init__(self, secrets: tuple[str, str] = ("s3cret", "s3cret"), pool: str = POOL) -> None:
        self.secrets = secrets
        self.pool = pool
        self.peers: list[InProcessPeer] = []

    async def __aenter__(self) -> "Pair":
        self.p = Node(Config().with_overrides({"peer.secret": self.secrets[0]}))
        self.d = Node(Config().with_overrides({"peer.secret": self.secrets[1]}),
                      peer_connector=self._connect)
        opts = {"llm.MemPoolConfig": self.pool, "llm.EnableRemoteCacheAccessible": "1"}
        self.ps = await self.p.init_engine(P, Role.PROMPT, opts, worker_session(self.p))
        self.ds = await self.d.init_engine(D, Role.DECODER, opts, worker_session(self.d))
        return self

    def _connect(self, address: str) -> InProcessPeer:
        peer = InProcessPeer(self.ps.links, address)
        self.peers.append(peer)
        return peer

    async def __aexit__(self, *exc: object) -> None:
        await self.d.close()
        await self.p.close()

    @property
    def links(self) -> tuple[LinkManager, LinkManager]:
        return self.ps.links, self.ds.links

    async def link(self) -> tuple[int, list[int]]:
        return await self.ds.links.link_clusters([ClusterSpec(P, "127.0.0.1", 1)], 3000)

    def caches(self, tensors: int = 2) -> tuple[int, int]:
        """A blocks cache on each side, bound to model 0; the prompt's filled with a pattern."""
        desc = CacheDesc(tensors, (BLOCKS, BLOCK), DType.DT_UINT8, Placement.DEVICE)
        src = self.ps.engine.allocate_cache(desc, is_blocks=True, blocks_key=BlocksKeyRef(P, 0))
        dst = self.ds.engine.allocate_cache(desc, is_blocks=True, blocks_key=BlocksKeyRef(D, 0))
        for t, seg in enumerate(tensors_of(src)):
            seg.handle.write_from(seg.offset, memoryview(np.full(seg.length, t + 1, np.uint8)).cast("B"))
        return int(src.cache_id), int(dst.cache_id)


def general_reads_only(manager: LinkManager) -> None:
    """``manager``'s engine publishes no read view (``readview``): every small read and write of a peer is answered
    by the general path on the loop (``Owner.read_small`` / ``write_small``: ``prepare_read`` / ``prepare_write``),
    the reference the view's answers must equal."""
    manager.table.watchers.remove(manager.calls._publish)
    manager.engine.read_view = None


def _bytes(slot: Any, cache_id: int) -> list[np.ndarray]:
    out = []
    for seg in tensors_of(slot.engine.entry(cache_id)):
        buf = np.zeros(seg.length, np.uint8)
        seg.handle.read_into(seg.offset, memoryview(buf).cast("B"))
        out.append(buf.reshape(BLOCKS, BLOCK))
    return out


def _order(remote_cluster: int, local_cache: int, remote: list[int], local: list[int]) -> TransferOrder:
    """Blocks ``remote`` of the other end's model-0 cache <-> blocks ``local`` of ``local_cache``."""
    return TransferOrder(TransferKind.BLOCKS, BlocksKeyRef(remote_cluster, 0), local_cache, tuple(remote),
                         tuple(local))


def test_both_ends_pull_and_push_byte_exact() -> None:
    async def main() -> None:
        async with Pair() as pair:
            assert await pair.link() == (0, [0])
            serving, linking = pair.links
            assert linking.links[P].state == LinkState.ESTABLISHED and D in serving.served
            src, dst = pair.caches()
            nbytes, transport = await pulled(linking, _order(P, dst, [1, 2], [5, 6]))
            assert (nbytes, transport) == (2 * 2 * BLOCK, "tcp")
            got, want = _bytes(pair.ds, dst), _bytes(pair.ps, src)
            for t in range(2):
                np.testing.assert_array_equal(got[t][[5, 6]], want[t][[1, 2]])
                assert not got[t][[0, 1, 2, 3, 4, 7]].any()
            # the serving end pushes its block 3 into the linking end's block 0 (two-way links)
            await pushed(serving, _order(D, src, [0], [3]))
            got = _bytes(pair.ds, dst)
            for t in range(2):
                np.testing.assert_array_equal(got[t][0], want[t][3])
            # the Peer service saw the handshake only: every owner call went as a frame on the data channel
            assert pair.peers[0].calls == ["challenge", "handshake"]

    asyncio.run(main())


def test_each_end_holds_the_record_of_its_kind() -> None:
    async def main() -> None:
        async with Pair() as pair:
            assert await pair.link() == (0, [0])
            serving, linking = pair.links
            out, inb = linking.links[P], serving.served[D]
            assert isinstance(out, OutboundLink) and isinstance(inb, InboundLink)
            assert out.initiator and not inb.initiator
            assert out.link_nonce == inb.link_nonce and serving.served == {D: inb} and not linking.served
            assert out.streams == out.channel.streams >= 1 and inb.streams == 0
            assert linking.table.channel_of(out) is out.channel and serving.table.channel_of(inb) is not None
            assert not out.calls.closed and not inb.calls.closed
            engines = pair.p.snapshot().engines + pair.d.snapshot().engines
            views = {(v.remote_cluster, v.initiator, v.streams) for e in engines for v in e.links}
            assert views == {(P, True, out.streams), (D, False, 0)}
            code, _ = await serving.unlink_clusters([ClusterSpec(D)], 3000, False)   # from the serving end
            assert code == 0 and not serving.served and await _until(lambda: not linking.links)
            assert serving.transport.channel(inb.token) is None            # its data-plane token revoked

    asyncio.run(main())


@pytest.mark.parametrize("how", ["inline", "awaited"])
def test_a_link_unlinked_during_a_transfer_is_not_yet_link_not_a_timeout(how: str) -> None:
    """CANN answers LLM_NOT_YET_LINK for a link that was destroyed (hixl data_cache_engine.cc, PullCache); the
    pull used to say LLM_TIMEOUT "failed within 1000 ms" though nothing timed out. Both ways a small pull runs:
    started by callback (``start_pull``: the attach socket's) and awaited (``pull``)."""
    async def main() -> None:
        async with Pair() as pair:
            serving, linking = pair.links
            general_reads_only(serving)
            assert await pair.link() == (0, [0])
            _, dst = pair.caches()

            async def read_while_this_end_unlinks(*args: Any) -> tuple[int, bool]:
                assert (await serving.unlink_clusters([ClusterSpec(D)], 3000, False))[0] == 0
                deadline = time.monotonic() + 5
                while linking.links and time.monotonic() < deadline:   # the notice reaches the linking end
                    await asyncio.sleep(0.01)
                raise DataDistError(S.LLM_LINK_FAILED, f"owner calls to cluster {P} closed: unlinked")

            # the owner answers a small read with its bytes (inline): make it take the general path and unlink there
            serving.owner.read_small = read_while_this_end_unlinks  # type: ignore[method-assign]
            with pytest.raises(DataDistError) as info:
                if how == "awaited":
                    await pulled(linking, _order(P, dst, [1], [1]))
                else:
                    ended: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                    start_pull(linking, _order(P, dst, [1], [1]), ended.set_result)
                    result = await asyncio.wait_for(ended, 10)
                    if isinstance(result, DataDistError):
                        raise result
            assert info.value.code == S.LLM_NOT_YET_LINK, info.value
            assert info.value.message.startswith(f"the link to cluster {P} was closed during the transfer ("), \
                info.value.message

    asyncio.run(main())


def test_a_wrong_secret_is_refused_at_either_end() -> None:
    async def main() -> None:
        async with Pair(secrets=("alpha", "bravo")) as pair:
            code, codes = await pair.link()
            assert (code, codes) == (S.LLM_LINK_FAILED, [S.LLM_LINK_FAILED])
            serving, linking = pair.links
            assert not linking.links and not serving.served

    asyncio.run(main())


def test_a_replayed_handshake_is_refused() -> None:
    async def main() -> None:
        async with Pair() as pair:
            serving, linking = pair.links
            assert await pair.link() == (0, [0])
            offers = pair.peers[0].offers
            with pytest.raises(DataDistError) as info:
                await serving.serve_handshake(offers[0])
            assert info.value.code == S.LLM_LINK_FAILED and "challenge" in info.value.message
            with pytest.raises(DataDistError) as info:
                serving.serve_challenge(D, P + 9)
            assert "cluster id mismatch" in info.value.message

    asyncio.run(main())


def test_already_linked_and_relink_after_unlink() -> None:
    async def main() -> None:
        async with Pair() as pair:
            serving, linking = pair.links
            assert await pair.link() == (0, [0])
            assert await pair.link() == (S.LLM_ALREADY_LINK, [S.LLM_ALREADY_LINK])
            code, _ = await linking.unlink_clusters([ClusterSpec(P, "127.0.0.1", 1)], 3000, False)
            assert code == 0 and not linking.links and not serving.served
            assert await pair.link() == (0, [0])

    asyncio.run(main())


def test_a_failed_owner_call_breaks_the_link_and_says_relink() -> None:
    async def main() -> None:
        async with Pair() as pair:
            serving, linking = pair.links
            assert await pair.link() == (0, [0])
            _, dst = pair.caches()
            out = linking.links[P]
            assert isinstance(out, OutboundLink)
            serving.transport.revoke(out.token)   # the serving end's data plane drops the connections
            assert await _until(lambda: out.channel.broken)
            with pytest.raises(DataDistError) as info:
                await pulled(linking, _order(P, dst, [1], [1]))
            # the connection failed before any deadline: CANN's code for a failed communication, not LLM_TIMEOUT --
            # found by the pull, or told by the channel first (``CONTROL_DOWN``: the link is broken already)
            assert info.value.code == S.LLM_FAILED, info.value
            assert "no live data connection" in info.value.message or "data channel closed" in info.value.message
            assert linking.links[P].state == LinkState.BROKEN
            with pytest.raises(DataDistError) as info:   # no retry on a broken link: the caller relinks
                await pulled(linking, _order(P, dst, [1], [1]))
            assert info.value.code == S.LLM_FAILED and "link_clusters again" in info.value.message
            # an owner-side refusal (not a link fault) leaves a healthy link alone
            assert await pair.link() == (0, [0])
            with pytest.raises(DataDistError) as info:
                await pulled(linking, _order(P, dst, [BLOCKS + 3], [1]))
            assert info.value.code == S.LLM_PARAM_INVALID
            assert linking.links[P].state == LinkState.ESTABLISHED

    asyncio.run(main())


def test_no_link_no_transfer() -> None:
    async def main() -> None:
        async with Pair() as pair:
            _, dst = pair.caches()
            with pytest.raises(DataDistError) as info:
                await pulled(pair.ds.links, _order(P, dst, [1], [1]))
            assert info.value.code == S.LLM_NOT_YET_LINK

    asyncio.run(main())


class OwnerCallCounter:
    """Counts the write calls an owner serves (frames on the data channel, from either end)."""

    def __init__(self, owner: LinkManager) -> None:
        self.opened: list[int] = []      # parts per open_write call
        self.committed: list[int] = []   # transfers per commit_write call
        real_open, real_commit = owner.owner.open_write_for, owner.owner.commit_write_for

        async def open_write_for(link: Any, specs: Any, timeout_ms: int, hold_ms: int = 0) -> list[int]:
            self.opened.append(len(specs))
            return await real_open(link, specs, timeout_ms, hold_ms)

        async def commit_write_for(link: Any, transfer_ids: Any, timeout_ms: int) -> None:
            self.committed.append(len(transfer_ids))
            await real_commit(link, transfer_ids, timeout_ms)

        owner.owner.open_write_for = open_write_for        # type: ignore[method-assign]
        owner.owner.commit_write_for = commit_write_for    # type: ignore[method-assign]


LAYERS = 4


async def _layer_push(pair: Pair) -> tuple[LayerPush, LinkManager, int, int]:
    """Linked, with caches of ``LAYERS`` layers: the serving end's task pushing every layer, blocks 1 and 2, into
    blocks 5 and 6 of the linking end's model-0 cache (two-way links); the owner's links and both caches."""
    await pair.link()
    serving, linking = pair.links
    src, dst = pair.caches(2 * LAYERS)
    desc = serving.engine.entry(src).desc
    target = LayerTarget(D, (0, LAYERS), key=BlocksKeyRef(D, 0), dst_layers=(0, LAYERS))
    return LayerPush(serving, src, LayerTask(desc, True, (target,), (1, 2), (5, 6))), linking, src, dst


def test_a_layer_wise_push_opens_and_commits_once_per_target() -> None:
    """Two owner calls per target and task (open every layer, commit them all), none per layer."""
    async def main() -> None:
        async with Pair() as pair:
            task, linking, src, dst = await _layer_push(pair)
            owner = OwnerCallCounter(linking)
            events = []
            try:
                for layer in range(LAYERS):
                    events += await task.ready(layer)
            finally:
                task.close()
            assert [(e.layer, e.status, e.final) for e in events] == \
                [(layer, 0, layer == LAYERS - 1) for layer in range(LAYERS)]
            assert owner.opened == [LAYERS] and owner.committed == [LAYERS]
            got, want = _bytes(pair.ds, dst), _bytes(pair.ps, src)
            for t in range(2 * LAYERS):
                np.testing.assert_array_equal(got[t][[5, 6]], want[t][[1, 2]])
            assert not linking.table.writes and pair.ds.engine.entry(dst).pins == 0

    asyncio.run(main())


async def _until(condition: Any, seconds: float = 5.0) -> bool:
    for _ in range(int(seconds / 0.02)):
        if condition():
            return True
        await asyncio.sleep(0.02)
    return condition()


def test_an_engine_with_nothing_to_look_after_is_not_swept_until_a_link_is_served() -> None:
    """The link table's sweeper (linking daemons gone silent, abandoned writes) runs only while there is
    something of that kind: an engine with no served link or write sleeps until one comes (before: a round a
    second in every engine, linked or not); a link served wakes it, and once that link is gone it sleeps again."""
    async def main() -> None:
        async with Pair() as pair:
            serving, linking = pair.links
            await asyncio.sleep(1.5)
            assert serving.table.sweeps == linking.table.sweeps == 0
            await pair.link()
            assert await _until(lambda: serving.table.sweeps >= 2)
            assert linking.table.sweeps == 0     # it serves nothing: a linking daemon's liveness is its pings
            code, _ = await linking.unlink_clusters([ClusterSpec(P, "127.0.0.1", 1)], 3000, False)
            assert code == 0
            assert await _until(lambda: not serving.table.served)
            await asyncio.sleep(1.2)             # a round under way ends
            rounds = serving.table.sweeps
            await asyncio.sleep(1.5)
            assert serving.table.sweeps == rounds

    asyncio.run(main())


def test_a_layer_wise_push_ended_early_releases_the_owner() -> None:
    """A task closed after its first layer: the owner's opened transfers are aborted and its cache unpinned
    (not held until the transfers' hold time)."""
    async def main() -> None:
        async with Pair() as pair:
            task, linking, src, dst = await _layer_push(pair)
            assert [e.status for e in await task.ready(0)] == [0]
            assert len(linking.table.writes) == LAYERS and pair.ds.engine.entry(dst).pins == LAYERS
            task.close()
            assert await _until(lambda: not linking.table.writes and pair.ds.engine.entry(dst).pins == 0)

    asyncio.run(main())


def test_unlink_between_layers_releases_the_owners_writes_and_fails_the_next_layer() -> None:
    async def main() -> None:
        async with Pair() as pair:
            task, linking, src, dst = await _layer_push(pair)
            try:
                await task.ready(0)
                assert len(linking.table.writes) == LAYERS
                assert (await linking.unlink_clusters([ClusterSpec(P, "127.0.0.1", 1)], 3000, False))[0] == 0
                # the sweeper drops the writes of a link gone (not the unlink: a commit may be on its way)
                assert await _until(lambda: not linking.table.writes and pair.ds.engine.entry(dst).pins == 0)
                (event,) = await task.ready(1)
                assert event.final and event.status == S.LLM_NOT_YET_LINK and task.done
            finally:
                task.close()

    asyncio.run(main())


def test_an_open_write_is_all_or_none_and_a_commit_names_only_open_transfers() -> None:
    """What a peer may ask of an owner: a bad part among good ones opens nothing (no pin left behind); a
    commit naming a transfer twice, or one it did not open, is refused before anything is waited for."""
    async def main() -> None:
        async with Pair() as pair:
            await pair.link()
            serving, _ = pair.links
            src, _ = pair.caches()
            link = serving.served[D]
            good = RemoteSpec(BlocksKeyRef(P, 0), ReadMode.BLOCKS, (1,), -1, 0, 0, 0, 2 * BLOCK)
            bad = RemoteSpec(BlocksKeyRef(P, 0), ReadMode.BLOCKS, (BLOCKS,), -1, 0, 0, 0, 2 * BLOCK)
            with pytest.raises(DataDistError) as info:
                await serving.owner.open_write_for(link, [good, good, bad], 1000)
            assert info.value.code == S.LLM_PARAM_INVALID
            assert not serving.table.writes
            assert await _until(lambda: serving.engine.entry(src).pins == 0)
            tids = await serving.owner.open_write_for(link, [good, good], 1000)
            assert len(serving.table.writes) == 2 and serving.engine.entry(src).pins == 2
            for ids in ([tids[0], tids[0]], [tids[0], 12345], []):
                with pytest.raises(DataDistError) as info:
                    await serving.owner.commit_write_for(link, ids, 1000)
                assert info.value.code == S.LLM_PARAM_INVALID
            assert len(serving.table.writes) == 2   # nothing was taken by the refused commits
            serving.table.drop_writes(tids)
            assert not serving.table.writes
            assert await _until(lambda: serving.engine.entry(src).pins == 0)

    asyncio.run(main())


@pytest.mark.parametrize("old", [2, 6, 8])
def test_a_peer_of_another_protocol_is_refused_at_the_handshake(old: int) -> None:
    """No legacy path: a peer of protocol 2 (owner calls over gRPC), 6 (nixl pulls by read grants) or 8 (hccl pulls
    by read grants) is refused, naming both versions."""
    async def main() -> None:
        async with Pair() as pair:
            serving, _ = pair.links
            secret = pair.secrets[0].encode()
            offer = make_offer(secret, D, P, serving.serve_challenge(D, P))
            stale = dataclasses.replace(offer, protocol_version=old,
                                        mac=offer_mac(secret, old, D, P, offer.timestamp_ms, offer.challenge))
            with pytest.raises(DataDistError) as info:
                await serving.serve_handshake(stale)
            assert info.value.code == S.LLM_LINK_FAILED
            assert f"v{old}, this daemon v{PROTOCOL_VERSION}" in info.value.message
            assert not serving.served

    asyncio.run(main())


def test_liveness_and_check_link_are_frames_from_either_end() -> None:
    async def main() -> None:
        async with Pair() as pair:
            serving, linking = pair.links
            assert await pair.link() == (0, [0])
            inb = serving.served[D]
            before = inb.last_seen
            await asyncio.sleep(0.01)
            await linking.check_link(P)          # a ping frame: the serving end hears from the linking end
            assert inb.last_seen > before
            out = linking.links[P]
            before = out.last_seen
            await asyncio.sleep(0.01)
            await serving.check_link(D)          # and the serving end may ask too
            assert out.last_seen > before
            assert pair.peers[0].calls == ["challenge", "handshake"]

    asyncio.run(main())


def test_a_small_pull_comes_back_in_the_reply_without_a_transfer_on_the_channel() -> None:
    """A pull of at most ``INLINE_READ_MAX`` bytes over tcp asks the owner for its bytes in the
    reply -- no receipt at the requester, no transfer sent by the owner -- by callback and awaited alike."""
    async def main() -> None:
        async with Pair() as pair:
            serving, linking = pair.links
            assert await pair.link() == (0, [0])
            src, dst = pair.caches()
            used: list[str] = []
            expect, read_for = linking.table.transport.expect, serving.owner.read_for
            linking.table.transport.expect = lambda *a, **k: used.append("expect") or expect(*a, **k)  # type: ignore
            serving.owner.read_for = lambda *a, **k: used.append("read_for") or read_for(*a, **k)  # type: ignore
            assert await pulled(linking, _order(P, dst, [1, 4], [2, 7])) == (4 * BLOCK, "tcp")
            ended: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            start_pull(linking, _order(P, dst, [5], [0]), ended.set_result)
            assert await asyncio.wait_for(ended, 10) == (2 * BLOCK, "tcp")
            assert used == []
            for t, tensor in enumerate(_bytes(pair.ds, dst)):
                blocks = tensor.reshape(BLOCKS, BLOCK)
                assert (blocks[[0, 2, 7]] == t + 1).all() and (blocks[[1, 3, 4, 5, 6]] == 0).all()
            assert serving.engine.entry(src).pins == 0 and linking.engine.entry(dst).pins == 0

    asyncio.run(main())


#: a pool for pulls the event loop does not send itself (``big_caches``): 64 rows of 64 KiB a cache
BIG_POOL, BIG_ROWS, BIG_ROW = '{"memory_size": 16777216}', 64, 64 << 10
#: the prompt's DATA frames in ``big_caches``: a pull of more than this is several frames, which the event loop
#: does not send itself (``try_send_soon``: one frame at most) -- it goes by the link's queue (``Owner._queued``)
BIG_FRAME = 128 << 10


def big_caches(pair: Pair) -> tuple[Any, Any, np.ndarray]:
    """A one-tensor blocks cache of ``BIG_ROWS`` x ``BIG_ROW`` at each end (model 0), the prompt's filled with a
    random pattern (returned, ``BIG_ROWS`` x ``BIG_ROW``); the prompt sends frames of ``BIG_FRAME``."""
    pair.ps.links.table.transport.chunk_size = BIG_FRAME
    desc = CacheDesc(1, (BIG_ROWS, BIG_ROW), DType.DT_UINT8, Placement.DEVICE)
    src = pair.ps.engine.allocate_cache(desc, is_blocks=True, blocks_key=BlocksKeyRef(P, 0))
    dst = pair.ds.engine.allocate_cache(desc, is_blocks=True, blocks_key=BlocksKeyRef(D, 0))
    (seg,) = tensors_of(src)
    pattern = np.random.default_rng(3).integers(0, 256, seg.length, np.uint8)
    seg.handle.write_from(seg.offset, memoryview(pattern).cast("B"))
    return src, dst, pattern.reshape(BIG_ROWS, BIG_ROW)


async def linked_big_caches(pair: Pair) -> tuple[Any, Any, np.ndarray, Any]:
    """``pair`` linked, ``big_caches`` at each end, and the serving end's data channel of the link."""
    assert await pair.link() == (0, [0])
    src, dst, pattern = big_caches(pair)
    serving = pair.ps.links
    return src, dst, pattern, serving.table.channel_of(serving.table.served[D])


def test_reads_in_flight_on_a_link_go_out_one_sender_per_connection_replies_after_the_unpin() -> None:
    """Pulls too big for the event loop's send (the general path's DATA frames), many at once on one link: the owner
    queues them on the link and one executor job per connection sends them back to back (``Owner._queued``) --
    never two threads in ``send`` on the link's one connection at once -- and each REPLY goes behind them on the
    same queue once the read's source is unpinned (``queued_control``): when a pull ends at the requester, the
    owner holds no pin of it. Byte-exact."""
    rows, row, per = BIG_ROWS, BIG_ROW, 8                 # 8 blocks of 64 KiB: 512 KiB a pull, 4 frames
    async def main() -> None:
        async with Pair(pool=BIG_POOL) as pair:
            serving, linking = pair.links
            src, dst, pattern, channel = await linked_big_caches(pair)
            inside, most, lock = [0], [0], threading.Lock()
            send, controls = channel.send, []
            send_control = channel.send_control

            def counted(*args: Any, **kwargs: Any) -> None:
                with lock:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                try:
                    send(*args, **kwargs)
                finally:
                    with lock:
                        inside[0] -= 1

            channel.send = counted  # type: ignore[method-assign]
            channel.send_control = lambda *a: controls.append(a[0]) or send_control(*a)  # type: ignore[method-assign]
            # a REPLY made while no sender runs goes out at once (``queued_control`` None): which way each takes
            # is timing (a slow machine drains the queue first), so both are counted
            try_control = channel.try_control
            channel.try_control = lambda *a: controls.append(a[0]) or try_control(*a)  # type: ignore[method-assign]
            remote = [list(range(i, rows, rows // per))[::-1] for i in range(rows // per)]
            loop = asyncio.get_running_loop()
            ends: list[asyncio.Future[Any]] = [loop.create_future() for _ in remote]
            pins: list[int] = []

            def ended(k: int, result: Any) -> None:
                pins.append(serving.engine.entry(src.cache_id).pins)   # the owner's pins as the pull ends here
                ends[k].set_result(result)

            for k, r in enumerate(remote):
                start_pull(linking, _order(P, int(dst.cache_id), r, list(range(k * per, (k + 1) * per))),
                                   functools.partial(ended, k))
            got = await asyncio.wait_for(asyncio.gather(*ends), 30)
            assert got == [(per * row, "tcp")] * len(remote)
            # at the i-th end, only the pulls not ended yet may hold a pin (one each): the ended one's is released
            # (reads still arriving on a slow run pin the shared source meanwhile)
            assert most[0] == 1 and controls.count(CONTROL_REPLY) >= len(remote)
            assert all(n <= len(remote) - 1 - i for i, n in enumerate(pins)), pins
            assert pins[-1] == 0
            (out,) = tensors_of(dst)
            buf = np.zeros(out.length, np.uint8)
            out.handle.read_into(out.offset, memoryview(buf).cast("B"))
            assert (buf.reshape(rows, row) == pattern[[b for r in remote for b in r]]).all()
            assert linking.engine.entry(dst.cache_id).pins == 0
            assert await _until(lambda: not serving.owner._sends)   # the queue goes with its last send

    asyncio.run(main())


def test_a_pull_sent_as_a_transfer_runs_without_a_task_and_ends_with_the_owners_code() -> None:
    """A pull whose bytes come as a transfer on the data channel (more than an inline read) is started and ended by
    callback (``TransferPulls._start_read``): no task per pull at the requester (``LinkTable.spawn`` is not called),
    byte-exact; one the owner refuses (a block past its cache) ends with the owner's code and message, and leaves
    nothing pinned or counted at either end."""
    async def main() -> None:
        async with Pair(pool=BIG_POOL) as pair:
            serving, linking = pair.links
            src, dst, pattern, _ = await linked_big_caches(pair)
            spawned: list[Any] = []
            spawn = linking.table.spawn
            linking.table.spawn = lambda work: spawned.append(work) or spawn(work)  # type: ignore[method-assign]
            remote = [[9, 3, 4, 5], [60, 1, 2, 33]]
            got = await asyncio.gather(*(pulled(linking, _order(P, int(dst.cache_id), r, list(range(4 * k, 4 * k + 4))))
                                         for k, r in enumerate(remote)))
            assert got == [(4 * BIG_ROW, "tcp")] * 2 and spawned == []
            (out,) = tensors_of(dst)
            buf = np.zeros(out.length, np.uint8)
            out.handle.read_into(out.offset, memoryview(buf).cast("B"))
            assert (buf.reshape(-1, BIG_ROW)[:8] == pattern[[b for r in remote for b in r]]).all()
            with pytest.raises(DataDistError) as err:
                await pulled(linking, _order(P, int(dst.cache_id), [1, 2, 3, BIG_ROWS], [0, 1, 2, 3]))
            assert err.value.code == S.LLM_PARAM_INVALID and str(BIG_ROWS) in err.value.message
            link = linking.table.links[P]
            assert spawned == [] and link.pulls == 0 and link.inflight == 0 and link.state == LinkState.ESTABLISHED
            assert serving.engine.entry(src.cache_id).pins == 0 and linking.engine.entry(dst.cache_id).pins == 0

    asyncio.run(main())


def test_a_node_makes_at_most_a_few_link_attempts_at_once_per_address() -> None:
    """Issue 37, item 1: a node's own start-up burst to one listener stays under a stranger's pre-auth cap."""
    from datadistd.links import AddressSlots

    async def scenario() -> None:
        slots = AddressSlots(2)
        inside: list[str] = []
        release = asyncio.Event()

        async def attempt(address: str) -> None:
            async with slots.hold(address, time.monotonic() + 30):
                inside.append(address)
                await release.wait()

        tasks = [asyncio.create_task(attempt("10.0.0.1:26000")) for _ in range(5)]
        tasks.append(asyncio.create_task(attempt("10.0.0.2:26000")))
        for _ in range(10):
            await asyncio.sleep(0)
        assert sorted(inside) == ["10.0.0.1:26000"] * 2 + ["10.0.0.2:26000"]   # 2 per address; others wait
        with pytest.raises(DataDistError) as info:                  # a wait past its deadline: LLM_TIMEOUT
            async with slots.hold("10.0.0.1:26000", time.monotonic()):
                pass
        assert info.value.code == S.LLM_TIMEOUT
        release.set()
        await asyncio.gather(*tasks)
        assert len(inside) == 6 and len(slots) == 0                  # every attempt ran; no entry left behind

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_challenge_refused_with_retry_later_is_retried_within_the_timeout() -> None:
    """Issue 37, item 1: the peer's admission says "retry later" (an address over its challenge budget): the link
    tries again within its timeout and gets in; any other failure is reported at once, untried again."""
    from datadistd.links.wire.peering import RETRY_LATER

    async def main() -> None:
        async with Pair() as pair:
            refusals = [DataDistError(S.LLM_LINK_FAILED, f"too many challenges; {RETRY_LATER}", retryable=True)
                        for _ in range(2)]
            connect = pair._connect

            def refusing(address: str) -> InProcessPeer:
                peer = connect(address)
                if refusals:
                    peer.fail["challenge"] = refusals.pop()
                return peer

            pair.d.peer_connector = refusing
            assert await pair.link() == (0, [0])
            assert [p.calls for p in pair.peers] == [["challenge"], ["challenge"], ["challenge", "handshake"]]
            assert await pair.ds.links.unlink_clusters([ClusterSpec(P, "127.0.0.1", 1)], 3000, False) == (0, [0])
            refusals.append(DataDistError(S.LLM_LINK_FAILED, "authentication failed: wrong or missing shared secret"))
            before = len(pair.peers)
            assert await pair.link() == (S.LLM_LINK_FAILED, [S.LLM_LINK_FAILED])
            assert len(pair.peers) == before + 1                          # one attempt: nothing to retry

    asyncio.run(asyncio.wait_for(main(), 30))


async def _unlink_call_out(linking: LinkManager, link: Any) -> "asyncio.Future[tuple[int, list[int]]]":
    """``linking`` unlinks the link to P, as a task, returned once its unlink call is out, waiting for its answer."""
    ours = asyncio.ensure_future(linking.unlink_clusters([ClusterSpec(P, "127.0.0.1", 1)], 3000, False))
    for _ in range(1000):
        if link.calls._pending:
            return ours
        await asyncio.sleep(0)
    raise AssertionError("the unlink call never went out")


def _warnings_of(caplog: pytest.LogCaptureFixture, cluster: int) -> list[str]:
    """The WARNING lines the engine of ``cluster`` logged (its messages start "cluster N:")."""
    return [r.getMessage() for r in caplog.records
            if r.levelname == "WARNING" and r.getMessage().startswith(f"cluster {cluster}:")]


@pytest.mark.parametrize("end", ["linking", "serving"])
def test_the_channels_end_after_an_unlink_call_is_the_unlink_not_a_fault(end: str,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """The other end finalizes: its unlink call, then its channel's end (``CONTROL_DOWN``), handled in that order in
    one turn of the loop -- before the task answering the call has run, as when a peer closes right after the
    answer. This end lets the link go as unlinked, with no "broken" or "went away" warning (a normal run logs
    none)."""

    async def main() -> None:
        async with Pair() as pair:
            serving, linking = pair.links
            assert await pair.link() == (0, [0])
            manager, link, cluster = ((linking, linking.links[P], D) if end == "linking"
                                      else (serving, serving.served[D], P))
            manager.calls._on_control(link, CONTROL_CALL, ownerwire.encode_call(UnlinkCmd(1)))
            manager.calls._on_control(link, CONTROL_DOWN, b"the peer closed the connection")
            assert link.state == LinkState.ESTABLISHED, link.reason
            assert await _until(lambda: link.calls.closed)   # torn down by the answer to the unlink call
            assert not _warnings_of(caplog, cluster), caplog.text

    asyncio.run(main())


def test_two_ends_unlinking_at_once_both_succeed() -> None:
    """The serving end finalizes (its unlink call reaches this end) while this end unlinks: this end's own unlink
    call is closed by the teardown the other's caused. Both ends meant the same: ``unlink_clusters`` succeeds,
    not ``LLM_NOTIFY_PROMPT_UNLINK_FAILED``."""

    async def main() -> None:
        async with Pair() as pair:
            serving, linking = pair.links
            assert await pair.link() == (0, [0])
            link = linking.links[P]
            ours = await _unlink_call_out(linking, link)
            linking.calls._on_control(link, CONTROL_CALL, ownerwire.encode_call(UnlinkCmd(1)))   # theirs crosses it
            assert await ours == (0, [0])
            assert link.calls.closed and P not in linking.links

    asyncio.run(main())


def test_the_channels_end_after_this_ends_unlink_is_no_fault(caplog: pytest.LogCaptureFixture) -> None:
    """This end unlinks; the other end answers and closes the channel, whose end (``CONTROL_DOWN``) this end may
    handle before the task awaiting the answer resumed: no "broken" warning, and the unlink succeeds."""

    async def main() -> None:
        async with Pair() as pair:
            _, linking = pair.links
            assert await pair.link() == (0, [0])
            link = linking.links[P]
            ours = await _unlink_call_out(linking, link)
            (command_id,) = link.calls._pending
            linking.calls._on_control(link, CONTROL_REPLY, ownerwire.encode_reply(OwnerReply(command_id)))
            linking.calls._on_control(link, CONTROL_DOWN, b"the peer closed the connection")
            assert await ours == (0, [0])
            assert not _warnings_of(caplog, D), caplog.text

    asyncio.run(main())


# ---- liveness: one heartbeat per pair of daemons ---------------------------------------------------------------

HEARTBEAT_S = 0.05
LINKED = 8


class Many:
    """``LINKED`` decoder engines of node ``d`` linked to one prompt engine of node ``p``: links between one pair of
    daemons, the heartbeat every ``HEARTBEAT_S``."""

    def __init__(self, linked: bool = True) -> None:
        self.linked = linked

    async def __aenter__(self) -> "Many":
        cfg = {"peer.secret": "s3cret", "peer.heartbeat_seconds": str(HEARTBEAT_S)}
        self.p = Node(Config().with_overrides(cfg))
        self.d = Node(Config().with_overrides(cfg), peer_connector=lambda address: InProcessPeer(self.ps.links,
                                                                                                 address))
        opts = {"llm.MemPoolConfig": POOL, "llm.EnableRemoteCacheAccessible": "1"}
        self.ps = await self.p.init_engine(P, Role.PROMPT, opts, worker_session(self.p))
        self.ds = [await self.d.init_engine(100 + k, Role.DECODER, opts, worker_session(self.d)) for k in range(LINKED)]
        if self.linked:
            await self.link(self.ds)
        return self

    async def link(self, slots: list[Any]) -> None:
        for slot in slots:
            assert await slot.links.link_clusters([ClusterSpec(P, "127.0.0.1", 1)], 3000) == (0, [0])

    async def __aexit__(self, *exc: object) -> None:
        await self.d.close()
        await self.p.close()

    def outbound(self) -> list[OutboundLink]:
        return [slot.links.table.links[P] for slot in self.ds]


async def _passes(node: Node, n: int) -> None:
    """Until the node's heartbeat made ``n`` more passes (bounded: 200 intervals)."""
    until = node.liveness.passes + n
    for _ in range(200 * n):
        if node.liveness.passes >= until:
            return
        await asyncio.sleep(HEARTBEAT_S / 4)
    raise AssertionError("the heartbeat made no pass")


def test_links_to_one_daemon_share_one_heartbeat_and_the_serving_end_keeps_them_all() -> None:
    """Eight links between two daemons: each heartbeat pass pings one of them (before: each link pinged on its own,
    eight per interval), and the serving end, hearing a frame on one link only, keeps all eight past its
    ``3 x interval`` (at least 2 s) silence limit: a frame of the daemon counts for every link of it."""
    async def main() -> None:
        async with Many() as many:
            liveness = many.d.liveness
            assert len({link.peer_daemon for link in many.outbound()}) == 1
            assert many.outbound()[0].peer_daemon == many.p.liveness.daemon_id
            await _passes(many.d, int(2.5 / HEARTBEAT_S))
            assert list(liveness.history) == [1] * len(liveness.history)   # one ping per pass, for eight links
            assert all(link.state == LinkState.ESTABLISHED for link in many.outbound())
            served = many.ps.links.table.served
            assert sorted(served) == [100 + k for k in range(LINKED)]
            assert all(link.peer_daemon == liveness.daemon_id for link in served.values())

    asyncio.run(main())


def test_a_peer_daemon_that_answers_no_heartbeat_breaks_every_link_to_it() -> None:
    """The one ping of a pass times out (the peer daemon is hung: it holds its connections and answers nothing):
    every link to that daemon is broken then, each link's owner calls closed -- not one link per interval."""
    async def main() -> None:
        async with Many() as many:
            async def hung(timeout: float) -> None:
                raise DataDistError(S.LLM_TIMEOUT, "no answer")

            for link in many.outbound():
                link.calls.ping = hung   # type: ignore[method-assign]
            passes = many.d.liveness.passes
            # two passes: the one under way when the pings were replaced may end with a real answer (a slow machine)
            await _passes(many.d, 2)
            liveness = many.d.liveness
            recent = list(liveness.history)[len(liveness.history) - (liveness.passes - passes):]
            assert sum(recent) <= 2, recent   # one ping a pass broke them all (per link: 8, one link a pass)
            assert all(link.state == LinkState.BROKEN and "did not answer" in link.reason for link in many.outbound())
            assert all(link.calls.closed for link in many.outbound())

    asyncio.run(main())


def test_a_link_whose_own_channel_failed_is_broken_alone_and_the_next_one_asked() -> None:
    """The heartbeat's link failed by itself (its channel, not its daemon): that link is broken, the pass asks
    the next link of the daemon, which answers, and the others stay up."""
    async def main() -> None:
        async with Many() as many:
            first = many.outbound()[0]

            async def lost(timeout: float) -> None:
                raise DataDistError(S.LLM_LINK_FAILED, "channel gone")

            first.calls.ping = lost   # type: ignore[method-assign]
            passes = many.d.liveness.passes
            # three passes: the one under way when the ping was replaced may have pinged the first link already
            # and ended with its real answer (a slow machine), so the failing pass is the first or the second
            await _passes(many.d, 3)
            assert first.state == LinkState.BROKEN
            assert all(link.state == LinkState.ESTABLISHED for link in many.outbound()[1:])
            liveness = many.d.liveness
            since = list(liveness.history)[len(liveness.history) - (liveness.passes - passes):]
            at = 0 if since[0] == 2 else 1
            assert since[at:at + 2] == [2, 1], since   # the failed link and the next one, then one
            assert since[:at] in ([], [1]), since

    asyncio.run(main())


def _fds_and_readers() -> tuple[int, int]:
    """This process's open fds, and its tcp data-plane threads (the readers' pool, accept loops, stripe senders;
    before, a reader per connection too)."""
    import os
    import threading

    return len(os.listdir("/proc/self/fd")), sum(1 for t in threading.enumerate() if t.name.startswith("datadist-tcp"))


def test_a_link_holds_one_fd_and_no_thread_at_each_end() -> None:
    """Both daemons in this process: four links and then four more add one fd per link end (default ``[transport]
    streams``: one connection; before, four) and no data-plane thread: the readers are the process's pool, made
    with its first transport (before: a reader thread per connection at each end)."""
    async def main() -> None:
        async with Many(linked=False) as many:
            await many.link(many.ds[:4])
            fds, threads = _fds_and_readers()
            await many.link(many.ds[4:])
            more_fds, more_threads = _fds_and_readers()
            assert more_fds - fds == 2 * 4          # two ends of four links, one connection each
            assert more_threads == threads
            assert sum(1 for t in threading.enumerate() if t.name.startswith(f"{THREAD_PREFIX}#")) == reactor().size

    asyncio.run(main())
