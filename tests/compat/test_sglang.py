"""SGLang's Ascend disaggregation backend (``DataDistKVManager``), its call sequence replayed.

The prefill is PROMPT with ``listen_ip_info`` (port 26000 there), ``sync_kv_timeout=20000``,
cache-manager mode, and registers its KV blocks cache and its aux (output ids) cache *without* a
key; the decoder registers both *with* ``BlocksCacheKey``s and links to the prefill
(``link_clusters([cluster], 20000)``, one local ip, the prefill's ip). Then the prefill — the
listening side — pushes each request from a ``ThreadPoolExecutor(max_workers=12)``: its KV blocks,
then its aux row. Separate processes, embedded and through daemons; bytes checked block by block.

Where the replay departs from that prototype, and why: it sets ``enable_remote_cache_accessible``
(CANN's ``push_blocks`` requires it today); both sides there use ``dp_rank`` as the cluster id, here
they differ (ids must be unique among linked parties); its decoder binds both caches to
``BlocksCacheKey(cluster, 0)``, here the aux cache takes model id 1 (one blocks cache per key).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.harness import free_port

pytestmark = pytest.mark.integration

PREFILL, DECODE = 0, 1
IP = "127.0.0.1"
OPS = "tests.compat.ops"
LAYERS = 4
BLOCKS = 96
KV = [([BLOCKS, 16, 2, 8], 0.0)] * (2 * LAYERS)   # per layer K and V: [blocks, block_size, kv heads, head dim]
AUX = [([64, 16], 0.0)]                            # output ids, one row per request slot
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
    run(prefill, "register_blocks", "kv", KV, dtype="DT_BF16")
    run(prefill, "register_blocks", "aux", AUX, dtype="DT_INT8")
    run(decode, "register_blocks", "kv", KV, dtype="DT_BF16", key=(DECODE, 0))
    run(decode, "register_blocks", "aux", AUX, dtype="DT_INT8", key=(DECODE, 1))
    assert run(decode, "link_clusters", [(PREFILL, IP, port, IP, 0)], timeout=20000) == ("LLM_SUCCESS",
                                                                                         ["LLM_SUCCESS"])
    rng = np.random.default_rng(7)
    for wave in range(3):  # three waves of 12 requests, each with its own block tables on both sides
        prefill.call("fill", "kv", wave)
        prefill.call("fill", "aux", 10 + wave)
        src = rng.permutation(BLOCKS)[:THREADS * 4].reshape(THREADS, 4).tolist()
        dst = rng.permutation(BLOCKS)[:THREADS * 4].reshape(THREADS, 4).tolist()
        aux_src, aux_dst = rng.permutation(64)[:THREADS].tolist(), rng.permutation(64)[:THREADS].tolist()
        requests = list(zip(src, dst, aux_src, aux_dst, strict=True))
        assert run(prefill, "sglang_push_requests", DECODE, requests, threads=THREADS) == ["LLM_SUCCESS"] * THREADS
        mine, theirs = prefill.call("rows", "kv"), decode.call("rows", "kv")
        mine_aux, theirs_aux = prefill.call("rows", "aux"), decode.call("rows", "aux")
        for s, d, a_s, a_d in requests:
            np.testing.assert_array_equal(theirs[:, d], mine[:, s], err_msg=f"wave {wave}")
            np.testing.assert_array_equal(theirs_aux[:, a_d], mine_aux[:, a_s], err_msg=f"wave {wave}")
    # the link survived the concurrent pushes: one more request goes through, then the decoder unlinks
    assert run(prefill, "sglang_push_requests", DECODE, [([5, 6], [90, 91], 3, 63)], threads=1) == ["LLM_SUCCESS"]
    np.testing.assert_array_equal(decode.call("rows", "kv", None, [90, 91]),
                                  prefill.call("rows", "kv", None, [5, 6]))
    assert run(decode, "unlink_clusters", [(PREFILL, IP, port)]) == ("LLM_SUCCESS", ["LLM_SUCCESS"])
    decode.call("finalize")
    prefill.call("finalize")
