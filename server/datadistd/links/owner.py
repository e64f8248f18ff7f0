"""The owning side of a transfer: serve a read (send the bytes), open and commit a write (receive them)."""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from typing import Sequence

from ..core.errors import DataDistError, StatusCode, require
from ..core.layout import Span
from ..core.types import BlocksKeyRef, ReadMode, RemoteSpec, TransferId
from ..engine import readview
from ..memory.base import Segment
from ..memory.copy import all_mapped, read_bytes, write_bytes
from ..memory.segments import SegmentTable, segments_of
from ..ops.metrics import track_transfer
from ..transport.base import Channel, Receipt
from .model import Link, _PendingWrite
from .table import LinkTable
from .wire.ownercalls import INLINE_READ_MAX, MAX_OPEN_PER_CALL

#: the most blocks of a read (an open write: of its parts in all) whose segments (``segments_of``: array arithmetic,
#: ~40 ms for 2^20 blocks) are worked out on the event loop; more, on the daemon's threads as the link's peer
_LOOP_BLOCKS = 4096


class Owner:
    """The owning side of a transfer at either end of a link: what an owner call of the other end runs."""

    def __init__(self, table: LinkTable) -> None:
        self.table = table
        self._sends: dict[int, _SendQueue] = {}   # id(link) -> its queued reads, while any is queued or sending

    async def read_for(self, link: Link, transfer_id: int, spec: RemoteSpec, timeout_ms: int) -> tuple[int, bool]:
        """Owner side of a pull at either end of ``link``: send what ``spec`` names over its data channel; its bytes
        and whether the requester must release the key. A read of one frame goes out from the event loop on an idle
        connection whose socket takes it (``Channel.try_send_soon``; what it took only in part is finished from the
        loop as the socket drains); the rest is queued on the link (``_SendQueue``): one executor job per
        connection sends the link's queued reads back to back -- and the REPLYs queued behind them
        (``queued_control``) -- instead of one thread per read waiting its turn for the socket. The segments of a
        read of more than ``_LOOP_BLOCKS`` blocks are worked out on the link's peer's threads, not the loop. The
        source is unpinned before the REPLY is queued, so the requester never hears of a read whose source is still
        pinned here."""
        if self.table.published is not None:   # the puller reads: the owner sends
            raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"pulls over {link.transport} are the puller's reads")
        channel = self.table.channel_of(link)
        if channel is None or channel.broken:
            raise DataDistError(StatusCode.LLM_LINK_FAILED, "no live data connection for this link")
        table = self.table
        limits = table.node.link_limits
        timeout = limits.clamp(timeout_ms or table.engine.options.sync_kv_timeout_ms)
        deadline = time.monotonic() + timeout / 1000
        await link.usage.enter_call(limits, deadline)   # a per-link cap: one peer cannot fill the daemon's executor
        try:
            with track_transfer(table.node.metrics, "serve_read", table.cluster_id, link.remote_cluster) as tracked:
                cache_id, tensors, spans, release = self.table.engine.pin(spec, "src")
                try:
                    src = segments_of(tensors, spans) if len(spec.blocks) <= _LOOP_BLOCKS else \
                        await self.table.in_thread_of(link.principal, segments_of, tensors, spans)
                    # a read of one frame goes out from the event loop when a connection is idle and its socket
                    # takes it (no executor hop); what the socket took only in part is finished from the loop
                    sent = channel.try_send_soon(TransferId(transfer_id), src, deadline)
                    if sent is False:
                        await self._queued(link, channel, (transfer_id, src), deadline)
                    elif sent is not True:
                        await sent.wait()
                finally:
                    self.table.engine.unpin(cache_id)
                tracked.done(spec.expected_bytes, len(spec.blocks))
        finally:
            link.usage.exit_call()
        link.bytes_out += spec.expected_bytes
        return spec.expected_bytes, release

    def queued_control(self, link: Link, channel: Channel, kind: int, payload: bytes,
                       deadline: float) -> asyncio.Future[None] | None:
        """While ``link``'s reads are being sent (a sender drains its queue): the control frame queued behind them,
        sent by that sender in turn (a read's REPLY: no executor hop, no wait on a busy socket); its future. None when
        no sender runs: the caller sends it itself. For a read's REPLY only (``OwnerCalls._reply``): a frame queued
        here waits for every byte queued before it -- a heartbeat's answer would come too late."""
        queue = self._sends.get(id(link))
        if queue is None:
            return None
        done: asyncio.Future[None] = queue.loop.create_future()
        with queue.lock:
            if not queue.running:
                return None
            queue.jobs.append((channel, (kind, payload), deadline, done))
        return done

    async def _queued(self, link: Link, channel: Channel, what: tuple[int, Sequence[Segment]],
                      deadline: float) -> None:
        """``channel.send`` of one read (``what``: transfer id and source), queued on ``link`` (``_SendQueue``);
        returns once it was sent, raises its failure. Cancelled while still queued, it is taken off the queue."""
        loop = asyncio.get_running_loop()
        queue = self._sends.get(id(link))
        if queue is None:
            queue = self._sends[id(link)] = _SendQueue(loop)
        done: asyncio.Future[None] = loop.create_future()
        job: _SendJob = (channel, what, deadline, done)
        with queue.lock:
            queue.jobs.append(job)
            start = queue.running < max(1, channel.streams)
            if start:
                queue.running += 1
        if start:
            self.table.spawn(self._drain(link, queue))
        try:
            await done
        except asyncio.CancelledError:
            with queue.lock:
                if job in queue.jobs:
                    queue.jobs.remove(job)
            raise

    async def _drain(self, link: Link, queue: _SendQueue) -> None:
        """One sender of ``link``'s queued reads, on the daemon's threads as the link's peer (its share) and counted
        by the engine's gate (finalize waits for it), as each read's own job was."""
        turn = [_PENDING]
        try:
            await self.table.in_thread_of(link.principal, queue.drain, turn)
        except BaseException as exc:   # cancelled or refused: a sender that never began gives up (``give_up``)
            queue.give_up(turn, exc)
            raise
        finally:
            if self._sends.get(id(link)) is queue and queue.idle():
                del self._sends[id(link)]

    async def read_small(self, link: Link, spec: RemoteSpec) -> tuple[bytes, bool]:
        """Owner side of a small pull answered in the reply (at most ``INLINE_READ_MAX`` bytes), on the event loop:
        the bytes ``spec`` names and whether the requester must release the key: by the engine's published
        read view when it settles the read (``readview.read``: copied here when the memory is mapped, else in a
        thread -- a system call or device copy each block); anything else -- another key kind, a refusal -- is
        checked by ``engine.prepare_read`` (every status code and message) and copied under a pin that ends here
        (mapped: here; else in a thread). Nothing stays pinned while the reply travels."""
        require(spec.expected_bytes <= INLINE_READ_MAX,
                f"an inline read of {spec.expected_bytes} bytes; at most {INLINE_READ_MAX}")
        table = self.table
        engine = table.engine
        with track_transfer(table.node.metrics, "serve_read", table.cluster_id, link.remote_cluster) as tracked:
            got: int | bytes | None = None
            key = spec.key
            if (isinstance(key, BlocksKeyRef) and spec.mode == ReadMode.BLOCKS
                    and key.cluster_id == engine.cluster_id):
                args = (engine, key.model_id, spec.tensor_start, spec.tensor_count, spec.blocks, spec.expected_bytes)
                got = readview.read(*args)
                if got == readview.UNMAPPED:
                    got = await table.in_thread_of(link.principal, readview.read, *args, None, b"", True)
            release = False
            if isinstance(got, bytes):
                data = got
            else:
                cache_id, src, release = engine.prepare_read(spec)
                try:
                    data = read_bytes(src) if all_mapped(src) else await table.in_thread_of(link.principal,
                                                                                            read_bytes, src)
                finally:
                    engine.unpin(cache_id)
            tracked.done(len(data), len(spec.blocks))
        link.bytes_out += len(data)
        return data, release

    async def write_small(self, link: Link, spec: RemoteSpec, data: bytes) -> int:
        """Owner side of a small push carrying its bytes (``WriteCmd``; at most ``INLINE_READ_MAX``), on the event
        loop: what the reader threads' published view did not settle. ``engine.prepare_write`` checks and pins the
        destination (every status code and message of a push), the bytes are copied in (mapped: here; else in a
        thread), the pin ends here. Its bytes."""
        require(len(data) == spec.expected_bytes <= INLINE_READ_MAX,
                f"a write carrying {len(data)} bytes for a spec of {spec.expected_bytes}; they must agree, at most "
                f"{INLINE_READ_MAX}")
        table = self.table
        engine = table.engine
        with track_transfer(table.node.metrics, "serve_write", table.cluster_id, link.remote_cluster) as tracked:
            cache_id, dst = engine.prepare_write(spec)
            try:
                if all_mapped(dst):
                    write_bytes(dst, data)
                else:
                    await table.in_thread_of(link.principal, write_bytes, dst, data)
            finally:
                engine.unpin(cache_id)
            tracked.done(len(data), len(spec.blocks))
        link.bytes_in += len(data)
        return len(data)

    async def open_write_for(self, link: Link, specs: Sequence[RemoteSpec], timeout_ms: int,
                             hold_ms: int = 0) -> list[int]:
        """Owner side of a push: one incoming transfer per spec, all or none; each waits ``hold_ms`` (else
        ``timeout_ms``) for its bytes and commit, pinning its cache meanwhile. The segments of parts of more than
        ``_LOOP_BLOCKS`` blocks in all are worked out on the link's peer's threads, not the event loop."""
        require(0 < len(specs) <= MAX_OPEN_PER_CALL,
                f"an open write of {len(specs)} parts; 1 to {MAX_OPEN_PER_CALL} per call")
        channel = self.table.channel_of(link)
        if channel is None or channel.broken:
            raise DataDistError(StatusCode.LLM_LINK_FAILED, "no live data connection for this link")
        limits = self.table.node.link_limits
        hold = limits.clamp(hold_ms or timeout_ms or self.table.engine.options.sync_kv_timeout_ms)
        deadline = time.monotonic() + hold / 1000
        nbytes = sum(spec.expected_bytes for spec in specs)
        link.usage.check_writes(limits, len(specs))   # over the count cap: refused before any part is looked at
        pinned: list[tuple[int, tuple[Segment, ...], "Sequence[Span] | SegmentTable"]] = []
        receipts: list[Receipt] = []
        booked = False
        try:   # every destination checked (and pinned) before any receipt exists
            for spec in specs:
                pinned.append(self.table.engine.pin(spec, "dst")[:3])
            # the caps booked once the parts are valid (so a bad byte count is LLM_PARAM_INVALID, not a cap), before
            # any receipt exists; no await since the pins above, so nothing ran with them over the cap
            link.usage.open_writes(limits, len(specs), nbytes)
            booked = True
            if sum(len(spec.blocks) for spec in specs) <= _LOOP_BLOCKS:
                dsts = _segments_of_parts(pinned)
            else:
                dsts = await self.table.in_thread_of(link.principal, _segments_of_parts, pinned)
            for dst in dsts:
                receipts.append(self.table.transport.expect(dst, channel=channel))
        except BaseException:
            if booked:
                link.usage.close_writes(len(specs), nbytes)
            self.table.release_later(receipts, [cache_id for cache_id, _, _ in pinned])
            raise
        for (cache_id, _, _), receipt, spec in zip(pinned, receipts, specs, strict=True):
            self.table.writes[receipt.transfer_id] = _PendingWrite(receipt, cache_id, deadline, link,
                                                                   len(spec.blocks), spec.expected_bytes)
        self.table.watch()
        return [receipt.transfer_id for receipt in receipts]

    async def commit_write_for(self, link: Link, transfer_ids: Sequence[int], timeout_ms: int) -> None:
        """Wait until every byte of the transfers arrived; the first failure cancels the rest (all end here)."""
        unknown = [t for t in transfer_ids if (pw := self.table.writes.get(t)) is None or pw.link is not link]
        if unknown or not transfer_ids or len(set(transfer_ids)) != len(transfer_ids):
            raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                f"unknown transfer {unknown[0]}" if unknown else "no transfers, or one named twice")
        limits = self.table.node.link_limits
        timeout = limits.clamp(timeout_ms or self.table.engine.options.sync_kv_timeout_ms)
        limit = time.monotonic() + timeout / 1000
        await link.usage.enter_call(limits, limit)   # refused or timed out: the writes stay open for the sweeper
        if any(self.table.writes.get(t) is None for t in transfer_ids):   # dropped (unlink, sweeper) while it waited
            link.usage.exit_call()
            raise DataDistError(StatusCode.LLM_PARAM_INVALID, "a transfer ended while its commit waited for a turn")
        pending = [self.table.writes.pop(t) for t in transfer_ids]
        link.usage.close_writes(len(pending), sum(pw.nbytes for pw in pending))
        try:
            await self._commit(link, pending, limit)
        finally:
            link.usage.exit_call()

    async def _commit(self, link: Link, pending: list[_PendingWrite], limit: float) -> None:
        table = self.table
        with track_transfer(table.node.metrics, "serve_write", table.cluster_id, link.remote_cluster) as tracked:
            nbytes = blocks = 0
            try:
                while pending:
                    pw = pending[0]
                    if pw.receipt.done:   # its bytes are in (the usual case for all but the last): no thread hop
                        pw.receipt.wait(min(pw.deadline, limit))
                    else:
                        await self.table.in_thread_of(link.principal, pw.receipt.wait, min(pw.deadline, limit))
                    pending.pop(0)
                    self.table.engine.unpin(pw.cache_id)
                    nbytes, blocks = nbytes + pw.receipt.expected, blocks + pw.blocks
                    link.bytes_in += pw.receipt.expected
            finally:   # a failure ends the rest too (cancelled off the event loop, then unpinned)
                self.table.release_later([pw.receipt for pw in pending], [pw.cache_id for pw in pending])
            tracked.done(nbytes, blocks)


