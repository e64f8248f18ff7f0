"""Worker-side helpers of the API tests, run in a test ``Worker`` via ``w.call("run", "tests.api._ops", name, ...)``.

Like ``tests/worker_ops.py`` they use only the public ``llm_datadist`` API (and ``llm_datadist.views``),
as a real prompt or decoder worker would; ``state`` is the worker's state dict.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

import llm_datadist as ld
from llm_datadist import views
from tests.worker_ops import DTYPES, NPU, NpuTensor

GATE_WAIT_S = 60.0  # bound of every wait of a gated synchronizer (a liveness guard, not a timing assertion)


# ---- v1 (KvCacheManager mode) ------------------------------------------------------------------

def init_v1(state: dict, role: str, cluster_id: int, listen: str | None = None, sync_kv_timeout: int = 3000,
            flow: int | None = 8 << 20, switch: bool = False, extra: dict | None = None) -> dict:
    cfg = ld.LLMConfig()
    cfg.device_id = 0
    cfg.sync_kv_timeout = sync_kv_timeout
    if listen:
        cfg.listen_ip_info = listen
    if flow:
        cfg.ge_options = {"ge.flowGraphMemMaxSize": str(flow)}
    if switch:
        cfg.enable_switch_role = True
    options = cfg.generate_options()
    options.update(extra or {})
    dd = ld.LLMDataDist(getattr(ld.LLMRole, role), cluster_id)
    dd.init(options)
    state.update(dd=dd, caches={}, arrays={})
    return dict(dd._options)


def kv_alloc(state: dict, name: str, num_tensors: int, shape: tuple, dtype: str = "uint8", keys: list | None = None,
             blocks: bool = False, model_id: int | None = None) -> int:
    dt, np_dt = DTYPES[dtype]
    kv = state["dd"].kv_cache_manager
    desc = ld.CacheDesc(num_tensors, list(shape), dt)
    if blocks:
        key = ld.BlocksCacheKey(state["dd"].cluster_id, model_id) if model_id is not None else None
        cache = kv.allocate_blocks_cache(desc, key)
    else:
        cache = kv.allocate_cache(desc, [ld.CacheKey(state["dd"].cluster_id, *k) for k in (keys or [])])
    state["caches"][name] = cache
    # on the acl planes a DEVICE cache is NPU memory: reached by aclrtMemcpy, never through a host view
    state["arrays"][name] = [NpuTensor(a, shape, np_dt, state["dd"]._device_id) for a in addrs(state, name)] \
        if NPU else \
        views.numpy_views(cache)
    return cache.cache_id


def addrs(state: dict, name: str) -> list:
    cache = state["caches"][name]
    return list(cache.per_device_tensor_addrs[0] if isinstance(cache, ld.KvCache) else cache.tensor_addrs)


def _key(remote: int, key: tuple) -> Any:
    if key[0] == "id":
        return ld.CacheKeyByIdAndIndex(remote, key[1], key[2])
    if key[0] == "blocks":
        return ld.BlocksCacheKey(remote, key[1])
    return ld.CacheKey(remote, *key[1:])


def _ranges(kw: dict) -> dict:
    return {k: range(*val) if k.endswith("_range") and val is not None else val for k, val in kw.items()}


def kv_pull_cache(state: dict, remote: int, dst: str, key: tuple, batch_index: int = 0, size: int = -1,
                  **kw: Any) -> None:
    state["dd"].kv_cache_manager.pull_cache(_key(remote, key), state["caches"][dst], batch_index, size, **_ranges(kw))


def kv_pull_blocks(state: dict, remote: int, dst: str, prompt_blocks: list, decoder_blocks: list, model_id: int = 0,
                   **kw: Any) -> None:
    state["dd"].kv_cache_manager.pull_blocks(ld.BlocksCacheKey(remote, model_id), state["caches"][dst],
                                             prompt_blocks, decoder_blocks, **_ranges(kw))


def kv_call(state: dict, method: str, *names_and_args: Any, **kw: Any) -> Any:
    """``kv_cache_manager.<method>(...)`` with ``"@name"`` arguments replaced by the named caches."""
    args = [state["caches"][a[1:]] if isinstance(a, str) and a.startswith("@") else a for a in names_and_args]
    return getattr(state["dd"].kv_cache_manager, method)(*args, **kw)


def drop(state: dict, name: str) -> None:
    """Forget a KvCache without deallocating it: CANN frees it when the object is collected."""
    import gc

    state["arrays"].pop(name, None)
    state["caches"].pop(name)
    gc.collect()


def pool_used(state: dict) -> int:
    from datadist.v1 import datadist_pb2

    dd = state["dd"]
    status = dd._call("GetStatus", datadist_pb2.StatusRequest(engine_id=dd._engine_id), "test")
    return sum(p.used for e in status.engines for p in e.pools)


def expect_error(state: dict, op: str, *args: Any, **kw: Any) -> tuple:
    """Run ``op`` (an op of this module or of tests.worker_ops); return (exception type, status code name)."""
    import tests.worker_ops as wops

    fn = globals().get(op) or getattr(wops, op)
    try:
        fn(state, *args, **kw)
    except ld.LLMException as exc:
        return "LLMException", exc.status_code.name
    except (TypeError, ValueError, RuntimeError) as exc:
        return type(exc).__name__, None
    return "ok", None


# ---- transfer_cache_async with a gated synchronizer ---------------------------------------------

class Gate(ld.LayerSynchronizer):
    """``synchronize_layer(l)`` blocks until the test releases (True) or aborts (False) layer ``l``."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.decisions: dict[int, bool] = {}
        self.asked: list[int] = []

    def synchronize_layer(self, layer_index: int, timeout_in_millis: int | None) -> bool:
        with self._cond:
            self.asked.append(layer_index)
            self._cond.notify_all()
            self._cond.wait_for(lambda: layer_index in self.decisions, GATE_WAIT_S)
            return self.decisions.get(layer_index, False)

    def decide(self, layer: int, ok: bool) -> None:
        with self._cond:
            self.decisions[layer] = ok
            self._cond.notify_all()

    def wait_asked(self, layer: int) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: layer in self.asked, GATE_WAIT_S)


