"""Who may have put a socket in a directory: the one rule the daemon (``datadistd.ops.config.secure_socket_dir``)
and the Python client (``llm_datadist._attach``) both apply; the C++ client's ``DirectoryCulprit``
(client/cpp/src/attach.cc) is this rule in C++.

A directory is safe for ``uid``'s sockets when every directory from it up to ``/`` is owned by ``uid`` or root and
writable by nobody else -- except a root-owned sticky directory such as ``/tmp``, where others cannot rename or
remove our entries. That is enough for the daemon, which knows the directory is the one it meant to use.

A client trusting a daemon that runs as another uid asks more (``given=True``): that ``uid`` could not have taken
the name itself. An entry of ``uid`` right inside a directory every user may create names in (``/tmp``) proves
nothing: another user can create ``/tmp/datadist-<victim uid>/`` before the victim's daemon does and listen there.
So there a root-owned sticky directory vouches only for root's own entries: ``uid``'s directory must have been
given to it by root (systemd's ``RuntimeDirectory=``: ``/run/datadist``) or lie inside one such.

Both the path as named and the path it resolves to are walked: a symbolic link is a name too, and one another user
made in ``/tmp`` (``/tmp/datadist-<victim uid>`` -> a directory of that user's own) must not pass because its target
would. A link's own mode means nothing (always 0777); its owner and the directory holding it do.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["culprit"]


def culprit(directory: str, uid: int, given: bool = False) -> str | None:
    """Why ``directory`` is not safe for the sockets of ``uid`` ("<dir> is owned by uid N with mode M", or for
    ``given`` "<dir> of uid N is inside <parent>, where every user may create names"), None when it is.
    OSError when a directory on the way cannot be looked at."""
    named = Path(os.path.abspath(directory))
    real = Path(os.path.realpath(directory))
    why = _walk(named, uid, given) if named != real else None
    return why or _walk(real, uid, given)


def _walk(here: Path, uid: int, given: bool) -> str | None:
    """``culprit`` along ``here`` and its parents as named: each entry judged by who made it (lstat: a link's
    owner) and by the directory it names (stat: a link's target, where the names below it are made)."""
    below: Path | None = None      # the directory just below ``d`` on the way up (None: the socket itself)
    below_uid = uid
    for d in (here, *here.parents):
        entry = d.lstat()
        st = d.stat() if stat.S_ISLNK(entry.st_mode) else entry
        writable_by_others = st.st_mode & 0o022
        sticky_root = st.st_uid == 0 and st.st_mode & 0o1000
        if entry is not st and entry.st_uid not in (uid, 0):
            return f"{d} is a link owned by uid {entry.st_uid}"
        if st.st_uid not in (uid, 0) or (writable_by_others and not sticky_root):
            return f"{d} is owned by uid {st.st_uid} with mode {st.st_mode & 0o7777:#o}"
        if given and writable_by_others and below_uid != 0:
            what = f"{below} of uid {below_uid}" if below is not None else "the socket"
            return f"{what} is inside {d}, where every user may create names"
        below, below_uid = d, entry.st_uid
    return None
