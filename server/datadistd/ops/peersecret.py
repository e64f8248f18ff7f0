"""The peer secret a daemon proves in the handshake: where it comes from, the one rule for reading it from a file,
and how to say which one a daemon uses without saying it.

Where it comes from, the first that applies (embedded and standalone daemons alike):

1. ``[peer] secret_file`` (``DATADISTD_PEER_SECRET_FILE``): the file's first line;
2. ``[peer] secret`` (``DATADISTD_PEER_SECRET``); set to ``DEV_SECRET`` it is the public development secret;
3. nothing configured, under systemd with a state directory (``StateDirectory=datadist``, which sets
   ``$STATE_DIRECTORY``): **the node secret**, ``$STATE_DIRECTORY/peer.secret``, made on first use with 256 random
   bits. Only the daemon's user (and root) can read it, so no local user can prove it; a second node links once it
   is given the same secret (``secret_file``, docs/operations.md "Two hosts"). A worker's embedded daemon and the
   C++ library's private one are not given it: a worker's ``$STATE_DIRECTORY`` is its own service's;
4. nothing configured otherwise: **this user's own**, ``<dir>/datadist/peer.secret``, made on first use, where
   ``<dir>`` is ``$XDG_RUNTIME_DIR``, else ``$XDG_CONFIG_HOME``, else ``~/.config`` (never made when the home itself
   is missing). Every daemon of one user on one host -- one behind a worker, one inside it -- reads the same file, so
   their workers link without any configuration; another user cannot read it, so its handshakes fail;
5. no place for either: with ``[peer] dev_secret_fallback = true`` the public development secret, else the start
   stops (exit 2) naming the fix. ``deploy/`` ships ``false``, and so do a worker's embedded daemon and the C++
   library's private one.

The public development secret -- configured or fallen back to -- serves **one user only**: any local user can prove
it, so a daemon whose sockets are open to its group (``[daemon] socket_mode`` with group bits, a daemon serving other
users) refuses to start with it (``refuse_public_when_shared``), and a daemon on it listens on loopback only
(``Node.check_listen_host``). A secret only its holders know is a real secret: a daemon may listen off loopback with it.

One rule for every secret file, configured, per-node or per-user: a regular file, owned by the daemon's uid (or,
configured, by root), that neither group nor others may read or write, not empty. Anything else stops the start
(exit 2) naming the path and the ``chmod``/``chown`` that fixes it -- a secret others could read is no secret, one
they could write is theirs. A file this module makes, and its directory, are besides opened without following
symbolic links.

Which secret a side uses is said by its source (kind and path) and a fingerprint: 32 bits of a slow, salted hash
(PBKDF2, 100,000 rounds), enough to tell two secrets apart, too little and too slow to test guesses of a weak one.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import logging
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from .config import DEV_SECRET, SECRET_FIX, ConfigError, PeerSection, is_loopback

__all__ = ["PeerSecret", "peer_secret", "read_secret_file", "user_secret_file", "UnsafeSecret", "NoUserSecret",
           "SAME_SECRET_FIX", "PUBLIC_FIX", "refuse_public_when_shared",
           "check_public"]

log = logging.getLogger(__name__)

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


def _user_place(env: Mapping[str, str]) -> tuple[Path, str]:
    """Where this user's secret lives: an existing directory and the path below it that may be made."""
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        return Path(runtime), "datadist"
    config = env.get("XDG_CONFIG_HOME")
    if config and os.path.isabs(config):
        return Path(config), "datadist"
    return Path(env.get("HOME") or os.path.expanduser("~")), os.path.join(".config", "datadist")


def user_secret_file(env: Mapping[str, str] | None = None) -> str:
    """The path of this user's peer secret, made (mode 0600, in a 0700 directory) if missing and checked; see the
    module doc. NoUserSecret when there is no place to make it."""
    path = _made_user_secret(os.environ if env is None else env)
    _read_made(path)
    return str(path)


def _read_made(path: Path) -> bytes:
    """A secret file this module makes: the daemon user's alone, never through a symbolic link."""
    return read_secret_file(path, owners=(os.getuid(),), follow=False, what="peer secret")


def _made_user_secret(env: Mapping[str, str]) -> Path:
    anchor, below = _user_place(env)
    if not anchor.is_dir():   # never made: a missing $HOME (or runtime dir) is not this daemon's to create
        raise NoUserSecret(f"{anchor} does not exist")
    directory = anchor / below
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise NoUserSecret(f"cannot create {directory} for this user's peer secret: "
                           f"{os.strerror(exc.errno or 0)}") from None
    return _made_secret(directory)


