"""Links of one engine, and the transfers that run over them.

A link is set up by the *linking* engine (``link_clusters`` on the decoder, typically) towards a
*serving* engine (one that set ``listen_ip_info``): an authenticated Peer handshake, then a data
channel of several connections, then the reverse control path (``reverse.py``). As in CANN, a
link then has two ends and **either end may pull and push** over it, single and layer-wise; the
roles of client and server say nothing about prompt and decoder. A pull asks the owner at the
other end to ``Read`` (bytes flow back over the data channel, straight into the destination), a
push asks it to ``OpenWrite`` and then streams the bytes to it. The linking end reaches the owner
through the peer's ``Peer`` service, the serving end through the reverse path; the transfer code
is the same (``_calls``). Unlinking either end tears down both. When both engines live in this
daemon the link is ``local`` and transfers are plain memory copies.

Deadlines: every transfer has ``sync_kv_timeout`` (or the call's timeout); a peer that is
unreachable or breaks mid-transfer ends the call with ``LLM_TIMEOUT`` (CANN's "the link is
unrecoverable, re-link" code) and marks the link ``broken``; ``link_clusters`` on a broken link
re-establishes it.
"""

from __future__ import annotations

import asyncio
import enum
import hmac
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Protocol, Sequence, TypeVar

from datadist.status import LLMStatusCode

from .core.errors import DataDistError, StatusCode, require
from .core.plan import TransferOrder, plan_pull, plan_push
from .core.registry import CacheEntry
from .core.types import CacheId, CacheKeyRef, IdIndexRef, RemoteSpec, TransferId
from .engine import Engine, segments_of, tensors_of
from .memory.base import Segment
from .memory.copy import copy_segments
from .metrics import DaemonMetrics, track_transfer
from .peering import (
    PROTOCOL_VERSION,
    ChallengeStore,
    HandshakeAnswer,
    HandshakeOffer,
    PeerClient,
    answer_mac,
    data_token,
    make_offer,
    offer_mac,
)
from .reverse import (
    CallCodec,
    CommitWriteCmd,
    FrameCalls,
    OpenWriteCmd,
    ReadCmd,
    ReleaseCmd,
    ReverseCmd,
    ReverseHub,
    ReverseReply,
    UnlinkCmd,
)
from .transport.base import CONTROL_CALL, CONTROL_REPLY, CallChannel, CallTransport, Channel, Receipt, Transport

