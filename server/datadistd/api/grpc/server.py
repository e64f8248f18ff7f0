"""The one seam that builds gRPC servers: the worker socket (DataDist + health + reflection) and
the per-engine Peer listeners (Peer + health + reflection)."""

from __future__ import annotations

import logging
import os

import grpc
from google.protobuf import message_factory
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from datadist.v1 import datadist_pb2, datadist_pb2_grpc, peer_pb2

from ...guard.admission import AdmissionLimits
from ...guard.sockfiles import OwnedSocket, publish, staging_path
from ...node.node import EngineSlot, Node
from ...ops.metrics import DaemonMetrics
from .datadist_servicer import DataDistServicer
from .front import PeerFront
from .peer_client import GrpcPeerClient
from .peer_servicer import PeerServicer
from .tls import PeerTls

__all__ = ["create_worker_server", "PeerListener", "start_peer_listener", "grpc_peer_connector", "SERVER_OPTIONS",
           "ADMIN_SUFFIX", "admin_path"]

log = logging.getLogger(__name__)

SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.so_reuseport", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
]

#: the admin socket is the worker socket's path plus this (mode 0600)
ADMIN_SUFFIX = ".admin"


def admin_path(worker_socket: str) -> str:
    return worker_socket + ADMIN_SUFFIX


DATADIST_SERVICE = datadist_pb2.DESCRIPTOR.services_by_name["DataDist"].full_name
PEER_SERVICE = peer_pb2.DESCRIPTOR.services_by_name["Peer"].full_name


