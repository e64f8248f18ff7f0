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


def _cm(state: dict) -> Any:
    return state["dd"].cache_manager


def push_blocks_threads(state: dict, remote_cluster: int, src: str, jobs: list, threads: int = 12,
                        model_id: int = 0) -> list:
    """``threads`` threads call ``push_blocks`` at once, one job (src_blocks, dst_blocks) each (SGLang's
    transfer worker pool); returns one status name per job ("LLM_SUCCESS" or the exception's)."""
    cache = state["caches"][src]
    key = ld.BlocksCacheKey(remote_cluster, model_id)

    def one(job: tuple) -> str:
        src_blocks, dst_blocks = job
        try:
            _cm(state).push_blocks(key, cache, list(src_blocks), list(dst_blocks))
        except ld.LLMException as exc:
            return exc.status_code.name
        return "LLM_SUCCESS"

    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(one, jobs))


def pull_blocks_threads(state: dict, remote_cluster: int, dst: str, jobs: list, threads: int = 12,
                        model_id: int = 0) -> list:
    cache = state["caches"][dst]
    key = ld.BlocksCacheKey(remote_cluster, model_id)

    def one(job: tuple) -> str:
        src_blocks, dst_blocks = job
        try:
            _cm(state).pull_blocks(key, cache, list(src_blocks), list(dst_blocks))
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


def now_ms(state: dict) -> float:
    return time.monotonic() * 1000


_ = np
