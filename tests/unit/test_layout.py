"""Block/layer arithmetic: every rule and error code, plus spans against a numpy gather oracle."""

from __future__ import annotations

import enum
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datadistd.core.errors import DataDistError, StatusCode
from datadistd.core.layout import (
    Span,
    block_copy_pairs,
    block_runs,
    block_spans,
    explain_size_mismatch,
    inclusive_pair_to_range,
    layer_range_to_tensor_indices,
    slot_as_blocks_spans,
    slot_spans,
    swap_pairs,
    total_length,
)
from datadistd.core.types import CacheDesc, DType

INVALID = StatusCode.LLM_PARAM_INVALID
NOT_EXIST = StatusCode.LLM_KV_CACHE_NOT_EXIST


def invalid(fn, *args, **kwargs) -> DataDistError:  # noqa: ANN001
    with pytest.raises(DataDistError) as exc:
        fn(*args, **kwargs)
    assert exc.value.code == INVALID, exc.value
    return exc.value


# ---- layer ranges -------------------------------------------------------------------------------

def test_no_range_means_every_tensor() -> None:
    assert layer_range_to_tensor_indices(None, None, 2, 6) == (0, 1, 2, 3, 4, 5)


def test_half_open_layer_range_maps_to_interleaved_tensors() -> None:
    assert layer_range_to_tensor_indices(0, 1, 2, 8) == (0, 1)
    assert layer_range_to_tensor_indices(1, 3, 2, 8) == (2, 3, 4, 5)
    assert layer_range_to_tensor_indices(3, 4, 2, 8) == (6, 7)
    assert layer_range_to_tensor_indices(0, 6, 1, 6) == tuple(range(6))
    assert layer_range_to_tensor_indices(1, 2, 3, 6) == (3, 4, 5)


@pytest.mark.parametrize(("start", "stop", "per", "n", "names"), [
    (2, 2, 2, 8, ["2"]),            # empty range
    (3, 1, 2, 8, ["3", "1"]),       # reversed
    (-1, 1, 2, 8, ["-1"]),          # negative start
    (0, 5, 2, 8, ["5", "8"]),       # beyond the last layer
    (3, 5, 2, 9, ["5", "9"]),
    (0, 1, 0, 8, ["0"]),            # per_layer 0
    (0, 1, -2, 8, ["-2"]),
    (0, 1, 9, 8, ["9", "8"]),       # per_layer > num_tensors
    (0, None, 2, 8, ["None"]),      # half a range
    (None, 1, 2, 8, ["None"]),
])
def test_bad_layer_ranges_are_param_invalid(start, stop, per, n, names) -> None:  # noqa: ANN001
    err = invalid(layer_range_to_tensor_indices, start, stop, per, n)
    for name in names:
        assert name in err.message


def test_per_layer_must_be_positive_even_without_a_range() -> None:
    invalid(layer_range_to_tensor_indices, None, None, 0, 4)


def test_default_per_layer_on_a_single_tensor_cache_without_range_is_fine() -> None:
    # pull_cache(...) without ranges passes the default tensor_num_per_layer=2 for any cache
    assert layer_range_to_tensor_indices(None, None, 2, 1) == (0,)


def test_inclusive_pair() -> None:
    assert inclusive_pair_to_range(-1, -1) == (None, None)
    assert inclusive_pair_to_range(0, 0) == (0, 1)
    assert inclusive_pair_to_range(2, 5) == (2, 6)


@pytest.mark.parametrize(("first", "second"), [(3, 2), (-2, 0), (-2, -2), (0, -2), (-1, 3), (1, -1)])
def test_bad_inclusive_pairs_are_param_invalid(first: int, second: int) -> None:
    err = invalid(inclusive_pair_to_range, first, second)
    assert str(first) in err.message and str(second) in err.message


def test_inclusive_pair_round_trips_through_tensor_indices() -> None:
    start, stop = inclusive_pair_to_range(1, 2)
    assert layer_range_to_tensor_indices(start, stop, 2, 8) == (2, 3, 4, 5)
    start, stop = inclusive_pair_to_range(-1, -1)
    assert layer_range_to_tensor_indices(start, stop, 2, 8) == tuple(range(8))


# ---- block spans --------------------------------------------------------------------------------

DESC = CacheDesc(num_tensors=3, shape=(10, 4, 2), dtype=DType.DT_FLOAT16)   # row = 16 bytes


def test_block_runs() -> None:
    assert block_runs([]) == []
    assert block_runs([5]) == [(5, 1)]
    assert block_runs([1, 2, 3, 7, 8, 3, 2, 2, 3]) == [(1, 3), (7, 2), (3, 1), (2, 1), (2, 2)]


