"""A worker's small pull or push settled on the data reader thread that reads its reply (docs/daemon.md, "A small
pull or push ended by the reader thread"): ``FastTransfers.start`` with the attach frame's ints on the reactor thread
that read the frame (or on the event loop when the loop had to handle it first: ``api.attachread``), ``_land`` (a
pull: the bytes into the rows) or ``_pushed`` (a push: the owner took them) on the reader thread,
``_pull_answer`` / ``_push_answer`` on the loop for every other outcome (the general path's codes: ``Requester``).
One shape serves both directions: the same checks, the same pending call (``FrameCalls.register_fast``), the same
send (``try_control``); a pull's frame is a READ whose reply carries the bytes, a push's a WRITE carrying them."""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol, Sequence

from ..core.errors import DataDistError, StatusCode
from ..state import pullview
from ..state.engine import Engine
from ..state.metrics import transfer_log
from ..transport.base import CONTROL_CALL
from .model import LinkState, LocalLink
from .requester import Requester, explained
from .table import LinkTable
from .wire import ownerwire
from .wire.ownercalls import INLINE_READ_MAX, OwnerReply

__all__ = ["FastTransfers", "FastReply"]

log = logging.getLogger("datadistd.links")


class FastReply(Protocol):
    """Who hears of a fast transfer's end (``FastTransfers.start``; the attach server)."""

    def ended_here(self, token: Any, nbytes: int, transport: str) -> None:
        """It succeeded (on a data reader thread)."""

    def ended(self, token: Any, status: int, nbytes: int, transport: str, message: str) -> None:
        """It ended (on the event loop): status 0 and its bytes, or an ``LLMStatusCode`` and why."""


#: a fast transfer in flight: link, local rows (destination or source), local blocks, bytes, start time, reply
#: target and token, timeout_ms, local cache id, the pull view's generation, metrics (the pending call's context:
#: ``FrameCalls.register_fast``)
_FastCtx = tuple[Any, pullview.Dest, tuple[int, ...], int, float, FastReply, Any, int, int, int, Any]
_read_call, _write_call = ownerwire.small_read_call, ownerwire.small_write_call
_REPLY_DATA = ownerwire.REPLY_DATA


def _move_rows(engine: Engine, rows: pullview.Dest, generation: int, local: Sequence[int], buf: bytes | bytearray,
               at: int, into_rows: bool) -> bool:
    """Blocks ``local`` of ``rows`` (tensor by tensor, block by block) to or from ``buf[at:]`` -- into the rows
    (``into_rows``: a pull's bytes) or out of them (a push's) -- under the engine's ``read_lock`` once the view of
    ``generation`` is checked current (``state.pullview``: a deallocate takes that lock before memory goes, so no
    byte moves to or from memory another cache took). False, nothing moved, when the view is stale or one of its
    views was released (its handle closed). ``FastTransfers._land`` inlines the same loop (the reader thread's
    path: one Python call fewer per pull, counted by bench scenario 12)."""
    data = memoryview(buf)
    row = rows.row
    with engine.read_lock:
        if engine.closed or generation != engine.registry.generation:
            return False
        try:
            for view, base in rows.tensors:
                for b in local:
                    start = base + b * row
                    if into_rows:
                        view[start:start + row] = data[at:at + row]
                    else:
                        data[at:at + row] = view[start:start + row]
                    at += row
        except (ValueError, TypeError):
            return False
    return True


