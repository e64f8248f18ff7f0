"""The daemon-to-daemon seam: records of the handshake and the ``PeerClient`` protocol.

The Peer service is what happens before a link's data channel exists: ``Challenge``, then ``Handshake``.
Everything after it travels as frames on the authenticated data channel (``ownercalls``).
``api/grpc/peer_client.py`` implements ``PeerClient`` over gRPC; tests may inject a fake. The
handshake authenticates both sides with HMAC-SHA256 over a shared secret (never sent): the
client proves it in the offer, the server in the answer; the data-plane token is derived
from the link nonce, so it is neither fixed nor sent in clear over the control plane.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

from ...core.errors import DataDistError, StatusCode

__all__ = ["PROTOCOL_VERSION", "HandshakeOffer", "HandshakeAnswer", "PeerClient", "make_offer", "check_version",
           "offer_mac", "answer_mac", "data_token", "ChallengeStore", "CHALLENGE_BYTES", "CHALLENGE_TTL_S",
           "AUTH_FAILED"]

#: how a serving daemon's refusal of a wrong secret begins (the linking daemon adds which secret it used)
AUTH_FAILED = "authentication failed: wrong or missing shared secret"

#: 1: the linking side's own nonce and timestamp; 2: the serving side issues the challenge; 3: after the
#: handshake the data channel carries everything (owner calls, unlink, liveness): the Peer service has only
#: Challenge and Handshake; 4: reads and every reply are fixed-layout frames (``ownerwire``), a small read answered
#: with its bytes in the reply; 5: owner calls carry no session (the data channel is the link's); 6: every owner
#: call is a fixed-layout frame too (``ownerwire``: one encoding; ``peer.proto``'s ``OwnerCall`` is gone); 7: over nixl
#: the owner publishes its remotely accessible caches to the link (``P`` / ``W`` messages, ``onesided.tables``) and
#: a pull reads them with no owner call (``grant_read`` / ``done_read`` stay for hccl only); 8: over hccl each link
#: has communicators of its own, named by the link's token (docs/ascend.md, "Communicators and relinks"): a peer of 7
#: would never meet them in Prepare. A peer of another version is refused at the challenge and at the handshake.
PROTOCOL_VERSION = 8
CHALLENGE_BYTES = 32
#: how a serving engine's admission ends a refusal the linking side may retry within its deadline
#: (``api/grpc/front.py``; ``api/grpc/peer_client.py`` marks such a failure ``retryable``)
RETRY_LATER = "retry later"
#: how long an issued challenge may be answered (a handshake answers it within milliseconds)
CHALLENGE_TTL_S = 30.0
#: challenges outstanding per serving engine; past it the oldest is forgotten
MAX_CHALLENGES = 1024
#: outstanding challenges one source (an address, an IPv6 /64) may hold; its oldest goes first
MAX_CHALLENGES_PER_SOURCE = 16


@dataclass(frozen=True)
class HandshakeOffer:
    protocol_version: int
    client_cluster_id: int
    server_cluster_id: int
    challenge: bytes           # issued by the serving engine (Peer/Challenge), single use
    timestamp_ms: int          # informational since protocol 2 (freshness is the challenge's)
    mac: bytes
    client_version: str = ""
    daemon_id: bytes = b""     # the linking daemon (``Liveness``), covered by the mac


@dataclass(frozen=True)
class HandshakeAnswer:
    protocol_version: int
    server_cluster_id: int
    link_nonce: bytes
    data_endpoint: str
    streams: int
    mac: bytes
    server_version: str = ""
    daemon_id: bytes = b""     # the serving daemon (``Liveness``), covered by the mac


def check_version(version: int, who: str) -> None:
    """Refuse a peer of another protocol version (``LLM_LINK_FAILED`` naming both versions): no legacy path."""
    if version != PROTOCOL_VERSION:
        raise DataDistError(StatusCode.LLM_LINK_FAILED,
                            f"protocol version mismatch: {who} speaks v{version}, this daemon v{PROTOCOL_VERSION}; "
                            f"run the same datadist version on both nodes")


def offer_mac(secret: bytes, version: int, client: int, server: int, timestamp_ms: int, challenge: bytes,
              daemon_id: bytes = b"") -> bytes:
    """The offer's MAC: every field but the informational client version (the daemon id since protocol 7)."""
    msg = f"datadist-offer|{version}|{client}|{server}|{timestamp_ms}|".encode() + challenge + b"|" + daemon_id
    return hmac.new(secret, msg, hashlib.sha256).digest()