def test_block_spans_merge_ascending_runs_per_tensor_in_order() -> None:
    spans = block_spans(DESC, [2, 0], [3, 4, 5, 9, 1])
    assert spans == [
        Span(2, 48, 48), Span(2, 144, 16), Span(2, 16, 16),
        Span(0, 48, 48), Span(0, 144, 16), Span(0, 16, 16),
    ]
    assert total_length(spans) == 2 * 5 * 16


def test_descending_or_repeated_blocks_are_not_merged() -> None:
    assert block_spans(DESC, [0], [4, 3]) == [Span(0, 64, 16), Span(0, 48, 16)]
    assert block_spans(DESC, [0], [4, 4]) == [Span(0, 64, 16), Span(0, 64, 16)]


def test_block_spans_accept_ranges_and_tuples() -> None:
    assert block_spans(DESC, range(3), range(10)) == [Span(t, 0, 160) for t in range(3)]
    assert block_spans(DESC, (1,), ()) == []
    assert block_spans(DESC, (), (1, 2)) == []


@pytest.mark.parametrize("blocks", [[0, 10], [-1], [3, 4, 99, 5], [1, True], [1, 2.0]])
def test_block_out_of_range_is_param_invalid_and_named(blocks: list) -> None:
    err = invalid(block_spans, DESC, [0], blocks)
    bad = next(b for b in blocks if not (type(b) is int and 0 <= b < 10))
    assert repr(bad) in err.message and "10" in err.message


class _Block(enum.IntEnum):
    TWO = 2
    TEN = 10


def test_int_subclasses_are_ints_and_checked_by_value() -> None:
    """An IntEnum is an int (``_is_int``): in range it is taken, out of range it is named; a bool is not an int.
    (The C-speed check of a list that is not all plain ints refused the first one as "out of range" whatever its
    value.)"""
    assert block_spans(DESC, [0], [1, _Block.TWO, 3]) == block_spans(DESC, [0], [1, 2, 3])
    err = invalid(block_spans, DESC, [0], [1, _Block.TWO, 12, _Block.TEN])
    assert "12 (position 2)" in err.message, err.message
    err = invalid(block_spans, DESC, [0], [_Block.TWO, _Block.TEN])
    assert "(position 1)" in err.message, err.message
    err = invalid(block_spans, DESC, [0], [_Block.TWO, True, 1])
    assert "True (position 1)" in err.message, err.message


@pytest.mark.parametrize("tensors", [[3], [0, -1], [0, 1, 2, 3], range(2, 4)])
def test_tensor_index_out_of_range_is_param_invalid_and_named(tensors) -> None:  # noqa: ANN001
    err = invalid(block_spans, DESC, tensors, [0])
    assert "tensor index" in err.message


def test_block_spans_of_100k_blocks() -> None:
    """100,000 blocks in one run, in runs of 8 and scattered (their cost per block is bench scenario 4's)."""
    desc = CacheDesc(num_tensors=4, shape=(200_000, 16), dtype=DType.DT_FLOAT16)
    runs_of_8 = [b for start in range(0, 200_000, 16) for b in range(start, start + 8)][:100_000]
    one_run = block_spans(desc, range(4), list(range(50_000, 150_000)))
    many = block_spans(desc, range(4), runs_of_8)
    scattered = block_spans(desc, range(4), list(range(199_999, 99_999, -1)))
    assert one_run == [Span(t, 50_000 * 32, 100_000 * 32) for t in range(4)]
    assert len(many) == 4 * 12_500 and len(scattered) == 4 * 100_000


# ---- slot spans ---------------------------------------------------------------------------------

SLOTS = CacheDesc(num_tensors=2, shape=(4, 8), dtype=DType.DT_INT32)   # row = 32 bytes


def test_slot_spans() -> None:
    assert slot_spans(SLOTS, [0, 1], 2, -1) == [Span(0, 64, 32), Span(1, 64, 32)]
    assert slot_spans(SLOTS, [1], 3, 8, 4) == [Span(1, 100, 8)]
    assert slot_spans(SLOTS, range(2), 0, -1, 30) == [Span(0, 30, 2), Span(1, 30, 2)]
    assert slot_spans(SLOTS, [0], 1, 32) == [Span(0, 32, 32)]


@pytest.mark.parametrize(("batch", "size", "offset"), [
    (0, 0, 0), (0, 33, 0), (0, 30, 3), (0, -2, 0), (0, -1, 32), (0, -1, 40), (0, 4, -1), (0, 1, 32),
])
def test_bad_slot_size_or_offset_is_param_invalid(batch: int, size: int, offset: int) -> None:
    invalid(slot_spans, SLOTS, [0], batch, size, offset)


@pytest.mark.parametrize("batch", [-1, 4, 100])
def test_batch_index_out_of_range_uses_missing_code(batch: int) -> None:
    err = invalid(slot_spans, SLOTS, [0], batch, -1)
    assert str(batch) in err.message
    with pytest.raises(DataDistError) as exc:
        slot_spans(SLOTS, [0], batch, -1, missing_code=NOT_EXIST)
    assert exc.value.code == NOT_EXIST


