"""Private: the worker's attach connection to its daemon (see ``datadist/v1/attach.proto``).

One ``SOCK_SEQPACKET`` connection per ``LLMDataDist``: the daemon learns who we are from the
kernel, answers the capability every DataDist call carries, takes memory we register as file
descriptors and hands us the descriptors of our engine's pools. Closing it (or exiting) ends our
lease: the daemon then releases our engines.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
from typing import List, Sequence, Tuple

from datadist.status import LLMStatusCode, code_2_status
from datadist.v1 import attach_pb2

from .status import LLMException

__all__ = ["AttachClient", "attach_path", "unix_path", "CAPABILITY_METADATA_KEY"]

CAPABILITY_METADATA_KEY = "datadist-capability"
PROTOCOL_VERSION = 1
_MAX_MESSAGE = 64 << 10
_TIMEOUT_S = 30.0


def unix_path(target: str) -> str:
    """The socket path of a gRPC target ``unix:/path``, ``unix:///path`` or ``unix:path``."""
    if not target.startswith("unix:"):
        raise LLMException(f"[init] failed, error code is {LLMStatusCode.LLM_PARAM_INVALID}, datadistd serves workers "
                           f"on a unix socket only; got {target!r} (use unix:///run/datadist/datadistd.sock).",
                           status_code=LLMStatusCode.LLM_PARAM_INVALID)
    rest = target[len("unix:"):]
    if rest.startswith("//"):
        rest = rest[2:]
    return rest


def attach_path(target: str) -> str:
    return unix_path(target) + ".attach"


class AttachClient:
    def __init__(self, target: str, timeout: float = _TIMEOUT_S) -> None:
        self.path = attach_path(target)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(self.path)
            welcome = self._call(attach_pb2.AttachRequest(hello=attach_pb2.AttachHello(
                protocol_version=PROTOCOL_VERSION)), "init")[0].welcome
        except OSError as exc:
            self._sock.close()
            raise LLMException(f"[init] failed, error code is {LLMStatusCode.LLM_FAILED}, cannot attach to datadistd "
                               f"at {self.path}: {exc.strerror or exc}; is it running, and is this user in its group?",
                               status_code=LLMStatusCode.LLM_FAILED) from None
        except BaseException:
            self._sock.close()
            raise
        self.capability = bytes(welcome.capability)
        self.uid, self.pid = welcome.uid, welcome.pid

    @property
    def metadata(self) -> Tuple[Tuple[str, str], ...]:
        return ((CAPABILITY_METADATA_KEY, self.capability.hex()),)

    def _call(self, request: attach_pb2.AttachRequest, func: str, fds: Sequence[int] = ()
              ) -> Tuple[attach_pb2.AttachReply, int]:
        """One request, one reply (and the descriptor it carried, or -1)."""
        with self._lock:
            request.request_id = next(self._ids)
            socket.send_fds(self._sock, [request.SerializeToString()], list(fds))
            data, got_fds, _, _ = socket.recv_fds(self._sock, _MAX_MESSAGE, 1)
        if not data:
            for fd in got_fds:
                os.close(fd)
            raise LLMException(f"[{func}] failed, error code is {LLMStatusCode.LLM_FAILED}, datadistd closed the "
                               "attach connection", status_code=LLMStatusCode.LLM_FAILED)
        reply = attach_pb2.AttachReply()
        reply.ParseFromString(data)
        if reply.status:
            for fd in got_fds:
                os.close(fd)
            code = code_2_status(reply.status)
            raise LLMException(f"[{func}] failed, error code is {code}, {reply.message}.", status_code=code)
        for fd in got_fds[1:]:
            os.close(fd)
        return reply, (got_fds[0] if got_fds else -1)

    def import_memory(self, fds: Sequence[int], pieces: Sequence[Tuple[int, int]], offset: int, length: int,
                      func: str) -> int:
        """Hand ``pieces`` (``(file_offset, length)`` of each descriptor) over; returns the memory id."""
        msg = attach_pb2.ImportMemory(pieces=[attach_pb2.MemoryPiece(file_offset=o, length=n) for o, n in pieces],
                                      offset=offset, length=length)
        try:
            return self._call(attach_pb2.AttachRequest(import_memory=msg), func, fds)[0].imported.memory_id
        except OSError as exc:
            raise self._broken(func, exc) from None

    def release_memory(self, memory_ids: List[int]) -> None:
        """Give back imported memory the daemon did not put into a cache (best effort)."""
        for memory_id in memory_ids:
            try:
                self._call(attach_pb2.AttachRequest(release_memory=attach_pb2.ReleaseMemory(memory_id=memory_id)),
                           "release")
            except (OSError, LLMException):
                return

    def export_pool(self, engine_id: int, pool: str, func: str) -> Tuple[int, int]:
        """``(fd, size)`` of one of our engine's pools; the caller closes the descriptor."""
        try:
            reply, fd = self._call(attach_pb2.AttachRequest(export_pool=attach_pb2.ExportPool(engine_id=engine_id,
                                                                                              pool=pool)), func)
        except OSError as exc:
            raise self._broken(func, exc) from None
        if fd < 0:
            raise LLMException(f"[{func}] failed, error code is {LLMStatusCode.LLM_FAILED}, datadistd sent no "
                               "descriptor for the pool", status_code=LLMStatusCode.LLM_FAILED)
        return fd, int(reply.pool.size)

    def _broken(self, func: str, exc: OSError) -> LLMException:
        return LLMException(f"[{func}] failed, error code is {LLMStatusCode.LLM_FAILED}, the attach connection to "
                            f"datadistd failed: {exc.strerror or exc}", status_code=LLMStatusCode.LLM_FAILED)

    def close(self) -> None:
        self._sock.close()
