"""Private: this process's ACL IPC export keys of its own NPU memory, handed to an ``acl`` daemon (``device_memory``).

One key per range (NPU, address, length), shared by every registration of that range in this process (the same
tensors registered twice, by one engine or two), with the pids allowed to import it. A registration takes a user
(``acquire``); its user goes (``release``) once the daemon no longer imports the range -- after the daemon
acknowledged the unregistration, the engine's finalize, or the attach connection's end -- and the key is closed
(``aclrtIpcMemClose`` on the exporting side) when its last user goes: importer first, exporter second, the order
that is safe whatever the driver does when an exporter closes first (hicann/runtime ``IpcCloseMemoryByName``: a
name this process did not import is destroyed, ``DestroyIpcMem``). A close that fails is logged once, never raised.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, Iterable, Set, Tuple

if TYPE_CHECKING:
    from datadist_ascend.acl import Acl

__all__ = ["Export", "ExportKeys", "export_keys"]

log = logging.getLogger(__name__)

#: (this process's logical NPU, address, length)
Range = Tuple[int, int, int]


@dataclass
class Export:
    key: str
    users: int = 0
    allowed: Set[int] = field(default_factory=set)   # bare tgids already on the key's white list


class ExportKeys:
    """The process's export keys by range (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: Dict[Range, Export] = {}
        self._warned = False

    def acquire(self, runtime: Acl, rng: Range, pid: int) -> str:
        """The key of ``rng`` (exported now if no registration holds one) with ``pid`` allowed to import it; one more
        user. The caller holds ``rng``'s device current. ``AscendError`` as the runtime raises it (no user taken)."""
        device, address, length = rng
        with self._lock:
            exp = self._keys.get(rng)
            fresh = exp is None
            if exp is None:
                exp = Export(runtime.ipc_export(device, address, length))
            try:
                if pid not in exp.allowed:
                    runtime.ipc_allow(device, exp.key, [pid])
                    exp.allowed.add(pid)
            except BaseException:
                if fresh:
                    self._close(runtime, device, exp.key)
                raise
            exp.users += 1
            self._keys[rng] = exp
            return exp.key

    def release(self, ranges: Iterable[Range], runtime: Acl | None = None) -> None:
        """One user of each range goes; a key whose last user went is closed (failures logged, never raised)."""
        closing = []
        with self._lock:
            for rng in ranges:
                exp = self._keys.get(rng)
                if exp is None:
                    continue
                exp.users -= 1
                if exp.users <= 0:
                    del self._keys[rng]
                    closing.append((rng[0], exp.key))
        if closing and runtime is None:
            from datadist_ascend.acl import acl

            runtime = acl()
        for device, key in closing:
            assert runtime is not None
            self._close(runtime, device, key)

    def open_keys(self) -> int:
        with self._lock:
            return len(self._keys)

    def _close(self, runtime: Acl, device: int, key: str) -> None:
        from datadist_ascend import AscendError

        try:
            with runtime.on_device(device):   # the caller keeps its own device
                runtime.ipc_close(device, key)
        except AscendError as exc:
            if not self._warned:   # once: a runtime that refuses one close refuses them all
                self._warned = True
                log.warning("closing an export key of this process's NPU memory (aclrtIpcMemClose): %s", exc)


#: the process's export keys
export_keys = ExportKeys()
