"""The peer secret of an embedded daemon that was given none: one per user, readable by that user only.

Embedded mode (the daemon inside the worker, ``llm_datadist._embedded``) is the zero-setup default. With
the public development secret, any local user could link to a worker's engine and read or overwrite
its cache. Instead, an embedded daemon with no ``[peer] secret``/``secret_file`` uses
``<dir>/datadist/peer.secret``, made on first use with 32 random bytes, where ``<dir>`` is
``$XDG_RUNTIME_DIR`` (per user, mode 0700 under systemd) or else ``$XDG_CONFIG_HOME`` / ``~/.config``.
Two embedded workers of one user read the same file and link; another user cannot read it, so its
handshake fails. The directory and the file must be this uid's and closed to group and others
(``O_NOFOLLOW``, checked with ``fstat`` on what was opened): anything else stops the start, naming
the path, rather than trusting a secret someone else could have planted or read.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path
from typing import Mapping

__all__ = ["user_secret_file", "UnsafeSecret"]

FILE_NAME = "peer.secret"


class UnsafeSecret(RuntimeError):
    """The per-user secret's directory or file is not this user's alone."""


def _base(env: Mapping[str, str]) -> Path:
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        return Path(runtime)
    config = env.get("XDG_CONFIG_HOME")
    if config and os.path.isabs(config):
        return Path(config)
    return Path(env.get("HOME") or os.path.expanduser("~")) / ".config"


def _check_private(st: os.stat_result, path: Path, what: str) -> None:
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise UnsafeSecret(f"{what} {path} is owned by uid {st.st_uid} with mode {st.st_mode & 0o7777:#o}; the "
                           f"embedded daemon's peer secret must be readable by uid {os.getuid()} only. Remove it, or "
                           "set DATADISTD_PEER_SECRET_FILE to a file of your own (mode 0600)")


def user_secret_file(env: Mapping[str, str] | None = None) -> str:
    """The path of this user's embedded peer secret, created (mode 0600) if missing; see the module doc."""
    env = os.environ if env is None else env
    directory = _base(env) / "datadist"
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise UnsafeSecret(f"cannot create {directory} for the embedded daemon's peer secret: "
                           f"{os.strerror(exc.errno or 0)}") from None
    _check_private(os.lstat(directory), directory, "directory")
    path = directory / FILE_NAME
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    if not os.path.lexists(path):   # written aside, then linked in: nobody ever reads a half-written secret
        tmp = directory / f".{FILE_NAME}.{secrets.token_hex(8)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, secrets.token_hex(32).encode() + b"\n")
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass                       # another worker of this user won the race: use its secret
        finally:
            os.unlink(tmp)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        why = "a symbolic link" if exc.errno == errno.ELOOP else os.strerror(exc.errno or 0)
        raise UnsafeSecret(f"cannot open the embedded daemon's peer secret {path}: {why}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeSecret(f"{path} is not a regular file")
        _check_private(st, path, "file")
        if st.st_size == 0:
            raise UnsafeSecret(f"{path} is empty; remove it (a new one is made on the next start)")
    finally:
        os.close(fd)
    return str(path)
