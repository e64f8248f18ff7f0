"""The one data-type table of datadist.

``DataType`` keeps CANN's names and numeric values (the ``ge::DataType`` numbers of the 14 types
CANN exposes in Python) and, like CANN's, is an ``Enum``, not an ``IntEnum``. The client exports it
as ``llm_datadist.DataType``, the daemon derives its ``DType`` from it and the wire carries the
number, so all three agree on every name and value. ``ITEMSIZE`` has the bytes per element of every
type but ``DT_STRING``, which has no fixed size.
"""

from __future__ import annotations

import enum

__all__ = ["DataType", "ITEMSIZE"]


class DataType(enum.Enum):
    """Element type of cache tensors; values are ``ge::DataType`` numbers. ``Enum``, not ``IntEnum`` (as CANN)."""

    DT_FLOAT = 0
    DT_FLOAT16 = 1
    DT_INT8 = 2
    DT_INT32 = 3
    DT_UINT8 = 4
    DT_INT16 = 6
    DT_UINT16 = 7
    DT_UINT32 = 8
    DT_INT64 = 9
    DT_UINT64 = 10
    DT_DOUBLE = 11
    DT_BOOL = 12
    DT_STRING = 13
    DT_BF16 = 27


#: bytes per element; ``DT_STRING`` has no entry
ITEMSIZE: dict[DataType, int] = {
    DataType.DT_FLOAT: 4, DataType.DT_FLOAT16: 2, DataType.DT_INT8: 1, DataType.DT_INT32: 4,
    DataType.DT_UINT8: 1, DataType.DT_INT16: 2, DataType.DT_UINT16: 2, DataType.DT_UINT32: 4,
    DataType.DT_INT64: 8, DataType.DT_UINT64: 8, DataType.DT_DOUBLE: 8, DataType.DT_BOOL: 1,
    DataType.DT_BF16: 2,
}