__all__ = ["LinkManager", "Link", "LinkState", "ClusterSpec", "NodeContext", "MAX_CLUSTERS_PER_CALL"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

MAX_CLUSTERS_PER_CALL = 16


class LinkState(str, enum.Enum):
    ESTABLISHED = "established"
    BROKEN = "broken"


@dataclass(frozen=True)
class ClusterSpec:
    remote_cluster_id: int
    remote_ip: str = ""
    remote_port: int = 0
    local_ip: str = ""

    @property
    def address(self) -> str:
        host = f"[{self.remote_ip}]" if ":" in self.remote_ip else self.remote_ip
        return f"{host}:{self.remote_port}"


@dataclass
class Link:
    remote_cluster: int
    initiator: bool
    transport: str
    session: bytes
    address: str = ""
    data_endpoint: str = ""
    peer: PeerClient | None = None
    channel: Channel | None = None
    token: bytes = b""
    local_peer: "LinkManager | None" = None
    state: LinkState = LinkState.ESTABLISHED
    reason: str = ""
    inflight: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    last_seen: float = field(default_factory=time.monotonic)
    heartbeat: "asyncio.Task[None] | None" = None
    reverse: "ReverseHub | None" = None             # serving end: its owner calls to the linking end
    reverse_task: "asyncio.Task[None] | None" = None  # linking end: answers the serving end's calls
    pulls: int = 0                                  # pulls in flight (LLM_LINK_BUSY rules, docs/spec.md §1.4)
    layerwise: int = 0                              # transfer_cache_async tasks using this link
    frames: "FrameCalls | None" = None              # owner calls as data-channel frames (both ends; protocol 2)


@dataclass
class _PendingWrite:
    receipt: Receipt
    cache_id: int
    deadline: float
    link: Link
    blocks: int = 0


class NodeContext(Protocol):
    """What a link manager needs from its daemon."""

    secret: bytes
    version: str
    streams: int
    heartbeat_seconds: float
    peer_connector: Callable[[str], PeerClient]
    executor: object
    call_codec: "CallCodec | None"
    metrics: "DaemonMetrics | None"     # owner-side transfers are counted here, whichever path asked

    def local_links_at(self, address: str) -> "LinkManager | None": ...


class LinkManager:
    def __init__(self, engine: Engine, transport: Transport, node: NodeContext) -> None:
        self.engine = engine
        self.transport = transport
        self.node = node
        self.links: dict[int, Link] = {}       # links this engine set up (it is their linking end)
        self.served: dict[int, Link] = {}      # links other engines set up to this one (their serving end)
        self.sessions: dict[bytes, Link] = {}
        self.pending: set[int] = set()
        self.writes: dict[int, _PendingWrite] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._busy = 0              # executor jobs (sends, receipt waits, copies) touching cache memory
        self.closed = False
        self._challenges = ChallengeStore()     # what serve_challenge issued; serve_handshake redeems each once
        self._jobs: set[asyncio.Task[None]] = set()   # owner calls that came as frames, running

    # ---- helpers -----------------------------------------------------------------------------

    @property
    def cluster_id(self) -> int:
        return self.engine.cluster_id

    async def _in_thread(self, fn: Callable[..., _T], *args: object) -> _T:
        loop = asyncio.get_running_loop()
        self._busy += 1
        try:
            return await loop.run_in_executor(self.node.executor, lambda: fn(*args))
        finally:
            self._busy -= 1

    def start(self) -> None:
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def _sweep(self) -> None:
        """Drop serving links whose linking daemon vanished; expire abandoned writes."""
        interval = max(0.2, min(1.0, self.node.heartbeat_seconds / 2))
        stale_after = max(3 * self.node.heartbeat_seconds, 2.0)
        while not self.closed:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for link in list(self.sessions.values()):
                channel = self.transport.channel(link.token) if link.token else None
                if (channel is not None and channel.broken) or now - link.last_seen > stale_after:
                    log.warning("cluster %s: linking cluster %s went away (%s); dropping its link", self.cluster_id,
                                link.remote_cluster, "data channel closed" if channel is not None and channel.broken
                                else f"no heartbeat for {now - link.last_seen:.1f}s")
                    self._drop_serving(link)
            for tid, pw in list(self.writes.items()):
                if now > pw.deadline + 1.0:
                    self.writes.pop(tid, None)
                    pw.receipt.cancel()
                    self.engine.unpin(pw.cache_id)

    def all_links(self) -> list[Link]:
        return [*self.links.values(), *self.served.values()]

    def _drop_serving(self, link: Link) -> None:
        if link.reverse is not None:
            link.reverse.close("the link was dropped")
        if link.frames is not None:
            link.frames.close("the link was dropped")
        self.sessions.pop(link.session, None)
        if self.served.get(link.remote_cluster) is link:
            del self.served[link.remote_cluster]
        if link.token:
            self.transport.revoke(link.token)

    def _mark_broken(self, link: Link, reason: str) -> None:
        if link.state != LinkState.BROKEN:
            link.state = LinkState.BROKEN
            link.reason = reason
            if link.frames is not None:
                link.frames.close(reason)
            log.warning("cluster %s: link to cluster %s (%s) broken: %s", self.cluster_id, link.remote_cluster,
                        link.address or link.transport, reason)

    # ---- linking -----------------------------------------------------------------------------

    async def link_clusters(self, clusters: Sequence[ClusterSpec], timeout_ms: int) -> tuple[int, list[int]]:
        require(len(clusters) > 0, "clusters must not be empty")
        require(timeout_ms > 0, f"timeout must be > 0 ms, got {timeout_ms}")
        if len(clusters) > MAX_CLUSTERS_PER_CALL:
            code = int(StatusCode.LLM_CLUSTER_NUM_EXCEED_LIMIT)
            return code, [code] * len(clusters)
        deadline = time.monotonic() + timeout_ms / 1000
        codes = await asyncio.gather(*(self._guarded(self._link_one, c, deadline) for c in clusters))
        return _overall(codes), codes

    async def _guarded(self, fn: Callable[[ClusterSpec, float], Awaitable[None]], spec: ClusterSpec,
                       deadline: float) -> int:
        cid = spec.remote_cluster_id
        if cid in self.pending:
            return int(StatusCode.LLM_PROCESSING_LINK)
        self.pending.add(cid)
        try:
            await fn(spec, deadline)
            return int(StatusCode.LLM_SUCCESS)
        except DataDistError as exc:
            log.warning("cluster %s: %s cluster %s at %s failed: %s", self.cluster_id, fn.__name__.strip("_"),
                        cid, spec.address, exc)
            return int(exc.code)
        finally:
            self.pending.discard(cid)

    async def _link_one(self, spec: ClusterSpec, deadline: float) -> None:
        cid = spec.remote_cluster_id
        require(cid != self.cluster_id, f"cannot link cluster {cid} to itself")
        existing = self.links_to(cid)  # one link per remote cluster, whichever side set it up (CANN)
        if existing is not None:
            if existing.state == LinkState.ESTABLISHED:
                raise DataDistError(StatusCode.LLM_ALREADY_LINK, f"cluster {cid} is already linked")
            await self._close_link(existing, notify=False)
        require(bool(spec.remote_ip) and spec.remote_port > 0,
                f"cluster {cid}: remote_ip_info must name the serving node's listen ip:port")
        local = self.node.local_links_at(spec.address)
        if local is not None and local is not self:
            self._link_local(spec, local)
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DataDistError(StatusCode.LLM_TIMEOUT, f"link timeout before contacting {spec.address}")
        peer = self.node.peer_connector(spec.address)
        try:
            challenge = await peer.challenge(self.cluster_id, cid, remaining)
            offer = make_offer(self.node.secret, self.cluster_id, cid, challenge, self.node.version)
            answer = await peer.handshake(offer, max(deadline - time.monotonic(), 0.001))
            self._verify_answer(offer, answer, spec)
            token = data_token(self.node.secret, answer.session)
            streams = max(1, min(self.node.streams, answer.streams or self.node.streams))
            channel = await self._in_thread(self.transport.connect, answer.data_endpoint, token, streams, deadline)
        except BaseException:
            await peer.close()
            raise
        link = Link(cid, True, self.transport.name, answer.session, spec.address, answer.data_endpoint, peer,
                    channel, token)
        if self.node.call_codec is not None and isinstance(channel, CallChannel):
            link.frames = self._frame_calls(link)
            channel.on_control(self._control_handler(link))
        link.heartbeat = asyncio.get_running_loop().create_task(self._heartbeat(link))
        link.reverse_task = asyncio.get_running_loop().create_task(self._serve_reverse(link))
        self.links[cid] = link
        log.info("cluster %s linked to cluster %s at %s: transport=%s data=%s streams=%d", self.cluster_id, cid,
                 spec.address, self.transport.name, answer.data_endpoint, streams)

    def _verify_answer(self, offer: HandshakeOffer, answer: HandshakeAnswer, spec: ClusterSpec) -> None:
        expected = answer_mac(self.node.secret, offer.challenge, answer.session, answer.server_cluster_id,
                              answer.data_endpoint)
        if not hmac.compare_digest(expected, answer.mac):
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                f"peer at {spec.address} failed to prove the shared secret (check [peer] secret)")
        if answer.protocol_version != PROTOCOL_VERSION:
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                f"protocol version mismatch: this daemon speaks v{PROTOCOL_VERSION}, peer at "
                                f"{spec.address} v{answer.protocol_version}")
        if answer.server_cluster_id != spec.remote_cluster_id:
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                f"cluster id mismatch: expected cluster {spec.remote_cluster_id} at {spec.address}, "
                                f"found cluster {answer.server_cluster_id}")

    def _link_local(self, spec: ClusterSpec, server: "LinkManager") -> None:
        if server.cluster_id != spec.remote_cluster_id:
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                f"cluster id mismatch: expected cluster {spec.remote_cluster_id} at {spec.address}, "
                                f"found cluster {server.cluster_id}")
        session = os.urandom(16)
        self.links[spec.remote_cluster_id] = Link(spec.remote_cluster_id, True, "local", session, spec.address,
                                                  local_peer=server)
        serving = Link(self.cluster_id, False, "local", session, "", local_peer=self)
        old = server.served.get(self.cluster_id)
        if old is not None:
            server._drop_serving(old)
        server.served[self.cluster_id] = serving
        log.info("cluster %s linked to cluster %s at %s: transport=local (same daemon)", self.cluster_id,
                 spec.remote_cluster_id, spec.address)

    async def _heartbeat(self, link: Link) -> None:
        interval = self.node.heartbeat_seconds
        while link.state == LinkState.ESTABLISHED and not self.closed:
            await asyncio.sleep(interval)
            if link.channel is not None and link.channel.broken:
                self._mark_broken(link, "data channel closed")
                return
            try:
                assert link.peer is not None
                await link.peer.ping(link.session, max(interval, 1.0))
                link.last_seen = time.monotonic()
            except DataDistError as exc:
                self._mark_broken(link, f"heartbeat failed: {exc}")
                return
            except asyncio.CancelledError:
                raise

    def serve_challenge(self, client: int, server: int) -> bytes:
        """Serving side, first step of a link: a single-use challenge for the handshake that follows."""
        require(not self.closed, "engine is finalized", StatusCode.LLM_ENGINE_FINALIZED)
        if server != self.cluster_id:
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                f"cluster id mismatch: the linking side expects cluster {server}, "
                                f"this engine is cluster {self.cluster_id}")
        return self._challenges.issue()

    async def serve_handshake(self, offer: HandshakeOffer) -> HandshakeAnswer:
        """Serving side of ``link_clusters``: authenticate, record the link, open the data plane."""
        require(not self.closed, "engine is finalized", StatusCode.LLM_ENGINE_FINALIZED)
        expected = offer_mac(self.node.secret, offer.protocol_version, offer.client_cluster_id,
                             offer.server_cluster_id, offer.timestamp_ms, offer.challenge)
        if not hmac.compare_digest(expected, offer.mac):
            log.warning("cluster %s: refused a handshake from cluster %s: bad credential", self.cluster_id,
                        offer.client_cluster_id)
            raise DataDistError(StatusCode.LLM_LINK_FAILED, "authentication failed: wrong or missing shared secret")
        if offer.protocol_version != PROTOCOL_VERSION:
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                f"protocol version mismatch: peer speaks v{offer.protocol_version}, "
                                f"this daemon v{PROTOCOL_VERSION}")
        if not self._challenges.redeem(offer.challenge):  # replayed, stale, or of an earlier daemon
            log.warning("cluster %s: refused a handshake from cluster %s: challenge unknown, used or expired",
                        self.cluster_id, offer.client_cluster_id)
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                "handshake refused: its challenge is unknown, already used or expired (a replayed "
                                "or stale handshake)")
        if offer.server_cluster_id != self.cluster_id:
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                f"cluster id mismatch: the linking side expects cluster {offer.server_cluster_id}, "
                                f"this engine is cluster {self.cluster_id}")
        require(offer.client_cluster_id != self.cluster_id,
                f"linking cluster id {offer.client_cluster_id} equals this engine's own cluster id")
        old = self.served.get(offer.client_cluster_id)
        if old is not None:  # the linking side relinks (e.g. after a restart): the new link replaces the old
            self._drop_serving(old)
        session = os.urandom(16)
        token = data_token(self.node.secret, session)
        self.transport.allow(token)
        link = Link(offer.client_cluster_id, False, self.transport.name, session, token=token,
                    data_endpoint=self.transport.endpoint, reverse=ReverseHub(offer.client_cluster_id))
        if self.node.call_codec is not None and isinstance(self.transport, CallTransport):
            link.frames = self._frame_calls(link)
            self.transport.on_control(token, self._control_handler(link))
        self.served[offer.client_cluster_id] = link
        self.sessions[session] = link
        log.info("cluster %s accepted a link from cluster %s", self.cluster_id, offer.client_cluster_id)
        endpoint = self.transport.endpoint
        return HandshakeAnswer(PROTOCOL_VERSION, self.cluster_id, session, endpoint, self.node.streams,
                               answer_mac(self.node.secret, offer.challenge, session, self.cluster_id, endpoint),
                               self.node.version)

    def session_link(self, session: bytes) -> Link:
        link = self.sessions.get(session)
        if link is None:
            raise DataDistError(StatusCode.LLM_NOT_YET_LINK, "unknown or expired link session; link first")
        link.last_seen = time.monotonic()
        return link

    def serve_unlink(self, session: bytes) -> None:
        link = self.session_link(session)
        log.info("cluster %s: cluster %s unlinked", self.cluster_id, link.remote_cluster)
        self._drop_serving(link)

    async def unlink_clusters(self, clusters: Sequence[ClusterSpec], timeout_ms: int,
                              force: bool) -> tuple[int, list[int]]:
        require(len(clusters) > 0, "clusters must not be empty")
        require(timeout_ms > 0, f"timeout must be > 0 ms, got {timeout_ms}")
        if len(clusters) > MAX_CLUSTERS_PER_CALL:
            code = int(StatusCode.LLM_CLUSTER_NUM_EXCEED_LIMIT)
            return code, [code] * len(clusters)
        deadline = time.monotonic() + timeout_ms / 1000

        async def one(spec: ClusterSpec, dl: float) -> None:
            link = self.links_to(spec.remote_cluster_id)
            if link is None and force:  # CANN: DestroyEntity of an unknown cluster only logs a warning
                log.warning("cluster %s: force unlink of cluster %s, which is not linked", self.cluster_id,
                            spec.remote_cluster_id)
                return
            if link is None:
                raise DataDistError(StatusCode.LLM_NOT_YET_LINK, f"no link to cluster {spec.remote_cluster_id}")
            if link.inflight:
                raise DataDistError(StatusCode.LLM_LINK_BUSY,
                                    f"{link.inflight} transfers in flight on the link to cluster {link.remote_cluster}")
            await self._close_link(link, notify=not force, deadline=dl)

        one.__name__ = "unlink"
        codes = await asyncio.gather(*(self._guarded(one, c, deadline) for c in clusters))
        return _overall(codes), codes

    async def _close_link(self, link: Link, notify: bool, deadline: float | None = None) -> None:
        if self.links.get(link.remote_cluster) is link:
            del self.links[link.remote_cluster]
        if link.heartbeat is not None:
            link.heartbeat.cancel()
        if link.reverse_task is not None:
            link.reverse_task.cancel()
        if link.frames is not None:
            link.frames.close("unlinked")
        failure: DataDistError | None = None
        if link.local_peer is not None:
            other = link.local_peer
            for table in (other.links, other.served):
                peer_side = table.get(self.cluster_id)
                if peer_side is not None and peer_side.session == link.session:
                    del table[self.cluster_id]
            if self.served.get(link.remote_cluster) is link:
                del self.served[link.remote_cluster]
        elif link.initiator:
            if notify and link.state == LinkState.ESTABLISHED and link.peer is not None:
                try:
                    remaining = (deadline or time.monotonic() + 1) - time.monotonic()
                    await link.peer.unlink(link.session, max(0.1, remaining))
                except DataDistError as exc:
                    failure = DataDistError(StatusCode.LLM_NOTIFY_PROMPT_UNLINK_FAILED,
                                            f"local end removed, but the serving side was not told: {exc}")
            if link.channel is not None:
                await self._in_thread(link.channel.close)
            if link.peer is not None:
                await link.peer.close()
        else:
            hub = link.reverse
            # a reverse path not attached yet (a link just made) is waited for within the deadline
            if notify and link.state == LinkState.ESTABLISHED and hub is not None and not hub.closed:
                try:
                    remaining = (deadline or time.monotonic() + 1) - time.monotonic()
                    await hub.unlink(link.session, max(0.1, remaining))
                except DataDistError as exc:
                    failure = DataDistError(StatusCode.LLM_NOTIFY_PROMPT_UNLINK_FAILED,
                                            f"local end removed, but the linking side was not told: {exc}")
            self._drop_serving(link)
        log.info("cluster %s unlinked cluster %s", self.cluster_id, link.remote_cluster)
        if failure is not None:
            raise failure

    # ---- transfers (requester side) --------------------------------------------------------------

    def _transfer_link(self, cluster: int) -> Link:
        """The link to ``cluster``, whichever end of it this engine is: both ends may pull and push."""
        link = self.links_to(cluster)
        if link is None:
            raise DataDistError(StatusCode.LLM_NOT_YET_LINK,
                                f"cluster {self.cluster_id} has no link to cluster {cluster}")
        if link.state == LinkState.BROKEN:
            raise DataDistError(StatusCode.LLM_TIMEOUT,
                                f"link to cluster {cluster} is broken ({link.reason}); unlink and link again")
        return link

    def _calls(self, link: Link, timeout_ms: int):  # noqa: ANN202 - FrameCalls, PeerClient or ReverseHub
        """The owner calls of the other end of ``link`` and the data channel: frames on the data channel when
        both ends speak them; else the peer's Peer service from the linking end, the reverse path from the
        serving end."""
        calls = link.frames or (link.peer if link.initiator else link.reverse)
        channel = self._channel_of(link)
        if calls is None or channel is None or channel.broken:
            raise self._transfer_failure(link, DataDistError(
                StatusCode.LLM_LINK_FAILED, f"no live data connection to cluster {link.remote_cluster}"), timeout_ms)
        return calls, channel

    def _deadline(self, order: TransferOrder) -> tuple[float, int]:
        timeout_ms = order.timeout_ms or self.engine.options.sync_kv_timeout_ms
        return time.monotonic() + timeout_ms / 1000, timeout_ms

    def _local_entry(self, cache_id: int) -> CacheEntry:
        entry = self.engine.registry.find(CacheId(cache_id))
        if entry is None:
            raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"local cache {cache_id} does not exist")
        return entry

    async def pull(self, order: TransferOrder) -> tuple[int, str]:
        entry = self._local_entry(order.local_cache_id)
        plan = plan_pull(order, entry.desc, entry.is_blocks, self.cluster_id)
        link = self._transfer_link(order.remote.cluster_id)
        deadline, timeout_ms = self._deadline(order)
        dst = segments_of(tensors_of(entry), plan.local_spans)
        if link.layerwise:
            raise DataDistError(StatusCode.LLM_LINK_BUSY, f"a transfer_cache_async task is using the link to "
                                                          f"cluster {link.remote_cluster}; pull after it ends")
        if order.exclusive and link.pulls:
            raise DataDistError(StatusCode.LLM_LINK_BUSY,
                                f"another pull is running on the link to cluster {link.remote_cluster}")
        self.engine.registry.pin(entry.cache_id)
        link.inflight += 1
        link.pulls += 1
        try:
            if link.local_peer is not None:
                await self._local_pull(link, plan.remote, dst)
            else:
                await self._remote_pull(link, plan.remote, dst, deadline, timeout_ms)
            link.bytes_in += plan.nbytes
        finally:
            link.inflight -= 1
            link.pulls -= 1
            self.engine.unpin(entry.cache_id)
        log.debug("cluster %s pulled %d bytes from cluster %s", self.cluster_id, plan.nbytes, link.remote_cluster)
        return plan.nbytes, link.transport

    async def _local_pull(self, link: Link, spec: RemoteSpec, dst: Sequence[Segment]) -> None:
        owner = link.local_peer
        assert owner is not None
        cache_id, src, release = owner.engine.prepare_read(spec)
        try:
            await self._in_thread(copy_segments, dst, src)
        finally:
            owner.engine.unpin(cache_id)
        if release:
            assert isinstance(spec.key, (CacheKeyRef, IdIndexRef))
            owner.engine.release_pulled(spec.key, spec.tensor_start, spec.tensor_count)

    async def _remote_pull(self, link: Link, spec: RemoteSpec, dst: Sequence[Segment], deadline: float,
                           timeout_ms: int) -> None:
        calls, channel = self._calls(link, timeout_ms)
        receipt = self.transport.expect(dst, channel=channel)
        try:
            _, release = await calls.read(link.session, receipt.transfer_id, spec, deadline - time.monotonic())
            if receipt.done:  # the bytes usually land before the answer: no executor hop
                receipt.wait(deadline)
            else:
                await self._in_thread(receipt.wait, deadline)
        except DataDistError as exc:
            receipt.cancel()
            raise self._transfer_failure(link, exc, timeout_ms) from None
        except BaseException:
            receipt.cancel()
            raise
        if release:
            assert isinstance(spec.key, (CacheKeyRef, IdIndexRef))
            try:
                await calls.release(link.session, spec.key, spec.tensor_start, spec.tensor_count,
                                    max(0.5, deadline - time.monotonic()))
            except DataDistError as exc:
                log.warning("cluster %s: pulled key from cluster %s but could not release it: %s", self.cluster_id,
                            link.remote_cluster, exc)

    def _transfer_failure(self, link: Link, exc: DataDistError, timeout_ms: int) -> DataDistError:
        if exc.code in (StatusCode.LLM_LINK_FAILED, StatusCode.LLM_TIMEOUT, StatusCode.LLM_WAIT_PROCESS_TIMEOUT):
            self._mark_broken(link, str(exc))
            return DataDistError(StatusCode.LLM_TIMEOUT,
                                 f"transfer with cluster {link.remote_cluster} failed within {timeout_ms} ms: "
                                 f"{exc.message}; the link is broken, unlink and link again")
        if exc.code == StatusCode.LLM_NOT_YET_LINK:
            self._mark_broken(link, "the peer no longer knows this link")
        return exc

    async def push(self, order: TransferOrder) -> tuple[int, str]:
        entry = self._local_entry(order.local_cache_id)
        plan = plan_push(order, entry.desc, entry.is_blocks, self.cluster_id)
        link = self._transfer_link(order.remote.cluster_id)
        deadline, timeout_ms = self._deadline(order)
        src = segments_of(tensors_of(entry), plan.local_spans)
        self.engine.registry.pin(entry.cache_id)
        link.inflight += 1
        try:
            await self._write_owner(link, plan.remote, src, deadline, timeout_ms)
            link.bytes_out += plan.nbytes
        finally:
            link.inflight -= 1
            self.engine.unpin(entry.cache_id)
        return plan.nbytes, link.transport

    def _channel_of(self, link: Link) -> Channel | None:
        """The data channel of a link: the one this side opened, or the one the linking side opened to it."""
        if link.initiator:
            return link.channel
        return self.transport.channel(link.token) if link.token else None

    async def _write_owner(self, link: Link, spec: RemoteSpec, src: Sequence[Segment], deadline: float,
                           timeout_ms: int) -> None:
        """Push ``src`` into what ``spec`` names at the other end of ``link`` (same daemon, either end)."""
        if link.local_peer is not None:
            owner = link.local_peer.engine
            cache_id, dst = owner.prepare_write(spec)
            try:
                await self._in_thread(copy_segments, dst, src)
            finally:
                owner.unpin(cache_id)
            return
        calls, channel = self._calls(link, timeout_ms)
        try:
            tid = await calls.open_write(link.session, spec, deadline - time.monotonic())
            try:
                await self._in_thread(channel.send, tid, src, deadline)
            except DataDistError:
                channel.abort(tid, LLMStatusCode.LLM_TIMEOUT)
                raise
            await calls.commit_write(link.session, tid, deadline - time.monotonic())
        except DataDistError as exc:
            raise self._transfer_failure(link, exc, timeout_ms) from None

    async def push_pieces(self, cluster: int, cache_id: int, pieces: Sequence[tuple[list, RemoteSpec]],
                          timeout_ms: int | None = None) -> int:
        """Send pieces (spans, owner spec) of local cache ``cache_id`` to ``cluster``: a layer of a layer-wise push."""
        link = self._transfer_link(cluster)
        if link.pulls:
            raise DataDistError(StatusCode.LLM_LINK_BUSY,
                                f"a pull is running on the link to cluster {cluster}; transfer_cache_async and pulls "
                                f"must not overlap on one link")
        timeout_ms = timeout_ms or self.engine.options.sync_kv_timeout_ms
        deadline = time.monotonic() + timeout_ms / 1000
        entry = self.engine.registry.pin(CacheId(cache_id))
        link.inflight += 1
        nbytes = 0
        try:
            for spans, spec in pieces:
                await self._write_owner(link, spec, segments_of(tensors_of(entry), spans), deadline, timeout_ms)
                nbytes += spec.expected_bytes
                link.bytes_out += spec.expected_bytes
        finally:
            link.inflight -= 1
            self.engine.unpin(entry.cache_id)
        return nbytes

    def links_to(self, cluster: int) -> Link | None:
        return self.links.get(cluster) or self.served.get(cluster)

    async def check_link(self, cluster: int, timeout_ms: int | None = None) -> None:
        """v1 ``check_link_status``: raise when the link to ``cluster`` is missing, busy or broken."""
        link = self.links_to(cluster)
        if link is None:
            raise DataDistError(StatusCode.LLM_NOT_YET_LINK,
                                f"cluster {self.cluster_id} has no link to cluster {cluster}")
        if link.pulls or link.layerwise:
            raise DataDistError(StatusCode.LLM_LINK_BUSY, f"transfers are running on the link to cluster {cluster}")
        channel = self._channel_of(link) if link.local_peer is None else None
        if link.state == LinkState.ESTABLISHED and channel is not None and channel.broken:
            self._mark_broken(link, "data channel closed")
        if link.state == LinkState.ESTABLISHED and link.initiator and link.peer is not None:
            timeout = (timeout_ms or self.engine.options.sync_kv_timeout_ms) / 1000
            try:
                await link.peer.ping(link.session, timeout)
                link.last_seen = time.monotonic()
            except DataDistError as exc:
                self._mark_broken(link, f"check_link_status: {exc}")
        if link.state == LinkState.BROKEN:
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                f"the link to cluster {cluster} is broken ({link.reason}); unlink and link again")

    # ---- the reverse path (see reverse.py) --------------------------------------------------------

    # ---- owner calls as data-channel frames ---------------------------------------------------------

    def _frame_calls(self, link: Link) -> FrameCalls:
        codec = self.node.call_codec
        assert codec is not None

        async def send(payload: bytes, deadline: float) -> None:
            await self._control_frame(link, CONTROL_CALL, payload, deadline)

        return FrameCalls(link.remote_cluster, codec, send)

    async def _control_frame(self, link: Link, kind: int, payload: bytes, deadline: float) -> None:
        """One control frame on the link's channel: from the event loop when a connection is idle (no thread
        hop), else from the executor, waiting for a connection until ``deadline``."""
        channel = self._channel_of(link)
        if not isinstance(channel, CallChannel) or channel.broken:
            raise DataDistError(StatusCode.LLM_LINK_FAILED, f"no live data connection to cluster {link.remote_cluster}")
        if not channel.try_control(kind, payload, deadline):
            await self._in_thread(channel.send_control, kind, payload, deadline)

    def _control_handler(self, link: Link) -> Callable[[int, bytes], None]:
        """What the data channel's reader threads call with a control frame: hand it to the event loop."""
        loop = asyncio.get_running_loop()

        def handler(kind: int, payload: bytes) -> None:
            try:
                loop.call_soon_threadsafe(self._on_control, link, kind, payload)
            except RuntimeError:   # the loop is closed: the daemon is stopping
                pass

        return handler

    def _on_control(self, link: Link, kind: int, payload: bytes) -> None:
        codec, frames = self.node.call_codec, link.frames
        if codec is None or frames is None or self.closed:
            return
        try:
            if kind == CONTROL_REPLY:
                frames.on_reply(codec.decode_reply(payload))
                return
            cmd = codec.decode_command(payload)
        except DataDistError as exc:
            log.warning("cluster %s: dropped a control frame of cluster %s: %s", self.cluster_id,
                        link.remote_cluster, exc.message)
            return
        if isinstance(cmd, UnlinkCmd):   # unlinking stays on the control plane (gRPC)
            return

        async def send_reply(reply: ReverseReply) -> None:
            deadline = time.monotonic() + max(1.0, self.engine.options.sync_kv_timeout_ms / 1000)
            await self._control_frame(link, CONTROL_REPLY, codec.encode_reply(reply), deadline)

        job = asyncio.get_running_loop().create_task(self._answer_reverse(link, send_reply, cmd))
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)

    def attach_reverse(self, session: bytes) -> ReverseHub:
        """Serving side: the linking daemon opened the reverse stream of its link."""
        link = self.session_link(session)
        if link.reverse is None:
            raise DataDistError(StatusCode.LLM_NOT_YET_LINK, "this link has no reverse path")
        link.reverse.attach()
        return link.reverse

    async def _serve_reverse(self, link: Link) -> None:
        """Linking side: answer the serving side's owner calls for the life of the link."""
        if link.peer is None:
            return
        stream = None
        jobs: set[asyncio.Task[None]] = set()  # keep references: the loop holds tasks only weakly
        try:
            stream = await link.peer.reverse(link.session)
            async for cmd in stream.commands():
                job = asyncio.get_running_loop().create_task(self._answer_reverse(link, stream.reply, cmd))
                jobs.add(job)
                job.add_done_callback(jobs.discard)
        except DataDistError as exc:
            if link.state == LinkState.ESTABLISHED and not self.closed:
                log.info("cluster %s: reverse path of the link to cluster %s ended: %s", self.cluster_id,
                         link.remote_cluster, exc)
        finally:
            if stream is not None:
                await stream.close()

    async def _answer_reverse(self, link: Link, send_reply: Callable[[ReverseReply], Awaitable[None]],
                              cmd: ReverseCmd) -> None:
        """Run one owner call of the other end (any number run at once) and answer it: the serving end's
        calls on the reverse stream, or either end's as data-channel frames."""
        try:
            if isinstance(cmd, OpenWriteCmd):
                reply = ReverseReply(cmd.command_id, transfer_id=self.open_write_for(link, cmd.spec, cmd.timeout_ms))
            elif isinstance(cmd, CommitWriteCmd):
                await self.commit_write_for(link, cmd.transfer_id, cmd.timeout_ms)
                reply = ReverseReply(cmd.command_id)
            elif isinstance(cmd, ReadCmd):
                nbytes, release = await self.read_for(link, cmd.transfer_id, cmd.spec, cmd.timeout_ms)
                reply = ReverseReply(cmd.command_id, nbytes=nbytes, release_needed=release)
            elif isinstance(cmd, ReleaseCmd):
                self.engine.release_pulled(cmd.key, cmd.tensor_start, cmd.tensor_count)
                reply = ReverseReply(cmd.command_id)
            else:
                assert isinstance(cmd, UnlinkCmd)
                if self.links.get(link.remote_cluster) is link:  # gone before the serving end hears back
                    del self.links[link.remote_cluster]
                reply = ReverseReply(cmd.command_id)
        except DataDistError as exc:
            reply = ReverseReply(cmd.command_id, int(exc.code), exc.message)
        try:
            await send_reply(reply)
        except DataDistError as exc:
            log.info("cluster %s: cannot answer reverse call %s of cluster %s: %s", self.cluster_id,
                     cmd.command_id, link.remote_cluster, exc)
        if isinstance(cmd, UnlinkCmd):
            log.info("cluster %s: cluster %s unlinked from its end", self.cluster_id, link.remote_cluster)
            await self._close_link(link, notify=False)

    # ---- transfers (owner side, called by the Peer service) -----------------------------------

    async def serve_read(self, session: bytes, transfer_id: int, spec: RemoteSpec,
                         timeout_ms: int) -> tuple[int, bool]:
        return await self.read_for(self.session_link(session), transfer_id, spec, timeout_ms)

    async def read_for(self, link: Link, transfer_id: int, spec: RemoteSpec, timeout_ms: int) -> tuple[int, bool]:
        """Owner side of a pull at either end of ``link``: send what ``spec`` names over its data channel."""
        channel = self._channel_of(link)
        if channel is None or channel.broken:
            raise DataDistError(StatusCode.LLM_LINK_FAILED, "no live data connection for this link")
        with track_transfer(self.node.metrics, "serve_read", self.cluster_id, link.remote_cluster) as tracked:
            cache_id, src, release = self.engine.prepare_read(spec)
            timeout = timeout_ms or self.engine.options.sync_kv_timeout_ms
            deadline = time.monotonic() + timeout / 1000
            try:
                # a small read goes out from the event loop when a connection is idle (no executor hop)
                if not channel.try_send(TransferId(transfer_id), src, deadline):
                    await self._in_thread(channel.send, TransferId(transfer_id), src, deadline)
            finally:
                self.engine.unpin(cache_id)
            tracked.done(spec.expected_bytes, len(spec.blocks))
        link.bytes_out += spec.expected_bytes
        return spec.expected_bytes, release

    def serve_release(self, session: bytes, key: CacheKeyRef | IdIndexRef, tensor_start: int,
                      tensor_count: int) -> None:
        self.session_link(session)
        self.engine.release_pulled(key, tensor_start, tensor_count)

    def serve_open_write(self, session: bytes, spec: RemoteSpec, timeout_ms: int) -> int:
        return self.open_write_for(self.session_link(session), spec, timeout_ms)

    def open_write_for(self, link: Link, spec: RemoteSpec, timeout_ms: int) -> int:
        channel = self._channel_of(link)
        if channel is None or channel.broken:
            raise DataDistError(StatusCode.LLM_LINK_FAILED, "no live data connection for this link")
        cache_id, dst = self.engine.prepare_write(spec)
        receipt = self.transport.expect(dst, channel=channel)
        timeout = timeout_ms or self.engine.options.sync_kv_timeout_ms
        self.writes[receipt.transfer_id] = _PendingWrite(receipt, cache_id, time.monotonic() + timeout / 1000, link,
                                                         len(spec.blocks))
        return receipt.transfer_id

    async def serve_commit_write(self, session: bytes, transfer_id: int, timeout_ms: int) -> None:
        await self.commit_write_for(self.session_link(session), transfer_id, timeout_ms)

    async def commit_write_for(self, link: Link, transfer_id: int, timeout_ms: int) -> None:
        pw = self.writes.pop(transfer_id, None)
        if pw is None or pw.link is not link:
            raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"unknown transfer {transfer_id}")
        timeout = timeout_ms or self.engine.options.sync_kv_timeout_ms
        deadline = min(pw.deadline, time.monotonic() + timeout / 1000)
        with track_transfer(self.node.metrics, "serve_write", self.cluster_id, link.remote_cluster) as tracked:
            try:
                await self._in_thread(pw.receipt.wait, deadline)
                link.bytes_in += pw.receipt.expected
                tracked.done(pw.receipt.expected, pw.blocks)
            except DataDistError:
                pw.receipt.cancel()
                raise
            finally:
                self.engine.unpin(pw.cache_id)

    # ---- life cycle ------------------------------------------------------------------------------

    async def close(self) -> None:
        """Engine finalize: tell linked peers (briefly), drop everything, stop the data plane."""
        if self.closed:
            return
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        deadline = time.monotonic() + 1.0
        for link in self.all_links():
            try:
                await self._close_link(link, notify=True, deadline=deadline)
            except DataDistError as exc:
                log.info("cluster %s: finalize: %s", self.cluster_id, exc)
        for pw in self.writes.values():
            pw.receipt.cancel()
        self.writes.clear()
        await self._in_thread(self.transport.stop)  # fails every wait and send still running
        for _ in range(100):  # bounded: let those jobs return before the engine frees memory
            if self._busy == 0:
                break
            await asyncio.sleep(0.05)


def _overall(codes: Sequence[int]) -> int:
    for code in codes:
        if code != StatusCode.LLM_SUCCESS:
            return code
    return int(StatusCode.LLM_SUCCESS)
