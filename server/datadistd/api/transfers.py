"""A worker's pull or push: the one entry of every way in (the attach socket's frames, the gRPC ``Pull``/``Push``).

``start_transfer`` checks the caller may reach the engine, builds the order (its bounds: ``api/orders.py``), starts
it on the engine's links, tracks it (``track_transfer``: in flight, outcome, bytes, blocks), counts a failure by
status code (``count_error``) and calls ``done(status, bytes, transport, message)`` exactly once -- a refusal before
it returns, the end of a started transfer from the event loop; a push cancelled by its caller (the returned task:
the attach connection closed, the gRPC call cancelled) answers nobody.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from ..core.errors import DataDistError, StatusCode
from ..core.plan import TransferOrder
from ..node.node import EngineSlot, Node
from ..node.sessions import WorkerSession
from ..state.metrics import DaemonMetrics, count_error, track_transfer

__all__ = ["Done", "start_transfer"]

log = logging.getLogger(__name__)

#: how a transfer ends: ``(status, bytes, transport, message)``; status 0 is success, else an ``LLMStatusCode``
Done = Callable[[int, int, str, str], None]


def start_transfer(node: Node, session: WorkerSession | None, engine_id: int, order_of: Callable[[], TransferOrder],
                   *, push: bool, done: Done, metrics: DaemonMetrics | None,
                   admin: bool = False) -> asyncio.Task[None] | None:
    """Start a pull (``push`` False) or push of engine ``engine_id`` for ``session`` (any engine when ``admin``:
    the admin socket). ``order_of`` builds the order (a ``DataDistError`` refuses it). A pull starts by callback
    (``LinkManager.start_pull``: a small one runs with no task at all) and returns None; a push runs as a task,
    returned so its caller may cancel it. ``done``: see the module doc."""
    method = "Push" if push else "Pull"

    def failed(exc: BaseException) -> None:
        if isinstance(exc, DataDistError):
            code, why = exc.code, exc.message
        else:   # a bug of ours: the caller gets an answer, the log the trace
            log.error("%s of engine %s failed", method, engine_id, exc_info=exc)
            code, why = StatusCode.LLM_FAILED, f"internal error in {method}: {type(exc).__name__}: {exc}"
        count_error(metrics, method, code)
        done(int(code), 0, "", why)

    slot: EngineSlot
    try:
        slot = node.slot(engine_id) if admin else node.owned_slot(session, engine_id)
        order = order_of()
    except Exception as exc:  # noqa: BLE001 - every refusal is answered
        failed(exc)
        return None
    tracked = track_transfer(metrics, method.lower(), slot.engine.cluster_id, order.remote.cluster_id,
                             order.local_cache_id)
    if push:
        async def run() -> None:
            try:
                with tracked:
                    nbytes, transport = await slot.links.push(order)
                    tracked.done(nbytes, len(order.local_blocks))
            except Exception as exc:  # noqa: BLE001 - every failure is answered
                failed(exc)
                return
            done(0, nbytes, transport, "")

        return asyncio.get_running_loop().create_task(run())

    tracked.__enter__()

    def finish(result: tuple[int, str] | Exception) -> None:
        if isinstance(result, Exception):
            tracked.__exit__(type(result), result, None)
            failed(result)
            return
        tracked.done(result[0], len(order.local_blocks))
        tracked.__exit__(None, None, None)
        done(0, result[0], result[1], "")

    try:
        slot.links.start_pull(order, finish)
    except Exception as exc:  # noqa: BLE001 - a bug of ours before the pull started: answered, logged
        finish(exc)
    return None
