"""Private: one HIXL engine, as an engine of datadistd (docs/hixl.md; the contract: proto/datadist/hixl.py).

- the engine is the daemon's ``Init`` of cluster id ``engine_cluster_id(local engine)``, ROLE_MIX, cache-manager mode,
  listening at the engine's address when it names a port -- opened as ``LLMDataDist.init`` opens one
  (``llm_datadist._daemon``: ``DATADIST_DAEMON``, else an embedded daemon);
- a registration is a cache of one uint8 tensor of one row of the range's length (shape [1, len]), handed over as
  ``register_cache`` hands memory over (``llm_datadist._cache_ops.CacheOps``); its handle is an opaque non-zero int
  mapped to the cache id;
- a connection is a link (``LinkClusters`` to the remote engine's cluster id at its address);
- a transfer is an extents frame on the worker's attach connection (``datadist.fastframe.KIND_EXTENTS``: the daemon's
  ``TransferExtents`` without protobuf or gRPC on the hot path): sync waits for its reply, async submits it and
  polls (``_requests``);
- a notify is ``SendNotify`` / ``GetNotifies``.

Every method returns HIXL's status (a daemon's ``LLMStatusCode`` mapped by ``hixl_status``) and never raises for a
refusal. What HIXL checks in the client (hixl_impl.cc, hixl_engine.cc, hixl_client.cc, client_manager.cc) is checked
here, in HIXL's order.

Threads: any caller thread; ``ConnectPool``'s workers call ``connect`` / ``disconnect``. The registrations and
connections are guarded by ``_lock``; one remote engine's connect and disconnect by its own lock (HIXL's per-client
mutex).
"""

from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from datadist import fastframe
from datadist.hixl import (
    ALREADY_CONNECTED,
    FAILED,
    NOT_CONNECTED,
    PARAM_INVALID,
    SUCCESS,
    Engine,
    engine_cluster_id,
    hixl_status,
    parse_engine,
)
from datadist.v1 import datadist_pb2
from llm_datadist._cache_ops import CacheOps
from llm_datadist._daemon import OpenEngine, close_engine, open_engine
from llm_datadist._rpc import RPC_MARGIN_S, DaemonClient
from llm_datadist.configs import LLMRole
from llm_datadist.data_type import DataType
from llm_datadist.llm_types import CacheDesc, Placement
from llm_datadist.status import LLMException, LLMStatusCode, code_2_status

from ._connect_pool import ConnectPool
from ._options import HixlOptions
from ._requests import Requests

__all__ = ["HixlEngine", "MEM_DEVICE", "MEM_HOST", "READ", "WRITE", "AUTO_CONNECT_TIMEOUT_MS", "ASYNC_TIMEOUT_MS"]

log = logging.getLogger(__name__)

# hixl_types.h MemType, TransferOp
MEM_DEVICE, MEM_HOST = 0, 1
READ, WRITE = 0, 1
#: hixl_engine.cc kAutoConnectTimeout: an async transfer's connect, and the disconnect after its failure
AUTO_CONNECT_TIMEOUT_MS = 3000
#: an async transfer's deadline (HIXL's TransferAsync takes none): the daemon answers TIMEOUT after it
ASYNC_TIMEOUT_MS = 30_000
_ADDR_END = 1 << 64


@dataclass(frozen=True)
class _Region:
    start: int
    end: int
    mem_type: int
    cache_id: int


def _status(exc: LLMException) -> int:
    return hixl_status(int(exc.status_code))


