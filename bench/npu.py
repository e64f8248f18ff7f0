"""Scenario 10: datadist over ``hccl`` (backend ``acl``) against bare HCCL, GB/s per block size.

Where the runtime comes from (``--ascend``): ``auto`` takes CANN's own when ``ASCEND_HOME_PATH`` is set and
``npu-smi info`` succeeds, else the SIMULATED runtime of ``tests/sim`` (built with the system C compiler; the
scenario is skipped, saying why, without one); ``real`` insists on CANN and NPUs (the scenario fails without
them); ``sim`` always takes the simulation. On the simulation every row, note and plot says
``SIMULATED runtime (tests/sim) — not NPU numbers``: its "device memory" is shared memory and its HCCL wire a
memcpy between processes, so the numbers say what datadist's control path and bookkeeping cost next to the
engine's own calls, nothing of HCCS or RoCE. No bulk target is judged on either (the per-block Python row,
datadist's own arithmetic with no runtime call, is: ``bench/perblock.py``).

The datadist side: two daemons (``[memory] backend = "acl"``, ``[transport] name = "hccl"``), the prompt engine
on NPU 0 and the decoder on NPU 1, DEVICE caches (allocated from the daemon's pool, or the worker's own
``aclrtMalloc``'d tensors registered by IPC key), scenario 1's pulls and pushes of shuffled blocks.

The baseline (``BareHccl``), HCCL's own number: two processes on NPUs 0 and 1 and nothing of datadist but
the ctypes bindings (``datadist_ascend``) and the rank table datadist's agent builds (``cluster_table``): each
``aclrtMalloc``'s a cache of the same size, ``HcclCommInitClusterInfoMemConfig``, ``aclrtCreateStream``,
``HcclRegisterGlobalMem`` + ``HcclCommBindMem``, ``HcclCommPrepare``. One request = the same number of shuffled
blocks of every tensor as datadist's request, one descriptor per block, built before the clock; timed from
``HcclBatchPut`` (or ``HcclBatchGet``) to ``aclrtSynchronizeStreamWithTimeout`` returning. Its bytes are
checked once (a put and a get of tagged blocks) before anything is timed.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import shutil
import subprocess
import tempfile
import time
from typing import Any, Callable

import numpy as np

from .perblock import per_block_rows
from .procs import Worker, free_port
from .stats import Row

__all__ = ["runtime", "BareHccl", "SIMULATED", "ASCEND_MODES", "SIM_MIB", "bulk_hccl"]

SIMULATED = "SIMULATED runtime (tests/sim) — not NPU numbers"
ASCEND_MODES = ("auto", "real", "sim")
#: MiB per request on the simulated runtime unless --hccl-mib says otherwise (the whole scenario ~15-25 s here)
SIM_MIB = 64
_TAG = np.uint64(0xB0 << 56)


def _npu_absent() -> str | None:
    """Why CANN with NPUs is not there (``None`` when it is)."""
    if not os.environ.get("ASCEND_HOME_PATH"):
        return "ASCEND_HOME_PATH is not set"
    smi = shutil.which("npu-smi")
    if smi is None:
        return "npu-smi is not on PATH"
    try:
        subprocess.run([smi, "info"], check=True, capture_output=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "npu-smi info did not answer within 30 s"
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"npu-smi info failed ({exc})"
    return None


def runtime(mode: str = "auto", log: Callable[[str], None] = print) -> tuple[dict[str, str] | None, str]:
    """``(environment, label)`` of the Ascend runtime to bench on: ``"NPU"`` for CANN's, ``SIMULATED`` for
    the simulation (with a state directory of its own, made here: the caller removes it); ``(None, why)``
    when there is none. ``mode="real"`` raises instead."""
    if mode != "sim":
        why = _npu_absent()
        if why is None:
            return {"ASCEND_HOME_PATH": os.environ["ASCEND_HOME_PATH"]}, "NPU"
        if mode == "real":
            raise RuntimeError(f"--ascend real, but no CANN with NPUs: {why}")
        if os.environ.get("ASCEND_HOME_PATH"):
            log(f"scenario 10: {why}; running on the {SIMULATED}")
    from tests.sim import build, sim_env  # the simulation lives with the tests (bench runs from the repository)
    root = build()
    if root is None:
        return None, "no NPU and no C compiler (cc/gcc) to build the simulated runtime of tests/sim: skipped"
    # in the temporary directory, as the tests' (/dev/shm measured no faster here, and leaks RAM if killed)
    return sim_env(root, tempfile.mkdtemp(prefix="datadist-bench-ascend-")), SIMULATED


def _device_ip(device: int) -> str:
    """The NIC address of this process's NPU ``device``, derived as the daemons derive it (``npu_address``: by
    physical id, ``DATADISTD_TRANSPORT_HCCL_DEVICE_IP``, else the node's hccn.conf, else hccn_tool)."""
    from datadist_ascend.acl import acl
    from datadistd.transport.hccl.transport import npu_address

    return npu_address(acl().physical_id(device), os.environ.get("DATADISTD_TRANSPORT_HCCL_DEVICE_IP", ""),
                       os.environ.get("DATADISTD_TRANSPORT_HCCL_HCCN_CONF", "/etc/hccn.conf"),
                       os.environ.get("DATADISTD_TRANSPORT_HCCL_HCCN_TOOL", ""))[0]


