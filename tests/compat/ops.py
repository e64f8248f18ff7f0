"""Worker-side operations of the caller scenarios (run with ``worker.call("run", "tests.compat.ops", ...)``).

Each reproduces what one public caller of LLM-DataDist does with the public ``llm_datadist`` API:
the same classes, argument shapes, option keys, thread counts and retry-on-code logic, on numpy
memory. Written from reading those callers, not copied from them.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

import llm_datadist as ld
from tests.worker_ops import _ranges


def _cm(state: dict) -> Any:
    return state["dd"].cache_manager


def blocks_threads(state: dict, method: str, remote_cluster: int, cache: str, jobs: list, threads: int = 12,
                   model_id: int = 0) -> list:
    """``threads`` threads call ``push_blocks`` or ``pull_blocks`` (``method``) at once, one job
    (src_blocks, dst_blocks) each, as SGLang's transfer pool does; returns one status name per job
    ("LLM_SUCCESS" or the ``LLMException``'s code)."""
    call = getattr(_cm(state), method)
    key, local = ld.BlocksCacheKey(remote_cluster, model_id), state["caches"][cache]

    def one(job: tuple) -> str:
        src_blocks, dst_blocks = job
        try:
            call(key, local, list(src_blocks), list(dst_blocks))
        except ld.LLMException as exc:
            return exc.status_code.name
        return "LLM_SUCCESS"

    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(one, jobs))


def cluster_info(remote_cluster: int, remote_ip: str, remote_port: int, local_ip: str = "127.0.0.1",
                 local_port: int = 0) -> Any:
    info = ld.LLMClusterInfo()
    info.remote_cluster_id = remote_cluster
    info.append_local_ip_info(local_ip, local_port)
    info.append_remote_ip_info(remote_ip, remote_port)
    return info


# ---- shapes the callers use ----------------------------------------------------------------------

NP = {"DT_FLOAT": np.float32, "DT_FLOAT16": np.float16, "DT_BF16": np.uint16, "DT_INT8": np.int8,
      "DT_UINT8": np.uint8}


def init(state: dict, role: str, cluster_id: int, config: dict, extra: dict | None = None) -> dict:
    """``LLMConfig`` with the caller's attributes (``config``), ``generate_options()``, ``init``."""
    cfg = ld.LLMConfig()
    for name, value in config.items():
        setattr(cfg, name, value)
    options = cfg.generate_options()
    options.update(extra or {})
    dd = ld.LLMDataDist(getattr(ld.LLMRole, role), cluster_id)
    dd.init(options)
    state.update(dd=dd, caches={}, arrays={})
    return dict(options)


def init_raw(state: dict, role: str, cluster_id: int, options: dict) -> None:
    """``init`` with a raw option dict (vllm-ascend's V0 connector)."""
    dd = ld.LLMDataDist(getattr(ld.LLMRole, role), cluster_id)
    dd.init(dict(options))
    state.update(dd=dd, caches={}, arrays={})


def register_blocks(state: dict, name: str, tensors: list, dtype: str = "DT_FLOAT",
                    key: tuple | None = None, placement: str = "DEVICE") -> int:
    """The caller allocated its own tensors (``tensors``: one (shape, fill value) each) and registers them
    as one blocks cache; ``key`` = (cluster_id, model_id) of the ``BlocksCacheKey`` or None."""
    arrays = [np.full(tuple(shape), value, dtype=NP[dtype]) for shape, value in tensors]
    desc = ld.CacheDesc(num_tensors=len(arrays), shape=list(arrays[0].shape), data_type=getattr(ld.DataType, dtype),
                        placement=getattr(ld.Placement, placement))
    blocks_key = ld.BlocksCacheKey(*key) if key is not None else None
    cache = _cm(state).register_blocks_cache(desc, [a.ctypes.data for a in arrays], blocks_key)
    state["caches"][name] = cache
    state["arrays"][name] = arrays
    return cache.cache_id


def link_clusters(state: dict, clusters: list, timeout: int = 5000) -> tuple:
    """``clusters``: (remote_cluster_id, remote_ip, remote_port, local_ip, local_port) each."""
    infos = [cluster_info(c, rip, rport, lip, lport) for c, rip, rport, lip, lport in clusters]
    code, codes = state["dd"].link_clusters(infos, timeout)
    return code.name, [c.name for c in codes]


