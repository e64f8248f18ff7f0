"""How a resolved transfer (``links.transfer.Transfer``) moves its bytes: one ``RowPath`` per engine, chosen once
by what its transport declares (``path_for``: the only place the link code asks which transport it runs on), plus
``LocalPath`` for a link between two engines of this daemon.

- ``StreamPath`` (tcp: the bytes cross the link's own sockets): a small pull is one READ whose REPLY carries the
  rows, landed by the data reader thread that reads it; a larger one is the same READ answered as data frames
  straight into the destination (a ``Receipt``), its REPLY behind them. A small push is one WRITE carrying its
  rows; a larger one opens a write at the owner, streams the bytes and commits.
- ``TablePath`` (nixl, hccl: a fabric reads the owner's memory): a pull reads rows of the table the owner
  published to the link (``links.published``), no owner call; a push streams as ``StreamPath`` does.

Every path ends its transfers in ``Transfers.finish`` / ``Transfers.failed``; none answers a worker itself.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Protocol, Sequence

import numpy as np

from ..core.errors import DataDistError, StatusCode
from ..core.types import CacheKeyRef, IdIndexRef, TransferId
from ..engine import pullview
from ..engine.engine import Engine
from ..memory.base import Segment
from ..memory.copy import all_mapped, copy_segments, read_bytes, write_bytes
from ..memory.segments import SegmentTable
from ..transport.base import CONTROL_CALL, Channel, ReadTables, Receipt
from .model import LocalLink
from .record import Transfer
from .table import LinkTable
from .wire import ownerwire
from .wire.framecalls import FrameCalls
from .wire.ownercalls import INLINE_READ_MAX, OwnerReply, ReadCmd, WriteCmd

__all__ = ["RowPath", "StreamPath", "TablePath", "LocalPath", "Ending", "path_for"]

log = logging.getLogger("datadistd.links")

_REPLY_DATA = ownerwire.REPLY_DATA
_read_call = ownerwire.small_read_call


class Ending(Protocol):
    """What a path ends its transfers with (``links.transfer.Transfers``)."""

    table: LinkTable

    def finish(self, t: Transfer, failure: BaseException | None = None) -> None: ...

    def failed(self, t: Transfer, exc: BaseException) -> None: ...

    def local_view(self) -> pullview.PullView: ...


def path_for(transfers: Ending) -> "RowPath":
    """The path of the engine's transport (what its class declares: ``transport.base``)."""
    transport = transfers.table.transport
    if isinstance(transport, ReadTables):
        return TablePath(transfers)
    return StreamPath(transfers)


def _move_rows(engine: Engine, t: Transfer, rows: pullview.Dest, generation: int, buf: bytes | bytearray,
               at: int) -> bool:
    """Blocks ``t.local`` of ``rows`` (tensor by tensor, block by block) to or from ``buf[at:]`` -- into the rows
    (a pull's bytes) or out of them (a push's) -- under the engine's ``read_lock`` once the view of ``generation``
    is checked current (``engine.pullview``: a deallocate takes that lock before memory goes). False, nothing
    moved, when the view is stale or one of its views was released."""
    data = memoryview(buf)
    row, into = rows.row, not t.push
    with engine.read_lock:
        if engine.closed or generation != engine.registry.generation:
            return False
        try:
            for view, base in rows.tensors:
                for b in t.local:
                    start = base + b * row
                    if into:
                        view[start:start + row] = data[at:at + row]
                    else:
                        data[at:at + row] = view[start:start + row]
                    at += row
        except (ValueError, TypeError):
            return False
    return True


def _land_pieces(engine: Engine, generation: int, pieces: Sequence[tuple[memoryview, int, int]], buf: bytes,
                 at: int) -> bool:
    """``buf[at:]`` into ``pieces`` (each ``(view, offset, length)``, in order) under the engine's ``read_lock`` once
    the view of ``generation`` is checked current (``engine.pullview``); False, nothing landed, when it is stale or
    a view was released."""
    data = memoryview(buf)
    with engine.read_lock:
        if engine.closed or generation != engine.registry.generation:
            return False
        try:
            for view, offset, length in pieces:
                view[offset:offset + length] = data[at:at + length]
                at += length
        except (ValueError, TypeError):
            return False
    return True


