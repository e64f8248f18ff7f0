"""Scenario 10: datadist over ``hccl`` (backend ``acl``) against bare HCCL, GB/s per block size.

Where the runtime comes from: CANN's own when ``ASCEND_HOME_PATH`` is set and ``npu-smi`` sees NPUs; else the
SIMULATED runtime of ``tests/sim`` (built with the system C compiler), and then every row says so -- its
"device memory" is shared memory and its HCCL wire a memcpy between processes: the numbers say what datadist's
control path and bookkeeping cost next to the engine's own calls, nothing of HCCS or RoCE.

The baseline (``BareHccl``): two processes on NPUs 0 and 1, each ``aclrtMalloc`` of the cache, a two-rank
communicator (``HcclCommInitClusterInfoMemConfig``), ``HcclRegisterGlobalMem`` + ``HcclCommBindMem``,
``HcclCommPrepare``; one request = one ``HcclBatchPut`` of the request's shuffled blocks (one descriptor per
block) and ``aclrtSynchronizeStreamWithTimeout`` -- what datadist's hccl transport does for a transfer, without
datadist. The datadist engines are on NPUs 0 (prompt) and 1 (decoder) of two daemons.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import subprocess
import tempfile
import time
from typing import Any

import numpy as np

from .procs import Worker, free_port
from .stats import Row

__all__ = ["runtime", "BareHccl", "SIMULATED"]

SIMULATED = "SIMULATED runtime (tests/sim), not NPU numbers"


def runtime() -> tuple[dict[str, str] | None, str]:
    """``(environment, label)`` of the Ascend runtime to bench on; ``(None, why)`` when there is none."""
    home = os.environ.get("ASCEND_HOME_PATH")
    if home and shutil.which("npu-smi"):
        try:
            subprocess.run(["npu-smi", "info"], check=True, capture_output=True, timeout=30)
            return {"ASCEND_HOME_PATH": home}, "NPU"
        except (OSError, subprocess.SubprocessError):
            pass
    from tests.sim import build, sim_env  # the simulation lives with the tests (bench runs from the repository)
    root = build()
    if root is None:
        return None, "no Ascend runtime and no C compiler to build the simulated one: skipped"
    state = tempfile.mkdtemp(prefix="datadist-bench-ascend-")
    return sim_env(root, state), SIMULATED


def _rank(conn: Any, rank: int, env: dict[str, str], tensors: int, num_blocks: int, block: int, n: int) -> None:
    """One rank of ``BareHccl`` (a spawned process): rank 0 puts, rank 1 is the target."""
    os.environ.update(env)
    from datadist.ascend.acl import acl
    from datadist.ascend.hccl import MEM_DEVICE, CommConfig, hccl
    from datadistd.transport.hccl.agent import cluster_table

    a, h = acl(), hccl()
    tensor_bytes = num_blocks * block
    size = tensors * tensor_bytes
    buf = a.malloc(rank, size)
    members = [{"name": f"bench-r{i}", "server_id": "127.0.0.1", "device_id": str(a.physical_id(i)),
                "device_ip": env.get("DATADISTD_TRANSPORT_HCCL_DEVICE_IP", "127.0.0.1")} for i in (0, 1)]
    table, order = cluster_table(members)
    a.use(rank)
    comm = h.init_comm(table, order.index(f"bench-r{rank}"), CommConfig.make(f"datadist-bench-{os.getppid()}"))
    stream = a.create_stream(rank)
    token = h.register(MEM_DEVICE, buf, size)
    h.bind(comm, token)
    h.prepare(comm, 60_000)
    conn.send(buf)
    peer = conn.recv()
    rng = np.random.default_rng(7)
    src = np.concatenate([t * tensor_bytes + rng.permutation(num_blocks)[:n] * block for t in range(tensors)])
    dst = np.concatenate([t * tensor_bytes + rng.permutation(num_blocks)[:n] * block for t in range(tensors)])
    local, remote, lengths = (buf + src).tolist(), (peer + dst).tolist(), [block] * len(src)
    peer_rank = order.index(f"bench-r{1 - rank}")
    try:
        while conn.recv():
            if rank == 0:
                t0 = time.perf_counter()
                h.batch(True, comm, peer_rank, local, remote, lengths, stream)
                a.synchronize(rank, stream, 120_000)
                conn.send(time.perf_counter() - t0)
            else:
                conn.send(0.0)
    finally:
        h.unbind(comm, token)
        h.deregister(token)
        a.destroy_stream(rank, stream)
        h.destroy(comm)
        a.free(rank, buf)


class BareHccl:
    """Two processes, one rank each, moving a request's ``n`` shuffled blocks of every tensor by one
    ``HcclBatchPut``; ``once()`` times one request (post to stream synchronised)."""

    def __init__(self, env: dict[str, str], tensors: int, num_blocks: int, block: int, n: int) -> None:
        ctx = mp.get_context("spawn")
        self.conns, self.procs = [], []
        for rank in (0, 1):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=_rank, args=(theirs, rank, env, tensors, num_blocks, block, n), daemon=True)
            p.start()
            self.conns.append(mine)
            self.procs.append(p)
        bases = []
        for c in self.conns:
            if not c.poll(120):
                self.close()
                raise TimeoutError("bare HCCL rank did not start (communicator not prepared)")
            bases.append(c.recv())
        self.conns[0].send(bases[1])
        self.conns[1].send(bases[0])

    def once(self, timeout: float = 120.0) -> float:
        for c in self.conns:
            c.send(True)
        if not all(c.poll(timeout) for c in self.conns):
            raise TimeoutError("bare HCCL request did not finish")
        seconds = self.conns[0].recv()
        self.conns[1].recv()
        return float(seconds)

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(False)
            except OSError:
                pass
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)


def bulk_hccl(run: Any) -> None:
    """Scenario 1's requests between DEVICE caches over ``hccl``, against ``BareHccl`` with the same blocks."""
    from .scenarios import MIB, D, P, _Baseline, _bulk

    env, label = runtime()
    if env is None:
        run.add(Row("10 hccl bulk", "hccl", None, note=label))
        return
    scenario = f"10 hccl bulk ({label})" if label != "NPU" else "10 hccl bulk"
    tensors = 2 * run.cfg.layers
    daemon_env = {**env, "DATADISTD_MEMORY_BACKEND": "acl", "DATADISTD_TRANSPORT_NAME": "hccl"}
    worker_env = {**env, "DATADIST_BENCH_NPU": "1"}
    nodes = ("PA", "DA")
    try:
        dp, dd = run.daemon(nodes[0], daemon_env), run.daemon(nodes[1], daemon_env)
        wp, wd = Worker(dp, worker_env), Worker(dd, worker_env)
        run.workers += [wp, wd]
        pool = 2 * run.cfg.bulk_mib * MIB + 64 * MIB if "allocated" in run.cfg.memory else 0
        port = free_port()
        wp.send("init", "PROMPT", P, listen=f"127.0.0.1:{port}", mem_pool=pool, device=0)
        wd.send("init", "DECODER", D, mem_pool=pool, device=1)
        wp.result()
        wd.result()
        wd.call("link", P, f"127.0.0.1:{port}")

        def bare(block: int, n: int, num_blocks: int) -> _Baseline:
            b = BareHccl(env, tensors, num_blocks, block, n)
            note = ("two processes on NPUs 0 and 1, one HcclBatchPut of the shuffled blocks (a descriptor each) "
                    "and one stream synchronisation per request") + ("" if label == "NPU" else f"; {label}")
            return _Baseline({"bare HCCL": b.once}, ["bare HCCL"], {"bare HCCL": note}, b.close)

        _bulk(run, scenario, wp, wd, bare)
    finally:
        run.close_workers()
        run.stop_daemons(*nodes)
        if env.get("ASCEND_SIM_DIR"):
            shutil.rmtree(env["ASCEND_SIM_DIR"], ignore_errors=True)
