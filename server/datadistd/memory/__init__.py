"""Memory backends: where cache bytes live and how the daemon reaches them.

``get_backend(name)`` loads a backend module by name, only when asked for: ``host`` (memfd
pools, runs everywhere) is built in; ``acl`` (Ascend) imports its device library lazily and fails with a
clear error where absent. A backend that does not exist is not registered (an unknown name lists the known).
"""

from __future__ import annotations

from typing import Any

from ..core.plugins import load_named
from .base import Allocation, FdPiece, FdRef, MemoryBackend, MemoryHandle, MemoryRef, Pool, ProcessRef, Segment

__all__ = [
    "Allocation", "FdPiece", "FdRef", "MemoryBackend", "MemoryHandle", "MemoryRef", "Pool", "ProcessRef",
    "Segment", "BACKENDS", "get_backend", "backend_from_config",
]

#: backend name -> "module:factory"; modules are imported only by get_backend()
BACKENDS: dict[str, str] = {
    "host": "datadistd.memory.host:HostBackend",
    "acl": "datadistd.memory.acl:AclBackend",
}


def backend_from_config(memory: Any) -> MemoryBackend:
    """The backend a ``[memory]`` config section names, with the settings it takes."""
    extra: dict[str, object] = {"device_id": memory.device_id} if memory.backend == "acl" else {}
    return get_backend(memory.backend, shm_dir=memory.shm_dir, **extra)


def get_backend(name: str, **kwargs: object) -> MemoryBackend:
    """Instantiate the backend registered under ``name``; an unknown name lists the known ones."""
    return load_named("memory backend", BACKENDS, name, **kwargs)