def _rank(conn: Any, rank: int, env: dict[str, str], tensors: int, num_blocks: int, block: int, n: int,
          comm_name: str) -> None:
    """One rank of ``BareHccl`` (a spawned process on NPU ``rank``); any failure goes back as ``("error", text)``."""
    try:
        _serve_rank(conn, rank, env, tensors, num_blocks, block, n, comm_name)
    except BaseException as exc:  # noqa: BLE001 - reported to the bench process, which raises it
        try:
            conn.send(("error", f"bare HCCL rank {rank}: {type(exc).__name__}: {exc}"))
        except OSError:
            pass


def _serve_rank(conn: Any, rank: int, env: dict[str, str], tensors: int, num_blocks: int, block: int, n: int,
                comm_name: str) -> None:
    os.environ.update(env)
    from datadist_ascend.acl import MEMCPY_DEVICE_TO_HOST, MEMCPY_HOST_TO_DEVICE, acl
    from datadist_ascend.hccl import DESCS_PER_CALL, MEM_DEVICE, CommConfig, OneSideOpDesc, descriptors, hccl
    from datadistd.transport.hccl.agent import cluster_table

    a, h = acl(), hccl()
    rows = tensors * num_blocks
    size = rows * block
    a.use(rank)
    buf = a.malloc(rank, size)
    comm = stream = token = 0
    try:
        members = [{"name": f"bench-r{i}", "server_id": "127.0.0.1", "device_id": str(a.physical_id(i)),
                    "device_ip": _device_ip(i)} for i in (0, 1)]
        table, order = cluster_table(members)
        me, peer_rank = order.index(f"bench-r{rank}"), order.index(f"bench-r{1 - rank}")
        comm = h.init_comm(table, me, CommConfig.make(comm_name))
        stream = a.create_stream(rank)
        token = h.register(MEM_DEVICE, buf, size)
        h.bind(comm, token)
        h.prepare(comm, 60)   # seconds
        host = np.zeros((rows, block), np.uint8)      # rank 0: a tag per block; rank 1: zeros
        if rank == 0:
            host[:, :8].view(np.uint64)[:, 0] = _TAG | np.arange(rows, dtype=np.uint64)
        a.memcpy(rank, buf, size, host.ctypes.data, size, MEMCPY_HOST_TO_DEVICE)
        del host
        conn.send(("ok", buf))
        peer = int(conn.recv())
        rng = np.random.default_rng(7)                # both ranks draw the same tables, request by request
        base = np.arange(tensors, dtype=np.int64)[:, None] * num_blocks
        src = dst = np.zeros(0, np.int64)
        while True:
            op = conn.recv()
            if op is None:
                return
            if op == "check":                         # rank 1: the last request's blocks hold their tags
                host = np.empty((rows, block), np.uint8)
                a.memcpy(rank, host.ctypes.data, size, buf, size, MEMCPY_DEVICE_TO_HOST)
                got = np.ascontiguousarray(host[dst, :8]).view(np.uint64)[:, 0]
                wrong = int(np.count_nonzero(got != (_TAG | src.astype(np.uint64))))
                host[:] = 0
                a.memcpy(rank, buf, size, host.ctypes.data, size, MEMCPY_HOST_TO_DEVICE)
                conn.send(("ok", wrong))
                continue
            src = (base + np.stack([rng.permutation(num_blocks)[:n] for _ in range(tensors)])).ravel()
            dst = (base + np.stack([rng.permutation(num_blocks)[:n] for _ in range(tensors)])).ravel()
            get = op == "get"
            if get != (rank == 1):                    # the other rank's request: one-sided, nothing to do here
                conn.send(("ok", 0.0))
                continue
            mine, theirs = (dst, src) if get else (src, dst)
            local, remote = buf + mine * block, peer + theirs * block
            if op == "put-binding":                   # descriptors filled by the binding, on the clock
                t0 = time.perf_counter()
                h.batch(True, comm, peer_rank, local, remote, block, stream)
            else:
                descs = descriptors(local, remote, block)
                t0 = time.perf_counter()
                # Hccl.batch's own calls -- DESCS_PER_CALL descriptors each, as CANN allows -- made beforehand
                for at in range(0, len(descs), DESCS_PER_CALL):
                    h._call("HcclBatchGet" if get else "HcclBatchPut", ctypes.c_void_p(comm), peer_rank,
                            ctypes.cast(descs.ctypes.data + at * descs.itemsize, ctypes.POINTER(OneSideOpDesc)),
                            min(DESCS_PER_CALL, len(descs) - at), ctypes.c_void_p(stream))
            a.synchronize(rank, stream, 120_000)
            conn.send(("ok", time.perf_counter() - t0))
    finally:   # CANN's order: abort the stream, unbind, destroy the communicator, then the stream
        a.set_device(rank)
        if stream:
            a.abort(rank, stream)
        if token and comm:
            h.unbind(comm, token)
        if comm:
            h.destroy(comm)
        if token:
            h.deregister(token)
        if stream:
            a.destroy_stream(rank, stream)
        a.free(rank, buf)


