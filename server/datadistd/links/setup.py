"""Setting links up and tearing them down, at either end: the handshake (challenge, offer, answer), same-daemon
links, heartbeats, unlink."""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import time
from typing import Awaitable, Callable, Sequence

from ..authz import REMOTE, authorize_displace, authorize_local_link
from ..core.errors import DataDistError, StatusCode, require
from ..peering import (
    PROTOCOL_VERSION,
    HandshakeAnswer,
    HandshakeOffer,
    answer_mac,
    data_token,
    make_offer,
    offer_mac,
)
from ..reverse import (
    ReverseHub,
)
from ..transport.base import CallChannel, CallTransport
from .core import LinkCore
from .model import (
    MAX_CLUSTERS_PER_CALL,
    ClusterSpec,
    InboundLink,
    Link,
    LinkState,
    LocalLink,
    OutboundLink,
    ServingEnd,
    _overall,
)

log = logging.getLogger("datadistd.links")


class LinkSetup(LinkCore):
    async def link_clusters(self, clusters: Sequence[ClusterSpec], timeout_ms: int,
                            reasons: list[str] | None = None) -> tuple[int, list[int]]:
        """The overall code and one per cluster; ``reasons`` (if given) gets one message per cluster ("" when
        it linked), so the worker learns why a link failed, not only that it did."""
        require(len(clusters) > 0, "clusters must not be empty")
        require(timeout_ms > 0, f"timeout must be > 0 ms, got {timeout_ms}")
        if len(clusters) > MAX_CLUSTERS_PER_CALL:
            code = int(StatusCode.LLM_CLUSTER_NUM_EXCEED_LIMIT)
            return code, [code] * len(clusters)
        deadline = time.monotonic() + timeout_ms / 1000
        results = await asyncio.gather(*(self._attempt(self._link_one, c, deadline) for c in clusters))
        if reasons is not None:
            reasons.extend(reason for _, reason in results)
        codes = [code for code, _ in results]
        return _overall(codes), codes

    async def link_one(self, spec: ClusterSpec, deadline: float) -> int:
        """Link one cluster by ``deadline``: its status code (``LLM_PROCESSING_LINK`` while another call is
        linking it); for callers that retry (comm domains)."""
        return await self._guarded(self._link_one, spec, deadline)

    async def drop_link(self, link: Link, notify: bool, deadline: float) -> None:
        """Tear down ``link`` (either end); ``notify``: tell the other end too (its failure is raised)."""
        await self._close_link(link, notify=notify, deadline=deadline)

    async def _guarded(self, fn: Callable[[ClusterSpec, float], Awaitable[None]], spec: ClusterSpec,
                       deadline: float) -> int:
        return (await self._attempt(fn, spec, deadline))[0]

    async def _attempt(self, fn: Callable[[ClusterSpec, float], Awaitable[None]], spec: ClusterSpec,
                       deadline: float) -> tuple[int, str]:
        """``fn(spec, deadline)`` unless another call is at it: its status code and, when it failed, why."""
        cid = spec.remote_cluster_id
        if cid in self.pending:
            return int(StatusCode.LLM_PROCESSING_LINK), f"another call is linking or unlinking cluster {cid}"
        self.pending.add(cid)
        try:
            await fn(spec, deadline)
            return int(StatusCode.LLM_SUCCESS), ""
        except DataDistError as exc:
            log.warning("cluster %s: %s cluster %s at %s failed: %s", self.cluster_id, fn.__name__.strip("_"),
                        cid, spec.address, exc)
            return int(exc.code), exc.message
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
        link = OutboundLink(remote_cluster=cid, transport=self.transport.label, session=answer.session,
                            address=spec.address, data_endpoint=answer.data_endpoint, peer=peer, channel=channel,
                            token=token)
        if self.node.call_codec is not None and isinstance(channel, CallChannel):
            link.frames = self._frame_calls(link)
            channel.on_control(self._control_handler(link))
        link.heartbeat = asyncio.get_running_loop().create_task(self._heartbeat(link))
        link.reverse_task = asyncio.get_running_loop().create_task(self._serve_reverse(link))
        self.links[cid] = link
        log.info("cluster %s linked to cluster %s at %s: transport=%s data=%s streams=%d", self.cluster_id, cid,
                 spec.address, self.transport.label, answer.data_endpoint, streams)

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

    def _link_local(self, spec: ClusterSpec, server: LinkCore) -> None:
        authorize_local_link(self.node.principal(self), self.node.principal(server))   # before anything is said
        if server.cluster_id != spec.remote_cluster_id:
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                f"cluster id mismatch: expected cluster {spec.remote_cluster_id} at {spec.address}, "
                                f"found cluster {server.cluster_id}")
        session = os.urandom(16)
        self.links[spec.remote_cluster_id] = LocalLink(remote_cluster=spec.remote_cluster_id, transport="local",
                                                       session=session, address=spec.address, local_peer=server,
                                                       linking=True)
        serving = LocalLink(remote_cluster=self.cluster_id, transport="local", session=session, local_peer=self,
                            linking=False)
        old = server.served.get(self.cluster_id)
        authorize_displace(self.cluster_id, _origin(old), self)
        if old is not None:
            server._drop_serving(old)
        server.served[self.cluster_id] = serving
        log.info("cluster %s linked to cluster %s at %s: transport=local (same daemon)", self.cluster_id,
                 spec.remote_cluster_id, spec.address)

    async def _heartbeat(self, link: OutboundLink) -> None:
        interval = self.node.heartbeat_seconds
        while link.state == LinkState.ESTABLISHED and not self.closed:
            await asyncio.sleep(interval)
            if link.channel.broken:
                self._mark_broken(link, "data channel closed")
                return
            try:
                await link.peer.ping(link.session, max(interval, 1.0))
                link.last_seen = time.monotonic()
            except DataDistError as exc:
                self._mark_broken(link, f"heartbeat failed: {exc}")
                return
            except asyncio.CancelledError:
                raise

    def serve_challenge(self, client: int, server: int, source: str = "") -> bytes:
        """Serving side, first step of a link: a single-use challenge for the handshake that follows
        (``source``: who asked, ``admission.source_key``, for the store's fair share)."""
        require(not self.closed, "engine is finalized", StatusCode.LLM_ENGINE_FINALIZED)
        if server != self.cluster_id:   # the caller is unauthenticated: this engine's cluster id is not said
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                f"cluster id mismatch: the linking side expects cluster {server}, which is not "
                                "the cluster of the engine at this address")
        return self._challenges.issue(source)

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
        authorize_displace(offer.client_cluster_id, _origin(old), REMOTE)
        if old is not None:  # the linking side relinks (e.g. after a restart): the new link replaces the old
            self._drop_serving(old)
        session = os.urandom(16)
        token = data_token(self.node.secret, session)
        self.transport.allow(token)
        link = InboundLink(remote_cluster=offer.client_cluster_id, transport=self.transport.label, session=session,
                           token=token, data_endpoint=self.transport.endpoint,
                           reverse=ReverseHub(offer.client_cluster_id))
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
        if isinstance(link, OutboundLink) and link.reverse_task is not None:
            link.reverse_task.cancel()
        if link.frames is not None:
            link.frames.close("unlinked")
        failure: DataDistError | None = None
        if isinstance(link, LocalLink):
            other = link.local_peer
            for table in (other.links, other.served):
                peer_side = table.get(self.cluster_id)
                if peer_side is not None and peer_side.session == link.session:
                    del table[self.cluster_id]
            if self.served.get(link.remote_cluster) is link:
                del self.served[link.remote_cluster]
        elif isinstance(link, OutboundLink):
            if notify and link.state == LinkState.ESTABLISHED:
                try:
                    remaining = (deadline or time.monotonic() + 1) - time.monotonic()
                    await link.peer.unlink(link.session, max(0.1, remaining))
                except DataDistError as exc:
                    failure = DataDistError(StatusCode.LLM_NOTIFY_PROMPT_UNLINK_FAILED,
                                            f"local end removed, but the serving side was not told: {exc}")
            await self._in_thread(link.channel.close)
            await link.peer.close()
        else:
            assert isinstance(link, InboundLink)
            hub = link.reverse
            # a reverse path not attached yet (a link just made) is waited for within the deadline
            if notify and link.state == LinkState.ESTABLISHED and not hub.closed:
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

    async def check_link(self, cluster: int, timeout_ms: int | None = None) -> None:
        """v1 ``check_link_status``: raise when the link to ``cluster`` is missing, busy or broken."""
        link = self.links_to(cluster)
        if link is None:
            raise DataDistError(StatusCode.LLM_NOT_YET_LINK,
                                f"cluster {self.cluster_id} has no link to cluster {cluster}")
        if link.pulls or link.layerwise:
            raise DataDistError(StatusCode.LLM_LINK_BUSY, f"transfers are running on the link to cluster {cluster}")
        channel = self._channel_of(link)
        if link.state == LinkState.ESTABLISHED and channel is not None and channel.broken:
            self._mark_broken(link, "data channel closed")
        if isinstance(link, OutboundLink) and link.state == LinkState.ESTABLISHED:
            timeout = (timeout_ms or self.engine.options.sync_kv_timeout_ms) / 1000
            try:
                await link.peer.ping(link.session, timeout)
                link.last_seen = time.monotonic()
            except DataDistError as exc:
                self._mark_broken(link, f"check_link_status: {exc}")
        if link.state == LinkState.BROKEN:
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                f"the link to cluster {cluster} is broken ({link.reason}); unlink and link again")


def _origin(link: ServingEnd | None) -> object | None:
    """Who set up a served link (``authz.authorize_displace``): a peer daemon, or a linking engine here."""
    if link is None:
        return None
    return REMOTE if isinstance(link, InboundLink) else link.local_peer
