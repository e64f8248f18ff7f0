"""A stranger on an honest peer's own address (issue 44, attack 5): without the secret, loops asking challenges
from 127.0.0.1 -- the address the honest decoder daemon links from, proven by its first link -- while that daemon
links, pulls and unlinks. Every one of its links gets in: the stranger's challenges never evict the honest one's
within its handshake (each connection's challenges are its own, ``peering.ChallengeStore``), and each pre-auth
connection's first challenge is served outside the address's shared rate bucket (``Admission.allow_challenge``),
which the flood keeps empty. Before, the honest challenge was the first one evicted under its own address's flood,
and its first challenge waited in the drained bucket: the links failed."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from datadist.v1 import peer_pb2, peer_pb2_grpc
from datadistd.links.wire.peering import PROTOCOL_VERSION
from tests.daemonproc import DaemonProcess, free_port
from tests.harness import Worker

from .test_peer import BLOCK_SHAPE, BLOCKS, TENSORS

pytestmark = pytest.mark.integration

P, D = 1, 2
LOOPS = 24          # flooding threads, each: a connection of its own, its 4 challenges, closed, again
LINKS = 5           # the honest daemon's link / pull / unlink rounds under the flood
FLOOD_S = 60.0      # the flood's own bound (it is stopped as soon as the links are done)


class Flood:
    """``LOOPS`` threads asking challenges of ``address`` until stopped: granted and refused counted."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.granted = self.refused = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(LOOPS)]

    def __enter__(self) -> "Flood":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(15)
        assert not any(t.is_alive() for t in self._threads)

    def _loop(self) -> None:
        request = peer_pb2.ChallengeRequest(protocol_version=PROTOCOL_VERSION, client_cluster_id=9,
                                            server_cluster_id=P)
        end = time.monotonic() + FLOOD_S
        while not self._stop.is_set() and time.monotonic() < end:
            with grpc.insecure_channel(self.address, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
                stub = peer_pb2_grpc.PeerStub(ch)
                for _ in range(4):                       # what one pre-auth connection may ask
                    try:
                        stub.Challenge(request, timeout=5)
                        ok = True
                    except grpc.RpcError:
                        ok = False
                    with self._lock:
                        self.granted += ok
                        self.refused += not ok


def test_a_stranger_flooding_from_a_peers_address_does_not_keep_the_peer_out():
    port = free_port()
    serving, linking = DaemonProcess("shared-p").start(), DaemonProcess("shared-d").start()
    prompt, decoder = Worker({"DATADIST_DAEMON": serving.target}), Worker({"DATADIST_DAEMON": linking.target})
    try:
        prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True, mem_pool=1 << 20)
        prompt.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE, model_id=0)
        prompt.call("fill", "kv", 7)
        decoder.call("init", "DECODER", D, mem_pool=1 << 20)
        decoder.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE)
        want = prompt.call("rows", "kv", None, [1, 2, 3])

        def link_pull_unlink() -> tuple[int, list[int]]:
            got = decoder.call("link", P, "127.0.0.1", port, timeout=5000)
            if got == (0, [0]):
                decoder.call("zero", "kv")
                decoder.call("pull_blocks", P, "kv", [1, 2, 3], [5, 6, 7])
                assert (decoder.call("rows", "kv", None, [5, 6, 7]) == want).all()
                assert decoder.call("unlink", P, "127.0.0.1", port)[0] == 0
            return got

        assert link_pull_unlink() == (0, [0])          # the address is proven: a live, recent link
        with Flood(f"127.0.0.1:{port}") as flood:
            deadline = time.monotonic() + 60
            while not flood.refused:   # the attack's start: the address's bucket drained, the stranger refused
                assert time.monotonic() < deadline and serving.proc.poll() is None, (flood.granted, flood.refused)
                time.sleep(0.05)
            results = [link_pull_unlink() for _ in range(LINKS)]
        assert results == [(0, [0])] * LINKS, results
        assert serving.proc.poll() is None and linking.proc.poll() is None
    finally:
        for w in (prompt, decoder):
            w.close()
        for d in (serving, linking):
            d.discard()
