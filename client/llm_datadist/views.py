"""datadist's addition to CANN's API: zero-copy numpy (and torch CPU) views of a cache's tensors.

``Cache.tensor_addrs`` are real addresses in this process (daemon-owned caches are mapped
shared memory), so these views alias the daemon's bytes: writing to them writes the cache.
"""

from __future__ import annotations

from typing import Any, List, Optional

import numpy as np

from . import _memory
from .data_type import dtype_to_np_dtype

__all__ = ["numpy_views", "numpy_view", "torch_views"]


def numpy_view(cache: Any, tensor_index: int = 0) -> np.ndarray:
    """Tensor ``tensor_index`` of ``cache`` (``Cache`` or ``KvCache``) as a writable numpy array, no copy."""
    addrs = getattr(cache, "tensor_addrs", None)
    if addrs is None:
        addrs = cache.per_device_tensor_addrs[0]
    if not addrs:
        raise ValueError("the cache has no tensor addresses (deallocated?)")
    if not 0 <= tensor_index < len(addrs):
        raise IndexError(f"tensor_index {tensor_index} outside [0, {len(addrs)})")
    desc = cache.cache_desc
    return _memory.numpy_view(addrs[tensor_index], tuple(desc.shape), dtype_to_np_dtype(desc.data_type))


def numpy_views(cache: Any) -> List[np.ndarray]:
    """Every tensor of ``cache`` as a writable numpy array, no copy."""
    n = cache.cache_desc.num_tensors
    return [numpy_view(cache, i) for i in range(n)]


def torch_views(cache: Any, dtype: Optional[Any] = None) -> List[Any]:
    """Every tensor as a torch CPU tensor aliasing the same memory (needs torch installed)."""
    import torch  # optional dependency

    out = []
    for arr in numpy_views(cache):
        t = torch.from_numpy(arr)
        out.append(t.view(dtype) if dtype is not None else t)
    return out