class BareHccl:
    """Two processes, one rank each on NPUs 0 and 1, moving a request's ``n`` shuffled blocks of every tensor
    by one ``HcclBatchPut`` (``once("put")``), one ``HcclBatchGet`` by the receiving rank (``once("get")``) or
    one put whose descriptors the binding fills on the clock (``once("put-binding")``); seconds per request.
    The bytes of a put and of a get are checked before the first timed request."""

    OPS = ("put", "get", "put-binding")
    _count = 0

    def __init__(self, env: dict[str, str], tensors: int, num_blocks: int, block: int, n: int,
                 timeout: float = 120.0) -> None:
        ctx = mp.get_context("spawn")
        BareHccl._count += 1
        name = f"datadist-bench-{os.getpid()}-{BareHccl._count}"
        self.conns: list[Any] = []
        self.procs: list[Any] = []
        try:
            for rank in (0, 1):
                mine, theirs = ctx.Pipe()
                p = ctx.Process(target=_rank, args=(theirs, rank, env, tensors, num_blocks, block, n, name),
                                daemon=True, name=f"bare-hccl-r{rank}")
                p.start()
                theirs.close()
                self.conns.append(mine)
                self.procs.append(p)
            deadline = time.monotonic() + timeout
            bases = [self._reply(c, deadline - time.monotonic(), "start (communicator prepared)")
                     for c in self.conns]
            self.conns[0].send(bases[1])
            self.conns[1].send(bases[0])
            for op in ("put", "get"):
                self.once(op)
                self.conns[1].send("check")
                wrong = self._reply(self.conns[1], timeout, "check")
                if wrong:
                    raise RuntimeError(f"bare HCCL {op}: {wrong} of {n * tensors} blocks hold wrong bytes")
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _reply(conn: Any, timeout: float, what: str) -> Any:
        try:
            if not conn.poll(max(0.0, timeout)):
                raise TimeoutError(f"bare HCCL: no {what} within {timeout:.0f} s")
            status, value = conn.recv()
        except EOFError:
            raise RuntimeError(f"bare HCCL: a rank exited during {what}") from None
        if status == "error":
            raise RuntimeError(value)
        return value

    def once(self, op: str = "put", timeout: float = 120.0) -> float:
        for c in self.conns:
            c.send(op)
        deadline = time.monotonic() + timeout
        return max(float(self._reply(c, deadline - time.monotonic(), f"{op} request")) for c in self.conns)

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(None)
            except OSError:
                pass
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
        for c in self.conns:
            c.close()
        self.conns, self.procs = [], []