def test_slot_spans_tensor_index_checked() -> None:
    invalid(slot_spans, SLOTS, [2], 0, -1)


def test_slot_as_blocks_spans() -> None:
    assert slot_as_blocks_spans(SLOTS, [0, 1], 1, 24) == [Span(0, 32, 24), Span(1, 32, 24)]
    assert slot_as_blocks_spans(SLOTS, [1], 3, 32) == [Span(1, 96, 32)]
    err = invalid(slot_as_blocks_spans, SLOTS, [0], 0, 33)
    assert "33" in err.message and "32" in err.message
    invalid(slot_as_blocks_spans, SLOTS, [0], 0, 0)
    invalid(slot_as_blocks_spans, SLOTS, [0], 0, -1)
    invalid(slot_as_blocks_spans, SLOTS, [0], 4, 8)
    with pytest.raises(DataDistError) as exc:
        slot_as_blocks_spans(SLOTS, [0], 4, 8, missing_code=NOT_EXIST)
    assert exc.value.code == NOT_EXIST


# ---- copy_blocks / swap_blocks ------------------------------------------------------------------

def test_block_copy_pairs_in_mapping_and_list_order() -> None:
    assert block_copy_pairs({3: [1, 2], 0: [5]}, 6) == [(3, 1), (3, 2), (0, 5)]
    assert block_copy_pairs({}, 6) == []
    assert block_copy_pairs({1: []}, 6) == []


@pytest.mark.parametrize("info", [{6: [0]}, {-1: [0]}, {0: [6]}, {0: [1, -1]}, {0: 1}, {0: "12"}])
def test_bad_block_copy_info_is_param_invalid(info: dict) -> None:
    invalid(block_copy_pairs, info, 6)


def test_swap_pairs_checks_each_side_against_its_cache() -> None:
    assert swap_pairs({0: 9, 3: 1}, 4, 10) == [(0, 9), (3, 1)]
    err = invalid(swap_pairs, {4: 0}, 4, 10)
    assert "4" in err.message
    err = invalid(swap_pairs, {0: 10}, 4, 10)
    assert "10" in err.message
    invalid(swap_pairs, {0: -1}, 4, 10)


# ---- properties against a numpy oracle ------------------------------------------------------------

@st.composite
def block_cases(draw):  # noqa: ANN001, ANN201
    n = draw(st.integers(1, 4))
    rows = draw(st.integers(1, 12))
    inner = draw(st.integers(1, 5))
    dtype = draw(st.sampled_from([DType.DT_UINT8, DType.DT_FLOAT16, DType.DT_INT32]))
    desc = CacheDesc(num_tensors=n, shape=(rows, inner), dtype=dtype)
    tensors = draw(st.lists(st.integers(0, n - 1), max_size=n + 1))
    blocks = draw(st.lists(st.integers(0, rows - 1), max_size=3 * rows) | st.builds(
        lambda a, b: list(range(min(a, b), max(a, b) + 1)), st.integers(0, rows - 1), st.integers(0, rows - 1)))
    return desc, tensors, blocks


def _tensors_bytes(desc: CacheDesc, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, desc.tensor_size, dtype=np.uint8) for _ in range(desc.num_tensors)]


def _gather(data: list[np.ndarray], spans: list[Span]) -> bytes:
    return b"".join(data[s.tensor][s.offset:s.offset + s.length].tobytes() for s in spans)


@settings(max_examples=300, deadline=None)
@given(case=block_cases(), seed=st.integers(0, 2**32 - 1))
def test_block_spans_select_the_same_bytes_as_a_per_block_gather(case, seed: int) -> None:  # noqa: ANN001
    desc, tensors, blocks = case
    data = _tensors_bytes(desc, seed)
    spans = block_spans(desc, tensors, blocks)
    row = desc.row_size
    views = [d.reshape(desc.rows, row) for d in data]
    expected = b"".join(views[t][b].tobytes() for t in tensors for b in blocks)
    assert _gather(data, spans) == expected
    assert total_length(spans) == len(tensors) * len(blocks) * row
    # tensor by tensor in the order given; inside one tensor the runs are maximal
    per_tensor = [block_spans(desc, [t], blocks) for t in tensors]
    assert spans == [s for group in per_tensor for s in group]
    for group in per_tensor:
        for prev, nxt in itertools.pairwise(group):
            assert prev.offset + prev.length != nxt.offset
    for s in spans:
        assert s.length > 0 and s.length % row == 0 and s.offset % row == 0
        assert 0 <= s.offset and s.offset + s.length <= desc.tensor_size


