"""Finding and ``dlopen``-ing CANN's shared libraries."""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Callable, TypeVar

from .errors import AscendUnavailable

__all__ = ["find_library", "once", "HOME_VAR"]

T = TypeVar("T")

#: CANN's environment variable (set by ``set_env.sh``): the toolkit's root, libraries in ``lib64``
HOME_VAR = "ASCEND_HOME_PATH"

_lock = threading.Lock()
_loaded: dict[tuple[str, ...], ctypes.CDLL] = {}


def once(factory: Callable[[], T]) -> Callable[[], T]:
    """``factory()`` made on the first call, under a lock, and that same object from then on (a failed
    call is retried next time): the process's one runtime object of each library."""
    lock = threading.Lock()
    made: list[T] = []

    def get() -> T:
        with lock:
            if not made:
                made.append(factory())
            return made[0]

    get.__doc__ = factory.__doc__
    return get


def find_library(*names: str) -> ctypes.CDLL:
    """The first of ``names`` that loads: every name from ``$ASCEND_HOME_PATH/lib64`` first, then by the loader's
    own search (so a tree that has only the second name -- the simulation's ``libhccl.so`` -- is never mixed with
    another install's first name found on ``LD_LIBRARY_PATH``). ``AscendUnavailable`` naming every path tried
    when none does. Loaded once per process."""
    with _lock:
        if names in _loaded:
            return _loaded[names]
        home = os.environ.get(HOME_VAR, "")
        tried: list[str] = []
        candidates = [os.path.join(home, "lib64", name) for name in names] if home else []
        candidates += list(names)   # LD_LIBRARY_PATH, ldconfig
        for path in candidates:
            if os.sep in path and not os.path.exists(path):
                tried.append(f"{path} (absent)")
                continue
            try:
                lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as exc:
                tried.append(f"{path} ({exc})")
                continue
            _loaded[names] = lib
            return lib
        raise AscendUnavailable(
            f"Ascend CANN is not installed here: could not load {' or '.join(names)} (tried {'; '.join(tried)}); "
            f"set {HOME_VAR} (source CANN's set_env.sh) or use the host backend and the tcp transport")
