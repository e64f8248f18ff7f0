"""The daemon's node-wide state: config, memory backend, and one engine per initialized LLMDataDist.

``Node`` knows nothing of grpc: the rpc layer injects a ``peer_connector`` (address ->
``PeerClient``) and a ``listener_factory`` (starts a Peer listener for an engine that set
``listen_ip_info``). Tests inject fakes the same way.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import secrets
import time
from dataclasses import dataclass, field, replace
from typing import Awaitable, Callable, Iterable, Mapping, Protocol

from .. import __version__
from ..core.errors import DataDistError, StatusCode, require
from ..core.options import EngineOptions, PoolConfig, parse_listen, parse_options
from ..core.types import EngineId, Placement, Role
from ..engine.engine import Engine
from ..guard.admission import Admitting
from ..guard.executor import EXECUTOR_THREADS, UNMETERED, Lane, Threads
from ..guard.quota import Charge, QuotaBook
from ..links import LINK_ATTEMPTS_PER_ADDRESS, AddressSlots, LinkManager
from ..links.comm import CommManager
from ..links.liveness import Liveness
from ..links.table import LinkTable
from ..links.wire.peering import PeerClient
from ..memory import MemoryBackend, Pool, backend_from_config
from ..memory.base import DeviceBackend
from ..ops.config import SECRET_FIX, Config, is_loopback
from ..ops.metrics import DaemonMetrics
from ..ops.peersecret import PeerSecret, check_public
from ..ops.peersecret import peer_secret as _peer_secret
from ..ops.snapshot import EngineView, LinkView, ListenerView, NodeView, PoolView
from ..transport import Transport, get_transport
from .sessions import SessionTable, WorkerSession

__all__ = ["Node", "EngineSlot", "ListenerFactory", "Listener"]

#: how long an Init whose listen address an engine being finalized still holds waits for it (``_retired_address``)
RETIRING_WAIT_SECONDS = 10.0

log = logging.getLogger(__name__)


class Listener(Protocol):
    address: str

    async def stop(self) -> None: ...


ListenerFactory = Callable[[str, int, "EngineSlot"], Awaitable[Listener]]


@dataclass
class EngineSlot:
    engine: Engine
    links: LinkManager
    transport: Transport
    session: WorkerSession                    # the worker that created the engine
    listener: Listener | None = None
    comm: CommManager | None = None
    extra_listeners: list[Listener] = field(default_factory=list)   # comm-domain listen addresses
    created: float = field(default_factory=time.time)
    options: dict[str, str] = field(default_factory=dict)           # the init options, verbatim
    device: int = 0                           # the engine's NPU (memory backend acl; 0 and unused otherwise)
    data_host: str = ""                       # the address the engine's data plane serves on
    charge: Charge | None = None              # the engine and its pools, booked to its worker's uid

    def listeners(self) -> list[Listener]:
        return ([self.listener] if self.listener is not None else []) + self.extra_listeners

    @property
    def engine_id(self) -> EngineId:
        return self.engine.engine_id

    @property
    def pid(self) -> int:
        """The worker's pid as the kernel reported it on the attach socket."""
        return self.session.cred.pid

    @property
    def uid(self) -> int:
        return self.session.cred.uid

    @property
    def listen_address(self) -> str:
        return self.listener.address if self.listener is not None else ""


