"""v1 KvCacheManager mode (spec §8) between two daemons, written from the v1 clients of spec §14.

* vllm-ascend V0 ``LLMDataDistConnector`` (§14.2): the prompt allocates four caches with
  ``CacheKey(cluster, 0, model_id)`` for model ids 1..4; the decoder pulls them with
  ``CacheKeyByIdAndIndex(remote, cache_id=1..4, 0)``, relying on cache ids counting from 1.
* Ascend sample ``basic_api_samples/decoder.py`` (§14.6): ``pull_cache(CacheKey(...), kv_cache_4bs, 1, 64)``,
  ``copy_cache``, ``get_cache_tensors(...)[0].numpy()``, ``deallocate_cache``.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.harness import ACL_PLANE, WorkerError, free_port, over_planes

pytestmark = pytest.mark.integration

P, D = 0x0100, 0x0200
OPS = "tests.api._ops"


def run(worker, op: str, *args, **kw):  # noqa: ANN001, ANN002, ANN003, ANN201
    return worker.call("run", OPS, op, *args, **kw)


@pytest.fixture
def pair(daemon_factory, worker_factory):
    dp, dd = daemon_factory.many("p", "d")
    port = free_port()
    prompt, decoder = worker_factory(dp), worker_factory(dd)
    run(prompt, "init_v1", "PROMPT", P, listen=f"127.0.0.1:{port}")
    run(decoder, "init_v1", "DECODER", D)
    return prompt, decoder, port


@over_planes("tcp", ACL_PLANE)
def test_vllm_v0_connector_flow_and_sample_decoder(pair) -> None:
    prompt, decoder, port = pair
    layers, seq, hidden = 4, 8, 16
    shapes = {1: (layers, (1, seq, hidden)), 2: (layers, (1, seq, hidden)), 3: (1, (1, seq)), 4: (1, (1, hidden))}
    for model_id, (n, shape) in shapes.items():  # key, value, input, hidden: cache ids 1..4
        assert run(prompt, "kv_alloc", f"m{model_id}", n, shape, keys=[(0, model_id)]) == model_id
        prompt.call("fill", f"m{model_id}", model_id)
        assert run(decoder, "kv_alloc", f"m{model_id}", n, shape) == model_id
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    assert run(decoder, "check_link_status_code", P) == "ok"
    for model_id in shapes:
        run(decoder, "kv_pull_cache", P, f"m{model_id}", ("id", model_id, 0), 0)
        np.testing.assert_array_equal(decoder.call("rows", f"m{model_id}"), prompt.call("rows", f"m{model_id}"))
    # a CacheKey pull consumed key (0, 1) on the prompt: gone now, as CANN's allocated caches do
    with pytest.raises(WorkerError) as info:
        run(decoder, "kv_pull_cache", P, "m1", ("key", 0, 1))
    assert info.value.status_code == 0x5010B002  # LLM_KV_CACHE_NOT_EXIST

    # the Ascend v1 sample decoder: a 4-batch cache, pull req 1 into batch 1 with size 64, then copy_cache
    run(prompt, "kv_alloc", "bs1", 4, (1, 4, 8), dtype="float16", keys=[(1, 0)])
    prompt.call("fill", "bs1", 9)
    run(decoder, "kv_alloc", "bs4", 4, (4, 4, 8), dtype="float16")
    run(decoder, "kv_alloc", "bs1", 4, (1, 4, 8), dtype="float16")
    run(decoder, "kv_pull_cache", P, "bs4", ("key", 1, 0), 1, 64)
    src = prompt.call("rows", "bs1")
    got = decoder.call("rows", "bs4")
    np.testing.assert_array_equal(got[:, 1], src[:, 0])
    assert not got[:, [0, 2, 3]].any()
    run(decoder, "kv_call", "copy_cache", "@bs1", "@bs4", 0, 1)  # dst first, as CANN
    np.testing.assert_array_equal(decoder.call("rows", "bs1")[:, 0], src[:, 0])
    (tensor,) = run(decoder, "cache_tensors", "bs4", 2)
    assert tensor.shape == (4, 4, 8) and tensor.dtype == np.float16
    np.testing.assert_array_equal(tensor[1].view(np.uint8).reshape(-1), src[2, 0])
    run(prompt, "kv_call", "remove_cache_key", run(prompt, "key_of", 1, 0))  # already consumed: no-op
    run(prompt, "kv_call", "deallocate_cache", "@bs1")


@over_planes("tcp", ACL_PLANE)
def test_offsets_blocks_swap_and_auto_free(pair) -> None:
    prompt, decoder, port = pair
    run(prompt, "kv_alloc", "c", 2, (2, 64), keys=[(5, 0), (6, 0)])
    prompt.call("fill", "c", 4)
    run(prompt, "kv_alloc", "pb", 2, (8, 32), blocks=True, model_id=3)
    prompt.call("fill", "pb", 5)
    run(decoder, "kv_alloc", "c", 2, (2, 64))
    run(decoder, "kv_alloc", "db", 2, (8, 32), blocks=True)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    src = prompt.call("rows", "c")
    # 16 bytes from offset 8 of the remote slot into offset 40 of local batch slot 1
    run(decoder, "kv_pull_cache", P, "c", ("key", 6, 0), 1, 16, src_cache_offset=8, dst_cache_offset=40)
    got = decoder.call("rows", "c")
    np.testing.assert_array_equal(got[:, 1, 40:56], src[:, 1, 8:24])
    assert not got[:, 1, :40].any() and not got[:, 1, 56:].any() and not got[:, 0].any()
    # size -1 with a dst offset: the local slot minus the offset
    run(decoder, "kv_pull_cache", P, "c", ("key", 5, 0), 0, -1, dst_cache_offset=16)
    np.testing.assert_array_equal(decoder.call("rows", "c")[:, 0, 16:], src[:, 0, :48])
    # v1 pull_blocks names: prompt_cache_key, decoder_kv_cache, prompt_blocks, decoder_blocks (+ layer kwargs)
    blocks = prompt.call("rows", "pb")
    run(decoder, "kv_pull_blocks", P, "db", [7, 0, 3], [1, 2, 3], model_id=3)
    run(decoder, "kv_pull_blocks", P, "db", [5], [6], model_id=3, src_layer_range=(1, 2), dst_layer_range=(1, 2),
        tensor_num_per_layer=1)
    got = decoder.call("rows", "db")
    np.testing.assert_array_equal(got[:, [1, 2, 3]], blocks[:, [7, 0, 3]])
    np.testing.assert_array_equal(got[1, 6], blocks[1, 5])
    assert not got[0, 6].any()
    # copy_blocks and swap_blocks (out to a host cache made from the worker's own memory, then back in)
    run(decoder, "kv_call", "copy_blocks", "@db", {1: [4, 5]})
    run(decoder, "cpu_cache", "host", 2, (8, 32))
    run(decoder, "kv_call", "swap_blocks", "@db", "@host", {4: 0, 2: 7})
    host = decoder.call("rows", "host")
    np.testing.assert_array_equal(host[:, 0], blocks[:, 7])
    np.testing.assert_array_equal(host[:, 7], blocks[:, 0])
    run(decoder, "kv_call", "swap_blocks", "@host", "@db", {7: 0})
    np.testing.assert_array_equal(decoder.call("rows", "db")[:, 0], blocks[:, 0])
    # KvCache frees itself when collected (CANN's __del__ -> deallocate_cache)
    used = run(decoder, "pool_used")
    run(decoder, "kv_alloc", "tmp", 4, (4, 256))
    assert run(decoder, "pool_used") > used
    run(decoder, "drop", "tmp")
    assert run(decoder, "pool_used") == used
    # roles: only the decoder pulls, only the prompt owns keys
    assert run(prompt, "expect_error", "kv_pull_cache", D, "c", ("key", 1, 0)) == ("LLMException", "LLM_PARAM_INVALID")
    assert run(decoder, "expect_error", "kv_alloc", "k", 1, (1, 8), keys=[(1, 0)]) == ("LLMException",
                                                                                       "LLM_PARAM_INVALID")
