"""Throwaway local users for the tests that run the daemon and its workers as real, different uids.

Needs root (to make the users and drop to them) and ``setpriv``; ``why_not()`` says why a test must skip otherwise.
The users are made on first use and removed by the last user of them: test modules run in several pytest-xdist
processes at once, so each ``hold()`` counts itself in a file under an exclusive lock, and only the last release
deletes them (a module's teardown used to delete users another module was still running as).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from typing import Iterator

from tests.harness import ROOT

#: the group the daemon's user and its workers share (as ``datadist`` in ``deploy/datadist.sysusers.conf``)
GROUP = "ddtest"
#: each throwaway user and its primary group (None: a group of its own): ``ddtest-eve`` is outside the daemon's
#: group, a stranger to its sockets; the squatter and its victim share nothing with anyone (test_client_trust.py)
USERS = {"ddtest-daemon": GROUP, "ddtest-alice": GROUP, "ddtest-bob": GROUP, "ddtest-eve": "nogroup",
         "ddtest-squat": None, "ddtest-squatvic": None}
PYTHON = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
SITE = next(p for p in sys.path if p.endswith("site-packages"))
PYTHONPATH = os.pathsep.join(str(ROOT / d) for d in ("client", "server", "proto")) + os.pathsep + SITE
_COUNT = "/run/datadist-test-users.json"   # root's alone: /run is not world-writable


def why_not() -> str | None:
    """Why throwaway users cannot be had here, or None."""
    if os.geteuid() != 0:
        return "needs root to create throwaway users and run processes as them"
    for tool in ("setpriv", "useradd", "groupadd", "userdel", "groupdel"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if not os.access(PYTHON, os.X_OK):
        return f"needs {PYTHON} (an interpreter other users can run; the venv's may live under /root)"
    return None


def ids(name: str) -> tuple[int, int]:
    pw = pwd.getpwnam(name)
    return pw.pw_uid, pw.pw_gid


def as_user(name: str, args: list[str], **kw):  # noqa: ANN003, ANN201
    """``python args`` as ``name`` (its own uid, gid and groups, no capability), with the project importable."""
    uid, gid = ids(name)
    cmd = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--init-groups", "--inh-caps=-all",
           "--bounding-set=-all", "--no-new-privs", PYTHON, *args]
    # no home (as a system user's): a daemon or embedded worker needs its secret's place given (XDG_RUNTIME_DIR)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": PYTHONPATH, "HOME": "/nonexistent", **kw.pop("env", {})}
    return subprocess.Popen(cmd, env=env, **kw)


def end(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """End a process started by ``as_user``: SIGTERM, and SIGKILL if it has not exited within ``timeout``."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def runtime_dir(prefix: str) -> tuple[str, str]:
    """A socket directory of the daemon's user that root made for it, as systemd's ``RuntimeDirectory=`` does:
    ``(the root-owned directory to remove afterwards, the daemon's directory inside it)``. Workers trust a daemon of
    another uid only in such a directory (``datadist.sockdir``: not one that uid could have made in ``/tmp``)."""
    base = tempfile.mkdtemp(prefix=prefix)
    os.chmod(base, 0o755)
    d = os.path.join(base, "run")
    os.mkdir(d, 0o750)
    os.chown(d, *ids("ddtest-daemon"))
    return base, d


@contextlib.contextmanager
def _counted() -> Iterator[dict]:
    with open(_COUNT + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(_COUNT) as f:
                state = json.load(f)
        except (OSError, ValueError):
            state = {"holders": 0}
        yield state
        with open(_COUNT, "w") as f:
            json.dump(state, f)


@contextlib.contextmanager
def hold() -> Iterator[None]:
    """The throwaway users exist while this is held, in this process or any other."""
    with _counted() as state:   # made whatever the count says: a killed run may have left it stale
        subprocess.run(["groupadd", "-f", GROUP], check=True)
        for name, group in USERS.items():
            if subprocess.run(["id", name], capture_output=True).returncode != 0:
                grouping = ["-U"] if group is None else ["-N", "-g", group]
                subprocess.run(["useradd", "--system", "-M", *grouping, "-s", "/usr/sbin/nologin", name], check=True)
        state["holders"] += 1
    try:
        yield
    finally:
        with _counted() as state:
            state["holders"] = max(0, state["holders"] - 1)
            if state["holders"] == 0:
                for name, group in USERS.items():
                    subprocess.run(["userdel", name], capture_output=True)
                    if group is None:
                        subprocess.run(["groupdel", name], capture_output=True)
                subprocess.run(["groupdel", GROUP], capture_output=True)
