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
           "offer_mac", "answer_mac", "data_token", "ChallengeStore", "Asker", "CHALLENGE_BYTES", "CHALLENGE_TTL_S",
           "AUTH_FAILED"]

#: how a serving daemon's refusal of a wrong secret begins (the linking daemon adds which secret it used)
AUTH_FAILED = "authentication failed: wrong or missing shared secret"

#: the peer protocol this daemon speaks: the Peer service's Challenge and Handshake, then everything else on the link's
#: data channel as fixed-layout frames (``ownerwire``); over a one-sided transport (nixl, hccl) the owner publishes
#: its remotely accessible caches to the link and a pull reads them with no owner call; over hccl each link has
#: communicators of its own, named by its token (docs/ascend.md). A peer of another version is refused at the
#: challenge and at the handshake.
PROTOCOL_VERSION = 9
CHALLENGE_BYTES = 32
#: how a serving engine's admission ends a refusal the linking side may retry within its deadline
#: (``api/grpc/front.py``; ``api/grpc/peer_client.py`` marks such a failure ``retryable``)
RETRY_LATER = "retry later"
#: how long an issued challenge may be answered (a handshake answers it within milliseconds)
CHALLENGE_TTL_S = 30.0
#: challenges outstanding per serving engine; past it those of closed connections are forgotten, else the oldest
MAX_CHALLENGES = 1024
#: outstanding challenges one connection may hold (what a pre-auth one may ask: ``challenges_per_connection``); its
#: oldest goes first
MAX_CHALLENGES_PER_ASKER = 4


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


class Asker(Protocol):
    """The connection a challenge was asked on (``admission.Ticket``): ``closed`` once it is gone."""

    closed: bool


class ChallengeStore:
    """The challenges one serving engine issued: each good once, for ``ttl`` seconds; at most ``per_asker``
    outstanding per connection that asked (its own oldest goes first) and ``cap`` in all.

    A challenge belongs to the connection it was asked on (``issue(asker)``: the front's admission ticket), and a
    linking daemon sends its handshake on that same connection, within milliseconds. So when the store is full,
    the challenges of connections that are gone go first -- every one of them, oldest to newest -- and only with none
    the oldest challenge. A flood, even from the honest peer's own address, evicts its own challenges and never the
    one of a live connection: live connections are what admission bounds (``max_preauth`` pre-auth connections of 4
    challenges at most each, well under ``cap``), and to take one away an attacker must have admission close it,
    by opening a source's ``proven_per_source`` newer connections within that peer's round trip, continuously.
    (An age floor alone would not do: an attacker asking challenges faster than the floor lets them age keeps the
    store full of fresh ones, and then a peer's next challenge is refused instead.) ``asker`` None (no front: a
    test) is nobody's connection, never gone.

    Nothing here survives the process, which is the point: an offer made over a challenge of an
    earlier daemon (or an earlier handshake) finds nothing to redeem. ``clock`` is injectable."""

    def __init__(self, ttl: float = CHALLENGE_TTL_S, cap: int = MAX_CHALLENGES,
                 per_asker: int = MAX_CHALLENGES_PER_ASKER, clock=time.monotonic) -> None:  # noqa: ANN001
        self.ttl = ttl
        self.cap = cap
        self.per_asker = per_asker
        self._clock = clock
        self._issued: OrderedDict[bytes, tuple[float, Asker | None]] = OrderedDict()  # challenge -> (expiry, asker)
        self._by_asker: dict[Asker, OrderedDict[bytes, None]] = {}

    def __len__(self) -> int:
        return len(self._issued)

    def issue(self, asker: Asker | None = None) -> bytes:
        now = self._clock()
        while self._issued and next(iter(self._issued.values()))[0] <= now:
            self._drop(next(iter(self._issued)))
        mine = self._by_asker.get(asker) if asker is not None else None
        if mine is not None and len(mine) >= self.per_asker:
            self._drop(next(iter(mine)))
        elif len(self._issued) >= self.cap:
            gone = [c for c, (_, who) in self._issued.items() if who is not None and who.closed]
            for c in gone or [next(iter(self._issued))]:
                self._drop(c)
        challenge = os.urandom(CHALLENGE_BYTES)
        self._issued[challenge] = (now + self.ttl, asker)
        if asker is not None:
            self._by_asker.setdefault(asker, OrderedDict())[challenge] = None
        return challenge

    def redeem(self, challenge: bytes) -> bool:
        """True once for a challenge issued here within the TTL; False for anything else."""
        entry = self._issued.get(bytes(challenge))
        if entry is None:
            return False
        self._drop(bytes(challenge))
        return entry[0] > self._clock()

    def _drop(self, challenge: bytes) -> None:
        _, asker = self._issued.pop(challenge)
        if asker is None:
            return
        mine = self._by_asker[asker]
        del mine[challenge]
        if not mine:
            del self._by_asker[asker]


class PeerClient(Protocol):
    """The handshake calls of one peer daemon's Peer service (a link closes it once its data channel is open).
    Failures raise ``DataDistError`` with the peer's code;
    an unreachable peer raises ``LLM_LINK_FAILED`` and a missed deadline ``LLM_TIMEOUT``."""

    address: str

    async def challenge(self, client: int, server: int, timeout: float) -> bytes: ...

    async def handshake(self, offer: HandshakeOffer, timeout: float) -> HandshakeAnswer: ...

    async def close(self) -> None: ...