class FastTransfers:
    """Small pulls and pushes of one engine ended on the reader thread (``start``); the rest is ``requester``'s."""

    def __init__(self, table: LinkTable, requester: Requester) -> None:
        self.table = table
        self.requester = requester
        self._view: pullview.PullView | None = None     # the local rows (``state.pullview``)
        self._bounds: dict[int, Any] = {}               # peer cluster -> its pull metrics (``DaemonMetrics.bound``)
        self._push_bounds: dict[int, Any] = {}          # peer cluster -> its push metrics
        self._channels: dict[int, tuple[Any, Any]] = {}  # peer cluster -> (link, its channel) as last looked up

    def start(self, push: bool, cluster: int, model_id: int, cache_id: int, frame: bytes, at: int,
              local: tuple[int, ...], timeout_ms: int, to: FastReply, token: object, on_loop: bool) -> bool | None:
        """A worker's small ``pull_blocks`` (``push`` False: into blocks ``local`` of cache ``cache_id``) or
        ``push_blocks`` (from those blocks) by ``BlocksCacheKey(cluster, model_id)`` (whole tensors, no layer range,
        no offset), the remote block numbers the ``len(local)`` u64 words at ``frame[at:]``: started here with
        nothing but ints, ended on the data reader thread that reads the owner's reply (``_land``: the
        pulled bytes copied into the rows; ``_pushed``: the owner's success; then ``to.ended_here``) or, for
        anything else, on the loop with the general path's codes and side effects (``_pull_answer`` /
        ``_push_answer``: ``to.ended``). A push's bytes are read from the rows here, into its WRITE frame
        (``_move_rows``). False, with nothing done, when it is not such a transfer or cannot go at once -- an unknown
        or unmapped local cache, a block out of range, too many bytes, no such link, a busy connection: the general
        path (``Requester.start_pull`` / ``push``) runs it from the start and gives its answer.

        Off the event loop (``on_loop`` False: the attach connection's reactor thread, never two at once for one
        engine) this only reads what the loop owns -- the link table's dicts, the link's state, the published view
        -- and returns None, nothing done, when the loop must act first: the view is stale (republished there,
        ``pullview.publish``); the call's sweep, when none is armed early enough, is asked of the loop
        (``FrameCalls.register_fast``) without waiting for it. Link counts are taken before the call is registered
        and given back only by whoever pops it: the sweep or ``close`` may answer it (on the loop) before this
        returns."""
        table = self.table
        link = table.links.get(cluster) or table.served.get(cluster)
        if (link is None or link.state != LinkState.ESTABLISHED or link.layerwise or type(link) is LocalLink
                or not table.transport.inline_small_reads or table.closed):
            return False
        engine = table.engine
        view = self._view
        if view is None or view.generation != engine.registry.generation:
            if not on_loop:
                return None
            view = self._view = pullview.publish(engine)
        dest = view.caches.get(cache_id)
        if dest is None:
            return False
        rows = dest.rows
        for b in local:
            if b >= rows:
                return False
        n = len(local)
        nbytes = len(dest.tensors) * n * dest.row
        calls = link.calls   # type: ignore[union-attr]   # not a LocalLink (above; no isinstance on an ABC here)
        known = self._channels.get(cluster)
        if known is not None and known[0] is link:
            channel = known[1]
        else:   # looked up once per link (dropped below when it stops taking frames)
            channel = table.channel_of(link)
            if channel is not None:
                self._channels[cluster] = (link, channel)
        if nbytes > INLINE_READ_MAX or channel is None or calls.closed:
            return False
        timeout_ms = timeout_ms or engine.options.sync_kv_timeout_ms
        now = time.monotonic()
        deadline = now + timeout_ms / 1000
        bounds = self._push_bounds if push else self._bounds
        bound = bounds.get(cluster)
        if bound is None and table.node.metrics is not None:
            bound = bounds[cluster] = table.node.metrics.bound("push" if push else "pull", str(table.cluster_id),
                                                               str(cluster))
        ctx = (link, dest, local, nbytes, now, to, token, timeout_ms, cache_id, view.generation, bound)
        with link.reader_lock:   # the reader thread that lands the reply ends it (``_land`` / ``_pushed``)
            link.inflight += 1
            if not push:
                link.pulls += 1
        cid = 0
        try:   # once registered, the reply, the sweep or ``close`` (off the loop) may end it
            if push:   # the reply carries no bytes: ``expected`` 0
                cid = calls.register_fast(deadline, self._push_answer, self._pushed, ctx, 0, on_loop)
                write, into = _write_call(command_id=cid, timeout_ms=timeout_ms, cluster_id=cluster,
                                          model_id=model_id, blocks=frame[at:at + 8 * n], nbytes=nbytes)
                sent = (_move_rows(engine, dest, view.generation, local, write, into, False)
                        and channel.try_control(CONTROL_CALL, write, deadline))
            else:
                cid = calls.register_fast(deadline, self._pull_answer, self._land, ctx, nbytes, on_loop)
                sent = channel.try_control(CONTROL_CALL, _read_call(
                    command_id=cid, timeout_ms=timeout_ms, cluster_id=cluster, model_id=model_id,
                    blocks=frame[at:at + 8 * n], nbytes=nbytes), deadline)
        except DataDistError:   # no live connection, or the calls closed: the general path fails it with its code
            sent = False
        if not sent:
            self._channels.pop(cluster, None)
            if cid and not calls.forget(cid):   # answered meanwhile (the sweep, ``close``): it ended there
                return True
            with link.reader_lock:
                link.inflight -= 1
                if not push:
                    link.pulls -= 1
            return False
        if bound is not None:
            bound.begin()
        return True

    def _land(self, payload: bytes, ctx: _FastCtx) -> bool:
        """A fast pull's whole, successful reply, on the data reader thread that read it: its bytes copied into
        the rows under the engine's ``read_lock`` while the view is current (``state.pullview``), the worker
        answered from here. False, nothing written, when the view went stale: the loop's answer lands it."""
        link, dest, local, nbytes, started, to, token, _, _, generation, bound = ctx
        engine = self.table.engine
        data = memoryview(payload)
        at = _REPLY_DATA
        row = dest.row
        with engine.read_lock:
            if engine.closed or generation != engine.registry.generation:
                return False
            try:
                for view, base in dest.tensors:
                    for b in local:
                        start = base + b * row
                        view[start:start + row] = data[at:at + row]
                        at += row
            except (ValueError, TypeError):   # a released view (its handle closed): the loop settles it
                return False   # (``_move_rows``'s loop, inlined: the hot path)
        with link.reader_lock:
            link.inflight -= 1
            link.pulls -= 1
            link.bytes_in += nbytes
        if bound is not None:
            bound.end("success", time.monotonic() - started, nbytes, len(local))
        to.ended_here(token, nbytes, link.transport)
        return True

    def _pushed(self, payload: bytes, ctx: _FastCtx) -> bool:
        """A fast push's successful reply, on the data reader thread that read it: the owner has the bytes, the
        worker is answered from here."""
        link, _, local, nbytes, started, to, token, _, _, _, bound = ctx
        with link.reader_lock:
            link.inflight -= 1
            link.bytes_out += nbytes
        if bound is not None:
            bound.end("success", time.monotonic() - started, nbytes, len(local))
        to.ended_here(token, nbytes, link.transport)
        return True

    def _pull_answer(self, result: OwnerReply | DataDistError, ctx: _FastCtx) -> None:
        """A fast pull that did not end on the reader thread, on the event loop: the general path's outcome for
        the same answer -- its failure codes and messages (``_failed``), or its bytes landed here (the destination
        looked up again: gone, the pull fails as one into a missing cache)."""
        link, dest, local, nbytes, started, to, token, timeout_ms, cache_id, _, bound = ctx
        try:
            if isinstance(result, DataDistError):
                raise explained(self.requester._transfer_failure(link, result, timeout_ms), dest.entry, 0)
            if len(result.data) != nbytes:
                raise DataDistError(StatusCode.LLM_FAILED, f"cluster {link.remote_cluster} answered a read of "
                                                           f"{nbytes} bytes with {len(result.data)}")
            engine = self.table.engine
            view = self._view
            if view is None or view.generation != engine.registry.generation:
                view = self._view = pullview.publish(engine)
            now = view.caches.get(cache_id)
            if now is None or now.entry is not dest.entry:
                raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"local cache {cache_id} does not exist")
            if not _move_rows(engine, now, view.generation, local, result.data, 0, True):
                raise DataDistError(StatusCode.LLM_FAILED, f"local cache {cache_id} is not mapped")
        except Exception as exc:  # noqa: BLE001 - the pull ends here whatever went wrong; a bug is logged too
            self._failed(False, exc, ctx)
            return
        with link.reader_lock:
            link.inflight -= 1
            link.pulls -= 1
            link.bytes_in += nbytes
        if bound is not None:
            bound.end("success", time.monotonic() - started, nbytes, len(local))
        to.ended(token, 0, nbytes, link.transport, "")

    def _push_answer(self, result: OwnerReply | DataDistError, ctx: _FastCtx) -> None:
        """A fast push that did not end on the reader thread, on the event loop: the general path's outcome for the
        same answer (``_failed``: ``_transfer_failure``, ``explained``), or its success."""
        link, src, local, nbytes, started, to, token, timeout_ms, _, _, bound = ctx
        if isinstance(result, DataDistError):
            try:
                failure = explained(self.requester._transfer_failure(link, result, timeout_ms), src.entry, 0)
            except Exception as exc:  # noqa: BLE001 - a bug of ours: still answered (``_failed`` logs it)
                self._failed(True, exc, ctx)
                return
            self._failed(True, failure, ctx)
            return
        with link.reader_lock:
            link.inflight -= 1
            link.bytes_out += nbytes
        if bound is not None:
            bound.end("success", time.monotonic() - started, nbytes, len(local))
        to.ended(token, 0, nbytes, link.transport, "")

    def _failed(self, push: bool, exc: Exception, ctx: _FastCtx) -> None:
        """A fast transfer failed (the event loop): its counts undone, its metrics and log line, the worker told."""
        link, _, _, _, started, to, token, _, cache_id, _, bound = ctx
        what = "push" if push else "pull"
        if not isinstance(exc, DataDistError):
            log.exception("cluster %s: a %s with cluster %s failed", self.table.cluster_id, what, link.remote_cluster)
            exc = DataDistError(StatusCode.LLM_FAILED, f"the {what} failed: {exc!r}")
        with link.reader_lock:
            link.inflight -= 1
            if not push:
                link.pulls -= 1
        if bound is not None:
            bound.end(exc.code.name)
        transfer_log.warning("cluster %s %s peer cluster %s failed: cache %s, %.1f ms: %s", self.table.cluster_id,
                             what, link.remote_cluster, cache_id, (time.monotonic() - started) * 1e3, exc)
        to.ended(token, int(exc.code), 0, "", exc.message)
