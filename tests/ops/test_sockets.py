"""The daemon's socket files: a second daemon never takes over a live one's sockets, a daemon never removes
a socket it did not create, and the sockets a dead daemon left are still replaced (issue 29, finding 1)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from datadistd.guard.sockfiles import serving_pid
from tests.harness import Daemon

pytestmark = pytest.mark.integration

SUFFIXES = ("", ".attach", ".admin")


def inodes(path: str) -> list[int]:
    return [os.lstat(path + s).st_ino for s in SUFFIXES]


def second_daemon(socket_path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "datadistd", "--socket", socket_path], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "DATADISTD_MEMORY_SHM_DIR": os.path.dirname(
                              socket_path)})


def test_a_second_daemon_on_a_live_socket_exits_1_and_leaves_it_alone() -> None:
    first = Daemon("live").start()
    try:
        before = inodes(first.socket)
        done = second_daemon(first.socket)
        assert done.returncode == 1, done.stderr
        assert f"the socket {first.socket} is served by a running daemon (pid {first.pid})" in done.stderr
        assert "ready" not in done.stderr
        assert inodes(first.socket) == before   # nothing replaced, nothing removed
        assert first.serving()
        assert first.stop() == 0
    finally:
        first.discard()


def test_a_socket_created_by_someone_else_is_not_removed_at_stop() -> None:
    daemon = Daemon("owner").start()
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.unlink(daemon.socket)   # another process took the path over while the daemon ran
        other.bind(daemon.socket)
        other.listen(1)
        theirs = os.lstat(daemon.socket).st_ino
        assert daemon.stop() == 0
        assert os.lstat(daemon.socket).st_ino == theirs
        assert not os.path.exists(daemon.socket + ".admin")   # its own sockets are gone
        assert not os.path.exists(daemon.socket + ".attach")
        assert "not removing" in daemon.log()
    finally:
        other.close()
        daemon.discard()


def test_the_sockets_of_a_killed_daemon_are_replaced() -> None:
    daemon = Daemon("stale").start()
    try:
        daemon.stop(signal.SIGKILL)
        assert all(os.path.exists(daemon.socket + s) for s in SUFFIXES)   # left behind
        assert serving_pid(daemon.socket) is None
        daemon.start()
        assert daemon.serving()
        assert serving_pid(daemon.socket) == daemon.pid
        assert serving_pid(daemon.socket + ".attach") == daemon.pid
        assert "nobody serves it" in daemon.log()
    finally:
        daemon.discard()


def test_a_private_name_left_by_a_daemon_killed_while_starting_is_removed(tmp_path) -> None:
    """gRPC binds ``<socket>.<pid>`` before it is published under the real name (``sockfiles.publish``)."""
    from datadistd.guard.sockfiles import claim

    path = str(tmp_path / "datadistd.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:   # bound, never listening: its process died
        s.bind(path + ".4242")
    (tmp_path / "datadistd.sock.notes").write_text("not ours to remove")
    claim([path, path + ".attach", path + ".admin"])
    assert sorted(os.listdir(tmp_path)) == ["datadistd.sock.notes"]
