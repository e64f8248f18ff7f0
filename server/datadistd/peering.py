"""The daemon-to-daemon seam: records of the handshake and the ``PeerClient`` protocol.

``rpc/peer_client.py`` implements ``PeerClient`` over gRPC; tests may inject a fake. The
handshake authenticates both sides with HMAC-SHA256 over a shared secret (never sent): the
client proves it in the offer, the server in the answer; the data-plane token is derived
from the session, so it is neither fixed nor sent in clear over the control plane.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from dataclasses import dataclass
from typing import Protocol

from .core.types import CacheKeyRef, IdIndexRef, RemoteSpec

__all__ = ["PROTOCOL_VERSION", "HandshakeOffer", "HandshakeAnswer", "PeerClient", "make_offer", "offer_mac",
           "answer_mac", "data_token"]

PROTOCOL_VERSION = 1


@dataclass(frozen=True)
class HandshakeOffer:
    protocol_version: int
    client_cluster_id: int
    server_cluster_id: int
    nonce: bytes
    timestamp_ms: int
    mac: bytes
    client_version: str = ""


@dataclass(frozen=True)
class HandshakeAnswer:
    protocol_version: int
    server_cluster_id: int
    session: bytes
    data_endpoint: str
    streams: int
    mac: bytes
    server_version: str = ""


def offer_mac(secret: bytes, version: int, client: int, server: int, timestamp_ms: int, nonce: bytes) -> bytes:
    msg = f"datadist-offer|{version}|{client}|{server}|{timestamp_ms}|".encode() + nonce
    return hmac.new(secret, msg, hashlib.sha256).digest()


def answer_mac(secret: bytes, nonce: bytes, session: bytes, server: int, data_endpoint: str) -> bytes:
    msg = b"datadist-answer|" + nonce + b"|" + session + f"|{server}|{data_endpoint}".encode()
    return hmac.new(secret, msg, hashlib.sha256).digest()


def data_token(secret: bytes, session: bytes) -> bytes:
    return hmac.new(secret, b"datadist-data|" + session, hashlib.sha256).digest()


def make_offer(secret: bytes, client: int, server: int, version: str = "") -> HandshakeOffer:
    nonce = os.urandom(16)
    ts = int(time.time() * 1000)
    return HandshakeOffer(PROTOCOL_VERSION, client, server, nonce, ts,
                          offer_mac(secret, PROTOCOL_VERSION, client, server, ts, nonce), version)


class PeerClient(Protocol):
    """Calls on one peer daemon's Peer service. Failures raise ``DataDistError`` with the peer's code;
    an unreachable peer raises ``LLM_LINK_FAILED`` and a missed deadline ``LLM_TIMEOUT``."""

    address: str

    async def handshake(self, offer: HandshakeOffer, timeout: float) -> HandshakeAnswer: ...

    async def read(self, session: bytes, transfer_id: int, spec: RemoteSpec, timeout: float) -> tuple[int, bool]: ...

    async def release(self, session: bytes, key: CacheKeyRef | IdIndexRef, tensor_start: int, tensor_count: int,
                      timeout: float) -> None: ...

    async def open_write(self, session: bytes, spec: RemoteSpec, timeout: float) -> int: ...

    async def commit_write(self, session: bytes, transfer_id: int, timeout: float) -> None: ...

    async def unlink(self, session: bytes, timeout: float) -> None: ...

    async def ping(self, session: bytes, timeout: float) -> None: ...

    async def close(self) -> None: ...
