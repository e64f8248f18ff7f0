"""The rows of a peer's published table at the requester (``tables.PublishedTables``): its entries, a checked READ
of them, and the arithmetic that names which prepared rows a read takes -- int arithmetic for a few whole rows,
array operations for the rest. Rows outside the published cache are refused here (``LLM_PARAM_INVALID``), before
the agent (which refuses them too) is asked."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from datadist.status import LLMStatusCode

from ...core.errors import DataDistError
from ...memory.base import Segment
from ..registrations import Registration
from .link import LinkPeer

__all__ = ["RemoteEntry", "ReadPlan", "FEW_ROWS", "row_indices", "by_rows", "tensor_ranges", "settle_future"]


@dataclass
class RemoteEntry:
    """An entry of a peer's table at the requester: what ``P`` said, and its rows prepared for READ."""

    handle: int
    generation: int
    row_size: int
    rows: int
    bases: np.ndarray            # uint64, one per tensor
    info: bytes
    prepared: Any = None         # the agent's prepared descriptor list of every row (None: no tensor is readable)
    starts: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint64))   # row addresses, sorted
    order: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))     # their rows' indices
    busy: int = 0                # READs running on ``prepared``
    gone: bool = False           # withdrawn or replaced: ``prepared`` is released once no READ uses it


@dataclass
class ReadPlan:
    """A READ of published rows, checked (``PublishedTables._plan``), and once ``start_rows`` posted it, what the
    progress thread needs to end it."""

    peer: LinkPeer
    entry: RemoteEntry
    handle: int
    indices: list[int] | None     # whole rows: their indices in the entry's prepared list, paired with ``dst``
    src: np.ndarray
    dst: np.ndarray
    reg: Registration | None      # the registration every ``dst`` extent lies in (``indices`` only)
    nbytes: int
    notif: bytes
    tid: int = 0
    # posted by ``start_rows``: checked by the progress thread
    request: int = 0
    made: Any = None
    deadline: float = 0.0
    loop: asyncio.AbstractEventLoop | None = None
    future: asyncio.Future[None] | None = None
    probed: bool = False          # past its deadline, the fabric's connection was probed (``wire.PROBE``)


def settle_future(future: asyncio.Future[None], error: DataDistError | None) -> None:
    """On the loop: a posted READ's ``future`` ends with ``error`` (or None), unless its pull was cancelled."""
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)



FEW_ROWS = 64   # spans checked and indexed by int arithmetic (more: by array operations)


def row_indices(entry: RemoteEntry, spans: np.ndarray, handle: int, name: str) -> list[int] | None:
    """The indices in ``entry``'s prepared list of ``spans`` (``(tensor, offset, length)`` rows) when there are a
    few and each is one whole row; None otherwise (the array path pairs them). Rows outside the published cache are
    refused either way (``LLM_PARAM_INVALID``); an empty ``spans`` is None (nothing to read)."""
    if not 0 < len(spans) <= FEW_ROWS or entry.prepared is None:
        if len(spans) and (int(spans[:, 0].astype(np.uint64).max()) >= len(entry.bases) or
                           int((spans[:, 1].astype(np.uint64) + spans[:, 2].astype(np.uint64)).max()) >
                           entry.rows * entry.row_size):
            raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID, f"{name}: rows outside published cache {handle}")
        return None
    tensors, size, rows = len(entry.bases), entry.row_size, entry.rows
    indices: list[int] | None = []
    for tensor, offset, length in spans.tolist():
        if not 0 <= tensor < tensors or offset < 0 or length < 0 or offset + length > rows * size:
            raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID, f"{name}: rows outside published cache {handle}")
        if indices is not None:
            if length == size and offset % size == 0:
                indices.append(tensor * rows + offset // size)
            else:
                indices = None
    return indices


def by_rows(entry: RemoteEntry, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``(indices, local extents)`` when the paired ``src`` extents are whole rows of ``entry`` (a piece of several
    consecutive rows is cut into them, ``dst`` alike); None when a piece cuts a row."""
    size = np.uint64(entry.row_size)
    if not len(entry.starts):
        return None
    if bool((src[:, 1] == size).all()):   # one row a piece (a few blocks): no cutting
        pos = np.searchsorted(entry.starts, src[:, 0])
        if int(pos.max()) >= len(entry.starts) or not np.array_equal(entry.starts[pos], src[:, 0]):
            return None
        return entry.order[pos], dst
    if np.any(src[:, 1] % size):
        return None
    count = (src[:, 1] // size).astype(np.int64)
    total = int(count.sum())
    step = (np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)).astype(np.uint64)
    first = np.searchsorted(entry.starts, src[:, 0])
    pos = np.repeat(first, count) + step.astype(np.int64)
    if int(pos.max()) >= len(entry.starts):
        return None
    if not np.array_equal(entry.starts[pos], np.repeat(src[:, 0], count) + step * size):
        return None
    local = np.empty((total, 2), dtype=np.uint64)
    local[:, 0] = np.repeat(dst[:, 0], count) + step * size
    local[:, 1] = size
    return entry.order[pos], local


def tensor_ranges(tensors: Sequence[Segment]) -> np.ndarray | None:
    """``(address, length)`` of each tensor in this process, or None when one is not mapped here."""
    out = np.empty((len(tensors), 2), dtype=np.uint64)
    for i, seg in enumerate(tensors):
        view = seg.handle.view()
        if view is None:
            return None
        out[i] = (int(np.frombuffer(view, dtype=np.uint8).ctypes.data) + seg.offset, seg.length)
    return out