class Node:
    def __init__(self, config: Config, *, backend: MemoryBackend | None = None,
                 peer_connector: Callable[[str], PeerClient] | None = None,
                 listener_factory: ListenerFactory | None = None, peer_secret: PeerSecret | None = None) -> None:
        """``peer_secret``: what peers must prove (default: ``peersecret.peer_secret`` of ``config``, as a
        standalone daemon reads it); ConfigError where the public one may not serve (``peersecret.check_public``)."""
        self.peer_secret = peer_secret or _peer_secret(config.peer)
        check_public(self.peer_secret, config.daemon.socket_mode, config.transport.host)
        self.config = config
        self.metrics: DaemonMetrics | None = None   # set by the app: owner-side transfers are counted there
        self.backend = backend or backend_from_config(config.memory)
        self.peer_connector: Callable[[str], PeerClient] = peer_connector or _no_peers
        self.listener_factory = listener_factory
        self.engines: dict[EngineId, EngineSlot] = {}
        self.sessions = SessionTable()
        self.quota = QuotaBook(config.quota.limits())
        self.link_limits = config.quota.link_limits()
        self.link_attempts = AddressSlots(LINK_ATTEMPTS_PER_ADDRESS)   # every engine's links leave from one address
        self._retiring: dict[EngineId, EngineSlot] = {}   # finalizing: memory not yet freed, still counted
        self._finalizing: set[asyncio.Task[None]] = set()  # finalize_engine's tasks (referenced until done)
        # engine ids never repeat across daemon restarts: a client left over from the previous daemon
        # must get LLM_ENGINE_FINALIZED, never reach a new worker's engine that happens to get its id
        self._ids = itertools.count((secrets.randbits(32) << 16) + 1)
        # the daemon's one executor, shared fairly: one uid's local work, or one peer's owner calls, hold at
        # most [quota] threads_per_principal of its threads at once (guard/executor.py)
        self.threads = Threads(EXECUTOR_THREADS, config.quota.threads_per_principal)
        self.version = __version__
        self.streams = config.transport.streams
        self.heartbeat_seconds = config.peer.heartbeat_seconds
        self.liveness = Liveness(self.heartbeat_seconds)   # one heartbeat per peer daemon, for every engine's links
        self.started = time.monotonic()
        self._told_data_ports = False   # ``_note_data_host`` logs its warning once

    # ---- NodeContext -------------------------------------------------------------------------

    def local_links_at(self, address: str) -> LinkTable | None:
        for slot in self.engines.values():
            if any(_same_address(listener.address, address) for listener in slot.listeners()):
                return slot.links.table
        return None

    def principal(self, links: object) -> int:
        for slot in self.engines.values():
            if slot.links.table is links:
                return slot.uid
        return os.getuid()   # an engine being made or gone: the daemon's own

    # ---- the one read model (status RPCs, metrics, datadistctl) ---------------------------------------

    def snapshot(self, slots: Iterable[EngineSlot] | None = None) -> NodeView:
        """Frozen records of ``slots`` (default: every engine) and the node (``datadistd.ops.snapshot``)."""
        chosen = list(self.engines.values()) if slots is None else list(slots)
        return NodeView(self.version, self.backend.name, self.config.transport.name,
                        "mtls" if self.config.tls.enabled else "plaintext", time.monotonic() - self.started,
                        tuple(_engine_view(slot) for slot in chosen))

    # ---- engines -------------------------------------------------------------------------------

    def slot(self, engine_id: int) -> EngineSlot:
        slot = self.engines.get(EngineId(engine_id))
        if slot is None:
            raise DataDistError(StatusCode.LLM_ENGINE_FINALIZED,
                                f"engine {engine_id} is unknown to this daemon: finalized, or never created here "
                                "(`datadistctl status` lists the engines and their ids)")
        return slot

    def owned_slot(self, session: WorkerSession | None, engine_id: int) -> EngineSlot:
        """``engine_id`` if ``session`` created it; any other engine looks like one that does not exist."""
        slot = self.engines.get(EngineId(engine_id))
        if slot is None or session is None or slot.session is not session or session.closed:
            raise DataDistError(StatusCode.LLM_ENGINE_FINALIZED,
                                f"engine {engine_id} is unknown to this caller: no engine of that id was created with "
                                "its capability, or it was finalized (engines of other workers are seen on the admin "
                                "socket: `datadistctl status` as root or the daemon's user)")
        return slot

    async def end_session(self, session: WorkerSession) -> None:
        """The worker's attach connection closed: it exited or died; its engines go with it."""
        for engine_id in list(session.engines):
            if EngineId(engine_id) in self.engines:
                log.warning("engine %s: worker pid %s detached without finalize; releasing its caches", engine_id,
                            session.cred.pid)
                await self.finalize_engine(engine_id, reason="worker detached")
        session.engines.clear()

    def engine_device(self, options: EngineOptions) -> int:
        """The NPU of an engine, as this daemon's logical id: ``ge.exec.deviceId`` -- which the worker sends as the
        PHYSICAL id (its own logical ids are its own) -- mapped to this process's, else ``[memory] device_id``;
        checked when the memory backend is in NPU memory (``LLM_PARAM_INVALID`` naming the NPU it does not see)."""
        if not isinstance(self.backend, DeviceBackend):
            return options.npu if options.npu is not None else self.config.memory.device_id
        if options.npu is not None:
            return self.backend.local_device(options.npu)
        self.backend.check_device(self.config.memory.device_id)
        return self.config.memory.device_id

    def physical_device(self, device: int) -> int:
        """How this daemon's logical NPU ``device`` is named to a worker: its physical id (``device`` itself when
        the memory backend is not in NPU memory)."""
        return self.backend.physical(device) if isinstance(self.backend, DeviceBackend) else device

    def _make_pools(self, options: EngineOptions, device: int) -> dict[Placement, Pool]:
        pools: dict[Placement, Pool] = {}
        cap = self.config.memory.max_total_bytes
        in_use = sum(p.capacity for s in [*self.engines.values(), *self._retiring.values()]
                     for p in s.engine.pools.values())
        try:
            for placement, cfg in options.pools:
                if cap and in_use + cfg.memory_size > cap:
                    raise DataDistError(StatusCode.LLM_OUT_OF_MEMORY,
                                        f"a {placement.name} pool of {cfg.memory_size} bytes exceeds the node cap "
                                        f"([memory] max_total_bytes={cap}, {in_use} bytes in use)")
                if isinstance(self.backend, DeviceBackend):   # DEVICE pools on the engine's NPU
                    pools[placement] = self.backend.create_pool_on(device, placement, cfg.memory_size,
                                                                   cfg.page_shift)
                else:
                    pools[placement] = self.backend.create_pool(placement, cfg.memory_size, cfg.page_shift)
                in_use += cfg.memory_size
        except BaseException:
            for pool in pools.values():
                pool.close()
            raise
        return pools

    async def init_engine(self, cluster_id: int, role: Role, options: Mapping[str, str],
                          session: WorkerSession) -> EngineSlot:
        """A new engine owned by ``session``, booked to its uid."""
        if session.closed:
            raise DataDistError(StatusCode.LLM_ENGINE_FINALIZED, "this worker's attach connection is closed")
        opts = v1_engine_pool(parse_options(role, cluster_id, options), options)
        if opts.listen:
            self.check_listen_host(opts.listen[0])   # before any pool or socket is made
        # engines are keyed by engine id: several may share a cluster id (omni-infer's older manager gives
        # every prefill TP rank the same one); peers tell them apart by listen address (docs/choices.md)
        device = self.engine_device(opts)
        charge = self.quota.take(session.cred.uid, engines=1, pools=len(opts.pools))
        try:
            pools = self._make_pools(opts, device)
        except BaseException:
            charge.release()
            raise
        engine_id = EngineId(next(self._ids))
        engine = Engine(engine_id, opts, self.backend, pools, Lane(self.threads, f"uid {session.cred.uid}"))
        host = opts.listen[0] if opts.listen else self.config.transport.host
        settings = self.config.transport.settings(host, device, opts)
        try:
            transport = get_transport(self.config.transport.name, **settings,
                                      admission=self.config.peer.admission())
        except BaseException:
            engine.close()
            charge.release()
            raise
        try:
            _start_data_plane(transport, opts.listen)
            links = LinkManager(engine, transport, self)
            slot = EngineSlot(engine, links, transport, session, options=dict(options), device=device, charge=charge,
                              data_host=host)
            slot.comm = CommManager(links, lambda ip, port: self.ensure_listener(slot, ip, port),
                                    self.config.peer.default_port)
            if opts.listen:
                await self._listen(slot, *opts.listen)
        except BaseException:
            transport.stop()
            engine.close()
            charge.release()
            raise
        self.engines[engine_id] = slot
        session.engines.add(engine_id)
        if session.closed:  # the worker went while its engine was being made: it goes too
            await self.finalize_engine(engine_id, reason="worker detached during init")
            raise DataDistError(StatusCode.LLM_ENGINE_FINALIZED, "this worker's attach connection closed")
        links.start()
        log.info("engine %s up: cluster %s role %s pid %s uid %s listen=%s pools=%s", engine_id, cluster_id,
                 opts.role.name, slot.pid, slot.uid, slot.listen_address or "-",
                 {p.name: c.memory_size for p, c in opts.pools})
        self._note_data_host(engine_id, host)
        return slot

    def _note_data_host(self, engine_id: int, host: str) -> None:
        """Warn once per daemon: an engine serves its data plane off loopback with ``[transport] data_ports`` unset."""
        if self._told_data_ports or is_loopback(host) or self.config.transport.data_port_range() is not None:
            return
        self._told_data_ports = True
        log.warning("engine %s serves its data plane on %s at a port the kernel picks: [transport] data_ports is unset"
                    ", so no firewall rule can name it and a firewall between the nodes stops every link at its data "
                    "connection; set and open them (docs/operations.md \"Ports\"; said once)", engine_id, host)

    def check_listen_host(self, host: str) -> None:
        """Refuse a peer or data-plane listener other hosts can reach while the secret is the public one."""
        if not self.peer_secret.real and not is_loopback(host):
            raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                f"this daemon's peers authenticate with {self.peer_secret.source}, which is public, "
                                f"so it does not listen on {host} (a non-loopback address anyone could link to); "
                                f"{SECRET_FIX}")

    async def _listen(self, slot: EngineSlot, host: str, port: int) -> None:
        self.check_listen_host(host)
        if self.listener_factory is None:
            raise DataDistError(StatusCode.LLM_FEATURE_NOT_ENABLED, "this daemon cannot open peer listeners")
        await self._retired_address(_host_port(host, port))
        try:
            slot.listener = await self.listener_factory(host, port, slot)
        except DataDistError:
            raise
        except Exception as exc:  # bind errors and the like
            raise _unlistenable((host, port), str(exc)) from None

    async def _retired_address(self, address: str, timeout: float = RETIRING_WAIT_SECONDS) -> None:
        """Wait (at most ``timeout`` seconds) until no engine being finalized listens at ``address``: a worker
        restarted at once on its old listen address (its predecessor died or finalized) gets the address when
        the old engine lets it go (the first step of ``_finalize``), not "address already in use"."""
        deadline = time.monotonic() + timeout
        while any(_same_address(listener.address, address)
                  for old in self._retiring.values() for listener in old.listeners()):
            if time.monotonic() >= deadline:   # the bind below then says why
                return
            await asyncio.sleep(0.05)

    async def ensure_listener(self, slot: EngineSlot, host: str, port: int) -> None:
        """Make ``slot`` reachable at host:port (comm-domain links), in addition to its listen_ip_info."""
        address = _host_port(host, port)
        if any(_same_address(listener.address, address) for listener in slot.listeners()):
            return
        self.check_listen_host(host)
        other = self.local_links_at(address)
        if other is not None:
            raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                f"{address} already belongs to cluster {other.cluster_id} on this node")
        if self.listener_factory is None:
            raise DataDistError(StatusCode.LLM_FEATURE_NOT_ENABLED, "this daemon cannot open peer listeners")
        try:
            slot.extra_listeners.append(await self.listener_factory(host, port, slot))
        except DataDistError:
            raise
        except Exception as exc:
            raise DataDistError(StatusCode.LLM_LINK_FAILED, f"cannot listen on {address}: {exc}") from None

    async def finalize_engine(self, engine_id: int, reason: str = "finalize") -> None:
        """Remove the engine and everything it holds. The work is the node's, not the caller's: it runs in a task
        of its own to its end even when the caller is cancelled (a worker killed during its Finalize call, whose
        gRPC handler is then cancelled: the engine's listen address used to stay bound for good)."""
        eid = EngineId(engine_id)
        slot = self.engines.pop(eid, None)
        if slot is None:
            return
        slot.session.retire(eid)
        self._retiring[eid] = slot  # its pools count against the node cap until freed
        done = asyncio.get_running_loop().create_task(self._finalize(eid, slot, reason))
        self._finalizing.add(done)
        done.add_done_callback(self._finalized)
        await asyncio.shield(done)

    def _finalized(self, task: asyncio.Task[None]) -> None:
        self._finalizing.discard(task)
        if not task.cancelled() and task.exception() is not None:   # its caller may be gone: say it here
            log.error("finalize failed: %r", task.exception())

    async def _finalize(self, eid: EngineId, slot: EngineSlot, reason: str) -> None:
        try:
            for listener in slot.listeners():   # first: no new link, and a restarted worker gets its address back
                await listener.stop()
            slot.listener, slot.extra_listeners = None, []   # what _retired_address waits for
            if slot.comm is not None:
                await slot.comm.close()
            await slot.links.close()  # while the data channels still work: the peers are told (unlink calls)
            await slot.engine.drain(timeout=5.0)
            usage = slot.engine.registry.bytes_owned
            slot.engine.close()
        finally:
            self._retiring.pop(eid, None)
            if slot.charge is not None:
                slot.charge.release()
        log.info("engine %s (cluster %s) removed: %s; %d owned bytes returned", eid, slot.engine.cluster_id,
                 reason, usage)

    async def switch_role(self, engine_id: int, role: Role, options: Mapping[str, str]) -> None:
        slot = self.slot(engine_id)
        if not slot.engine.options.cache_manager:  # v1 (KvCacheManager mode) rules, docs/spec.md §4
            if slot.options.get("llm.EnableSwitchRole") != "1":
                raise DataDistError(StatusCode.LLM_FEATURE_NOT_ENABLED,
                                    "switch_role needs enable_switch_role=True (llm.EnableSwitchRole) at init")
            require(Role(role) != slot.engine.role, f"role not changed, role = {Role(role).name}")
            require(Role(role) != Role.PROMPT or bool(options.get("llm.listenIpInfo")),
                    'switching to Prompt needs option "llm.listenIpInfo"')
        if slot.links.all_links():
            raise DataDistError(StatusCode.LLM_EXIST_LINK,
                                f"cluster {slot.engine.cluster_id} has {len(slot.links.all_links())} links; "
                                f"unlink first")
        listen = options.get("llm.listenIpInfo")
        new = parse_listen(listen) if listen else None
        if slot.listener is not None and (new is None or not _same_address(slot.listener.address,
                                                                           f"{new[0]}:{new[1]}")):
            await slot.listener.stop()
            slot.listener = None
        if new is not None and slot.listener is None:
            self.check_listen_host(new[0])
            await self._serve_data_on(slot, *new)
            await self._listen(slot, *new)
        slot.engine.role = Role(role)
        log.info("engine %s switched role to %s listen=%s", engine_id, Role(role).name, slot.listen_address or "-")

    async def _serve_data_on(self, slot: EngineSlot, host: str, port: int) -> None:
        """switch_role listens on ``host``: the tcp data plane moves there when it serves elsewhere (an engine made
        without a listen address serves it on ``[transport] host``, loopback by default), so peers reach it where
        they reach the listener, through the ``[transport] data_ports`` a firewall opens. switch_role has checked
        that no link exists, so nothing uses the old one. The one-sided transports (nixl, hccl) keep theirs: their
        agents hold the engine's memory registrations."""
        if host == slot.data_host or self.config.transport.name != "tcp":
            return
        settings = self.config.transport.settings(host, slot.device, slot.engine.options)
        transport = get_transport(self.config.transport.name, **settings, admission=self.config.peer.admission())
        _start_data_plane(transport, (host, port))
        old, slot.transport, slot.data_host = slot.transport, transport, host
        slot.links.table.use_transport(transport)
        await slot.links.table.in_thread_of(UNMETERED, old.stop)
        log.info("engine %s: the data plane moved to %s with the listen address", slot.engine_id, host)
        self._note_data_host(slot.engine_id, host)

    async def close(self) -> None:
        for engine_id in list(self.engines):
            await self.finalize_engine(engine_id, reason="daemon stopping")
        # finalizes whose callers went (a worker killed during its Finalize) end before the memory backend does
        await asyncio.gather(*self._finalizing, return_exceptions=True)
        for session in self.sessions.sessions():
            self.sessions.close(session)
        self.backend.close()
        self.threads.shutdown()