def unlink_clusters(state: dict, clusters: list, timeout: int = 5000, force: bool = False) -> tuple:
    """``clusters``: (remote_cluster_id, remote_ip or None, remote_port) each; no local ip, as CANN's samples."""
    infos = []
    for cid, rip, rport in clusters:
        info = ld.LLMClusterInfo()
        info.remote_cluster_id = cid
        if rip is not None:
            info.append_remote_ip_info(rip, rport)
        infos.append(info)
    code, codes = state["dd"].unlink_clusters(infos, timeout, force=force)
    return code.name, [c.name for c in codes]


def pull_blocks(state: dict, remote_cluster: int, model_id: int, dst: str, src_blocks: list, dst_blocks: list,
                **kw: Any) -> None:
    _cm(state).pull_blocks(ld.BlocksCacheKey(remote_cluster, model_id), state["caches"][dst],
                           src_blocks=src_blocks, dst_blocks=dst_blocks, **_ranges(kw))


def push_blocks(state: dict, remote_cluster: int, model_id: int, src: str, src_blocks: list, dst_blocks: list,
                **kw: Any) -> None:
    _cm(state).push_blocks(ld.BlocksCacheKey(remote_cluster, model_id), state["caches"][src],
                           src_blocks=src_blocks, dst_blocks=dst_blocks, **_ranges(kw))


def switch_role(state: dict, role: str, listen: str | None = None) -> None:
    """CANN's switch_role_sample: to PROMPT with ``LLMConfig(listen_ip_info=...).generate_options()``."""
    options = None
    if listen is not None:
        cfg = ld.LLMConfig()
        cfg.listen_ip_info = listen
        options = cfg.generate_options()
    state["dd"].switch_role(getattr(ld.LLMRole, role), options)


class _Ready(ld.LayerSynchronizer):
    def synchronize_layer(self, layer_index: int, timeout_in_millis: int | None) -> bool:
        return True


def transfer_blocks_key_async(state: dict, src: str, remote_cluster: int, model_id: int, src_layers: tuple,
                              dst_layers: tuple) -> tuple:
    """``transfer_cache_async(cache, sync, [TransferWithCacheKeyConfig(BlocksCacheKey(...), range, range)])``
    without block indices (CANN's transfer_cache_async_sample)."""
    config = ld.TransferWithCacheKeyConfig(ld.BlocksCacheKey(remote_cluster, model_id), range(*src_layers),
                                           range(*dst_layers))
    task = _cm(state).transfer_cache_async(state["caches"][src], _Ready(), [config])
    results = task.get_results()
    return task.synchronize().name, [r.name for r in results]


def unregister_and_finalize(state: dict, name: str) -> None:
    _cm(state).unregister_cache(state["caches"].pop(name).cache_id)
    state.pop("dd").finalize()


# ---- comm domains (vllm-ascend's c_mgr connector, omni-infer's LLMDataDistManager) ------------------

def wait_registered(state: dict, comm_id: int, poll_s: float = 0.1, timeout_s: float = 30.0) -> str:
    """Poll ``query_register_mem_status`` until OK, as the callers do (bounded here)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = state["dd"].query_register_mem_status(comm_id)
        if status == ld.RegisterMemStatus.OK:
            return status.name
        if status == ld.RegisterMemStatus.FAILED:
            raise RuntimeError(f"link {comm_id} failed")
        time.sleep(poll_s)
    return "PREPARING"


#: omni-infer retries a pull on these codes (spec §14.4)
RETRYABLE = {"LLM_REPEAT_REQUEST", "LLM_CLUSTER_NUM_EXCEED_LIMIT", "LLM_PROCESSING_LINK", "LLM_DEVICE_OUT_OF_MEMORY",
             "LLM_TIMEOUT", "LLM_WAIT_PROCESS_TIMEOUT", "LLM_LINK_BUSY"}


def pull_blocks_with_retry(state: dict, remote_cluster: int, model_id: int, dst: str, src_blocks: list,
                           dst_blocks: list, retries: int = 3, pause_s: float = 0.2) -> int:
    """omni-infer's pull: up to ``retries`` more attempts while the code is retryable; returns the attempts."""
    for attempt in range(retries + 1):
        try:
            _cm(state).pull_blocks(ld.BlocksCacheKey(remote_cluster, model_id=model_id), state["caches"][dst],
                                   src_blocks, dst_blocks)
            return attempt + 1
        except ld.LLMException as exc:
            if exc.status_code.name not in RETRYABLE or attempt == retries:
                raise
            time.sleep(pause_s)
    return retries + 1