class LocalPath:
    """Both engines live in this daemon: the transfer is a copy, on the daemon's threads, between pinned caches."""

    def __init__(self, transfers: Ending) -> None:
        self.transfers = transfers

    def start(self, t: Transfer) -> bool:
        self.transfers.table.spawn(self._copy(t))
        return True

    async def _copy(self, t: Transfer) -> None:
        link = t.link
        assert isinstance(link, LocalLink) and t.spec is not None
        owner = link.local_peer.engine
        try:
            release = False
            if t.push:
                cache_id, theirs = owner.prepare_write(t.spec)
            else:
                cache_id, theirs, release = owner.prepare_read(t.spec)
            try:
                dst, src = (theirs, t.dst) if t.push else (t.dst, theirs)
                await self.transfers.table.in_thread(copy_segments, dst, src)
            finally:
                owner.unpin(cache_id)
            if release:
                assert isinstance(t.spec.key, (CacheKeyRef, IdIndexRef))
                owner.release_pulled(t.spec.key, t.spec.tensor_start, t.spec.tensor_count)
        except Exception as exc:  # noqa: BLE001 - every failure is answered, a refusal explained as any other's
            self.transfers.failed(t, exc)
            return
        self.transfers.finish(t)


class RowPath:
    """What every remote path shares: the link's owner calls and channel, a push by stream, the end of a READ."""

    def __init__(self, transfers: Ending) -> None:
        self.transfers = transfers
        self.table = transfers.table
        self.local = LocalPath(transfers)

    #: the most bytes of a quick-shape transfer this path starts as resolved, off the loop too (0: none)
    quick_max = 0

    def start(self, t: Transfer, on_loop: bool) -> bool:
        """Start ``t`` (the module doc); False only off the loop, nothing done."""
        if t.push:
            self.table.spawn(self._push_stream(t))
        else:
            self.table.spawn(self._pull(t))
        return True

    async def _pull(self, t: Transfer) -> None:
        raise DataDistError(StatusCode.LLM_FAILED, f"no pull path on {self.table.transport.name}")

    def _calls(self, t: Transfer) -> tuple[FrameCalls, Channel]:
        """The owner calls on the other end of ``t``'s link and its data channel (which carries both)."""
        link = t.link
        assert not isinstance(link, LocalLink)
        channel = self.table.channel_of(link)
        if channel is None or channel.broken:
            raise DataDistError(StatusCode.LLM_LINK_FAILED, f"no live data connection to cluster {link.remote_cluster}")
        return link.calls, channel

    async def _push_stream(self, t: Transfer) -> None:
        """A push whose bytes go as a transfer: the owner opens it, the bytes stream (the receiver hears of a failure
        at once: ABORT), the owner commits."""
        assert t.spec is not None
        try:
            calls, channel = self._calls(t)
            (tid,) = await calls.open_write([t.spec], t.deadline - time.monotonic())
            try:
                await self.table.in_thread(channel.send, TransferId(tid), t.dst, t.deadline)
            except DataDistError:
                channel.abort(TransferId(tid), StatusCode.LLM_TIMEOUT)
                raise
            await calls.commit_write([tid], t.deadline - time.monotonic())
        except Exception as exc:  # noqa: BLE001 - a bug of ours too: answered, logged (``Transfers.failed``)
            self.transfers.failed(t, exc)
            return
        self.transfers.finish(t)

    async def _release(self, t: Transfer, calls: FrameCalls, confirm: bool) -> None:
        """The RELEASE of a pulled key, which the owner consumes. ``confirm``: its answer is what says the cache
        was still there (a table read asked nothing before): a cache or key gone fails the pull with the owner's
        code; any other failure is logged (the bytes are in)."""
        spec = t.spec
        assert spec is not None and isinstance(spec.key, (CacheKeyRef, IdIndexRef))
        try:
            await calls.release(spec.key, spec.tensor_start, spec.tensor_count,
                                max(0.5, t.deadline - time.monotonic()))
        except DataDistError as exc:
            if confirm and exc.code == StatusCode.LLM_KV_CACHE_NOT_EXIST:
                raise
            log.warning("cluster %s: pulled key from cluster %s but could not release it: %s",
                        self.table.cluster_id, t.link.remote_cluster, exc)


