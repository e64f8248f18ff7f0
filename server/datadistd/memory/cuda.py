"""CUDA device memory (``cuda``): named so deployments can select it; not implemented in this build.

There is no GPU where datadist is built and tested, so no CUDA backend ships. Constructing it
says so; what it would do: ``cudaMalloc`` pools exported with ``cudaIpcGetMemHandle``.
"""

from __future__ import annotations

from ..core.errors import DataDistError, StatusCode

__all__ = ["CudaBackend"]


class CudaBackend:
    name = "cuda"

    def __init__(self, **_: object) -> None:
        raise DataDistError(StatusCode.LLM_FEATURE_NOT_ENABLED,
                            "memory backend 'cuda' is not implemented in this build (no GPU to verify it); "
                            "use backend 'host'")
