"""Block and layer arithmetic: which bytes of which tensors a transfer or a copy touches.

A cache is ``num_tensors`` equally shaped tensors; ``shape[0]`` is the batch size of a
contiguous cache or the block count of a blocks cache, and one row (batch slot or block) of one
tensor is ``desc.row_size`` bytes. A transfer lists its bytes in one logical order: tensor by
tensor in the order given, and inside a tensor row by row in list order. A ``Span`` is one
contiguous byte range inside one tensor; consecutive ascending blocks become one span.

Layer ranges follow docs/spec.md §6: Python ranges are half-open, layer ``L`` holds tensors
``[L*N, L*N + N)`` with ``N = tensor_num_per_layer``; C++ ``KvCacheExtParam`` pairs are
inclusive with ``{-1, -1}`` meaning all layers.

Every check raises ``DataDistError`` (``LLM_PARAM_INVALID`` unless told otherwise) before
anything is returned. Pure Python, no numpy: the daemon core imports no array library.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, count, islice, repeat
from operator import is_not, not_

from .errors import DataDistError, StatusCode, require
from .types import BlockList, CacheDesc, ReadMode, RemoteSpec

__all__ = [
    "address_spans",
    "Span", "BlockSpans", "layer_range_to_tensor_indices", "inclusive_pair_to_range", "block_spans", "slot_spans",
    "slot_as_blocks_spans", "total_length", "owner_spans", "block_copy_pairs", "swap_pairs", "block_runs",
]


@dataclass(frozen=True, slots=True)
class Span:
    """``length`` bytes at byte ``offset`` inside tensor number ``tensor`` of a cache."""

    tensor: int
    offset: int
    length: int


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ---- layer ranges -------------------------------------------------------------------------------

def layer_range_to_tensor_indices(start: int | None, stop: int | None, tensor_num_per_layer: int,
                                  num_tensors: int) -> tuple[int, ...]:
    """Tensor indices of layers ``range(start, stop)``; both ``None`` means every tensor of the cache.

    With a range: ``tensor_num_per_layer`` in ``[1, num_tensors]``, ``0 <= start < stop`` and
    ``stop * tensor_num_per_layer <= num_tensors``. Without one, ``tensor_num_per_layer`` only has
    to be >= 1: it selects nothing, so a cache with fewer tensors than the default N of 2 can still
    be transferred whole.
    """
    per = tensor_num_per_layer
    require(_is_int(per) and per >= 1, f"tensor_num_per_layer must be an int >= 1, got {per!r}")
    require(_is_int(num_tensors) and num_tensors >= 1, f"num_tensors must be an int >= 1, got {num_tensors!r}")
    if start is None and stop is None:
        return tuple(range(num_tensors))
    if start is None or stop is None:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                            f"a layer range needs both start and stop, got start={start!r} stop={stop!r}")
    require(_is_int(start) and _is_int(stop), f"layer range bounds must be ints, got range({start!r}, {stop!r})")
    require(per <= num_tensors,
            f"tensor_num_per_layer must be in [1, num_tensors={num_tensors}], got {per}")
    require(0 <= start < stop, f"layer range must satisfy 0 <= start < stop, got range({start}, {stop})")
    require(stop * per <= num_tensors,
            f"layer range range({start}, {stop}) with tensor_num_per_layer={per} needs tensors up to "
            f"{stop * per - 1}, but the cache has num_tensors={num_tensors} (max layer index "
            f"{num_tensors // per - 1})")
    return tuple(range(start * per, stop * per))


def inclusive_pair_to_range(first: int, second: int) -> tuple[int | None, int | None]:
    """C++ ``KvCacheExtParam`` inclusive ``{first, second}`` -> half-open ``(start, stop)``; ``{-1, -1}`` -> all."""
    require(_is_int(first) and _is_int(second), f"layer range values must be ints, got {{{first!r}, {second!r}}}")
    require(first >= -1 and second >= -1, f"layer range values must be >= -1, got {{{first}, {second}}}")
    require(first <= second, f"layer range needs first <= second, got {{{first}, {second}}}")
    if first == -1 and second == -1:
        return None, None
    require(first >= 0, f"layer range {{{first}, {second}}}: -1 means all layers only as {{-1, -1}}")
    return first, second + 1


# ---- spans ---------------------------------------------------------------------------------------

def _check_tensor_indices(desc: CacheDesc, tensor_indices: Sequence[int]) -> None:
    n = desc.num_tensors
    if not tensor_indices:
        return
    if isinstance(tensor_indices, range):
        ok = tensor_indices.step > 0 and tensor_indices[0] >= 0 and tensor_indices[-1] < n
        if ok:
            return
    else:
        try:
            ok = min(tensor_indices) >= 0 and max(tensor_indices) < n
        except TypeError:
            ok = False
        if ok and all(_is_int(t) for t in tensor_indices):
            return
    for t in tensor_indices:
        if not (_is_int(t) and 0 <= t < n):
            raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                f"tensor index {t!r} out of range [0, {n}) (num_tensors={n})")


#: which block list a check is about, as the worker named it: ``side`` -> (argument, whose cache)
SIDES = {"src": ("src_blocks", "source"), "dst": ("dst_blocks", "destination")}


def _check_rows(desc: CacheDesc, rows: Sequence[int], what: str, side: str = "") -> None:
    """Every item of ``rows`` an int in ``[0, desc.rows)``, else ``LLM_PARAM_INVALID`` naming the first that is not.
    No Python loop over the items, whatever their count: a peer's long list (``BlockList``) is checked by its
    ``high`` and its first bad item found by bisection of its ``peaks``; any other list by C passes (``min``,
    ``max``, ``map``) that stop at the first bad item (``_first_bad``)."""
    n = desc.rows
    if not rows:
        return
    if isinstance(rows, BlockList):
        if rows.high < n:
            return
        i = bisect.bisect_left(rows.peaks, n)   # the first item whose running maximum reaches n: that item is >= n
    else:
        plain = set(map(type, rows)) == {int}   # the types found by a C loop
        if plain and min(rows) >= 0 and max(rows) < n:
            return
        found = _first_bad(rows, n, plain)
        if found is None:   # ints of a subclass (an IntEnum), every one in range
            return
        i = found
    b = rows[i]
    if side:
        arg, whose = SIDES[side]
        raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                            f"{arg}[{i}] = {b!r} out of range [0, {n}): the {whose} cache has {n} {what}s")
    raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                        f"{what} {b!r} (position {i}) out of range [0, {n}) for a cache of {n} {what}s")


def _first_bad(rows: Sequence[int], n: int, plain: bool) -> int | None:
    """The position of the first item of ``rows`` that is not an int (a bool is not) in ``[0, n)``, None when
    there is none, found by C iterators that stop there. ``plain``: every item is an int (``n.__le__``,
    ``(0).__gt__`` find the first one out of range); else the first item of another type, and the first int before
    it outside ``range(n)`` (``range.__contains__`` is O(1) on an int, and only ints reach it) -- that item itself
    when it is no int in range, else the same from the item after it (an int subclass such as an IntEnum is an
    int, as everywhere in this module: ``_is_int``)."""
    if plain:
        return min(next(compress(count(), map(n.__le__, rows)), len(rows)),
                   next(compress(count(), map((0).__gt__, rows)), len(rows)))
    start, end = 0, len(rows)
    while start < end:
        typed = next(compress(count(start), map(is_not, map(type, islice(rows, start, None)), repeat(int))), end)
        bad = next(compress(count(start), map(not_, map(range(n).__contains__, islice(rows, start, typed)))), typed)
        if bad < typed:
            return bad
        if typed == end:
            return None
        b = rows[typed]
        if not (_is_int(b) and 0 <= b < n):
            return typed
        start = typed + 1
    return None


def block_runs(blocks: Sequence[int]) -> list[tuple[int, int]]:
    """``(first block, count)`` of each run of consecutive ascending blocks, in list order."""
    runs: list[tuple[int, int]] = []
    it = iter(blocks)
    try:
        first = prev = next(it)
    except StopIteration:
        return runs
    for b in it:
        if b == prev + 1:
            prev = b
            continue
        runs.append((first, prev - first + 1))
        first = prev = b
    runs.append((first, prev - first + 1))
    return runs


class BlockSpans(Sequence[Span]):
    """The spans of ``block_spans``: every run of ``blocks`` in every tensor of ``tensors``, tensor by tensor.

    A paged transfer names thousands of blocks in dozens of tensors; this keeps the checked inputs
    (``tensors``, ``blocks``, ``row`` bytes per block) instead of one ``Span`` per (tensor, run), so
    its size is known at once (``nbytes``) and the daemon's memory layer can turn it into byte
    ranges with array arithmetic (``memory.segments.SegmentTable.blocks``). As a sequence it yields
    the same ``Span`` items a list would (built on demand, runs merged as ``block_runs`` says) and
    compares equal to such a list.
    """

    __slots__ = ("tensors", "blocks", "row", "_runs")

    def __init__(self, tensors: Sequence[int], blocks: Sequence[int], row: int) -> None:
        self.tensors = tuple(tensors)
        self.blocks = blocks if isinstance(blocks, (tuple, range)) else tuple(blocks)
        self.row = row
        self._runs: list[tuple[int, int]] | None = None

    @property
    def nbytes(self) -> int:
        return len(self.tensors) * len(self.blocks) * self.row

    @property
    def runs(self) -> list[tuple[int, int]]:
        """``(byte offset, byte length)`` of each run of blocks inside one tensor."""
        if self._runs is None:
            row = self.row
            self._runs = [(first * row, count * row) for first, count in block_runs(self.blocks)] \
                if self.tensors else []
        return self._runs

    def __len__(self) -> int:
        return len(self.tensors) * len(self.runs) if self.tensors else 0

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        runs = self.runs
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("span index out of range")
        offset, length = runs[i % len(runs)]
        return Span(self.tensors[i // len(runs)], offset, length)

    def __iter__(self) -> Iterator[Span]:
        runs = self.runs
        for t in self.tensors:
            for offset, length in runs:
                yield Span(t, offset, length)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BlockSpans):
            return list(self) == list(other)
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"BlockSpans(tensors={self.tensors!r}, {len(self.blocks)} blocks of {self.row} bytes)"


def block_spans(desc: CacheDesc, tensor_indices: Sequence[int], blocks: Sequence[int], side: str = "") -> BlockSpans:
    """The bytes of ``blocks`` (list order) in each tensor of ``tensor_indices`` (given order), runs merged.

    Checks every index first (an error names ``side``'s list: ``"src"`` -> src_blocks of the source cache,
    ``"dst"`` -> dst_blocks of the destination); the result is a ``BlockSpans`` sequence (see there).
    """
    _check_tensor_indices(desc, tensor_indices)
    _check_rows(desc, blocks, "block", side)
    return BlockSpans(tensor_indices, blocks, desc.row_size)


def slot_spans(desc: CacheDesc, tensor_indices: Sequence[int], batch_index: int, size: int, offset: int = 0,
               *, missing_code: StatusCode = StatusCode.LLM_PARAM_INVALID) -> list[Span]:
    """Bytes ``[offset, offset + size)`` of batch slot ``batch_index`` in each tensor (contiguous caches).

    ``size == -1`` means the rest of the slot (``row_size - offset``). A batch index outside the
    cache raises ``missing_code`` (the owner of a pulled cache passes ``LLM_KV_CACHE_NOT_EXIST``).
    """
    if not (_is_int(batch_index) and 0 <= batch_index < desc.rows):
        raise DataDistError(missing_code, f"batch_index {batch_index!r} out of range [0, {desc.rows})")
    row = desc.row_size
    require(_is_int(offset) and 0 <= offset, f"offset must be an int >= 0, got {offset!r}")
    require(_is_int(size), f"size must be an int, got {size!r}")
    if size == -1:
        size = row - offset
    require(0 < size <= row - offset,
            f"size {size} at offset {offset} must be in (0, {row - offset}]: the batch slot holds {row} bytes")
    _check_tensor_indices(desc, tensor_indices)
    start = batch_index * row + offset
    return [Span(t, start, size) for t in tensor_indices]


def slot_as_blocks_spans(desc_src: CacheDesc, tensor_indices: Sequence[int], batch_index: int, nbytes: int,
                         *, missing_code: StatusCode = StatusCode.LLM_PARAM_INVALID) -> list[Span]:
    """The first ``nbytes`` of batch slot ``batch_index`` per tensor: the source of a contiguous -> blocks pull.

    ``nbytes`` is ``len(dst_blocks) * dst.row_size`` and must fit in the source slot.
    """
    require(_is_int(nbytes) and 0 < nbytes <= desc_src.row_size,
            f"{nbytes!r} bytes asked from a batch slot of {desc_src.row_size} bytes: the destination blocks "
            f"must not exceed the source slot")
    return slot_spans(desc_src, tensor_indices, batch_index, nbytes, 0, missing_code=missing_code)


def total_length(spans: Iterable[Span]) -> int:
    if isinstance(spans, BlockSpans):
        return spans.nbytes
    return sum(s.length for s in spans)


# ---- local block copies --------------------------------------------------------------------------

def _check_block(value: object, rows: int, what: str) -> None:
    if not (_is_int(value) and 0 <= value < rows):  # type: ignore[operator]
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"{what} {value!r} out of range [0, {rows})")


def block_copy_pairs(copy_block_info: Mapping[int, Sequence[int]], rows: int) -> list[tuple[int, int]]:
    """``{src: [dst, ...]}`` of ``copy_blocks`` -> ``(src, dst)`` pairs in mapping and list order, all checked."""
    pairs: list[tuple[int, int]] = []
    for src, dsts in copy_block_info.items():
        _check_block(src, rows, "copy_blocks source block")
        if isinstance(dsts, (str, bytes)) or not isinstance(dsts, Iterable):
            raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                f"copy_blocks destinations of block {src!r} must be a list of ints, "
                                f"got {type(dsts).__name__}")
        for dst in dsts:
            _check_block(dst, rows, f"copy_blocks destination block (of source {src})")
            pairs.append((src, dst))
    return pairs


def swap_pairs(src_to_dst: Mapping[int, int], src_rows: int, dst_rows: int) -> list[tuple[int, int]]:
    """``{src: dst}`` of ``swap_blocks`` -> ``(src, dst)`` pairs in mapping order, both sides checked."""
    pairs: list[tuple[int, int]] = []
    for src, dst in src_to_dst.items():
        _check_block(src, src_rows, "swap_blocks source block")
        _check_block(dst, dst_rows, f"swap_blocks destination block (of source {src})")
        pairs.append((src, dst))
    return pairs


def owner_spans(desc: CacheDesc, is_blocks: bool, cache_id: int, batch: int, spec: RemoteSpec, side: str,
                cluster_id: int) -> tuple[Sequence[Span], list[int]]:
    """What a peer's ``spec`` touches of a cache it may address (found, remotely accessible): the spans and the
    tensor indices, after every bound -- tensor range, blocks or slot, and the requester's byte count. The one
    copy of these checks: ``Engine.prepare_read`` / ``prepare_write`` call it; the owner's read view
    (``engine/readview``) answers only what passes the same bounds, and hands anything else here to be refused
    (tests/unit/test_readview.py holds both to the same answers)."""
    count = spec.tensor_count or desc.num_tensors
    require(spec.tensor_start + count <= desc.num_tensors,
            f"tensors [{spec.tensor_start}, {spec.tensor_start + count}) outside cache {cache_id} "
            f"with {desc.num_tensors} tensors")
    indices = list(range(spec.tensor_start, spec.tensor_start + count))
    spans: Sequence[Span]
    if spec.mode == ReadMode.BLOCKS:
        require(is_blocks, f"cache {cache_id} is not a blocks cache")
        spans = block_spans(desc, indices, spec.blocks, side)
    else:
        require(not is_blocks, f"cache {cache_id} is a blocks cache; address it with a BlocksCacheKey")
        require(spec.size == -1 or spec.size + spec.offset <= desc.row_size,
                f"{spec.size} bytes at offset {spec.offset} exceed the batch slot of {desc.row_size} bytes "
                f"of cache {cache_id}")
        spans = slot_spans(desc, indices, batch, spec.size, spec.offset, missing_code=StatusCode.LLM_KV_CACHE_NOT_EXIST)
    got = total_length(spans)
    if spec.expected_bytes != got:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                            size_mismatch(desc, is_blocks, cache_id, cluster_id, spec, side, count, got))
    return spans, indices


def describe_layout(desc: CacheDesc, is_blocks: bool) -> str:
    """``"block shape [16, 8, 64] of DT_FLOAT16, 16384 bytes per tensor and block"``: what two caches a transfer or
    a copy pairs must agree on, for messages."""
    unit = "block" if is_blocks else "batch slot"
    return f"{unit} shape {list(desc.shape[1:])} of {desc.dtype.name}, {desc.row_size} bytes per tensor and {unit}"


#: how an owner's refusal of a requester's byte count begins (``size_mismatch``; ``explain_size_mismatch`` reads it)
SIZE_MISMATCH = "size mismatch: "
_OWNER_FACTS = re.compile(r"size mismatch: (the (source|destination) cache \d+ of cluster \d+ has (\d+) tensors "
                          r"\((?:block|batch slot) shape \[[\d, ]*\] of \w+, (\d+) bytes per tensor and "
                          r"(?:block|batch slot)\))")


def size_mismatch(desc: CacheDesc, is_blocks: bool, cache_id: int, cluster_id: int, spec: RemoteSpec, side: str,
                  count: int, got: int) -> str:
    """The owner's side of a byte count it does not hold for a peer's request: its tensors and layout, in the
    caller's terms (``side``: this cache's side of the transfer, "src" for a pull, "dst" for a push). The
    requester, which knows its own cache, turns it into the whole story (``explain_size_mismatch``)."""
    ours, theirs = ("source", "destination") if side == "src" else ("destination", "source")
    return (f"{SIZE_MISMATCH}the {ours} cache {cache_id} of cluster {cluster_id} has {count} tensors "
            f"({describe_layout(desc, is_blocks)}): {got} bytes for this request, the {theirs} side expects "
            f"{spec.expected_bytes}")


def explain_size_mismatch(message: str, local: CacheDesc, local_is_blocks: bool, local_cache_id: int,
                          local_tensors: int, layers_given: bool) -> str | None:
    """The requester's account of an owner's ``size_mismatch`` refusal: both caches' tensor counts and layouts,
    what differs and the option that fixes it; None when ``message`` is no such refusal (an older owner's)."""
    found = _OWNER_FACTS.search(message)
    if found is None:
        return None
    there, role, count, row = found.group(1), found.group(2), int(found.group(3)), int(found.group(4))
    mine = "destination" if role == "source" else "source"
    here = (f"the {mine} cache {local_cache_id} has {local_tensors} tensors "
            f"({describe_layout(local, local_is_blocks)})")
    if count != local_tensors and row == local.row_size:
        common = min(count, local_tensors) // 2
        if layers_given or not common:
            layers = "src_layer_range and dst_layer_range covering the same number of tensors"
        else:
            layers = (f"src_layer_range=range(0, {common}) and dst_layer_range=range(0, {common}) (with the default "
                      f"tensor_num_per_layer=2: the first {2 * common} tensors of each)")
        return (f"tensor counts differ: {there}, {here}; move the layers both have -- {layers} -- or register both "
                "caches with the same number of tensors (CacheDesc num_tensors)")
    what = "block sizes differ" if count == local_tensors else "tensor counts and block sizes differ"
    return (f"{what}: {there}, {here}; register both caches with the same number of tensors and block shape "
            "(CacheDesc num_tensors, shape[1:] and data_type)")


def address_spans(desc: CacheDesc, cache_id: int, tensor: int, offset: int, spec: RemoteSpec) -> list[Span]:
    """What a peer's ``spec`` naming a raw worker address touches: ``offset`` bytes into tensor ``tensor`` of the
    cache, blocks of the key's ``block_size`` (``ReadMode.BLOCKS``) or ``spec.size`` bytes, every one inside the
    tensor. The one copy of these checks (the owner's ``Engine``, the puller's published table)."""
    key = spec.key
    size = desc.tensor_size
    if spec.mode == ReadMode.BLOCKS:
        bs = key.block_size  # type: ignore[union-attr]
        require(bs > 0, "a blocks address needs the block size (dst_block_memory_size)")
        for i, b in enumerate(spec.blocks):
            require(offset + (b + 1) * bs <= size,
                    f"block {b} (position {i}) of {bs} bytes at address {key.addr:#x} runs past the end of "  # type: ignore[union-attr]
                    f"tensor {tensor} of cache {cache_id}")
        return [Span(tensor, offset + first * bs, count * bs) for first, count in block_runs(spec.blocks)]
    require(spec.size > 0 and offset + spec.size <= size,
            f"{spec.size} bytes at address {key.addr:#x} run past the end of tensor {tensor} of cache "  # type: ignore[union-attr]
            f"{cache_id}")
    return [Span(tensor, offset, spec.size)]
