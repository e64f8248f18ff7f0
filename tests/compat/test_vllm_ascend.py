"""vllm-ascend's ``LLMDataDistCMgrConnector`` (v1 connector, cache-manager mode), its call sequence replayed.

Both roles: ``LLMConfig`` with ``device_id``, ``sync_kv_timeout``, ``enable_switch_role``,
``enable_cache_manager``, ``enable_remote_cache_accessible``; register every cache before linking
(MLA: two blocks caches, ``k_normed`` as ``BlocksCacheKey(cluster_id=local, model_id=0)`` and ``k_pe``
as model 1, one tensor per layer each); then each side calls ``link(f"pd_comm_{p_ip}_{d_ip}",
{prefill: 0, decode: 1}, rank_table)`` and polls ``query_register_mem_status`` until OK; the decoder
pulls every cache with the remote block ids trimmed to its local ones, catching the exception tiers
as the connector does; ``unlink(comm_id)`` on both. Separate processes, embedded and through daemons.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.harness import free_port

pytestmark = pytest.mark.integration

IP = "127.0.0.1"
OPS = "tests.compat.ops"
PREFILL, DECODE = 17, 42     # the connector reads cluster ids from its rank table
LAYERS = 4
BLOCKS = 64
K_NORMED = [([BLOCKS, 128, 1, 64], 0.0)] * LAYERS
K_PE = [([BLOCKS, 128, 1, 16], 0.0)] * LAYERS


def run(worker, op: str, *args, **kw):  # noqa: ANN001, ANN002, ANN003, ANN201
    return worker.call("run", OPS, op, *args, **kw)


def rank_table(prefill_port: int, decode_port: int) -> str:
    """The connector's v1.2 rank table (two servers); ``device_port`` is datadist's extension for one host."""
    servers = [{"server_id": IP, "device": [{"device_id": str(r), "device_ip": IP, "device_port": str(port),
                                             "rank_id": str(r)}]}
               for r, port in ((0, prefill_port), (1, decode_port))]
    return json.dumps({"version": "1.2", "server_count": "2", "status": "completed", "server_list": servers})


def test_c_mgr_connector_mla_pull(spawn) -> None:
    prefill, decode = spawn(), spawn()
    config = {"device_id": 0, "sync_kv_timeout": 3000, "enable_switch_role": True, "enable_cache_manager": True,
              "enable_remote_cache_accessible": True}
    for worker, role, cid in ((prefill, "PROMPT", PREFILL), (decode, "DECODER", DECODE)):
        run(worker, "init", role, cid, config)
        run(worker, "register_blocks", "k_normed", K_NORMED, dtype="DT_BF16", key=(cid, 0))
        run(worker, "register_blocks", "k_pe", K_PE, dtype="DT_BF16", key=(cid, 1))
    prefill.call("fill", "k_normed", 1)
    prefill.call("fill", "k_pe", 2)
    table = rank_table(free_port(), free_port())
    name, members = f"pd_comm_{IP}_{IP}", [(PREFILL, 0), (DECODE, 1)]
    d_comm = decode.call("comm_link", name, members, table)     # the decoder links first ...
    p_comm = prefill.call("comm_link", name, members, table)    # ... the prefill on the decoder's metadata
    assert run(decode, "wait_registered", d_comm) == "OK" and run(prefill, "wait_registered", p_comm) == "OK"
    remote = [7, 8, 9, 10, 11, 12]           # the prefill's block table; the decoder holds the last 4
    local = [40, 3, 33, 5]
    assert run(decode, "vllm_pull_blocks", PREFILL, ["k_normed", "k_pe"], remote, local) == "ok"
    for name_ in ("k_normed", "k_pe"):
        np.testing.assert_array_equal(decode.call("rows", name_, None, local),
                                      prefill.call("rows", name_, None, remote[-4:]))
    # a bad table is caught the way the connector catches it (ValueError from the argument checks)
    assert run(decode, "vllm_pull_blocks", PREFILL, ["k_normed"], [-1], [0]).startswith("ValueError")
    decode.call("comm_unlink", d_comm)
    prefill.call("comm_unlink", p_comm)
    assert run(decode, "vllm_pull_blocks", PREFILL, ["k_normed"], [1], [1]) == "LLM_NOT_YET_LINK"
    decode.call("finalize")
    prefill.call("finalize")


def test_v0_connector_kv_cache_manager_flow(spawn) -> None:
    """vllm-ascend's V0 ``LLMDataDistConnector`` (``SimplePipe``), KvCacheManager mode: raw init options
    (``llm.SyncKvCacheWaitTime``, ``ge.exec.deviceId``, the prompt's ``llm.listenIpInfo``), the decoder links
    at init (``link_clusters([cluster], 20000)``), the prompt sends four tensors (key, value, input ids,
    hidden: ``CacheDesc(num_layer | 1, shape, seq_len_dim_index=1 | -1)``, ``CacheKey(cluster, 0, model_id)``,
    cache ids 1..4) and the decoder receives them by ``CacheKeyByIdAndIndex(remote, 1..4, 0)``; close unlinks.

    Departure: the connector gives prompt and decoder the same cluster id (0, "for 1P1D"); datadist refuses
    a link between equal cluster ids, so the decoder is cluster 1 here (see the issue report).
    """
    port = free_port()
    prompt, decoder = spawn(), spawn()
    run(prompt, "init_raw", "PROMPT", 0, {"llm.SyncKvCacheWaitTime": "5000", "ge.exec.deviceId": "0",
                                          "llm.listenIpInfo": f"{IP}:{port}"})
    run(decoder, "init_raw", "DECODER", 1, {"llm.SyncKvCacheWaitTime": "5000", "ge.exec.deviceId": "0"})
    assert run(decoder, "link_clusters", [(0, IP, port, IP, 0)], timeout=20000) == ("LLM_SUCCESS", ["LLM_SUCCESS"])
    tensors = {1: (LAYERS, [1, 16, 8, 32], 1), 2: (LAYERS, [1, 16, 8, 32], 1), 3: (1, [1, 16], -1),
               4: (1, [1, 16, 256], -1)}
    sent = {m: run(prompt, "v0_send", 0, m, n, shape, seq, m) for m, (n, shape, seq) in tensors.items()}
    for model_id, (n, shape, seq) in tensors.items():
        got = run(decoder, "v0_recv", 0, model_id, n, shape, seq)
        for a, b in zip(got, sent[model_id], strict=True):
            np.testing.assert_array_equal(a, b)
    assert run(decoder, "unlink_clusters", [(0, IP, port)]) == ("LLM_SUCCESS", ["LLM_SUCCESS"])
