"""Operations a test ``Worker`` process runs on request (first argument: the worker's state dict).

Every op uses only the public ``llm_datadist`` API (plus ``llm_datadist.views``), as a real
prompt or decoder worker would.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

import numpy as np

import llm_datadist as ld
from llm_datadist import views

DTYPES = {"float16": (ld.DataType.DT_FLOAT16, np.float16), "float32": (ld.DataType.DT_FLOAT, np.float32),
          "int8": (ld.DataType.DT_INT8, np.int8), "uint8": (ld.DataType.DT_UINT8, np.uint8),
          "int16": (ld.DataType.DT_INT16, np.int16)}


#: set by the acl planes (tests.harness.ACL_PLANES): DEVICE tensors are NPU memory of the (simulated) runtime,
#: reached only through aclrtMemcpy -- never a host load or store, as on an Ascend host
NPU = os.environ.get("DATADIST_TEST_NPU") == "1"


class NpuTensor:
    """A tensor in NPU memory: ``shape``/``dtype`` like numpy's; bytes move with ``aclrtMemcpy``."""

    def __init__(self, addr: int, shape: tuple, dtype: Any, device: int = 0) -> None:
        self.addr, self.shape, self.dtype, self.device = addr, tuple(shape), np.dtype(dtype), device
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize

    @classmethod
    def allocate(cls, shape: tuple, dtype: Any, device: int = 0) -> "NpuTensor":
        from datadist_ascend.acl import acl
        t = cls(0, shape, dtype, device)
        t.addr = acl().malloc(device, t.nbytes)
        t.store(np.zeros(t.shape, t.dtype))
        return t

    def load(self) -> np.ndarray:
        from datadist_ascend.acl import MEMCPY_DEVICE_TO_HOST, acl
        out = np.empty(self.shape, self.dtype)
        acl().memcpy(self.device, out.ctypes.data, self.nbytes, self.addr, self.nbytes, MEMCPY_DEVICE_TO_HOST)
        return out

    def store(self, arr: np.ndarray) -> None:
        from datadist_ascend.acl import MEMCPY_HOST_TO_DEVICE, acl
        src = np.ascontiguousarray(arr).view(np.uint8).reshape(-1)
        assert src.size == self.nbytes
        acl().memcpy(self.device, self.addr, self.nbytes, src.ctypes.data, self.nbytes, MEMCPY_HOST_TO_DEVICE)


def _new_tensor(state: dict, shape: tuple, np_dt: Any, placement: str) -> Any:
    """A tensor the worker owns: NPU memory on its engine's device (acl planes, DEVICE) or a numpy array."""
    if NPU and placement == "DEVICE":
        return NpuTensor.allocate(shape, np_dt, state["dd"]._device_id)
    return np.zeros(shape, dtype=np_dt)


def _addr(t: Any) -> int:
    return t.addr if isinstance(t, NpuTensor) else t.ctypes.data


def _load(t: Any) -> np.ndarray:
    """The tensor's contents on the host (a view for host memory, a copy for NPU memory)."""
    return t.load() if isinstance(t, NpuTensor) else t


def _store(t: Any, arr: np.ndarray) -> None:
    if isinstance(t, NpuTensor):
        t.store(arr)
    else:
        t.reshape(-1).view(np.uint8)[:] = arr.reshape(-1).view(np.uint8)


def pid(state: dict) -> int:
    return os.getpid()


def init(state: dict, role: str, cluster_id: int, listen: str | None = None, sync_kv_timeout: int | None = None,
         mem_pool: int | None = None, host_mem_pool: int | None = None, remote_cache_accessible: bool | None = None,
         extra: dict | None = None) -> int:
    cfg = ld.LLMConfig()
    cfg.device_id = 0
    cfg.enable_cache_manager = True
    if listen:
        cfg.listen_ip_info = listen
    if sync_kv_timeout:
        cfg.sync_kv_timeout = sync_kv_timeout
    if mem_pool:
        cfg.mem_pool_cfg = f'{{"memory_size": {mem_pool}, "page_shift": 16}}'
    if host_mem_pool:
        cfg.host_mem_pool_cfg = f'{{"memory_size": {host_mem_pool}, "page_shift": 16}}'
    if remote_cache_accessible is not None:
        cfg.enable_remote_cache_accessible = remote_cache_accessible
    options = cfg.generate_options()
    options.update(extra or {})
    dd = ld.LLMDataDist(getattr(ld.LLMRole, role), cluster_id)
    dd.init(options)
    state["dd"] = dd
    state["caches"] = {}
    state["arrays"] = {}
    return dd.cluster_id


