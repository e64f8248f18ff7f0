"""Python function calls counted in a daemon from outside it (scenario 12): what a ``sitecustomize`` imports.

``sitecustomize_dir()`` writes a directory holding a ``sitecustomize.py`` that imports this module and calls
``install()``; a daemon started with that directory (and the repository) first on ``PYTHONPATH`` counts the profile
hook's ``"call"`` events (a Python function entered, a generator or coroutine resumed; C functions are not counted)
of every thread while a window is open. ``SIGUSR1`` opens a window (the count starts at 0; ``on-<pid>`` appears in
``DATADIST_BENCH_CALLS_DIR`` once it is open), ``SIGUSR2`` closes it and writes the count to ``calls-<pid>`` there.
With ``DATADIST_BENCH_CALLS_TOP`` set to a path prefix, the window also tallies which functions were called and
``SIGUSR2`` writes them, most called first, to ``<prefix>-<pid>-<window>.txt`` (windows counted from 1; where a
count goes: ``DATADIST_BENCH_CALLS_TOP=/tmp/top make bench BENCH_ARGS="--scenarios 12"``). The hook runs for
every event of the daemon's life, window open or not: such a daemon is slower and is used for counting only, never
timed. Nothing of the daemon's package is touched.
"""

from __future__ import annotations

import collections
import itertools
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

__all__ = ["install", "sitecustomize_dir", "DIR_ENV"]

DIR_ENV = "DATADIST_BENCH_CALLS_DIR"
TOP_ENV = "DATADIST_BENCH_CALLS_TOP"
ROOT = Path(__file__).resolve().parents[1]

_open = False
_count = itertools.count()
_top: collections.Counter[tuple[str, str, int]] | None = None   # (file, function, line) -> calls, with TOP_ENV
_windows = itertools.count(1)


def _hook(frame: Any, event: str, arg: Any) -> None:
    if _open and event == "call":
        next(_count)
        if _top is not None:
            code = frame.f_code
            _top[(code.co_filename, code.co_name, code.co_firstlineno)] += 1


def _write(name: str, text: str) -> None:
    where = Path(os.environ[DIR_ENV])
    tmp = where / f".{name}.tmp"
    tmp.write_text(text)
    tmp.rename(where / name)   # whole, or not there yet


def _start(signum: int, frame: Any) -> None:
    global _open, _count, _top
    _count = itertools.count()
    _top = collections.Counter() if os.environ.get(TOP_ENV) else None
    _open = True
    _write(f"on-{os.getpid()}", "")


def _stop(signum: int, frame: Any) -> None:
    global _open
    _open = False
    _write(f"calls-{os.getpid()}", str(next(_count)))
    if _top is not None:
        lines = [f"{n:8d}  {name}  {file}:{line}" for (file, name, line), n in _top.most_common()]
        Path(f"{os.environ[TOP_ENV]}-{os.getpid()}-{next(_windows)}.txt").write_text("\n".join(lines) + "\n")


def install() -> None:
    """The hook on this thread and every thread started later; the window's signals. Without ``DIR_ENV`` nothing."""
    if not os.environ.get(DIR_ENV):
        return
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
    threading.setprofile(_hook)
    sys.setprofile(_hook)


def sitecustomize_dir() -> str:
    """A fresh directory with the ``sitecustomize.py`` that installs the hook (the counts are written there too)."""
    where = tempfile.mkdtemp(prefix="datadist-bench-calls-")
    Path(where, "sitecustomize.py").write_text("import bench.callcount\n\nbench.callcount.install()\n")
    return where


def env_for(where: str) -> dict[str, str]:
    """The environment of a daemon that counts: ``where`` and the repository first on its path."""
    path = os.pathsep.join(p for p in (where, str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, DIR_ENV: where}
