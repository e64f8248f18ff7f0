"""A worker's pull or push as an order: the entry of the gRPC ``Pull``/``Push`` and of every attach frame the quick
shape did not take (``api.attach``, ``_fast``).

``start_transfer`` checks the caller may reach the engine, builds the order (its bounds: ``api/orders.py``) and hands
it to the engine's one transfer path (``LinkManager.transfer``), which resolves, starts, counts and ends it; a
failure is also counted by status code (``count_error``). ``done(status, bytes, transport, message)`` is called
exactly once, from any thread -- a refusal before this returns.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from ..core.errors import DataDistError, StatusCode
from ..core.plan import TransferOrder
from ..engine.extents import ExtentOrder
from ..node.node import EngineSlot, Node
from ..node.sessions import WorkerSession
from ..ops.metrics import DaemonMetrics, count_error

__all__ = ["Done", "start_transfer"]

log = logging.getLogger(__name__)

#: how a transfer ends: ``(status, bytes, transport, message)``; status 0 is success, else an ``LLMStatusCode``
Done = Callable[[int, int, str, str], None]


class _Answer:
    """A transfer's end (``links.transfer.Ends``): a failure counted by status code, then ``done``."""

    __slots__ = ("done", "metrics", "method")

    def __init__(self, done: Done, metrics: DaemonMetrics | None, method: str) -> None:
        self.done, self.metrics, self.method = done, metrics, method

    def ended(self, token: Any, status: int, nbytes: int, transport: str, message: str) -> None:
        if status:
            count_error(self.metrics, self.method, StatusCode(status))
        self.done(status, nbytes, transport, message)


def start_transfer(node: Node, session: WorkerSession | None, engine_id: int,
                   order_of: Callable[[], TransferOrder | ExtentOrder], *, push: bool, done: Done,
                   metrics: DaemonMetrics | None, admin: bool = False, method: str = "") -> None:
    """Start a pull (``push`` False) or push of engine ``engine_id`` for ``session`` (any engine when ``admin``:
    the admin socket). ``order_of`` builds the order (a ``DataDistError`` refuses it): a cache order, or a HIXL
    transfer's extents (``engine.extents``; ``push`` is its WRITE). ``method`` names the call in the error count
    (default "Pull"/"Push"). ``done``: the module doc."""
    answer = _Answer(done, metrics, method or ("Push" if push else "Pull"))
    slot: EngineSlot
    try:
        slot = node.slot(engine_id) if admin else node.owned_slot(session, engine_id)
        order = order_of()
    except Exception as exc:  # noqa: BLE001 - every refusal is answered
        if not isinstance(exc, DataDistError):   # a bug of ours: the caller gets an answer, the log the trace
            log.error("%s of engine %s failed", answer.method, engine_id, exc_info=exc)
            exc = DataDistError(StatusCode.LLM_FAILED, f"internal error in {answer.method}: {type(exc).__name__}: "
                                                       f"{exc}")
        answer.ended(None, int(exc.code), 0, "", exc.message)
        return
    if isinstance(order, ExtentOrder):
        slot.links.transfer(order.write, order.remote_cluster, -1, order.timeout_ms or 0, answer, None, order=order)
        return
    slot.links.transfer(push, order.remote.cluster_id, order.local_cache_id, order.timeout_ms or 0, answer, None,
                        order=order)
