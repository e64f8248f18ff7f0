"""``DataType`` (CANN ``llm_datadist.data_type``): the 14 ``ge::DataType`` members exposed to Python.

The numeric values are ``ge::DataType`` numbers, hardcoded once in ``datadist.dtypes``, the table
shared with the daemon (CANN takes them from its C++ wrapper).
``dtype_to_np_dtype`` / ``np_dtype_to_dtype`` are dicts in CANN; here they are dicts that can also
be called like functions. datadist does not support ``DT_STRING`` tensors, so it has no numpy
mapping and no item size.
"""

from __future__ import annotations

from typing import Any, List

import numpy as np

from datadist.dtypes import ITEMSIZE, DataType

from .status import LLMException, LLMStatusCode

__all__ = ["DataType", "dtype_to_np_dtype", "np_dtype_to_dtype", "valid_np_dtypes"]


def _unsupported(what: Any) -> LLMException:
    return LLMException(f"data type {what} is not supported", status_code=LLMStatusCode.LLM_PARAM_INVALID)


def _itemsize(data_type: DataType) -> int:
    """Bytes per element; ``DT_STRING`` -> ``LLMException(LLM_PARAM_INVALID)``, non-``DataType`` -> TypeError."""
    if not isinstance(data_type, DataType):
        raise TypeError(f"data_type only support ['DataType'], but got {type(data_type)}.")
    try:
        return ITEMSIZE[data_type]
    except KeyError:
        raise _unsupported(data_type) from None


class _DtypeToNp(dict):
    """``DataType`` -> numpy scalar type; ``m[dt]`` / ``m.get(dt)`` as in CANN, ``m(dt)`` raises when unmapped."""

    def __call__(self, data_type: DataType) -> Any:
        if not isinstance(data_type, DataType):
            raise TypeError(f"data_type only support ['DataType'], but got {type(data_type)}.")
        if data_type not in self:
            raise _unsupported(data_type)
        return self[data_type]


class _NpToDtype(dict):
    """``np.dtype`` -> ``DataType``; ``m(x)`` accepts anything ``np.dtype(x)`` does and raises when unmapped."""

    def __call__(self, np_dtype: Any) -> DataType:
        try:
            key = np.dtype(np_dtype)
        except TypeError:
            raise _unsupported(np_dtype) from None
        if key not in self:
            raise _unsupported(key)
        return self[key]


#: DT_BF16 maps to np.float16 (numpy has no bfloat16), exactly as CANN does.
dtype_to_np_dtype: _DtypeToNp = _DtypeToNp({
    DataType.DT_FLOAT: np.float32,
    DataType.DT_FLOAT16: np.float16,
    DataType.DT_BF16: np.float16,
    DataType.DT_INT8: np.int8,
    DataType.DT_INT16: np.int16,
    DataType.DT_UINT16: np.uint16,
    DataType.DT_UINT8: np.uint8,
    DataType.DT_INT32: np.int32,
    DataType.DT_INT64: np.int64,
    DataType.DT_UINT32: np.uint32,
    DataType.DT_UINT64: np.uint64,
    DataType.DT_BOOL: np.bool_,
    DataType.DT_DOUBLE: np.float64,
})

#: numpy scalar types that have a DataType (np.float16 once, although two DataTypes map to it).
valid_np_dtypes: List[Any] = list(dict.fromkeys(dtype_to_np_dtype.values()))

#: np.float16 maps back to DT_FLOAT16, never DT_BF16.
np_dtype_to_dtype: _NpToDtype = _NpToDtype({
    np.dtype(np_type): dt for dt, np_type in dtype_to_np_dtype.items() if dt is not DataType.DT_BF16
})