@settings(max_examples=300, deadline=None)
@given(case=block_cases(), data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_slot_spans_select_the_same_bytes_as_numpy_slicing(case, data, seed: int) -> None:  # noqa: ANN001
    desc, tensors, _ = case
    row = desc.row_size
    batch = data.draw(st.integers(-1, desc.rows))
    offset = data.draw(st.integers(0, row + 1))
    size = data.draw(st.sampled_from([-1, 0]) | st.integers(1, row + 1))
    arrays = _tensors_bytes(desc, seed)
    valid_batch = 0 <= batch < desc.rows
    want = row - offset if size == -1 else size
    if not valid_batch or not (0 < want <= row - offset):
        with pytest.raises(DataDistError) as exc:
            slot_spans(desc, tensors, batch, size, offset, missing_code=NOT_EXIST)
        assert exc.value.code == (NOT_EXIST if not valid_batch else INVALID)
        return
    spans = slot_spans(desc, tensors, batch, size, offset)
    views = [a.reshape(desc.rows, row) for a in arrays]
    expected = b"".join(views[t][batch][offset:offset + want].tobytes() for t in tensors)
    assert _gather(arrays, spans) == expected
    assert total_length(spans) == len(tensors) * want


@settings(max_examples=200, deadline=None)
@given(start=st.integers(-2, 10), length=st.integers(-1, 6), per=st.integers(0, 4), n=st.integers(1, 16))
def test_layer_ranges_match_python_range_arithmetic(start: int, length: int, per: int, n: int) -> None:
    stop = start + length
    ok = per >= 1 and per <= n and 0 <= start < stop and stop * per <= n
    if not ok:
        invalid(layer_range_to_tensor_indices, start, stop, per, n)
        return
    got = layer_range_to_tensor_indices(start, stop, per, n)
    expected = [t for layer in range(start, stop) for t in range(layer * per, layer * per + per)]
    assert list(got) == expected
    assert all(0 <= t < n for t in got)
    # the inclusive C++ pair of the same layers gives the same tensors
    first, second = inclusive_pair_to_range(start, stop - 1)
    assert layer_range_to_tensor_indices(first, second, per, n) == got


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(-3, 12), st.booleans(), st.integers(0, 9).map(np.int64), st.none(),
                          st.floats(0, 9)), min_size=1, max_size=12))
def test_block_lists_are_checked_element_by_element_unless_all_plain_ints(blocks: list[object]) -> None:
    """A list of plain in-range ints passes at once; anything else fails naming its first bad element, as a check
    of each element (``_is_int`` and the range) would."""
    desc = CacheDesc(1, (10, 4), DType.DT_UINT8)
    bad = next((i for i, b in enumerate(blocks) if not (isinstance(b, int) and not isinstance(b, bool)
                                                         and 0 <= b < 10)), None)
    if bad is None:
        assert block_spans(desc, [0], blocks, "dst").nbytes == 4 * len(blocks)
    else:
        with pytest.raises(DataDistError, match=rf"dst_blocks\[{bad}\] = "):
            block_spans(desc, [0], blocks, "dst")


@pytest.mark.parametrize("theirs,what", [
    ((4, (8, 16)), "tensor counts differ"),                 # 4 tensors of the same blocks against 8
    ((8, (8, 32)), "block sizes differ"),                   # 8 tensors of twice the block
    ((2, (8, 32)), "tensor counts and block sizes differ"),  # both wrong
])
def test_an_owner_size_mismatch_becomes_the_requesters_whole_story(theirs, what) -> None:
    """The owner says its side (``size_mismatch``), the requester reads it and adds its own (issue 37, item 7): the
    two halves of one format, kept in one module."""
    from datadistd.core.layout import owner_spans
    from datadistd.core.types import BlocksKeyRef, ReadMode, RemoteSpec

    owner = CacheDesc(8, (16, 8, 16), DType.DT_FLOAT16)
    count, block = theirs
    requester = CacheDesc(count, (16, *block), DType.DT_FLOAT16)
    expected = count * 2 * requester.row_size
    spec = RemoteSpec(BlocksKeyRef(1, 0), ReadMode.BLOCKS, (0, 1), expected_bytes=expected)
    with pytest.raises(DataDistError) as info:
        owner_spans(owner, True, 7, 1, spec, "src", 1)
    told = explain_size_mismatch(info.value.message, requester, True, 9, count, False)
    assert told is not None and told.startswith(f"{what}: the source cache 7 of cluster 1 has 8 tensors (block "
                                                "shape [8, 16] of DT_FLOAT16, 256 bytes per tensor and block), the "
                                                f"destination cache 9 has {count} tensors"), told
    assert ("src_layer_range=range(0, 2) and dst_layer_range=range(0, 2)" in told) == (what == "tensor counts differ")
    assert explain_size_mismatch("an unrelated refusal", requester, True, 9, count, False) is None
