"""llm_datadist: CANN LLM-DataDist's Python API, backed by the datadist daemon.

Code written for Huawei CANN's ``llm_datadist`` package runs unchanged: the same names,
signatures, defaults, status codes and exception types. See ``docs/api-parity.md`` for what is
supported, what differs and why. ``llm_datadist.views`` (datadist's addition) gives zero-copy
numpy/torch views of cache tensors.
"""

from __future__ import annotations

import os as _os

from ._task import CacheTask
from .configs import LLMClusterInfo, LLMConfig, LlmConfig, LLMRole
from .data_type import DataType
from .llm_datadist import LLMDataDist
from .llm_types import (
    BlocksCacheKey,
    Cache,
    CacheDesc,
    CacheKey,
    CacheKeyByIdAndIndex,
    KvCache,
    LayerSynchronizer,
    MemInfo,
    Memtype,
    Placement,
    RegisterMemStatus,
    TransferConfig,
    TransferWithCacheKeyConfig,
)
from .status import LLMException, LLMStatusCode, Status

_os.environ.setdefault("AUTO_USE_UC_MEMORY", "0")

__version__ = "0.1.0"

v2_list = [
    "LLMDataDist", "LLMRole", "LLMConfig", "LlmConfig", "LLMClusterInfo", "LLMStatusCode", "LLMException", "DataType",
    "Status", "CacheDesc", "CacheKey", "CacheKeyByIdAndIndex", "BlocksCacheKey", "Cache", "Placement",
    "RegisterMemStatus", "LayerSynchronizer", "TransferConfig", "CacheTask", "TransferWithCacheKeyConfig",
    "Memtype", "MemInfo",
]

__all__ = [
    "LLMClusterInfo", "LLMStatusCode", "LLMException", "LLMRole", "LlmConfig", "LLMConfig", "DataType", "Status",
    "CacheDesc", "CacheKey", "CacheKeyByIdAndIndex", "KvCache", "Cache", "BlocksCacheKey", "LLMDataDist",
    "Placement", "RegisterMemStatus", "LayerSynchronizer", "TransferConfig", "CacheTask",
    "TransferWithCacheKeyConfig", "Memtype", "MemInfo", "TensorDesc", "Tensor", "KvCacheManager",
]

_V1_NAMES = {"KvCacheManager": "kv_cache_manager", "Tensor": "tensor", "TensorDesc": "tensor",
             # the model API of CANN 8.0.RC2-8.2 (docs/spec.md §9): importable, not in __all__ (as in CANN's package)
             "LLMReq": "llm_model", "ModelConfig": "llm_model", "ModelRunner": "llm_model", "LLMModel": "llm_model",
             "CapacityState": "llm_model"}


def __getattr__(name: str):  # noqa: ANN202 - CANN re-exports the v1 names lazily
    module = _V1_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'llm_datadist' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{module}", __name__), name)
