"""Worker-side operations of the reliability tests, run with ``worker.call("run", OPS, "<name>", ...)``.

Like ``tests.worker_ops`` they use only the public ``llm_datadist`` API.
"""

from __future__ import annotations

import hashlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

import llm_datadist as ld
from tests import worker_ops

OPS = "tests.reliability.ops"


def try_op(state: dict, name: str, *args: Any, **kwargs: Any) -> tuple[str, str]:
    """Run ``worker_ops.<name>``; ("OK", "") or (status code name / exception type, message)."""
    try:
        getattr(worker_ops, name)(state, *args, **kwargs)
    except ld.LLMException as exc:
        return exc.status_code.name, str(exc)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return type(exc).__name__, str(exc)
    return "OK", ""


def singleton_released(state: dict) -> bool:
    return ld.LLMDataDist.llm_engine_instance is None


def expected_rows(seed: int, num_tensors: int, shape: tuple, dtype: str = "float16") -> np.ndarray:
    """What ``worker_ops.fill(seed)`` writes, as ``rows`` returns it: [tensor, row, bytes] (uint8)."""
    np_dt = worker_ops.DTYPES[dtype][1]
    out = []
    for i in range(num_tensors):
        n = int(np.prod(shape)) * np.dtype(np_dt).itemsize
        flat = np.random.default_rng(seed * 1000 + i).integers(0, 256, n, dtype=np.uint8)
        out.append(flat.reshape(shape[0], -1))
    return np.stack(out)


def timed(state: dict, name: str, *args: Any, **kwargs: Any) -> tuple[str, float]:
    """Run ``worker_ops.<name>``; (outcome, seconds) where outcome is "OK" or the status code name."""
    t0 = time.monotonic()
    outcome, _ = try_op(state, name, *args, **kwargs)
    return outcome, time.monotonic() - t0


def pulls_at_once(state: dict, remote_cluster: int, dst: str, pulls: list) -> list[tuple[str, float]]:
    """Run ``pulls`` (``(src_blocks, dst_blocks)`` each) of blocks cache ``dst`` from one thread each, all at once;
    each one's (outcome, ``time.monotonic()`` when it ended): outcome "OK" or the status code name (the clock is the
    machine's, so a test compares it with its own)."""
    def one(pull: tuple[list, list]) -> tuple[str, float]:
        outcome, _ = try_op(state, "pull_blocks", remote_cluster, dst, *pull)
        return outcome, time.monotonic()

    with ThreadPoolExecutor(len(pulls)) as pool:
        return list(pool.map(one, pulls))


# ---- soak: many workers, mixed pulls and pushes, every transfer checked ------------------------------

SOAK_TENSORS = 4                  # 2 layers x (K, V)
SOAK_BLOCK = (16, 64)             # float16: 2 KiB per block per tensor
SOURCE = range(0, 16)             # blocks peers pull from; never written after fill
LANDING = range(16, 32)           # where this worker's own pulls land
INBOX = 32                        # [INBOX + 4*i, INBOX + 4*i + 4): where worker i pushes into its peers


def soak_blocks(n_workers: int) -> int:
    return INBOX + 4 * n_workers


def soak_setup(state: dict, cluster: int, listen: str, seed: int, n_workers: int, daemon: str | None = None) -> int:
    """Init (on ``daemon``, else ``$DATADIST_DAEMON``), register and fill the soak cache; the worker's pid.

    Naming the daemon here (the ``datadist.daemon`` option) lets a test spawn its workers before the
    daemons exist, so the workers' imports overlap the daemons' start-up.
    """
    extra = {"datadist.daemon": daemon} if daemon else None
    worker_ops.init(state, "MIX", cluster, listen=listen, remote_cache_accessible=True, sync_kv_timeout=10000,
                    extra=extra)
    worker_ops.register_blocks(state, "kv", SOAK_TENSORS, soak_blocks(n_workers), SOAK_BLOCK, model_id=0)
    worker_ops.fill(state, "kv", seed)
    state["soak"] = {"seed": seed, "n": n_workers}
    return os.getpid()


def _sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def soak_run(state: dict, me: int, remotes: list, ops: int, rng_seed: int) -> dict:
    """``ops`` random pulls / pushes against ``remotes`` [(cluster, seed), ...]; every transfer checked.

    A pull copies source blocks of a peer into LANDING; the landed bytes must hash like the peer's
    source blocks (known from its seed). A push writes my source blocks into my inbox slice at the
    peer; it is read back with a pull into LANDING and must hash like what was pushed.
    """
    n = state["soak"]["n"]
    total = soak_blocks(n)
    mine = expected_rows(state["soak"]["seed"], SOAK_TENSORS, (total, *SOAK_BLOCK))
    theirs = {c: expected_rows(s, SOAK_TENSORS, (total, *SOAK_BLOCK))[:, :len(SOURCE)] for c, s in remotes}
    rng = np.random.default_rng(rng_seed)
    out = {"pulls": 0, "pushes": 0, "readbacks": 0, "bytes": 0, "failures": [], "slowest": 0.0}

    def transfer(name: str, *args: Any, **kwargs: Any) -> bool:
        t0 = time.monotonic()
        try:
            getattr(worker_ops, name)(state, *args, **kwargs)
        except ld.LLMException as exc:
            out["failures"].append(f"{name}{args[:1]}: {exc.status_code.name}: {exc}")
            return False
        out["slowest"] = max(out["slowest"], time.monotonic() - t0)
        return True

    def check(what: str, got: np.ndarray, want: np.ndarray) -> None:
        if _sha(got) != _sha(want):
            out["failures"].append(f"CORRUPTION {what}")

    for _ in range(ops):
        cluster, _seed = remotes[int(rng.integers(len(remotes)))]
        if rng.random() < 0.5:
            k = int(rng.integers(1, 9))
            src = [int(b) for b in rng.choice(len(SOURCE), k, replace=False)]
            dst = [LANDING[0] + int(b) for b in rng.choice(len(LANDING), k, replace=False)]
            kw: dict = {}
            tensors = list(range(SOAK_TENSORS))
            if rng.random() < 0.25:  # one layer of the two
                layer = int(rng.integers(2))
                kw = {"src_layer_range": (layer, layer + 1), "dst_layer_range": (layer, layer + 1)}
                tensors = [2 * layer, 2 * layer + 1]
            if transfer("pull_blocks", cluster, "kv", src, dst, **kw):
                out["pulls"] += 1
                out["bytes"] += k * len(tensors) * 2048
                check(f"pull {src}->{dst} from {cluster}", worker_ops.rows(state, "kv", tensors, dst),
                      theirs[cluster][tensors][:, src])
        else:
            k = int(rng.integers(1, 5))
            src = [int(b) for b in rng.choice(len(SOURCE), k, replace=False)]
            dst = [INBOX + 4 * me + int(b) for b in rng.choice(4, k, replace=False)]
            back = [LANDING[0] + int(b) for b in rng.choice(len(LANDING), k, replace=False)]
            if transfer("push_blocks", cluster, "kv", src, dst):
                out["pushes"] += 1
                out["bytes"] += k * SOAK_TENSORS * 2048
                if transfer("pull_blocks", cluster, "kv", dst, back):
                    out["readbacks"] += 1
                    check(f"push {src}->{dst} to {cluster}, read back", worker_ops.rows(state, "kv", None, back),
                          mine[:, src])
    # nothing ever wrote into my source blocks
    check("own source blocks", worker_ops.rows(state, "kv", None, list(SOURCE)), mine[:, :len(SOURCE)])
    return out
