"""``RegistrationTable``: the memory a one-sided transfer engine (NIXL, HCCL) has registered, by handle.

An engine moves only memory registered with it. Each memory handle a transfer uses is registered once,
on first use, and deregistered exactly once: when the handle is garbage (a weak reference's finalizer),
when a new handle takes its ``id``, or when the table closes. The engine's calls are the two callbacks;
the table is the same for every engine.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..memory.base import MemoryHandle, Segment
from ..memory.segments import SegmentTable

__all__ = ["Registration", "RegistrationTable"]


@dataclass(frozen=True)
class Registration:
    """A handle's memory, registered with an engine: ``size`` bytes at ``base`` (this process's address);
    ``serial`` tells it from a later registration of a handle that happens to get the same ``key`` (``id``);
    ``token`` is what the engine returned for it (NIXL's descriptor list, HCCL's handle)."""

    serial: int
    key: int
    base: int
    size: int
    token: Any


#: ``register(handle) -> (base, size, token)``; raises ``DataDistError`` when the engine cannot take it
Register = Callable[[MemoryHandle], tuple[int, int, Any]]


class RegistrationTable:
    """Thread-safe. ``lock``: the engine's own (re-entrant) lock when registrations must be consistent with
    other state of the engine; ``register_locked``: call ``register`` under it (HCCL binds each new
    registration to every communicator, and a communicator made meanwhile binds every registration)."""

    def __init__(self, register: Register, deregister: Callable[[Registration], None],
                 lock: threading.RLock | None = None, register_locked: bool = False) -> None:
        self._register = register
        self._deregister = deregister
        self._lock = lock or threading.RLock()   # re-entrant: a handle's finalizer may run from a GC pass
        self._register_locked = register_locked
        self._regs: dict[int, tuple[weakref.ReferenceType[Any], Registration]] = {}
        self._serials = itertools.count(1)
        self._closed = False

    def extents(self, segments: Sequence[Segment]) -> tuple[np.ndarray, list[Registration], list[Registration]]:
        """``(extents, used, new)``: ``extents`` an ``(N, 2)`` uint64 array of ``(address, length)`` of the non-empty
        ``segments``; the registrations they lie in, and which of those were made by this call.

        A ``SegmentTable`` is read as its arrays: one lookup per distinct handle, then array arithmetic -- no
        Python object per segment (other sequences are made a table first)."""
        table = SegmentTable.of(segments)
        used: list[Registration] = []
        new: list[Registration] = []
        for handle in table.handles:   # the handles of a transfer are few
            used.append(self.lookup(handle, new))
        table = table.nonempty()
        extents = np.empty((len(table), 2), dtype=np.uint64)
        offsets = table.offsets   # checked >= 0 (``SegmentTable.first_bad``) before a transfer: int64 bits as uint64
        offsets = offsets.view(np.uint64) if offsets.dtype == np.int64 else offsets.astype(np.uint64)
        if len({reg.base for reg in used}) == 1:
            np.add(offsets, np.uint64(used[0].base), out=extents[:, 0])
        else:
            bases = np.fromiter((reg.base for reg in used), dtype=np.uint64, count=len(used))
            np.add(bases[table.which], offsets, out=extents[:, 0])
        extents[:, 1] = table.lengths
        return extents, list({reg.key: reg for reg in used}.values()), new

    def lookup(self, handle: MemoryHandle, new: list[Registration]) -> Registration:
        """The registration of ``handle``, made now (and appended to ``new``) if it has none."""
        key = id(handle)
        with self._lock:
            known = self._regs.get(key)
            if known is not None and known[0]() is handle:
                return known[1]
            if self._register_locked:
                return self._add(handle, key, self._register(handle), new)
        return self._add(handle, key, self._register(handle), new)

    def _add(self, handle: MemoryHandle, key: int, made: tuple[int, int, Any], new: list[Registration]) -> Registration:
        reg = Registration(next(self._serials), key, *made)
        with self._lock:
            stale = self._regs.pop(key, None)
            self._regs[key] = (weakref.ref(handle), reg)
        if stale is not None:   # a dead handle's id, taken by a new one before its finalizer ran
            self._deregister(stale[1])
        weakref.finalize(handle, self._forget, key, reg)
        new.append(reg)
        return reg

    def _forget(self, key: int, reg: Registration) -> None:
        with self._lock:
            known = self._regs.get(key)
            if self._closed or known is None or known[1] is not reg:
                return   # deregistered already: by close(), or when a new handle took the key
            del self._regs[key]
        self._deregister(reg)

    def all(self) -> list[Registration]:
        with self._lock:
            return [reg for _, reg in self._regs.values()]

    def __len__(self) -> int:
        with self._lock:
            return len(self._regs)

    def close(self) -> None:
        """Deregister everything; later finalizers do nothing."""
        with self._lock:
            regs = [reg for _, reg in self._regs.values()]
            self._regs.clear()
            self._closed = True
        for reg in regs:
            self._deregister(reg)
