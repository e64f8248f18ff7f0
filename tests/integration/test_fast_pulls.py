"""A worker's small pull_blocks or push_blocks over the attach socket ends on the data reader thread (the quick
shape of the one transfer path, ``links.transfer``): the same bytes and the same status codes and messages as an
order (``[daemon] fast_pulls = false``) for a table of good and bad pulls and one of pushes, each answered once; a
deallocate racing pulls never gets bytes written into freed or reused memory, one racing pushes never sends bytes
of reused memory."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from datadist.status import LLMStatusCode as S
from tests.harness import WorkerError, free_port, metrics_address, series_sum

pytestmark = pytest.mark.integration

P, D = 1, 2
TENSORS, BLOCKS, BLOCK_SHAPE = 2, 48, (4, 32)   # float16: 256 bytes per tensor and block
#: what the general path logs for each pull it ends (the fast path logs nothing per pull)
GENERAL_LINE = f"cluster {D} pull peer cluster {P}: cache"
#: what the general path logs for each push it ends (the tracker's line; the fast path logs nothing per push)
GENERAL_PUSH_LINE = f"cluster {D} push peer cluster {P}: cache"


def _pair(daemon_factory, worker_factory, fast: bool, with_prompt: bool = False):  # noqa: ANN001, ANN202
    env = {"DATADISTD_DAEMON_FAST_PULLS": "true" if fast else "false", "DATADISTD_DAEMON_LOG_LEVEL": "DEBUG"}
    dp, dd = daemon_factory.many(f"p{int(fast)}", f"d{int(fast)}", env=env, args=["--metrics", "127.0.0.1:0"])
    metrics = metrics_address(dd)
    port = free_port()
    prompt, decoder = worker_factory(dp), worker_factory(dd)
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True, sync_kv_timeout=3000,
                mem_pool=8 << 20)
    decoder.call("init", "DECODER", D, remote_cache_accessible=True, sync_kv_timeout=3000, mem_pool=8 << 20)
    prompt.call("allocate", "kv", TENSORS, (BLOCKS, *BLOCK_SHAPE), blocks=True, model_id=0)
    prompt.call("allocate", "wide", TENSORS, (BLOCKS, 8, 32), blocks=True, model_id=1)
    prompt.call("fill", "kv", 1)
    prompt.call("fill", "wide", 2)
    decoder.call("allocate", "kv", TENSORS, (BLOCKS, *BLOCK_SHAPE), blocks=True)
    decoder.call("allocate", "three", 3, (BLOCKS, *BLOCK_SHAPE), blocks=True)
    decoder.call("zero", "kv")
    decoder.call("zero", "three")
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    if with_prompt:
        return dd, decoder, prompt, metrics
    return dd, decoder


#: (remote cluster, dst cache, src blocks, dst blocks, model id)
CASES = [
    (P, "kv", [3], [5], 0),                                   # one block
    (P, "kv", [0, 7, 2], [9, 1, 4], 0),                       # scattered
    (P, "kv", list(range(40)), list(range(47, 7, -1)), 0),    # 40 blocks, 40 KiB
    (P, "kv", [1], [BLOCKS], 0),                              # dst block out of range (refused here)
    (P, "kv", [BLOCKS + 3], [2], 0),                          # src block out of range (the owner refuses)
    (P, "kv", [1], [2], 7),                                   # no such BlocksCacheKey at the owner
    (P, "kv", [1], [2], 1),                                   # block sizes differ (the owner's size mismatch)
    (P, "three", [1], [2], 0),                                # tensor counts differ (explained here)
    (9, "kv", [1], [2], 0),                                   # not linked
    (D, "kv", [1], [2], 0),                                   # its own cluster
    (P, "kv", [4, 4], [10, 11], 0),                           # a block twice at the source
]


def _run_table(decoder) -> tuple[list, list]:  # noqa: ANN001
    outcomes = []
    for cluster, dst, src, dst_blocks, model_id in CASES:
        try:
            decoder.call("pull_blocks", cluster, dst, src, dst_blocks, model_id=model_id)
            outcomes.append((0, ""))
        except WorkerError as exc:
            outcomes.append((exc.status_code, exc.message))
    return outcomes, [decoder.call("rows", "kv").tobytes(), decoder.call("rows", "three").tobytes()]


def test_fast_and_general_pulls_give_the_same_bytes_and_status_codes(daemon_factory, worker_factory) -> None:
    fast_dd, fast = _pair(daemon_factory, worker_factory, fast=True)
    fast_out, fast_rows = _run_table(fast)
    general_dd, general = _pair(daemon_factory, worker_factory, fast=False)
    general_out, general_rows = _run_table(general)
    assert fast_out == general_out
    assert fast_rows == general_rows
    codes = [code for code, _ in fast_out]
    assert codes[:3] == [0, 0, 0] and codes[-1] == 0 and all(codes[3:-1]), fast_out
    # the general daemon ended every successful pull on its loop; the fast one none of them (each pull it did not
    # take -- the refused ones -- ended there with no bytes: no line)
    assert general_dd.log().count(GENERAL_LINE) == 4
    assert fast_dd.log().count(GENERAL_LINE) == 0


RACE_ROUNDS = 12


def race(state: dict, rounds: int, pulls: int) -> tuple[list[int], list[int]]:
    """In this worker: threads pull into cache "a" while the main thread deallocates it and allocates "b" of the
    same layout (its memory most likely "a"'s), zeroes it and, once every pull has ended, reads it back. Returns
    the pulls' status codes and the count of nonzero bytes found in each round's "b"."""
    from llm_datadist.status import LLMException
    from tests import worker_ops as ops

    codes: list[int] = []
    dirty: list[int] = []
    lock = threading.Lock()
    for _ in range(rounds):
        ops.allocate(state, "a", TENSORS, (BLOCKS, *BLOCK_SHAPE), blocks=True)
        cache = state["caches"]["a"]
        started = threading.Barrier(5)

        def puller(k: int, cache=cache, started=started) -> None:  # noqa: ANN001
            started.wait()
            for i in range(pulls):
                try:
                    ops._cm(state).pull_blocks(ops.ld.BlocksCacheKey(P, 0), cache, [(k + i) % BLOCKS],
                                               [(3 * k + i) % BLOCKS])
                    code = 0
                except LLMException as exc:
                    code = int(exc.status_code)
                with lock:
                    codes.append(code)

        threads = [threading.Thread(target=puller, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        started.wait()
        ops.deallocate(state, "a")
        ops.allocate(state, "b", TENSORS, (BLOCKS, *BLOCK_SHAPE), blocks=True)
        ops.zero(state, "b")
        for t in threads:
            t.join(30)
        dirty.append(int(np.count_nonzero(ops.rows(state, "b"))))
        ops.deallocate(state, "b")
    return codes, dirty


def test_a_deallocate_racing_fast_pulls_never_gets_bytes_into_freed_memory(daemon_factory, worker_factory) -> None:
    """Pulls in flight while their destination is deallocated end as a pull into a missing cache does
    (LLM_PARAM_INVALID) or before it went (success); a cache allocated in its place -- likely on the same pool
    memory -- stays zero: no pull lands after its destination was freed."""
    _, decoder = _pair(daemon_factory, worker_factory, fast=True)
    codes, dirty = decoder.call("run", __name__, "race", RACE_ROUNDS, 40, timeout=120)
    assert dirty == [0] * RACE_ROUNDS
    assert set(codes) <= {0, int(S.LLM_PARAM_INVALID)}, set(codes)
    assert codes.count(0) > 0


# ---- pushes --------------------------------------------------------------------------------------------------

#: (remote cluster, src cache, src blocks, dst blocks, model id)
PUSH_CASES = [
    (P, "kv", [3], [5], 0),                                   # one block
    (P, "kv", [0, 7, 2], [9, 1, 4], 0),                       # scattered
    (P, "kv", list(range(40)), list(range(47, 7, -1)), 0),    # 40 blocks, 20 KiB
    (P, "kv", [BLOCKS], [1], 0),                              # src block out of range (refused here)
    (P, "kv", [2], [BLOCKS + 3], 0),                          # dst block out of range (the owner refuses)
    (P, "kv", [1], [2], 7),                                   # no such BlocksCacheKey at the owner
    (P, "kv", [1], [2], 1),                                   # block sizes differ (the owner's size mismatch)
    (P, "three", [1], [2], 0),                                # tensor counts differ (explained here)
    (9, "kv", [1], [2], 0),                                   # not linked
    (D, "kv", [1], [2], 0),                                   # its own cluster
    (P, "kv", [1, 2], [3], 0),                                # the lists differ in length
    (P, "kv", [4, 4], [10, 11], 0),                           # a block twice at the source
]


def _run_push_table(decoder, prompt) -> tuple[list, list]:  # noqa: ANN001
    decoder.call("fill", "kv", 3)
    decoder.call("fill", "three", 4)
    outcomes = []
    for cluster, src, src_blocks, dst_blocks, model_id in PUSH_CASES:
        try:
            decoder.call("push_blocks", cluster, src, src_blocks, dst_blocks, model_id=model_id)
            outcomes.append((0, ""))
        except WorkerError as exc:
            outcomes.append((exc.status_code, exc.message))
    return outcomes, [prompt.call("rows", "kv").tobytes(), prompt.call("rows", "wide").tobytes()]


def test_fast_and_general_pushes_give_the_same_bytes_and_status_codes(daemon_factory, worker_factory) -> None:
    fast_dd, fast, fast_prompt, fast_metrics = _pair(daemon_factory, worker_factory, fast=True, with_prompt=True)
    fast_out, fast_rows = _run_push_table(fast, fast_prompt)
    general_dd, general, general_prompt, general_metrics = _pair(daemon_factory, worker_factory, fast=False,
                                                                 with_prompt=True)
    general_out, general_rows = _run_push_table(general, general_prompt)
    assert fast_out == general_out
    assert fast_rows == general_rows
    codes = [code for code, _ in fast_out]
    assert codes[:3] == [0, 0, 0] and codes[-1] == 0 and all(codes[3:-1]), fast_out
    # the general daemon ended every successful push in its tracker; the fast one none of them
    assert Path(general_dd.log_path).read_text().count(GENERAL_PUSH_LINE) == 4
    assert Path(fast_dd.log_path).read_text().count(GENERAL_PUSH_LINE) == 0
    # each push answered and counted once: 4 successes, nothing left in flight on the daemon or the link
    for metrics in (fast_metrics, general_metrics):
        assert series_sum(metrics, "datadist_transfers_total", 'op="push",outcome="success"') == 4
        assert series_sum(metrics, "datadist_transfers_in_flight", 'op="push"') == 0
        assert series_sum(metrics, "datadist_link_transfers_in_flight", f'peer_cluster_id="{P}"') == 0


#: what the source cache holds in the push race, and what the cache allocated in its place is filled with
SOURCE_BYTE, REUSED_BYTE = 0x11, 0xAB


def push_race(state: dict, rounds: int, pushes: int) -> list[int]:
    """In this worker: threads push blocks of cache "a" (every byte ``SOURCE_BYTE``) to the prompt's "kv" while the
    main thread deallocates "a" and allocates "b" of the same layout (its memory most likely "a"'s), filling it
    with ``REUSED_BYTE``; then, in turn, one push from "a" after the same (its cache id is the worker's stale
    handle: the daemon's view of the local caches must be current). Returns the pushes' status codes."""
    from llm_datadist.status import LLMException
    from tests import worker_ops as ops

    codes: list[int] = []
    lock = threading.Lock()

    def set_bytes(name: str, value: int) -> None:
        for arr in ops._arrays(state, name):
            ops._store(arr, np.full(arr.nbytes, value, np.uint8))

    for _ in range(rounds):
        ops.allocate(state, "a", TENSORS, (BLOCKS, *BLOCK_SHAPE), blocks=True)
        set_bytes("a", SOURCE_BYTE)
        cache = state["caches"]["a"]
        started = threading.Barrier(5)

        def pusher(k: int, cache=cache, started=started) -> None:  # noqa: ANN001
            started.wait()
            for i in range(pushes):
                try:
                    ops._cm(state).push_blocks(ops.ld.BlocksCacheKey(P, 0), cache, [(k + i) % BLOCKS],
                                               [(3 * k + i) % BLOCKS])
                    code = 0
                except LLMException as exc:
                    code = int(exc.status_code)
                with lock:
                    codes.append(code)

        threads = [threading.Thread(target=pusher, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        started.wait()
        ops.deallocate(state, "a")
        ops.allocate(state, "b", TENSORS, (BLOCKS, *BLOCK_SHAPE), blocks=True)
        set_bytes("b", REUSED_BYTE)
        for t in threads:
            t.join(30)
        ops.deallocate(state, "b")
    ops.allocate(state, "a", TENSORS, (BLOCKS, *BLOCK_SHAPE), blocks=True)
    set_bytes("a", SOURCE_BYTE)
    stale = state["caches"]["a"]
    ops._cm(state).push_blocks(ops.ld.BlocksCacheKey(P, 0), stale, [0], [0])
    codes.append(0)
    ops.deallocate(state, "a")
    ops.allocate(state, "b", TENSORS, (BLOCKS, *BLOCK_SHAPE), blocks=True)
    set_bytes("b", REUSED_BYTE)
    try:
        ops._cm(state).push_blocks(ops.ld.BlocksCacheKey(P, 0), stale, [1], [1])
        codes.append(0)
    except LLMException as exc:
        codes.append(int(exc.status_code))
    return codes


def test_a_deallocate_racing_fast_pushes_never_sends_bytes_of_reused_memory(daemon_factory, worker_factory) -> None:
    """Pushes in flight while their source is deallocated end as a push from a missing cache does
    (LLM_PARAM_INVALID) or with the bytes read before it went (success); the destination never receives the
    bytes of a cache allocated in its place -- likely on the same pool memory -- and every push is answered once."""
    _, decoder, prompt, metrics = _pair(daemon_factory, worker_factory, fast=True, with_prompt=True)
    prompt.call("zero", "kv")
    codes = decoder.call("run", __name__, "push_race", RACE_ROUNDS, 40, timeout=120)
    got = set(np.unique(prompt.call("rows", "kv").view(np.uint8)).tolist())
    assert got <= {0, SOURCE_BYTE}, got
    assert set(codes) <= {0, int(S.LLM_PARAM_INVALID)}, set(codes)
    assert codes.count(0) > 0 and SOURCE_BYTE in got and codes[-1] == S.LLM_PARAM_INVALID
    assert series_sum(metrics, "datadist_transfers_total", 'op="push",outcome="success"') == codes.count(0)
    assert series_sum(metrics, "datadist_transfers_in_flight", 'op="push"') == 0