class StreamPath(RowPath):
    """tcp: the rows cross the link's own sockets (the module doc)."""

    quick_max = INLINE_READ_MAX

    def _frame(self, t: Transfer, cid: int, transfer_id: int) -> bytes | bytearray | None:
        """``t``'s CALL frame (``ownerwire``) but the quick shape's READ (``start`` builds that one straight from the
        attach frame's block words): a READ (inline when ``transfer_id`` is 0) or a small push's WRITE with its rows
        copied in; None when the rows could not be read (a stale local view: the quick shape only)."""
        ms = max(1, int((t.deadline - time.monotonic()) * 1000))
        cluster = t.link.remote_cluster
        if t.spec is None:
            frame, at = ownerwire.small_write_call(command_id=cid, timeout_ms=ms, cluster_id=cluster,
                                                   model_id=t.model_id, blocks=t.remote, nbytes=t.nbytes)
            assert t.rows is not None
            return frame if _move_rows(self.table.engine, t, t.rows, t.generation, frame, at) else None
        if t.push:
            return ownerwire.encode_call(WriteCmd(cid, t.spec, ms, read_bytes(t.dst)))
        return ownerwire.encode_call(ReadCmd(cid, transfer_id, t.spec, ms, inline=transfer_id == 0))

    def start(self, t: Transfer, on_loop: bool) -> bool:
        """The one sender of ``t``'s CALL frame: a READ -- inline (its REPLY carries the rows, landed by the reader
        thread that reads it, ``_landed``, or on the loop, ``_answered``) or, for a larger pull, answered as data
        frames into the rows (a ``Receipt``; its REPLY behind them ends it on the loop, ``_streamed``) -- or a small
        push's WRITE carrying its rows. A larger push, or one from rows the daemon does not map, streams
        (``_push_stream``). Off the loop (the quick shape) nothing waits: a busy connection declines it."""
        link, push, small = t.link, t.push, t.nbytes <= INLINE_READ_MAX
        if push and (not small or t.spec is not None and not all_mapped(t.dst)):
            self.table.spawn(self._push_stream(t))   # the loop only: the quick shape is small and mapped
            return True
        channel = self.table.channel_of(link)
        calls = link.calls   # type: ignore[union-attr]   # not a LocalLink (``Transfers._start``)
        receipt: Receipt | None = None
        try:
            if channel is None:   # a broken one refuses the frame below
                raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                    f"no live data connection to cluster {link.remote_cluster}")
            if small:
                cid = calls.register_fast(t.deadline, self._answered, self._landed, t, 0 if push else t.nbytes,
                                          on_loop)
            else:
                receipt = self.table.transport.expect(t.dst, channel=channel)
                cid = calls.register_fast(t.deadline, functools.partial(self._streamed, receipt), None, t, 0)
        except DataDistError as exc:   # no live channel, the calls closed
            if not on_loop:
                return False
            self.transfers.failed(t, exc)
            return True
        if t.spec is None and not push:   # the quick shape's READ, straight from the attach frame's block words
            frame: bytes | bytearray | None = _read_call(command_id=cid, timeout_ms=t.timeout_ms,
                                                         cluster_id=link.remote_cluster, model_id=t.model_id,
                                                         blocks=t.remote, nbytes=t.nbytes)
        else:
            frame = self._frame(t, cid, 0 if receipt is None else int(receipt.transfer_id))
        failure: DataDistError | None = None
        if frame is not None:
            try:
                if channel.try_control(CONTROL_CALL, frame, t.deadline):
                    return True
                if on_loop:
                    calls.send_later(cid, bytes(frame), t.deadline)
                    return True
            except DataDistError as exc:   # the channel broke
                failure = DataDistError(StatusCode.LLM_LINK_FAILED, f"no live data connection to cluster "
                                                                    f"{link.remote_cluster} ({exc.message})")
        if receipt is not None:
            receipt.cancel()
        if not calls.forget(cid):   # answered meanwhile (the sweep, ``close``): it ended there
            return True
        if failure is not None and on_loop:
            self.transfers.failed(t, failure)
            return True
        if on_loop:   # the local rows went (a stale view on the loop): as a pull into a missing cache
            self.transfers.finish(t, DataDistError(StatusCode.LLM_PARAM_INVALID,
                                                   f"local cache {t.cache_id} does not exist"))
            return True
        return False

    def _landed(self, payload: bytes, t: Transfer) -> bool:
        """A small transfer's whole, successful REPLY on the data reader thread that read it: a pull's bytes copied
        into the rows (``_move_rows``' loop, inlined: the hot path), then ``finish``. False, nothing done, for a
        pinned (planned) transfer or a stale view: the loop's answer ends it (``_answered``)."""
        if t.pinned:
            return False
        if t.landing is not None:   # a small read of HIXL's extents (``Transfers._quick_extents``)
            if not _land_pieces(self.table.engine, t.generation, t.landing[2], payload, _REPLY_DATA):
                return False
        elif not t.push:
            rows, engine = t.rows, self.table.engine
            assert rows is not None
            data, at, row = memoryview(payload), _REPLY_DATA, rows.row
            with engine.read_lock:
                if engine.closed or t.generation != engine.registry.generation:
                    return False
                try:
                    for view, base in rows.tensors:
                        for b in t.local:
                            start = base + b * row
                            view[start:start + row] = data[at:at + row]
                            at += row
                except (ValueError, TypeError):   # a released view (its handle closed): the loop settles it
                    return False
        self.transfers.finish(t)
        return True

    def _answered(self, result: OwnerReply | DataDistError, t: Transfer) -> None:
        """A small transfer's answer on the event loop: a failure (``Transfers.failed``), or a pull's bytes landed
        here -- into the planned segments, or the quick shape's rows looked up again (gone: it fails as a pull into
        a missing cache) -- then the RELEASE of a consumed key, if the owner asks for it."""
        if isinstance(result, DataDistError):
            self.transfers.failed(t, result)
            return
        try:
            if not t.push:
                self._land_here(t, result.data)
        except Exception as exc:  # noqa: BLE001 - this side's refusal as it is, or a bug of ours (``finish``)
            self.transfers.finish(t, exc)
            return
        if result.release_needed and not t.push:
            self.table.spawn(self._released(t))
            return
        self.transfers.finish(t)

    def _land_here(self, t: Transfer, data: bytes) -> None:
        if len(data) != t.nbytes:
            raise DataDistError(StatusCode.LLM_FAILED, f"cluster {t.link.remote_cluster} answered a read of "
                                                       f"{t.nbytes} bytes with {len(data)}")
        if t.landing is not None:   # the extents' rows found again by the view of now (they may have moved)
            view = self.transfers.local_view()
            locals_, lens, _ = t.landing
            try:
                pieces, _ = pullview.pieces(view, locals_, lens, f"engine {self.table.cluster_id}")
            except DataDistError as exc:
                raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"the local registration went during the "
                                                                  f"transfer: {exc.message}") from None
            if not _land_pieces(self.table.engine, view.generation, pieces, data, 0):
                raise DataDistError(StatusCode.LLM_FAILED, "the local registration is not mapped")
            return
        if t.spec is not None:
            write_bytes(t.dst, data)   # pinned; small: a memmove the loop may make
            return
        view = self.transfers.local_view()
        rows = view.caches.get(t.cache_id)
        if rows is None or t.rows is None or rows.entry is not t.rows.entry:
            raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"local cache {t.cache_id} does not exist")
        if not _move_rows(self.table.engine, t, rows, view.generation, data, 0):
            raise DataDistError(StatusCode.LLM_FAILED, f"local cache {t.cache_id} is not mapped")

    async def _released(self, t: Transfer) -> None:
        assert not isinstance(t.link, LocalLink)
        await self._release(t, t.link.calls, confirm=False)
        self.transfers.finish(t)

    # ---- a larger pull's end: its REPLY came behind the data frames ---------------------------------------

    def _streamed(self, receipt: Receipt, result: OwnerReply | DataDistError, t: Transfer) -> None:
        if isinstance(result, DataDistError):
            receipt.cancel()
            self.transfers.failed(t, result)
        elif not receipt.done or result.release_needed:   # striped: the rest may still be arriving
            self.table.spawn(self._stream_end(t, receipt, result.release_needed))
        else:
            self.transfers.finish(t)

    async def _stream_end(self, t: Transfer, receipt: Receipt, release: bool) -> None:
        try:
            await self.table.in_thread(receipt.wait, t.deadline)
            if release:
                assert not isinstance(t.link, LocalLink)
                await self._release(t, t.link.calls, confirm=False)
        except DataDistError as exc:
            receipt.cancel()
            self.transfers.failed(t, exc)
            return
        except BaseException as exc:
            receipt.cancel()
            self.transfers.finish(t, exc if isinstance(exc, Exception) else DataDistError(
                StatusCode.LLM_FAILED, "the pull was cancelled"))
            if not isinstance(exc, Exception):
                raise
            return
        self.transfers.finish(t)