def finalize(state: dict) -> None:
    state.pop("dd").finalize()


def _cm(state: dict) -> Any:
    return state["dd"].cache_manager


def register_blocks(state: dict, name: str, num_tensors: int, num_blocks: int, block_shape: tuple,
                    dtype: str = "float16",
                    model_id: int | None = None, remote_accessible: bool | None = None,
                    placement: str = "DEVICE") -> int:
    """vLLM-style: the worker allocates its own (anonymous) KV tensors and registers them."""
    dt, np_dt = DTYPES[dtype]
    shape = (num_blocks, *block_shape)
    arrays = [_new_tensor(state, shape, np_dt, placement) for _ in range(num_tensors)]
    desc = ld.CacheDesc(num_tensors, list(shape), dt, getattr(ld.Placement, placement))
    key = ld.BlocksCacheKey(state["dd"].cluster_id, model_id) if model_id is not None else None
    cache = _cm(state).register_blocks_cache(desc, [_addr(a) for a in arrays], key,
                                             remote_accessible=remote_accessible)
    state["caches"][name] = cache
    state["arrays"][name] = arrays
    return cache.cache_id


def register_cache(state: dict, name: str, num_tensors: int, shape: tuple, dtype: str = "float16",
                   keys: list | None = None, remote_accessible: bool | None = None, placement: str = "DEVICE") -> int:
    dt, np_dt = DTYPES[dtype]
    arrays = [_new_tensor(state, shape, np_dt, placement) for _ in range(num_tensors)]
    desc = ld.CacheDesc(num_tensors, list(shape), dt, getattr(ld.Placement, placement))
    cache_keys = [ld.CacheKey(state["dd"].cluster_id, *k) for k in (keys or [])]
    cache = _cm(state).register_cache(desc, [_addr(a) for a in arrays], cache_keys,
                                      remote_accessible=remote_accessible)
    state["caches"][name] = cache
    state["arrays"][name] = arrays
    return cache.cache_id


def allocate(state: dict, name: str, num_tensors: int, shape: tuple, dtype: str = "float16", blocks: bool = False,
             keys: list | None = None, model_id: int | None = None, placement: str = "DEVICE") -> int:
    dt, np_dt = DTYPES[dtype]
    desc = ld.CacheDesc(num_tensors, list(shape), dt, getattr(ld.Placement, placement))
    cm = _cm(state)
    if blocks:
        key = ld.BlocksCacheKey(state["dd"].cluster_id, model_id) if model_id is not None else None
        cache = cm.allocate_blocks_cache(desc, key)
    else:
        cache = cm.allocate_cache(desc, [ld.CacheKey(state["dd"].cluster_id, *k) for k in (keys or [])])
    state["caches"][name] = cache
    if NPU and placement == "DEVICE":
        state["arrays"][name] = [NpuTensor(a, shape, np_dt, state["dd"]._device_id) for a in cache.tensor_addrs]
    else:
        state["arrays"][name] = views.numpy_views(cache)
    return cache.cache_id


def addresses(state: dict, name: str) -> list[int]:
    """Where cache ``name``'s tensors are (the daemon's memory: the same pages for another cache that took them)."""
    return list(state["caches"][name].tensor_addrs)


def _arrays(state: dict, name: str) -> list:
    return state["arrays"][name]


def fill(state: dict, name: str, seed: int) -> None:
    """Deterministic bytes: tensor i is filled from rng(seed * 1000 + i)."""
    for i, arr in enumerate(_arrays(state, name)):
        _store(arr, np.random.default_rng(seed * 1000 + i).integers(0, 256, arr.nbytes, dtype=np.uint8))


def zero(state: dict, name: str) -> None:
    for arr in _arrays(state, name):
        _store(arr, np.zeros(arr.nbytes, np.uint8))


def rows(state: dict, name: str, tensor_indices: list | None = None, row_indices: list | None = None) -> np.ndarray:
    """Bytes of the selected rows (blocks / batch slots): array [tensor, row, bytes] (uint8)."""
    arrays = _arrays(state, name)
    idx = range(len(arrays)) if tensor_indices is None else tensor_indices
    out = []
    for i in idx:
        a = _load(arrays[i])
        per = a.reshape(a.shape[0], -1).view(np.uint8)
        out.append(per if row_indices is None else per[list(row_indices)])
    return np.stack(out).copy()


