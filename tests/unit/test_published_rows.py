"""A pull of a few blocks over a published table is checked by int arithmetic (``links.published._few_blocks``);
it must accept exactly what the owner's own rule (``layout.owner_spans``) accepts, with the same rows, and leave
every refusal to that rule (so the code and message are the owner's). Hostile and odd requests beside the good."""

from __future__ import annotations

import numpy as np
import pytest

from datadistd.core.errors import DataDistError
from datadistd.core.layout import owner_spans
from datadistd.core.types import BlocksKeyRef, CacheDesc, DType, OwnerKey, ReadMode, RemoteSpec
from datadistd.links.published import _few_blocks, _span_rows
from datadistd.links.wire.tables import CacheInfo

DESC = CacheDesc(3, (8, 4, 16), DType.DT_FLOAT16)   # 3 tensors, 8 blocks of 128 bytes
ROW = DESC.row_size
BLOCKS_INFO = CacheInfo(7, True, False, DESC, {OwnerKey.blocks(1): 0})
SLOTS_INFO = CacheInfo(8, False, True, DESC, {})


def _spec(blocks: tuple, start: int = 0, count: int = 0, expected: int | None = None,
          mode: ReadMode = ReadMode.BLOCKS) -> RemoteSpec:
    tensors = count or DESC.num_tensors
    if expected is None:
        expected = max(tensors, 0) * len(blocks) * ROW
    return RemoteSpec(BlocksKeyRef(1, 1), mode, blocks=blocks, tensor_start=start, tensor_count=count,
                      expected_bytes=expected)


CASES = [
    _spec((0,)), _spec((7, 0, 3)), _spec((2, 2)), _spec((1,), start=1), _spec((1,), start=2, count=1),
    _spec((5,), start=1, count=2),
    # refused by the owner: each must be left to owner_spans
    _spec((8,)), _spec((-1,)), _spec((1 << 40,)), _spec((0,), start=3, count=1), _spec((0,), start=-1, count=1),
    _spec((0,), start=2, count=2), _spec((0,), expected=ROW), _spec((0,), expected=0), _spec(()),
    _spec((np.int64(1),)), _spec((1.0,)), _spec((True,)), _spec((0,), mode=ReadMode.SLOT),
    # more rows than the int path takes: owner_spans answers them (the same rows)
    _spec(tuple(range(8)) * 3),
]


def _owner(info: CacheInfo, spec: RemoteSpec) -> np.ndarray | None:
    try:
        spans, _ = owner_spans(info.desc, info.is_blocks, info.cache_id, 0, spec, "src", 1)
    except DataDistError:
        return None
    return _span_rows(spans)


@pytest.mark.parametrize("spec", CASES)
@pytest.mark.parametrize("info", [BLOCKS_INFO, SLOTS_INFO], ids=["blocks", "slots"])
def test_few_blocks_agrees_with_owner_spans(info: CacheInfo, spec: RemoteSpec) -> None:
    fast = _few_blocks(info, spec)
    owner = _owner(info, spec)
    if fast is None:   # left to owner_spans: fine either way, it answers
        return
    assert owner is not None, f"the int path accepted what the owner refuses: {spec}"
    assert fast.dtype == np.int64 and fast.tolist() == owner.tolist()


def test_few_blocks_takes_the_usual_pull() -> None:
    """The path is used: a good few-block pull of a blocks cache is answered by it, rows in stream order."""
    rows = _few_blocks(BLOCKS_INFO, _spec((5, 1), start=1, count=2))
    assert rows is not None
    assert rows.tolist() == [[1, 5 * ROW, ROW], [1, ROW, ROW], [2, 5 * ROW, ROW], [2, ROW, ROW]]
