"""v1 ``KvCacheManager`` ("KvCacheManager mode", CANN GE's llm_datadist_v1).

Not implemented by datadist yet: ``LLMDataDist.kv_cache_manager`` raises
``LLMException(LLM_FEATURE_NOT_ENABLED)`` in non-cache-manager mode. The class exists so that
``from llm_datadist import KvCacheManager`` keeps working for type checks and isinstance tests.
"""

from __future__ import annotations

from .status import LLMException, LLMStatusCode

__all__ = ["KvCacheManager"]


class KvCacheManager:
    def __init__(self, *args: object, **kwargs: object) -> None:
        raise LLMException("v1 KvCacheManager mode is not implemented by datadist yet; "
                           "use enable_cache_manager=True (CacheManager)",
                           status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)

    def is_initialized(self) -> bool:
        return False