def digest(state: dict, name: str) -> list[str]:
    return [hashlib.sha256(_load(a).reshape(-1).view(np.uint8).tobytes()).hexdigest() for a in _arrays(state, name)]


def link(state: dict, remote_cluster: int, remote_ip: str, remote_port: int, timeout: int = 3000,
         local_ip: str = "127.0.0.1") -> tuple:
    info = ld.LLMClusterInfo()
    info.remote_cluster_id = remote_cluster
    info.append_local_ip_info(local_ip, 0)
    info.append_remote_ip_info(remote_ip, remote_port)
    code, codes = state["dd"].link_clusters([info], timeout)
    return int(code), [int(c) for c in codes]


def unlink(state: dict, remote_cluster: int, remote_ip: str, remote_port: int, timeout: int = 3000,
           force: bool = False) -> tuple:
    info = ld.LLMClusterInfo()
    info.remote_cluster_id = remote_cluster
    info.append_local_ip_info("127.0.0.1", 0)
    info.append_remote_ip_info(remote_ip, remote_port)
    code, codes = state["dd"].unlink_clusters([info], timeout, force)
    return int(code), [int(c) for c in codes]


def _ranges(kw: dict) -> dict:
    out = dict(kw)
    for k in ("src_layer_range", "dst_layer_range"):
        if isinstance(out.get(k), (list, tuple)):
            out[k] = range(*out[k])
    return out


def pull_blocks(state: dict, remote_cluster: int, dst: str, src_blocks: list, dst_blocks: list, model_id: int = 0,
                key: tuple | None = None, **kw: Any) -> None:
    if key is None:
        src_key: Any = ld.BlocksCacheKey(remote_cluster, model_id)
    elif key[0] == "id":
        src_key = ld.CacheKeyByIdAndIndex(remote_cluster, key[1], key[2])
    else:
        src_key = ld.CacheKey(remote_cluster, *key[1:])
    _cm(state).pull_blocks(src_key, state["caches"][dst], src_blocks, dst_blocks, **_ranges(kw))


def pull_cache(state: dict, remote_cluster: int, dst: str, key: tuple, batch_index: int = 0, size: int = -1,
               **kw: Any) -> None:
    if key[0] == "id":
        src_key: Any = ld.CacheKeyByIdAndIndex(remote_cluster, key[1], key[2])
    else:
        src_key = ld.CacheKey(remote_cluster, *key[1:])
    _cm(state).pull_cache(src_key, state["caches"][dst], batch_index, size, **_ranges(kw))


def push_blocks(state: dict, remote_cluster: int, src: str, src_blocks: list, dst_blocks: list, model_id: int = 0,
                **kw: Any) -> None:
    _cm(state).push_blocks(ld.BlocksCacheKey(remote_cluster, model_id), state["caches"][src], src_blocks,
                           dst_blocks, **_ranges(kw))


def push_cache(state: dict, remote_cluster: int, src: str, cache_id: int, batch_index: int = 0,
               src_batch_index: int = 0, **kw: Any) -> None:
    _cm(state).push_cache(ld.CacheKeyByIdAndIndex(remote_cluster, cache_id, batch_index), state["caches"][src],
                          src_batch_index, **_ranges(kw))


def copy_blocks(state: dict, name: str, info: dict) -> None:
    _cm(state).copy_blocks(state["caches"][name], info)


def swap_blocks(state: dict, src: str, dst: str, mapping: dict) -> None:
    _cm(state).swap_blocks(state["caches"][src], state["caches"][dst], mapping)


def deallocate(state: dict, name: str) -> None:
    cache = state["caches"].pop(name)
    state["arrays"].pop(name, None)
    if cache.is_blocks_cache:
        _cm(state).deallocate_blocks_cache(cache)
    else:
        _cm(state).deallocate_cache(cache)


def remove_cache_key(state: dict, req_id: int, model_id: int = 0) -> None:
    _cm(state).remove_cache_key(ld.CacheKey(state["dd"].cluster_id, req_id, model_id))


def exit_now(state: dict) -> None:
    os._exit(0)


