"""Faults: a peer daemon killed (or the network cut) mid-transfer, a worker killed mid-call, the local
daemon restarted under a live client. Every fault ends in a clear status code within its deadline, the
pool and the link table stay consistent, and every transfer that reported success is byte-exact.

Transfers that must be *in flight* when the fault hits run between two network namespaces joined by a
rate-limited veth (the half cache they move, 32 MiB at 200 mbit/s, takes ~1.35 s), so the kill lands mid-transfer
every time.
"""

from __future__ import annotations

import glob
import os
import re
import signal
import threading
import time

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from datadist.status import LLMStatusCode as S
from datadist.v1 import common_pb2, datadist_pb2
from datadistd.transport.nixl.ucx import UCX_TCP_USER_TIMEOUT_DEFAULT, fence_seconds
from tests.conftest import ascend_runtime
from tests.harness import (
    ACL_PLANE,
    DATA_PLANES,
    WorkerError,
    free_port,
    metrics_address,
    nixl_installed,
    nixl_plane,
    over_planes,
    pool_memfds,
    scrape,
)
from tests.reliability.common import (
    HAVE_NETNS,
    Hosts,
    caches,
    code_of,
    links,
    pool_used,
    status,
    stub,
    wait_until,
)
from tests.reliability.ops import OPS

pytestmark = pytest.mark.integration

P, D, D2 = 1, 2, 3
PORT = 26000
MIB = 1 << 20
# 16 tensors x 256 blocks x 16 KiB = 64 MiB per cache
TENSORS, BLOCKS, BLOCK_SHAPE = 16, 256, (16, 8, 64)
BLOCK_BYTES = 16 * 8 * 64 * 2
SYNC_MS = 3000   # a half-cache transfer (32 MiB) takes ~1.35 s on the 200 mbit veth: the deadline is past it
#: nixl with the network cut: a pull still in flight at its deadline is waited for up to the fence after it (the
#: probe makes this side's kernel abort the dead connection: docs/nixl.md, "Failure behaviour"), then answered
NIXL_CUT_SYNC_MS = 5000
NIXL_FENCE_S = fence_seconds({"UCX_TCP_USER_TIMEOUT": UCX_TCP_USER_TIMEOUT_DEFAULT})
MARGIN_S = 2.5
HEARTBEAT = {"DATADISTD_PEER_HEARTBEAT_SECONDS": "0.5"}

netns = pytest.mark.skipif(not HAVE_NETNS, reason="needs root and iproute2/tc to create network namespaces")


def _in_background(fn, *args, **kwargs):  # noqa: ANN001, ANN202
    """Run ``fn`` in a thread; returns (thread, outcome dict with 'result' and 'seconds')."""
    outcome: dict = {}

    def body() -> None:
        t0 = time.monotonic()
        try:
            outcome["result"] = fn(*args, **kwargs)
        except WorkerError as exc:
            outcome["result"] = exc.status_code if exc.status_code is not None else exc.kind
        except Exception as exc:  # noqa: BLE001 - e.g. the worker died under the call
            outcome["result"] = type(exc).__name__
        outcome["seconds"] = time.monotonic() - t0

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, outcome


def _wait_in_flight(daemon, min_seconds: float = 0.4) -> None:  # noqa: ANN001
    """Let a started transfer get going (bytes on the wire) before the fault."""
    time.sleep(min_seconds)