class TablePath(RowPath):
    """nixl, hccl: a pull reads rows of the table the owner published to the link (``links.published``)."""

    async def _pull(self, t: Transfer) -> None:
        """The key resolved by the owner's table, then one READ of the rows straight into the destination -- no
        owner call, but the RELEASE that consumes a CacheKey after its pull. A key the table lacks is asked once
        (a ping: the owner's table changes precede its reply), then refused with the owner's code."""
        published = self.table.published
        assert published is not None and t.spec is not None
        link = t.link
        try:
            calls, channel = self._calls(t)
            found = published.resolve(channel, channel.token, link.remote_cluster, t.spec)
            if found is None:
                await calls.ping(max(0.0, t.deadline - time.monotonic()))
                found = published.resolve(channel, channel.token, link.remote_cluster, t.spec, asked=True)
            assert found is not None
            for handle, rows, which in found.parts or ((found.handle, found.spans, None),):
                await self._read(channel, handle, rows, t.dst if which is None else _some(t.dst, which), t.deadline)
            if found.release:
                await self._release(t, calls, confirm=True)
        except Exception as exc:  # noqa: BLE001 - a bug of ours too: answered, logged (``Transfers.failed``)
            self.transfers.failed(t, exc)
            return
        self.transfers.finish(t)


    async def _read(self, channel: Channel, handle: int, rows: np.ndarray, dst: Sequence[Segment],
                    deadline: float) -> None:
        """One READ of ``rows`` of the owner's published ``handle`` straight into ``dst``."""
        tables = self.table.published.tables   # type: ignore[union-attr]   # a table path's table publishes
        posted = tables.start_rows(channel, handle, rows, dst, deadline, asyncio.get_running_loop())
        if posted is None:
            await self.table.in_thread(tables.read_rows, channel, handle, rows, dst, deadline)
        else:
            await _landed(posted, deadline)


def _some(dst: Sequence[Segment], which: np.ndarray) -> SegmentTable:
    """The segments of ``dst`` (one per HIXL extent, in order) that ``which`` selects."""
    table = SegmentTable.of(dst)
    return SegmentTable(table.handles, table.which[which], table.offsets[which], table.lengths[which])


async def _landed(posted: asyncio.Future[None], deadline: float) -> None:
    """Wait for a READ ``start_rows`` posted. Cancelled, it still waits for the READ to end (the transport ends it
    by its deadline) before the pull lets go of its destination."""
    try:
        await asyncio.shield(posted)
    except asyncio.CancelledError:
        if not posted.done():
            await asyncio.wait([posted], timeout=max(0.0, deadline - time.monotonic()) + 1.0)
        raise
