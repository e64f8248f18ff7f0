"""The worker's share of a small pull, against a real daemon: a warm 1-block ``pull_blocks`` / ``pull_cache`` costs
this process at most 15 Python function calls (profile "call" events; C functions are not counted: a count, not a
timing), and many threads pulling through one attach connection each get their own bytes.

The prompt engine is a worker process of the same daemon (a same-daemon link); the decoder is this process, so the
profile hook sees the whole of the worker's part of a pull: checks, frame, send, wait, reply."""

from __future__ import annotations

import gc
import sys
import threading
from typing import Any, Callable

import numpy as np
import pytest

from tests import worker_ops as ops
from tests.harness import Daemon, Worker, free_port

pytestmark = pytest.mark.integration

P, D = 1, 2
BLOCKS, BLOCK_BYTES = 16, 4096
#: the issue's worker target (issue 36): at most 15 Python calls per warm 1-block pull
MAX_CALLS = 15


@pytest.fixture
def linked(monkeypatch):  # noqa: ANN201
    """``(state, prompt)``: this process's decoder engine (``tests.worker_ops`` state, a blocks cache "dst" and a
    contiguous cache "slot") linked to a prompt worker of the same daemon that holds a filled blocks cache keyed
    ``BlocksCacheKey(P, 0)`` and a filled contiguous cache (its cache id in ``state["prompt_cache"]``)."""
    daemon = Daemon("calls").start()
    monkeypatch.setenv("DATADIST_DAEMON", daemon.target)
    monkeypatch.delenv("DATADIST_LOCAL_TRANSFERS", raising=False)
    prompt = Worker({"DATADIST_DAEMON": daemon.target})
    state: dict[str, Any] = {}
    try:
        port = free_port()
        prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", mem_pool=4 << 20)
        prompt.call("allocate", "src", 1, (BLOCKS, BLOCK_BYTES), dtype="uint8", blocks=True, model_id=0)
        prompt.call("fill", "src", 5)
        state["prompt_cache"] = prompt.call("allocate", "whole", 1, (2, BLOCK_BYTES), dtype="uint8")
        prompt.call("fill", "whole", 6)
        ops.init(state, "DECODER", D, mem_pool=4 << 20)
        ops.allocate(state, "dst", 1, (BLOCKS, BLOCK_BYTES), dtype="uint8", blocks=True)
        ops.allocate(state, "slot", 1, (2, BLOCK_BYTES), dtype="uint8")
        assert ops.link(state, P, "127.0.0.1", port)[0] == 0
        yield state, prompt
    finally:
        if "dd" in state:
            ops.finalize(state)
        prompt.close()
        daemon.discard()


def python_calls(fn: Callable[..., None], *args: Any) -> list[str]:
    """The Python functions ``fn(*args)`` runs in this thread, ``fn`` included, one entry per call (no garbage
    collection meanwhile: a finalizer it ran would count)."""
    calls: list[str] = []

    def hook(frame, event, arg):  # noqa: ANN001, ANN202, ARG001
        if event == "call":
            calls.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    gc.disable()
    sys.setprofile(hook)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
        gc.enable()
    return calls


def test_a_warm_one_block_pull_costs_the_worker_at_most_15_python_calls(linked):
    state, prompt = linked
    cm = state["dd"].cache_manager
    key = ops.ld.BlocksCacheKey(P, 0)
    dst = state["caches"]["dst"]
    for _ in range(3):                                          # warm: the link, the frame path, the caches
        cm.pull_blocks(key, dst, [3], [7])
    ops.zero(state, "dst")
    calls = python_calls(cm.pull_blocks, key, dst, [4], [9])
    assert len(calls) <= MAX_CALLS, "\n".join(calls)
    np.testing.assert_array_equal(ops.rows(state, "dst", row_indices=[9]), prompt.call("rows", "src", None, [4]))

    by_id = ops.ld.CacheKeyByIdAndIndex(P, state["prompt_cache"], 1)
    slot = state["caches"]["slot"]
    cm.pull_cache(by_id, slot, 0)
    ops.zero(state, "slot")
    calls = python_calls(cm.pull_cache, by_id, slot, 0)
    assert len(calls) <= MAX_CALLS, "\n".join(calls)
    np.testing.assert_array_equal(ops.rows(state, "slot", row_indices=[0]), prompt.call("rows", "whole", None, [1]))


def test_32_threads_x_200_pulls_through_one_connection_each_get_their_own_bytes(linked):
    """32 threads x 200 pulls on the one attach connection (the lone caller, waiting callers and callers that take
    over reading all run): every pull lands its own source block in its thread's own destination block, checked
    after each pull, and nothing is left waiting or marked as reading."""
    state, prompt = linked
    cm = state["dd"].cache_manager
    key = ops.ld.BlocksCacheKey(P, 0)
    threads_n, pulls = 32, 200
    ops.allocate(state, "many", 1, (threads_n, BLOCK_BYTES), dtype="uint8", blocks=True)
    dst = state["caches"]["many"]
    got = state["arrays"]["many"][0].reshape(threads_n, -1).view(np.uint8)
    src_rows = prompt.call("rows", "src")[0]
    errors: list[BaseException] = []
    checked = [0] * threads_n

    def pull(i: int) -> None:
        try:
            for n in range(pulls):
                src = (i * 7 + n) % BLOCKS
                got[i] = 0
                cm.pull_blocks(key, dst, [src], [i])
                np.testing.assert_array_equal(got[i], src_rows[src])
                checked[i] += 1
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            errors.append(exc)
    threads = [threading.Thread(target=pull, args=(i,)) for i in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors[:3]
    assert not any(t.is_alive() for t in threads) and checked == [pulls] * threads_n
    attach = state["dd"]._client.attachment
    assert attach._pending == {} and not attach._reading
