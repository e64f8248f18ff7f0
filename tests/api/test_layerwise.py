"""``transfer_cache_async`` (spec §5.7, §7): layer-wise push from the prompt while it computes, real daemons.

The prompt worker's synchronizer is a gate the test opens layer by layer; the decoder's bytes are
read back after each release. Layer ``l`` must have arrived while layer ``l + 1`` is still unreleased,
so the push is layer-wise and asynchronous (no timing threshold: a stuck push fails the bounded wait).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.harness import ACL_PLANE, WorkerError, free_port, metrics_address, over_planes, series_sum

#: transfers run over tcp, nixl (UCX over TCP and over shared memory) and acl-hccl, see ``over_planes``;
#: tests of errors and limits over tcp, one nixl plane and acl-hccl (the simulated Ascend runtime)
pytestmark = pytest.mark.integration

P, D = 1, 2
LAYERS = 3
TENSORS = 2 * LAYERS
BLOCKS = 16
BLOCK_SHAPE = (4, 16)  # uint8 -> 64 bytes per block per tensor
OPS = "tests.api._ops"


def run(worker, op: str, *args, **kw):  # noqa: ANN001, ANN002, ANN003, ANN201
    return worker.call("run", OPS, op, *args, **kw)


@pytest.fixture
def v2_pair(daemon_factory, worker_factory):
    """Prompt listens, decoder links to it (one-sided link_clusters): the prompt pushes over the reverse path."""
    dp, dd = daemon_factory.many("p", "d", args=["--metrics", "127.0.0.1:0"])
    port = free_port()
    prompt, decoder = worker_factory(dp), worker_factory(dd)
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True, sync_kv_timeout=5000,
                mem_pool=4 << 20)
    decoder.call("init", "DECODER", D, remote_cache_accessible=True, sync_kv_timeout=5000, mem_pool=4 << 20)
    prompt.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE, dtype="uint8", model_id=0)
    decoder.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE, dtype="uint8", model_id=0)
    assert decoder.call("allocate", "c", TENSORS, (2, 128), dtype="uint8") == 2  # contiguous target, cache id 2
    prompt.call("allocate", "c", TENSORS, (2, 128), dtype="uint8")
    prompt.call("fill", "kv", 1)
    prompt.call("fill", "c", 2)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    return prompt, decoder, port


def _layer(t: int) -> list:
    return [2 * t, 2 * t + 1]


@over_planes()
def test_layers_arrive_one_by_one_while_the_prompt_computes(v2_pair, daemon_factory) -> None:
    prompt, decoder, _ = v2_pair
    src_blocks, dst_blocks = [3, 4, 5, 9], [10, 0, 1, 7]
    src = prompt.call("rows", "kv", None, src_blocks)
    run(prompt, "tca_start", "kv", [{"kind": "blocks", "cluster": D, "model_id": 0, "src": (0, LAYERS),
                                     "dst": (0, LAYERS)}], src_blocks, dst_blocks)
    assert run(prompt, "tca_pending") == ("LLM_TIMEOUT", ["LLM_TIMEOUT"])  # the task waits for layer 0
    for layer in range(LAYERS):
        assert run(prompt, "tca_release", layer)
        assert run(decoder, "wait_rows", "kv", _layer(layer), dst_blocks, src[_layer(layer)]), f"layer {layer}"
        if layer + 1 < LAYERS:  # not released yet: not sent
            assert not decoder.call("rows", "kv", _layer(layer + 1), dst_blocks).any()
    assert run(prompt, "tca_results") == ("LLM_SUCCESS", ["LLM_SUCCESS"])
    untouched = [b for b in range(BLOCKS) if b not in dst_blocks]
    assert not decoder.call("rows", "kv", None, untouched).any()
    # the sending daemon's metrics count the push as any push (issue 44, trip 6: they had none of it)
    at, mine = metrics_address(daemon_factory.daemons[0]), f'cluster_id="{P}",peer_cluster_id="{D}"'
    assert series_sum(at, "datadist_transfers_total", f'op="push",{mine},outcome="success"') == 1
    assert series_sum(at, "datadist_transfer_bytes_total", f'direction="out",{mine}') == src.nbytes
    assert series_sum(at, "datadist_transfer_blocks_total", f'direction="out",{mine}') == len(dst_blocks)
    assert series_sum(at, "datadist_transfers_in_flight", f'op="push",cluster_id="{P}"') == 0


def test_abort_midway_and_never_sent_configs(v2_pair) -> None:
    prompt, decoder, _ = v2_pair
    configs = [
        {"kind": "blocks", "cluster": D, "model_id": 0, "src": (0, 1), "dst": (2, 3)},       # layer 0 -> dst layer 2
        {"kind": "blocks", "cluster": D, "model_id": 0, "src": (1, 3), "dst": (0, 2)},       # aborted at layer 1
        {"kind": "id", "cluster": D, "cache_id": 2, "index": 1, "src": (2, 3), "dst": (2, 3), "batch": 0},  # never
    ]
    src = prompt.call("rows", "kv", None, [6, 7])
    run(prompt, "tca_start", "kv", configs, [6, 7], [6, 7])
    assert run(prompt, "tca_release", 0)
    assert run(decoder, "wait_rows", "kv", _layer(2), [6, 7], src[_layer(0)])
    assert run(prompt, "tca_release", 1, ok=False)  # synchronize_layer(1) -> False
    code, results = run(prompt, "tca_results")
    assert results == ["LLM_SUCCESS", "LLM_PARAM_INVALID", None]
    assert code == "LLM_PARAM_INVALID"
    assert run(prompt, "tca_asked") == [0, 1]  # layer 2 never synchronized once the task aborted
    assert not decoder.call("rows", "kv", _layer(0) + _layer(1)).any()
    assert not decoder.call("rows", "c").any()


@over_planes("tcp", "nixl-ucx-shm", ACL_PLANE)
def test_contiguous_targets_by_id_and_link_busy(v2_pair) -> None:
    prompt, decoder, port = v2_pair
    # the decoder pushes too (v2 has no roles): its own task on its link makes its pulls LLM_LINK_BUSY
    decoder.call("fill", "c", 5)
    run(decoder, "tca_start", "c", [{"kind": "id", "cluster": P, "cache_id": 2, "index": 0, "src": (0, LAYERS),
                                     "dst": (0, LAYERS), "batch": 1}])
    with pytest.raises(WorkerError) as info:
        decoder.call("pull_blocks", P, "kv", [0], [0])
    assert info.value.status_code == 0x5010B01B  # LLM_LINK_BUSY
    for layer in range(LAYERS):
        assert run(decoder, "tca_release", layer)
    assert run(decoder, "tca_results") == ("LLM_SUCCESS", ["LLM_SUCCESS"])
    np.testing.assert_array_equal(prompt.call("rows", "c")[:, 0], decoder.call("rows", "c")[:, 1])
    decoder.call("pull_blocks", P, "kv", [0], [0])  # the link is free again
    # contiguous -> blocks (dst_block_memory_size): the first 2 blocks' worth of batch slot 1 of each tensor
    run(prompt, "tca_start", "c", [{"kind": "blocks", "cluster": D, "model_id": 0, "src": (0, LAYERS),
                                    "dst": (0, LAYERS), "batch": 0}], None, [12, 13], 64)
    for layer in range(LAYERS):
        assert run(prompt, "tca_release", layer)
    assert run(prompt, "tca_results") == ("LLM_SUCCESS", ["LLM_SUCCESS"])
    slot = prompt.call("rows", "c")[:, 0, :128].reshape(TENSORS, 2, 64)
    np.testing.assert_array_equal(decoder.call("rows", "kv", None, [12, 13]), slot)


@over_planes("tcp", "nixl-ucx-tcp", ACL_PLANE)
def test_blocks_key_without_indices_takes_the_cache_to_cache_path(v2_pair) -> None:
    """CANN's transfer_cache_async_sample: BlocksCacheKey config, no block indices (issue: item 3).

    CANN's layer-wise job then copies one source stride per tensor to the start of the destination
    tensor (``GenerateCacheToCacheTask``); for blocks caches a stride is one block: block 0 to block 0.
    """
    prompt, decoder, _ = v2_pair
    run(prompt, "tca_start", "kv", [{"kind": "blocks", "cluster": D, "model_id": 0, "src": (0, 1), "dst": (1, 2)}])
    assert run(prompt, "tca_release", 0)
    assert run(prompt, "tca_results") == ("LLM_SUCCESS", ["LLM_SUCCESS"])
    np.testing.assert_array_equal(decoder.call("rows", "kv", _layer(1), [0]), prompt.call("rows", "kv", _layer(0), [0]))
    assert not decoder.call("rows", "kv", _layer(1), list(range(1, BLOCKS))).any()
    assert not decoder.call("rows", "kv", _layer(0) + _layer(2)).any()
    # a contiguous source: its batch slot (128 bytes) does not fit one 64-byte destination block -> refused per config
    run(prompt, "tca_start", "c", [{"kind": "blocks", "cluster": D, "model_id": 0, "src": (0, 1), "dst": (0, 1)}])
    assert run(prompt, "tca_release", 0)
    assert run(prompt, "tca_results") == ("LLM_PARAM_INVALID", ["LLM_PARAM_INVALID"])


@pytest.fixture
def v1_pair(daemon_factory, worker_factory):
    """KvCacheManager mode: the prompt listens and pushes with raw remote addresses (TransferConfig)."""
    dp, dd = daemon_factory.many("p", "d", args=["--metrics", "127.0.0.1:0"])
    port = free_port()
    prompt, decoder = worker_factory(dp), worker_factory(dd)
    run(prompt, "init_v1", "PROMPT", P, listen=f"127.0.0.1:{port}")
    run(decoder, "init_v1", "DECODER", D)
    run(prompt, "kv_alloc", "c", TENSORS, (2, 96))
    run(decoder, "kv_alloc", "c", TENSORS, (4, 96))
    prompt.call("fill", "c", 3)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    return prompt, decoder


@over_planes("tcp", "nixl-ucx-shm", ACL_PLANE)
def test_v1_transfer_config_raw_addresses(v1_pair) -> None:
    prompt, decoder = v1_pair
    base = run(decoder, "addrs", "c")
    row = 96
    # layers 1..2 of prompt batch 1 -> decoder batch slot 3 (addresses pre-offset by the user, spec §5.7)
    dst_addrs = [a + 3 * row for a in base[2:6]]
    bad = [base[0] + 4 * row * 100, base[1]]  # outside every cache of the decoder: refused by its daemon
    run(prompt, "tca_start", "c", [{"kind": "addrs", "cluster": D, "addrs": dst_addrs, "src": (1, 3), "batch": 1}])
    assert run(prompt, "check_link_status_code", D) == "LLM_LINK_BUSY"
    for layer in range(1, LAYERS):
        assert run(prompt, "tca_release", layer)
    assert run(prompt, "tca_results") == ("LLM_SUCCESS", ["LLM_SUCCESS"])
    got = decoder.call("rows", "c")
    np.testing.assert_array_equal(got[2:6, 3], prompt.call("rows", "c")[2:6, 1])
    assert not got[:2].any() and not got[:, :3].any()
    run(prompt, "tca_start", "c", [{"kind": "addrs", "cluster": D, "addrs": bad, "src": (0, 1)}])
    assert run(prompt, "tca_release", 0)
    assert run(prompt, "tca_results") == ("LLM_PARAM_INVALID", ["LLM_PARAM_INVALID"])
    # the decoder is not PROMPT: v1 transfer_cache_async is refused there
    assert run(decoder, "expect_error", "tca_start", "c", [{"kind": "addrs", "cluster": P, "addrs": bad,
                                                           "src": (0, 1)}]) == ("LLMException", "LLM_PARAM_INVALID")