#: v1 engine pool when ``ge.flowGraphMemMaxSize`` is absent (CANN's engine default is 10 GiB of device
#: memory; datadist reserves host shared memory up front, so it defaults lower -- see docs/choices.md)
V1_DEFAULT_POOL_BYTES = 1 << 30
V1_PAGE_SHIFT = 12


def v1_engine_pool(opts: EngineOptions, options: Mapping[str, str]) -> EngineOptions:
    """v1 (KvCacheManager mode) memory: ``ge.flowGraphMemMaxSize`` x ``llm.MemoryUtilization`` as the device pool.

    Only when no ``llm.MemPoolConfig`` gave one; ``llm.BufPoolCfg`` (v1 buffer tiers) is accepted and not
    needed: the pool allocator serves every size.
    """
    if opts.cache_manager or opts.pool(Placement.DEVICE) is not None:
        return opts
    raw = options.get("llm.MemoryUtilization", "0.95")
    try:
        utilization = float(raw)
    except ValueError:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                            f"option llm.MemoryUtilization={raw!r}: not a number") from None
    require(0 < utilization <= 1, f"option llm.MemoryUtilization={raw!r}: must be in (0, 1]")
    flow = options.get("ge.flowGraphMemMaxSize")
    total = int(flow) if flow else V1_DEFAULT_POOL_BYTES
    size = int(total * utilization)
    require(size >> V1_PAGE_SHIFT > 0, f"the v1 memory pool of {size} bytes (ge.flowGraphMemMaxSize x "
                                       f"llm.MemoryUtilization) is too small")
    return replace(opts, pools=(*opts.pools, (Placement.DEVICE, PoolConfig(size, V1_PAGE_SHIFT))))