def _health(server: grpc.aio.Server, services: list[str]) -> health.aio.HealthServicer:
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    reflection.enable_server_reflection([*services, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    return servicer


async def create_worker_server(node: Node, socket_path: str, mode: int = 0o660, metrics: DaemonMetrics | None = None,
                               admin: bool = False) -> tuple[grpc.aio.Server, health.aio.HealthServicer, OwnedSocket]:
    """The DataDist server on a unix socket; health stays NOT_SERVING until the caller sets SERVING.

    ``admin``: the whole-node view (every engine) -- only on a socket of mode 0600 (see ``DataDistServicer``).
    The caller checked the directory (``config.secure_socket_dir``) and that no live daemon serves the path
    (``sockfiles.claim``). gRPC replaces whatever is at the path it binds and unlinks that path when it
    stops, so it binds a private name that ``sockfiles.publish`` links to ``socket_path`` (never over an
    existing file): the socket the daemon removes at stop (``OwnedSocket.remove``) is only ever its own."""
    server = grpc.aio.server(options=SERVER_OPTIONS)
    servicer = DataDistServicer(node, socket_path[:-len(ADMIN_SUFFIX)] if admin else socket_path, metrics, admin)
    datadist_pb2_grpc.add_DataDistServicer_to_server(servicer, server)
    health_servicer = _health(server, [DATADIST_SERVICE])
    for name in ("", DATADIST_SERVICE):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    private = staging_path(socket_path)
    if server.add_insecure_port(f"unix:{private}") == 0:
        raise OSError(f"cannot bind the worker socket {socket_path}")
    await server.start()
    try:
        os.chmod(private, mode)
        owned = publish(private, socket_path)
    except OSError:
        await server.stop(0)
        raise
    return server, health_servicer, owned


class PeerListener:
    """A Peer service on one engine's ``listen_ip_info`` address: ``front`` owns the address (admission),
    ``server`` answers on a private loopback port behind it (see ``api/grpc/front.py``)."""

    def __init__(self, server: grpc.aio.Server, address: str, front: PeerFront) -> None:
        self.server = server
        self.address = address
        self.front = front

    def admission_stats(self) -> dict[str, int]:
        return self.front.admission.stats()

    async def stop(self) -> None:
        await self.front.stop()
        await self.server.stop(grace=0.5)


#: an unauthenticated request (Challenge, Handshake) is a few dozen bytes; more is refused before it is parsed
MAX_UNAUTHENTICATED_BYTES = 4 << 10
UNAUTHENTICATED_METHODS = ("Challenge", "Handshake")
#: what an authenticated peer request needs at most: a block list of MAX_LIST (2**20) varints of <= 10 bytes
PEER_MAX_MESSAGE = 16 << 20
PEER_SERVER_OPTIONS = [*[(k, v) for k, v in SERVER_OPTIONS if k != "grpc.max_receive_message_length"],
                       ("grpc.max_receive_message_length", PEER_MAX_MESSAGE)]


class Oversized:
    """What an unauthenticated request larger than ``MAX_UNAUTHENTICATED_BYTES`` deserializes to: refused unparsed."""

    limit = MAX_UNAUTHENTICATED_BYTES

    def __init__(self, size: int) -> None:
        self.size = size


def _bounded(parse):  # noqa: ANN001, ANN202
    def bounded(data: bytes):  # noqa: ANN202
        return Oversized(len(data)) if len(data) > MAX_UNAUTHENTICATED_BYTES else parse(data)

    return bounded


_NOT_VIA_FRONT = "connect to the engine's peer port: this private port serves only its front"


def _gated(handler, front: PeerFront):  # noqa: ANN001, ANN202
    """Refuse calls that did not come through ``front`` (Handshake authenticates its connection there, in the
    servicer, once it succeeded)."""
    async def unary(request, context):  # noqa: ANN001, ANN202
        if not front.admitted(context.peer()):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, _NOT_VIA_FRONT)
        return await handler(request, context)

    return unary


def _peer_handlers(servicer: PeerServicer, front: PeerFront) -> grpc.GenericRpcHandler:
    """The Peer service's method handlers, built from its descriptor; unauthenticated requests are bounded."""
    handlers = {}
    for method in peer_pb2.DESCRIPTOR.services_by_name["Peer"].methods:
        parse = message_factory.GetMessageClass(method.input_type).FromString
        if method.name in UNAUTHENTICATED_METHODS:
            parse = _bounded(parse)
        serialize = message_factory.GetMessageClass(method.output_type).SerializeToString
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(_gated(getattr(servicer, method.name), front),
                                                                    request_deserializer=parse,
                                                                    response_serializer=serialize)
    return grpc.method_handlers_generic_handler(PEER_SERVICE, handlers)


async def start_peer_listener(host: str, port: int, slot: EngineSlot, tls: PeerTls | None = None,
                              metrics: DaemonMetrics | None = None,
                              limits: AdmissionLimits | None = None) -> PeerListener:
    """Peer + health + reflection on ``host:port`` behind a ``PeerFront`` (connection caps, pre-auth
    deadline); with ``tls`` only clients with a certificate get in."""
    server = grpc.aio.server(options=PEER_SERVER_OPTIONS)
    front = PeerFront(0, limits)
    server.add_generic_rpc_handlers((_peer_handlers(PeerServicer(slot, metrics, front), front),))
    health_servicer = _health(server, [PEER_SERVICE])
    bind_host = f"[{host}]" if ":" in host else host
    private = (server.add_secure_port("127.0.0.1:0", tls.server_credentials()) if tls is not None
               else server.add_insecure_port("127.0.0.1:0"))
    if private == 0:
        raise OSError("cannot open the private loopback port of the peer listener")
    front.inner_port = private
    await server.start()
    try:
        bound = await front.start(host, port)
    except OSError as exc:
        await server.stop(grace=None)
        raise OSError(exc.errno, exc.strerror or str(exc)) from None   # the node says where
    for name in ("", PEER_SERVICE):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    actual = f"{bind_host}:{bound}"
    log.info("cluster %s listening for peers on %s (%s)", slot.engine.cluster_id, actual,
             "mutual TLS" if tls is not None else "plaintext")
    return PeerListener(server, actual, front)


def grpc_peer_connector(tls: PeerTls | None = None):  # noqa: ANN201
    """address -> ``GrpcPeerClient``; with ``tls`` every new link dials with the current certificate files."""
    def connect(address: str) -> GrpcPeerClient:
        if tls is None:
            return GrpcPeerClient(address)
        return GrpcPeerClient(address, tls.channel_credentials(), tls.channel_options())

    return connect
