"""``HcclAgent``: the one-sided HCCL engine behind ``HcclTransport``, with the interface of the nixl ``Agent``
(metadata, registrations, ``addresses``, ``write`` with a notification, ``read``, ``notifications``).

An engine's agent, on the engine's NPU, in CANN's order (LLM-DataDist ``comm_entity.cc``; docs/ascend.md):

* memory is registered with HCCL per allocation -- a whole DEVICE pool when it is made, a worker's imported cache
  when it arrives (``datadist_ascend.globalmem``) -- never lazily at a transfer;
* one communicator per link with a peer engine (two ranks), named by the link (``comm_name``), made when the peer's
  identity arrives on it, under ONE process-wide lock (HCCL does not support concurrent
  ``HcclCommInitClusterInfoMemConfig``), then ``HcclCommBindMem`` of every registered range of the device, then
  ``HcclCommPrepare`` (timeout in seconds, rounded up): what is bound there is all the peer can reach; memory
  registered later is reachable on links made later;
* the peer's identity names the ranges it had registered; a transfer checks every extent against both sides' bound
  ranges and cuts an extent that spans two of them (HCCL wants each descriptor inside one buffer);
* a transfer enqueues ``DESCS_PER_CALL`` descriptors per call on the link's stream, synchronises once, and aborts
  the stream on ANY failure (an enqueue that failed half-way left the first descriptors queued);
* unlink waits for Prepare, then: abort the stream, unbind each range, destroy the communicator, destroy the stream;
* every path that touches HCCL or ACL state sets the engine's device first (``Acl.set_device``).

Completion of a put is known to this side only (stream synchronisation); the notification then travels to the
peer over the link's channel (``route``), where ``deliver`` queues it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import Future
from typing import Callable, Sequence

import numpy as np

from datadist.status import LLMStatusCode
from datadist_ascend import AscendError
from datadist_ascend.acl import DEV_ATTR_SUPER_POD_DEVICE_ID, DEV_ATTR_SUPER_POD_ID, acl
from datadist_ascend.globalmem import Range, global_mem
from datadist_ascend.hccl import CommConfig, hccl, prepare_seconds

from ...core.errors import DataDistError
from ...memory.base import DeviceMemory, MemoryHandle, Segment
from ..onesided.pairing import pair_extents
from ..registrations import Registration, RegistrationTable
from .extents import split_extents
from .identity import check_device_ip, cluster_table, comm_name, host_address

__all__ = ["HcclAgent", "DONE", "check_device_ip", "close_wait", "cluster_table", "comm_name", "host_address",
           "split_extents"]

log = logging.getLogger("datadistd.transport.hccl")

DONE = b"H"         # control message: u8 'H', then the notification of a completed put
_MAX_META = 65536
_MAX_RANGES = 1024  # ranges a peer may name (HCCL binds at most so many per communicator here)
#: identity fields that may be empty: HCCL's default port; no super pod (an A2)
_OPTIONAL = frozenset({"device_port", "super_pod_id", "super_device_id"})
#: one process-wide lock around communicator creation (LLM-DataDist ``comm_entity.cc`` ``g_mutex_``)
_INIT_LOCK = threading.Lock()


#: the phases of one HcclCommPrepare, each with the whole timeout: connect, exchange, enable (hcomm's one-sided
#: service, as issue 45 reads it)
PREPARE_PHASES = 3


def close_wait(prepare_timeout: float, retries: int) -> float:
    """The longest an unlink waits for a Prepare to end: every try's timeout in each of its phases, and a margin."""
    return prepare_seconds(prepare_timeout * 1000, retries) * retries * PREPARE_PHASES + 5.0


class _Comm:
    """A communicator with one peer: made and prepared by a thread of its own (both ranks meet in Prepare)."""

    def __init__(self, peer: str, link: bytes, theirs: list[tuple[int, int]]) -> None:
        self.peer = peer
        self.link = link                            # the token of the link it was made for
        self.comm = 0
        self.stream = 0
        self.rank = self.remote_rank = 0
        self.bound: list[Range] = []                # ranges bound before Prepare: what the peer reaches
        self.theirs = theirs                        # the peer's registered ranges when it sent its identity
        self.ready: Future[None] = Future()
        self.lock = threading.Lock()       # one batch at a time on the stream
        self.opening = threading.Lock()    # held while the communicator is made and prepared
        self.stop = False                  # unlink: no more Prepare tries