def _segments_of_parts(pinned: Sequence[tuple[int, tuple[Segment, ...], "Sequence[Span] | SegmentTable"]]
                       ) -> list[Sequence[Segment]]:
    """The segments of each part an open write pinned (``Engine.pin``), in order."""
    return [segments_of(tensors, spans) for _, tensors, spans in pinned]


#: a sender's state (``_SendQueue.drain``): waiting for its turn on the daemon's threads, draining, given up
_PENDING, _BEGUN, _GAVE_UP = 0, 1, 2
#: a queued send: channel, what (a read: transfer id and source; a control frame: kind and payload), deadline, the
#: event loop's future
_SendJob = tuple[Channel, "tuple[int, Sequence[Segment]] | tuple[int, bytes]", float, "asyncio.Future[None]"]


class _SendQueue:
    """One link's reads waiting to be sent (``Owner._queued``), in order, by at most one executor job per connection
    of its channel (``drain``). The jobs are taken under ``lock``; their ends go back to the event loop in batches:
    one ``call_soon_threadsafe`` for all that ended since the loop last looked (``_flush``)."""

    __slots__ = ("loop", "lock", "jobs", "running", "ended", "flushing")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.lock = threading.Lock()
        self.jobs: collections.deque[_SendJob] = collections.deque()
        self.running = 0            # senders (``drain``) started or waiting for a turn on the threads
        self.ended: list[tuple[asyncio.Future[None], BaseException | None]] = []
        self.flushing = False       # a ``_flush`` is scheduled on the loop

    def idle(self) -> bool:
        with self.lock:
            return not self.running and not self.jobs

    def drain(self, turn: list[int]) -> None:
        """A sender (an executor thread): the queued reads, one after the other, until none is left. ``turn``: this
        sender's state, under ``lock`` (``_PENDING`` until it begins; ``give_up`` marks one that never will)."""
        with self.lock:
            if turn[0] != _PENDING:
                return
            turn[0] = _BEGUN
        while True:
            with self.lock:
                if not self.jobs:
                    self.running -= 1
                    return
                channel, (head, body), deadline, done = self.jobs.popleft()
            failure: BaseException | None = None
            try:
                if isinstance(body, (bytes, bytearray)):   # a control frame (``queued_control``), else a read
                    channel.send_control(head, body, deadline)
                else:
                    channel.send(TransferId(head), body, deadline)
            except Exception as exc:  # noqa: BLE001 - the send's failure, raised where it is awaited
                failure = exc
            self._ended(done, failure)

    def give_up(self, turn: list[int], exc: BaseException) -> None:
        """On the loop, the sender of ``turn`` was cancelled or refused: if it never began it never will, and when no
        other sender is left the queued reads fail (nothing of them was sent). One that began drains on."""
        with self.lock:
            if turn[0] != _PENDING:
                return
            turn[0] = _GAVE_UP
            self.running -= 1
            jobs = list(self.jobs) if not self.running else []
            if jobs:
                self.jobs.clear()
        for job in jobs:
            if not job[3].done():
                job[3].set_exception(DataDistError(StatusCode.LLM_FAILED, f"could not be sent: {exc!r}"))

    def _ended(self, done: asyncio.Future[None], failure: BaseException | None) -> None:
        with self.lock:
            self.ended.append((done, failure))
            if self.flushing:
                return
            self.flushing = True
        try:
            self.loop.call_soon_threadsafe(self._flush)
        except RuntimeError:   # the loop is closed: the daemon is stopping, nobody awaits
            pass

    def _flush(self) -> None:
        """On the loop: the reads that ended, to their awaiting answers."""
        with self.lock:
            ended, self.ended = self.ended, []
            self.flushing = False
        for done, failure in ended:
            if done.done():
                continue
            if failure is None:
                done.set_result(None)
            else:
                done.set_exception(failure)