def _config(spec: dict) -> Any:
    if spec["kind"] == "addrs":
        return ld.TransferConfig(spec["cluster"], list(spec["addrs"]),
                                 range(*spec["src"]) if spec.get("src") else None, spec.get("batch", 0))
    key = (ld.BlocksCacheKey(spec["cluster"], spec.get("model_id", 0)) if spec["kind"] == "blocks"
           else ld.CacheKeyByIdAndIndex(spec["cluster"], spec["cache_id"], spec.get("index", 0)))
    return ld.TransferWithCacheKeyConfig(key, range(*spec["src"]), range(*spec["dst"]), spec.get("batch", 0))


def tca_start(state: dict, src: str, configs: list, src_blocks: list | None = None, dst_blocks: list | None = None,
              dst_block_size: int | None = None) -> None:
    dd = state["dd"]
    manager = dd.cache_manager if dd._enable_cache_manager else dd.kv_cache_manager
    gate = Gate()
    state["gate"] = gate
    state["task"] = manager.transfer_cache_async(state["caches"][src], gate, [_config(c) for c in configs],
                                                 src_blocks, dst_blocks, dst_block_size)


def tca_release(state: dict, layer: int, ok: bool = True) -> bool:
    """Decide layer ``layer`` once the task asks for it; returns whether it asked."""
    gate = state["gate"]
    asked = gate.wait_asked(layer)
    gate.decide(layer, ok)
    return asked


def tca_asked(state: dict) -> list:
    return list(state["gate"].asked)


def tca_results(state: dict, timeout_ms: int = 30000) -> tuple:
    task = state["task"]
    code = task.synchronize(timeout_ms)
    return code.name, [None if r is None else r.name for r in task.get_results(timeout_ms)]


def tca_pending(state: dict) -> tuple:
    """``synchronize(0)`` / ``get_results(0)`` of a task that is still running: the default error code."""
    task = state["task"]
    return task.synchronize(0).name, [r.name for r in task.get_results(0)]


def wait_rows(state: dict, name: str, tensors: list, rows_: list, expected: np.ndarray, timeout_s: float = 30.0
              ) -> bool:
    """Poll until rows ``rows_`` of tensors ``tensors`` equal ``expected`` (uint8 [tensor, row, bytes])."""
    import tests.worker_ops as wops

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if np.array_equal(wops.rows(state, name, tensors, rows_), expected):
            return True
        time.sleep(0.01)
    return False


