"""Links of one engine, and the transfers that run over them.

A link is set up by the *linking* engine (``link_clusters`` on the decoder, typically) towards a
*serving* engine (one that set ``listen_ip_info``): an authenticated Peer handshake, then a data
channel of several connections. After the handshake that channel is the only conversation between
the two daemons: as in CANN, a link has two ends and **either end may pull and push** over it,
single and layer-wise (the roles of client and server say nothing about prompt and decoder). A pull
asks the owner at the other end to ``read`` (bytes flow back over the data channel, straight into
the destination), a push asks it to ``open_write`` and then streams the bytes to it; these owner
calls, unlink and the heartbeat are CALL/REPLY frames on the same channel (``ownercalls``), the
same from either end. Unlinking either end tears down both. When both engines live in this daemon
the link is ``local`` and transfers are plain memory copies.

Deadlines: every transfer has ``sync_kv_timeout`` (or the call's timeout). A transfer that does not
complete by then ends with ``LLM_TIMEOUT``; one whose connection is lost before (the peer died) with
``LLM_FAILED``; one whose link was unlinked meanwhile with ``LLM_NOT_YET_LINK`` (CANN's codes:
docs/choices.md). The first two mark the link ``broken`` (later transfers: ``LLM_FAILED`` at once);
``link_clusters`` on a broken link re-establishes it.
"""

from __future__ import annotations

from typing import Sequence

from datadist.status import LLMStatusCode

from ..engine.engine import Engine
from ..engine.notifies import check_notify
from ..transport.base import Transport
from .attempts import LINK_ATTEMPTS_PER_ADDRESS, AddressSlots
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
    refuse_too_many,
)
from .owner import Owner
from .setup import Linker
from .staged import PushPart, StagedPush, StagedPushes
from .table import LinkTable, NodeContext
from .transfer import Transfers
from .wire.peering import Asker, HandshakeAnswer, HandshakeOffer

__all__ = ["LinkManager", "Link", "OutboundLink", "InboundLink", "LocalLink", "LinkState", "ClusterSpec",
           "NodeContext", "MAX_CLUSTERS_PER_CALL", "refuse_too_many", "AddressSlots",
           "LINK_ATTEMPTS_PER_ADDRESS"]


class LinkManager:
    """The links of one engine and the transfers over them, composed of parts with one job each, built here
    and handed what they need: ``table`` (the links and opened writes, ``table.LinkTable``), ``owner`` (serve
    the other end's reads and writes), ``calls`` (owner calls as data-channel frames, both ways), ``setup``
    (link, unlink, handshake, heartbeat: ``setup.Linker``), ``transfers`` (a worker's pull or push, the one path:
    ``transfer``), ``staged`` (layer-wise pushes). The methods below are the whole surface the rest of the daemon
    uses."""

    def __init__(self, engine: Engine, transport: Transport, node: NodeContext) -> None:
        self.table = LinkTable(engine, transport, node)
        self.owner = Owner(self.table)
        self.calls = OwnerCalls(self.table, self.owner)
        self.setup = Linker(self.table, self.calls)
        self.transfers = Transfers(self.table)
        self.staged = StagedPushes(self.table, self.transfers)
        #: the one way a worker's pull or push starts (``Transfers.transfer``: an order, or the attach frame's quick
        #: shape; bound here, no call in between on the hot path)
        self.transfer = self.transfers.transfer

    # ---- state (read-only views for the node's snapshot, comm domains and tests) ---------------------

    @property
    def engine(self) -> Engine:
        return self.table.engine

    @property
    def transport(self) -> Transport:
        return self.table.transport

    @property
    def cluster_id(self) -> int:
        return self.table.cluster_id

    @property
    def links(self) -> dict[int, "OutboundLink | LocalLink"]:
        return self.table.links

    @property
    def served(self) -> dict[int, "InboundLink | LocalLink"]:
        return self.table.served

    def all_links(self) -> list[AnyLink]:
        return self.table.all_links()

    def links_to(self, cluster: int) -> AnyLink | None:
        return self.table.links_to(cluster)

    def start(self) -> None:
        self.table.start()

    async def close(self) -> None:
        await self.setup.close()

    # ---- links ------------------------------------------------------------------------------

    async def link_clusters(self, clusters: Sequence[ClusterSpec], timeout_ms: int,
                            reasons: list[str] | None = None) -> tuple[int, list[int]]:
        return await self.setup.link_clusters(clusters, timeout_ms, reasons)

    async def link_one(self, spec: ClusterSpec, deadline: float) -> int:
        return await self.setup.link_one(spec, deadline)

    async def unlink_clusters(self, clusters: Sequence[ClusterSpec], timeout_ms: int, force: bool,
                              reasons: list[str] | None = None) -> tuple[int, list[int]]:
        return await self.setup.unlink_clusters(clusters, timeout_ms, force, reasons)

    async def drop_link(self, link: Link, notify: bool, deadline: float) -> None:
        await self.setup.drop_link(link, notify, deadline)

    async def check_link(self, cluster: int, timeout_ms: int | None = None) -> None:
        await self.setup.check_link(cluster, timeout_ms)

    def serve_challenge(self, client: int, server: int, asker: Asker | None = None) -> bytes:
        return self.setup.serve_challenge(client, server, asker)

    async def serve_handshake(self, offer: HandshakeOffer, source: str = "") -> HandshakeAnswer:
        return await self.setup.serve_handshake(offer, source)

    # ---- transfers ----------------------------------------------------------------------------

    async def stage_push(self, cluster: int, cache_id: int, parts: Sequence[PushPart], timeout_ms: int | None = None,
                         hold_ms: int = 0) -> StagedPush:
        return await self.staged.stage_push(cluster, cache_id, parts, timeout_ms, hold_ms)

    async def send_staged(self, push: StagedPush, indices: Sequence[int], timeout_ms: int | None = None) -> int:
        return await self.staged.send_staged(push, indices, timeout_ms)

    async def commit_staged(self, push: StagedPush, timeout_ms: int | None = None) -> None:
        await self.staged.commit_staged(push, timeout_ms)

    def abandon_staged(self, push: StagedPush, code: LLMStatusCode) -> None:
        self.staged.abandon_staged(push, code)

    # ---- HIXL notifies --------------------------------------------------------------------------

    async def notify(self, cluster: int, name: bytes, msg: bytes, timeout_ms: int | None = None) -> None:
        """A HIXL notify to the engine linked as ``cluster`` (its queue: ``engine.notifies``), over the link's
        owner calls -- or straight into its queue when it lives in this daemon. Refused with the code of whichever
        end refuses it (HIXL's bounds, a full queue, no link, the link's failure)."""
        check_notify(name, msg)
        link = self.transfers.link_for(cluster)
        if isinstance(link, LocalLink):
            link.local_peer.engine.notifies.push(name, msg, self.cluster_id)
            return
        await link.calls.notify(name, msg, (timeout_ms or self.engine.options.sync_kv_timeout_ms) / 1000)
