"""How the bytes of a memory handle can be reached -- the one place that tells, for the tcp data plane
(``transport/tcp``) and local copies (``memory/copy.py``) alike:

* **mapped**: the handle gives a byte view (``byte_view``): zero-copy ``recv_into``/``sendmsg``/memcpy;
* **raw**: no view, but batched positional I/O of many pieces per system call (``RawAccess``: the
  daemon's ``preadv``/``pwritev`` on an unsealed worker file);
* **plain**: neither: one ``read_into``/``write_from`` per piece.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

__all__ = ["RawAccess", "MAPPED", "RAW", "PLAIN", "access_kind", "has_raw"]

MAPPED, RAW, PLAIN = 0, 1, 2


@runtime_checkable
class RawAccess(Protocol):
    """A handle without a view that moves many pieces per system call. ``pieces`` rows are
    ``(handle offset, address in this process, length)``; both return the bytes moved."""

    def read_raw(self, pieces: Sequence[tuple[int, int, int]]) -> int: ...

    def write_raw(self, pieces: Sequence[tuple[int, int, int]]) -> int: ...


def has_raw(handle: Any) -> bool:
    """The handle offers batched positional I/O (``RawAccess``)."""
    return isinstance(handle, RawAccess)


def access_kind(handle: Any, view: memoryview | None) -> int:
    """``MAPPED`` when ``view`` (the handle's ``byte_view``) exists, else ``RAW`` or ``PLAIN``."""
    return MAPPED if view is not None else RAW if has_raw(handle) else PLAIN
