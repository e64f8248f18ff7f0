"""``check_blocks``: a block list is accepted or refused exactly as checking each element with ``check_uint64``
does, with the same error (its usual case is found by C loops, the rest element by element)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llm_datadist import _validate as v
from llm_datadist._cache_ops import check_blocks

U64 = 2**64 - 1

elements = st.one_of(st.integers(0, U64), st.integers(0, 1000), st.integers(-(2**70), 2**70), st.booleans(),
                     st.none(), st.floats(allow_nan=False), st.text(max_size=2),
                     st.integers(0, 50).map(np.int64), st.integers(0, 50).map(np.uint64))


def _elementwise(name: str, blocks: Any) -> Any:
    """What the list is refused with, checked element by element (None: accepted)."""
    try:
        for b in blocks:
            v.check_uint64(f"{name} element", b)
    except (TypeError, ValueError) as exc:
        return type(exc), str(exc)
    return None


@given(st.lists(elements, max_size=20) | st.lists(st.integers(0, U64), max_size=300), st.booleans())
def test_check_blocks_is_the_elementwise_check(blocks: list[Any], as_tuple: bool) -> None:
    value = tuple(blocks) if as_tuple else blocks
    want = _elementwise("src_blocks", blocks)
    if want is None:
        got = check_blocks("src_blocks", value)
        assert got == list(blocks) and type(got) is list and got is not value
    else:
        with pytest.raises(want[0]) as info:
            check_blocks("src_blocks", value)
        assert str(info.value) == want[1]


def test_check_blocks_refuses_what_is_not_a_list() -> None:
    with pytest.raises(TypeError):
        check_blocks("dst_blocks", {1, 2})
    assert check_blocks("dst_blocks", ()) == [] and check_blocks("dst_blocks", []) == []