def check_link_status_code(state: dict, remote: int) -> str:
    try:
        state["dd"].check_link_status(remote)
    except ld.LLMException as exc:
        return exc.status_code.name
    return "ok"


def cpu_cache(state: dict, name: str, num_tensors: int, shape: tuple, dtype: str = "uint8") -> None:
    """A host KvCache over this worker's own numpy memory (``KvCache.create_cpu_cache``), for swap_blocks."""
    dt, np_dt = DTYPES[dtype]
    arrays = [np.zeros(shape, dtype=np_dt) for _ in range(num_tensors)]
    desc = ld.CacheDesc(num_tensors, list(shape), dt, ld.Placement.HOST)
    state["caches"][name] = ld.KvCache.create_cpu_cache(desc, [a.ctypes.data for a in arrays])
    state["arrays"][name] = arrays


def cache_tensors(state: dict, name: str, tensor_index: int) -> list:
    """``get_cache_tensors`` as numpy arrays (host copies)."""
    return [t.numpy() for t in state["dd"].kv_cache_manager.get_cache_tensors(state["caches"][name], tensor_index)]


def key_of(state: dict, req_id: int, model_id: int = 0) -> Any:
    return ld.CacheKey(state["dd"].cluster_id, req_id, model_id)


def switch_role(state: dict, role: str, listen: str | None = None) -> str:
    """``switch_role``; returns "ok" or the LLMException's status code name."""
    options = {"llm.listenIpInfo": listen} if listen else None
    try:
        state["dd"].switch_role(getattr(ld.LLMRole, role), options)
    except ld.LLMException as exc:
        return exc.status_code.name
    return "ok"


# ---- the legacy model API (spec §9) -------------------------------------------------------------

class FillRunner(ld.ModelRunner):
    """A ``ModelRunner`` subclass: ``write={batch: value}`` fills batch rows (tensor t gets value + t),
    ``read=True`` returns copies of the KV tensors it was given."""

    def __init__(self) -> None:
        self.allocated: list = []

    def run_model(self, kv_cache: Any, input_tensors: Any, **kwargs: Any) -> Any:
        arrays = views.numpy_views(kv_cache)
        for t, arr in enumerate(arrays):
            rows_ = arr.reshape(arr.shape[0], -1).view(np.uint8)
            for batch, value in (kwargs.get("write") or {}).items():
                rows_[batch] = value + t
        return [a.copy() for a in arrays] if kwargs.get("read") else []

    def on_cache_allocated(self, kv_cache: Any) -> None:
        self.allocated.append(kv_cache.cache_id)


def _req(value: Any) -> Any:
    if isinstance(value, dict) and "req" in value:
        return ld.LLMReq(**value["req"])
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return [_req(x) for x in value]
    return value


def model_add(state: dict, name: str, shapes: list, dtype: str = "uint8") -> int:
    config = ld.ModelConfig()
    config.kv_shapes = shapes
    config.kv_dtypes = [DTYPES[dtype][0]] * len(shapes)
    runner = FillRunner()
    model = state["dd"].add_model(config.generate_options(), runner)
    state.setdefault("models", {})[name] = (model, runner)
    return model.model_id


def model_call(state: dict, name: str, method: str, *args: Any, **kw: Any) -> Any:
    """``LLMModel.<method>``; ``{"req": {...}}`` arguments become ``LLMReq``s. Errors come back as (type, code)."""
    model, runner = state["models"][name]
    if method == "allocated":
        return list(runner.allocated)
    try:
        return getattr(model, method)(*[_req(a) for a in args], **kw)
    except ld.LLMException as exc:
        return "LLMException", exc.status_code.name


def dd_call(state: dict, method: str, *args: Any) -> Any:
    try:
        out = getattr(state["dd"], method)(*[_req(a) for a in args])
    except ld.LLMException as exc:
        return "LLMException", exc.status_code.name
    if isinstance(out, ld.CapacityState):
        return out.is_available, out.free_tokens_num, out.total_tokens_num
    return out