def _lost_mid_transfer(decoder, db, op: str, blocks: list[int], lose, seconds: float, what: str) -> dict:  # noqa: ANN001
    """The decoder's ``op`` of ``blocks`` (to the same blocks) in the background, ``lose()`` (a peer killed, the
    network cut) once it is in flight: it ends -- no hang -- within ``seconds``, with LLM_TIMEOUT when its deadline
    passes first or LLM_FAILED (CANN's code for a failed communication that is not a timeout) when the connection
    ends before it (a killed peer, a kernel aborting a dead connection) or the heartbeat gives up on the peer.
    Printed with ``what``; returns the outcome."""
    thread, outcome = _in_background(decoder.call, op, P, "kv", blocks, blocks, timeout=60)
    _wait_in_flight(db)
    lose()
    thread.join(60)
    assert not thread.is_alive(), "the transfer hung"
    got = outcome["result"]
    print(f"\n{what}: {S(got).name if isinstance(got, int) else got} after {outcome['seconds']:.2f}s")
    assert got in (S.LLM_TIMEOUT, S.LLM_FAILED), outcome
    assert outcome["seconds"] < seconds, outcome
    return outcome


def _linked_hosts(hosts: Hosts, plane: str, env: dict[str, str], daemon_factory, worker_factory,  # noqa: ANN001, ANN202
                  request=None, sync_ms: int = SYNC_MS):  # noqa: ANN001
    """Daemon a (prompt, listening) and b (decoder) in ``hosts``, over ``plane`` (nixl: UCX TCP on the veth;
    acl-hccl: NPU caches of the simulated runtime, HCCL puts, the channel on the veth), caches registered and
    filled (prompt 5, decoder 9), linked. Returns (da, db, prompt, decoder)."""
    if plane == "nixl" and not nixl_installed():
        pytest.skip("NIXL is not installed (make nixl)")
    if plane == ACL_PLANE:   # the simulated HCCL wire as fast as the veth, so a fault lands mid-put
        env = {**env, **DATA_PLANES[ACL_PLANE], **ascend_runtime(request), "ASCEND_SIM_WIRE_MBPS": "200"}
    da = daemon_factory("a", netns=hosts.a, env={**env, **(nixl_plane("tcp", hosts.va) if plane == "nixl" else {})})
    db = daemon_factory("b", netns=hosts.b, env={**env, **(nixl_plane("tcp", hosts.vb) if plane == "nixl" else {})})
    prompt, decoder = worker_factory(da), worker_factory(db)
    prompt.call("init", "PROMPT", P, listen=f"{hosts.ip_a}:{PORT}", remote_cache_accessible=True,
                sync_kv_timeout=sync_ms)
    decoder.call("init", "DECODER", D, remote_cache_accessible=True, sync_kv_timeout=sync_ms)
    prompt.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE, model_id=0)
    decoder.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE, model_id=0)
    prompt.call("fill", "kv", 5)
    decoder.call("fill", "kv", 9)
    assert decoder.call("link", P, hosts.ip_a, PORT, local_ip=hosts.ip_b) == (0, [0])
    return da, db, prompt, decoder


# ---- a peer daemon killed, or the network cut, in the middle of a transfer -----------------------------

@netns
@pytest.mark.parametrize("fault,direction,plane", [("kill", "pull", "tcp"), ("kill", "push", "tcp"),
                                                   ("cut", "pull", "tcp"), ("cut", "push", "tcp"),
                                                   ("kill", "push", "nixl"), ("cut", "pull", "nixl"),
                                                   ("kill", "pull", ACL_PLANE), ("kill", "push", ACL_PLANE)])
