"""Private: ``TransferAsync``'s requests, as HIXL keeps them (hicann/hixl src/hixl/engine/hixl_engine.cc
GetTransferStatus, client_manager.cc).

Each request is one unary ``TransferExtents`` call in flight (a ``grpc.Future``; no thread of its own), so one thread
keeps as many in flight as it starts. Its status moves from WAITING to COMPLETED, TIMEOUT or FAILED exactly once, in
the future's done callback. A request is reported until a query sees it finished: ``status`` and ``collect`` forget
a finished request once they report it (HIXL erases it), so a second query of it is ``PARAM_INVALID`` ("request not
found"). ``collect`` reports in submission order. A disconnect forgets the requests to that engine (HIXL erases them
with the client), and their calls are cancelled.

Threads: any caller thread and gRPC's callback thread; every field is guarded by the one lock.
"""

from __future__ import annotations

import itertools
import threading
from typing import Dict, List, Optional, Tuple

import grpc

from datadist.hixl import PARAM_INVALID, SUCCESS, TIMEOUT, hixl_status
from llm_datadist._rpc import status_of

__all__ = ["Requests", "WAITING", "COMPLETED", "TIMED_OUT", "FAILED_"]

# hixl_types.h TransferStatus
WAITING, COMPLETED, TIMED_OUT, FAILED_ = range(4)


class _Request:
    __slots__ = ("remote", "user_data", "status", "future")

    def __init__(self, remote: str, user_data: int, future: Optional[grpc.Future]) -> None:
        self.remote = remote
        self.user_data = user_data
        self.status = WAITING
        self.future = future


def _outcome(future: grpc.Future) -> int:
    """COMPLETED, TIMED_OUT (the daemon's timeout or the call's deadline) or FAILED_ of a finished call."""
    if future.cancelled():
        return FAILED_
    err = future.exception()
    if err is None:
        return COMPLETED
    if isinstance(err, grpc.RpcError):
        return TIMED_OUT if hixl_status(status_of(err)[0]) == TIMEOUT else FAILED_
    return FAILED_


class Requests:
    """The requests of one engine, by id (an opaque non-zero int, as HIXL's ``TransferReq`` pointer)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._requests: Dict[int, _Request] = {}   # in submission order

    def start(self, remote: str, user_data: int, future: grpc.Future) -> int:
        """Track the call ``future`` to ``remote``; its id."""
        request = _Request(remote, user_data, future)
        with self._lock:
            req = next(self._ids)
            self._requests[req] = request
        future.add_done_callback(lambda done: self._finish(request, _outcome(done)))
        return req

    def _finish(self, request: _Request, status: int) -> None:
        with self._lock:
            if request.status == WAITING:
                request.status = status
                request.future = None

    def status(self, req: int) -> Tuple[int, int]:
        """(SUCCESS, status) of request ``req``, forgotten when finished; (PARAM_INVALID, FAILED_) when unknown."""
        with self._lock:
            request = self._requests.get(req)
            if request is None:
                return PARAM_INVALID, FAILED_
            if request.status != WAITING:
                del self._requests[req]
            return SUCCESS, request.status

    def collect(self, max_count: int, skip_waiting: bool) -> List[Tuple[int, int, int]]:
        """(req, user_data, status) of up to ``max_count`` requests in submission order, the finished ones forgotten;
        with ``skip_waiting`` the waiting ones are neither reported nor counted."""
        out: List[Tuple[int, int, int]] = []
        if max_count == 0:
            return out
        with self._lock:
            for req, request in list(self._requests.items()):
                status = request.status
                if status != WAITING:
                    del self._requests[req]
                elif skip_waiting:
                    continue
                out.append((req, request.user_data, status))
                if len(out) >= max_count:
                    break
        return out

    def forget(self, remote: Optional[str] = None) -> None:
        """Forget the requests to ``remote`` (all when None), cancelling their calls."""
        with self._lock:
            gone = [req for req, r in self._requests.items() if remote is None or r.remote == remote]
            futures = [self._requests.pop(req).future for req in gone]
        for future in futures:
            if future is not None:
                future.cancel()