def answer_mac(secret: bytes, challenge: bytes, link_nonce: bytes, server: int, data_endpoint: str,
               daemon_id: bytes = b"") -> bytes:
    """The answer's MAC over the offer's challenge: every field but the stream count and the version."""
    msg = (b"datadist-answer|" + challenge + b"|" + link_nonce + f"|{server}|{data_endpoint}|".encode()
           + daemon_id)
    return hmac.new(secret, msg, hashlib.sha256).digest()


def data_token(secret: bytes, link_nonce: bytes) -> bytes:
    return hmac.new(secret, b"datadist-data|" + link_nonce, hashlib.sha256).digest()


def make_offer(secret: bytes, client: int, server: int, challenge: bytes, version: str = "",
               daemon_id: bytes = b"") -> HandshakeOffer:
    """The linking side's offer over ``challenge`` (what the serving engine's ``Peer/Challenge`` returned)."""
    ts = int(time.time() * 1000)
    return HandshakeOffer(PROTOCOL_VERSION, client, server, challenge, ts,
                          offer_mac(secret, PROTOCOL_VERSION, client, server, ts, challenge, daemon_id), version,
                          daemon_id)


class ChallengeStore:
    """The challenges one serving engine issued: each good once, for ``ttl`` seconds; at most ``cap`` in all
    and ``per_source`` per source (``admission.source_key``: an address, an IPv6 /64).

    Fair across sources: a source over its share loses its own oldest challenge; over the total, the
    source holding most loses its oldest (among equals, the one that asked last: the busy one). So a
    flood only ever evicts the flooders' own, and a legitimate peer's challenge -- one, redeemed
    within milliseconds -- survives it.

    Nothing here survives the process, which is the point: an offer made over a challenge of an
    earlier daemon (or an earlier handshake) finds nothing to redeem. ``clock`` is injectable."""

    def __init__(self, ttl: float = CHALLENGE_TTL_S, cap: int = MAX_CHALLENGES,
                 per_source: int = MAX_CHALLENGES_PER_SOURCE, clock=time.monotonic) -> None:  # noqa: ANN001
        self.ttl = ttl
        self.cap = cap
        self.per_source = per_source
        self._clock = clock
        self._issued: OrderedDict[bytes, tuple[float, str, int]] = OrderedDict()  # challenge -> (expiry, source, n)
        self._count = 0
        self._by_source: dict[str, OrderedDict[bytes, None]] = {}

    def __len__(self) -> int:
        return len(self._issued)

    def issue(self, source: str = "") -> bytes:
        now = self._clock()
        while self._issued and next(iter(self._issued.values()))[0] <= now:
            self._drop(next(iter(self._issued)))
        mine = self._by_source.get(source)
        if mine is not None and len(mine) >= self.per_source:
            self._drop(next(iter(mine)))
        elif len(self._issued) >= self.cap:
            heaviest = max(self._by_source.values(),
                           key=lambda mine: (len(mine), self._issued[next(reversed(mine))][2]))
            self._drop(next(iter(heaviest)))
        challenge = os.urandom(CHALLENGE_BYTES)
        self._count += 1
        self._issued[challenge] = (now + self.ttl, source, self._count)
        self._by_source.setdefault(source, OrderedDict())[challenge] = None
        return challenge

    def redeem(self, challenge: bytes) -> bool:
        """True once for a challenge issued here within the TTL; False for anything else."""
        entry = self._issued.get(bytes(challenge))
        if entry is None:
            return False
        self._drop(bytes(challenge))
        return entry[0] > self._clock()

    def _drop(self, challenge: bytes) -> None:
        _, source, _ = self._issued.pop(challenge)
        mine = self._by_source[source]
        del mine[challenge]
        if not mine:
            del self._by_source[source]


class PeerClient(Protocol):
    """The handshake calls of one peer daemon's Peer service (a link closes it once its data channel is open).
    Failures raise ``DataDistError`` with the peer's code;
    an unreachable peer raises ``LLM_LINK_FAILED`` and a missed deadline ``LLM_TIMEOUT``."""

    address: str

    async def challenge(self, client: int, server: int, timeout: float) -> bytes: ...

    async def handshake(self, offer: HandshakeOffer, timeout: float) -> HandshakeAnswer: ...

    async def close(self) -> None: ...