def test_peer_lost_mid_transfer(fault: str, direction: str, plane: str, daemon_factory, worker_factory,
                                request) -> None:
    """... over tcp, over nixl with UCX over TCP on the veth (its WRITE to a dead or cut-off peer must
    end at the deadline too, and the relinked peer's next transfers be byte-exact), and over hccl on the simulated
    runtime (its wire paced like the veth: a put to a peer that died stalls until the deadline aborts it)."""
    hosts = Hosts(rate="200mbit")
    sync_ms = NIXL_CUT_SYNC_MS if (fault, plane) == ("cut", "nixl") else SYNC_MS
    try:
        da, db, prompt, decoder = _linked_hosts(hosts, plane, HEARTBEAT, daemon_factory, worker_factory, request,
                                                sync_ms)
        half = list(range(BLOCKS // 2))
        untouched = list(range(BLOCKS // 2, BLOCKS))
        before = decoder.call("rows", "kv", None, untouched)
        op = "pull_blocks" if direction == "pull" else "push_blocks"
        fence = NIXL_FENCE_S if plane == "nixl" else 0.0
        _lost_mid_transfer(decoder, db, op, half, da.kill if fault == "kill" else hosts.cut,
                           sync_ms / 1000 + fence + MARGIN_S,
                           f"{fault} mid-{direction} (sync_kv_timeout {sync_ms / 1000:.0f}s)")
        assert "was abandoned in flight" not in db.log()   # it ended in the fence: nothing of it can land
        # the link is broken, and further transfers say so at once (nothing times out then)
        assert [lk.state for lk in links(db)] == ["broken"]
        with pytest.raises(WorkerError) as info:
            decoder.call("pull_blocks", P, "kv", [0], [0])
        assert info.value.status_code == S.LLM_FAILED and "is broken" in str(info.value)
        # a failed transfer leaves the rest of the cache alone
        np.testing.assert_array_equal(decoder.call("rows", "kv", None, untouched), before)
        # the peer comes back (a new daemon and worker on the same address, or the network mends)
        if fault == "kill":
            prompt.kill()
            da.start()
            prompt = worker_factory(da)
            prompt.call("init", "PROMPT", P, listen=f"{hosts.ip_a}:{PORT}", remote_cache_accessible=True,
                        sync_kv_timeout=sync_ms)
            prompt.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE, model_id=0)
            prompt.call("fill", "kv", 6)
        else:
            hosts.mend()
        for _ in range(20):  # bounded: the veth / the new listener needs a moment
            result = decoder.call("link", P, hosts.ip_a, PORT, local_ip=hosts.ip_b)
            if result == (0, [0]):
                break
            time.sleep(0.25)
        assert result == (0, [0])
        assert [lk.state for lk in links(db)] == ["established"]
        # the next transfer is byte-exact (and reported success only because it is); its destination includes
        # blocks the failed one was writing (3, 4): no late byte of it may land
        src, dst = [7, 200, 201, 13], [130, 3, 4, 250]
        decoder.call("pull_blocks", P, "kv", src, dst)
        np.testing.assert_array_equal(decoder.call("rows", "kv", None, dst), prompt.call("rows", "kv", None, src))
        decoder.call("fill", "kv", 10)
        decoder.call("push_blocks", P, "kv", dst, src)
        np.testing.assert_array_equal(prompt.call("rows", "kv", None, src), decoder.call("rows", "kv", None, dst))
    finally:
        hosts.remove()


@netns
@pytest.mark.parametrize("direction", ["pull", "push"])
def test_a_transfer_cut_off_in_flight_lands_nothing_once_answered(direction: str, daemon_factory, worker_factory,
                                                                   request) -> None:
    """nixl over UCX's TCP, the network cut mid-transfer: the transfer fails within its deadline and the fence after
    it, and from then on nothing of it lands. The network heals at once, the side it was
    writing into (the decoder for a pull, the prompt for a push) rewrites its blocks, and they stay as written for
    10 s -- long enough for the sending kernel to retransmit what it had queued (twice, at its backoff), which lands
    then without the fence (run the daemons with UCX_TCP_USER_TIMEOUT=inf)."""
    hosts = Hosts(rate="200mbit")
    try:
        da, db, prompt, decoder = _linked_hosts(hosts, "nixl", HEARTBEAT, daemon_factory, worker_factory, request,
                                                NIXL_CUT_SYNC_MS)
        half = list(range(BLOCKS // 2))
        _lost_mid_transfer(decoder, db, f"{direction}_blocks", half, hosts.cut,
                           NIXL_CUT_SYNC_MS / 1000 + NIXL_FENCE_S + MARGIN_S,
                           f"cut mid-{direction} (deadline {NIXL_CUT_SYNC_MS / 1000:.0f}s, fence {NIXL_FENCE_S:.1f}s)")
        hosts.mend()
        written_into = decoder if direction == "pull" else prompt
        written_into.call("fill", "kv", 11)
        written = written_into.call("digest", "kv")
        for _ in range(20):   # 10 s, bounded
            time.sleep(0.5)
            assert written_into.call("digest", "kv") == written, "bytes of the failed transfer landed after its answer"
        assert "was abandoned in flight" not in db.log()
    finally:
        hosts.remove()


# ---- a peer daemon killed while calls wait on it: they fail at the connection's end, not at the heartbeat -------

#: the heartbeat far past the pulls' deadline: a pull still waiting for its owner call when the peer's connection
#: ends fails at once (``base.CONTROL_DOWN``), or else hangs to its deadline (``LLM_TIMEOUT``)
LONG_HEARTBEAT = {"DATADISTD_PEER_HEARTBEAT_SECONDS": "30"}
DOWN_SYNC_MS = 10000
#: pulls of a 4 x 64-block cache of 2 KiB rows (8 KiB a block): two of one block (answered inline, in the owner's
#: reply) and two of 16 blocks (128 KiB: a transfer on the data channel, a receipt beside the owner call)
DOWN_PULLS = [([1], [1]), ([2], [2]), (list(range(16)), list(range(16, 32))), (list(range(32, 48)),
                                                                               list(range(48, 64)))]


def _in_flight(daemon, cluster: int) -> int:  # noqa: ANN001
    """Transfers running on the links of engine ``cluster`` of ``daemon`` (its metrics)."""
    return sum(int(sample.value) for family in text_string_to_metric_families(scrape(metrics_address(daemon)))
               if family.name == "datadist_link_transfers_in_flight" for sample in family.samples
               if sample.labels["cluster_id"] == str(cluster))


@over_planes("tcp", "nixl-ucx-tcp")
@pytest.mark.parametrize("puller", ["linking", "serving"])
def test_peer_killed_fails_calls_in_flight_at_once(puller: str, data_plane, daemon_factory,
                                                   worker_factory) -> None:
    """The owner daemon is stopped (SIGSTOP: its kernel still takes the pulls' frames, nothing answers), four
    pulls wait on it, then it is killed (SIGKILL: the kernel ends its connections). Every pull fails with the code
    a lost peer gets -- the linking end's ``LLM_FAILED`` (its link broken, as the heartbeat would find it), the
    serving end's ``LLM_NOT_YET_LINK`` (its link dropped, as the sweeper would) -- at the connection's end: the
    heartbeat is 30 s, past the pulls' 10 s deadline."""
    if data_plane and not nixl_installed():
        pytest.skip("NIXL is not installed (make nixl)")
    metrics = ["--metrics", "127.0.0.1:0"]
    da, db = daemon_factory.many("a", "b", env=LONG_HEARTBEAT, args=metrics)
    prompt, decoder = worker_factory(da), worker_factory(db)
    port = free_port()
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True,
                sync_kv_timeout=DOWN_SYNC_MS)
    decoder.call("init", "DECODER", D, remote_cache_accessible=True, sync_kv_timeout=DOWN_SYNC_MS)
    for worker, seed in ((prompt, 5), (decoder, 9)):
        worker.call("register_blocks", "kv", 4, 64, (16, 64), model_id=0)
        worker.call("fill", "kv", seed)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    # the owner daemon, its puller and the cluster the puller names
    owner, pulling, near, far, code = ((da, decoder, D, P, S.LLM_FAILED) if puller == "linking" else
                                       (db, prompt, P, D, S.LLM_NOT_YET_LINK))
    pulling.call("pull_blocks", far, "kv", [0], [0])   # the link works
    os.kill(owner.pid, signal.SIGSTOP)
    try:
        pulling.send("run", OPS, "pulls_at_once", far, "kv", DOWN_PULLS)
        assert wait_until(lambda: _in_flight(db if puller == "linking" else da, near) == len(DOWN_PULLS), 10)
    finally:
        killed = time.monotonic()
        owner.kill()
    results = pulling.result(DOWN_SYNC_MS / 1000 + 20)
    print(f"\n{puller} end, pulls in flight when the peer died: " +
          ", ".join(f"{outcome} after {ended - killed:.3f}s" for outcome, ended in results))
    assert [outcome for outcome, _ in results] == [code.name] * len(DOWN_PULLS), results
    # failed by the connection's end: well before the deadline (10 s) and the heartbeat (30 s)
    assert all(ended - killed < DOWN_SYNC_MS / 1000 / 2 for _, ended in results), results
    if puller == "linking":
        assert [lk.state for lk in links(db)] == ["broken"]
    else:
        assert links(da) == []


# ---- the link unlinked (by its other end) in the middle of a transfer -----------------------------------

@netns
@pytest.mark.parametrize("direction,plane", [("pull", "tcp"), ("push", "tcp"), ("pull", "nixl"), ("push", "nixl"),
                                             ("pull", ACL_PLANE), ("push", ACL_PLANE)])
def test_unlink_mid_transfer(direction: str, plane: str, daemon_factory, worker_factory, request) -> None:
    """The listening end unlinks while the decoder's transfer is on the wire: the transfer ends with a
    status (no hang, no success), both link tables are empty, the blocks it did not touch are intact,
    and a new link's transfers are byte-exact."""
    hosts = Hosts(rate="200mbit")
    try:
        da, db, prompt, decoder = _linked_hosts(hosts, plane, {}, daemon_factory, worker_factory, request)
        half, untouched = list(range(BLOCKS // 2)), list(range(BLOCKS // 2, BLOCKS))
        before = decoder.call("rows", "kv", None, untouched)
        op = "pull_blocks" if direction == "pull" else "push_blocks"
        thread, outcome = _in_background(decoder.call, op, P, "kv", half, half, timeout=60)
        _wait_in_flight(db)
        assert prompt.call("unlink", D, hosts.ip_b, 1) == (0, [0])
        thread.join(60)
        assert not thread.is_alive(), "the transfer hung"
        print(f"\nunlink mid-{direction} over {plane}: {outcome}")
        assert outcome["seconds"] < SYNC_MS / 1000 + MARGIN_S, outcome
        assert wait_until(lambda: links(da) == [] and links(db) == [], 10)
        if outcome["result"] is None:   # nixl: a WRITE already posted completes; success only if byte-exact
            src_side, dst_side = (prompt, decoder) if direction == "pull" else (decoder, prompt)
            np.testing.assert_array_equal(dst_side.call("rows", "kv", None, half), src_side.call("rows", "kv", None,
                                                                                                half))
        else:
            assert outcome["result"] in (S.LLM_TIMEOUT, S.LLM_NOT_YET_LINK, S.LLM_LINK_FAILED), outcome
        np.testing.assert_array_equal(decoder.call("rows", "kv", None, untouched), before)
        time.sleep(0.5)   # a late byte of the old transfer would land now, and the checks below would see it
        assert decoder.call("link", P, hosts.ip_a, PORT, local_ip=hosts.ip_b) == (0, [0])
        src, dst = [7, 200, 201, 13], [130, 3, 4, 250]
        decoder.call("pull_blocks", P, "kv", src, dst)
        np.testing.assert_array_equal(decoder.call("rows", "kv", None, dst), prompt.call("rows", "kv", None, src))
        decoder.call("fill", "kv", 10)
        decoder.call("push_blocks", P, "kv", dst, src)
        time.sleep(0.5)
        np.testing.assert_array_equal(prompt.call("rows", "kv", None, src), decoder.call("rows", "kv", None, dst))
    finally:
        hosts.remove()


# ---- a worker killed in the middle of a call -----------------------------------------------------------

@netns
def test_worker_killed_mid_pull_releases_everything(daemon_factory, worker_factory) -> None:
    hosts = Hosts(rate="200mbit")
    try:
        da = daemon_factory("a", netns=hosts.a, env=HEARTBEAT)
        # the node cap fits the survivor's pool and the doomed worker's pool, not one more of that size
        db = daemon_factory("b", netns=hosts.b, env={**HEARTBEAT, "DATADISTD_MEMORY_MAX_TOTAL_BYTES": str(84 * MIB)})
        prompt = worker_factory(da)
        prompt.call("init", "PROMPT", P, listen=f"{hosts.ip_a}:{PORT}", remote_cache_accessible=True,
                    sync_kv_timeout=SYNC_MS)
        prompt.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE, model_id=0)
        prompt.call("fill", "kv", 5)
        source = prompt.call("digest", "kv")
        survivor = worker_factory(db)
        survivor.call("init", "DECODER", D2, remote_cache_accessible=True, sync_kv_timeout=SYNC_MS, mem_pool=4 * MIB)
        survivor.call("allocate", "kv", TENSORS, (8, *BLOCK_SHAPE), blocks=True)
        assert survivor.call("link", P, hosts.ip_a, PORT, local_ip=hosts.ip_b) == (0, [0])
        baseline_used, baseline_pools = pool_used(db), pool_memfds(db.proc.pid)
        baseline_caches = caches(db)
        doomed = worker_factory(db)
        doomed.call("init", "DECODER", D, remote_cache_accessible=True, sync_kv_timeout=SYNC_MS, mem_pool=80 * MIB)
        doomed.call("allocate", "kv", TENSORS, (BLOCKS, *BLOCK_SHAPE), blocks=True)   # 64 MiB of the pool
        doomed.call("register_blocks", "mine", 2, 8, (16, 16))                         # its own memory
        assert doomed.call("link", P, hosts.ip_a, PORT, local_ip=hosts.ip_b) == (0, [0])
        assert pool_used(db) > baseline_used
        doomed_pools = pool_memfds(db.proc.pid) - baseline_pools
        assert doomed_pools
        thread, outcome = _in_background(doomed.call, "pull_blocks", P, "kv", list(range(BLOCKS)),
                                         list(range(BLOCKS)), timeout=60)
        _wait_in_flight(db)
        doomed.kill()
        # a newcomer asks for the same 80 MiB at once: refused while the dead worker's pool still exists
        # (the node cap is never over-committed), granted once it is gone
        newcomer, refusals = _init_until_granted(db, 80 * MIB, deadline=time.monotonic() + SYNC_MS / 1000 + 8)
        assert not doomed_pools & pool_memfds(db.proc.pid), "two pools over the node cap at once"
        with stub(db) as s:
            s.Finalize(datadist_pb2.EngineRef(engine_id=newcomer), timeout=20)
        print(f"\nnewcomer's pool granted after {refusals} LLM_OUT_OF_MEMORY answers")
        thread.join(10)
        # its engine, caches, registrations, pool and link go; the daemon's accounting returns to before
        assert wait_until(lambda: [e.cluster_id for e in status(db).engines] == [D2], SYNC_MS / 1000 + 8)
        # the engine leaves the table first; its memory goes once in-flight copies drained (bounded)
        assert wait_until(lambda: pool_memfds(db.proc.pid) == baseline_pools, 10)
        assert pool_used(db) == baseline_used
        # the lease ends with whichever the daemon sees first: the attach connection or the session stream
        assert re.search(r"removed: worker (session ended|detached); 67108864 owned bytes returned", db.log())
        assert caches(db) == baseline_caches
        assert wait_until(lambda: [lk.remote_cluster_id for lk in links(da)] == [D2], 10), links(da)
        # the other worker on the same daemon is unaffected, and the source was never touched
        assert [lk.state for lk in links(db)] == ["established"]
        src, dst = [3, 250, 17], [0, 1, 7]
        survivor.call("pull_blocks", P, "kv", src, dst)
        np.testing.assert_array_equal(survivor.call("rows", "kv", None, dst), prompt.call("rows", "kv", None, src))
        assert prompt.call("digest", "kv") == source
    finally:
        hosts.remove()


def _init_until_granted(daemon, pool_bytes: int, deadline: float) -> tuple[int, int]:  # noqa: ANN001
    """Init an engine with a pool of ``pool_bytes`` until the daemon grants it: (engine id, refusals)."""
    refusals = 0
    with stub(daemon) as s:
        while True:
            try:
                resp = s.Init(datadist_pb2.InitRequest(
                    cluster_id=4, role=common_pb2.ROLE_DECODER, pid=os.getpid(),
                    options={"llm.EnableCacheManager": "1",
                             "llm.MemPoolConfig": f'{{"memory_size": {pool_bytes}, "page_shift": 16}}'}), timeout=10)
                return resp.engine_id, refusals
            except grpc.RpcError as err:
                assert code_of(err) == S.LLM_OUT_OF_MEMORY, err.details()
                assert time.monotonic() < deadline, "the dead worker's memory was never returned"
                refusals += 1
                time.sleep(0.02)


# ---- the local daemon restarted under a live client ------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_local_daemon_restart_under_a_live_client(sig: int, daemon_factory, worker_factory) -> None:
    d = daemon_factory()
    w = worker_factory(d)
    w.call("init", "DECODER", D, mem_pool=4 * MIB)
    w.call("allocate", "x", 2, (8, 64), dtype="uint8", blocks=True)
    d.stop(sig)
    # the daemon is down: a clear code, and the message says it is not reachable
    outcome, message = w.call("run", OPS, "try_op", "allocate", "y", 1, (4, 64), dtype="uint8", blocks=True)
    assert outcome == "LLM_FAILED" and "not reachable" in message, (outcome, message)
    d.start()
    # a new worker gets an engine on the restarted daemon first; the stale client must not reach it
    other = worker_factory(d)
    other.call("init", "PROMPT", P, mem_pool=4 * MIB)
    other.call("allocate", "o", 1, (4, 64), dtype="uint8", blocks=True)
    other.call("fill", "o", 3)
    held = pool_used(d)
    deadline = time.monotonic() + 10  # the client's channel may still be in its (short) reconnect backoff
    while True:
        outcome, message = w.call("run", OPS, "try_op", "allocate", "y", 1, (4, 64), dtype="uint8", blocks=True)
        if not (outcome == "LLM_FAILED" and "not reachable" in message) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert outcome == "LLM_ENGINE_FINALIZED", (outcome, message)
    assert pool_used(d) == held
    # finalize is clean and releases the singleton; init again with a new instance in the same process
    w.call("finalize")
    assert w.call("run", OPS, "singleton_released")
    assert [e.cluster_id for e in status(d).engines] == [P]   # finalize did not touch the other engine
    w.call("init", "DECODER", D, mem_pool=4 * MIB)
    w.call("allocate", "x", 2, (8, 64), dtype="uint8", blocks=True)
    w.call("fill", "x", 4)
    w.call("copy_blocks", "x", {1: [5, 6]})
    rows = w.call("rows", "x")
    np.testing.assert_array_equal(rows[:, 5], rows[:, 1])
    np.testing.assert_array_equal(rows[:, 6], rows[:, 1])
    assert other.call("rows", "o").any()
    assert sorted(e.cluster_id for e in status(d).engines) == [P, D]
    # pools are memfds: even a SIGKILLed daemon leaves nothing behind in any directory
    assert glob.glob(os.path.join(d.shm_dir, "datadist-*")) == []
