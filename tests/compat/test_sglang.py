"""SGLang's Ascend disaggregation backend (LLM-DataDist transfer), its call sequence replayed.

The prefill listens (``listen_ip_info``, ``sync_kv_timeout=20000``, cache-manager mode, remote cache
accessible) and registers its paged KV with ``BlocksCacheKey(cluster_id, 0)``; the decoder registers
its own, links to the prefill (``link_clusters([cluster], 20000)``); then the *prefill* — the
listening side — pushes each finished request's blocks to the decoder from its 12 transfer threads
at once. Separate processes, embedded and through daemons; bytes checked block by block.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.harness import free_port

pytestmark = pytest.mark.integration

PREFILL, DECODE = 1001, 2001
IP = "127.0.0.1"
OPS = "tests.compat.ops"
LAYERS = 4
BLOCKS = 96
KV = [([BLOCKS, 16, 2, 8], 0.0)] * (2 * LAYERS)   # per layer K and V: [blocks, block_size, kv heads, head dim]
THREADS = 12


def run(worker, op: str, *args, **kw):  # noqa: ANN001, ANN002, ANN003, ANN201
    return worker.call("run", OPS, op, *args, **kw)


def test_prefill_pushes_to_the_decoder_that_linked_from_12_threads(spawn) -> None:
    port = free_port()
    prefill, decode = spawn(), spawn()
    config = {"device_id": 0, "sync_kv_timeout": 20000, "enable_cache_manager": True,
              "enable_remote_cache_accessible": True}
    run(prefill, "init", "PROMPT", PREFILL, {**config, "listen_ip_info": f"{IP}:{port}"})
    run(decode, "init", "DECODER", DECODE, config)
    run(prefill, "register_blocks", "kv", KV, dtype="DT_FLOAT16", key=(PREFILL, 0))
    run(decode, "register_blocks", "kv", KV, dtype="DT_FLOAT16", key=(DECODE, 0))
    assert run(decode, "link_clusters", [(PREFILL, IP, port, IP, 0)], timeout=20000) == ("LLM_SUCCESS",
                                                                                         ["LLM_SUCCESS"])
    rng = np.random.default_rng(7)
    for round_ in range(3):  # three waves of 12 requests, each with its own block table on both sides
        run(prefill, "fill_random", "kv", round_)
        src = rng.permutation(BLOCKS)[:THREADS * 4].reshape(THREADS, 4).tolist()
        dst = rng.permutation(BLOCKS)[:THREADS * 4].reshape(THREADS, 4).tolist()
        jobs = list(zip(src, dst, strict=True))
        assert run(prefill, "push_blocks_threads", DECODE, "kv", jobs, threads=THREADS) == ["LLM_SUCCESS"] * THREADS
        mine, theirs = run(prefill, "blocks_of", "kv"), run(decode, "blocks_of", "kv")
        for s, d in jobs:
            np.testing.assert_array_equal(theirs[:, d], mine[:, s], err_msg=f"round {round_}")
    # the link survived the concurrent pushes: the decoder still pulls over it, then unlinks both ends
    run(decode, "pull_blocks", PREFILL, 0, "kv", src_blocks=[0, 1], dst_blocks=[2, 3])
    np.testing.assert_array_equal(run(decode, "blocks_of", "kv", None, [2, 3]),
                                  run(prefill, "blocks_of", "kv", None, [0, 1]))
    assert run(decode, "unlink_clusters", [(PREFILL, IP, port)]) == ("LLM_SUCCESS", ["LLM_SUCCESS"])
    run(decode, "finalize")
    run(prefill, "finalize")
