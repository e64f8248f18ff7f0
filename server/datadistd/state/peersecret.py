"""The peer secret a daemon proves in the handshake: where it comes from, the one rule for reading it from a file,
and how to say which one a daemon uses without saying it.

Where it comes from, the first that applies (embedded and standalone daemons alike):

1. ``[peer] secret_file`` (``DATADISTD_PEER_SECRET_FILE``): the file's first line;
2. ``[peer] secret`` (``DATADISTD_PEER_SECRET``); set to ``DEV_SECRET`` it is the public development secret;
3. nothing configured: **this user's own**, ``<dir>/datadist/peer.secret``, made on first use with 256 random bits,
   where ``<dir>`` is ``$XDG_RUNTIME_DIR``, else ``$XDG_CONFIG_HOME``, else ``~/.config``. Every daemon of one user on
   one host -- one behind a worker, one inside it -- reads the same file, so their workers link without any
   configuration; another user cannot read it, so its handshakes fail. When the user has no place to make it (a
   system service without a home, ``ProtectHome=``), a standalone daemon falls back to the development secret, as
   before: public, so it listens on loopback only; a daemon of one worker process (embedded, or the C++ library's
   private one: ``[peer] dev_secret_fallback = false``) refuses to start instead.

A secret only its user knows is a real secret: a daemon may listen off loopback with it (only holders link). The
development secret never is (``Node.check_listen_host``).

One rule for every secret file, configured or per-user: a regular file, owned by the daemon's uid (or, configured,
by root), that neither group nor others may read or write, not empty. Anything else stops the start (exit 2)
naming the path and the ``chmod``/``chown`` that fixes it -- a secret others could read is no secret, one they
could write is theirs. The per-user file and its directory are, besides, opened without following symbolic links.

Which secret a side uses is said by its source (kind and path) and a fingerprint: 32 bits of a slow, salted hash
(PBKDF2, 100,000 rounds), enough to tell two secrets apart, too little and too slow to test guesses of a weak one.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from .config import DEV_SECRET, ConfigError, PeerSection

__all__ = ["PeerSecret", "peer_secret", "read_secret_file", "user_secret_file", "UnsafeSecret", "NoUserSecret",
           "SAME_SECRET_FIX"]

FILE_NAME = "peer.secret"

#: what to do when two daemons that should link hold different secrets
SAME_SECRET_FIX = ("give both sides the same secret: the same file (first line, mode 0600) as [peer] secret_file or "
                   "DATADISTD_PEER_SECRET_FILE on each (an embedded worker reads DATADISTD_PEER_SECRET_FILE from its "
                   "environment); workers of one user on one host share their per-user secret when neither side "
                   "configures one (docs/security.md, \"Peer secret\")")


class UnsafeSecret(ConfigError):
    """A secret file is not the daemon user's alone, or cannot be read: the start stops (exit 2)."""


class NoUserSecret(UnsafeSecret):
    """This user has no place for a per-user secret (no writable home or runtime directory)."""


@dataclass(frozen=True)
class PeerSecret:
    """The secret a daemon proves to its peers, and where it came from (``source``: kind and path, for messages)."""

    value: bytes = field(repr=False)
    source: str
    real: bool          # known only to its holders (not the public development secret)

    @property
    def fingerprint(self) -> str:
        return _fingerprint(self.value)

    def describe(self) -> str:
        """Which secret this is, without it: ``"the per-user secret /run/user/1000/datadist/peer.secret
        (fingerprint 1a2b3c4d)"``."""
        return f"{self.source} (fingerprint {self.fingerprint})"


@functools.lru_cache(maxsize=8)
def _fingerprint(value: bytes) -> str:
    return hashlib.pbkdf2_hmac("sha256", value, b"datadist peer secret fingerprint", 100_000)[:4].hex()


def _refuse_mode(st: os.stat_result, path: str | Path, owners: tuple[int, ...], what: str) -> None:
    uid = os.geteuid()
    if st.st_uid not in owners:
        raise UnsafeSecret(f"{what} {path} is owned by uid {st.st_uid}; a peer secret must be the daemon user's "
                           f"(uid {uid}) alone, or another user could have planted it: chown {uid} {path}")
    if st.st_mode & 0o077:
        fix = "chmod 700" if stat.S_ISDIR(st.st_mode) else "chmod 600"
        raise UnsafeSecret(f"{what} {path} has mode {st.st_mode & 0o7777:#o}: its group or others may read or change "
                           f"the peer secret; {fix} {path}")