def _unlistenable(listen: tuple[str, int], why: str) -> DataDistError:
    """The one refusal of a listen address (``llm.listenIpInfo``: init, switch_role) its peer listener or its data
    plane cannot bind: ``LLM_PARAM_INVALID`` naming the address and the cause."""
    address = _host_port(*listen)
    hint = f"; is {listen[0]} an address of this host?" if "assign requested address" in why else ""
    return DataDistError(StatusCode.LLM_PARAM_INVALID, f"cannot listen on {address} (llm.listenIpInfo): {why}{hint}")


def _start_data_plane(transport: Transport, listen: tuple[str, int] | None) -> None:
    """``transport.start()``; a bind failure on the engine's listen host refuses that address (``_unlistenable``)."""
    try:
        transport.start()
    except DataDistError as exc:
        if listen is None or exc.code != StatusCode.LLM_LINK_FAILED:
            raise
        raise _unlistenable(listen, exc.message) from None


def _host_port(host: str, port: int) -> str:
    """``host:port`` as listeners name their address (an IPv6 host in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _same_address(a: str, b: str) -> bool:
    return a.strip("[]") == b.strip("[]") or a.replace("[", "").replace("]", "") == b.replace("[", "").replace("]", "")


def _no_peers(address: str) -> PeerClient:
    raise DataDistError(StatusCode.LLM_FEATURE_NOT_ENABLED, f"no peer connector configured; cannot reach {address}")


def _engine_view(slot: EngineSlot) -> EngineView:
    engine = slot.engine
    links = tuple(LinkView(link.remote_cluster, link.state.value, link.transport, link.initiator, link.address,
                           link.data_endpoint, link.streams,
                           link.inflight, link.bytes_received, link.bytes_sent) for link in slot.links.all_links())
    listeners = []
    for kind, listener, address in [("data", slot.transport, ""),
                                    *[("peer", x, x.address) for x in slot.listeners()]]:
        if isinstance(listener, Admitting):
            books = listener.admission_stats()
            listeners.append(ListenerView(kind, address, books.get("preauth", 0), books.get("authenticated", 0),
                                          books.get("evicted", 0), books.get("expired", 0), books.get("refused", 0)))
    pools = tuple(PoolView(int(p), p.name, capacity, used) for p, capacity, used in engine.pool_usage())
    return EngineView(int(slot.engine_id), engine.cluster_id, int(engine.role), engine.role.name,
                      slot.listen_address, slot.pid, slot.uid, len(engine.registry.entries()), pools, links,
                      tuple(listeners))
