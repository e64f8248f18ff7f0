"""The source side of ``transfer_cache_async``: a layer-wise push driven by the worker's readiness.

The worker opens one ``TransferCacheAsync`` stream per task. This object validates the task
(everything docs/spec.md §5.7/§7 lets the source check) before anything moves, then, for each layer the
worker reports ready, sends that layer to every target whose ``src_layer_range`` holds it and
reports one event per (target, layer). As in CANN the task ends at its first failure, and an
aborted layer (``synchronize_layer`` returned False) fails the targets holding it with
``LLM_PARAM_INVALID``; targets never completed keep no result (``None`` on the client).

While the task runs it marks the links it uses, so a pull on one of them gets ``LLM_LINK_BUSY``
(docs/spec.md §1.4: "pull_cache + transfer_cache_async" on one link), and a layer push meeting a running
pull fails the same way.

Round trips: at a target's first ready layer every layer of that target is opened at the owner in one
call (``Requester.stage_push``), each later layer is only its bytes on the data channel, and the target's
last layer ends with one commit: two owner calls per target and task, none per layer. A layer's event
says its bytes were sent; the target's final event says the owner has them all. A task that ends early
tells the owners in the background (``abandon_staged``), so their caches are not held.

Each target is one transfer in the daemon's metrics (``track_transfer``, op ``push``, as a ``push_blocks``): begun
at its first layer, ended by its commit (bytes, and destination blocks when it writes blocks), its failure, the
abort of a layer it holds, or the stream's end (``cancelled``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace

from datadist.status import LLMStatusCode

from ..core.errors import DataDistError, StatusCode, require
from ..core.plan import LayerTask, check_layer_task, plan_layer
from ..core.types import CacheId, Placement
from ..ops.metrics import TransferTracker, track_transfer
from . import Link, LinkManager
from .staged import PushPart, StagedPush

__all__ = ["LayerEvent", "LayerPush"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LayerEvent:
    target: int
    layer: int
    status: int
    final: bool
    message: str = ""


class LayerPush:
    def __init__(self, links: LinkManager, src_cache_id: int, task: LayerTask, timeout_ms: int | None = None) -> None:
        engine = links.engine
        entry = engine.entry(src_cache_id)
        require(entry.desc.placement != Placement.HOST, "src cache not support placement HOST")
        self.task = replace(task, src=entry.desc, src_is_blocks=entry.is_blocks)
        check_layer_task(self.task, engine.cluster_id)
        self.links = links
        self.cache_id = CacheId(src_cache_id)
        self.timeout_ms = timeout_ms or engine.options.sync_kv_timeout_ms
        self.remaining = {i: set(range(*t.src_layers)) for i, t in enumerate(self.task.targets)}
        self.final: set[int] = set()
        self.done = False
        self._staged: dict[int, tuple[StagedPush, dict[int, list[int]]]] = {}
        self._marked: list[Link] = []
        self._tracked: dict[int, TransferTracker] = {}   # target -> its transfer in the metrics, while it runs
        for cluster in {t.dst_cluster for t in self.task.targets}:
            link = links.links_to(cluster)
            if link is not None:
                link.begin_layerwise()
                self._marked.append(link)
        log.info("cluster %s: transfer_cache_async of cache %s to %d targets started", engine.cluster_id,
                 src_cache_id, len(self.task.targets))

    async def _stage(self, i: int) -> tuple[StagedPush, dict[int, list[int]]]:
        """Target ``i``'s push, opened at its owner with every layer of the target at its first layer."""
        staged = self._staged.get(i)
        if staged is None:
            target = self.task.targets[i]
            parts: list[PushPart] = []
            by_layer: dict[int, list[int]] = {}
            for layer in range(*target.src_layers):
                layer_parts = plan_layer(self.task, i, layer)
                by_layer[layer] = list(range(len(parts), len(parts) + len(layer_parts)))
                parts.extend(layer_parts)
            # the owner keeps the target's transfers as long as its layers may take: a timeout each
            hold_ms = min(self.timeout_ms * len(by_layer), _MAX_HOLD_MS)
            push = await self.links.stage_push(target.dst_cluster, self.cache_id, parts, self.timeout_ms, hold_ms)
            staged = self._staged[i] = (push, by_layer)
        return staged

    def _track(self, i: int) -> TransferTracker:
        """Target ``i``'s transfer in the metrics, begun at its first layer."""
        tracked = self._tracked.get(i)
        if tracked is None:
            tracked = self._tracked[i] = track_transfer(self.links.table.node.metrics, "push", self.links.cluster_id,
                                                        self.task.targets[i].dst_cluster, self.cache_id)
            tracked.__enter__()
        return tracked

    def _untrack(self, i: int, exc: BaseException | None) -> None:
        """Target ``i``'s transfer ended: a success if ``done`` was called, else with ``exc``'s outcome."""
        tracked = self._tracked.pop(i, None)
        if tracked is not None:
            tracked.__exit__(None if exc is None else type(exc), exc, None)

    async def _send_layer(self, i: int, layer: int) -> bool:
        """Send ``layer`` to target ``i``; True when that was the target's last layer (and it is committed)."""
        tracked = self._track(i)
        push, by_layer = await self._stage(i)
        tracked.nbytes += await self.links.send_staged(push, by_layer[layer], self.timeout_ms)
        self.remaining[i].discard(layer)
        if self.remaining[i]:
            return False
        await self.links.commit_staged(push, self.timeout_ms)
        tracked.done(tracked.nbytes, len(self.task.dst_blocks))
        self._untrack(i, None)
        return True

    async def ready(self, layer: int) -> list[LayerEvent]:
        """Layer ``layer`` is computed: send it to every unfinished target holding it."""
        if self.done or not 0 <= layer < self.task.num_layers:
            return []
        events: list[LayerEvent] = []
        for i, target in enumerate(self.task.targets):
            if i in self.final or layer not in self.remaining[i]:
                continue
            try:
                finished = await self._send_layer(i, layer)
            except DataDistError as exc:
                log.warning("cluster %s: transfer_cache_async layer %d to cluster %s failed: %s",
                            self.links.cluster_id, layer, target.dst_cluster, exc)
                self.final.add(i)
                self._untrack(i, exc)
                self.done = True  # CANN ends the whole task at its first failure
                events.append(LayerEvent(i, layer, int(exc.code), True, exc.message))
                return events
            if finished:
                self.final.add(i)
            events.append(LayerEvent(i, layer, int(StatusCode.LLM_SUCCESS), finished))
        if len(self.final) == len(self.task.targets):
            self.done = True
        return events

    def abort(self, layer: int) -> list[LayerEvent]:
        """``synchronize_layer(layer)`` returned False: the targets holding it fail, the task ends."""
        events = [LayerEvent(i, layer, int(StatusCode.LLM_PARAM_INVALID), True,
                             f"synchronize_layer({layer}) returned False")
                  for i, t in enumerate(self.task.targets) if i not in self.final and t.holds(layer)]
        self.final.update(e.target for e in events)
        for e in events:
            self._untrack(e.target, DataDistError(StatusCode.LLM_PARAM_INVALID, e.message))
        self.done = True
        return events

    def close(self) -> None:
        """The task's stream ended: owners of targets not committed are told (in the background)."""
        for i in list(self._tracked):
            self._untrack(i, asyncio.CancelledError())
        for push, _ in self._staged.values():
            self.links.abandon_staged(push, LLMStatusCode.LLM_FAILED)
        self._staged = {}
        for link in self._marked:
            link.end_layerwise()
        self._marked = []


#: the longest an owner keeps a layer-wise target's opened transfers (an hour; the owner's cache stays pinned)
_MAX_HOLD_MS = 3_600_000
