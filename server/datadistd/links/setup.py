"""Setting links up and tearing them down, at either end: the handshake (challenge, offer, answer; the only
Peer RPCs), same-daemon links, and unlink (owner calls on the data channel); heartbeats: ``liveness``."""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import random
import time
from typing import Awaitable, Callable, Sequence

from ..core.errors import DataDistError, StatusCode, require
from ..guard.admission import source_key
from ..guard.authz import OWN, REMOTE, authorize_displace, authorize_local_link
from ..ops.config import is_loopback
from ..ops.peersecret import SAME_SECRET_FIX
from .calls import OwnerCalls
from .model import (
    MAX_CLUSTERS_PER_CALL,
    AnyLink,
    ClusterSpec,
    InboundLink,
    Link,
    LinkState,
    LocalLink,
    OutboundLink,
    _overall,
    refuse_too_many,
)
from .table import LinkTable
from .wire.peering import (
    AUTH_FAILED,
    PROTOCOL_VERSION,
    Asker,
    ChallengeStore,
    HandshakeAnswer,
    HandshakeOffer,
    answer_mac,
    check_version,
    data_token,
    make_offer,
    offer_mac,
)

log = logging.getLogger("datadistd.links")

#: the first pause before a link attempt the peer's admission turned away is retried, and the longest
_RETRY_FIRST_S = 0.05
_RETRY_MAX_S = 0.8


