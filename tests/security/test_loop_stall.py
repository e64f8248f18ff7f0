"""One authenticated peer cannot stall the daemon's event loop (issue 44, attack 3).

The other end of a link (a ``PeerAgent``: the right secret, a data connection of its own) keeps six READ calls of
2^20 blocks in flight -- 8 MiB frames, the most a call may name, every block in range but the last -- and sends the
next as soon as one is refused. Meanwhile an honest daemon linked to the same engine pulls from it (its heartbeat
every second, a link broken after 1 s without an answer) and the engine's own worker copies blocks. Each READ is
refused with ``LLM_PARAM_INVALID``; the honest link stays up, every pull and copy succeeds.

Before, the event loop decoded each frame and walked its 2^20 blocks in Python to name the bad one (~0.2 s a frame,
64 frames a turn): the honest daemon's pings went unanswered past its deadline, its link broke and its pulls failed.
Now a frame over ``links.calls._OFF_LOOP`` bytes is decoded on the peer's share of the daemon's threads, its block
list carries its bounds (``core.types.BlockList``: the refusal is a bisection), and a turn of the loop takes at most
``_DRAIN_BYTES`` of frames it decodes itself.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from datadist.status import LLMStatusCode
from datadistd.core.types import BlocksKeyRef, ReadMode, RemoteSpec
from datadistd.links.wire import ownerwire
from datadistd.links.wire.ownercalls import PingCmd, ReadCmd
from tests.daemonproc import DaemonProcess, free_port
from tests.harness import Worker
from tests.reliability.common import CallFailed, PeerAgent, links

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

P, D, HOSTILE = 1, 2, 66
TENSORS, BLOCKS, BLOCK_SHAPE = 2, 16, (8, 64)
IN_FLIGHT, ROUNDS, ATTACK_SECONDS = 6, 4, 30


def _maximal_read() -> bytes:
    """A READ of ``MAX_BLOCKS`` blocks (an 8 MiB frame), each in range but the last: refused only once the last one
    is looked at."""
    blocks = np.random.default_rng(7).integers(0, BLOCKS, ownerwire.MAX_BLOCKS).tolist()
    blocks[-1] = BLOCKS
    block_bytes = int(np.prod(BLOCK_SHAPE)) * 2
    spec = RemoteSpec(BlocksKeyRef(P, 0), ReadMode.BLOCKS, tuple(blocks), -1, 0, 0, 0,
                      TENSORS * len(blocks) * block_bytes)
    return ownerwire.encode_call(ReadCmd(0, 1, spec, 10_000))


def _attack(agent: PeerAgent, frame: bytes, stop_at: float, refused: list, other: list) -> None:
    """One call in flight at a time, ``ROUNDS`` of them at most, none sent after ``stop_at``."""
    for _ in range(ROUNDS):
        if time.monotonic() >= stop_at:
            return
        try:
            agent.call_raw(frame, timeout=max(1.0, stop_at - time.monotonic()))
            other.append("answered with success")
        except CallFailed as exc:
            (refused if exc.status == LLMStatusCode.LLM_PARAM_INVALID else other).append(exc.status)


def _repeat(work, done: threading.Event, failures: list, count: list) -> None:
    """``work`` until ``done``; ``count``: calls that succeeded, and the slowest (seconds, printed only)."""
    while not done.is_set():
        try:
            began = time.monotonic()
            work()
            count[0] += 1
            count[1] = max(count[1], time.monotonic() - began)
        except Exception as exc:  # noqa: BLE001 - every failure is the test's finding
            failures.append(repr(exc)[:300])
        done.wait(0.05)


def test_a_peer_sending_maximal_reads_stalls_neither_an_honest_link_nor_a_tenant() -> None:
    port = free_port()
    owner_daemon = DaemonProcess("stall-owner").start()
    honest_daemon = DaemonProcess("stall-honest", env={"DATADISTD_PEER_HEARTBEAT_SECONDS": "1"}).start()
    tenant = Worker({"DATADIST_DAEMON": owner_daemon.target})
    honest = Worker({"DATADIST_DAEMON": honest_daemon.target})
    hostile = PeerAgent(f"127.0.0.1:{port}", HOSTILE, P)
    try:
        tenant.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True, mem_pool=1 << 20)
        tenant.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE, model_id=0)
        tenant.call("fill", "kv", 7)
        honest.call("init", "DECODER", D, mem_pool=1 << 20)
        honest.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE)
        assert honest.call("link", P, "127.0.0.1", port) == (0, [0])
        hostile.handshake(streams=1)
        hostile.call(PingCmd(0), timeout=10)

        frame = _maximal_read()
        refused: list = []
        other: list = []
        done = threading.Event()
        pull_failures: list = []
        copy_failures: list = []
        pulls, copies = [0, 0.0], [0, 0.0]
        stop_at = time.monotonic() + ATTACK_SECONDS
        attackers = [threading.Thread(target=_attack, args=(hostile, frame, stop_at, refused, other), daemon=True)
                     for _ in range(IN_FLIGHT)]
        watchers = [
            threading.Thread(target=_repeat, daemon=True, args=(
                lambda: honest.call("pull_blocks", P, "kv", [1, 2, 3], [5, 6, 7], timeout=30), done, pull_failures,
                pulls)),
            threading.Thread(target=_repeat, daemon=True, args=(
                lambda: tenant.call("copy_blocks", "kv", {0: [9]}, timeout=30), done, copy_failures, copies)),
        ]
        for t in attackers + watchers:
            t.start()
        for t in attackers:
            t.join(ATTACK_SECONDS + 15)
        done.set()
        for t in watchers:
            t.join(60)
        assert not any(t.is_alive() for t in attackers + watchers)
        print(f"\n{len(refused)} maximal READs refused; meanwhile {pulls[0]} honest pulls (slowest {pulls[1]:.3f} s), "
              f"{copies[0]} tenant copies (slowest {copies[1]:.3f} s)")

        assert refused and not other, other[:5]                      # the attack ran, and was refused
        assert not pull_failures, pull_failures[:3]                  # the honest peer's pulls all succeeded
        assert not copy_failures, copy_failures[:3]                  # and the tenant's copies
        assert pulls[0] and copies[0]
        # its link was never broken by a missed heartbeat: still established, and it still pulls
        assert [(lk.remote_cluster_id, lk.state) for lk in links(honest_daemon)] == [(P, "established")]
        assert "heartbeat failed" not in honest_daemon.log()
        honest.call("pull_blocks", P, "kv", [4], [0], timeout=30)
        assert (honest.call("rows", "kv", None, [0]) == tenant.call("rows", "kv", None, [4])).all()
    finally:
        hostile.close()
        for w in (tenant, honest):
            w.close()
        for d in (owner_daemon, honest_daemon):
            d.discard()
