"""Operations a HIXL worker process runs on request (``HixlWorker.call("op", ...)``; first argument: its state dict),
through the public ``hixl`` API only, as a worker written for CANN's HIXL would. Registered memory is numpy arrays
filled with a pattern the test can recompute (``pattern``)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

import hixl


def pattern(seed: int, n: int) -> bytes:
    """``n`` bytes of a pattern of ``seed`` (the same in every process)."""
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def init(state: dict, local_engine: str, options: dict | None = None) -> int:
    state["h"] = hixl.Hixl()
    state["mem"] = {}
    return state["h"].initialize(local_engine, options or {})


def alloc(state: dict, name: str, size: int, seed: int = -1) -> int:
    """A buffer of ``size`` bytes (zeros, or ``pattern(seed)``); its address."""
    arr = np.frombuffer(pattern(seed, size), np.uint8).copy() if seed >= 0 else np.zeros(size, np.uint8)
    state["mem"][name] = arr
    return int(arr.ctypes.data)


def register(state: dict, name: str, mem_type: str = "MEM_HOST", offset: int = 0, length: int = -1) -> list:
    arr = state["mem"][name]
    n = arr.nbytes - offset if length < 0 else length
    status, handle = state["h"].register_mem(hixl.MemDesc(int(arr.ctypes.data) + offset, n),
                                             getattr(hixl.MemType, mem_type))
    return [status, handle]


def read(state: dict, name: str, offset: int = 0, n: int = -1) -> bytes:
    arr = state["mem"][name]
    return arr[offset:offset + n if n >= 0 else None].tobytes()


def call(state: dict, method: str, *args: Any) -> Any:
    """``Hixl.<method>(*args)``: statuses and plain values back (enums as their names)."""
    out = getattr(state["h"], method)(*args)
    return _plain(out)


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (hixl.TransferStatus, hixl.AsyncConnectStatus)):
        return value.name
    if isinstance(value, hixl.NotifyDesc):
        return [value.name, value.notify_msg]
    if isinstance(value, hixl.TransferResult):
        return [value.req, value.user_data, value.status.name]
    return value


def _ops(rows: list) -> list:
    return [hixl.TransferOpDesc(*r) for r in rows]


def transfer_sync(state: dict, remote: str, op: str, rows: list, timeout_ms: int = 10000) -> int:
    return state["h"].transfer_sync(remote, getattr(hixl, op), _ops(rows), timeout_ms)


def transfer_async(state: dict, remote: str, op: str, rows: list, user_data: int = 0) -> list:
    args = hixl.TransferArgs()
    args.user_data = user_data
    return _plain(state["h"].transfer_async(remote, getattr(hixl, op), _ops(rows), args))


def many_async(state: dict, remote: str, op: str, batches: list) -> dict:
    """Start one transfer_async per batch of rows from this thread, then poll get_all_transfer_status until none
    waits. Returns: the start statuses, how many were in flight at once at the most, and each request's final status
    by its user_data (each reported exactly once)."""
    h = state["h"]
    starts, reqs = [], {}
    for i, rows in enumerate(batches):
        args = hixl.TransferArgs()
        args.user_data = 1000 + i
        status, req = h.transfer_async(remote, getattr(hixl, op), _ops(rows), args)
        starts.append(status)
        reqs[req] = 1000 + i
    finals: dict[int, str] = {}
    waiting = 0

    def take(results: list) -> None:
        nonlocal waiting
        for r in results:
            assert reqs[r.req] == r.user_data
            if r.status == hixl.TransferStatus.WAITING:
                waiting += 1
                continue
            assert r.user_data not in finals, "a request reported finished twice"
            finals[r.user_data] = r.status.name

    status, first = h.get_all_transfer_status()   # every request: the waiting ones counted, the finished taken
    assert status == hixl.SUCCESS and len(first) == len(reqs)
    take(first)
    in_flight = waiting
    pause = threading.Event()
    for _ in range(6000):
        if len(finals) == len(reqs):
            break
        status, results = h.get_all_transfer_status(hixl.GetTransferStatusArgs(skip_waiting=True))
        assert status == hixl.SUCCESS
        take(results)
        pause.wait(0.01)
    return {"starts": starts, "reqs": len(reqs), "waiting_at_start": in_flight, "finals": finals}


def start_async(state: dict, remote: str, op: str, batches: list) -> list:
    """Start one transfer_async per batch; the reqs."""
    return [state["h"].transfer_async(remote, getattr(hixl, op), _ops(rows))[1] for rows in batches]


def wait_all(state: dict, reqs: list) -> dict:
    """Poll get_transfer_status of each req until none waits; {req: final status name}."""
    h = state["h"]
    finals: dict[int, str] = {}
    pause = threading.Event()
    for _ in range(6000):
        for r in reqs:
            if r not in finals:
                code, status = h.get_transfer_status(r)
                if code != hixl.SUCCESS:
                    finals[r] = f"code {code}"
                elif status != hixl.TransferStatus.WAITING:
                    finals[r] = status.name
        if len(finals) == len(reqs):
            break
        pause.wait(0.01)
    return finals


def send_notify(state: dict, remote: str, name: str, msg: str, timeout_ms: int = 5000) -> int:
    return state["h"].send_notify(remote, hixl.NotifyDesc(name, msg), timeout_ms)


def get_notifies(state: dict) -> list:
    return _plain(state["h"].get_notifies())


def until_async_status(state: dict, remote: str, want: str) -> str:
    pause = threading.Event()
    status = ""
    for _ in range(3000):
        _, st = state["h"].get_async_connect_status(remote)
        status = st.name
        if status == want:
            break
        pause.wait(0.01)
    return status


def finalize(state: dict) -> None:
    if "h" in state:
        state["h"].finalize()


def llm_datadist_beside(state: dict) -> str:
    """An ``LLMDataDist`` (cache-manager mode) in the worker that has a HIXL engine: both register memory, the
    LLM-DataDist engine ends, the HIXL engine goes on."""
    import llm_datadist as ld

    dd = ld.LLMDataDist(ld.LLMRole.PROMPT, 77)
    config = ld.LLMConfig()
    config.enable_cache_manager = True
    dd.init(config.generate_options())
    try:
        arr = np.zeros(4096, np.uint8)
        cache = dd.cache_manager.register_cache(ld.CacheDesc(1, [4096], ld.DataType.DT_UINT8, ld.Placement.HOST),
                                                [int(arr.ctypes.data)])
        alloc(state, "beside", 4096, 5)
        status, handle = register(state, "beside")
        assert status == hixl.SUCCESS and handle != 0, status
        dd.cache_manager.unregister_cache(cache.cache_id)
    finally:
        dd.finalize()
    assert state["h"].deregister_mem(handle) == hixl.SUCCESS
    assert register(state, "beside")[0] == hixl.SUCCESS
    return "ok"


def send_many(state: dict, remote: str, name: str, count: int) -> list:
    """``count`` notifies ``name`` with messages "0", "1", ...; their statuses."""
    return [state["h"].send_notify(remote, hixl.NotifyDesc(name, str(i)), 5000) for i in range(count)]
