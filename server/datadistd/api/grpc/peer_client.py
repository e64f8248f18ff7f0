"""``PeerClient`` over gRPC: the handshake with one peer daemon's Peer service (``Challenge``, ``Handshake``)."""

from __future__ import annotations

import grpc

from datadist.v1 import peer_pb2, peer_pb2_grpc

from ...core.errors import DataDistError, StatusCode
from ...links.wire.peering import PROTOCOL_VERSION, RETRY_LATER, HandshakeAnswer, HandshakeOffer, check_version
from . import convert
from .errors import error_from_rpc

_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # a relink after the peer restarted must not inherit the old address's reconnect backoff
    ("grpc.use_local_subchannel_pool", 1),
]


class GrpcPeerClient:
    def __init__(self, address: str, credentials: grpc.ChannelCredentials | None = None,
                 options: list[tuple[str, str]] | None = None) -> None:
        self.address = address
        self.tls = credentials is not None
        opts = [*_OPTIONS, *(options or [])]
        self._channel = (grpc.aio.secure_channel(address, credentials, options=opts) if credentials is not None
                         else grpc.aio.insecure_channel(address, options=opts))
        self._stub = peer_pb2_grpc.PeerStub(self._channel)

    async def _call(self, what: str, method, request, timeout: float):  # noqa: ANN001, ANN202
        if timeout <= 0:
            raise DataDistError(StatusCode.LLM_TIMEOUT, f"{what} on {self.address}: deadline already passed")
        try:
            return await method(request, timeout=timeout, wait_for_ready=False)
        except grpc.RpcError as err:
            exc = error_from_rpc(err, f"{what} on {self.address}")
            exc.retryable = exc.message.endswith(RETRY_LATER)   # the peer's admission: again within the deadline
            raise exc from None

    async def challenge(self, client: int, server: int, timeout: float) -> bytes:
        try:
            reply = await self._call("handshake", self._stub.Challenge,
                                     peer_pb2.ChallengeRequest(protocol_version=PROTOCOL_VERSION,
                                                               client_cluster_id=client, server_cluster_id=server),
                                     timeout)
        except DataDistError as exc:
            if "Method not found" in exc.message or "UNIMPLEMENTED" in exc.message:
                raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                    f"protocol version mismatch: the peer at {self.address} speaks protocol 1 (no "
                                    f"Challenge); this daemon speaks v{PROTOCOL_VERSION} -- upgrade it") from None
            raise DataDistError(exc.code, exc.message + self._tls_hint(exc.message), exc.retryable) from None
        check_version(reply.protocol_version, f"the peer at {self.address}")
        return bytes(reply.challenge)

    async def handshake(self, offer: HandshakeOffer, timeout: float) -> HandshakeAnswer:
        try:
            answer = await self._call("handshake", self._stub.Handshake, convert.offer_to_pb(offer), timeout)
        except DataDistError as exc:
            raise DataDistError(exc.code, exc.message + self._tls_hint(exc.message), exc.retryable) from None
        return convert.answer_from_pb(answer)

    def _tls_hint(self, message: str) -> str:
        """Name the likely cause of a TLS mismatch: grpc only says the socket closed or the handshake failed."""
        if not self.tls and "Socket closed" in message:
            return "; if the peer has [tls] enabled, enable [tls] on this node too"
        if self.tls and ("WRONG_VERSION_NUMBER" in message or "Tls handshake failed" in message
                         or "Hostname Verification" in message):
            return "; check that both nodes' certificates chain to each other's [tls] ca_file, that the peer's " \
                   "certificate names the address dialled (or set [tls] server_name) and that the peer has [tls] " \
                   "enabled"
        return ""

    async def close(self) -> None:
        await self._channel.close()
