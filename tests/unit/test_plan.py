"""Transfer planning: the requester's spans and the owner's spec agree on every byte."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datadist.status import LLMStatusCode as S
from datadistd.core.errors import DataDistError
from datadistd.core.layout import block_spans, slot_spans, total_length
from datadistd.core.plan import TransferKind, TransferOrder, plan_pull, plan_push
from datadistd.core.types import BlocksKeyRef, CacheDesc, CacheKeyRef, DType, IdIndexRef, ReadMode


def blocks_desc(tensors: int = 4, blocks: int = 10, width: int = 8) -> CacheDesc:
    return CacheDesc(tensors, (blocks, width), DType.DT_UINT8)


def gather(desc: CacheDesc, data: np.ndarray, spans) -> np.ndarray:  # noqa: ANN001
    return np.concatenate([data[s.tensor].reshape(-1)[s.offset:s.offset + s.length] for s in spans])


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_pull_blocks_plan_matches_owner_arithmetic(data) -> None:  # noqa: ANN001
    layers = data.draw(st.integers(1, 4))
    nblocks = data.draw(st.integers(1, 12))
    desc = blocks_desc(2 * layers, nblocks, data.draw(st.integers(1, 16)))
    n = data.draw(st.integers(1, nblocks))
    src = data.draw(st.lists(st.integers(0, nblocks - 1), min_size=n, max_size=n))
    dst = data.draw(st.lists(st.integers(0, nblocks - 1), min_size=n, max_size=n, unique=True))
    start = data.draw(st.integers(0, layers - 1))
    stop = data.draw(st.integers(start + 1, layers))
    order = TransferOrder(TransferKind.BLOCKS, BlocksKeyRef(9, 0), 1, tuple(src), tuple(dst),
                          src_layers=(start, stop), dst_layers=(start, stop))
    plan = plan_pull(order, desc, True, own_cluster=1)
    # the owner's spans for the spec, over the owner's (same-shaped) cache
    owner = block_spans(desc, range(plan.remote.tensor_start, plan.remote.tensor_start + plan.remote.tensor_count),
                        plan.remote.blocks)
    assert total_length(owner) == plan.remote.expected_bytes == plan.nbytes
    src_data = np.random.default_rng(0).integers(0, 256, (desc.num_tensors, desc.tensor_size), dtype=np.uint8)
    stream = gather(desc, src_data, owner)
    dst_data = np.zeros_like(src_data)
    pos = 0
    for s in plan.local_spans:
        dst_data[s.tensor, s.offset:s.offset + s.length] = stream[pos:pos + s.length]
        pos += s.length
    want = np.zeros_like(src_data).reshape(desc.num_tensors, nblocks, -1)
    src3 = src_data.reshape(desc.num_tensors, nblocks, -1)
    for t in range(2 * start, 2 * stop):
        want[t, dst] = src3[t, src]
    np.testing.assert_array_equal(dst_data.reshape(want.shape), want)


def test_pull_cache_slot_plan() -> None:
    desc = CacheDesc(2, (4, 16), DType.DT_UINT8)
    plan = plan_pull(TransferOrder(TransferKind.CACHE, IdIndexRef(9, 1, 2), 1, local_batch_index=3, size=10), desc,
                     False, 1)
    assert plan.remote.mode == ReadMode.SLOT and plan.remote.size == 10 and plan.nbytes == 20
    assert plan.local_spans == slot_spans(desc, [0, 1], 3, 10)


def test_pull_cache_key_into_blocks_sends_whole_blocks_of_the_slot() -> None:
    dst = blocks_desc(2, 10, 8)
    plan = plan_pull(TransferOrder(TransferKind.BLOCKS, CacheKeyRef(9, 5), 1, (), (4, 2, 3)), dst, True, 1)
    assert plan.remote.mode == ReadMode.SLOT and plan.remote.size == 3 * 8 and plan.nbytes == 2 * 3 * 8


@pytest.mark.parametrize("order,is_blocks", [
    (TransferOrder(TransferKind.BLOCKS, BlocksKeyRef(1, 0), 1, (0,), (0,)), True),           # own cluster
    (TransferOrder(TransferKind.BLOCKS, BlocksKeyRef(9, 0), 1, (), (0,)), True),             # empty src_blocks
    (TransferOrder(TransferKind.BLOCKS, BlocksKeyRef(9, 0), 1, (0, 1), (0,)), True),         # length mismatch
    (TransferOrder(TransferKind.BLOCKS, CacheKeyRef(9, 5), 1, (1,), (0,)), True),            # src_blocks with CacheKey
    (TransferOrder(TransferKind.BLOCKS, BlocksKeyRef(9, 0), 1, (0,), (10,)), True),          # dst block out of range
    (TransferOrder(TransferKind.CACHE, BlocksKeyRef(9, 0), 1), False),                       # pull_cache by blocks key
    (TransferOrder(TransferKind.CACHE, CacheKeyRef(9, 5), 1), True),                         # pull_cache into blocks
    (TransferOrder(TransferKind.BLOCKS, BlocksKeyRef(9, 0), 1, (0,), (0,), src_layers=(0, 2),
                   dst_layers=(0, 1)), True),                                                 # unequal layer ranges
])
def test_bad_orders_are_param_invalid(order: TransferOrder, is_blocks: bool) -> None:
    desc = blocks_desc(4, 10, 8) if is_blocks else CacheDesc(4, (4, 8), DType.DT_UINT8)
    with pytest.raises(DataDistError) as info:
        plan_pull(order, desc, is_blocks, own_cluster=1)
    assert info.value.code == S.LLM_PARAM_INVALID


def test_push_plans() -> None:
    src = blocks_desc(4, 10, 8)
    plan = plan_push(TransferOrder(TransferKind.BLOCKS, BlocksKeyRef(9, 0), 1, (5, 6), (1, 2)), src, True, 1)
    assert plan.remote.blocks == (5, 6) and plan.local_spans == block_spans(src, range(4), (1, 2))
    c = CacheDesc(2, (3, 8), DType.DT_UINT8)
    plan = plan_push(TransferOrder(TransferKind.CACHE, IdIndexRef(9, 1, 0), 1, local_batch_index=2), c, False, 1)
    assert plan.remote.size == 8 and plan.nbytes == 16
    with pytest.raises(DataDistError):
        plan_push(TransferOrder(TransferKind.CACHE, IdIndexRef(9, 1, 0), 1, size=4), c, False, 1)


@pytest.mark.parametrize("plan,local,remote,message", [
    (plan_pull, (0, 1), (0, 1000), None),   # the remote list is checked by its owner
    (plan_pull, (0, 1000), (0, 1), "dst_blocks[1] = 1000 out of range [0, 10): the destination cache has 10 blocks"),
    (plan_push, (0, 1000), (0, 1), "src_blocks[1] = 1000 out of range [0, 10): the source cache has 10 blocks"),
])
def test_a_block_out_of_range_says_which_list(plan, local, remote, message) -> None:  # noqa: ANN001
    """`block 1000 (position 1) out of range [0, 64)` did not say whether src_blocks or dst_blocks was wrong."""
    order = TransferOrder(TransferKind.BLOCKS, BlocksKeyRef(9, 0), 1, remote, local)
    if message is None:
        assert plan(order, blocks_desc(4, 10, 8), True, 1).remote.blocks == tuple(remote)
        return
    with pytest.raises(DataDistError) as info:
        plan(order, blocks_desc(4, 10, 8), True, 1)
    assert info.value.code == S.LLM_PARAM_INVALID and info.value.message == message
