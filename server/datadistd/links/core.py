"""``LinkCore``: the state every side of a link manager shares -- the link tables, the sweeper, the
helpers -- and the methods one side calls on another (declared here, defined by the sides)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Coroutine, Iterable, Sequence, TypeVar

from ..core.errors import DataDistError
from ..core.types import CacheId, RemoteSpec
from ..engine import Engine
from ..ownercalls import (
    FrameCalls,
)
from ..peering import (
    ChallengeStore,
)
from ..transport.base import Channel, Receipt, Transport
from .model import (
    AnyLink,
    InboundLink,
    Link,
    LinkingEnd,
    LinkState,
    NodeContext,
    OutboundLink,
    RemoteLink,
    ServingEnd,
    _PendingWrite,
)

log = logging.getLogger("datadistd.links")

_T = TypeVar("_T")


class LinkCore:
    def __init__(self, engine: Engine, transport: Transport, node: NodeContext) -> None:
        self.engine = engine
        self.transport = transport
        self.node = node
        self.links: dict[int, LinkingEnd] = {}     # links this engine set up (it is their linking end)
        self.served: dict[int, ServingEnd] = {}    # links other engines set up to this one (their serving end)
        self.pending: set[int] = set()
        self.writes: dict[int, _PendingWrite] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self.closed = False
        self._challenges = ChallengeStore()     # what serve_challenge issued; serve_handshake redeems each once
        self._jobs: set[asyncio.Task[None]] = set()   # background jobs (``_spawn``), running

    # ---- helpers -----------------------------------------------------------------------------

    @property
    def cluster_id(self) -> int:
        return self.engine.cluster_id

    async def _in_thread(self, fn: Callable[..., _T], *args: object) -> _T:
        """``fn(*args)`` on the daemon's executor, counted by the engine's gate (finalize waits for it)."""
        return await self.engine.gate.run(self.engine.executor, fn, *args)

    def start(self) -> None:
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def _sweep(self) -> None:
        """Drop serving links whose linking daemon vanished; expire abandoned writes."""
        interval = max(0.2, min(1.0, self.node.heartbeat_seconds / 2))
        stale_after = max(3 * self.node.heartbeat_seconds, 2.0)
        while not self.closed:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for link in [served for served in self.served.values() if isinstance(served, InboundLink)]:
                channel = self.transport.channel(link.token)
                if (channel is not None and channel.broken) or now - link.last_seen > stale_after:
                    log.warning("cluster %s: linking cluster %s went away (%s); dropping its link", self.cluster_id,
                                link.remote_cluster, "data channel closed" if channel is not None and channel.broken
                                else f"no frame for {now - link.last_seen:.1f}s")
                    self._drop_serving(link)
            # abandoned writes, and those of links gone (unlinked, dropped): never committed now. Not at the
            # unlink itself: a commit may still be on its way while the unlink tells the other end
            live = {id(link) for link in self.all_links()}
            self._drop_writes([tid for tid, pw in self.writes.items()
                               if now > pw.deadline + 1.0 or id(pw.link) not in live])

    def _drop_writes(self, transfer_ids: Iterable[int]) -> None:
        """Forget opened writes; their receipts are cancelled and their caches unpinned in the background."""
        dropped = [pw for pw in (self.writes.pop(tid, None) for tid in list(transfer_ids)) if pw is not None]
        self._release_later([pw.receipt for pw in dropped], [pw.cache_id for pw in dropped])

    def _release_later(self, receipts: list[Receipt], cache_ids: list[int]) -> None:
        """Cancel ``receipts`` in a worker thread (a cancel may wait for the sender to confirm it writes no
        more), then unpin ``cache_ids``: their memory is handed back only when nothing more can land in it."""
        if not receipts and not cache_ids:
            return

        async def release() -> None:
            try:
                if receipts:
                    await self._in_thread(_cancel_all, receipts)
            finally:
                for cache_id in cache_ids:
                    self.engine.unpin(CacheId(cache_id))

        self._spawn(release())

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in the background, referenced until it ends (the loop holds tasks only weakly)."""
        job = asyncio.get_running_loop().create_task(work)
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)

    def all_links(self) -> list[AnyLink]:
        return [*self.links.values(), *self.served.values()]

    def _drop_serving(self, link: ServingEnd) -> None:
        if self.served.get(link.remote_cluster) is link:
            del self.served[link.remote_cluster]
        if isinstance(link, InboundLink):
            link.calls.close("the link was dropped")
            self.transport.revoke(link.token)

    def _mark_broken(self, link: Link, reason: str) -> None:
        if link.state != LinkState.BROKEN:
            link.state = LinkState.BROKEN
            link.reason = reason
            if isinstance(link, (OutboundLink, InboundLink)):
                link.calls.close(reason)
            log.warning("cluster %s: link to cluster %s (%s) broken: %s", self.cluster_id, link.remote_cluster,
                        link.address or link.transport, reason)

    def _channel_of(self, link: Link) -> Channel | None:
        """The data channel of a link: the one this side opened, or the one the linking side opened to it
        (None for a same-daemon link, or once the transport forgot the token)."""
        if isinstance(link, OutboundLink):
            return link.channel
        if isinstance(link, InboundLink):
            return self.transport.channel(link.token)
        return None

    def links_to(self, cluster: int) -> AnyLink | None:
        return self.links.get(cluster) or self.served.get(cluster)

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
        await self.engine.gate.drained(5.0)           # bounded: let those jobs return before memory is freed

    # ---- what one side calls on another (defined by the sides; declared here for the type checker) -----

    def _frame_calls(self, remote_cluster: int, channel: Callable[[], Channel | None]) -> FrameCalls:
        raise NotImplementedError

    def _control_handler(self, link: RemoteLink) -> Callable[[int, bytes], None]:
        raise NotImplementedError

    async def _heartbeat(self, link: OutboundLink) -> None:
        raise NotImplementedError

    async def _close_link(self, link: Link, notify: bool, deadline: float | None = None) -> None:
        raise NotImplementedError

    async def read_for(self, link: Link, transfer_id: int, spec: RemoteSpec, timeout_ms: int) -> tuple[int, bool]:
        raise NotImplementedError

    def open_write_for(self, link: Link, specs: Sequence[RemoteSpec], timeout_ms: int, hold_ms: int = 0) -> list[int]:
        raise NotImplementedError

    async def commit_write_for(self, link: Link, transfer_ids: Sequence[int], timeout_ms: int) -> None:
        raise NotImplementedError


def _cancel_all(receipts: list[Receipt]) -> None:
    for receipt in receipts:
        receipt.cancel()
