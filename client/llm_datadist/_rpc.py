"""Private: the worker's connection to its daemon, and the one place gRPC errors become LLMException."""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

import grpc

from datadist.status import STATUS_METADATA_KEY, LLMStatusCode, code_2_status
from datadist.v1 import datadist_pb2_grpc

from ._attach import AttachClient, unix_path
from .status import LLMException

log = logging.getLogger(__name__)

#: margin added to a call's own timeout for the daemon round trip
RPC_MARGIN_S = 5.0
DEFAULT_RPC_TIMEOUT_S = 60.0

_OPTIONS = [
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.max_send_message_length", 256 << 20),
    ("grpc.enable_retries", 0),
    # the daemon is local: after it restarts, reconnect within a fraction of a second, not after
    # gRPC's default backoff of up to two minutes
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def _nobody_listens(path: str) -> str:
    """Why nothing can serve the unix socket ``path`` ("" when something accepts connections on it)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except FileNotFoundError:
            return f"there is no socket file {path}"
        except ConnectionRefusedError:
            return f"nothing listens on {path} (a daemon that stopped left it)"
        except PermissionError:
            return f"this user may not connect to {path} (is it in the daemon's group?)"
        except OSError:
            return ""   # busy (a full backlog, a slow answer): worth the wait
    return ""


def status_of(err: grpc.RpcError) -> tuple[LLMStatusCode, str]:
    """The LLMStatusCode a failed call carries; transport failures get LLM_FAILED / LLM_TIMEOUT."""
    details = err.details() or ""
    for key, value in (err.trailing_metadata() or ()):
        if key == STATUS_METADATA_KEY:
            try:
                return code_2_status(int(value)), details
            except ValueError:
                break
    code = err.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return LLMStatusCode.LLM_TIMEOUT, f"the daemon did not answer in time ({details})"
    if code == grpc.StatusCode.UNAVAILABLE:
        return LLMStatusCode.LLM_FAILED, f"datadistd is not reachable ({details}); is it running?"
    return LLMStatusCode.LLM_FAILED, f"{code.name}: {details}"


def rpc_exception(err: grpc.RpcError, func_name: str) -> LLMException:
    code, details = status_of(err)
    return LLMException(f"[{func_name}] failed, error code is {code}, {details}.", status_code=code)


class DaemonClient:
    """Synchronous stub calls on the local daemon's DataDist service.

    ``attach()`` opens the attach connection (``_attach``) first: every call then carries the
    capability it answered, memory crosses to the daemon through it, and it is the engine's lease
    (closing it, or the worker dying, releases the engine)."""

    def __init__(self, target: str, embedded: bool = False) -> None:
        # a plain socket path or a unix: target, as datadistctl takes it (LLM_PARAM_INVALID for anything else)
        self.target = "unix://" + os.path.abspath(unix_path(target))
        self.embedded = embedded        # the daemon runs inside this process
        self._channel = grpc.insecure_channel(self.target, options=_OPTIONS)
        self._stub = datadist_pb2_grpc.DataDistStub(self._channel)
        self.attachment: AttachClient | None = None
        self._metadata: tuple[tuple[str, str], ...] = ()

    def attach(self) -> AttachClient:
        if self.attachment is None:
            self.attachment = AttachClient(self.target)
            self._metadata = self.attachment.metadata
        return self.attachment

    def call(self, method: str, request: Any, func_name: str, timeout: float | None = None) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=timeout or DEFAULT_RPC_TIMEOUT_S,
                                               metadata=self._metadata)
        except grpc.RpcError as err:
            raise rpc_exception(err, func_name) from None

    def stream(self, method: str, requests: Any) -> Any:
        """A bidirectional call: ``requests`` is consumed by gRPC's thread; iterate the result for replies."""
        return getattr(self._stub, method)(requests, metadata=self._metadata)

    def wait_ready(self, timeout: float, source: str = "DATADIST_DAEMON") -> None:
        """Wait up to ``timeout`` for a daemon that exists but is busy; fail at once when nothing listens at
        the address (no socket file, connection refused). ``source`` names where the address came from."""
        path = unix_path(self.target)
        absent = _nobody_listens(path)
        if absent:
            raise LLMException(f"[init] failed, error code is {LLMStatusCode.LLM_FAILED}, no datadistd at "
                               f"{self.target} (from {source}): {absent}; start it (systemctl start datadistd), "
                               f"point {source} at its socket, or unset it to use embedded mode.",
                               status_code=LLMStatusCode.LLM_FAILED)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise LLMException(f"[init] failed, error code is {LLMStatusCode.LLM_FAILED}, datadistd at {self.target} "
                               f"(from {source}) is not ready within {timeout:g}s; is it overloaded? "
                               "(datadistctl status, systemctl status datadistd)",
                               status_code=LLMStatusCode.LLM_FAILED) from None

    def daemon_gone(self) -> bool:
        """Nothing listens at the daemon's address any more (it stopped, or was killed)."""
        return bool(_nobody_listens(unix_path(self.target)))

    def close(self) -> None:
        self._channel.close()
        if self.attachment is not None:
            self.attachment.close()   # ends the lease: the daemon releases whatever this worker left
            self.attachment = None
