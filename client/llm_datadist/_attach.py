"""Private: the worker's attach connection to its daemon (see ``datadist/v1/attach.proto``).

One ``SOCK_SEQPACKET`` connection per ``LLMDataDist``: the daemon learns who we are from the
kernel, answers the capability every DataDist call carries, takes memory we register as file
descriptors and hands us the descriptors of our engine's pools, and (protocol 2) runs our pulls and
pushes without a gRPC call. Closing it (or exiting) ends our lease: the daemon then releases our
engines.

Requests may be in flight from many threads at once: each carries a request id, one reader thread
hands every reply to the caller waiting for that id.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import struct
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Dict, List, Optional, Sequence, Tuple

from datadist.status import LLMStatusCode, code_2_status
from datadist.v1 import attach_pb2

from .status import LLMException

__all__ = ["AttachClient", "attach_path", "unix_path", "CAPABILITY_METADATA_KEY"]

log = logging.getLogger(__name__)

CAPABILITY_METADATA_KEY = "datadist-capability"
PROTOCOL_VERSION = 2
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


_Reply = Tuple[attach_pb2.AttachReply, int]


class AttachClient:
    def __init__(self, target: str, timeout: float = _TIMEOUT_S) -> None:
        self.path = attach_path(target)
        self.timeout = timeout
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: Dict[int, "Future[_Reply]"] = {}
        self._broken: Optional[str] = None
        self._closing = False
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(self.path)
            self._sock.settimeout(None)         # the reader blocks; every caller waits with its own deadline,
            # and a send the daemon does not take within `timeout` fails (SO_SNDTIMEO) instead of hanging
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                                  struct.pack("ll", int(timeout), int(timeout % 1 * 1e6)))
            self._reader = threading.Thread(target=self._read, name="datadist-attach", daemon=True)
            self._reader.start()
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
        self.protocol = welcome.protocol_version
        self.memory_backend = welcome.memory_backend or "host"
        self.device_id = int(welcome.device_id)
        # the daemon's pid as the kernel reports it for this connection (never what a message says): the one
        # process this worker's exported device memory may be imported by
        self.daemon_pid = struct.unpack("3i", self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                    struct.calcsize("3i")))[0]

    @property
    def metadata(self) -> Tuple[Tuple[str, str], ...]:
        return ((CAPABILITY_METADATA_KEY, self.capability.hex()),)

    def _read(self) -> None:
        """The reader thread: every reply to the caller waiting for its request id."""
        why = "datadistd closed the attach connection"
        try:
            while True:
                data, fds, _, _ = socket.recv_fds(self._sock, _MAX_MESSAGE, 1)
                if not data:
                    break
                reply = attach_pb2.AttachReply()
                reply.ParseFromString(data)
                with self._lock:
                    waiter = self._pending.pop(reply.request_id, None)
                if waiter is None or not waiter.set_running_or_notify_cancel():
                    for fd in fds:       # nobody waits for it any more (it timed out)
                        os.close(fd)
                    continue
                waiter.set_result((reply, fds[0] if fds else -1))
        except OSError as exc:
            why = f"the attach connection to datadistd failed: {exc.strerror or exc}"
        with self._lock:
            self._broken = why
            pending, self._pending = self._pending, {}
            closing = self._closing
        if not closing:   # the daemon ended our lease (it stops: SIGTERM, or it died)
            log.warning("datadistd at %s is stopping: this engine and its caches are released (%s); finalize and "
                        "init again once it is back", self.path, why)
        for waiter in pending.values():
            if waiter.set_running_or_notify_cancel():
                waiter.set_exception(ConnectionError(why))

    def _call(self, request: attach_pb2.AttachRequest, func: str, fds: Sequence[int] = (),
              timeout: Optional[float] = None) -> _Reply:
        """One request, its reply (and the descriptor it carried, or -1); LLMException on failure."""
        waiter: "Future[_Reply]" = Future()
        with self._lock:
            if self._broken is not None:
                raise self._failed(func, self._broken)
            request.request_id = next(self._ids)
            self._pending[request.request_id] = waiter
        try:
            with self._send_lock:
                socket.send_fds(self._sock, [request.SerializeToString()], list(fds))
            reply, fd = waiter.result(self.timeout if timeout is None else timeout)
        except FutureTimeout:
            with self._lock:
                self._pending.pop(request.request_id, None)
            raise LLMException(f"[{func}] failed, error code is {LLMStatusCode.LLM_TIMEOUT}, datadistd did not answer "
                               "in time.", status_code=LLMStatusCode.LLM_TIMEOUT) from None
        except (OSError, ConnectionError) as exc:
            with self._lock:
                self._pending.pop(request.request_id, None)
            raise self._failed(func, str(exc)) from None
        if reply.status:
            if fd >= 0:
                os.close(fd)
            code = code_2_status(reply.status)
            raise LLMException(f"[{func}] failed, error code is {code}, {reply.message}.", status_code=code)
        return reply, fd

    @staticmethod
    def _failed(func: str, why: str) -> LLMException:
        return LLMException(f"[{func}] failed, error code is {LLMStatusCode.LLM_FAILED}, {why}",
                            status_code=LLMStatusCode.LLM_FAILED)

    def transfer(self, push: bool, request: Any, func: str, timeout: float) -> Any:
        """A DataDist Pull or Push over this connection (protocol 2): the ``TransferResponse``."""
        msg = attach_pb2.AttachRequest(push=request) if push else attach_pb2.AttachRequest(pull=request)
        return self._call(msg, func, timeout=timeout)[0].transfer

    def import_memory(self, fds: Sequence[int], pieces: Sequence[Tuple[int, int]], offset: int, length: int,
                      func: str) -> int:
        """Hand ``pieces`` (``(file_offset, length)`` of each descriptor) over; returns the memory id."""
        msg = attach_pb2.ImportMemory(pieces=[attach_pb2.MemoryPiece(file_offset=o, length=n) for o, n in pieces],
                                      offset=offset, length=length)
        return self._call(attach_pb2.AttachRequest(import_memory=msg), func, fds)[0].imported.memory_id

    def import_device_memory(self, key: str, device: int, length: int, func: str) -> int:
        """Hand over ``length`` bytes of NPU memory by the IPC ``key`` exported for the daemon; the memory id."""
        msg = attach_pb2.ImportMemory(device_key=key, device_id=device, length=length)
        return self._call(attach_pb2.AttachRequest(import_memory=msg), func)[0].imported.memory_id

    def release_memory(self, memory_ids: List[int]) -> None:
        """Give back imported memory the daemon did not put into a cache (best effort)."""
        for memory_id in memory_ids:
            try:
                self._call(attach_pb2.AttachRequest(release_memory=attach_pb2.ReleaseMemory(memory_id=memory_id)),
                           "release")
            except LLMException:
                return

    def export_pool(self, engine_id: int, pool: str, func: str) -> Tuple[int, int, str, int]:
        """``(fd, size, device_key, device_id)`` of one of our engine's pools: a descriptor (the caller closes it),
        or for an NPU pool ``fd == -1`` and the IPC key only this process may import."""
        reply, fd = self._call(attach_pb2.AttachRequest(export_pool=attach_pb2.ExportPool(engine_id=engine_id,
                                                                                          pool=pool)), func)
        if reply.pool.device_key:
            if fd >= 0:
                os.close(fd)
            return -1, int(reply.pool.size), reply.pool.device_key, int(reply.pool.device_id)
        if fd < 0:
            raise LLMException(f"[{func}] failed, error code is {LLMStatusCode.LLM_FAILED}, datadistd sent no "
                               "descriptor for the pool", status_code=LLMStatusCode.LLM_FAILED)
        return fd, int(reply.pool.size), "", 0

    def close(self) -> None:
        with self._lock:
            self._closing = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)   # wakes the reader, which fails whatever still waits
        except OSError:
            pass
        self._sock.close()
        if self._reader is not threading.current_thread():
            self._reader.join(5.0)