class HcclAgent:
    #: nothing here bounds when a batch that missed its deadline ends (``OneSidedAgent.fence``)
    fence = 0.0

    def __init__(self, name: str, device: int, server_id: str, device_ip: str, traffic_class: int | None = None,
                 service_level: int | None = None, prepare_timeout: float = 10.0, retries: int = 1,
                 physical_id: int | None = None, device_ip_source: str = "the caller",
                 device_port: int = 0) -> None:
        self.name = name
        self.device = device
        self._acl = acl()
        self._hccl = hccl()
        self._mem = global_mem()
        try:
            physical = self._acl.physical_id(device)
            self._mem.activate(device)   # the device's pools and imports registered with HCCL, before any link
        except AscendError as exc:
            raise DataDistError(exc.status, f"hccl: device {device}: {exc}") from None
        if physical_id is not None and physical_id != physical:
            raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID,
                                f"llm.LocalCommRes names device_id {physical_id}, but the engine's NPU (logical "
                                f"{device}) is physical device {physical}")
        try:   # an A3 names its super pod and its NPU there (rank table 1.2: hixl rank_table_generator_v2.cc)
            a3 = self._acl.is_a3()
            pod = str(self._acl.device_info(device, DEV_ATTR_SUPER_POD_ID)) if a3 else ""
            super_device = str(self._acl.device_info(device, DEV_ATTR_SUPER_POD_DEVICE_ID)) if a3 else ""
        except AscendError as exc:
            raise DataDistError(exc.status, f"hccl: device {device}: {exc}") from None
        self.physical = physical
        self._ip_source = device_ip_source
        self._identity = {"name": name, "server_id": server_id, "device_ip": device_ip, "device_id": str(physical),
                          "device_port": str(device_port) if device_port else "", "super_pod_id": pod,
                          "super_device_id": super_device}
        self._traffic_class = traffic_class
        self._service_level = service_level
        self._prepare_timeout = prepare_timeout
        self._retries = max(1, retries)
        self._lock = threading.RLock()
        self._regs = RegistrationTable(self._register, self._deregister, self._lock)
        self._comms: dict[str, _Comm] = {}
        self._routes: dict[str, Callable[[bytes], None]] = {}
        self._inbox: list[tuple[str, bytes]] = []
        self._closing: list[threading.Thread] = []   # unlinks waiting for a Prepare to end
        self._closed = False

    # -- identity and peers --

    def metadata(self) -> bytes:
        """The identity and the ranges registered now (the peer checks and cuts its extents against them)."""
        ranges = [(r.base, r.size) for r in self._mem.ranges(self.device)]
        return json.dumps({**self._identity, "ranges": ranges}).encode()

    def partial_metadata(self, regs: Sequence[Registration]) -> bytes:
        return b""   # a peer reaches memory through the communicator it was bound to before Prepare

    def serials(self) -> set[int]:
        return set()

    @staticmethod
    def _ranges(value: object) -> list[tuple[int, int]]:
        """A peer's ``[[base, size], ...]``, checked: sorted, disjoint, inside 64 bits."""
        if not isinstance(value, list) or len(value) > _MAX_RANGES or \
                not all(isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) and 0 < x < 1 << 64 for x in r)
                        for r in value):
            raise ValueError("bad ranges")
        ranges = sorted((int(b), int(n)) for b, n in value)
        if any(b + n > 1 << 64 for b, n in ranges) or \
                any(ranges[i][0] + ranges[i][1] > ranges[i + 1][0] for i in range(len(ranges) - 1)):
            raise ValueError("overlapping ranges")
        return ranges

    def _identity_of(self, metadata: bytes) -> tuple[dict[str, str], list[tuple[int, int]]]:
        """A peer's identity, checked, and the ranges it names."""
        try:
            if len(metadata) > _MAX_META:
                raise ValueError("too long")
            peer = json.loads(metadata)
            if not isinstance(peer, dict) or not set(self._identity) - _OPTIONAL <= set(peer) - {"ranges"} <= \
                    set(self._identity):
                raise ValueError("not an identity")
            peer = {**dict.fromkeys(_OPTIONAL, ""), **peer}
            theirs = self._ranges(peer.pop("ranges"))
            if not all(isinstance(v, str) and (v or k in _OPTIONAL) for k, v in peer.items()):
                raise ValueError("not an identity")
        except ValueError as exc:
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"hccl: bad peer identity ({exc})") from None
        return peer, theirs

    def identity_name(self, metadata: bytes) -> str:
        """The agent a peer's identity names (checked before its communicator retires that agent's older one)."""
        return self._identity_of(metadata)[0]["name"]

    def add_peer(self, metadata: bytes, link: bytes) -> str:
        """Start the communicator of the link ``link`` (its token) with the peer that sent ``metadata`` on it (the
        peer's name, at once; Prepare runs on). A peer whose communicator (made for a link still up on this side)
        was named by a smaller token keeps it: two links made at once from both ends (a comm domain) reach the two
        ends in either order, and both keep the same one; else the new link's replaces it. A link is one agent's:
        an identity of another agent on it is refused, leaving that agent's communicator alone."""
        peer, theirs = self._identity_of(metadata)
        name = peer["name"]
        if name == self.name:
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, "hccl: the peer claims this agent's name")
        check_device_ip(self._identity["device_ip"], self._ip_source, self.physical, peer["device_ip"])
        if not link:
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, "hccl: a communicator is made for a link")
        with self._lock:
            stale = self._comms.get(name)
            if stale is not None and stale.link == link:
                return name     # this link's communicator is made already (the identity again, on its link)
            if any(e.link == link for e in self._comms.values()):
                raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"hccl: an identity of {name} on another "
                                                                   "agent's link")
            if stale is not None and stale.link < link and not (stale.ready.done() and stale.ready.exception()):
                return name     # the smaller token's is kept (both ends keep it), unless it failed
            entry = self._comms[name] = _Comm(name, link, theirs)
        if stale is not None:
            self._retire(stale)
        threading.Thread(target=self._open, args=(entry, peer), name="datadist-hccl-prepare", daemon=True).start()
        return name

    def _open(self, entry: _Comm, peer: dict[str, str]) -> None:
        table, order = cluster_table([self._identity, peer])
        with entry.opening:
            try:
                if entry.stop:
                    raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, "unlinked while linking")
                name = comm_name((self.name, peer["name"]), entry.link)
                config = CommConfig.make(name, self._traffic_class, self._service_level)
                entry.rank, entry.remote_rank = order.index(self.name), order.index(peer["name"])
                self._acl.set_device(self.device)   # the link's thread takes the engine's context first
                with _INIT_LOCK:
                    entry.comm = self._hccl.init_comm(table, entry.rank, config)
                entry.stream = self._acl.create_stream(self.device)
                for rng in self._mem.ranges(self.device):   # bound BEFORE Prepare: all the peer will reach
                    self._hccl.bind(entry.comm, rng.handle)
                    self._mem.bound(rng, entry.comm)
                    entry.bound.append(rng)
                # CANN: link_retry_count tries of HcclCommPrepare sharing the link's time, in seconds rounded up
                seconds = prepare_seconds(self._prepare_timeout * 1000, self._retries)
                for attempt in range(self._retries):
                    try:
                        self._hccl.prepare(entry.comm, seconds)
                        break
                    except AscendError as exc:
                        if attempt + 1 == self._retries or entry.stop:
                            raise
                        log.info("hccl: HcclCommPrepare with %s failed (%s); retrying", peer["name"], exc)
                entry.ready.set_result(None)
            except (AscendError, ValueError, DataDistError) as exc:
                status = exc.status if isinstance(exc, AscendError) else \
                    exc.code if isinstance(exc, DataDistError) else LLMStatusCode.LLM_PARAM_INVALID
                entry.ready.set_exception(DataDistError(status, f"hccl: communicator with {peer['name']}: {exc}"))

    def route(self, peer: str, send: Callable[[bytes], None]) -> None:
        """How notifications reach ``peer``: a control message on its link's channel."""
        with self._lock:
            self._routes[peer] = send

    def drop_peer(self, name: str) -> None:
        """Unlink: tear the communicator down in CANN's order once its Prepare has ended -- at once if it has, else
        on a thread of its own when it does (Prepare is bounded by its timeout; HCCL cannot cancel it, and
        unbinding under a running Prepare races the set it iterates). A relink does not wait: its communicator has
        a name of its own."""
        with self._lock:
            entry = self._comms.pop(name, None)
            self._routes.pop(name, None)
        if entry is not None:
            self._retire(entry)

    def _retire(self, entry: _Comm) -> None:
        entry.stop = True
        if entry.opening.acquire(blocking=False):
            self._close_entry(entry)
            return
        thread = threading.Thread(target=self._close_later, args=(entry,), name="datadist-hccl-unlink", daemon=True)
        with self._lock:
            self._closing.append(thread)
        thread.start()

    def _close_wait(self) -> float:
        return close_wait(self._prepare_timeout, self._retries)

    def _close_later(self, entry: _Comm) -> None:
        wait = self._close_wait()
        if not entry.opening.acquire(timeout=wait):
            # its ranges stay bound: their memory is not freed under HCCL (globalmem frees after the last unbind)
            log.error("hccl: the communicator with %s is still being prepared after %s s: left as it is, with the "
                      "memory it binds", entry.peer, wait)
            return
        self._close_entry(entry)

    def _close_entry(self, entry: _Comm) -> None:
        """Under ``entry.opening`` (released here): the teardown, after any batch on the link's stream."""
        try:
            with entry.lock:
                self._teardown(entry)
        finally:
            entry.opening.release()

    def _teardown(self, entry: _Comm) -> None:
        """CANN's order (LLM-DataDist ``CommEntity::Finalize``): abort the stream, unbind each range, destroy the
        communicator, destroy the stream -- with the engine's device set."""
        try:
            self._acl.set_device(self.device)
        except AscendError as exc:
            log.warning("hccl: %s", exc)
        if entry.stream:
            try:
                self._acl.abort(self.device, entry.stream)
            except AscendError as exc:
                log.warning("hccl: aborting the stream of the link with %s: %s", entry.peer, exc)
        unbound = True
        for rng in entry.bound:
            try:
                self._hccl.unbind(entry.comm, rng.handle)
            except AscendError as exc:
                unbound = False
                log.warning("hccl: unbinding from the link with %s: %s", entry.peer, exc)
                continue
            self._mem.unbound(rng, entry.comm)
        entry.bound = []
        if entry.comm and unbound:
            try:
                self._hccl.destroy(entry.comm)
            except AscendError as exc:
                log.warning("hccl: destroying the communicator with %s: %s", entry.peer, exc)
        if entry.stream:
            try:
                self._acl.destroy_stream(self.device, entry.stream)
            except AscendError as exc:
                log.warning("hccl: destroying the stream of the link with %s: %s", entry.peer, exc)
        entry.comm = entry.stream = 0

    # -- registrations --

    def addresses(self, segments: Sequence[Segment]) -> tuple[np.ndarray, list[Registration], list[Registration]]:
        return self._regs.extents(segments)

    def _register(self, handle: MemoryHandle) -> tuple[int, int, int]:
        """A handle's extents: its own addresses; HCCL registered its allocation (``region``) already."""
        if not isinstance(handle, DeviceMemory) or handle.device != self.device:
            raise DataDistError(LLMStatusCode.LLM_FEATURE_NOT_ENABLED,
                                f"the hccl transport moves NPU memory of the engine's device ({self.device}) only "
                                "(memory backend acl, DEVICE caches); HOST caches: use transport tcp")
        return handle.address, handle.size, handle.region[0]

    def _deregister(self, reg: Registration) -> None:
        pass   # the allocation stays registered until its memory goes (globalmem)

    def registered(self) -> int:
        return len(self._regs)

    # -- published caches (``onesided.tables``): rows of memory bound before a link's Prepare, read by get --

    def ranges(self, tensors: Sequence[Segment]) -> np.ndarray | None:
        """``(address, length)`` of each tensor on the engine's NPU; None when one is not NPU memory of that device (a
        HOST cache: HCCL moves NPU memory only here)."""
        out = np.empty((len(tensors), 2), dtype=np.uint64)
        for i, seg in enumerate(tensors):
            handle = seg.handle
            if not isinstance(handle, DeviceMemory) or handle.device != self.device:
                return None
            out[i] = (handle.address + seg.offset, seg.length)
        return out

    def publish(self, ranges: np.ndarray) -> tuple[None, bytes]:
        """Nothing to register and no metadata: a cache lies in memory registered per allocation, which a link's
        communicator bound before its Prepare -- what the peer can reach was fixed there, and a get is checked
        against it (``_batch``). The peer's table names the cache's rows by address."""
        return None, b""

    def unpublish(self, token: object) -> None:
        """Nothing to deregister (``publish``): HCCL cannot revoke one cache of a prepared communicator (docs/ascend.md,
        "pull"); a withdrawn cache is unreadable because its entry left every link's table first."""

    def prepare_rows(self, peer: str, rows: np.ndarray) -> np.ndarray:
        """``peer``'s rows ``(address, length)`` as they are: HCCL has no descriptor list to prepare; a get names the
        addresses, checked against both sides' bound ranges when it runs (``_batch``: a row in memory the peer
        registered after the link is refused there, not here, so a later pool's cache leaves the link up)."""
        return np.ascontiguousarray(rows, dtype=np.uint64)

    def release_rows(self, prepared: object) -> None:
        """Nothing to release (``prepare_rows``)."""

    def read_rows(self, local: np.ndarray, prepared: np.ndarray, indices: Sequence[int] | np.ndarray, peer: str,
                  notif: bytes, deadline: float, reg: Registration | None = None) -> None:
        """``HcclBatchGet`` of rows ``indices`` of ``prepared`` (``peer``'s) into ``local`` extents -- rows adjacent on
        both sides as one descriptor (``pair_extents``: a contiguous pull is a few descriptors, not one a row) --,
        synchronised by ``deadline``; then ``notif`` to the peer, best effort (HCCL tells only the initiator; the
        owner only counts it)."""
        remote, local = pair_extents(prepared[np.asarray(indices, dtype=np.int64)], local)
        self.read(local, remote, peer, deadline)
        try:
            self.notify(peer, notif)
        except DataDistError as exc:   # the bytes are in: the link went meanwhile
            log.debug("hccl: the notification of a get from %s: %s", peer, exc)

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
        """``HcclBatchPut`` of extents ``local`` into ``peer``'s extents ``remote``, synchronised on the link's stream
        by ``deadline``; then the notification goes to the peer. Raises with the status table's code."""
        self._batch(True, local, remote, peer, deadline)
        self.notify(peer, notif)

    def read(self, local: np.ndarray, remote: np.ndarray, peer: str, deadline: float) -> None:
        """``HcclBatchGet`` of ``peer``'s extents ``remote`` into extents ``local``, synchronised on the link's stream
        by ``deadline`` (then every byte is here: no notification)."""
        self._batch(False, local, remote, peer, deadline)

    def _batch(self, put: bool, local: np.ndarray, remote: np.ndarray, peer: str, deadline: float) -> None:
        entry = self._ready(peer, deadline)
        with entry.lock:
            if not entry.comm:
                raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"hccl: the communicator with {peer} is closed")
            # what both sides bound before Prepare (and this side's memory still there)
            mine = [(r.base, r.size) for r in entry.bound if not r.retired]
            local, remote, outside = split_extents(local, remote, mine, entry.theirs)
            if outside is not None:
                raise DataDistError(LLMStatusCode.LLM_FEATURE_NOT_ENABLED,
                                    f"hccl: {outside} lies in memory registered after the link with {peer} was "
                                    "made: HCCL lets a peer reach only memory bound before the link's "
                                    "HcclCommPrepare; unlink and link again (docs/ascend.md)")
            what = "put to" if put else "get from"
            try:
                self._acl.set_device(self.device)
                self._hccl.batch(put, entry.comm, entry.remote_rank, local[:, 0], remote[:, 0], local[:, 1],
                                 entry.stream)
                self._acl.synchronize(self.device, entry.stream, int((deadline - time.monotonic()) * 1000))
            except AscendError as exc:
                try:   # CANN: any failure, the enqueue included, aborts the stream (queued descriptors would run)
                    self._acl.abort(self.device, entry.stream)
                except AscendError as abort_exc:
                    log.warning("hccl: aborting the stream: %s", abort_exc)
                raise DataDistError(exc.status, f"hccl: {what} {peer}: {exc}") from None

    def probe(self, peer: str) -> None:
        """Nothing to probe (``OneSidedAgent.probe``): ``fence`` is 0 and a batch is given up at its deadline."""

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
        with self._lock:
            closing, self._closing = self._closing, []
        for thread in closing:   # each ends within its Prepare's timeout
            thread.join()
        self._regs.close()
        self._closed = True
