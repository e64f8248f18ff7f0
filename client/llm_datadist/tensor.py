"""v1 ``TensorDesc`` / ``Tensor`` (deprecated in CANN; host copies of cache tensors)."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple, Union

import numpy as np

from . import _validate as v
from .data_type import DataType, dtype_to_np_dtype, np_dtype_to_dtype

__all__ = ["TensorDesc", "Tensor"]


class TensorDesc:
    """A tensor's ``DataType`` and shape (v1 API, deprecated by CANN)."""

    def __init__(self, dtype: DataType, shape: Union[List[int], Tuple[int, ...]]) -> None:
        """A tensor's type and shape (v1, deprecated by CANN).

        Args:
            dtype: its ``DataType``.
            shape: its dimensions.

        Raises:
            TypeError: ``dtype`` not a ``DataType``, ``shape`` not a list or tuple.
        """
        v.check_isinstance("dtype", dtype, [DataType], allow_none=False)
        v.check_isinstance("shape", shape, [list, tuple], allow_none=False)
        self._dtype = dtype
        self._shape = list(shape)

    @property
    def dtype(self) -> DataType:
        """The tensor's ``DataType``."""
        return self._dtype

    @property
    def shape(self) -> List[int]:
        """The tensor's dimensions (a list)."""
        return self._shape


class Tensor:
    """A host tensor over a numpy array (v1 API, deprecated by CANN): what ``get_cache_tensors`` returns."""

    def __init__(self, data: Union[np.ndarray, "Tensor", int], tensor_desc: Optional[TensorDesc] = None) -> None:
        """A host tensor (v1, deprecated by CANN): what ``get_cache_tensors`` returns.

        Args:
            data: a numpy array, another ``Tensor`` (shares its array), or an address in this process (then
                ``tensor_desc`` gives its type and shape).
            tensor_desc: the type and shape (default: the array's).

        Raises:
            TypeError: ``data`` of another type, an address without a ``TensorDesc``.
        """
        self._array: np.ndarray
        if isinstance(data, Tensor):
            self._array = data._array
        elif isinstance(data, np.ndarray):
            self._array = data
        elif isinstance(data, int):
            v.check_isinstance("tensor_desc", tensor_desc, [TensorDesc], allow_none=False)
            assert tensor_desc is not None   # checked just above (TypeError)
            from ._memory import numpy_view

            self._array = numpy_view(data, tuple(tensor_desc.shape), dtype_to_np_dtype(tensor_desc.dtype))
        else:
            raise TypeError(f"data only support [numpy.ndarray, Tensor, int] but got {type(data)}.")
        self._desc = tensor_desc or TensorDesc(np_dtype_to_dtype(self._array.dtype), list(self._array.shape))

    def numpy(self, copy: bool = False) -> np.ndarray:
        """The tensor as a numpy array.

        Args:
            copy: True: a copy; False: the array itself.

        Returns:
            The ``numpy.ndarray``.

        Raises:
            Nothing.
        """
        return self._array.copy() if copy else self._array

    @property
    def tensor_desc(self) -> TensorDesc:
        """The tensor's ``TensorDesc``."""
        return self._desc

    def __repr__(self) -> str:
        return f"Tensor(shape={list(self._array.shape)}, dtype={self._desc.dtype})"


_ = Any
