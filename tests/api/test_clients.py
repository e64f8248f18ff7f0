"""Layouts of the real v2 clients (spec §14), pulled between two daemons with shuffled block tables.

* MindIE-LLM (§14.5) / vLLM paged KV: a K cache and a V cache, one tensor per layer each, registered with
  ``BlocksCacheKey(cluster, model_id=0)`` (K) and ``model_id=1`` (V); the decoder pulls each by model id.
* vllm-ascend MLA (§14.1): two caches of different shapes, k_normed (``model_id=0``) and k_pe (``model_id=1``).
Like vllm-ascend, the decoder trims the remote block list to its last ``len(local)`` blocks.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.harness import free_port

pytestmark = pytest.mark.integration

P, D = 11, 22
LAYERS = 4
BLOCKS = 32
LAYOUTS = {
    "mindie_kv": [("k", 0, (4, 2, 8)), ("v", 1, (4, 2, 8))],        # (name, model_id, block shape)
    "mla": [("k_normed", 0, (4, 1, 32)), ("k_pe", 1, (4, 1, 8))],
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_paged_layout_pulled_with_shuffled_tables(layout, daemon_factory, worker_factory) -> None:
    dp, dd = daemon_factory.many("p", "d")
    port = free_port()
    prompt, decoder = worker_factory(dp), worker_factory(dd)
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True, sync_kv_timeout=5000)
    decoder.call("init", "DECODER", D, remote_cache_accessible=True, sync_kv_timeout=5000)
    caches = LAYOUTS[layout]
    for i, (name, model_id, shape) in enumerate(caches):
        # both sides register before linking; the decoder passes its own key too (vllm-ascend, MindIE)
        prompt.call("register_blocks", name, LAYERS, BLOCKS, shape, model_id=model_id)
        decoder.call("register_blocks", name, LAYERS, BLOCKS, shape, model_id=model_id)
        prompt.call("fill", name, 10 + i)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    rng = np.random.default_rng(7)
    expected = {name: np.zeros_like(decoder.call("rows", name)) for name, _, _ in caches}
    sources = {name: prompt.call("rows", name) for name, _, _ in caches}
    for request in range(3):
        remote_table = rng.permutation(BLOCKS)[: 6 + request].tolist()  # the prompt's block table of a request
        local_table = rng.permutation(BLOCKS)[:5].tolist()              # the decoder's (shorter) table
        remote_table = remote_table[-len(local_table):]                 # vllm-ascend: last len(local) blocks
        for name, model_id, _ in caches:
            decoder.call("pull_blocks", P, name, remote_table, local_table, model_id=model_id)
            expected[name][:, local_table] = sources[name][:, remote_table]
    for name, _, _ in caches:
        np.testing.assert_array_equal(decoder.call("rows", name), expected[name], err_msg=f"{layout}/{name}")
