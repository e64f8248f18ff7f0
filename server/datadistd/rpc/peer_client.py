"""``PeerClient`` over gRPC: calls one peer daemon's Peer service."""

from __future__ import annotations

import asyncio
from typing import Sequence

import grpc

from datadist.v1 import peer_pb2, peer_pb2_grpc

from ..core.errors import DataDistError, StatusCode
from ..core.types import CacheKeyRef, IdIndexRef, RemoteSpec
from ..peering import PROTOCOL_VERSION, HandshakeAnswer, HandshakeOffer
from ..reverse import ReverseCmd, ReverseReply, checked_ids
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
            raise error_from_rpc(err, f"{what} on {self.address}") from None

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
            raise DataDistError(exc.code, exc.message + self._tls_hint(exc.message)) from None
        return bytes(reply.challenge)

    async def handshake(self, offer: HandshakeOffer, timeout: float) -> HandshakeAnswer:
        try:
            answer = await self._call("handshake", self._stub.Handshake, convert.offer_to_pb(offer), timeout)
        except DataDistError as exc:
            raise DataDistError(exc.code, exc.message + self._tls_hint(exc.message)) from None
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

    async def read(self, session: bytes, transfer_id: int, spec: RemoteSpec, timeout: float) -> tuple[int, bool]:
        request = convert.spec_to_read_pb(session, transfer_id, spec, max(1, int(timeout * 1000)))
        resp = await self._call("read", self._stub.Read, request, timeout)
        return resp.bytes, resp.release_needed

    async def release(self, session: bytes, key: CacheKeyRef | IdIndexRef, tensor_start: int, tensor_count: int,
                      timeout: float) -> None:
        request = peer_pb2.ReleaseRequest(session=session, key=convert.key_to_pb(key), tensor_start=tensor_start,
                                          tensor_count=tensor_count)
        await self._call("release", self._stub.Release, request, timeout)

    async def open_write(self, session: bytes, specs: Sequence[RemoteSpec], timeout: float,
                         hold_ms: int = 0) -> list[int]:
        request = convert.specs_to_write_pb(session, specs, max(1, int(timeout * 1000)), hold_ms)
        resp = await self._call("open_write", self._stub.OpenWrite, request, timeout)
        return checked_ids(convert.ids_from_pb(resp), len(specs), f"the peer at {self.address}")

    async def commit_write(self, session: bytes, transfer_ids: Sequence[int], timeout: float) -> None:
        request = peer_pb2.CommitRequest(session=session, timeout_ms=max(1, int(timeout * 1000)),
                                         **convert.ids_to_pb(transfer_ids))
        await self._call("commit_write", self._stub.CommitWrite, request, timeout)

    async def unlink(self, session: bytes, timeout: float) -> None:
        await self._call("unlink", self._stub.Unlink, peer_pb2.SessionRef(session=session), timeout)

    async def ping(self, session: bytes, timeout: float) -> None:
        await self._call("ping", self._stub.Ping, peer_pb2.SessionRef(session=session), timeout)

    async def reverse(self, session: bytes) -> "GrpcReverseStream":
        """Open the reverse control path of a link (the linking side calls this once per link)."""
        call = self._stub.Reverse()
        try:
            await call.write(peer_pb2.ReverseReply(session=session))
        except grpc.RpcError as err:
            raise error_from_rpc(err, f"reverse on {self.address}") from None
        return GrpcReverseStream(call, self.address)

    async def close(self) -> None:
        await self._channel.close()


class GrpcReverseStream:
    """The linking side's end of ``Peer.Reverse``: commands in, replies out.

    Replies come from concurrent transfers; a grpc stream takes one write at a time (a second one
    while the first is in flight fails with ``TOO_MANY_OPERATIONS`` and kills the stream), so
    writes are serialised by a lock.
    """

    def __init__(self, call, address: str) -> None:  # noqa: ANN001
        self._call = call
        self._address = address
        self._write_lock = asyncio.Lock()

    async def commands(self):  # noqa: ANN201 - async iterator of ReverseCmd
        while True:
            try:
                msg = await self._call.read()
            except grpc.RpcError as err:
                raise error_from_rpc(err, f"reverse on {self._address}") from None
            if msg is grpc.aio.EOF:
                return
            try:
                cmd: ReverseCmd = convert.reverse_command_from_pb(msg)
            except DataDistError as exc:  # a call this daemon does not know: answer it, keep the stream
                await self.reply(ReverseReply(msg.command_id, int(exc.code), exc.message))
                continue
            yield cmd

    async def reply(self, reply: ReverseReply) -> None:
        try:
            async with self._write_lock:
                await self._call.write(convert.reverse_reply_to_pb(reply))
        except (grpc.RpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as err:
            raise DataDistError(StatusCode.LLM_LINK_FAILED, f"reverse reply to {self._address}: {err}") from None

    async def close(self) -> None:
        self._call.cancel()