def bulk_hccl(run: Any) -> None:
    """Scenario 1's requests between DEVICE caches over ``hccl``, against ``BareHccl`` with as many blocks."""
    from .scenarios import MIB, D, P, _Baseline, _bulk

    cfg = run.cfg
    tensors = 2 * cfg.layers
    sim_mib = cfg.hccl_mib or SIM_MIB
    env, label = runtime(cfg.ascend, log=run.log)
    if env is None:
        run.add(Row("10 hccl bulk", "hccl", None, note=label))
        return
    simulated = label == SIMULATED
    mib = sim_mib if simulated else (cfg.hccl_mib or cfg.bulk_mib)
    scenario = f"10 hccl bulk ({SIMULATED})" if simulated else "10 hccl bulk (CANN, NPUs 0 and 1)"
    for row in per_block_rows(scenario, "hccl", cfg.perblock_blocks, cfg.perblock_kib << 10, cfg.reps):
        run.add(row)          # datadist's own arithmetic: no runtime call on its clock, the same on either runtime
    daemon_env = {**env, "DATADISTD_MEMORY_BACKEND": "acl", "DATADISTD_TRANSPORT_NAME": "hccl"}
    worker_env = {**env, "DATADIST_BENCH_NPU": "1"}
    nodes = ("PA", "DA")
    try:
        dp, dd = run.daemon(nodes[0], daemon_env), run.daemon(nodes[1], daemon_env)
        wp, wd = Worker(dp, worker_env), Worker(dd, worker_env)
        run.workers += [wp, wd]
        pool = 2 * mib * MIB + 64 * MIB if "allocated" in cfg.memory else 0
        port = free_port()
        wp.send("init", "PROMPT", P, listen=f"127.0.0.1:{port}", mem_pool=pool, device=0)
        wd.send("init", "DECODER", D, mem_pool=pool, device=1)
        wp.result()
        wd.result()
        how = "two processes on NPUs 0 and 1, as many shuffled blocks a request as datadist's, a descriptor each"
        tail = f"; {SIMULATED}" if simulated else ""
        notes = {
            "bare HCCL put": f"{how}, built before the clock; HcclBatchPut + stream synchronised: the judged "
                             f"baseline of pushes (datadist's owner puts){tail}",
            "bare HCCL get": f"{how}, built before the clock; HcclBatchGet by the receiving rank + stream "
                             f"synchronised: the judged baseline of pulls (datadist's puller gets){tail}",
            "bare HCCL put, binding fills descriptors": f"{how}, filled by Hccl.batch (one numpy array, as datadist's "
                                                        f"transport calls it) on the clock: information only{tail}"}
        ops = dict(zip(notes, BareHccl.OPS, strict=True))

        def bare(block: int, n: int, num_blocks: int) -> _Baseline:
            b = BareHccl(env, tensors, num_blocks, block, n)
            return _Baseline({k: (lambda op=op: b.once(op)) for k, op in ops.items()}, ["bare HCCL put"], notes,
                             b.close, ["bare HCCL get"])

        # linked once each block size's caches exist, unlinked before they go: HCCL reaches only memory registered
        # before a link's Prepare, and keeps a registration while a link binds it (docs/ascend.md)
        _bulk(run, scenario, wp, wd, bare, bulk_mib=mib,
              link=(lambda: wd.call("link", P, f"127.0.0.1:{port}"), lambda: wd.call("unlink", P)))
    finally:
        run.close_workers()
        run.stop_daemons(*nodes)
        if env.get("ASCEND_SIM_DIR"):
            shutil.rmtree(env["ASCEND_SIM_DIR"], ignore_errors=True)
