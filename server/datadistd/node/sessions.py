"""Who a worker is: kernel-verified attach sessions and the capabilities that name them.

A worker's first contact with the daemon is the attach socket (``api/attach.py``). The daemon
reads the caller's uid, gid and pid from the kernel (``SO_PEERCRED``) when it accepts, and makes a
``WorkerSession`` with a fresh 256-bit capability. Every DataDist call carries that capability;
an engine belongs to the session whose capability created it, and only that session reaches it.
Nothing a caller says about itself (a pid, a path, an engine id) grants anything.

The session also holds the memory its worker handed over as file descriptors and has not yet
put into a cache, and it ends with the attach connection: the daemon then finalizes the session's
engines and closes what it imported. No grpc here.
"""

from __future__ import annotations

import hmac
import itertools
import logging
import os
import secrets
from dataclasses import dataclass, field

from ..core.errors import DataDistError, StatusCode, require
from ..core.types import EngineId
from ..memory.base import MemoryHandle

__all__ = ["PeerCred", "WorkerSession", "SessionTable", "CAPABILITY_BYTES", "MAX_IMPORTED_PER_SESSION",
           "MAX_SESSIONS_PER_UID", "MAX_SESSIONS"]

log = logging.getLogger(__name__)

CAPABILITY_BYTES = 32
#: imported descriptors a session may hold before it puts them into caches (bounds the daemon's fds)
MAX_IMPORTED_PER_SESSION = 1024
#: attach connections at once, per uid and in total (each holds a descriptor in the daemon)
MAX_SESSIONS_PER_UID = 256
MAX_SESSIONS = 4096
#: finalized engine ids a session remembers, so that a second Finalize of its own engine succeeds
MAX_RETIRED = 4096


@dataclass(frozen=True)
class PeerCred:
    """What the kernel says about the other end of a unix socket (``SO_PEERCRED``)."""

    pid: int
    uid: int
    gid: int


@dataclass(eq=False)
class WorkerSession:
    session_id: int
    capability: bytes
    cred: PeerCred
    pidfd: int | None = None                    # SO_PEERPIDFD where the kernel has it: the process, not a number
    engines: set[EngineId] = field(default_factory=set)
    retired: set[EngineId] = field(default_factory=set)     # finalized engines of this worker (Finalize is idempotent)
    imported: dict[int, MemoryHandle] = field(default_factory=dict)
    closed: bool = False

    @property
    def embedded(self) -> bool:
        """The worker is this very process (embedded mode): its own addresses are ours."""
        return self.cred.pid == os.getpid()

    def owns(self, engine_id: int) -> bool:
        return EngineId(engine_id) in self.engines

    def retire(self, engine_id: EngineId) -> None:
        self.engines.discard(engine_id)
        if len(self.retired) >= MAX_RETIRED:
            self.retired.clear()   # bounded: a Finalize of a long-gone engine then answers LLM_ENGINE_FINALIZED
        self.retired.add(engine_id)

    def add_memory(self, memory_id: int, handle: MemoryHandle) -> None:
        if len(self.imported) >= MAX_IMPORTED_PER_SESSION:
            handle.close()
            raise DataDistError(StatusCode.LLM_OUT_OF_MEMORY,
                                f"this worker holds {len(self.imported)} imported memories not yet in a cache; "
                                "register or release them first")
        self.imported[memory_id] = handle

    def take_memory(self, memory_id: int) -> MemoryHandle:
        """The imported memory ``memory_id``; the caller owns it from now on (closes it or puts it in a cache)."""
        handle = self.imported.pop(memory_id, None)
        require(handle is not None, f"memory {memory_id} was not handed over by this worker (or is already used)")
        assert handle is not None
        return handle

    def release_memory(self, memory_id: int) -> None:
        handle = self.imported.pop(memory_id, None)
        if handle is not None:
            handle.close()

    def close(self) -> None:
        self.closed = True
        imported, self.imported = self.imported, {}
        for handle in imported.values():
            handle.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


class SessionTable:
    """Live sessions by capability, with per-uid and total limits."""

    def __init__(self, max_per_uid: int = MAX_SESSIONS_PER_UID, max_total: int = MAX_SESSIONS) -> None:
        self._by_cap: dict[bytes, WorkerSession] = {}
        self._ids = itertools.count(1)
        self.memory_ids = itertools.count(1)
        self.max_per_uid = max_per_uid
        self.max_total = max_total

    def __len__(self) -> int:
        return len(self._by_cap)

    def open(self, cred: PeerCred, pidfd: int | None = None) -> WorkerSession:
        if len(self._by_cap) >= self.max_total:
            raise DataDistError(StatusCode.LLM_OUT_OF_MEMORY, f"{len(self._by_cap)} workers are attached; the "
                                                              f"daemon takes at most {self.max_total}")
        same_uid = sum(1 for s in self._by_cap.values() if s.cred.uid == cred.uid)
        if same_uid >= self.max_per_uid:
            raise DataDistError(StatusCode.LLM_OUT_OF_MEMORY, f"uid {cred.uid} has {same_uid} attached workers; "
                                                              f"at most {self.max_per_uid} per user")
        session = WorkerSession(next(self._ids), secrets.token_bytes(CAPABILITY_BYTES), cred, pidfd)
        self._by_cap[session.capability] = session
        return session

    def find(self, capability: bytes) -> WorkerSession | None:
        if len(capability) != CAPABILITY_BYTES:
            return None
        session = self._by_cap.get(capability)
        # the dict lookup hashes the whole key; compare once more in constant time before trusting it
        if session is None or not hmac.compare_digest(session.capability, capability):
            return None
        return session

    def close(self, session: WorkerSession) -> None:
        self._by_cap.pop(session.capability, None)
        session.close()

    def sessions(self) -> list[WorkerSession]:
        return list(self._by_cap.values())
