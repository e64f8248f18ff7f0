"""Private: ``TransferAsync``'s requests, as HIXL keeps them (hicann/hixl src/hixl/engine/hixl_engine.cc
GetTransferStatus, client_manager.cc).

Each request is one extents frame in flight on the worker's attach connection (``AttachClient.submit``: no thread
and no call object of its own), so one thread keeps as many in flight as it starts (the daemon reads at most 256
of one connection at a time and holds the rest in the socket). Its status moves from WAITING to COMPLETED, TIMEOUT or
FAILED exactly once: when a query finds its reply in (``AttachClient.poll``, which reads the connection without
blocking when nobody else does), or finds its deadline passed (TIMEOUT; the request is withdrawn and a late reply
dropped). A request is reported until a query sees it finished: ``status`` and ``collect`` forget a finished request
once they report it (HIXL erases it), so a second query of it is ``PARAM_INVALID`` ("request not found").
``collect`` reports in submission order. A disconnect forgets the requests to that engine (HIXL erases them with the
client).

Threads: any caller thread; every field is guarded by the one lock, the connection is the ``AttachClient``'s.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from datadist.hixl import PARAM_INVALID, SUCCESS, TIMEOUT, hixl_status
from llm_datadist._attach import AttachClient
from llm_datadist.status import LLMException

__all__ = ["Requests", "WAITING", "COMPLETED", "TIMED_OUT", "FAILED_"]

# hixl_types.h TransferStatus
WAITING, COMPLETED, TIMED_OUT, FAILED_ = range(4)


class _Request:
    __slots__ = ("remote", "user_data", "status", "rid", "box", "deadline")

    def __init__(self, remote: str, user_data: int, rid: int, box: Any, deadline: float) -> None:
        self.remote = remote
        self.user_data = user_data
        self.status = WAITING
        self.rid, self.box, self.deadline = rid, box, deadline


class Requests:
    """The requests of one engine, by id (an opaque non-zero int, as HIXL's ``TransferReq`` pointer)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._requests: Dict[int, _Request] = {}   # in submission order
        self._attach: Optional[AttachClient] = None

    def start(self, attach: AttachClient, remote: str, user_data: int, rid: int, box: Any, timeout_s: float) -> int:
        """Track the frame ``rid`` submitted on ``attach`` to ``remote``; its id."""
        request = _Request(remote, user_data, rid, box, time.monotonic() + timeout_s)
        with self._lock:
            self._attach = attach
            req = next(self._ids)
            self._requests[req] = request
        return req

    def _settle(self, request: _Request) -> int:
        """``request``'s status now (under the lock): WAITING until its reply is in or its deadline passed."""
        if request.status != WAITING or self._attach is None:
            return request.status
        try:
            got = self._attach.poll(request.rid, request.box, "transfer_async")
        except LLMException as exc:
            request.status = TIMED_OUT if hixl_status(int(exc.status_code)) == TIMEOUT else FAILED_
            return request.status
        if got is not None:
            request.status = COMPLETED
        elif time.monotonic() > request.deadline:
            self._attach.withdraw(request.rid)
            request.status = TIMED_OUT
        return request.status

    def status(self, req: int) -> Tuple[int, int]:
        """(SUCCESS, status) of request ``req``, forgotten when finished; (PARAM_INVALID, FAILED_) when unknown."""
        with self._lock:
            request = self._requests.get(req)
            if request is None:
                return PARAM_INVALID, FAILED_
            status = self._settle(request)
            if status != WAITING:
                del self._requests[req]
            return SUCCESS, status

    def collect(self, max_count: int, skip_waiting: bool) -> List[Tuple[int, int, int]]:
        """(req, user_data, status) of up to ``max_count`` requests in submission order, the finished ones forgotten;
        with ``skip_waiting`` the waiting ones are neither reported nor counted."""
        out: List[Tuple[int, int, int]] = []
        if max_count == 0:
            return out
        with self._lock:
            for req, request in list(self._requests.items()):
                status = self._settle(request)
                if status != WAITING:
                    del self._requests[req]
                elif skip_waiting:
                    continue
                out.append((req, request.user_data, status))
                if len(out) >= max_count:
                    break
        return out

    def forget(self, remote: Optional[str] = None) -> None:
        """Forget the requests to ``remote`` (all when None); their late replies are dropped."""
        with self._lock:
            gone = [req for req, r in self._requests.items() if remote is None or r.remote == remote]
            dropped = [self._requests.pop(req) for req in gone]
            attach = self._attach
        if attach is not None:
            for request in dropped:
                attach.withdraw(request.rid)
