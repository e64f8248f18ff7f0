"""Strangers without the secret flood and churn a peer port (issue 27, attack 9); a legitimate link still gets in.

Challenges are limited per connection and per source, and the engine's challenge store keeps each live
connection's challenges (``peering.ChallengeStore``), so a flood from a few addresses evicts only its own. The
connection churn half (100 sources, ~4,000 connections/s) is proven on the admission books
(``tests/unit/test_admission.py``), where the rate is not at the mercy of a loaded test machine.
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from datadist.v1 import peer_pb2, peer_pb2_grpc
from datadistd.links.wire.peering import PROTOCOL_VERSION
from tests.reliability.common import PeerAgent

from .test_peer import P, _link_and_pull, pair  # noqa: F401 - pair: the prompt/decoder fixture

pytestmark = pytest.mark.integration


class _From:
    """A loopback relay whose connections reach ``port`` from the address ``source`` (a stranger elsewhere)."""

    def __init__(self, source: str, port: int) -> None:
        self.source, self.port = source, port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                inner, _ = self.listener.accept()
            except OSError:
                continue
            outer = socket.socket()
            outer.bind((self.source, 0))
            try:
                outer.connect(("127.0.0.1", self.port))
            except OSError:
                inner.close()
                outer.close()
                continue
            self._socks += [inner, outer]
            for a, b in ((inner, outer), (outer, inner)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.listener.close()
        for s in self._socks:
            s.close()


def _flood(address: str, channels: int, calls: int) -> int:
    """``channels`` connections each asking ``calls`` challenges at once; how many were granted."""
    request = peer_pb2.ChallengeRequest(protocol_version=PROTOCOL_VERSION, client_cluster_id=9, server_cluster_id=P)
    granted = 0
    chans = [grpc.insecure_channel(address) for _ in range(channels)]
    try:
        futures = [peer_pb2_grpc.PeerStub(ch).Challenge.future(request, timeout=30) for ch in chans
                   for _ in range(calls)]
        for f in futures:
            try:
                f.result()
                granted += 1
            except grpc.RpcError:
                pass
    finally:
        for ch in chans:
            ch.close()
    return granted


def test_9_a_challenge_flood_does_not_evict_a_legitimate_handshake(pair):  # noqa: F811
    d, port, prompt, decoder = pair
    legit = PeerAgent(f"127.0.0.1:{port}", 77, P)
    relays = [_From(f"127.0.0.{i}", port) for i in (2, 3, 4)]
    try:
        challenge = legit.challenge()                  # a linking peer got its challenge ...
        with ThreadPoolExecutor(3) as pool:            # ... then 3 sources x 8 connections x 64 streams flood
            granted = sum(pool.map(lambda r: _flood(r.address, 8, 64), relays))
        assert granted < 3 * 8 * 64 // 2, granted      # most refused: per connection and per source
        answer = legit.peer.Handshake(legit.offer(challenge), timeout=10)   # ... and its handshake still counts
        assert len(answer.link_nonce) == 16
        _link_and_pull(port, prompt, decoder)          # and a real link gets in too
    finally:
        legit.close()
        for r in relays:
            r.close()
    assert d.proc.poll() is None


def test_9_a_stranger_asking_the_wrong_cluster_learns_no_cluster_id(pair):  # noqa: F811
    _, port, prompt, decoder = pair
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        with pytest.raises(grpc.RpcError) as info:
            peer_pb2_grpc.PeerStub(ch).Challenge(peer_pb2.ChallengeRequest(
                protocol_version=PROTOCOL_VERSION, client_cluster_id=9, server_cluster_id=77), timeout=10)
    assert "77" in info.value.details() and f"cluster {P}" not in info.value.details(), info.value.details()
    _link_and_pull(port, prompt, decoder)


def test_9_a_challenge_over_the_budget_is_a_retry_later_the_linking_side_knows(pair):  # noqa: F811
    """Issue 37, item 1: past an address's challenge budget the front answers "retry later", and the linking
    daemon's peer client marks exactly that failure retryable (``links/setup.py`` retries it within its timeout).
    A connection's first challenge is outside the budget (``test_shared_address.py``): each asks two."""
    import asyncio

    from datadistd.api.grpc.peer_client import GrpcPeerClient
    from datadistd.core.errors import DataDistError

    _, port, prompt, decoder = pair
    relay = _From("127.0.0.5", port)         # an address that never proved the secret: a stranger's budget

    async def one() -> DataDistError | None:
        peer = GrpcPeerClient(relay.address)   # a connection of its own, as a linking daemon asks
        try:
            await peer.challenge(77, P, 10)    # a connection's first is served outside the address's budget ...
            await peer.challenge(77, P, 10)    # ... its second counts against it
            return None
        except DataDistError as exc:
            return exc
        finally:
            await peer.close()

    async def ask(n: int) -> tuple[list[DataDistError], float]:
        started, got = time.monotonic(), []
        for _ in range(n // 4):    # 4 at once: under the 8 pre-auth connections an address may hold
            got += await asyncio.gather(*(one() for _ in range(4)))
        return [exc for exc in got if exc is not None], time.monotonic() - started

    try:
        refused, took = asyncio.run(ask(60))
    finally:
        relay.close()
    assert refused and all(exc.retryable and exc.message.endswith("retry later") for exc in refused), \
        {(e.retryable, e.message) for e in refused}
    assert len(refused) >= 60 - 20 - 10 * took - 1, (len(refused), took)   # a burst of 20, then 10 a second
