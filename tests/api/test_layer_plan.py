"""The pure planning behind transfer_cache_async (``datadistd.core.plan``): which bytes of which tensors
each layer sends, against a byte-level oracle, and the source-side rules checked before anything moves."""

from __future__ import annotations

import pytest

from datadistd.core.errors import DataDistError
from datadistd.core.layout import Span
from datadistd.core.plan import AddrRef, LayerTarget, LayerTask, check_layer_task, plan_layer
from datadistd.core.types import BlocksKeyRef, CacheDesc, DType, IdIndexRef, ReadMode

DESC = CacheDesc(6, (8, 4, 4), DType.DT_UINT8)  # 3 layers, 8 rows of 16 bytes


def bytes_of(spans: list[Span]) -> list[tuple[int, int]]:
    """(tensor, byte) pairs in stream order."""
    return [(s.tensor, s.offset + i) for s in spans for i in range(s.length)]


def test_blocks_to_blocks_by_key() -> None:
    task = LayerTask(DESC, True, (LayerTarget(9, (1, 3), BlocksKeyRef(9, 0), dst_layers=(0, 2)),), (5, 6, 0), (1, 2, 3))
    check_layer_task(task, own_cluster=1)
    (spans, spec), = plan_layer(task, 0, 2)  # source layer 2 -> destination layer 1
    assert bytes_of(spans) == [(t, b * 16 + i) for t in (4, 5) for b in (5, 6, 0) for i in range(16)]
    assert (spec.mode, spec.blocks, spec.tensor_start, spec.tensor_count) == (ReadMode.BLOCKS, (1, 2, 3), 2, 2)
    assert spec.expected_bytes == 2 * 3 * 16


def test_contiguous_to_raw_addresses_and_blocks() -> None:
    slot = LayerTask(DESC, False, (LayerTarget(9, (0, 2), dst_addrs=(100, 200, 300, 400), src_batch_index=3),))
    check_layer_task(slot, own_cluster=1)
    k, v = plan_layer(slot, 0, 1)
    assert [s.key for _, s in (k, v)] == [AddrRef(9, 300, 0), AddrRef(9, 400, 0)]
    assert bytes_of(k[0]) == [(2, 48 + i) for i in range(16)] and k[1].size == 16
    chunks = LayerTask(DESC, False, (LayerTarget(9, (0, 1), dst_addrs=(100, 200)),), (), (7, 2), 8)
    check_layer_task(chunks, own_cluster=1)
    k, _ = plan_layer(chunks, 0, 0)
    assert bytes_of(k[0]) == [(0, i) for i in range(16)]  # the first 2 x 8 bytes of slot 0
    assert k[1].key == AddrRef(9, 100, 8) and k[1].blocks == (7, 2)


@pytest.mark.parametrize("task", [
    LayerTask(CacheDesc(3, (8, 4), DType.DT_UINT8), True, (LayerTarget(9, (0, 1), IdIndexRef(9, 1), (), (0, 1)),)),
    LayerTask(DESC, True, (LayerTarget(9, (0, 4), BlocksKeyRef(9), (), (0, 4)),), (0,), (0,)),       # layer 3 of 3
    LayerTask(DESC, True, (LayerTarget(9, (0, 1), BlocksKeyRef(9), (), (0, 1)),), (0,), ()),          # blocks -> cache
    LayerTask(DESC, True, (LayerTarget(9, (0, 1), BlocksKeyRef(9), (), (0, 1)),), (8,), (0,)),        # block 8 of 8
    LayerTask(DESC, False, (LayerTarget(9, (0, 1), BlocksKeyRef(9), (), (0, 1)),), (), (0,)),         # no block size
    LayerTask(DESC, False, (LayerTarget(9, (0, 1), BlocksKeyRef(9), (), (0, 1)),), (), (0, 1), 9),    # 18 > 16 bytes
    LayerTask(DESC, False, (LayerTarget(9, (0, 1), IdIndexRef(9, 1), (), (0, 1)),), (), (), 8),       # size, no blocks
    LayerTask(DESC, False, (LayerTarget(9, (0, 2), dst_addrs=(1, 2, 3)),)),                          # 2 per layer
    LayerTask(DESC, False, (LayerTarget(9, (0, 1), dst_addrs=(1, 2), src_batch_index=8),)),          # batch 8 of 8
    LayerTask(DESC, False, (LayerTarget(1, (0, 1), dst_addrs=(1, 2)),)),                              # own cluster
    LayerTask(DESC, False, (LayerTarget(9, (0, 2), IdIndexRef(9, 1), (), (0, 1)),)),                  # range lengths
    LayerTask(DESC, False, ()),                                                                       # no targets
])
def test_rules_checked_before_anything_moves(task: LayerTask) -> None:
    with pytest.raises(DataDistError) as info:
        check_layer_task(task, own_cluster=1)
    assert info.value.code.name == "LLM_PARAM_INVALID"
