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
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from .core.errors import DataDistError, StatusCode, require
from .core.plan import LayerTask, check_layer_task, plan_layer
from .core.types import CacheId, Placement
from .links import Link, LinkManager

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
        self.timeout_ms = timeout_ms
        self.remaining = {i: set(range(*t.src_layers)) for i, t in enumerate(self.task.targets)}
        self.final: set[int] = set()
        self.done = False
        self._marked: list[Link] = []
        for cluster in {t.dst_cluster for t in self.task.targets}:
            link = links.links_to(cluster)
            if link is not None:
                link.begin_layerwise()
                self._marked.append(link)
        log.info("cluster %s: transfer_cache_async of cache %s to %d targets started", engine.cluster_id,
                 src_cache_id, len(self.task.targets))

    async def ready(self, layer: int) -> list[LayerEvent]:
        """Layer ``layer`` is computed: send it to every unfinished target holding it."""
        if self.done or not 0 <= layer < self.task.num_layers:
            return []
        events: list[LayerEvent] = []
        for i, target in enumerate(self.task.targets):
            if i in self.final or layer not in self.remaining[i]:
                continue
            try:
                await self.links.push_pieces(target.dst_cluster, self.cache_id, plan_layer(self.task, i, layer),
                                             self.timeout_ms)
            except DataDistError as exc:
                log.warning("cluster %s: transfer_cache_async layer %d to cluster %s failed: %s",
                            self.links.cluster_id, layer, target.dst_cluster, exc)
                self.final.add(i)
                self.done = True  # CANN ends the whole task at its first failure
                events.append(LayerEvent(i, layer, int(exc.code), True, exc.message))
                return events
            self.remaining[i].discard(layer)
            finished = not self.remaining[i]
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
        self.done = True
        return events

    def close(self) -> None:
        for link in self._marked:
            link.end_layerwise()
        self._marked = []
