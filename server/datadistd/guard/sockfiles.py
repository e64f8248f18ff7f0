"""The daemon's unix socket files: taken only from nobody, removed only if still ours.

``claim`` runs at start, before anything is bound: a socket file that a live process still serves
(a ``connect`` succeeds) stops the start with ``SocketInUse`` (exit 1) naming the socket and the
serving pid, which the kernel tells the connecting side (``SO_PEERCRED``); a socket file nobody
listens on (``ECONNREFUSED``: its daemon died) is removed so the new daemon can bind it.
``OwnedSocket`` remembers the inode this daemon bound, and ``remove`` unlinks the path only while
it still names that inode -- never a socket another process created there since. A listener that
binds its path itself (gRPC replaces what is there and unlinks it when it stops) binds a private
``staging_path`` that ``publish`` hard-links to the real path, which fails if anything is there.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SocketInUse", "serving_pid", "claim", "OwnedSocket", "publish", "staging_path"]

log = logging.getLogger(__name__)

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
#: a probe's connect never waits longer than this (a unix connect answers at once unless the backlog is full)
PROBE_TIMEOUT_S = 1.0


class SocketInUse(OSError):
    """Another live process serves the socket path this daemon was told to use."""


def serving_pid(path: str) -> int | None:
    """The pid of the process that listens on the unix socket ``path`` (0 when it cannot be told), or None
    when nobody does (no file, or a socket file whose process is gone). Tries a stream, then a seqpacket
    connection (the attach socket's type)."""
    for kind in (socket.SOCK_STREAM, socket.SOCK_SEQPACKET):
        with socket.socket(socket.AF_UNIX, kind | socket.SOCK_CLOEXEC) as probe:
            probe.settimeout(PROBE_TIMEOUT_S)
            try:
                probe.connect(path)
            except (FileNotFoundError, ConnectionRefusedError):
                return None
            except (BlockingIOError, TimeoutError):
                return 0  # a full backlog: alive, too busy to tell who it is
            except OSError as exc:
                if exc.errno == errno.EPROTOTYPE:
                    continue  # a socket of the other type
                raise
            pid, _, _ = _UCRED.unpack(probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
            return pid
    return None


def claim(paths: list[str]) -> None:
    """Make ``paths`` free to bind: raise ``SocketInUse`` if a live process serves any of them (nothing is
    removed then), else remove the socket files of dead daemons (and symlinks) found there."""
    stale = []
    # the private names of a daemon that died between binding and publishing (``staging_path``) go too
    leftovers = [str(p) for path in paths for p in Path(path).parent.glob(Path(path).name + ".*")
                 if p.name[len(Path(path).name) + 1:].isdigit()]
    for path in [*paths, *leftovers]:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            stale.append(path)
        elif stat.S_ISSOCK(st.st_mode):
            try:
                pid = serving_pid(path)
            except OSError as exc:
                raise SocketInUse(f"the socket {path} exists and cannot be probed ({exc.strerror or exc}); "
                                  "is another datadistd using it? Stop it or choose another --socket") from None
            if pid is not None:
                who = f"pid {pid}" if pid else "a process too busy to answer"
                raise SocketInUse(f"the socket {path} is served by a running daemon ({who}); stop it first "
                                  "or choose another --socket / [daemon] socket")
            stale.append(path)
        # anything else (a regular file, a directory) is left alone: binding there fails and says so
    for path in stale:
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        log.info("removed %s: nobody serves it (a daemon that is gone left it)", path)


@dataclass(frozen=True)
class OwnedSocket:
    """A socket file this daemon bound: ``remove`` unlinks it only while the path still names that file."""

    path: str
    dev: int
    ino: int

    @classmethod
    def bound(cls, path: str) -> OwnedSocket:
        st = os.lstat(path)
        return cls(path, st.st_dev, st.st_ino)

    def remove(self) -> None:
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if (st.st_dev, st.st_ino) != (self.dev, self.ino):
            log.warning("not removing %s: it is no longer the socket this daemon bound", self.path)
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def staging_path(path: str) -> str:
    """A private name beside ``path`` for a listener that binds (and later unlinks) its path itself."""
    return f"{path}.{os.getpid()}"


def publish(staging: str, path: str) -> OwnedSocket:
    """Give the socket bound at ``staging`` its real name ``path`` (a hard link: it fails if anything is
    there, so it never replaces a socket) and drop the private name."""
    try:
        os.link(staging, path)
    except FileExistsError:
        raise SocketInUse(f"the socket {path} was created by another process while this daemon started; "
                          "is another datadistd starting on it?") from None
    finally:
        try:
            os.unlink(staging)
        except FileNotFoundError:
            pass
    return OwnedSocket.bound(path)
