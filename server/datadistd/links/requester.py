"""The requesting side of a transfer, at either end of a link: plan, call the owner, move the bytes."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Sequence

from datadist.status import LLMStatusCode

from ..core.errors import DataDistError, StatusCode, require
from ..core.layout import Span
from ..core.plan import TransferOrder, plan_pull, plan_push
from ..core.registry import CacheEntry
from ..core.types import CacheId, CacheKeyRef, IdIndexRef, RemoteSpec, TransferId
from ..memory.base import Segment
from ..memory.copy import all_mapped, copy_segments, read_bytes, write_bytes
from ..memory.segments import segments_of
from ..state.engine import tensors_of
from ..transport.base import Channel
from .bytransfer import Pull, PullDone, TransferPulls, explained
from .model import AnyLink, InboundLink, Link, LinkState, LocalLink, RemoteLink
from .reads import OneSidedPulls
from .table import LinkTable
from .wire.framecalls import FrameCalls, answered
from .wire.ownercalls import INLINE_READ_MAX, OwnerReply

log = logging.getLogger("datadistd.links")


class Requester(OneSidedPulls, TransferPulls):
    """The requesting side of transfers at either end of a link: pulls, pushes and staged (layer-wise) pushes."""

    def __init__(self, table: LinkTable) -> None:
        self.table = table

    def _transfer_link(self, cluster: int) -> AnyLink:
        """The link to ``cluster``, whichever end of it this engine is: both ends may pull and push."""
        link = self.table.links_to(cluster)
        if link is None:
            raise DataDistError(StatusCode.LLM_NOT_YET_LINK,
                                f"cluster {self.table.cluster_id} has no link to cluster {cluster}")
        if link.state == LinkState.BROKEN:  # nothing timed out now: CANN's code for a failed communication
            raise DataDistError(StatusCode.LLM_FAILED,
                                f"the link to cluster {cluster} is broken ({link.reason}); link_clusters again")
        return link

    def _calls(self, link: RemoteLink, timeout_ms: int) -> tuple[FrameCalls, Channel]:
        """The owner calls on the other end of ``link`` and its data channel (which carries both)."""
        calls = link.calls
        channel = self.table.channel_of(link)
        if channel is None or channel.broken:
            raise self._transfer_failure(link, DataDistError(
                StatusCode.LLM_LINK_FAILED, f"no live data connection to cluster {link.remote_cluster}"), timeout_ms)
        return calls, channel

    def _deadline(self, order: TransferOrder) -> tuple[float, int]:
        timeout_ms = order.timeout_ms or self.table.engine.options.sync_kv_timeout_ms
        return time.monotonic() + timeout_ms / 1000, timeout_ms

    def _local_entry(self, cache_id: int) -> CacheEntry:
        entry = self.table.engine.registry.find(CacheId(cache_id))
        if entry is None:
            raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"local cache {cache_id} does not exist")
        return entry

    def _prepare_pull(self, order: TransferOrder) -> Pull:
        """Everything a pull checks before it holds anything: its plan, link, deadline and destination."""
        entry = self._local_entry(order.local_cache_id)
        plan = plan_pull(order, entry.desc, entry.is_blocks, self.table.cluster_id)
        link = self._transfer_link(order.remote.cluster_id)
        deadline, timeout_ms = self._deadline(order)
        dst = segments_of(tensors_of(entry), plan.local_spans)
        if link.layerwise:
            raise DataDistError(StatusCode.LLM_LINK_BUSY, f"a transfer_cache_async task is using the link to "
                                                          f"cluster {link.remote_cluster}; pull after it ends")
        if order.exclusive and link.pulls:
            raise DataDistError(StatusCode.LLM_LINK_BUSY,
                                f"another pull is running on the link to cluster {link.remote_cluster}")
        return Pull(entry, plan.remote, plan.nbytes, link, deadline, timeout_ms, dst)

    def _hold(self, p: Pull) -> None:
        self.table.engine.registry.pin(p.entry.cache_id)
        with p.link.reader_lock:   # fast pulls end on reader threads (``_land``)
            p.link.inflight += 1
            p.link.pulls += 1

    def _end(self, p: Pull, ok: bool) -> None:
        with p.link.reader_lock:
            p.link.inflight -= 1
            p.link.pulls -= 1
            if ok:
                p.link.bytes_in += p.nbytes
        self.table.engine.unpin(p.entry.cache_id)
        if ok:
            log.debug("cluster %s pulled %d bytes from cluster %s", self.table.cluster_id, p.nbytes,
                      p.link.remote_cluster)

    def start_pull(self, order: TransferOrder, done: PullDone) -> None:
        """A pull whose end goes to ``done`` -- ``(bytes, transport)`` or the ``DataDistError`` -- exactly once,
        from the event loop, possibly before this returns (an order refused at once). The general path (a worker's
        small pull over the attach socket takes ``FastTransfers.start`` first): a pull whose bytes come as a transfer
        on the data channel by callback (``TransferPulls._start_read``), any other as a task (``_pull``)."""
        try:
            p = self._prepare_pull(order)
        except DataDistError as exc:
            done(exc)
            return
        if self._by_transfer(p):
            self._start_read(p, done)
            return
        self.table.spawn(self._pull_then(p, done))

    def _by_transfer(self, p: Pull) -> bool:
        """Whether the pull's bytes come as a transfer on the link's data channel (tcp, more than an inline read):
        started by callback (``_start_read``); every other pull runs as a task (``_pull``)."""
        table = self.table
        return (not isinstance(p.link, LocalLink) and table.published is None
                and not (p.spec.expected_bytes <= INLINE_READ_MAX and table.transport.inline_small_reads))

    async def _pull_then(self, p: Pull, done: PullDone) -> None:
        try:
            result: tuple[int, str] | DataDistError = await self._pull(p)
        except DataDistError as exc:
            result = explained(exc, p.entry, p.spec.tensor_count)
        except Exception as exc:  # noqa: BLE001 - a bug of ours: the worker still gets an answer, the log the trace
            log.exception("cluster %s: a pull from cluster %s failed", self.table.cluster_id, p.link.remote_cluster)
            result = DataDistError(StatusCode.LLM_FAILED, f"the pull failed: {exc!r}")
        done(result)

    async def _release_then(self, p: Pull, link: RemoteLink, calls: FrameCalls, done: PullDone) -> None:
        try:
            await self._release(link, calls, p.spec, p.deadline)
        finally:
            self._end(p, ok=True)
        done((p.nbytes, p.link.transport))

    async def _pull(self, p: Pull) -> tuple[int, str]:
        self._hold(p)
        ok = False
        try:
            if isinstance(p.link, LocalLink):
                await self._local_pull(p.link, p.spec, p.dst)
            else:
                await self._remote_pull(p.link, p.spec, p.dst, p.deadline, p.timeout_ms)
            ok = True
        finally:
            self._end(p, ok)
        return p.nbytes, p.link.transport

    async def _local_pull(self, link: LocalLink, spec: RemoteSpec, dst: Sequence[Segment]) -> None:
        owner = link.local_peer
        cache_id, src, release = owner.engine.prepare_read(spec)
        try:
            await self.table.in_thread(copy_segments, dst, src)
        finally:
            owner.engine.unpin(cache_id)
        if release:
            assert isinstance(spec.key, (CacheKeyRef, IdIndexRef))
            owner.engine.release_pulled(spec.key, spec.tensor_start, spec.tensor_count)

    async def _remote_pull(self, link: RemoteLink, spec: RemoteSpec, dst: Sequence[Segment], deadline: float,
                           timeout_ms: int) -> None:
        calls, channel = self._calls(link, timeout_ms)
        if self.table.published is not None:   # a transport that reads published tables: no owner call
            await self._table_pull(link, calls, channel, spec, dst, deadline, timeout_ms)
            return
        # small: the bytes come in the reply (no receipt, no DATA frame); larger ones are ``_start_read``'s
        try:
            reply: OwnerReply = await answered(
                lambda done: calls.start_read_inline(spec, deadline - time.monotonic(), done))
        except DataDistError as exc:
            raise self._transfer_failure(link, exc, timeout_ms) from None
        data, release = reply.data, reply.release_needed
        if all_mapped(dst):
            write_bytes(dst, data)
        else:
            await self.table.in_thread(write_bytes, dst, data)
        if release:
            await self._release(link, calls, spec, deadline)

    async def _release(self, link: RemoteLink, calls: FrameCalls, spec: RemoteSpec, deadline: float) -> None:
        """Confirm a pulled key to its owner, which consumes it (a failure is logged: the bytes are in)."""
        assert isinstance(spec.key, (CacheKeyRef, IdIndexRef))
        try:
            await calls.release(spec.key, spec.tensor_start, spec.tensor_count,
                                max(0.5, deadline - time.monotonic()))
        except DataDistError as exc:
            log.warning("cluster %s: pulled key from cluster %s but could not release it: %s",
                        self.table.cluster_id, link.remote_cluster, exc)

    def _transfer_failure(self, link: Link, exc: DataDistError, timeout_ms: int) -> DataDistError:
        """What a transfer that failed on ``link`` tells the worker -- CANN's codes (docs/choices.md): the
        deadline passed: ``LLM_TIMEOUT``; the link was closed meanwhile (an unlink at either end, dropped by
        the serving end): ``LLM_NOT_YET_LINK``, as CANN answers for a destroyed link; the connection was lost
        before the deadline (the peer died, a reset): ``LLM_FAILED``, CANN's code for a communication error
        that is not a timeout -- at the linking end; the serving end drops such a link, so ``LLM_NOT_YET_LINK``
        there. Each with the reason."""
        cluster = link.remote_cluster
        if exc.code in (StatusCode.LLM_TIMEOUT, StatusCode.LLM_WAIT_PROCESS_TIMEOUT):
            self.table.mark_broken(link, str(exc))
            return DataDistError(StatusCode.LLM_TIMEOUT,
                                 f"transfer with cluster {cluster} did not complete within {timeout_ms} ms: "
                                 f"{exc.message}; the link is broken, link_clusters again")
        if exc.code == StatusCode.LLM_LINK_FAILED and self.table.links_to(cluster) is not link:
            return DataDistError(StatusCode.LLM_NOT_YET_LINK,
                                 f"the link to cluster {cluster} was closed during the transfer ({exc.message})")
        if exc.code == StatusCode.LLM_LINK_FAILED and isinstance(link, InboundLink):
            # the serving end drops a link whose connection is lost (as ``LinkTable.channel_went`` does): one code
            # whichever noticed first, the channel's end or the transfer's own failure (a one-sided READ's)
            self.table.drop_serving(link)
            return DataDistError(StatusCode.LLM_NOT_YET_LINK,
                                 f"the link to cluster {cluster} was dropped during the transfer: the connection "
                                 f"was lost ({exc.message}); link_clusters again")
        if exc.code == StatusCode.LLM_LINK_FAILED:
            self.table.mark_broken(link, str(exc))
            return DataDistError(StatusCode.LLM_FAILED,
                                 f"transfer with cluster {cluster} failed: the connection was lost ({exc.message}); "
                                 "the link is broken, link_clusters again")
        if exc.code == StatusCode.LLM_NOT_YET_LINK:
            self.table.mark_broken(link, "the peer no longer knows this link")
        return exc

    async def push(self, order: TransferOrder) -> tuple[int, str]:
        entry = self._local_entry(order.local_cache_id)
        plan = plan_push(order, entry.desc, entry.is_blocks, self.table.cluster_id)
        link = self._transfer_link(order.remote.cluster_id)
        deadline, timeout_ms = self._deadline(order)
        src = segments_of(tensors_of(entry), plan.local_spans)
        self.table.engine.registry.pin(entry.cache_id)
        with link.reader_lock:   # fast transfers end on reader threads
            link.inflight += 1
        ok = False
        try:
            await self._write_owner(link, plan.remote, src, deadline, timeout_ms)
            ok = True
        except DataDistError as exc:
            raise explained(exc, entry, plan.remote.tensor_count) from None
        finally:
            with link.reader_lock:   # fast transfers end on reader threads (``FastTransfers._pushed``)
                link.inflight -= 1
                if ok:
                    link.bytes_out += plan.nbytes
            self.table.engine.unpin(entry.cache_id)
        return plan.nbytes, link.transport

    async def _write_owner(self, link: AnyLink, spec: RemoteSpec, src: Sequence[Segment], deadline: float,
                           timeout_ms: int) -> None:
        """Push ``src`` into what ``spec`` names at the other end of ``link`` (same daemon, either end)."""
        if isinstance(link, LocalLink):
            await self._copy_local(link, spec, src)
            return
        calls, channel = self._calls(link, timeout_ms)
        try:
            if spec.expected_bytes <= INLINE_READ_MAX and self.table.transport.inline_small_reads:
                # small: the bytes go in the call itself (no open, no DATA frame, no commit: one round trip)
                data = read_bytes(src) if all_mapped(src) else await self.table.in_thread(read_bytes, src)
                await calls.write(spec, data, deadline - time.monotonic())
                return
            (tid,) = await calls.open_write([spec], deadline - time.monotonic())
            await self._send(channel, tid, src, deadline)
            await calls.commit_write([tid], deadline - time.monotonic())
        except DataDistError as exc:
            raise self._transfer_failure(link, exc, timeout_ms) from None

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

    # ---- a staged push: the targets of a layer-wise push ---------------------------------------

    async def stage_push(self, cluster: int, cache_id: int, parts: Sequence[PushPart], timeout_ms: int | None = None,
                         hold_ms: int = 0) -> StagedPush:
        """Open every part (local spans of cache ``cache_id``, owner spec) of a push to ``cluster`` at the owner in
        one call; they then go out as they become ready (``send_staged``) and end with one ``commit_staged``: one
        round trip before and one after, none per part. The owner keeps them ``hold_ms`` at most."""
        link = self._transfer_link(cluster)
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
            raise self._transfer_failure(link, exc, timeout_ms) from None
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
        link = self._transfer_link(push.cluster)
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
                        raise self._transfer_failure(link, exc, timeout_ms) from None
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
            raise self._transfer_failure(link, exc, timeout_ms) from None
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
