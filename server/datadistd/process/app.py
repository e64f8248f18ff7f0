"""``DaemonApp``: the daemon as an object — used by the ``datadistd`` command and by embedded mode.

``start()`` checks the socket directory (owned by the daemon's uid, writable by nobody else),
brings up the memory backend, the attach socket (worker identity from the kernel, memory as
descriptors), the worker socket and the admin socket (health NOT_SERVING until ready), the metrics
endpoint when ``[metrics] listen`` is set, then marks health SERVING; ``stop(grace)`` stops
accepting, drains in-flight calls for up to ``grace`` seconds, finalizes every engine (freeing its
memory), stops the metrics endpoint and removes the sockets it bound. It never takes over a socket a live
daemon serves (``sockfiles.claim``: exit 1) and never removes one it did not create.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from typing import Any, Callable

from grpc_health.v1 import health_pb2

from ..api.attach import AttachServer, attach_path
from ..api.grpc.server import (
    DATADIST_SERVICE,
    admin_path,
    create_worker_server,
    grpc_peer_connector,
    start_peer_listener,
)
from ..api.grpc.tls import PeerTls, TlsFiles
from ..guard.sockfiles import OwnedSocket, claim
from ..memory import backend_from_config
from ..memory.base import StaleCleanup
from ..node.node import Node
from ..ops.config import Config, secure_socket_dir
from ..ops.metrics import DaemonMetrics, MetricsServer, parse_listen_address
from ..ops.peersecret import PeerSecret

__all__ = ["DaemonApp"]

log = logging.getLogger(__name__)


class DaemonApp:
    def __init__(self, config: Config, on_ready: Callable[[], None] | None = None,
                 peer_secret: PeerSecret | None = None) -> None:
        """``peer_secret``: what peers must prove (default: as a standalone daemon reads it,
        ``datadistd.ops.peersecret``; embedded mode passes its own, which never falls back to the public one)."""
        self.config = config
        self.peer_secret = peer_secret
        self.node: Node | None = None
        self.server: Any = None          # grpc.aio.Server and its health servicer (rpc.server), once started
        self.health: Any = None
        self.admin_server: Any = None
        self.admin_health: Any = None
        self.attach: AttachServer | None = None
        self.on_ready = on_ready
        self.metrics = DaemonMetrics()
        self.metrics_server: MetricsServer | None = None
        self.tls: PeerTls | None = None
        self._sockets: list[OwnedSocket] = []
        self._stopped = asyncio.Event()

    @property
    def socket_path(self) -> str:
        return self.config.daemon.socket

    @property
    def target(self) -> str:
        return f"unix://{os.path.abspath(self.socket_path)}"

    async def start(self) -> None:
        cfg = self.config
        secure_socket_dir(self.socket_path)   # ConfigError (exit 2) before anything is bound
        # SocketInUse (exit 1) when a live daemon serves any of them; the files of a dead one are removed
        claim([self.socket_path, attach_path(self.socket_path), admin_path(self.socket_path)])
        # TLS files are checked first: a bad set stops the start before any memory is set up
        self.tls = (PeerTls(TlsFiles(cfg.tls.cert_file, cfg.tls.key_file, cfg.tls.ca_file), cfg.tls.server_name)
                    if cfg.tls.enabled else None)
        backend = backend_from_config(cfg.memory)
        if isinstance(backend, StaleCleanup):
            removed = backend.cleanup_stale(cfg.memory.shm_dir)
            if removed:
                log.info("removed %d stale shared-memory segments of dead daemons", len(removed))
        self.node = Node(cfg, backend=backend, peer_connector=grpc_peer_connector(self.tls),
                         listener_factory=functools.partial(start_peer_listener, tls=self.tls, metrics=self.metrics,
                                                            limits=cfg.peer.admission()),
                         peer_secret=self.peer_secret)
        self.metrics.attach(self.node)
        self.node.metrics = self.metrics
        if cfg.metrics.listen:
            try:
                await self._start_metrics(cfg.metrics.listen)
            except OSError:
                await self.node.close()
                raise
        self.attach = AttachServer(self.node, attach_path(self.socket_path), cfg.daemon.socket_mode, self.metrics,
                                   fast_pulls=cfg.daemon.fast_pulls)
        await self.attach.start()
        self.admin_server, self.admin_health, admin_socket = await create_worker_server(
            self.node, admin_path(self.socket_path), 0o600, metrics=self.metrics, admin=True)
        self._sockets.append(admin_socket)
        self.server, self.health, worker_socket = await create_worker_server(
            self.node, self.socket_path, cfg.daemon.socket_mode, metrics=self.metrics)
        self._sockets.append(worker_socket)
        for health in (self.health, self.admin_health):
            for name in ("", DATADIST_SERVICE):
                await health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("datadistd ready: socket=%s backend=%s transport=%s peers=%s metrics=%s", self.socket_path,
                 cfg.memory.backend, cfg.transport.name,
                 self.tls.describe() if self.tls is not None else "plaintext (HMAC-authenticated handshake)",
                 f"http://{self.metrics_server.address}/metrics" if self.metrics_server else "off")
        if log.isEnabledFor(logging.INFO):   # the fingerprint costs a slow hash: only when it is shown
            log.info("peers authenticate with %s", self.node.peer_secret.describe())
        if self.on_ready is not None:
            self.on_ready()

    async def _start_metrics(self, listen: str) -> None:
        try:
            host, port = parse_listen_address(listen)
        except ValueError as exc:
            raise OSError(str(exc)) from None
        server = MetricsServer(self.metrics, host, port)
        try:
            await server.start()
        except OSError as exc:
            raise OSError(f"cannot serve metrics on {listen}: {exc.strerror or exc}") from None
        self.metrics_server = server

    async def stop(self, grace: float | None = None) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        grace = self.config.daemon.drain_seconds if grace is None else grace
        for health in (self.health, self.admin_health):
            if health is not None:
                await health.enter_graceful_shutdown()
        if self.attach is not None:
            await self.attach.stop()   # the leases: each worker hears at once that its engine is released
        servers = [s for s in (self.server, self.admin_server) if s is not None]
        await asyncio.gather(*(s.stop(grace) for s in servers))
        if self.node is not None:
            await self.node.close()
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        for owned in self._sockets:
            owned.remove()
        log.info("datadistd stopped")
