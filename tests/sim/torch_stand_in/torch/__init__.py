"""A stand-in for ``torch`` with ``torch_npu`` -- SIMULATION, not PyTorch: just what CANN's HIXL Python sample
(hicann/hixl ``examples/python/hixl/hixl_d2rd_multiproc_sample.py``) calls, so that sample runs unchanged on the
simulated Ascend runtime (tests/sim) without PyTorch or an NPU.

- ``torch.npu.set_device(n)``: ``aclrtSetDevice`` (torch_npu does the same);
- ``torch.full(shape, value, dtype=torch.uint8, device="npu")`` and ``torch.zeros(...)``: NPU memory from
  ``aclrtMalloc`` on the current device, written by ``aclrtMemcpy`` (torch_npu's caching allocator takes it from
  the same call);
- ``Tensor.data_ptr()``: the device address; ``Tensor.cpu().numpy()``: a host copy by ``aclrtMemcpy``.

Put ``tests/sim/torch_stand_in`` first on ``PYTHONPATH`` only to run that sample (tests/hixl/test_cann_samples.py);
anything else it lacks raises ``AttributeError``, so a sample needing more fails loudly, never quietly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["uint8", "npu", "full", "zeros", "Tensor"]

uint8 = np.dtype(np.uint8)


class _Npu:
    """``torch.npu``: the current device, as torch_npu keeps it."""

    def __init__(self) -> None:
        self.device = 0

    def set_device(self, device: int) -> None:
        from datadist_ascend.acl import acl

        acl().set_device(int(device))
        self.device = int(device)


npu = _Npu()


class _Host:
    """A host tensor (``Tensor.cpu()``)."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    def numpy(self) -> np.ndarray:
        return self._array


class Tensor:
    """A 1-D tensor in NPU memory of the current device."""

    def __init__(self, n: int, dtype: Any) -> None:
        from datadist_ascend.acl import acl

        self.dtype = np.dtype(dtype)
        self.nbytes = n * self.dtype.itemsize
        self.device = npu.device
        self.addr = acl().malloc(self.device, self.nbytes)

    def data_ptr(self) -> int:
        return self.addr

    def _store(self, host: np.ndarray) -> None:
        from datadist_ascend.acl import MEMCPY_HOST_TO_DEVICE, acl

        acl().memcpy(self.device, self.addr, self.nbytes, host.ctypes.data, self.nbytes, MEMCPY_HOST_TO_DEVICE)

    def cpu(self) -> _Host:
        from datadist_ascend.acl import MEMCPY_DEVICE_TO_HOST, acl

        out = np.empty(self.nbytes // self.dtype.itemsize, self.dtype)
        acl().memcpy(self.device, out.ctypes.data, self.nbytes, self.addr, self.nbytes, MEMCPY_DEVICE_TO_HOST)
        return _Host(out)


def _size(shape: Any) -> int:
    return int(np.prod(shape)) if isinstance(shape, (tuple, list)) else int(shape)


def _on_npu(device: Any) -> None:
    if device != "npu":
        raise AttributeError(f"the torch stand-in makes NPU tensors only (device='npu'), not {device!r}")


def full(shape: Any, value: int, dtype: Any = uint8, device: Any = "npu") -> Tensor:
    _on_npu(device)
    t = Tensor(_size(shape), dtype)
    t._store(np.full(_size(shape), value, t.dtype))
    return t


def zeros(shape: Any, dtype: Any = uint8, device: Any = "npu") -> Tensor:
    _on_npu(device)
    t = Tensor(_size(shape), dtype)
    t._store(np.zeros(_size(shape), t.dtype))
    return t
