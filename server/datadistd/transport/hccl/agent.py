"""``HcclAgent``: the one-sided HCCL engine behind ``HcclTransport``, with the interface of the nixl ``Agent``
(metadata, registrations, ``addresses``, ``write`` with a notification, ``read``, ``notifications``).

An engine's agent, on the engine's NPU: one communicator per peer engine (two ranks), made when the peer's
identity arrives, with the engine's CANN options; every registered range is bound to every communicator.
Completion of a put is known to this side only (stream synchronisation); the notification then travels to the
peer over the link's channel (``route``), where ``deliver`` queues it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from concurrent.futures import Future
from typing import Callable, Sequence

import numpy as np

from datadist.status import LLMStatusCode
from datadist_ascend import AscendError
from datadist_ascend.acl import acl
from datadist_ascend.hccl import MEM_DEVICE, CommConfig, hccl

from ...core.errors import DataDistError
from ...memory.base import DeviceMemory, MemoryHandle, Segment
from ..registrations import Registration, RegistrationTable

__all__ = ["HcclAgent", "DONE", "cluster_table"]

log = logging.getLogger("datadistd.transport.hccl")

DONE = b"H"         # control message: u8 'H', then the notification of a completed put
_MAX_META = 4096


def cluster_table(members: Sequence[dict[str, str]]) -> tuple[str, list[str]]:
    """The rank table (CANN's version 1.0 format, as LLM-DataDist generates it) of ``members`` -- each
    ``{"name", "server_id", "device_id", "device_ip"}`` -- and the agent names in rank order: servers sorted
    by id, devices in name order within a server, ranks counted in that order. Both daemons build the same."""
    servers: dict[str, list[dict[str, str]]] = {}
    for m in sorted(members, key=lambda m: m["name"]):
        servers.setdefault(m["server_id"], []).append(m)
    server_list: list[dict[str, object]] = []
    order: list[str] = []
    for server_id in sorted(servers):
        devices = []
        for m in servers[server_id]:
            devices.append({"device_id": m["device_id"], "device_ip": m["device_ip"], "rank_id": str(len(order))})
            order.append(m["name"])
        server_list.append({"server_id": server_id, "device": devices})
    table = {"version": "1.0", "server_count": str(len(server_list)), "server_list": server_list,
             "status": "completed"}
    return json.dumps(table, separators=(",", ":")), order


class _Comm:
    """A communicator with one peer: made and prepared by a thread of its own (both ranks meet in Prepare)."""

    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.comm = 0
        self.stream = 0
        self.rank = self.remote_rank = 0
        self.bound: set[int] = set()       # registration handles bound
        self.ready: Future[None] = Future()
        self.lock = threading.Lock()       # one batch at a time on the stream


class HcclAgent:
    def __init__(self, name: str, device: int, server_id: str, device_ip: str, traffic_class: int | None = None,
                 service_level: int | None = None, prepare_timeout: float = 10.0, retries: int = 1,
                 physical_id: int | None = None) -> None:
        self.name = name
        self.device = device
        self._acl = acl()
        self._hccl = hccl()
        try:
            physical = self._acl.physical_id(device)
        except AscendError as exc:
            raise DataDistError(exc.status, f"hccl: device {device}: {exc}") from None
        if physical_id is not None and physical_id != physical:
            raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID,
                                f"llm.LocalCommRes names device_id {physical_id}, but the engine's NPU (logical "
                                f"{device}) is physical device {physical}")
        self._identity = {"name": name, "server_id": server_id, "device_ip": device_ip, "device_id": str(physical)}
        self._traffic_class = traffic_class
        self._service_level = service_level
        self._prepare_timeout = prepare_timeout
        self._retries = max(1, retries)
        self._lock = threading.RLock()
        self._regs = RegistrationTable(self._register, self._deregister, self._lock, register_locked=True)
        self._comms: dict[str, _Comm] = {}
        self._routes: dict[str, Callable[[bytes], None]] = {}
        self._inbox: list[tuple[str, bytes]] = []
        self._closed = False

    # -- identity and peers --

    def metadata(self) -> bytes:
        return json.dumps(self._identity).encode()

    def partial_metadata(self, regs: Sequence[Registration]) -> bytes:
        return b""   # a peer reaches new registrations through the communicator they are bound to

    def serials(self) -> set[int]:
        return set()

    def add_peer(self, metadata: bytes) -> str:
        """Start the communicator with the peer that sent ``metadata`` (its name, at once; Prepare runs on)."""
        try:
            if len(metadata) > _MAX_META:
                raise ValueError("too long")
            peer = json.loads(metadata)
            if not isinstance(peer, dict) or set(peer) != set(self._identity) or \
                    not all(isinstance(v, str) and v for v in peer.values()):
                raise ValueError("not an identity")
        except ValueError as exc:
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"hccl: bad peer identity ({exc})") from None
        name = peer["name"]
        if name == self.name:
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, "hccl: the peer claims this agent's name")
        with self._lock:
            if name in self._comms:
                return name
            entry = self._comms[name] = _Comm(name)
        threading.Thread(target=self._open, args=(entry, peer), name="datadist-hccl-prepare", daemon=True).start()
        return name

    def _open(self, entry: _Comm, peer: dict[str, str]) -> None:
        table, order = cluster_table([self._identity, peer])
        comm_name = "datadist-" + hashlib.sha256("|".join(order).encode()).hexdigest()[:32]
        try:
            config = CommConfig.make(comm_name, self._traffic_class, self._service_level)
            entry.rank, entry.remote_rank = order.index(self.name), order.index(peer["name"])
            self._acl.use(self.device)   # CANN: the link's thread takes the engine's context before HCCL calls
            with self._lock:
                entry.comm = self._hccl.init_comm(table, entry.rank, config)
                entry.stream = self._acl.create_stream(self.device)
                for reg in self._regs.all():
                    self._hccl.bind(entry.comm, reg.token)
                    entry.bound.add(reg.token)
            # CANN: link_retry_count tries of HcclCommPrepare sharing the link's time
            share = max(1, int(self._prepare_timeout * 1000 / self._retries))
            for attempt in range(self._retries):
                try:
                    self._hccl.prepare(entry.comm, share)
                    break
                except AscendError as exc:
                    if attempt + 1 == self._retries:
                        raise
                    log.info("hccl: HcclCommPrepare with %s failed (%s); retrying", peer["name"], exc)
            entry.ready.set_result(None)
        except (AscendError, ValueError) as exc:
            status = exc.status if isinstance(exc, AscendError) else LLMStatusCode.LLM_PARAM_INVALID
            entry.ready.set_exception(DataDistError(status, f"hccl: communicator with {peer['name']}: {exc}"))

    def route(self, peer: str, send: Callable[[bytes], None]) -> None:
        """How notifications reach ``peer``: a control message on its link's channel."""
        with self._lock:
            self._routes[peer] = send

    def drop_peer(self, name: str) -> None:
        """Unlink: unbind every range from the communicator, destroy it (CANN's teardown order)."""
        with self._lock:
            entry = self._comms.pop(name, None)
            self._routes.pop(name, None)
        if entry is None:
            return
        try:
            entry.ready.result(self._prepare_timeout + 1)
        except Exception:  # noqa: BLE001 - failed or still preparing: tear down what exists
            pass
        with entry.lock, self._lock:
            self._teardown(entry)

    def _teardown(self, entry: _Comm) -> None:
        for handle in list(entry.bound):
            try:
                self._hccl.unbind(entry.comm, handle)
            except AscendError as exc:
                log.warning("hccl: %s", exc)
        entry.bound.clear()
        if entry.stream:
            try:
                self._acl.destroy_stream(self.device, entry.stream)
            except AscendError as exc:
                log.warning("hccl: destroying the stream of the link with %s: %s", entry.peer, exc)
        if entry.comm:
            try:
                self._hccl.destroy(entry.comm)
            except AscendError as exc:
                log.warning("hccl: destroying the communicator with %s: %s", entry.peer, exc)
        entry.comm = entry.stream = 0

    # -- registrations --

    def addresses(self, segments: Sequence[Segment]) -> tuple[np.ndarray, list[Registration], list[Registration]]:
        return self._regs.rows(segments)

    def _register(self, handle: MemoryHandle) -> tuple[int, int, int]:
        """Register (under the agent's lock, ``RegistrationTable(register_locked=True)``) and bind to every
        communicator; one made later binds every registration (``_open``)."""
        if not isinstance(handle, DeviceMemory) or handle.device != self.device:
            raise DataDistError(LLMStatusCode.LLM_FEATURE_NOT_ENABLED,
                                f"the hccl transport moves NPU memory of the engine's device ({self.device}) only "
                                "(memory backend acl, DEVICE caches); HOST caches: use transport tcp")
        try:
            self._acl.use(self.device)
            token = self._hccl.register(MEM_DEVICE, handle.address, handle.size)
            for entry in self._comms.values():
                if entry.comm:
                    self._hccl.bind(entry.comm, token)
                    entry.bound.add(token)
        except AscendError as exc:
            raise DataDistError(exc.status, f"hccl: registering {handle.size} bytes: {exc}") from None
        return handle.address, handle.size, token

    def _deregister(self, reg: Registration) -> None:
        with self._lock:
            if self._closed:
                return
            for entry in self._comms.values():
                if reg.token in entry.bound:
                    try:
                        self._hccl.unbind(entry.comm, reg.token)
                    except AscendError as exc:
                        log.debug("hccl: %s", exc)
                    entry.bound.discard(reg.token)
            try:
                self._hccl.deregister(reg.token)
            except AscendError as exc:
                log.debug("hccl: %s", exc)

    def registered(self) -> int:
        return len(self._regs)

    # -- transfers --

    def _ready(self, peer: str, deadline: float) -> _Comm:
        with self._lock:
            entry = self._comms.get(peer)
        if entry is None:
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"hccl: no communicator with {peer}")
        try:
            entry.ready.result(max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise DataDistError(LLMStatusCode.LLM_TIMEOUT, f"hccl: the communicator with {peer} was not prepared "
                                                           f"by the deadline") from None
        return entry

    def write(self, local: np.ndarray, remote: np.ndarray, peer: str, notif: bytes, deadline: float,
              stop: Callable[[], DataDistError | None]) -> None:
        """``HcclBatchPut`` of rows ``local`` into ``peer``'s rows ``remote``, synchronised on the link's stream
        by ``deadline``; then the notification goes to the peer. Raises with the status table's code."""
        self._batch(True, local, remote, peer, deadline)
        self.notify(peer, notif)

    def read(self, local: np.ndarray, remote: np.ndarray, peer: str, deadline: float) -> None:
        """``HcclBatchGet`` of ``peer``'s rows ``remote`` into rows ``local``, synchronised on the link's stream by
        ``deadline`` (then every byte is here: no notification)."""
        self._batch(False, local, remote, peer, deadline)

    def _batch(self, put: bool, local: np.ndarray, remote: np.ndarray, peer: str, deadline: float) -> None:
        entry = self._ready(peer, deadline)
        with entry.lock:
            if not entry.comm:
                raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"hccl: the communicator with {peer} is closed")
            try:
                self._acl.use(self.device)
                self._hccl.batch(put, entry.comm, entry.remote_rank, local[:, 0], remote[:, 0], local[:, 1],
                                 entry.stream)
            except AscendError as exc:
                raise DataDistError(exc.status, f"hccl: {exc}") from None
            try:
                self._acl.synchronize(self.device, entry.stream, int((deadline - time.monotonic()) * 1000))
            except AscendError as exc:
                try:
                    self._acl.abort(self.device, entry.stream)   # CANN: a failed batch aborts its stream
                except AscendError as abort_exc:
                    log.warning("hccl: aborting the stream: %s", abort_exc)
                raise DataDistError(exc.status, f"hccl: {'put to' if put else 'get from'} {peer}: {exc}") from None

    def notify(self, peer: str, message: bytes) -> None:
        with self._lock:
            send = self._routes.get(peer)
        if send is None:
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"hccl: no channel to {peer}")
        send(message)

    def deliver(self, peer: str, message: bytes) -> None:
        with self._lock:
            self._inbox.append((peer, bytes(message)))

    def notifications(self) -> list[tuple[str, bytes]]:
        with self._lock:
            out, self._inbox = self._inbox, []
        return out

    def close(self) -> None:
        with self._lock:
            names = list(self._comms)
        for name in names:
            self.drop_peer(name)
        self._regs.close()
        self._closed = True
