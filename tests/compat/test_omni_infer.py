"""omni-infer's two LLM-DataDist callers, their call sequences replayed.

* The older ``LLMDataDistManager`` (comm-domain ``link``): every prefill TP rank uses the *same*
  cluster id (and every decode rank another), one node daemon serves all ranks of a node; KV tensors
  are grouped by shape, one blocks cache per group (``model_id`` = group index, the prefill binds
  ``BlocksCacheKey(cluster_id, model_id=i)``, the decode registers without a key); each rank pair
  links with its own comm name and rank table, polls ``query_register_mem_status``, and the decode
  pulls every group with omni-infer's retry-on-code logic.
* The ``omni_npu`` engine's reconnect path: ``unlink_clusters(force=True)`` then ``link_clusters``,
  raising on anything but success, also after the prefill went away and came back.

Separate processes, embedded and through daemons; bytes checked.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from datadist.status import LLMStatusCode as S
from tests.harness import WorkerError, free_port

pytestmark = pytest.mark.integration

IP = "127.0.0.1"
OPS = "tests.compat.ops"
PREFILL, DECODE = 1000, 2000
TP = 2
LAYERS = 3
GROUPS = [[32, 8, 1, 64], [32, 8, 1, 16]]   # MLA-like: k_normed and k_pe blocks of different shapes


def run(worker, op: str, *args, **kw):  # noqa: ANN001, ANN002, ANN003, ANN201
    return worker.call("run", OPS, op, *args, **kw)


def rank_table(prefill_port: int, decode_port: int) -> str:
    """HCCL v1.2 rank table of one prefill rank (rank 0) and one decode rank (rank 1); ``device_port`` is
    datadist's extension for several engines on one host."""
    servers = [{"server_id": IP, "device": [{"device_id": str(r), "device_ip": IP, "device_port": str(port),
                                             "rank_id": str(r)}]}
               for r, port in ((0, prefill_port), (1, decode_port))]
    return json.dumps({"version": "1.2", "server_count": "2", "status": "completed", "server_list": servers})


def test_llmdatadist_manager_tp_ranks_share_a_cluster_id(spawn) -> None:
    p_node, d_node = spawn.node(), spawn.node()     # one node daemon per side, shared by its TP ranks
    prefill = [spawn(p_node) for _ in range(TP)]
    decode = [spawn(d_node) for _ in range(TP)]
    config = {"enable_switch_role": True, "enable_cache_manager": True, "sync_kv_timeout": 20000,
              "enable_remote_cache_accessible": True}
    for rank in range(TP):
        run(prefill[rank], "init", "PROMPT", PREFILL, {**config, "device_id": rank})
        run(decode[rank], "init", "DECODER", DECODE, {**config, "device_id": rank})
        for g, shape in enumerate(GROUPS):
            run(prefill[rank], "register_blocks", f"g{g}", [(shape, 0.0)] * LAYERS, dtype="DT_FLOAT16",
                key=(PREFILL, g))
            run(decode[rank], "register_blocks", f"g{g}", [(shape, 0.0)] * LAYERS, dtype="DT_FLOAT16")
            prefill[rank].call("fill", f"g{g}", 10 * rank + g)
    comm = {}
    for rank in range(TP):
        table = rank_table(free_port(), free_port())
        name = f"{IP}-{PREFILL}-{IP}-{DECODE}-p{rank}-d{rank}"
        members = [(PREFILL, 0), (DECODE, 1)]
        comm[rank] = (prefill[rank].call("comm_link", name, members, table),
                      decode[rank].call("comm_link", name, members, table))
    for rank in range(TP):
        assert run(prefill[rank], "wait_registered", comm[rank][0]) == "OK"
        assert run(decode[rank], "wait_registered", comm[rank][1]) == "OK"
    src, dst = [3, 4, 5, 17], [0, 9, 10, 31]
    for rank in range(TP):
        for g in range(len(GROUPS)):
            assert run(decode[rank], "pull_blocks_with_retry", PREFILL, g, f"g{g}", src, dst) == 1
            np.testing.assert_array_equal(decode[rank].call("rows", f"g{g}", None, dst),
                                          prefill[rank].call("rows", f"g{g}", None, src),
                                          err_msg=f"rank {rank} group {g}")
    assert not np.array_equal(prefill[0].call("rows", "g0"), prefill[1].call("rows", "g0"))
    for rank in range(TP):
        decode[rank].call("comm_unlink", comm[rank][1])
        prefill[rank].call("comm_unlink", comm[rank][0])
        decode[rank].call("finalize")
        prefill[rank].call("finalize")


def test_omni_npu_reconnect_path(spawn) -> None:
    port = free_port()
    config = {"device_id": 0, "enable_cache_manager": True, "enable_remote_cache_accessible": True,
              "sync_kv_timeout": 5000}
    kv = [([16, 8, 2, 16], 0.0)] * (2 * LAYERS)
    decode = spawn()
    run(decode, "init", "DECODER", DECODE, config)
    run(decode, "register_blocks", "kv", kv, dtype="DT_FLOAT16")
    for life in range(2):  # the prefill goes away and comes back on the same address and cluster id
        prefill = spawn()
        run(prefill, "init", "PROMPT", PREFILL, {**config, "listen_ip_info": f"{IP}:{port}"})
        run(prefill, "register_blocks", "kv", kv, dtype="DT_FLOAT16", key=(PREFILL, 0))
        prefill.call("fill", "kv", life)
        run(decode, "reconnect", PREFILL, IP, port)   # force unlink (linked or not), then link
        run(decode, "pull_blocks", PREFILL, 0, "kv", src_blocks=[1, 2], dst_blocks=[5, 6])
        np.testing.assert_array_equal(decode.call("rows", "kv", None, [5, 6]),
                                      prefill.call("rows", "kv", None, [1, 2]))
        run(decode, "reconnect", PREFILL, IP, port)   # reconnecting a live link works too
        prefill.call("finalize")
        with pytest.raises(WorkerError) as info:      # the prefill's finalize unlinked both ends
            run(decode, "pull_blocks", PREFILL, 0, "kv", src_blocks=[1], dst_blocks=[5])
        assert info.value.status_code == S.LLM_NOT_YET_LINK
        prefill.close()
    decode.call("finalize")
