"""How the bytes of a memory handle can be reached -- the one place that tells, for the tcp data plane
(``transport/tcp``) and local copies (``memory/copy.py``) alike:

* **mapped**: the handle gives a byte view (``byte_view``): zero-copy ``recv_into``/``sendmsg``/memcpy;
* **raw**: no view, but batched positional I/O of many moves per system call (``RawAccess``: the
  daemon's ``preadv``/``pwritev`` on an unsealed worker file);
* **plain**: neither: one ``read_into``/``write_from`` per move.

Device memory (``acl``) is *plain* towards the host; between two handles of one device it is ``DeviceCopy``:
``memory/copy.py`` makes those moves device to device in one batch, never through the host.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

__all__ = ["RawAccess", "DeviceCopy", "MAPPED", "RAW", "PLAIN", "access_kind", "has_raw", "same_device"]

MAPPED, RAW, PLAIN = 0, 1, 2


@runtime_checkable
class RawAccess(Protocol):
    """A handle without a view that makes many moves per system call. ``moves`` are
    ``(handle offset, address in this process, length)``; both return the bytes moved."""

    def read_raw(self, moves: Sequence[tuple[int, int, int]]) -> int: ...

    def write_raw(self, moves: Sequence[tuple[int, int, int]]) -> int: ...


@runtime_checkable
class DeviceCopy(Protocol):
    """A handle in device memory at ``address`` (this process) on ``device`` that copies device to device:
    ``copy_moves`` makes moves ``(destination address, source address, length)`` -- absolute addresses of memory
    on its device -- in one batch."""

    @property
    def device(self) -> int: ...

    @property
    def address(self) -> int: ...

    def copy_moves(self, moves: Sequence[tuple[int, int, int]]) -> None: ...


def same_device(handles: Sequence[Any]) -> bool:
    """Every handle is ``DeviceCopy`` memory of one device."""
    return bool(handles) and all(isinstance(h, DeviceCopy) for h in handles) and \
        len({h.device for h in handles}) == 1


#: handle class -> offers ``RawAccess``: decided once per class (every handle class defines its methods on the
#: class), not by a runtime-Protocol ``isinstance`` per call (that walks the Protocol's members every time)
_RAW_BY_TYPE: dict[type, bool] = {}


def has_raw(handle: Any) -> bool:
    """The handle offers batched positional I/O (``RawAccess``)."""
    cls = type(handle)
    raw = _RAW_BY_TYPE.get(cls)
    if raw is None:
        raw = _RAW_BY_TYPE[cls] = isinstance(handle, RawAccess)
    return raw


def access_kind(handle: Any, view: memoryview | None) -> int:
    """``MAPPED`` when ``view`` (the handle's ``byte_view``) exists, else ``RAW`` or ``PLAIN``."""
    return MAPPED if view is not None else RAW if has_raw(handle) else PLAIN