def reconnect(state: dict, remote_cluster: int, remote_ip: str, remote_port: int, timeout: int = 5000) -> None:
    """omni_npu's reconnect path: force-unlink, then link; anything but success raises."""
    info = cluster_info(remote_cluster, remote_ip, remote_port)
    code, _ = state["dd"].unlink_clusters([info], timeout, force=True)
    if code != ld.LLMStatusCode.LLM_SUCCESS:
        raise RuntimeError(f"unlink_clusters(force=True) returned {code.name}")
    code, codes = state["dd"].link_clusters([info], timeout)
    if code != ld.LLMStatusCode.LLM_SUCCESS:
        raise RuntimeError(f"link_clusters returned {code.name} {[c.name for c in codes]}")


def sglang_push_requests(state: dict, decode_cluster: int, requests: list, threads: int = 12) -> list:
    """SGLang's prefill ``add_transfer_request``: a 12-thread pool; each request pushes its KV blocks to the
    decoder's ``BlocksCacheKey(cluster, 0)`` and, with its last chunk, its aux row to the aux cache.
    ``requests``: (kv_src, kv_dst, aux_src, aux_dst) each; returns one status name per request."""
    kv, aux = state["caches"]["kv"], state["caches"]["aux"]

    def one(req: tuple) -> str:
        kv_src, kv_dst, aux_src, aux_dst = req
        try:
            _cm(state).push_blocks(ld.BlocksCacheKey(decode_cluster, 0), kv, list(kv_src), list(kv_dst))
            _cm(state).push_blocks(ld.BlocksCacheKey(decode_cluster, 1), aux, [aux_src], [aux_dst])
        except ld.LLMException as exc:
            return exc.status_code.name
        return "LLM_SUCCESS"

    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(one, requests))


def vllm_pull_blocks(state: dict, remote_cluster: int, caches: list, remote_block_ids: list,
                     local_block_ids: list) -> str:
    """vllm-ascend's c_mgr connector: one ``pull_blocks`` per cache (model_id = its index), remote ids trimmed to
    the last ``len(local)``; TypeError/ValueError and LLMException are caught and reported, as it does."""
    remote = remote_block_ids[-len(local_block_ids):]
    for model_id, name in enumerate(caches):
        try:
            _cm(state).pull_blocks(ld.BlocksCacheKey(cluster_id=remote_cluster, model_id=model_id),
                                   state["caches"][name], remote, local_block_ids)
        except (TypeError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"
        except ld.LLMException as exc:
            return exc.status_code.name
    return "ok"


# ---- vllm-ascend's V0 connector (KvCacheManager mode) ---------------------------------------------

def v0_send(state: dict, cluster_id: int, model_id: int, num_tensors: int, shape: list, seq_dim: int,
            seed: int) -> list:
    """``send_tensor``: allocate under ``CacheKey(cluster, 0, model_id)``, write through the tensor addresses,
    drop the cache id at once (the key keeps the memory until the decoder pulled). Returns the bytes written."""
    from llm_datadist import views

    kv = state["dd"].kv_cache_manager
    desc = ld.CacheDesc(num_tensors, shape, ld.DataType.DT_FLOAT16, seq_len_dim_index=seq_dim)
    buffer = kv.allocate_cache(desc, [ld.CacheKey(cluster_id, 0, model_id)])
    written = []
    for i, arr in enumerate(views.numpy_views(buffer)):
        flat = arr.reshape(-1).view(np.uint8)
        flat[:] = np.random.default_rng(seed * 10 + i).integers(0, 256, flat.size, dtype=np.uint8)
        written.append(flat.copy())
    kv.deallocate_cache(buffer)
    return written


def v0_recv(state: dict, remote_cluster: int, cache_id: int, num_tensors: int, shape: list, seq_dim: int) -> list:
    """``recv_tensor``: allocate a buffer, ``pull_cache(CacheKeyByIdAndIndex(remote, cache_id, 0), buffer, 0)``."""
    from llm_datadist import views

    kv = state["dd"].kv_cache_manager
    desc = ld.CacheDesc(num_tensors, shape, ld.DataType.DT_FLOAT16, seq_len_dim_index=seq_dim)
    buffer = kv.allocate_cache(desc)
    kv.pull_cache(ld.CacheKeyByIdAndIndex(remote_cluster, cache_id, 0), buffer, 0)
    state.setdefault("buffers", []).append(buffer)
    return [arr.reshape(-1).view(np.uint8).copy() for arr in views.numpy_views(buffer)]