def _infos(cluster_ids: list, port: int) -> list:
    infos = []
    for cid in cluster_ids:
        info = ld.LLMClusterInfo()
        info.remote_cluster_id = cid
        info.append_local_ip_info("127.0.0.1", 0)
        info.append_remote_ip_info("127.0.0.1", port)
        infos.append(info)
    return infos


def link_many(state: dict, cluster_ids: list, port: int, timeout: int = 2000) -> tuple:
    code, codes = state["dd"].link_clusters(_infos(cluster_ids, port), timeout)
    return int(code), [int(c) for c in codes]


def unlink_many(state: dict, cluster_ids: list, port: int, timeout: int = 2000) -> tuple:
    code, codes = state["dd"].unlink_clusters(_infos(cluster_ids, port), timeout)
    return int(code), [int(c) for c in codes]


def comm_link(state: dict, name: str, members: list, rank_table: str) -> int:
    return state["dd"].link(name, {c: r for c, r in members}, rank_table)


def comm_status(state: dict, comm_id: int) -> str:
    return state["dd"].query_register_mem_status(comm_id).name


def comm_unlink(state: dict, comm_id: int) -> None:
    state["dd"].unlink(comm_id)


def try_register_after_link(state: dict) -> str:
    """CANN: remote_accessible=True is refused after link(); the default turns False."""
    arr = np.zeros((4, 16), np.float16)
    desc = ld.CacheDesc(1, [4, 16], ld.DataType.DT_FLOAT16)
    try:
        _cm(state).register_blocks_cache(desc, [arr.ctypes.data], remote_accessible=True)
    except ld.LLMException as exc:
        return exc.status_code.name
    return "accepted"


# ---- reliability tests (issue 7) ---------------------------------------------------------------

def run(state: dict, module: str, func: str, *args: Any, **kwargs: Any) -> Any:
    """Run ``module.func(state, *args, **kwargs)`` in this worker (test packages keep their own ops)."""
    import importlib

    return getattr(importlib.import_module(module), func)(state, *args, **kwargs)


def register_shared(state: dict, name: str, kind: str, num_tensors: int, num_blocks: int, block_bytes: int,
                    model_id: int | None = None) -> str:
    """Register worker memory that lives in a shareable mapping (a /dev/shm file or a memfd)."""
    import mmap
    import tempfile

    size = num_blocks * block_bytes
    if kind == "memfd":
        fd = os.memfd_create(f"datadist-test-{name}")
    else:
        f = tempfile.NamedTemporaryFile(dir="/dev/shm", prefix="datadist-test-", delete=True)
        state.setdefault("files", []).append(f)
        fd = f.fileno()
    os.ftruncate(fd, size * num_tensors)
    mm = mmap.mmap(fd, size * num_tensors, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    state.setdefault("mmaps", []).append(mm)
    if kind == "memfd":
        state.setdefault("fds", []).append(fd)
    whole = np.frombuffer(mm, dtype=np.uint8)
    arrays = [whole[i * size:(i + 1) * size].reshape(num_blocks, block_bytes) for i in range(num_tensors)]
    desc = ld.CacheDesc(num_tensors, [num_blocks, block_bytes], ld.DataType.DT_UINT8)
    key = ld.BlocksCacheKey(state["dd"].cluster_id, model_id) if model_id is not None else None
    cache = _cm(state).register_blocks_cache(desc, [a.ctypes.data for a in arrays], key)
    state["caches"][name] = cache
    state["arrays"][name] = arrays
    from llm_datadist import _memory

    # the file itself went to the daemon: nothing of this process had to be re-backed
    return "shared_file" if not _memory._rebacked else "rebacked"


def capture_logs(state: dict) -> None:
    """Keep this worker's ``llm_datadist`` log records from now on (read them with ``logs``)."""
    import logging

    records: list[str] = state.setdefault("logs", [])

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger("llm_datadist")
    logger.addHandler(Keep(logging.INFO))
    logger.setLevel(logging.INFO)   # the library configures no level: INFO records would stop at the root's WARNING


def logs(state: dict, wait_for: str = "", timeout: float = 5.0) -> str:
    """The captured records, after waiting (bounded) for one containing ``wait_for``."""
    deadline = time.monotonic() + timeout
    while wait_for and not any(wait_for in r for r in state.get("logs", [])) and time.monotonic() < deadline:
        time.sleep(0.02)
    return "\n".join(state.get("logs", []))
