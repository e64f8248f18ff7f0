"""``PageAllocator``: rules, error codes, and best fit against a brute-force page-owner oracle."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from datadistd.core.allocator import PageAllocator
from datadistd.core.errors import DataDistError, StatusCode

KB = 1 << 10
INVALID = StatusCode.LLM_PARAM_INVALID
OOM = StatusCode.LLM_OUT_OF_MEMORY


def _code(exc: pytest.ExceptionInfo[DataDistError]) -> StatusCode:
    return exc.value.code


# ---- construction ------------------------------------------------------------------------------

@pytest.mark.parametrize("shift", [9, 31, 40, -1])
def test_page_shift_outside_10_to_30_is_param_invalid(shift: int) -> None:
    with pytest.raises(DataDistError) as exc:
        PageAllocator(1 << 40, page_shift=shift)
    assert _code(exc) == INVALID
    assert str(shift) in exc.value.message


@pytest.mark.parametrize("shift", [10, 16, 30])
def test_page_shift_bounds_are_accepted(shift: int) -> None:
    a = PageAllocator(4 << shift, page_shift=shift)
    assert a.page_size == 1 << shift
    assert a.capacity == 4 << shift


@pytest.mark.parametrize("capacity", [-1, 1.5, "1024", True])
def test_bad_capacity_is_param_invalid(capacity: object) -> None:
    with pytest.raises(DataDistError) as exc:
        PageAllocator(capacity)  # type: ignore[arg-type]
    assert _code(exc) == INVALID


def test_capacity_is_whole_pages_only() -> None:
    a = PageAllocator(10 * KB + 1000, page_shift=10)
    assert a.capacity == 10 * KB
    assert a.used == 0 and a.free_bytes == 10 * KB
    assert a.largest_free == 10 * KB


def test_pool_smaller_than_a_page_has_nothing_to_give() -> None:
    a = PageAllocator(1000, page_shift=10)
    assert a.capacity == 0 and a.free_bytes == 0 and a.largest_free == 0
    with pytest.raises(DataDistError) as exc:
        a.allocate(1)
    assert _code(exc) == OOM


# ---- allocate / free ----------------------------------------------------------------------------

@pytest.mark.parametrize("size", [0, -1, -KB, 1.0, None, True])
def test_bad_sizes_are_param_invalid(size: object) -> None:
    a = PageAllocator(8 * KB, page_shift=10)
    with pytest.raises(DataDistError) as exc:
        a.allocate(size)  # type: ignore[arg-type]
    assert _code(exc) == INVALID
    assert a.used == 0


def test_sizes_round_up_to_whole_pages_and_offsets_are_page_aligned() -> None:
    a = PageAllocator(16 * KB, page_shift=10)
    x = a.allocate(1)
    y = a.allocate(KB)
    z = a.allocate(KB + 1)
    assert (x, y, z) == (0, KB, 2 * KB)
    assert a.size_of(x) == KB and a.size_of(y) == KB and a.size_of(z) == 2 * KB
    assert a.used == 4 * KB and a.free_bytes == 12 * KB


def test_out_of_memory_when_full_and_nothing_changes() -> None:
    a = PageAllocator(4 * KB, page_shift=10)
    a.allocate(4 * KB)
    with pytest.raises(DataDistError) as exc:
        a.allocate(1)
    assert _code(exc) == OOM
    assert a.used == 4 * KB


def test_request_larger_than_the_pool_is_out_of_memory() -> None:
    a = PageAllocator(4 * KB, page_shift=10)
    with pytest.raises(DataDistError) as exc:
        a.allocate(4 * KB + 1)
    assert _code(exc) == OOM
    assert "4097" in exc.value.message


def test_fragmentation_is_out_of_memory_even_with_enough_free_bytes() -> None:
    a = PageAllocator(4 * KB, page_shift=10)
    offs = [a.allocate(KB) for _ in range(4)]
    a.free(offs[0])
    a.free(offs[2])
    assert a.free_bytes == 2 * KB and a.largest_free == KB
    with pytest.raises(DataDistError) as exc:
        a.allocate(2 * KB)
    assert _code(exc) == OOM


def test_free_coalesces_with_both_neighbours() -> None:
    a = PageAllocator(6 * KB, page_shift=10)
    offs = [a.allocate(2 * KB) for _ in range(3)]
    a.free(offs[0])
    a.free(offs[2])
    assert a.largest_free == 2 * KB
    a.free(offs[1])                      # joins the run before and the run after
    assert a.used == 0 and a.largest_free == 6 * KB
    assert a.allocate(6 * KB) == 0


def test_best_fit_takes_the_smallest_hole_that_fits() -> None:
    a = PageAllocator(16 * KB, page_shift=10)
    big = a.allocate(4 * KB)       # [0, 4)
    sep1 = a.allocate(KB)          # [4, 5)
    small = a.allocate(2 * KB)     # [5, 7)
    sep2 = a.allocate(KB)          # [7, 8)  -> [8, 16) stays free
    a.free(big)
    a.free(small)
    assert a.allocate(2 * KB) == 5 * KB    # exact fit, not the first hole
    assert a.allocate(3 * KB) == 0         # 4-page hole beats the 8-page tail
    assert a.allocate(5 * KB) == 8 * KB
    del sep1, sep2


def test_equal_holes_prefer_the_lowest_address() -> None:
    a = PageAllocator(8 * KB, page_shift=10)
    offs = [a.allocate(KB) for _ in range(8)]
    for i in (5, 1, 3):
        a.free(offs[i])
    assert a.allocate(KB) == KB


@pytest.mark.parametrize("offset", [-KB, 1, KB // 2, 3 * KB, 1 << 40, 1.0, None])
def test_free_of_anything_but_a_live_allocation_start_is_param_invalid(offset: object) -> None:
    a = PageAllocator(8 * KB, page_shift=10)
    a.allocate(2 * KB)   # [0, 2)
    a.allocate(KB)       # [2, 3)
    with pytest.raises(DataDistError) as exc:
        a.free(offset)  # type: ignore[arg-type]
    assert _code(exc) == INVALID
    with pytest.raises(DataDistError) as exc:
        a.size_of(offset)  # type: ignore[arg-type]
    assert _code(exc) == INVALID
    assert a.used == 3 * KB


def test_free_inside_an_allocation_is_param_invalid() -> None:
    a = PageAllocator(8 * KB, page_shift=10)
    a.allocate(4 * KB)
    with pytest.raises(DataDistError) as exc:
        a.free(KB)
    assert _code(exc) == INVALID


def test_double_free_is_param_invalid() -> None:
    a = PageAllocator(8 * KB, page_shift=10)
    x = a.allocate(KB)
    a.free(x)
    with pytest.raises(DataDistError) as exc:
        a.free(x)
    assert _code(exc) == INVALID
    assert a.used == 0 and a.largest_free == 8 * KB


def test_default_page_is_64_kib() -> None:
    a = PageAllocator(1 << 20)
    assert a.page_size == 64 * KB
    assert a.size_of(a.allocate(1)) == 64 * KB


def test_many_allocations_stay_fast() -> None:
    a = PageAllocator(1 << 30, page_shift=12)
    offs = [a.allocate(4096 * (1 + i % 3)) for i in range(20_000)]
    for off in offs[::2]:
        a.free(off)
    for off in offs[1::2]:
        a.free(off)
    assert a.used == 0 and a.largest_free == a.capacity


# ---- property: against a page-owner oracle -------------------------------------------------------

class Oracle:
    """Brute force: one owner tag per page (0 = free)."""

    def __init__(self, pages: int) -> None:
        self.owner = [0] * pages

    def free_runs(self) -> list[tuple[int, int]]:
        runs, start = [], None
        for i, o in enumerate(self.owner + [1]):
            if o == 0 and start is None:
                start = i
            elif o != 0 and start is not None:
                runs.append((start, i - start))
                start = None
        return runs

    def best_fit(self, need: int) -> int | None:
        fits = [(length, start) for start, length in self.free_runs() if length >= need]
        return min(fits)[1] if fits else None


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(min_value=1, max_value=9 * 1024)),
        st.tuples(st.just("free"), st.integers(min_value=0, max_value=10_000)),
    ),
    min_size=1, max_size=80,
)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pages=st.integers(min_value=0, max_value=24), ops=_ops)
def test_allocator_matches_a_best_fit_page_oracle(pages: int, ops: list[tuple[str, int]]) -> None:
    ps = KB
    a = PageAllocator(pages * ps + 17, page_shift=10)
    oracle = Oracle(pages)
    live: dict[int, tuple[int, int]] = {}   # offset -> (tag, pages)
    tag = 0
    for op, arg in ops:
        if op == "alloc":
            need = -(-arg // ps)
            expected = oracle.best_fit(need)
            if expected is None:
                with pytest.raises(DataDistError) as exc:
                    a.allocate(arg)
                assert exc.value.code == OOM
            else:
                off = a.allocate(arg)
                assert off % ps == 0
                first = off // ps
                assert all(o == 0 for o in oracle.owner[first:first + need]), "allocated pages not free"
                assert first == expected, "not the best fit"
                tag += 1
                oracle.owner[first:first + need] = [tag] * need
                live[off] = (tag, need)
                assert a.size_of(off) == need * ps
        elif live:
            off = sorted(live)[arg % len(live)]
            t, need = live.pop(off)
            a.free(off)
            first = off // ps
            assert oracle.owner[first:first + need] == [t] * need
            oracle.owner[first:first + need] = [0] * need
        used_pages = sum(1 for o in oracle.owner if o)
        assert a.used == used_pages * ps
        assert a.free_bytes == (pages - used_pages) * ps
        assert a.capacity == pages * ps
        runs = oracle.free_runs()
        assert a.largest_free == max((length for _, length in runs), default=0) * ps
        assert all(a.size_of(o) == need * ps for o, (_, need) in live.items())
    for off in list(live):
        a.free(off)
    assert a.used == 0 and a.largest_free == a.capacity
