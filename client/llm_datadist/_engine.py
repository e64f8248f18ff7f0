"""Private: what the managers and models of one ``LLMDataDist`` use of it -- declared, so ``CacheManager``,
``KvCacheManager``, ``LLMModel`` and the layer-wise push are typed against it instead of ``Any``.

``LLMDataDist`` satisfies it (a test checks the members exist); the managers never reach further.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional, Protocol

if TYPE_CHECKING:
    from ._rpc import DaemonClient
    from .configs import LLMRole

__all__ = ["EngineView"]


class EngineView(Protocol):
    """One initialized engine on the daemon, as the objects hanging off an ``LLMDataDist`` see it."""

    _engine_id: int                 # the daemon's id of this engine
    _device_id: int                 # the engine's NPU, as the daemon resolved it (NPU memory is handed over on it)
    _role: "LLMRole"
    _enable_cache_manager: bool     # CacheManager (v2) mode rather than KvCacheManager (v1)
    _is_call_linked: bool           # link_clusters was called (remote-accessible registrations are closed)
    _models: List[Any]              # v1 LLMModels, in add_model order

    @property
    def cluster_id(self) -> int: ...

    @property
    def _sync_kv_timeout_s(self) -> float: ...

    @property
    def kv_cache_manager(self) -> Any: ...

    def _check_init(self) -> "DaemonClient":
        """The daemon connection; raises when ``init`` was not called or ``finalize`` was."""

    def _call(self, method: str, request: object, func_name: str, timeout: Optional[float] = None) -> Any:
        """One DataDist RPC of this engine, errors mapped to ``LLMException``."""
