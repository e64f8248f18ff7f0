"""The pulls of a one-sided transport, by the puller's READ of the table the owner published to the link (nixl, hccl;
``links.published``). ``Requester`` runs them (a mixin: they use its table, its release and its failure rule)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Sequence

from ..core.errors import DataDistError, StatusCode
from ..core.types import CacheKeyRef, IdIndexRef, RemoteSpec
from ..memory.base import Segment
from ..transport.base import Channel
from .model import Link, RemoteLink
from .table import LinkTable
from .wire.framecalls import FrameCalls

__all__ = ["OneSidedPulls"]

log = logging.getLogger("datadistd.links")


async def _landed(posted: asyncio.Future[None], deadline: float) -> None:
    """Wait for a READ ``start_rows`` posted. Cancelled, it still waits for the READ to end (the transport ends it
    by its deadline) before the pull lets go of its destination."""
    try:
        await asyncio.shield(posted)
    except asyncio.CancelledError:
        if not posted.done():
            await asyncio.wait([posted], timeout=max(0.0, deadline - time.monotonic()) + 1.0)
        raise


class OneSidedPulls:
    table: LinkTable

    def _transfer_failure(self, link: Link, exc: DataDistError, timeout_ms: int) -> DataDistError:
        raise NotImplementedError

    async def _table_pull(self, link: RemoteLink, calls: FrameCalls, channel: Channel, spec: RemoteSpec,
                          dst: Sequence[Segment], deadline: float, timeout_ms: int) -> None:
        """A pull over a transport that reads published tables (``ReadTables``; ``links.published``): the key
        resolved by the table the owner published to the link, then one READ of the rows straight into ``dst`` --
        no owner call, but the RELEASE that consumes a CacheKey after its pull. A key the table lacks is asked
        once (a ping: the owner's table changes precede its reply), then refused with the owner's code."""
        published = self.table.published
        assert published is not None
        try:
            found = published.resolve(channel, channel.token, link.remote_cluster, spec)
            if found is None:   # asked once: the owner's table changes precede its answer on the link
                await calls.ping(max(0.0, deadline - time.monotonic()))
                found = published.resolve(channel, channel.token, link.remote_cluster, spec, asked=True)
            assert found is not None
            # a few whole rows: posted here, ended by the transport's progress thread (no worker thread)
            posted = published.tables.start_rows(channel, found.handle, found.spans, dst, deadline,
                                                 asyncio.get_running_loop())
            if posted is None:
                await self.table.in_thread(published.tables.read_rows, channel, found.handle, found.spans, dst,
                                           deadline)
            else:
                await _landed(posted, deadline)
        except DataDistError as exc:
            raise self._transfer_failure(link, exc, timeout_ms) from None
        if found.release:
            await self._confirm(link, calls, spec, deadline)

    async def _confirm(self, link: RemoteLink, calls: FrameCalls, spec: RemoteSpec, deadline: float) -> None:
        """The RELEASE of a key pulled by table: the owner was not asked before the READ, so its answer is what
        says the cache was still there. A cache or key it no longer has (deallocated, or consumed by another
        pull, while this side read a table entry whose withdrawal was still on its way) fails the pull with the
        owner's code -- the bytes read may be of memory it let go; any other failure is logged (as
        ``Requester._release`` does)."""
        assert isinstance(spec.key, (CacheKeyRef, IdIndexRef))
        try:
            await calls.release(spec.key, spec.tensor_start, spec.tensor_count, max(0.5, deadline - time.monotonic()))
        except DataDistError as exc:
            if exc.code == StatusCode.LLM_KV_CACHE_NOT_EXIST:
                raise
            log.warning("cluster %s: pulled key from cluster %s but could not release it: %s",
                        self.table.cluster_id, link.remote_cluster, exc)