class Linker:
    """Establishing and ending the links of one engine, at either end: ``link_clusters`` (handshake, data
    channel, its daemon's heartbeat), the serving side of the handshake, same-daemon links, unlink,
    ``check_link_status``, and telling every other end at engine finalize."""

    def __init__(self, table: LinkTable, calls: OwnerCalls) -> None:
        self.table = table
        self.calls = calls
        self._challenges = ChallengeStore()     # what serve_challenge issued; serve_handshake redeems each once

    async def link_clusters(self, clusters: Sequence[ClusterSpec], timeout_ms: int,
                            reasons: list[str] | None = None) -> tuple[int, list[int]]:
        """The overall code and one per cluster; ``reasons`` (if given) gets one message per cluster ("" when
        it linked), so the worker learns why a link failed, not only that it did."""
        require(len(clusters) > 0, "clusters must not be empty")
        require(timeout_ms > 0, f"timeout must be > 0 ms, got {timeout_ms}")
        if len(clusters) > MAX_CLUSTERS_PER_CALL:
            return _too_many(clusters, reasons)
        deadline = time.monotonic() + timeout_ms / 1000
        results = await asyncio.gather(*(self._attempt(self._link_one, c, deadline) for c in clusters))
        if reasons is not None:
            reasons.extend(reason for _, reason in results)
        codes = [code for code, _ in results]
        return _overall(codes), codes

    async def link_one(self, spec: ClusterSpec, deadline: float) -> int:
        """Link one cluster by ``deadline``: its status code (``LLM_PROCESSING_LINK`` while another call is
        linking it); for callers that retry (comm domains)."""
        return (await self._attempt(self._link_one, spec, deadline))[0]

    async def drop_link(self, link: Link, notify: bool, deadline: float) -> None:
        """Tear down ``link`` (either end); ``notify``: tell the other end too (its failure is raised)."""
        await self._close_link(link, notify=notify, deadline=deadline)

    async def _attempt(self, fn: Callable[[ClusterSpec, float], Awaitable[None]], spec: ClusterSpec,
                       deadline: float) -> tuple[int, str]:
        """``fn(spec, deadline)`` unless another call is at it: its status code and, when it failed, why."""
        cid = spec.remote_cluster_id
        if cid in self.table.pending:
            return int(StatusCode.LLM_PROCESSING_LINK), f"another call is linking or unlinking cluster {cid}"
        self.table.pending.add(cid)
        try:
            await fn(spec, deadline)
            return int(StatusCode.LLM_SUCCESS), ""
        except DataDistError as exc:
            log.warning("cluster %s: %s cluster %s at %s failed: %s", self.table.cluster_id, fn.__name__.strip("_"),
                        cid, spec.address, exc)
            return int(exc.code), exc.message
        finally:
            self.table.pending.discard(cid)

    async def _link_one(self, spec: ClusterSpec, deadline: float) -> None:
        cid = spec.remote_cluster_id
        require(cid != self.table.cluster_id, f"cannot link cluster {cid} to itself")
        existing = self.table.links_to(cid)  # one link per remote cluster, whichever side set it up (CANN)
        if existing is not None:
            if existing.state == LinkState.ESTABLISHED:
                raise DataDistError(StatusCode.LLM_ALREADY_LINK, f"cluster {cid} is already linked")
            await self._close_link(existing, notify=False)
        require(bool(spec.remote_ip) and spec.remote_port > 0,
                f"cluster {cid}: remote_ip_info must name the serving node's listen ip:port")
        local = self.table.node.local_links_at(spec.address)
        if local is not None and local is not self:
            self._link_local(spec, local)
            return
        pause = _RETRY_FIRST_S
        while True:
            try:
                async with self.table.node.link_attempts.hold(spec.address, deadline):
                    await self._link_remote(spec, deadline)
                return
            except DataDistError as exc:
                # the peer's admission turned this attempt away ("retry later": more challenges than it grants an
                # address that has not proved the secret lately): again a moment later, while the deadline allows
                if not exc.retryable or time.monotonic() + pause >= deadline:
                    raise
                log.debug("cluster %s: link to cluster %s at %s: %s; retrying in %.0f ms", self.table.cluster_id,
                          cid, spec.address, exc, pause * 1e3)
            await asyncio.sleep(pause * random.uniform(0.5, 1.0))   # spread: a burst's retries must not bunch
            pause = min(2 * pause, _RETRY_MAX_S)

    async def _link_remote(self, spec: ClusterSpec, deadline: float) -> None:
        """One attempt at a link to another daemon: challenge, handshake, data channel."""
        cid = spec.remote_cluster_id
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DataDistError(StatusCode.LLM_TIMEOUT, f"link timeout before contacting {spec.address}")
        peer = self.table.node.peer_connector(spec.address)
        try:
            challenge = await peer.challenge(self.table.cluster_id, cid, remaining)
            secret = self.table.node.peer_secret
            offer = make_offer(secret.value, self.table.cluster_id, cid, challenge, self.table.node.version,
                               self.table.node.liveness.daemon_id)
            try:
                answer = await peer.handshake(offer, max(deadline - time.monotonic(), 0.001))
            except DataDistError as exc:   # say which secret this side used, and how to make both agree
                if exc.code != StatusCode.LLM_LINK_FAILED or not exc.message.startswith(AUTH_FAILED):
                    raise
                raise DataDistError(StatusCode.LLM_LINK_FAILED, f"{exc.message}; this worker's daemon uses "
                                    f"{secret.describe()}: {SAME_SECRET_FIX}") from None
            self._verify_answer(offer, answer, spec)
            token = data_token(self.table.node.peer_secret.value, answer.link_nonce)
            streams = max(1, min(self.table.node.streams, answer.streams or self.table.node.streams))
            channel = await self.table.in_thread(self.table.transport.connect, answer.data_endpoint, token, streams,
                                                 deadline)
        finally:
            await peer.close()   # the handshake is all the Peer service does: the data channel carries the rest
        link = OutboundLink(remote_cluster=cid, transport=self.table.transport.label, link_nonce=answer.link_nonce,
                            address=spec.address, peer=source_key(spec.remote_ip), data_endpoint=answer.data_endpoint,
                            channel=channel, token=token, peer_daemon=answer.daemon_id,
                            calls=self.calls.frame_calls(cid, lambda: channel))
        channel.on_control(self.calls.control_handler(link))
        self.table.node.liveness.watch(link, self.table)
        self.table.links[cid] = link
        log.info("cluster %s linked to cluster %s at %s: transport=%s data=%s streams=%d", self.table.cluster_id, cid,
                 spec.address, self.table.transport.label, answer.data_endpoint, streams)

    def _verify_answer(self, offer: HandshakeOffer, answer: HandshakeAnswer, spec: ClusterSpec) -> None:
        expected = answer_mac(self.table.node.peer_secret.value, offer.challenge, answer.link_nonce,
                              answer.server_cluster_id, answer.data_endpoint, answer.daemon_id)
        if not hmac.compare_digest(expected, answer.mac):
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                f"peer at {spec.address} failed to prove the shared secret (check [peer] secret)")
        check_version(answer.protocol_version, f"the peer at {spec.address}")
        if answer.server_cluster_id != spec.remote_cluster_id:
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                f"cluster id mismatch: expected cluster {spec.remote_cluster_id} at {spec.address}, "
                                f"found cluster {answer.server_cluster_id}")

    def _link_local(self, spec: ClusterSpec, server: LinkTable) -> None:
        table = self.table
        authorize_local_link(table.node.principal(table), table.node.principal(server))   # before anything is said
        if server.cluster_id != spec.remote_cluster_id:
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                f"cluster id mismatch: expected cluster {spec.remote_cluster_id} at {spec.address}, "
                                f"found cluster {server.cluster_id}")
        old = _holder(server, self.table.cluster_id)
        authorize_displace(self.table.cluster_id, _origin(server, old), self.table)   # before either end exists
        if isinstance(old, (InboundLink, LocalLink)):
            server.drop_serving(old)
        link_nonce = os.urandom(16)
        self.table.links[spec.remote_cluster_id] = LocalLink(remote_cluster=spec.remote_cluster_id, transport="local",
                                                       link_nonce=link_nonce, address=spec.address, local_peer=server,
                                                       linking=True)
        server.served[self.table.cluster_id] = LocalLink(remote_cluster=self.table.cluster_id, transport="local",
                                                         link_nonce=link_nonce, local_peer=self.table, linking=False)
        log.info("cluster %s linked to cluster %s at %s: transport=local (same daemon)", self.table.cluster_id,
                 spec.remote_cluster_id, spec.address)

    def serve_challenge(self, client: int, server: int, asker: Asker | None = None) -> bytes:
        """Serving side, first step of a link: a single-use challenge for the handshake that follows
        (``asker``: the connection it was asked on, the front's admission ticket: ``ChallengeStore``)."""
        require(not self.table.closed, "engine is finalized", StatusCode.LLM_ENGINE_FINALIZED)
        if server != self.table.cluster_id:   # the caller is unauthenticated: this engine's cluster id is not said
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                f"cluster id mismatch: the linking side expects cluster {server}, which is not "
                                "the cluster of the engine at this address")
        return self._challenges.issue(asker)

    async def serve_handshake(self, offer: HandshakeOffer, source: str = "") -> HandshakeAnswer:
        """Serving side of ``link_clusters``: authenticate, record the link, open the data plane (``source``:
        the linking daemon's address, ``admission.source_key``: its owner calls' share of the threads)."""
        require(not self.table.closed, "engine is finalized", StatusCode.LLM_ENGINE_FINALIZED)
        expected = offer_mac(self.table.node.peer_secret.value, offer.protocol_version, offer.client_cluster_id,
                             offer.server_cluster_id, offer.timestamp_ms, offer.challenge, offer.daemon_id)
        if not hmac.compare_digest(expected, offer.mac):
            secret = self.table.node.peer_secret
            log.warning("cluster %s: refused a handshake from cluster %s at %s: bad credential; this daemon uses %s",
                        self.table.cluster_id, offer.client_cluster_id, source or "an unknown address",
                        secret.describe())
            # which secret this side uses is told to this host's daemons only (its fingerprint is a slow, short
            # hash; other hosts read it in this log): an unauthenticated caller learns nothing new of it
            told = secret.describe() if source and is_loopback(source) else "the secret its log names"
            raise DataDistError(StatusCode.LLM_LINK_FAILED, f"{AUTH_FAILED}: the serving daemon uses {told}")
        check_version(offer.protocol_version, f"linking cluster {offer.client_cluster_id}")
        if not self._challenges.redeem(offer.challenge):  # replayed, stale, or of an earlier daemon
            log.warning("cluster %s: refused a handshake from cluster %s: challenge unknown, used or expired",
                        self.table.cluster_id, offer.client_cluster_id)
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                "handshake refused: its challenge is unknown, already used or expired (a replayed "
                                "or stale handshake)")
        if offer.server_cluster_id != self.table.cluster_id:
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                f"cluster id mismatch: the linking side expects cluster {offer.server_cluster_id}, "
                                f"this engine is cluster {self.table.cluster_id}")
        require(offer.client_cluster_id != self.table.cluster_id,
                f"linking cluster id {offer.client_cluster_id} equals this engine's own cluster id")
        old = _holder(self.table, offer.client_cluster_id)
        authorize_displace(offer.client_cluster_id, _origin(self.table, old), REMOTE)
        if isinstance(old, (InboundLink, LocalLink)):  # the linking side relinks (e.g. after a restart): replaced
            self.table.drop_serving(old)
        link_nonce = os.urandom(16)
        token = data_token(self.table.node.peer_secret.value, link_nonce)
        self.table.transport.allow(token)
        transport = self.table.transport
        link = InboundLink(remote_cluster=offer.client_cluster_id, transport=transport.label, link_nonce=link_nonce,
                           token=token, data_endpoint=transport.endpoint, peer=source, peer_daemon=offer.daemon_id,
                           calls=self.calls.frame_calls(offer.client_cluster_id, lambda: transport.channel(token)))
        transport.on_control(token, self.calls.control_handler(link))
        self.table.served[offer.client_cluster_id] = link
        self.table.watch()   # its sweeper looks after it from now on (a linking daemon that vanishes)
        log.info("cluster %s accepted a link from cluster %s", self.table.cluster_id, offer.client_cluster_id)
        endpoint = self.table.transport.endpoint
        node = self.table.node
        mac = answer_mac(node.peer_secret.value, offer.challenge, link_nonce, self.table.cluster_id, endpoint,
                         node.liveness.daemon_id)
        return HandshakeAnswer(PROTOCOL_VERSION, self.table.cluster_id, link_nonce, endpoint, node.streams, mac,
                               node.version, node.liveness.daemon_id)

    async def unlink_clusters(self, clusters: Sequence[ClusterSpec], timeout_ms: int, force: bool,
                              reasons: list[str] | None = None) -> tuple[int, list[int]]:
        """As ``link_clusters``: the overall code, one per cluster, and (into ``reasons``) why each one failed."""
        require(len(clusters) > 0, "clusters must not be empty")
        require(timeout_ms > 0, f"timeout must be > 0 ms, got {timeout_ms}")
        if len(clusters) > MAX_CLUSTERS_PER_CALL:
            return _too_many(clusters, reasons)
        deadline = time.monotonic() + timeout_ms / 1000

        async def one(spec: ClusterSpec, dl: float) -> None:
            link = self.table.links_to(spec.remote_cluster_id)
            went = self.table.take_peer_unlinked(spec.remote_cluster_id)
            if link is None and went:
                log.info("cluster %s: unlink of cluster %s, which had unlinked from its end already",
                         self.table.cluster_id, spec.remote_cluster_id)
                return
            if link is None and force:  # CANN: DestroyEntity of an unknown cluster only logs a warning
                log.warning("cluster %s: force unlink of cluster %s, which is not linked", self.table.cluster_id,
                            spec.remote_cluster_id)
                return
            if link is None:
                raise DataDistError(StatusCode.LLM_NOT_YET_LINK, f"no link to cluster {spec.remote_cluster_id}")
            if link.inflight:
                raise DataDistError(StatusCode.LLM_LINK_BUSY,
                                    f"{link.inflight} transfers in flight on the link to cluster {link.remote_cluster}")
            await self._close_link(link, notify=not force, deadline=dl)

        one.__name__ = "unlink"
        results = await asyncio.gather(*(self._attempt(one, c, deadline) for c in clusters))
        if reasons is not None:
            reasons.extend(reason for _, reason in results)
        codes = [code for code, _ in results]
        return _overall(codes), codes

    async def _close_link(self, link: Link, notify: bool, deadline: float | None = None) -> None:
        """Tear down this end of ``link``; ``notify``: tell the other end first (an unlink call on the data channel;
        its failure is raised once this end is gone)."""
        failure: DataDistError | None = None
        link.unlinking = True   # the channel's end from here on is this teardown's, not a fault (``channel_went``)
        if isinstance(link, (OutboundLink, InboundLink)) and notify and link.state == LinkState.ESTABLISHED \
                and not link.calls.closed:
            try:
                remaining = (deadline or time.monotonic() + 1) - time.monotonic()
                await link.calls.unlink(max(0.1, remaining))
            except DataDistError as exc:
                if link.unlinked_by_peer:   # the two ends unlinked at once: the other end's call crossed ours
                    log.info("cluster %s: cluster %s unlinked from its end while this end did", self.table.cluster_id,
                             link.remote_cluster)
                else:
                    other_end = "serving" if isinstance(link, OutboundLink) else "linking"
                    failure = DataDistError(StatusCode.LLM_NOTIFY_PROMPT_UNLINK_FAILED,
                                            f"local end removed, but the {other_end} side was not told: {exc}")
        await self.table.forget(link)
        if failure is not None:
            raise failure

    async def close(self) -> None:
        """Engine finalize: tell linked peers (briefly), drop everything, stop the data plane."""
        if self.table.closed:
            return
        self.table.closed = True
        deadline = time.monotonic() + 1.0
        for link in self.table.all_links():
            try:
                await self._close_link(link, notify=True, deadline=deadline)
            except DataDistError as exc:
                log.info("cluster %s: finalize: %s", self.table.cluster_id, exc)
        await self.table.stop()

    async def check_link(self, cluster: int, timeout_ms: int | None = None) -> None:
        """v1 ``check_link_status``: raise when the link to ``cluster`` is missing, busy or broken."""
        link = self.table.links_to(cluster)
        if link is None:
            raise DataDistError(StatusCode.LLM_NOT_YET_LINK,
                                f"cluster {self.table.cluster_id} has no link to cluster {cluster}")
        if link.pulls or link.layerwise:
            raise DataDistError(StatusCode.LLM_LINK_BUSY, f"transfers are running on the link to cluster {cluster}")
        channel = self.table.channel_of(link)
        if link.state == LinkState.ESTABLISHED and channel is not None and channel.broken:
            self.table.mark_broken(link, "data channel closed")
        if isinstance(link, (OutboundLink, InboundLink)) and link.state == LinkState.ESTABLISHED:
            timeout = (timeout_ms or self.table.engine.options.sync_kv_timeout_ms) / 1000
            try:
                await link.calls.ping(timeout)
                link.last_seen = time.monotonic()
            except DataDistError as exc:
                self.table.mark_broken(link, f"check_link_status: {exc}")
        if link.state == LinkState.BROKEN:
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                f"the link to cluster {cluster} is broken ({link.reason}); unlink and link again")


def _too_many(clusters: Sequence[ClusterSpec], reasons: list[str] | None) -> tuple[int, list[int]]:
    """A call naming more clusters than CANN allows (``refuse_too_many``)."""
    code, codes, why = refuse_too_many(len(clusters))
    if reasons is not None:
        reasons.extend(why)
    return code, codes


def _holder(table: LinkTable, cluster: int) -> AnyLink | None:
    """The link ``table``'s engine has with ``cluster``, whichever end it is: the one a new served link naming
    ``cluster`` would displace or shadow (one link per remote cluster, ``authz.authorize_displace``)."""
    return table.links.get(cluster) or table.served.get(cluster)


def _origin(table: LinkTable, link: AnyLink | None) -> object | None:
    """Who set up ``link`` of ``table`` (``authz.authorize_displace``): a peer daemon, a linking engine here, or
    (a link this engine set up itself) ``OWN``."""
    if link is None:
        return None
    if isinstance(link, OutboundLink) or table.links.get(link.remote_cluster) is link:
        return OWN
    return REMOTE if isinstance(link, InboundLink) else link.local_peer
