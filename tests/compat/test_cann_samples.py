"""CANN's own Python samples (``hicann/hixl``, ``examples/python/llm_datadist/``), their flows replayed.

Same cluster ids (0 and 1), cache shapes (2 tensors of [3, 10] DT_FLOAT, one block = 10 floats),
keys, option attributes, block lists and unlink calls as the samples; ``torch.ones(...).npu()`` is
``np.ones``; the samples' ``dist.barrier()`` is the order of the calls here. Prompt and decoder are
separate processes, each embedded or through its own daemon. Written from reading the samples.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.harness import free_port

pytestmark = pytest.mark.integration

PROMPT, DECODER = 0, 1
OPS = "tests.compat.ops"
IP = "127.0.0.1"
SHAPE = [3, 10]
ONES = [(SHAPE, 1.0), (SHAPE, 1.0)]
ZEROS = [(SHAPE, 0.0), (SHAPE, 0.0)]
SUCCESS = ("LLM_SUCCESS", ["LLM_SUCCESS"])


def run(worker, op: str, *args, **kw):  # noqa: ANN001, ANN002, ANN003, ANN201
    return worker.call("run", OPS, op, *args, **kw)


def test_push_blocks_sample_decoder_pushes_to_the_listening_prompt(spawn) -> None:
    """push_blocks_sample.py: both listen (local_comm_res=""), the decoder links and pushes [0,1] -> [0,2]."""
    pport, dport = free_port(), free_port()
    prompt, decoder = spawn(), spawn()
    run(prompt, "init", "PROMPT", PROMPT, {"device_id": 0, "local_comm_res": "", "listen_ip_info": f"{IP}:{pport}"})
    run(decoder, "init", "DECODER", DECODER, {"device_id": 0, "local_comm_res": "", "listen_ip_info": f"{IP}:{dport}"})
    run(prompt, "register_blocks", "kv", ONES, key=(PROMPT, 0))
    run(decoder, "register_blocks", "kv", ZEROS, key=(DECODER, 0))
    decoder.call("fill", "kv", 3)
    assert run(decoder, "link_clusters", [(PROMPT, IP, pport, IP, dport)]) == SUCCESS
    run(decoder, "push_blocks", PROMPT, 0, "kv", [0, 1], [0, 2])
    np.testing.assert_array_equal(prompt.call("rows", "kv", None, [0, 2]),
                                  decoder.call("rows", "kv", None, [0, 1]))
    assert (prompt.call("rows", "kv", None, [1]).view(np.float32) == 1.0).all()
    assert run(decoder, "unlink_clusters", [(PROMPT, None, 0)], force=True) == SUCCESS
    assert run(prompt, "unlink_clusters", [(DECODER, None, 0)], force=True) == SUCCESS
    run(decoder, "unregister_and_finalize", "kv")
    run(prompt, "unregister_and_finalize", "kv")


def test_switch_role_sample_then_the_listening_side_pushes(spawn) -> None:
    """switch_role_sample.py: pull, unlink; the prompt becomes DECODER (stops listening), the decoder becomes
    PROMPT (listens); the prompt links to it and the decoder, now the listening side, pushes."""
    pport, dport = free_port(), free_port()
    prompt, decoder = spawn(), spawn()
    run(prompt, "init", "PROMPT", PROMPT, {"device_id": 0, "local_comm_res": "", "listen_ip_info": f"{IP}:{pport}"})
    run(decoder, "init", "DECODER", DECODER, {"device_id": 0, "local_comm_res": ""})
    run(prompt, "register_blocks", "kv", ONES, key=(PROMPT, 0))
    run(decoder, "register_blocks", "kv", ZEROS, key=(DECODER, 0))
    prompt.call("fill", "kv", 1)
    assert run(decoder, "link_clusters", [(PROMPT, IP, pport, IP, dport)]) == SUCCESS
    run(decoder, "pull_blocks", PROMPT, 0, "kv", src_blocks=[0, 1], dst_blocks=[0, 2])
    np.testing.assert_array_equal(decoder.call("rows", "kv", None, [0, 2]),
                                  prompt.call("rows", "kv", None, [0, 1]))
    assert run(decoder, "unlink_clusters", [(PROMPT, IP, pport)]) == SUCCESS
    run(prompt, "switch_role", "DECODER")
    run(decoder, "switch_role", "PROMPT", listen=f"{IP}:{dport}")
    assert run(prompt, "link_clusters", [(DECODER, IP, dport, IP, pport)]) == SUCCESS
    decoder.call("fill", "kv", 2)
    run(decoder, "push_blocks", PROMPT, 0, "kv", [0, 1, 2], [0, 1, 2], src_layer_range=(0, 2),
        dst_layer_range=(0, 2), tensor_num_per_layer=1)
    np.testing.assert_array_equal(prompt.call("rows", "kv"), decoder.call("rows", "kv"))
    assert run(prompt, "unlink_clusters", [(DECODER, None, 0)], force=True) == SUCCESS
    assert run(decoder, "unlink_clusters", [(PROMPT, None, 0)], force=True) == SUCCESS
    run(prompt, "unregister_and_finalize", "kv")
    run(decoder, "unregister_and_finalize", "kv")


def test_transfer_cache_async_sample_layer_wise_without_indices(spawn) -> None:
    """transfer_cache_async_sample.py: enable_remote_cache_accessible, the prompt links to the listening
    decoder, pushes layer 0 with a BlocksCacheKey config and no block indices (one stride: block 0)."""
    pport, dport = free_port(), free_port()
    prompt, decoder = spawn(), spawn()
    config = {"device_id": 0, "enable_cache_manager": True, "enable_remote_cache_accessible": True}
    run(decoder, "init", "DECODER", DECODER, {**config, "listen_ip_info": f"{IP}:{dport}"})
    run(prompt, "init", "PROMPT", PROMPT, {**config, "listen_ip_info": f"{IP}:{pport}"})
    run(prompt, "register_blocks", "kv", ONES, key=(PROMPT, 0))
    run(decoder, "register_blocks", "kv", ZEROS, key=(DECODER, 0))
    assert run(prompt, "link_clusters", [(DECODER, IP, dport, IP, pport)]) == SUCCESS
    assert run(prompt, "transfer_blocks_key_async", "kv", DECODER, 0, (0, 1), (0, 1)) == SUCCESS
    got = decoder.call("rows", "kv").view(np.float32)   # [tensor, block, 10 floats]
    assert (got[:, 0] == 1.0).all() and (got[:, 1:] == 0.0).all()
    assert run(prompt, "unlink_clusters", [(DECODER, None, 0)], force=True) == SUCCESS
    assert run(decoder, "unlink_clusters", [(PROMPT, None, 0)], force=True) == SUCCESS
    run(prompt, "unregister_and_finalize", "kv")
    run(decoder, "unregister_and_finalize", "kv")


def _xpyd_cluster_id(ip: str, port: int) -> int:
    """pull_blocks_xpyd_sample.py: cluster_id = (ipv4 as int << 16) | port."""
    a, b, c, d = (int(x) for x in ip.split("."))
    return (((a << 24) | (b << 16) | (c << 8) | d) << 16) | port


def test_pull_blocks_xpyd_sample(spawn) -> None:
    """2 prompts (listening) x 2 decoders; each decoder links to both prompts in one call and pulls
    [0,1] -> [0,2] from each; then unlinks both and finalizes."""
    ports = [free_port(), free_port()]
    p_ids = [_xpyd_cluster_id(IP, p) for p in ports]
    d_ports = [free_port(), free_port()]
    d_ids = [_xpyd_cluster_id(IP, p) for p in d_ports]
    prompts = [spawn(), spawn()]
    decoders = [spawn(), spawn()]
    one = [([3, 10], 0.0)]
    for i, p in enumerate(prompts):
        run(p, "init", "PROMPT", p_ids[i], {"device_id": 0, "local_comm_res": "", "listen_ip_info": f"{IP}:{ports[i]}"})
        run(p, "register_blocks", "kv", one, key=(p_ids[i], 0))
        p.call("fill", "kv", 10 + i)
    for i, d in enumerate(decoders):
        run(d, "init", "DECODER", d_ids[i], {"device_id": 0, "local_comm_res": ""})
        run(d, "register_blocks", "kv", one, key=(d_ids[i], 0))
    for d in decoders:
        assert run(d, "link_clusters", [(p_ids[i], IP, ports[i], IP, 0) for i in range(2)]) == (
            "LLM_SUCCESS", ["LLM_SUCCESS", "LLM_SUCCESS"])
    for d in decoders:
        for i, p in enumerate(prompts):
            run(d, "pull_blocks", p_ids[i], 0, "kv", src_blocks=[0, 1], dst_blocks=[0, 2])
            np.testing.assert_array_equal(d.call("rows", "kv", None, [0, 2]),
                                          p.call("rows", "kv", None, [0, 1]))
    for d in decoders:
        assert run(d, "unlink_clusters", [(p_ids[i], IP, ports[i]) for i in range(2)]) == (
            "LLM_SUCCESS", ["LLM_SUCCESS", "LLM_SUCCESS"])
        run(d, "unregister_and_finalize", "kv")
    for p in prompts:
        run(p, "unregister_and_finalize", "kv")
