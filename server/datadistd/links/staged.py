"""A staged push: the targets of a layer-wise push (``transfer_cache_async``), opened at the owner together, sent
as they become ready, committed once. Every other pull and push is a ``links.transfer.Transfer``."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Sequence

from datadist.status import LLMStatusCode

from ..core.errors import DataDistError, StatusCode, require
from ..core.layout import Span
from ..core.types import CacheId, RemoteSpec, TransferId
from ..engine.engine import tensors_of
from ..memory.base import Segment
from ..memory.copy import copy_segments
from ..memory.segments import segments_of
from ..transport.base import Channel
from .model import AnyLink, LocalLink, RemoteLink
from .table import LinkTable
from .transfer import Transfers
from .wire.framecalls import FrameCalls

__all__ = ["StagedPushes", "StagedPush", "PushPart"]

log = logging.getLogger("datadistd.links")


class StagedPushes:
    """The staged (layer-wise) pushes of one engine, at either end of its links."""

    def __init__(self, table: LinkTable, transfers: Transfers) -> None:
        self.table = table
        self.transfers = transfers

    def _calls(self, link: RemoteLink, timeout_ms: int) -> tuple[FrameCalls, Channel]:
        """The owner calls on the other end of ``link`` and its data channel (which carries both)."""
        channel = self.table.channel_of(link)
        if channel is None or channel.broken:
            raise self.transfers.failure(link, DataDistError(
                StatusCode.LLM_LINK_FAILED, f"no live data connection to cluster {link.remote_cluster}"), timeout_ms)
        return link.calls, channel

    async def _copy_local(self, link: LocalLink, spec: RemoteSpec, src: Sequence[Segment]) -> None:
        owner = link.local_peer.engine
        cache_id, dst = owner.prepare_write(spec)
        try:
            await self.table.in_thread(copy_segments, dst, src)
        finally:
            owner.unpin(cache_id)

    async def _send(self, channel: Channel, tid: int, src: Sequence[Segment], deadline: float) -> None:
        """The bytes of an opened write; the receiver hears of a failure (ABORT) at once."""
        try:
            await self.table.in_thread(channel.send, TransferId(tid), src, deadline)
        except DataDistError:
            channel.abort(TransferId(tid), LLMStatusCode.LLM_TIMEOUT)
            raise

    async def stage_push(self, cluster: int, cache_id: int, parts: Sequence[PushPart], timeout_ms: int | None = None,
                         hold_ms: int = 0) -> StagedPush:
        """Open every part (local spans of cache ``cache_id``, owner spec) of a push to ``cluster`` at the owner in
        one call; they then go out as they become ready (``send_staged``) and end with one ``commit_staged``: one
        round trip before and one after, none per part. The owner keeps them ``hold_ms`` at most."""
        link = self.transfers.link_for(cluster)
        self._check_no_pull(link, cluster)
        push = StagedPush(cluster, CacheId(cache_id), tuple(parts), link)
        if isinstance(link, LocalLink):
            return push   # same daemon: each part is a copy when it is sent
        timeout_ms = timeout_ms or self.table.engine.options.sync_kv_timeout_ms
        calls, _ = self._calls(link, timeout_ms)
        with link.reader_lock:   # fast pulls end on reader threads
            link.inflight += 1
        try:
            push.transfer_ids = await calls.open_write([spec for _, spec in parts], timeout_ms / 1000,
                                                       hold_ms)
        except DataDistError as exc:
            raise self.transfers.failure(link, exc, timeout_ms) from None
        finally:
            with link.reader_lock:   # fast pulls end on reader threads
                link.inflight -= 1
        return push

    def _check_no_pull(self, link: AnyLink, cluster: int) -> None:
        if link.pulls:
            raise DataDistError(StatusCode.LLM_LINK_BUSY,
                                f"a pull is running on the link to cluster {cluster}; transfer_cache_async and pulls "
                                f"must not overlap on one link")

    def _staged_link(self, push: StagedPush) -> AnyLink:
        """The staged push's link, still the one it was opened on (an unlink in between ends it)."""
        link = self.transfers.link_for(push.cluster)
        if link is not push.link:
            raise DataDistError(StatusCode.LLM_NOT_YET_LINK, f"the link to cluster {push.cluster} was replaced "
                                                             f"while a layer-wise push was using it")
        self._check_no_pull(link, push.cluster)
        return link

    async def send_staged(self, push: StagedPush, indices: Sequence[int], timeout_ms: int | None = None) -> int:
        """Send the parts ``indices`` of a staged push; its bytes."""
        require(not push.ended, "the staged push has ended")
        link = self._staged_link(push)
        timeout_ms = timeout_ms or self.table.engine.options.sync_kv_timeout_ms
        deadline = time.monotonic() + timeout_ms / 1000
        channel = None if isinstance(link, LocalLink) else self._calls(link, timeout_ms)[1]
        entry = self.table.engine.registry.pin(push.cache_id)
        with link.reader_lock:   # fast pulls end on reader threads
            link.inflight += 1
        nbytes = 0
        try:
            for i in indices:
                spans, spec = push.parts[i]
                src = segments_of(tensors_of(entry), spans)
                if isinstance(link, LocalLink):
                    await self._copy_local(link, spec, src)
                else:
                    assert channel is not None
                    try:
                        await self._send(channel, push.transfer_ids[i], src, deadline)
                    except DataDistError as exc:
                        raise self.transfers.failure(link, exc, timeout_ms) from None
                push.sent.add(i)
                nbytes += spec.expected_bytes
                link.bytes_out += spec.expected_bytes
        finally:
            with link.reader_lock:   # fast pulls end on reader threads
                link.inflight -= 1
            self.table.engine.unpin(entry.cache_id)
        return nbytes

    async def commit_staged(self, push: StagedPush, timeout_ms: int | None = None) -> None:
        """Every part was sent: wait until the owner has all of them."""
        require(not push.ended and len(push.sent) == len(push.parts), "a staged push commits once, when all sent")
        link = self._staged_link(push)
        push.ended = True
        if isinstance(link, LocalLink):
            return
        timeout_ms = timeout_ms or self.table.engine.options.sync_kv_timeout_ms
        calls, _ = self._calls(link, timeout_ms)
        with link.reader_lock:   # fast pulls end on reader threads
            link.inflight += 1
        try:
            await calls.commit_write(push.transfer_ids, timeout_ms / 1000)
        except DataDistError as exc:
            raise self.transfers.failure(link, exc, timeout_ms) from None
        finally:
            with link.reader_lock:   # fast pulls end on reader threads
                link.inflight -= 1

    def abandon_staged(self, push: StagedPush, code: LLMStatusCode) -> None:
        """The push ends early: the owner is told (an ABORT for each part not sent, then one commit that ends
        them all and unpins its caches) in the background; nothing is awaited here."""
        if push.ended:
            return
        push.ended = True
        if (isinstance(push.link, LocalLink) or not push.transfer_ids
                or self.table.links_to(push.cluster) is not push.link):
            return   # nothing opened, or the link went (its end dropped the writes)
        link = push.link

        unsent = [TransferId(tid) for i, tid in enumerate(push.transfer_ids) if i not in push.sent]

        def abort_unsent(channel: Channel) -> None:
            for tid in unsent:
                channel.abort(tid, code)

        async def tell_owner() -> None:
            try:
                calls, channel = self._calls(link, 1000)
                await self.table.in_thread(abort_unsent, channel)
                await calls.commit_write(push.transfer_ids, _ABANDON_SECONDS)
            except DataDistError as exc:   # expected: the aborted parts fail the commit
                log.debug("cluster %s: abandoned push to cluster %s ended: %s", self.table.cluster_id, push.cluster,
                          exc)

        self.table.spawn(tell_owner())



#: a part of a push: the local spans and what they become at the owner
PushPart = tuple[Sequence[Span], RemoteSpec]
#: how long the owner is given to end an abandoned push (the transfers it cancels fail at once)
_ABANDON_SECONDS = 2.0


@dataclass
class StagedPush:
    """A push whose parts were opened at the owner together (``Requester.stage_push``)."""

    cluster: int
    cache_id: CacheId
    parts: tuple[PushPart, ...]
    link: AnyLink
    transfer_ids: list[int] = field(default_factory=list)   # one per part (none on a same-daemon link)
    sent: set[int] = field(default_factory=set)
    ended: bool = False
