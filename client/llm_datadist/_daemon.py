"""Private: the one way a client of datadistd opens an engine on it and closes it again -- ``LLMDataDist.init`` /
``finalize`` and the ``hixl`` package's ``Hixl.initialize`` / ``finalize`` both go through here.

The daemon is the one ``target`` names (the ``datadist.daemon`` option), else ``DATADIST_DAEMON``, else an
embedded daemon started inside this process (``_embedded``); the worker attaches (``DaemonClient.attach``), and the
engine is created with ``Init``. NPUs cross as physical ids: the daemon has logical ids of its own.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Optional

from datadist.v1 import datadist_pb2

from ._rpc import DaemonClient
from .status import LLMException, LLMStatusCode

if TYPE_CHECKING:
    from ._embedded import EmbeddedDaemon

__all__ = ["DAEMON_OPTION", "DAEMON_ENV", "OpenEngine", "open_engine", "close_engine"]

log = logging.getLogger(__name__)

#: option key / environment variable naming the daemon to use; without either: embedded mode
DAEMON_OPTION = "datadist.daemon"
DAEMON_ENV = "DATADIST_DAEMON"
#: how long ``open_engine`` waits for a daemon that exists but is busy
READY_TIMEOUT_S = 10.0


@dataclass
class OpenEngine:
    """An engine this process created on a daemon: the connection, the embedded daemon (None: a daemon of its own),
    the daemon's engine id, this process's logical id of the engine's NPU (the daemon's id with backend ``host``),
    and whether the daemon keeps DEVICE memory on NPUs (backend ``acl``)."""

    client: DaemonClient
    embedded: "Optional[EmbeddedDaemon]"
    engine_id: int
    device_id: int
    npu: bool

    @property
    def where(self) -> str:
        """The daemon, as a log line names it."""
        return "embedded daemon" if self.embedded is not None else self.client.target


def open_engine(cluster_id: int, role: int, options: Dict[str, str], target: Optional[str] = None,
                func: str = "init", device_option: bool = False) -> OpenEngine:
    """Connect to the daemon (``target``: the ``datadist.daemon`` option's value, or None) and create an engine of
    ``cluster_id`` and ``role`` with ``options``. ``device_option``: when the daemon keeps DEVICE memory on NPUs and
    ``ge.exec.deviceId`` is not given, name this thread's current ACL device (as CANN's engines take the current
    device). Raises ``LLMException`` (``LLM_FAILED``: no daemon at the named address, or not ready within 10 s; the
    daemon's status when it refuses the engine)."""
    source = f"the {DAEMON_OPTION} option" if target else DAEMON_ENV
    target = target or os.environ.get(DAEMON_ENV)
    embedded = None
    if not target:
        from ._embedded import EmbeddedDaemon

        embedded = EmbeddedDaemon()
        target = embedded.target
    client = DaemonClient(target, embedded=embedded is not None)
    try:
        client.wait_ready(timeout=READY_TIMEOUT_S, source=source)
        from ._cache_ops import local_npu, physical_npus

        npu = client.attach().memory_backend == "acl"
        sent = dict(options)
        if npu and device_option and "ge.exec.deviceId" not in sent:
            sent["ge.exec.deviceId"] = str(_current_npu())
        if npu and "ge.exec.deviceId" in sent:   # the daemon names NPUs by physical id (its own are its own)
            sent["ge.exec.deviceId"] = physical_npus(sent["ge.exec.deviceId"], func)
        resp = client.call("Init", datadist_pb2.InitRequest(cluster_id=cluster_id, role=role, options=sent), func)
        device = local_npu(int(resp.device_id), func) if npu else int(resp.device_id)
    except BaseException:
        client.close()
        if embedded is not None:
            embedded.stop()
        raise
    return OpenEngine(client, embedded, int(resp.engine_id), device, npu)


def _current_npu() -> int:
    """This thread's current ACL device (``aclrtGetDevice``), 0 when none is set."""
    from datadist_ascend.acl import acl

    current = acl().current()
    return 0 if current is None else current


def close_engine(engine: OpenEngine, func: str = "finalize") -> None:
    """Release the engine on the daemon, close the connection (the attach lease with it) and stop an embedded daemon.
    An engine the daemon already released (it stopped or restarted) is logged, not raised; other refusals are logged
    too: nothing of it is left to the caller."""
    client = engine.client
    try:
        try:
            client.call("Finalize", datadist_pb2.EngineRef(engine_id=engine.engine_id), func)
        except LLMException as exc:
            if exc.status_code == LLMStatusCode.LLM_ENGINE_FINALIZED or client.daemon_gone():
                # the daemon stopped (or restarted) and released the engine with everything it held:
                # what finalize was to do is done, and the worker was told when it happened
                log.info("%s: engine %s was already released by datadistd at %s", func, engine.engine_id,
                         client.target)
            else:
                log.warning("%s: %s", func, exc)
        client.close()
    finally:
        if engine.embedded is not None:
            engine.embedded.stop()