def read_secret_file(path: str | Path, *, owners: tuple[int, ...] | None = None, follow: bool = True,
                     what: str = "peer secret file") -> bytes:
    """The first line of the secret file ``path`` under the one rule (module doc); UnsafeSecret naming the fix.
    ``owners``: the uids it may belong to (default: the daemon's and root); ``follow``: symbolic links allowed (a
    configured path, e.g. a mounted secret's link); never for the per-user file."""
    owners = owners if owners is not None else (os.geteuid(), 0)
    flags = os.O_RDONLY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        why = "a symbolic link" if exc.errno == errno.ELOOP and not follow else os.strerror(exc.errno or 0)
        raise UnsafeSecret(f"cannot open the {what} {path}: {why}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeSecret(f"the {what} {path} is not a regular file")
        _refuse_mode(st, path, owners, f"the {what}")
        with os.fdopen(os.dup(fd), "rb") as f:
            first = f.read(1 << 16).splitlines()
    finally:
        os.close(fd)
    value = first[0].strip() if first else b""
    if not value:
        raise UnsafeSecret(f"the {what} {path} is empty: write the secret on its first line")
    return value


def _base(env: Mapping[str, str]) -> Path:
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        return Path(runtime)
    config = env.get("XDG_CONFIG_HOME")
    if config and os.path.isabs(config):
        return Path(config)
    return Path(env.get("HOME") or os.path.expanduser("~")) / ".config"


def user_secret_file(env: Mapping[str, str] | None = None) -> str:
    """The path of this user's peer secret, made (mode 0600, in a 0700 directory) if missing and checked; see the
    module doc. NoUserSecret when there is no place to make it."""
    path = _made_user_secret(os.environ if env is None else env)
    _read_user_secret(path)
    return str(path)


def _read_user_secret(path: Path) -> bytes:
    return read_secret_file(path, owners=(os.getuid(),), follow=False, what="per-user peer secret")


def _made_user_secret(env: Mapping[str, str]) -> Path:
    base = _base(env)
    directory = base / "datadist"
    try:   # only the last two components are ours to make: never a missing home (a root daemon's stale $HOME)
        if not os.path.isdir(base.parent):
            raise NoUserSecret(f"cannot create {directory} for this user's peer secret: {base.parent} does not "
                               f"exist (a missing home is not made)")
        for made, mode in ((base, 0o777), (directory, 0o700)):
            with contextlib.suppress(FileExistsError):
                os.mkdir(made, mode)
    except OSError as exc:
        raise NoUserSecret(f"cannot create {directory} for this user's peer secret: "
                           f"{os.strerror(exc.errno or 0)}") from None
    _refuse_mode(os.lstat(directory), directory, (os.getuid(),), "directory")
    path = directory / FILE_NAME
    if not os.path.lexists(path):   # written aside, then linked in: nobody ever reads a half-written secret
        tmp = directory / f".{FILE_NAME}.{secrets.token_hex(8)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise NoUserSecret(f"cannot make this user's peer secret in {directory}: "
                               f"{os.strerror(exc.errno or 0)}") from None
        try:
            os.write(fd, secrets.token_hex(32).encode() + b"\n")
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass                       # another daemon of this user won the race: use its secret
        finally:
            os.unlink(tmp)
    return path


def peer_secret(peer: PeerSection, *, env: Mapping[str, str] | None = None) -> PeerSecret:
    """The secret a daemon configured with ``peer`` proves (module doc: where it comes from); UnsafeSecret (a
    ConfigError: exit 2) when a file breaks the rule, or, without ``peer.dev_secret_fallback``, when there is no
    per-user secret."""
    if peer.secret_file:
        value = read_secret_file(peer.secret_file)
        return PeerSecret(value, f"the secret file {peer.secret_file}", value != DEV_SECRET.encode())
    if peer.secret == DEV_SECRET:
        return PeerSecret(DEV_SECRET.encode(), "the public development secret (set as [peer] secret)", False)
    if peer.secret:
        return PeerSecret(peer.secret.encode(), "the [peer] secret (DATADISTD_PEER_SECRET or the config file)", True)
    try:
        path = _made_user_secret(os.environ if env is None else env)
    except NoUserSecret as exc:
        if not peer.dev_secret_fallback:   # a worker's own daemon: never the public secret, any local user could link
            raise UnsafeSecret(f"{exc}; set DATADISTD_PEER_SECRET_FILE to a file of your own (mode 0600)") from None
        return PeerSecret(DEV_SECRET.encode(), f"the public development secret (no [peer] secret is set and {exc})",
                          False)
    return PeerSecret(_read_user_secret(path), f"the per-user secret {path}", True)
