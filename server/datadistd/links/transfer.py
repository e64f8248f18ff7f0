"""A worker's pull or push over a link, the one path every size and transport takes (links/README.md).

1. **Resolve once** (``Transfers.transfer``): the link, the local rows or segments, what the owner is asked for,
   the bytes and the deadline become a ``Transfer`` record. Two shapes reach it: a whole-tensor blocks transfer by
   ``BlocksCacheKey`` of at most ``QUICK_BLOCKS`` blocks as the attach frame carries it (its geometry from the
   engine's published local rows, ``engine.pullview``: no order object, no plan, possible off the event loop), and
   any other order (``core.plan``: the gRPC ``Pull``/``Push`` and every other attach frame, on the loop). Each
   shape makes the same checks; ownership of the engine was checked by the caller (``api.transfers``).
2. **Start one way** (``Transfers._start``): the link's ``RowPath`` -- a copy when both engines live here
   (``LocalPath``), else the transport's (``links.paths``: chosen once per engine, the only place the link code
   asks which transport it runs on).
3. **End one way** (``Transfers.finish``): counters, metrics, the log line and the worker's answer, from whichever
   thread ends it -- a data reader thread for a small one that landed there, the event loop for the rest.

Memory: a transfer that lands off the loop (a small pull's bytes copied by the reader thread that read them) holds no
pin: it copies under the engine's ``read_lock`` once the local view's generation is checked current
(``engine.pullview``), and a stale view hands the reply to the loop, which looks the cache up again. Every other
transfer pins its local cache on the loop from start to end (``Transfer.pinned``) and ends on the loop.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..core.errors import DataDistError, StatusCode
from ..core.layout import explain_size_mismatch
from ..core.plan import AddrRef, TransferOrder, plan_pull, plan_push
from ..core.registry import CacheEntry
from ..core.types import CacheId, ReadMode, RemoteSpec
from ..engine import pullview
from ..engine.engine import tensors_of
from ..engine.extents import FEW, ExtentOrder, remote_pairs
from ..memory.segments import segments_of
from ..ops.metrics import transfer_log
from .model import AnyLink, InboundLink, Link, LinkState, LocalLink
from .paths import path_for
from .record import Ends, Transfer
from .table import LinkTable
from .wire import ownerwire

__all__ = ["Transfer", "Transfers", "Ends", "QUICK_BLOCKS", "explained"]

log = logging.getLogger("datadistd.links")

#: the most blocks the quick shape names (what the owner's reader thread answers in one frame: ``ownerwire``)
QUICK_BLOCKS = ownerwire.SMALL_READ_BLOCKS


def explained(exc: DataDistError, entry: CacheEntry, tensor_count: int) -> DataDistError:
    """``exc``, or, when it is the owner's refusal of this side's byte count, the whole story: both caches' tensors
    and layouts, what differs and the option that fixes it (``core.layout.explain_size_mismatch``)."""
    if exc.code != StatusCode.LLM_PARAM_INVALID:
        return exc
    told = explain_size_mismatch(exc.message, entry.desc, entry.is_blocks, entry.cache_id,
                                 tensor_count or entry.desc.num_tensors, tensor_count != 0)
    return exc if told is None else DataDistError(StatusCode.LLM_PARAM_INVALID, told)


class Transfers:
    """The transfers of one engine: ``transfer`` (resolve and start), ``finish`` (the module doc)."""

    def __init__(self, table: LinkTable) -> None:
        self.table = table
        self.path = path_for(self)
        self._view: pullview.PullView | None = None      # the local rows (``engine.pullview``)
        self._bounds: dict[tuple[bool, int], Any] = {}   # (push, peer cluster) -> pre-bound metrics
        table.watchers.append(self.republish)

    def republish(self) -> None:
        """The registry changed (``LinkTable.changed``, the event loop): the local rows are published anew, so the
        quick shape resolves off the loop by a current view (a transfer that resolved by the old one lands by its
        generation check or on the loop, ``links.paths``)."""
        self._view = pullview.publish(self.table.engine)

    # ---- 1. resolve ------------------------------------------------------------------------------------

    def link_for(self, cluster: int) -> AnyLink:
        """The link to ``cluster``, whichever end of it this engine is (both ends may pull and push)."""
        link = self.table.links_to(cluster)
        if link is None:
            raise DataDistError(StatusCode.LLM_NOT_YET_LINK,
                                f"cluster {self.table.cluster_id} has no link to cluster {cluster}")
        if link.state == LinkState.BROKEN:  # nothing timed out now: CANN's code for a failed communication
            raise DataDistError(StatusCode.LLM_FAILED,
                                f"the link to cluster {cluster} is broken ({link.reason}); link_clusters again")
        return link

    def transfer(self, push: bool, cluster: int, cache_id: int, timeout_ms: int, to: Ends, token: Any, *,
                 order: TransferOrder | ExtentOrder | None = None, model_id: int = 0, remote: bytes = b"",
                 local: tuple[int, ...] = (), extents: tuple[int, ...] = (), on_loop: bool = True) -> bool:
        """The one way a worker's pull (``push`` False) or push with ``cluster`` starts (``LinkManager.transfer``):
        resolved into a ``Transfer`` -- ``order``'s (``_planned``: refusals answered here, with the codes the spec
        names), or the quick shape's (``order`` None: ``BlocksCacheKey(cluster, model_id)``, the remote blocks as
        the attach frame carries them in ``remote``, local blocks ``local`` of cache ``cache_id``, whole tensors;
        its geometry from the published local rows, the same checks, off the loop too) -- then started
        (``start``). Its end goes to ``to.ended(token, ...)`` exactly once, from any thread. False (the quick shape
        only), nothing done: not one the shape settles -- no such link or rows, a block out of range, more than a
        small transfer, a busy connection, a stale view off the loop -- run it as an order, whose resolution gives
        the exact answer. A small READ of HIXL's extents takes the quick shape too (``extents``: local address, remote
        address, length of each, as the attach frame carries them; ``_quick_extents``)."""
        if order is not None:
            try:
                t = self._planned(push, order, to, token) if isinstance(order, TransferOrder) else \
                    self._extents(order, to, token)
            except Exception as exc:  # noqa: BLE001 - every refusal is answered
                self.refused(push, cluster, exc, to, token)
                return True
            return self._start(t, True)
        table = self.table
        link = table.links.get(cluster) or table.served.get(cluster)
        if link is None or link.state != LinkState.ESTABLISHED or link.layerwise or table.closed:
            return False
        view = self._view
        if view is None or view.generation != table.engine.registry.generation:
            if not on_loop:
                return False
            view = self.local_view()   # a registry change that did not run ``Engine.watch`` (none should)
        if extents:
            return self._quick_extents(link, view, extents, timeout_ms, to, token, on_loop)
        rows = view.caches.get(cache_id)
        if rows is None:
            return False
        for b in local:
            if b >= rows.rows:
                return False
        n = len(local)
        nbytes = len(rows.tensors) * n * rows.row
        if n > QUICK_BLOCKS or nbytes > self.path.quick_max or type(link) is LocalLink:
            return False
        t = Transfer(push, link, cache_id, rows.entry, nbytes, n,
                     timeout_ms or table.engine.options.sync_kv_timeout_ms, to, token)
        t.rows, t.local, t.generation, t.model_id, t.remote = rows, local, view.generation, model_id, remote
        t.bound = self._bounds.get((push, cluster)) or self._bound(push, cluster)
        return self._start(t, on_loop)

    def _quick_extents(self, link: AnyLink, view: pullview.PullView, numbers: tuple[int, ...], timeout_ms: int,
                       to: Ends, token: Any, on_loop: bool) -> bool:
        """A READ of a few extents (at most ``FEW``, ``quick_max`` bytes) in the quick shape: the local ones found in
        the published view's registrations (each wholly inside one, mapped writable here), the remote ones sent as
        they are; no pin -- the bytes land under ``read_lock`` after the view's generation check
        (``paths.StreamPath._landed``). False, nothing done, for anything else: the order answers it."""
        n, rest = divmod(len(numbers), 3)
        locals_, remotes, lens = numbers[0::3], numbers[1::3], numbers[2::3]
        nbytes = sum(lens)
        if (rest or not 0 < n <= FEW or nbytes > self.path.quick_max or type(link) is LocalLink or 0 in lens
                or 0 in locals_ or 0 in remotes):
            return False
        try:
            pieces, entry = pullview.pieces(view, locals_, lens, "")
        except DataDistError:
            return False
        t = Transfer(False, link, entry.cache_id, entry, nbytes, n,
                     timeout_ms or self.table.engine.options.sync_kv_timeout_ms, to, token)
        pairs = tuple(x for pair in zip(remotes, lens, strict=True) for x in pair)
        t.spec = RemoteSpec(AddrRef(link.remote_cluster, remotes[0]),  # type: ignore[arg-type]  # as core.plan
                            ReadMode.EXTENTS, pairs, expected_bytes=nbytes)
        t.landing, t.generation = (locals_, lens, pieces), view.generation
        t.bound = self._bounds.get((False, link.remote_cluster)) or self._bound(False, link.remote_cluster)
        return self._start(t, on_loop)

    def _planned(self, push: bool, order: TransferOrder, to: Ends, token: Any) -> Transfer:
        """An order's record (the event loop): its plan (``core.plan``), link and local segments."""
        entry = self.table.engine.registry.find(CacheId(order.local_cache_id))
        if entry is None:
            raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"local cache {order.local_cache_id} does not exist")
        cluster = self.table.cluster_id
        plan = (plan_push if push else plan_pull)(order, entry.desc, entry.is_blocks, cluster)
        link = self.link_for(order.remote.cluster_id)
        if not push and link.layerwise:
            raise DataDistError(StatusCode.LLM_LINK_BUSY, f"a transfer_cache_async task is using the link to "
                                                          f"cluster {link.remote_cluster}; pull after it ends")
        if not push and order.exclusive and link.pulls:
            raise DataDistError(StatusCode.LLM_LINK_BUSY,
                                f"another pull is running on the link to cluster {link.remote_cluster}")
        t = Transfer(push, link, order.local_cache_id, entry, plan.nbytes, len(order.local_blocks),
                     order.timeout_ms or self.table.engine.options.sync_kv_timeout_ms, to, token)
        t.spec = plan.remote
        t.dst = segments_of(tensors_of(entry), plan.local_spans)
        t.bound = self._bound(push, link.remote_cluster)
        return t

    def _extents(self, order: ExtentOrder, to: Ends, token: Any) -> Transfer:
        """A HIXL transfer's record (the event loop, ``engine.extents``): the local extents resolved against this
        engine's registrations (every one wholly inside one, or refused naming it), the remote ones sent as they
        are -- the owner resolves them against its own."""
        ext = order.extents
        engine = self.table.engine
        local = engine.address_index(remote=False).resolve(ext[:, 0], ext[:, 2], f"engine {engine.cluster_id}")
        link = self.link_for(order.remote_cluster)
        if not order.write and link.layerwise:
            raise DataDistError(StatusCode.LLM_LINK_BUSY, f"a transfer_cache_async task is using the link to "
                                                          f"cluster {link.remote_cluster}; pull after it ends")
        first = local.entries[0]
        t = Transfer(order.write, link, first.cache_id, first, local.nbytes, len(ext),
                     order.timeout_ms or engine.options.sync_kv_timeout_ms, to, token)
        t.spec = RemoteSpec(AddrRef(order.remote_cluster, int(ext[0, 1])),  # type: ignore[arg-type]  # as core.plan
                            ReadMode.EXTENTS, remote_pairs(ext), expected_bytes=local.nbytes)
        t.dst, t.held = local.segments, local.entries
        t.bound = self._bound(order.write, link.remote_cluster)
        return t

    def refused(self, push: bool, cluster: int, exc: BaseException, to: Ends, token: Any) -> None:
        """An order refused before it started (``resolve`` raised): counted as a transfer's outcome, answered."""
        if not isinstance(exc, DataDistError):
            log.error("cluster %s: a %s with cluster %s failed", self.table.cluster_id, "push" if push else "pull",
                      cluster, exc_info=exc)
            exc = DataDistError(StatusCode.LLM_FAILED, f"the {'push' if push else 'pull'} failed: {exc!r}")
        bound = self._bound(push, cluster)
        if bound is not None:
            bound.begin()
            bound.end(exc.code.name)
        transfer_log.warning("cluster %s %s peer cluster %s refused: %s", self.table.cluster_id,
                             "push" if push else "pull", cluster, exc)
        to.ended(token, int(exc.code), 0, "", exc.message)

    def local_view(self) -> pullview.PullView:
        """The engine's local rows now (the event loop: republished when the registry moved)."""
        view = self._view
        engine = self.table.engine
        if view is None or view.generation != engine.registry.generation:
            view = self._view = pullview.publish(engine)
        return view

    def _bound(self, push: bool, cluster: int) -> Any:
        """The pre-bound metrics of this engine's pulls or pushes with ``cluster`` (``DaemonMetrics.bound``)."""
        bound = self._bounds.get((push, cluster))
        metrics = self.table.node.metrics
        if bound is None and metrics is not None:
            bound = self._bounds[(push, cluster)] = metrics.bound("push" if push else "pull",
                                                                  str(self.table.cluster_id), str(cluster))
        return bound

    # ---- 2. start ----------------------------------------------------------------------------------------

    def _start(self, t: Transfer, on_loop: bool = True) -> bool:
        """Start ``t`` (``transfer``): it ends in ``finish``, exactly once,
        never before this returns True. False (the quick shape off the loop only): it could not go at once -- a busy
        connection -- and nothing was done: the caller runs it as an order. The record is counted on its link from
        here to its end; a planned one pins its local cache."""
        link = t.link
        with link.reader_lock:
            link.inflight += 1
            if not t.push:
                link.pulls += 1
        if t.spec is not None and not t.pinned and t.landing is None:
            t.pin_id = self.table.engine.pin_many(t.held or (t.entry,))
            t.pinned = True
        try:
            started = self.path.start(t, on_loop) if type(link) is not LocalLink else self.path.local.start(t)
        except Exception as exc:  # noqa: BLE001 - a bug of ours: still answered (``finish`` logs it)
            self.finish(t, exc)
            return True
        if not started:
            self._uncount(t)
        elif t.bound is not None:
            t.bound.begin()
        return started

    def _uncount(self, t: Transfer) -> None:
        with t.link.reader_lock:
            t.link.inflight -= 1
            if not t.push:
                t.link.pulls -= 1

    # ---- 3. end ------------------------------------------------------------------------------------------

    def finish(self, t: Transfer, failure: BaseException | None = None) -> None:
        """``t`` ended -- succeeded (``failure`` None) or failed -- from any thread; a failure other than a
        ``DataDistError`` is a bug of ours: logged, answered ``LLM_FAILED``. A pinned transfer ends on the loop."""
        link = t.link
        with link.reader_lock:
            link.inflight -= 1
            if not t.push:
                link.pulls -= 1
            if failure is None:
                if t.push:
                    link.reader_bytes_out += t.nbytes
                else:
                    link.reader_bytes_in += t.nbytes
        if t.pinned:
            t.pinned = False
            self.table.engine.unpin(t.pin_id)
        if failure is None:
            if t.bound is not None:
                t.bound.end("success", time.monotonic() - t.started, t.nbytes, t.blocks)
            if t.spec is not None and transfer_log.isEnabledFor(logging.DEBUG):
                transfer_log.debug("cluster %s %s peer cluster %s: cache %s, %d blocks, %d bytes in %.1f ms",
                                   self.table.cluster_id, t.what, link.remote_cluster, t.cache_id, t.blocks,
                                   t.nbytes, (time.monotonic() - t.started) * 1e3)
            t.to.ended(t.token, 0, t.nbytes, link.transport, "")
            return
        exc = failure if isinstance(failure, DataDistError) else self._bug(t, failure)
        if t.bound is not None:
            t.bound.end(exc.code.name)
        transfer_log.warning("cluster %s %s peer cluster %s failed: cache %s, %.1f ms: %s", self.table.cluster_id,
                             t.what, link.remote_cluster, t.cache_id, (time.monotonic() - t.started) * 1e3, exc)
        t.to.ended(t.token, int(exc.code), 0, "", exc.message)

    def _bug(self, t: Transfer, exc: BaseException) -> DataDistError:
        log.error("cluster %s: a %s with cluster %s failed", self.table.cluster_id, t.what, t.link.remote_cluster,
                  exc_info=exc)
        return DataDistError(StatusCode.LLM_FAILED, f"the {t.what} failed: {exc!r}")

    def failed(self, t: Transfer, exc: BaseException) -> None:
        """``t`` failed: ``finish`` with what the worker is told -- a ``DataDistError`` mapped to CANN's codes for a
        link failure (``failure``) and explained when it is the owner's refusal of the byte count (``explained``);
        anything else is a bug of ours, answered ``LLM_FAILED`` and logged (``finish``)."""
        if not isinstance(exc, DataDistError):
            self.finish(t, exc)
            return
        try:
            told = explained(self.failure(t.link, exc, t.timeout_ms), t.entry, t.tensor_count)
        except Exception as bug:  # noqa: BLE001 - a bug of ours: still answered
            self.finish(t, bug)
            return
        self.finish(t, told)

    def failure(self, link: Link, exc: DataDistError, timeout_ms: int) -> DataDistError:
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
