"""What a benchmark worker process does on request (first argument: the worker's state dict).

Every op that moves cache bytes uses only the public ``llm_datadist`` API, as a real prompt or
decoder worker would; the timed loops run here, in the worker, with ``time.perf_counter``.
Caches are blocks caches of ``uint8`` rows: ``num_tensors`` tensors (K and V of each layer) of
``num_blocks`` blocks of ``block_bytes`` bytes. Two kinds of memory:

* ``allocated``: ``allocate_blocks_cache`` - the daemon's memfd pool, mapped by both the worker
  and the daemon (zero copy: the daemon receives straight into it);
* ``registered``: plain numpy arrays (anonymous memory, as vLLM/torch allocate) registered with
  ``register_blocks_cache`` - the client re-backs them in place with a sealed memfd and hands it
  over; the daemon maps it (zero copy too, after one copy at registration).

Every block starts with a tag (tensor, block) so a pull can be verified without a second copy
of the cache.

With ``DATADIST_BENCH_NPU=1`` (scenario 10: daemons on the ``acl`` backend) caches are NPU memory: the
daemon's DEVICE pool imported by IPC key, or ``aclrtMalloc``'d tensors registered by key; tags are written
and read through a host copy (``aclrtMemcpy``), never by a host load from device memory.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import numpy as np

import llm_datadist as ld
from llm_datadist import views

from .procs import cpu_seconds

_TAG = np.uint64(0x5DA7_0000_0000_0000)


def _tag(salt: int, tensor: int) -> np.uint64:
    return _TAG | (np.uint64(salt) << np.uint64(40)) | (np.uint64(tensor) << np.uint64(24))


def pid(state: dict) -> int:
    return os.getpid()


NPU = os.environ.get("DATADIST_BENCH_NPU") == "1"


def _npu_rows(addr: int, rows: int, cols: int, device: int) -> Any:
    """An NPU tensor of ``rows`` x ``cols`` bytes at ``addr`` on ``device``, seen through host copies (the tests'
    ``NpuTensor``: one implementation of aclrtMemcpy load/store)."""
    from tests.worker_ops import NpuTensor
    return NpuTensor(addr, (rows, cols), np.uint8, device)


def _on_npu(a: Any) -> bool:
    return not isinstance(a, np.ndarray)


def init(state: dict, role: str, cluster_id: int, listen: str | None = None, mem_pool: int = 0,
         timeout_ms: int = 60000, device: int = 0) -> int:
    cfg = ld.LLMConfig()
    cfg.device_id = device
    cfg.enable_cache_manager = True
    cfg.enable_remote_cache_accessible = True
    cfg.sync_kv_timeout = timeout_ms
    if listen:
        cfg.listen_ip_info = listen
    if mem_pool:
        cfg.mem_pool_cfg = f'{{"memory_size": {mem_pool}, "page_shift": 16}}'
    dd = ld.LLMDataDist(getattr(ld.LLMRole, role), cluster_id)
    dd.init(cfg.generate_options())
    state.update(dd=dd, caches={}, arrays={})
    return dd.cluster_id


def shutdown(state: dict) -> None:
    dd = state.pop("dd", None)
    if dd is not None:
        try:
            dd.finalize()
        except Exception:  # noqa: BLE001 - the process is going away
            pass


def cache(state: dict, name: str, memory: str, num_tensors: int, num_blocks: int, block_bytes: int,
          model_id: int | None = None) -> int:
    """A blocks cache (``memory``: ``allocated`` or ``registered``); every page touched, blocks tagged."""
    cm = state["dd"].cache_manager
    shape = [num_blocks, block_bytes]
    desc = ld.CacheDesc(num_tensors, shape, ld.DataType.DT_UINT8, ld.Placement.DEVICE)
    key = ld.BlocksCacheKey(state["dd"].cluster_id, model_id) if model_id is not None else None
    device = state["dd"]._device_id
    if NPU and memory == "allocated":
        c = cm.allocate_blocks_cache(desc, key)
        arrays: list[Any] = [_npu_rows(a, num_blocks, block_bytes, device) for a in c.tensor_addrs]
    elif NPU and memory == "registered":
        from datadist_ascend.acl import acl
        arrays = [_npu_rows(acl().malloc(device, num_blocks * block_bytes), num_blocks, block_bytes, device)
                  for _ in range(num_tensors)]
        c = cm.register_blocks_cache(desc, [a.addr for a in arrays], key)
        state.setdefault("registered", set()).add(c.cache_id)
    elif memory == "allocated":
        c = cm.allocate_blocks_cache(desc, key)
        arrays = [a.reshape(num_blocks, block_bytes) for a in views.numpy_views(c)]
    elif memory == "registered":
        arrays = [np.empty((num_blocks, block_bytes), np.uint8) for _ in range(num_tensors)]
        for a in arrays:
            a.fill(0)  # fault every page in before anything is timed
        c = cm.register_blocks_cache(desc, [a.ctypes.data for a in arrays], key)
        state.setdefault("registered", set()).add(c.cache_id)
    else:
        raise ValueError(f"unknown memory kind {memory!r}")
    state["caches"][name] = c
    state["arrays"][name] = arrays
    tag(state, name)
    return c.cache_id


def tag(state: dict, name: str, salt: int = 0) -> None:
    """Write (salt, tensor, block) into the first 8 bytes of every block (every byte touched once)."""
    for t, a in enumerate(state["arrays"][name]):
        host = a.load() if _on_npu(a) else a
        if a.shape[1] >= 8:
            blocks = np.arange(a.shape[0], dtype=np.uint64)
            host[:, :8].view(np.uint64)[:, 0] = _tag(salt, t) | blocks
        if _on_npu(a):
            a.store(host)


def clear(state: dict, name: str) -> None:
    for a in state["arrays"][name]:
        host = a.load() if _on_npu(a) else a
        host[:, :8] = 0
        if _on_npu(a):
            a.store(host)


def verify(state: dict, name: str, tensors: list[int], src_blocks: list[int], dst_blocks: list[int],
           salt: int = 0) -> int:
    """How many (tensor, block) tags of ``dst_blocks`` differ from what ``src_blocks`` of the source held."""
    arrays = state["arrays"][name]
    wrong = 0
    src = np.asarray(src_blocks, dtype=np.uint64)
    for t in tensors:
        a = arrays[t]
        if a.shape[1] < 8:
            continue
        want = _tag(salt, t) | src
        host = a.load() if _on_npu(a) else a
        got = np.ascontiguousarray(host[dst_blocks, :8]).view(np.uint64)[:, 0]
        wrong += int(np.count_nonzero(got != want))
    return wrong


def link(state: dict, remote_cluster: int, address: str, timeout_ms: int = 10000) -> float:
    """``link_clusters`` to ``address``; returns its wall time in seconds."""
    ip, port = address.rsplit(":", 1)
    info = ld.LLMClusterInfo()
    info.remote_cluster_id = remote_cluster
    info.append_local_ip_info("127.0.0.1", 0)
    info.append_remote_ip_info(ip, int(port))
    t0 = time.perf_counter()
    code, codes = state["dd"].link_clusters([info], timeout_ms)
    seconds = time.perf_counter() - t0
    if code != ld.LLMStatusCode.LLM_SUCCESS:
        raise RuntimeError(f"link_clusters to {address} failed: {code} {codes}")
    state.setdefault("links", {})[remote_cluster] = info
    return seconds


def unlink(state: dict, remote_cluster: int, timeout_ms: int = 10000) -> None:
    info = state["links"].pop(remote_cluster)
    state["dd"].unlink_clusters([info], timeout_ms)


def _transfer(state: dict, op: str, remote_cluster: int, name: str, src_blocks: list[int], dst_blocks: list[int],
              model_id: int) -> None:
    cm = state["dd"].cache_manager
    if op == "pull":
        cm.pull_blocks(ld.BlocksCacheKey(remote_cluster, model_id), state["caches"][name], src_blocks, dst_blocks)
    else:  # push our blocks ``src_blocks`` into the remote cache's ``dst_blocks``
        cm.push_blocks(ld.BlocksCacheKey(remote_cluster, model_id), state["caches"][name], src_blocks, dst_blocks)


def transfer_loop(state: dict, op: str, remote_cluster: int, name: str, tables: list[tuple[list[int], list[int]]],
                  model_id: int = 0, warmup: int = 1) -> list[float]:
    """Run ``op`` (pull/push) once per (src_blocks, dst_blocks) table after ``warmup`` untimed calls;
    returns the seconds of each timed call."""
    for src, dst in tables[:warmup]:
        _transfer(state, op, remote_cluster, name, src, dst, model_id)
    times = []
    for src, dst in tables[warmup:]:
        t0 = time.perf_counter()
        _transfer(state, op, remote_cluster, name, src, dst, model_id)
        times.append(time.perf_counter() - t0)
    return times


def _cpu(pids: tuple[int, ...]) -> list[float]:
    """CPU seconds so far of this process (``process_time``: exact, exited threads included) and then of each of
    ``pids`` (``/proc``, clock ticks)."""
    return [time.process_time(), *cpu_seconds(list(pids))]


def latency_loop(state: dict, remote_cluster: int, name: str, calls: int, num_blocks: int, model_id: int = 0,
                 warmup: int = 50, cpu_of: tuple[int, ...] = (), op: str = "pull") -> tuple[list[float], list[float]]:
    """``calls`` pulls (``op`` "push": pushes) of one block each (rotating block numbers) after ``warmup`` untimed
    ones: (seconds per call, CPU seconds used during the timed calls by this worker and then each process of
    ``cpu_of``)."""
    cm = state["dd"].cache_manager
    move = cm.pull_blocks if op == "pull" else cm.push_blocks
    key = ld.BlocksCacheKey(remote_cluster, model_id)
    c = state["caches"][name]
    out = []
    for i in range(warmup + calls):
        if i == warmup:
            cpu0 = _cpu(cpu_of)
        b = i % num_blocks
        t0 = time.perf_counter()
        move(key, c, [b], [(b * 7 + 3) % num_blocks])
        if i >= warmup:
            out.append(time.perf_counter() - t0)
    return out, [b - a for a, b in zip(cpu0, _cpu(cpu_of), strict=True)]


def in_flight_pulls(state: dict, remote_cluster: int, name: str, depth: int, calls: int, num_blocks: int,
                    model_id: int = 0, cpu_of: tuple[int, ...] = ()) -> tuple[float, list[float], list[float]]:
    """A decode worker pulling for ``depth`` requests at once: ``depth`` threads, released together, each pull
    one block ``calls`` times (thread k lands in blocks k, k + depth, ... modulo ``num_blocks``: no two threads
    share a destination when ``num_blocks`` is a multiple of ``depth``, as scenario 3's 256 and 64). One untimed
    pull per thread first. Returns (wall seconds, seconds per pull, CPU seconds of this worker and
    then each process of ``cpu_of`` from the common start to the last pull's end)."""
    cm = state["dd"].cache_manager
    key = ld.BlocksCacheKey(remote_cluster, model_id)
    c = state["caches"][name]
    cpu: list[list[float]] = []

    def one(k: int, n: int) -> list[float]:
        out = []
        for i in range(n):
            src, dst = (k * 13 + i * 7) % num_blocks, (k + i * depth) % num_blocks
            t0 = time.perf_counter()
            cm.pull_blocks(key, c, [src], [dst])
            out.append(time.perf_counter() - t0)
        return out

    _together(depth, lambda k: one(k, 1))   # warm-up: every thread's first call
    wall, lat = _together(depth, lambda k: one(k, calls), mark=lambda: cpu.append(_cpu(cpu_of)))
    return wall, lat, [b - a for a, b in zip(cpu[0], cpu[1], strict=True)]


def grpc_loop(state: dict, target: str, calls: int, warmup: int = 50) -> list[float]:
    """Bare unary round trips ``DataDist/GetStatus`` to the daemon at ``target`` (a fresh stub, same socket)."""
    import grpc

    from datadist.v1 import datadist_pb2, datadist_pb2_grpc

    out = []
    with grpc.insecure_channel(target) as ch:
        stub = datadist_pb2_grpc.DataDistStub(ch)
        req = datadist_pb2.StatusRequest()
        for i in range(warmup + calls):
            t0 = time.perf_counter()
            stub.GetStatus(req, timeout=10)
            if i >= warmup:
                out.append(time.perf_counter() - t0)
    return out


def health_loop(state: dict, address: str, calls: int, warmup: int = 50) -> list[float]:
    """Bare unary round trips ``grpc.health.v1.Health/Check`` to a peer listener over TCP (one channel)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    out = []
    with grpc.insecure_channel(address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        req = health_pb2.HealthCheckRequest(service="")
        for i in range(warmup + calls):
            t0 = time.perf_counter()
            stub.Check(req, timeout=10)
            if i >= warmup:
                out.append(time.perf_counter() - t0)
    return out


def fresh_grpc_call(state: dict, address: str, calls: int) -> list[float]:
    """Seconds for a fresh gRPC channel over TCP to ``address`` plus its first call (health Check)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        with grpc.insecure_channel(address) as ch:
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
            out.append(time.perf_counter() - t0)
    return out


def concurrent_pulls(state: dict, remote_cluster: int, name: str, threads: int, calls: int, blocks: int,
                     model_id: int = 0, seed: int = 0) -> tuple[float, list[float], int]:
    """``threads`` threads each pull ``calls`` times ``blocks`` random source blocks into their own
    destination blocks; returns (wall seconds from the common start, per-call seconds, bytes moved)."""
    cm = state["dd"].cache_manager
    key = ld.BlocksCacheKey(remote_cluster, model_id)
    c = state["caches"][name]
    arrays = state["arrays"][name]
    dst_blocks = arrays[0].shape[0]
    per_call = blocks * arrays[0].shape[1] * len(arrays)
    plans = []
    for k in range(threads):
        rng = np.random.default_rng(seed * 1000 + k)
        dst = [(k * blocks + i) % dst_blocks for i in range(blocks)]
        plans.append([(rng.choice(state.get("remote_blocks", dst_blocks), blocks, replace=False).tolist(), dst)
                      for _ in range(calls)])
    def one(k: int) -> list[float]:
        out = []
        for src, dst in plans[k]:
            t0 = time.perf_counter()
            cm.pull_blocks(key, c, src, dst)
            out.append(time.perf_counter() - t0)
        return out

    wall, lat = _together(threads, one)
    return wall, lat, per_call * threads * calls


def _together(threads: int, work: Any, mark: Any = None) -> tuple[float, list[float]]:
    """Run ``work(k)`` (-> seconds per call) in ``threads`` threads released at once; (wall seconds from the
    common start, every thread's seconds); the first error of any thread is raised. ``mark()``, if given, is
    called at the common start and after the last thread ended (CPU counters around the work alone)."""
    lat: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads + 1)

    def run(k: int) -> None:
        try:
            barrier.wait()
            lat[k] = work(k)
        except BaseException as exc:  # noqa: BLE001 - reported to the bench
            errors.append(exc)

    ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    if mark is not None:
        mark()
    barrier.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    if mark is not None:
        mark()
    if errors:
        raise errors[0]
    return wall, [x for lst in lat for x in lst]


def remote_blocks(state: dict, n: int) -> None:
    """How many blocks the remote cache of ``concurrent_pulls`` has (source blocks are drawn from them)."""
    state["remote_blocks"] = n


def drop(state: dict, name: str) -> None:
    """Deallocate (allocated) or unregister (registered) cache ``name``."""
    c = state["caches"].pop(name)
    arrays = state["arrays"].pop(name, None) or []
    cm = state["dd"].cache_manager
    if c.cache_id in state.setdefault("registered", set()):
        cm.unregister_cache(c.cache_id)
        for a in arrays:
            if _on_npu(a):   # the worker's own NPU memory: freed once the daemon let it go
                from datadist_ascend.acl import acl
                acl().free(a.device, a.addr)
    else:
        cm.deallocate_blocks_cache(c)


def start_at(state: dict, when: float) -> None:
    """Sleep until the wall clock reaches ``when`` (lines several worker processes up)."""
    delay = when - time.time()
    if delay > 0:
        time.sleep(delay)


def concurrent_pulls_at(state: dict, when: float, *args: Any, **kwargs: Any) -> tuple[float, list[float], int]:
    start_at(state, when)
    return concurrent_pulls(state, *args, **kwargs)


def layerwise(state: dict, remote_cluster: int, name: str, layers: int, compute_s: float, src_blocks: list[int],
              dst_blocks: list[int], model_id: int = 0, timeout_s: float = 120.0) -> tuple[float, list[float]]:
    """``transfer_cache_async`` of layers ``[0, layers)`` to ``remote_cluster``'s blocks cache, with a
    synchronizer that 'computes' ``compute_s`` per layer (sleeps) before reporting it ready.

    Returns (seconds from the call until the task finished, when each layer was reported ready)."""
    cm = state["dd"].cache_manager
    c = state["caches"][name]
    ready: list[float] = []

    class Compute(ld.LayerSynchronizer):
        def synchronize_layer(self, layer_index: int, timeout_in_millis: int | None = None) -> bool:
            time.sleep(compute_s)
            ready.append(time.perf_counter())
            return True

    cfg = ld.TransferWithCacheKeyConfig(ld.BlocksCacheKey(remote_cluster, model_id), range(0, layers),
                                        range(0, layers))
    t0 = time.perf_counter()
    task = cm.transfer_cache_async(c, Compute(), [cfg], src_blocks, dst_blocks)
    code = task.synchronize(int(timeout_s * 1000))
    total = time.perf_counter() - t0
    if code != ld.LLMStatusCode.LLM_SUCCESS:
        raise RuntimeError(f"transfer_cache_async failed: {code} {task.get_results(0)}")
    return total, [r - t0 for r in ready]


def memcpy_setup(state: dict, num_tensors: int, num_blocks: int, block_bytes: int) -> None:
    """Two sets of ``num_tensors`` arrays of ``num_blocks`` x ``block_bytes`` bytes, every page touched."""
    state["memcpy"] = ([np.full((num_blocks, block_bytes), 1, np.uint8) for _ in range(num_tensors)],
                       [np.full((num_blocks, block_bytes), 2, np.uint8) for _ in range(num_tensors)])


def memcpy_once(state: dict, src_blocks: list[int], dst_blocks: list[int]) -> tuple[float, float]:
    """numpy copies between the two sets: (block-by-block slice copies of the table, one contiguous copy
    of the same number of bytes per tensor), seconds each."""
    src, dst = state["memcpy"]
    n = len(src_blocks) * src[0].shape[1]
    t0 = time.perf_counter()
    for s_t, d_t in zip(src, dst, strict=True):
        for s, d in zip(src_blocks, dst_blocks, strict=True):
            d_t[d] = s_t[s]
    t1 = time.perf_counter()
    for s_t, d_t in zip(src, dst, strict=True):
        np.copyto(d_t.reshape(-1)[:n], s_t.reshape(-1)[:n])
    return t1 - t0, time.perf_counter() - t1


def memcpy_done(state: dict) -> None:
    state.pop("memcpy", None)


def model_requests(state: dict, op: str, remote_cluster: int, caches: list[tuple[str, int]], in_flight: int,
                   requests: int, blocks: int, src_blocks: int, dst_blocks: int) -> tuple[float, list[float], int]:
    """Requests shaped like a model's KV cache: one request = ``op`` (pull/push) of ``blocks`` blocks on every
    cache of ``caches`` ((name, model_id): DeepSeek's MLA has a "rope" and a "latent" cache, a GQA model one
    cache of K and V tensors), run by ``in_flight`` threads, ``requests`` each.

    Request ``i`` uses the source blocks ``[(i * blocks) % src_blocks, ...)`` and the destination blocks of its
    thread's slot (``k * blocks`` modulo ``dst_blocks``): with more requests in flight than slots, requests
    share destination blocks, whose bytes are then the same anyway (see docs/performance.md).
    Returns (wall seconds from the common start, seconds per request, bytes moved)."""
    cm = state["dd"].cache_manager
    per_request = sum(blocks * state["arrays"][name][0].shape[1] * len(state["arrays"][name]) for name, _ in caches)
    def one(k: int) -> list[float]:
        out = []
        for r in range(requests):
            i = k * requests + r
            here = [(k * blocks + j) % dst_blocks for j in range(blocks)]
            there = [(i * blocks + j) % src_blocks for j in range(blocks)]
            t0 = time.perf_counter()
            for name, model_id in caches:
                key = ld.BlocksCacheKey(remote_cluster, model_id)
                if op == "pull":
                    cm.pull_blocks(key, state["caches"][name], there, here)
                else:
                    cm.push_blocks(key, state["caches"][name], here, there)
            out.append(time.perf_counter() - t0)
        return out

    wall, lat = _together(in_flight, one)
    return wall, lat, per_request * in_flight * requests


# ---- scenarios 12-14: calls per pull, links at rest, a peer's death -------------------------------------------

def count_pull_calls(state: dict, remote_cluster: int, name: str, calls: int, num_blocks: int,
                     model_id: int = 0) -> int:
    """``calls`` 1-block pulls with a profile hook on this thread (and threads started meanwhile): the ``"call"``
    events it saw (Python functions entered, generators resumed; C functions not counted), the API entry
    included."""
    import itertools
    import sys

    cm = state["dd"].cache_manager
    key = ld.BlocksCacheKey(remote_cluster, model_id)
    c = state["caches"][name]
    counter = itertools.count()

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            next(counter)

    threading.setprofile(hook)
    sys.setprofile(hook)
    try:
        for i in range(calls):
            b = i % num_blocks
            cm.pull_blocks(key, c, [b], [(b * 7 + 3) % num_blocks])
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return next(counter)


def link_engines(state: dict, clusters: list[int], remote_cluster: int, address: str,
                 timeout_ms: int = 20000) -> None:
    """One engine per cluster id of ``clusters`` on this worker's daemon (bare ``Init``: no cache, no pool), each
    linked to ``remote_cluster`` at ``address``: one link each, between the same two daemons. Engines made by an
    earlier call stay (``state["engines"]``); a cluster that has one is only linked."""
    from datadist.v1 import datadist_pb2
    from tests.reliability.common import stub

    make_engines(state, clusters)
    engines: dict[int, int] = state["engines"]
    ip, port = address.rsplit(":", 1)
    with stub(state["attached"]) as s:
        for cluster in clusters:
            link = datadist_pb2.ClusterLink(remote_cluster_id=remote_cluster)
            link.remote_ip_info.add(ip=ip, port=int(port))
            resp = s.LinkClusters(datadist_pb2.LinkClustersRequest(engine_id=engines[cluster], clusters=[link],
                                                                   timeout_ms=timeout_ms),
                                  timeout=timeout_ms / 1000 + 5)
            if resp.status:
                raise RuntimeError(f"engine of cluster {cluster}: link_clusters to {address} failed: {resp.status} "
                                   f"{list(resp.reasons)}")


def make_engines(state: dict, clusters: list[int]) -> None:
    """One engine per cluster id of ``clusters`` not made yet on this worker's daemon (bare ``Init`` over the worker
    socket as this process's attached worker: no cache, no pool; ``state["engines"]``): a baseline of
    ``link_engines`` holds them before any link."""
    from types import SimpleNamespace

    from datadist.v1 import common_pb2, datadist_pb2
    from tests.reliability.common import stub

    engines: dict[int, int] = state.setdefault("engines", {})
    # the attach connection is kept with the state: the engines live as long as it does
    daemon = state.setdefault("attached", SimpleNamespace(target=os.environ["DATADIST_DAEMON"]))
    with stub(daemon) as s:
        for cluster in clusters:
            if cluster not in engines:
                engines[cluster] = s.Init(datadist_pb2.InitRequest(
                    cluster_id=cluster, role=common_pb2.ROLE_DECODER, pid=os.getpid(),
                    options={"llm.EnableCacheManager": "1"}), timeout=30).engine_id


def pull_outcome(state: dict, remote_cluster: int, name: str, src: list[int], dst: list[int],
                 model_id: int = 0) -> tuple[str, float]:
    """One pull: ("OK" or its status code's name, ``time.monotonic()`` when it ended -- the machine's clock, so
    the bench compares it with its own)."""
    try:
        _transfer(state, "pull", remote_cluster, name, src, dst, model_id)
        outcome = "OK"
    except ld.LLMException as exc:
        outcome = exc.status_code.name
    return outcome, time.monotonic()


# ---- scenario 15: CANN's HIXL engine beside the LLM-DataDist engine of the same worker -------------------------

def hixl_engine(state: dict, local_engine: str, nbytes: int, fill: int = 0) -> int:
    """A HIXL engine of this worker (beside its ``LLMDataDist``) with one registration of ``nbytes`` host bytes
    (a numpy array, every page touched, filled with ``fill``); returns the registration's address."""
    import hixl

    engine = hixl.Hixl()
    assert engine.initialize(local_engine, {}) == hixl.SUCCESS
    mem = np.full(nbytes, fill, np.uint8)
    status, handle = engine.register_mem(hixl.MemDesc(mem.ctypes.data, nbytes), hixl.MemType.MEM_HOST)
    assert status == hixl.SUCCESS, status
    state["hixl"] = (engine, mem, handle)
    return int(mem.ctypes.data)


def hixl_connect(state: dict, remote_engine: str, remote_addr: int) -> None:
    import hixl

    engine = state["hixl"][0]
    assert engine.connect(remote_engine, timeout_in_millis=10000) == hixl.SUCCESS
    state["hixl_remote"] = (remote_engine, remote_addr)


def _hixl_ops(state: dict, size: int, slots: int, k: int) -> list[Any]:
    import hixl

    _, mem, _ = state["hixl"]
    _, remote = state["hixl_remote"]
    at = (k % slots) * size
    return [hixl.TransferOpDesc(mem.ctypes.data + at, remote + (k * 7 + 3) % slots * size, size)]


def hixl_sync_loop(state: dict, calls: int, size: int, slots: int, warmup: int = 50) -> list[float]:
    """``calls`` ``transfer_sync`` READs of one ``size``-byte extent each (rotating slots) after ``warmup`` untimed
    ones: seconds per call."""
    import hixl

    engine = state["hixl"][0]
    name = state["hixl_remote"][0]
    out = []
    for i in range(warmup + calls):
        ops = _hixl_ops(state, size, slots, i)
        t0 = time.perf_counter()
        status = engine.transfer_sync(name, hixl.TransferOp.READ, ops, timeout_in_millis=10000)
        if i >= warmup:
            out.append(time.perf_counter() - t0)
        assert status == hixl.SUCCESS, status
    return out


def hixl_async_flight(state: dict, depth: int, calls: int, size: int, slots: int) -> tuple[float, list[float]]:
    """One thread keeps ``depth`` ``transfer_async`` READs of one ``size``-byte extent in flight, ``calls`` in all
    (after ``depth`` untimed ones): (wall seconds, seconds from each request's submit to the poll that saw it
    COMPLETED)."""
    import hixl

    engine = state["hixl"][0]
    name = state["hixl_remote"][0]
    done_status = hixl.TransferStatus.COMPLETED

    def submit(k: int) -> tuple[int, float]:
        status, req = engine.transfer_async(name, hixl.TransferOp.READ, _hixl_ops(state, size, slots, k))
        assert status == hixl.SUCCESS, status
        return req, time.perf_counter()

    def drain(n: int, lat: list[float] | None) -> None:
        flight = [submit(k) for k in range(min(depth, n))]
        sent = len(flight)
        while flight:
            req, t0 = flight[0]
            status, state_ = engine.get_transfer_status(req)
            assert status == hixl.SUCCESS, status
            if state_ == hixl.TransferStatus.WAITING:
                continue
            assert state_ == done_status, state_
            flight.pop(0)
            if lat is not None:
                lat.append(time.perf_counter() - t0)
            if sent < n:
                flight.append(submit(sent))
                sent += 1

    drain(depth, None)
    lat: list[float] = []
    t0 = time.perf_counter()
    drain(calls, lat)
    return time.perf_counter() - t0, lat


def hixl_close(state: dict) -> None:
    engine, _, handle = state.pop("hixl")
    name = state.pop("hixl_remote", (None,))[0]
    if name is not None:
        engine.disconnect(name, timeout_in_millis=10000)
    engine.deregister_mem(handle)
    engine.finalize()
