"""``LinkTable``: the links of one engine (both ends of each, by remote cluster), the writes opened at it, and
what every part of the link manager does to them: find a link's channel, mark it broken, forget it, sweep
the ones whose other end went away. It owns no protocol: the parts (``setup``, ``calls``, ``requester``,
``owner``) receive it in their constructors. Event-loop state only (see docs/daemon.md, "Concurrency")."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Any, Callable, Coroutine, Iterable, Protocol, TypeVar

from ..core.types import CacheId
from ..engine.engine import Engine
from ..guard.executor import UNMETERED
from ..guard.quota import LinkLimits
from ..ops.metrics import DaemonMetrics
from ..ops.peersecret import PeerSecret
from ..transport.base import Channel, ReadTables, Receipt, Transport
from .attempts import AddressSlots
from .liveness import Liveness
from .model import (
    AnyLink,
    InboundLink,
    Link,
    LinkingEnd,
    LinkState,
    LocalLink,
    OutboundLink,
    ServingEnd,
    _PendingWrite,
)
from .published import Published
from .wire.peering import PeerClient

log = logging.getLogger("datadistd.links")


class NodeContext(Protocol):
    """What a link manager needs from its daemon."""

    peer_secret: PeerSecret           # what peers prove (its value) and which one it is (for mismatch messages)
    version: str
    streams: int
    heartbeat_seconds: float
    liveness: Liveness                  # one heartbeat per peer daemon (``liveness``), node-wide
    metrics: "DaemonMetrics | None"     # owner-side transfers are counted here, whichever end asked
    link_limits: LinkLimits             # what one link's other end may make the owner hold (guard/quota.py)
    link_attempts: AddressSlots         # link attempts at once per peer address, node-wide (attempts.py)

    @property
    def peer_connector(self) -> Callable[[str], PeerClient]:
        """Address -> a client of the peer's Peer service (the rpc layer's gRPC one)."""

    def local_links_at(self, address: str) -> "LinkTable | None":
        """The link table of an engine of this daemon listening at ``address`` (a same-daemon link)."""

    def principal(self, links: "LinkTable") -> int:
        """The uid of the worker whose engine ``links`` serves (``authz``: same-daemon links stay within one)."""

_T = TypeVar("_T")

#: clusters remembered per engine as unlinked by their other end (``LinkTable.peer_unlinked``), the oldest
#: forgotten first
PEER_UNLINKED_KEPT = 1024


class LinkTable:
    def __init__(self, engine: Engine, transport: Transport, node: NodeContext) -> None:
        self.engine = engine
        self.transport = transport
        self.node = node
        self.links: dict[int, LinkingEnd] = {}     # links this engine set up (it is their linking end)
        self.served: dict[int, ServingEnd] = {}    # links other engines set up to this one (their serving end)
        #: clusters whose other end unlinked or finalized while this end held the link: this end's own unlink of
        #: one then succeeds, once (docs/choices.md): a prompt that finalizes as soon as its decoder's push
        #: landed is no error in the decoder's unlink. Consulted (and dropped) by the next unlink only.
        self.peer_unlinked: OrderedDict[int, None] = OrderedDict()
        self.pending: set[int] = set()
        self.writes: dict[int, _PendingWrite] = {}
        #: pulls over this transport read the tables owners publish (``ReadTables``: nixl, hccl); else the owner sends
        #: (tcp)
        self.published: Published | None = None
        #: run at each change of the engine's registry (``changed``)
        self.watchers: list[Callable[[], None]] = []
        self._publish_on(transport)
        self._sweeper: asyncio.Task[None] | None = None
        self._to_sweep: asyncio.Event | None = None   # set when a served link or write comes (``watch``)
        self.sweeps = 0                                # rounds the sweeper made (tests: an idle engine makes none)
        self.closed = False
        self._jobs: set[asyncio.Task[None]] = set()   # background jobs (``spawn``), running

    # ---- helpers -----------------------------------------------------------------------------

    @property
    def cluster_id(self) -> int:
        return self.engine.cluster_id

    async def in_thread(self, fn: Callable[..., _T], *args: object) -> _T:
        """``fn(*args)`` on the daemon's threads as this engine's worker (its uid's share, ``executor.Threads``),
        counted by the engine's gate (finalize waits for it)."""
        return await self.engine.gate.run(self.engine.lane, fn, *args)

    async def in_thread_of(self, principal: str, fn: Callable[..., _T], *args: object) -> _T:
        """``fn(*args)`` as ``principal``: a link's peer (``Link.principal``) for the owner calls of the other
        end, ``executor.UNMETERED`` for teardown that ends other jobs (never waits behind them)."""
        return await self.engine.gate.run(self.engine.lane.of(principal), fn, *args)

    def start(self) -> None:
        self._to_sweep = asyncio.Event()
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def watch(self) -> None:
        """Something the sweeper looks after came (a served link, an opened write; on the event loop): wake it if it
        was idle."""
        if self._to_sweep is not None:
            self._to_sweep.set()

    def _idle(self) -> bool:
        """Nothing to sweep: no link served for another daemon, no opened write."""
        return not self.writes and not any(isinstance(s, InboundLink) for s in self.served.values())

    async def _sweep(self) -> None:
        """Drop serving links whose linking daemon vanished; expire abandoned writes. An engine with
        none of those sleeps until one comes (``watch``), not once a second: an idle daemon of many engines
        wakes for none of them."""
        interval = max(0.2, min(1.0, self.node.heartbeat_seconds / 2))
        stale_after = max(3 * self.node.heartbeat_seconds, 2.0)
        assert self._to_sweep is not None
        while not self.closed:
            if self._idle():
                self._to_sweep.clear()
                await self._to_sweep.wait()
                continue
            await asyncio.sleep(interval)
            self.sweeps += 1
            now = time.monotonic()
            inbound = [served for served in self.served.values() if isinstance(served, InboundLink)]
            seen = self.node.liveness.seen   # a frame on any link of a linking daemon: all of them alive
            for link in inbound:
                if link.peer_daemon and link.last_seen > seen.get(link.peer_daemon, 0.0):
                    seen[link.peer_daemon] = link.last_seen
            for link in inbound:
                heard = max(link.last_seen, seen.get(link.peer_daemon, 0.0)) if link.peer_daemon else link.last_seen
                channel = self.transport.channel(link.token)
                if (channel is not None and channel.broken) or now - heard > stale_after:
                    log.warning("cluster %s: linking cluster %s went away (%s); dropping its link", self.cluster_id,
                                link.remote_cluster, "data channel closed" if channel is not None and channel.broken
                                else f"no frame of its daemon for {now - heard:.1f}s")
                    self.drop_serving(link)
            for daemon in [d for d, t in seen.items() if now - t > stale_after]:   # bounded: no link relies on it
                del seen[daemon]
            # abandoned writes, and those of links gone (unlinked, dropped): never committed now. Not at the
            # unlink itself: a commit may still be on its way while the unlink tells the other end
            live = {id(link) for link in self.all_links()}
            self.drop_writes([tid for tid, pw in self.writes.items()
                               if now > pw.deadline + 1.0 or id(pw.link) not in live])

    def drop_writes(self, transfer_ids: Iterable[int]) -> None:
        """Forget opened writes; their receipts are cancelled and their caches unpinned in the background."""
        dropped = [pw for pw in (self.writes.pop(tid, None) for tid in list(transfer_ids)) if pw is not None]
        for pw in dropped:
            pw.link.usage.close_writes(1, pw.nbytes)
        self.release_later([pw.receipt for pw in dropped], [pw.cache_id for pw in dropped])

    def release_later(self, receipts: list[Receipt], cache_ids: list[int]) -> None:
        """Cancel ``receipts`` in a worker thread (a cancel may wait for the sender to confirm it writes no
        more), then unpin ``cache_ids``: their memory is handed back only when nothing more can land in it."""
        if not receipts and not cache_ids:
            return

        async def release() -> None:
            try:
                if receipts:
                    await self.in_thread_of(UNMETERED, _cancel_all, receipts)
            finally:
                for cache_id in cache_ids:
                    self.engine.unpin(CacheId(cache_id))

        self.spawn(release())

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in the background, referenced until it ends (the loop holds tasks only weakly)."""
        job = asyncio.get_running_loop().create_task(work)
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)

    def all_links(self) -> list[AnyLink]:
        return [*self.links.values(), *self.served.values()]

    def drop_serving(self, link: ServingEnd) -> None:
        if self.served.get(link.remote_cluster) is link:
            del self.served[link.remote_cluster]
        if isinstance(link, InboundLink):
            link.calls.close("the link was dropped")
            self.transport.revoke(link.token)

    def channel_went(self, link: InboundLink | OutboundLink, reason: str) -> None:
        """``link``'s data channel broke or closed (its transport says so at once, ``transport.base.CONTROL_DOWN``):
        what the heartbeat (linking end: broken) or the sweeper (serving end: dropped) would find at its next tick,
        done now, so every owner call pending on the link fails at once with the code it would get then. Nothing
        when this end lets the link go (unlink, drop, finalize: the other end closes the channel once it answered
        this end's unlink call, before this end's teardown ran) or the other end's unlink call came before the
        channel's end (the answer to it tears the link down): an unlink, not a fault."""
        if self.closed or link.calls.closed or link.unlinked_by_peer or link.unlinking:
            return
        if isinstance(link, InboundLink):
            log.warning("cluster %s: linking cluster %s went away (data channel closed: %s); dropping its link",
                        self.cluster_id, link.remote_cluster, reason)
            self.drop_serving(link)
        else:
            self.mark_broken(link, f"data channel closed ({reason})")

    def mark_broken(self, link: Link, reason: str) -> None:
        if link.state != LinkState.BROKEN:
            link.state = LinkState.BROKEN
            link.reason = reason
            if isinstance(link, (OutboundLink, InboundLink)):
                link.calls.close(reason)
            log.warning("cluster %s: link to cluster %s (%s) broken: %s", self.cluster_id, link.remote_cluster,
                        link.address or link.transport, reason)

    def channel_of(self, link: Link) -> Channel | None:
        """The data channel of a link: the one this side opened, or the one the linking side opened to it
        (None for a same-daemon link, or once the transport forgot the token)."""
        kind = type(link)   # exact types, no ``abc`` instance check: a small pull's path asks this
        if kind is OutboundLink:
            return link.channel   # type: ignore[attr-defined]
        if kind is InboundLink:
            return self.transport.channel(link.token)   # type: ignore[attr-defined]
        return None

    def links_to(self, cluster: int) -> AnyLink | None:
        return self.links.get(cluster) or self.served.get(cluster)

    def use_transport(self, transport: Transport) -> None:
        """The engine's data plane moved (``Node.switch_role``, no link exists): every part reads ``transport``."""
        self.transport = transport
        self._publish_on(transport)

    def _publish_on(self, transport: Transport) -> None:
        """Publish the engine's remotely accessible caches to every link of ``transport`` if it reads tables:
        the engine runs ``Published.sync`` at each change of its registry (``Engine.watch``)."""
        self.published = Published(self.engine, transport) if isinstance(transport, ReadTables) else None
        self.engine.watch = self.changed
        self.changed()

    def changed(self) -> None:
        """The engine's registry changed (``Engine.watch``: the event loop, after the change and before any memory
        is freed): the tables peers read (``Published.sync``) and the local rows this engine's own transfers land
        in (``watchers``: ``Transfers.republish``) are published anew, at once."""
        if self.published is not None:
            self.published.sync()
        for watcher in self.watchers:
            watcher()

    def peer_went(self, cluster: int) -> None:
        """The other end of the link to ``cluster`` unlinked it (``peer_unlinked``)."""
        self.peer_unlinked[cluster] = None
        self.peer_unlinked.move_to_end(cluster)
        while len(self.peer_unlinked) > PEER_UNLINKED_KEPT:
            self.peer_unlinked.popitem(last=False)

    def take_peer_unlinked(self, cluster: int) -> bool:
        """Whether the other end unlinked ``cluster`` since this end's last unlink of it; forgotten by the asking."""
        if cluster not in self.peer_unlinked:
            return False
        del self.peer_unlinked[cluster]
        return True

    async def forget(self, link: Link) -> None:
        """Tear down this end of ``link`` without telling the other end: out of the tables, its heartbeat and owner
        calls stopped, its channel closed (in a worker thread: a close may wait for senders) or revoked."""
        if self.links.get(link.remote_cluster) is link:
            del self.links[link.remote_cluster]
        if isinstance(link, OutboundLink):
            self.node.liveness.unwatch(link)
        if isinstance(link, LocalLink):
            other = link.local_peer
            for table in (other.links, other.served):
                peer_side = table.get(self.cluster_id)
                if peer_side is not None and peer_side.link_nonce == link.link_nonce:
                    del table[self.cluster_id]
                    other.peer_went(self.cluster_id)
            if self.served.get(link.remote_cluster) is link:
                del self.served[link.remote_cluster]
        elif isinstance(link, OutboundLink):
            link.calls.close("unlinked")
            await self.in_thread_of(UNMETERED, link.channel.close)
        else:
            assert isinstance(link, InboundLink)
            self.drop_serving(link)
        log.info("cluster %s unlinked cluster %s", self.cluster_id, link.remote_cluster)

    async def stop(self) -> None:
        """Engine finalize, after the other ends were told: drop the writes, stop the data plane."""
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        for pw in self.writes.values():
            pw.receipt.cancel()
        self.writes.clear()
        await self.in_thread_of(UNMETERED, self.transport.stop)  # fails every wait and send still running
        await self.engine.gate.drained(5.0)          # bounded: let those jobs return before memory is freed


def _cancel_all(receipts: list[Receipt]) -> None:
    for receipt in receipts:
        receipt.cancel()