def _made_secret(directory: Path) -> Path:
    """``directory/peer.secret``, made with 256 random bits if missing; ``directory`` must be this uid's alone."""
    _refuse_mode(os.lstat(directory), directory, (os.getuid(),), "directory")
    path = directory / FILE_NAME
    if not os.path.lexists(path):   # written aside, then linked in: nobody ever reads a half-written secret
        tmp = directory / f".{FILE_NAME}.{secrets.token_hex(8)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise NoUserSecret(f"cannot make a peer secret in {directory}: {os.strerror(exc.errno or 0)}") from None
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


def _node_secret(state: str) -> PeerSecret:
    """The node secret in systemd's state directory (``$STATE_DIRECTORY``, the first of its paths)."""
    directory = Path(state.split(":")[0])
    if not directory.is_absolute() or not directory.is_dir():
        raise UnsafeSecret(f"STATE_DIRECTORY={state!r} is not an existing directory: the unit's StateDirectory= "
                           f"makes it (deploy/datadistd.service)")
    path = _made_secret(directory)
    return PeerSecret(_read_made(path), f"the node secret {path}", True)


#: what to do when a daemon serving other users would run on the public secret
PUBLIC_FIX = ("set [peer] secret_file (DATADISTD_PEER_SECRET_FILE) to a file of the daemon user's (mode 0600), or run "
              "it under systemd with StateDirectory=datadist as deploy/datadistd.service does (the node secret is "
              "made there); the public development secret ([peer] dev_secret_fallback = true) serves only a one-user "
              "daemon on loopback ([daemon] socket_mode = 0o600)")


def peer_secret(peer: PeerSection, *, env: Mapping[str, str] | None = None) -> PeerSecret:
    """The secret a daemon configured with ``peer`` proves (module doc: where it comes from); UnsafeSecret (a
    ConfigError: exit 2) when a file breaks the rule or when there is no secret to use."""
    return _configured_or_made(peer, os.environ if env is None else env)


def refuse_public_when_shared(secret: PeerSecret, socket_mode: int) -> None:
    """The public secret serves one user only: UnsafeSecret when the daemon's sockets (``socket_mode``) are open to
    its group, i.e. it serves other users, any of whom could prove the secret and link to the others' engines."""
    if not secret.real and socket_mode & 0o070:
        raise UnsafeSecret(f"this daemon's sockets are open to its group (socket_mode {socket_mode:#o}: it serves "
                           f"other users) and its peers would authenticate with {secret.source}, which is public: any "
                           f"local user could link to its engines; {PUBLIC_FIX}")


def check_public(secret: PeerSecret, socket_mode: int, data_host: str) -> None:
    """Where a daemon may run on the public secret: one user's (``refuse_public_when_shared``), on loopback only --
    ConfigError when ``[transport] host`` (``data_host``) is off loopback; the listeners are checked as they open
    (``Node.check_listen_host``). Logs once that the daemon stays on loopback."""
    if secret.real:
        return
    refuse_public_when_shared(secret, socket_mode)
    if not is_loopback(data_host):
        raise ConfigError(f"transport.host = {data_host!r} would serve the data plane to other hosts with "
                          f"{secret.source}, which is public: {SECRET_FIX}")
    log.warning("peers authenticate with %s, so this daemon listens on loopback addresses only; %s", secret.source,
                SECRET_FIX)


def _configured_or_made(peer: PeerSection, env: Mapping[str, str]) -> PeerSecret:
    if peer.secret_file:
        value = read_secret_file(peer.secret_file)
        return PeerSecret(value, f"the secret file {peer.secret_file}", value != DEV_SECRET.encode())
    if peer.secret == DEV_SECRET:
        return PeerSecret(DEV_SECRET.encode(), "the public development secret (set as [peer] secret)", False)
    if peer.secret:
        return PeerSecret(peer.secret.encode(), "the [peer] secret (DATADISTD_PEER_SECRET or the config file)", True)
    if env.get("STATE_DIRECTORY"):
        return _node_secret(env["STATE_DIRECTORY"])
    try:
        path = _made_user_secret(env)
    except NoUserSecret as exc:
        if not peer.dev_secret_fallback:   # never the public secret unless asked for: any local user could link
            raise UnsafeSecret(f"no peer secret is set and this user has none ({exc}); {PUBLIC_FIX}") from None
        return PeerSecret(DEV_SECRET.encode(), f"the public development secret (no [peer] secret is set and {exc})",
                          False)
    return PeerSecret(_read_made(path), f"the per-user secret {path}", True)