class HixlEngine:
    """An initialized HIXL engine on datadistd (see the module doc). Also what ``CacheOps`` needs of its owner
    (``llm_datadist._engine.EngineView``)."""

    def __init__(self, local_engine: str, options: HixlOptions) -> None:
        """Open the engine; ``ValueError`` (a bad engine string) or ``LLMException`` (the daemon's refusal)."""
        self.local = local_engine
        engine = parse_engine(local_engine)
        self._cluster_id = engine_cluster_id(engine)
        self._options = options
        daemon_options = {"llm.EnableCacheManager": "1", "llm.EnableRemoteCacheAccessible": "1"}
        if engine.port:
            daemon_options["llm.listenIpInfo"] = engine.canonical
        if options.rdma_traffic_class is not None:
            daemon_options["llm.RdmaTrafficClass"] = str(options.rdma_traffic_class)
        if options.rdma_service_level is not None:
            daemon_options["llm.RdmaServiceLevel"] = str(options.rdma_service_level)
        self._opened: OpenEngine = open_engine(self._cluster_id, int(LLMRole.MIX), daemon_options, options.daemon,
                                               "initialize", device_option=True)
        # what CacheOps reads of its owner (llm_datadist._engine.EngineView)
        self._engine_id = self._opened.engine_id
        self._device_id = self._opened.device_id
        self._role = LLMRole.MIX
        self._enable_cache_manager = True
        self._is_call_linked = False
        self._models: List[Any] = []
        self._closed = False
        self._ops = CacheOps(self)
        self._lock = threading.Lock()
        self._regions: Dict[int, _Region] = {}          # handle -> registration
        self._handles = 0
        self._connected: Dict[str, int] = {}            # remote engine -> its cluster id (HIXL's clients)
        self._remote_locks: Dict[str, threading.Lock] = {}
        self.requests = Requests()
        self.pool = ConnectPool(options.connect_threads, options.connect_queue, self.connect, self.disconnect)

    # ---- what CacheOps reads of its owner --------------------------------------------------------

    @property
    def cluster_id(self) -> int:
        """The daemon engine's cluster id (``engine_cluster_id`` of the local engine)."""
        return self._cluster_id

    @property
    def _sync_kv_timeout_s(self) -> float:
        return ASYNC_TIMEOUT_MS / 1000

    @property
    def kv_cache_manager(self) -> Any:
        """None: a HIXL engine has no v1 cache manager."""
        return None

    def _check_init(self) -> DaemonClient:
        if self._closed:
            raise RuntimeError("hixl engine is finalized")
        return self._opened.client

    def _call(self, method: str, request: object, func_name: str, timeout: Optional[float] = None) -> Any:
        return self._check_init().call(method, request, func_name, timeout)

    # ---- life cycle ------------------------------------------------------------------------------

    def finalize(self) -> None:
        """Stop the connect pool, forget (cancel) the requests, release the engine on the daemon (its registrations
        and links with it) and give back what was handed over."""
        self.pool.shutdown()
        self.requests.forget()
        self._ops._finalize()
        try:
            close_engine(self._opened, "finalize")
        finally:
            self._closed = True
            self._ops._release_exports()

    # ---- memory ----------------------------------------------------------------------------------

    def register_mem(self, addr: int, length: int, mem_type: int) -> Tuple[int, int]:
        """(status, handle): hixl_impl.cc (a null address), hixl_server.cc (overflow; the same range of the same type
        again: its handle; an overlapping one: PARAM_INVALID), then the daemon's RegisterCache."""
        if addr == 0:
            return PARAM_INVALID, 0
        if addr + length > _ADDR_END or length == 0:
            log.error("register_mem: the range 0x%x + %d is empty or overflows the address space", addr, length)
            return PARAM_INVALID, 0
        end = addr + length
        with self._lock:
            for handle, r in self._regions.items():
                if r.mem_type == mem_type and r.start < end and addr < r.end:
                    if (r.start, r.end) == (addr, end):
                        return SUCCESS, handle
                    log.error("register_mem: [0x%x, 0x%x) overlaps the registered [0x%x, 0x%x)", addr, end,
                              r.start, r.end)
                    return PARAM_INVALID, 0
        placement = Placement.DEVICE if mem_type == MEM_DEVICE else Placement.HOST
        desc = CacheDesc(1, [1, length], DataType.DT_UINT8, placement)
        try:
            info = self._ops._register_rpc("register_mem", desc, [addr], False, remote_accessible=True)
        except LLMException as exc:
            log.error("register_mem: %s", exc)
            return _status(exc), 0
        with self._lock:
            self._handles += 1
            self._regions[self._handles] = _Region(addr, end, mem_type, int(info.cache_id))
            return SUCCESS, self._handles

    def deregister_mem(self, handle: int) -> int:
        """hixl_impl.cc (a null handle), hixl_engine.cc (an unknown one: SUCCESS; any connection: FAILED), then the
        daemon's UnregisterCache."""
        if handle == 0:
            return PARAM_INVALID
        with self._lock:
            region = self._regions.get(handle)
            if region is None:
                log.warning("deregister_mem: handle %d is not registered", handle)
                return SUCCESS
            if self._connected:
                log.error("deregister_mem: all clients must be disconnected before deregistration (connected to %s)",
                          ", ".join(sorted(self._connected)))
                return FAILED
            del self._regions[handle]
        try:
            self._ops._unregister_rpc("deregister_mem", region.cache_id)
        except LLMException as exc:
            log.error("deregister_mem: %s", exc)
            return _status(exc)
        return SUCCESS

    # ---- connections -----------------------------------------------------------------------------

    def _remote_lock(self, remote: str) -> threading.Lock:
        with self._lock:
            return self._remote_locks.setdefault(remote, threading.Lock())

    def connected(self, remote: str) -> Optional[int]:
        """The cluster id of ``remote`` when this engine is connected to it."""
        with self._lock:
            return self._connected.get(remote)

    def connect(self, remote: str, timeout_ms: int) -> int:
        """hixl_engine.cc Connect: not to itself; ALREADY_CONNECTED when connected; a remote that names no port is
        PARAM_INVALID; then the daemon's LinkClusters."""
        if remote == self.local:
            log.error("connect: do not support connection with self (%s)", remote)
            return PARAM_INVALID
        with self._remote_lock(remote):
            if self.connected(remote) is not None:
                return ALREADY_CONNECTED
            try:
                engine = parse_engine(remote)
            except ValueError as exc:
                log.error("connect: %s", exc)
                return PARAM_INVALID
            if not engine.port:
                log.error("connect: remote engine %s names no port: it does not listen", remote)
                return PARAM_INVALID
            cluster_id = engine_cluster_id(engine)
            code = self._link("LinkClusters", datadist_pb2.LinkClustersRequest(
                engine_id=self._engine_id, clusters=[_cluster(engine, cluster_id)], timeout_ms=timeout_ms),
                "connect", timeout_ms)
            if code in (SUCCESS, ALREADY_CONNECTED):
                with self._lock:
                    self._connected[remote] = cluster_id
            return code

    def disconnect(self, remote: str, timeout_ms: int) -> int:
        """client_manager.cc DestroyClient: NOT_CONNECTED when not connected; else the requests to it are forgotten
        and the daemon's UnlinkClusters ends the link."""
        with self._remote_lock(remote):
            with self._lock:
                cluster_id = self._connected.pop(remote, None)
            if cluster_id is None:
                return NOT_CONNECTED
            self.requests.forget(remote)
            code = self._link("UnlinkClusters", datadist_pb2.UnlinkClustersRequest(
                engine_id=self._engine_id, clusters=[_cluster(parse_engine(remote), cluster_id)],
                timeout_ms=timeout_ms), "disconnect", timeout_ms)
            return SUCCESS if code == NOT_CONNECTED else code   # the link was gone already: it is ended

    def _link(self, method: str, request: Any, func: str, timeout_ms: int) -> int:
        """The HIXL status of a LinkClusters / UnlinkClusters of one cluster."""
        try:
            resp = self._call(method, request, func, timeout_ms / 1000 + RPC_MARGIN_S)
        except LLMException as exc:
            log.error("%s: %s", func, exc)
            return _status(exc)
        code = code_2_status(resp.statuses[0] if resp.statuses else resp.status)
        if code != LLMStatusCode.LLM_SUCCESS:
            reason = resp.reasons[0] if resp.reasons else "the daemon gave no reason"
            log.log(logging.WARNING if code == LLMStatusCode.LLM_ALREADY_LINK else logging.ERROR,
                    "%s: %s: %s", func, code.name, reason)
        return hixl_status(int(code))

    # ---- transfers -------------------------------------------------------------------------------

    def _prepare(self, remote: str, descs: Sequence[Tuple[int, int, int]], timeout_ms: int,
                 ) -> Tuple[int, int]:
        """(status, remote cluster id) before a transfer: hixl_impl.cc CheckTransferOpDescs (null addresses),
        hixl_engine.cc AutoConnect (NOT_CONNECTED, or connect first with AutoConnect), hixl_client.cc (no extents)."""
        for local_addr, remote_addr, _ in descs:
            if local_addr == 0 or remote_addr == 0:
                log.error("transfer: %s addr of desc can not be null", "local" if local_addr == 0 else "remote")
                return PARAM_INVALID, 0
        cluster_id = self.connected(remote)
        if cluster_id is None:
            if not self._options.auto_connect:
                log.error("transfer: remote engine %s is not connected", remote)
                return NOT_CONNECTED, 0
            code = self.connect(remote, timeout_ms)
            if code not in (SUCCESS, ALREADY_CONNECTED):
                return code, 0
            cluster_id = self.connected(remote)
            if cluster_id is None:   # a disconnect in between
                return NOT_CONNECTED, 0
        if not descs:
            log.error("transfer: op_descs is empty")
            return PARAM_INVALID, 0
        return SUCCESS, cluster_id

    def _frame(self, cluster_id: int, op: int, descs: Sequence[Tuple[int, int, int]],
               timeout_ms: int) -> fastframe.TransferFrame:
        """The extents as the attach connection's transfer frame (``datadist.fastframe.KIND_EXTENTS``)."""
        return fastframe.TransferFrame(fastframe.PUSH if op == WRITE else fastframe.PULL, self._engine_id,
                                       fastframe.KIND_EXTENTS, 0, (cluster_id, 0, 0, 0), 0,
                                       tuple(itertools.chain.from_iterable(descs)), timeout_ms=timeout_ms)

    def _failed(self, remote: str, code: int, timeout_ms: int) -> None:
        """After a transfer to ``remote`` failed with ``code``: a link the daemon no longer has is no connection; with
        AutoConnect the connection is ended (hixl_engine.cc AutoDisconnect), so the next transfer connects again."""
        if code == NOT_CONNECTED:
            with self._lock:
                self._connected.pop(remote, None)
        elif self._options.auto_connect:
            self.disconnect(remote, timeout_ms)

    def transfer_sync(self, remote: str, op: int, descs: Sequence[Tuple[int, int, int]], timeout_ms: int) -> int:
        """One TransferExtents, waited for."""
        code, cluster_id = self._prepare(remote, descs, timeout_ms)
        if code != SUCCESS:
            return code
        try:
            self._check_init().attach().transfer(self._frame(cluster_id, op, descs, timeout_ms), "transfer_sync",
                                                 timeout_ms / 1000 + RPC_MARGIN_S)
        except LLMException as exc:
            log.error("transfer_sync: %s", exc)
            code = _status(exc)
            self._failed(remote, code, timeout_ms)
            return code
        return SUCCESS

    def transfer_async(self, remote: str, op: int, descs: Sequence[Tuple[int, int, int]],
                       user_data: int) -> Tuple[int, int]:
        """(status, req): one TransferExtents started, tracked by ``requests``."""
        code, cluster_id = self._prepare(remote, descs, AUTO_CONNECT_TIMEOUT_MS)
        if code != SUCCESS:
            return code, 0
        try:
            attach = self._check_init().attach()
            rid, box = attach.submit(self._frame(cluster_id, op, descs, ASYNC_TIMEOUT_MS), "transfer_async")
        except LLMException as exc:
            log.error("transfer_async: %s", exc)
            return _status(exc), 0
        return SUCCESS, self.requests.start(attach, remote, user_data, rid, box,
                                            ASYNC_TIMEOUT_MS / 1000 + RPC_MARGIN_S)

    # ---- notifies --------------------------------------------------------------------------------

    def send_notify(self, remote: str, name: bytes, msg: bytes, timeout_ms: int) -> int:
        """hixl_engine.cc SendNotify (NOT_CONNECTED when not connected; the lengths are checked by the caller, as
        hixl_impl.cc's Hixl::SendNotify does first), then the daemon's SendNotify (RESOURCE_EXHAUSTED when the remote
        engine's queue is full)."""
        cluster_id = self.connected(remote)
        if cluster_id is None:
            log.error("send_notify: remote engine %s is not connected", remote)
            return NOT_CONNECTED
        try:
            self._call("SendNotify", datadist_pb2.NotifyRequest(
                engine_id=self._engine_id, remote_cluster_id=cluster_id, name=name, msg=msg, timeout_ms=timeout_ms),
                "send_notify", timeout_ms / 1000 + RPC_MARGIN_S)
        except LLMException as exc:
            log.error("send_notify: %s", exc)
            return _status(exc)
        return SUCCESS

    def get_notifies(self) -> Tuple[int, List[Tuple[bytes, bytes]]]:
        """(status, [(name, msg)]) received, oldest first; taken."""
        try:
            resp = self._call("GetNotifies", datadist_pb2.EngineRef(engine_id=self._engine_id), "get_notifies")
        except LLMException as exc:
            log.error("get_notifies: %s", exc)
            return _status(exc), []
        return SUCCESS, [(n.name, n.msg) for n in resp.notifies]


def _cluster(engine: Engine, cluster_id: int) -> datadist_pb2.ClusterLink:
    msg = datadist_pb2.ClusterLink(remote_cluster_id=cluster_id)
    msg.remote_ip_info.add(ip=engine.host, port=engine.port)
    return msg
