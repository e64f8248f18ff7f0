"""One daemon per node serves every NPU of the node: each engine's DEVICE pools, registered NPU memory and hccl
communicators are on its own device (``ge.exec.deviceId``), and its CANN link options (``llm.RdmaTrafficClass``,
``llm.RdmaServiceLevel``, ``llm.LocalCommRes``) shape its own communicators. On the SIMULATED Ascend runtime
(``tests/sim``), which refuses memory of one device used from another (copies, IPC, HCCL binds) and publishes
each communicator's device and config where these tests read them."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from datadist.status import LLMStatusCode as S
from tests.harness import ACL_PLANE, WorkerError, free_port, over_planes

pytestmark = over_planes(ACL_PLANE)

BLOCKS = 16
NOT_SET = 0xFFFFFFFF          # HCCL_COMM_TRAFFIC_CLASS_CONFIG_NOT_SET: HCCL's default
#: tests/sim/hccl.c pub_head: pid, prepared, count, traffic class, service level, device
HEAD = struct.Struct("=iiIIIi")


def _comms(sim_dir: str, pid: int) -> list[dict[str, int]]:
    """What the simulated HCCL published of the communicators of process ``pid``."""
    out = []
    for path in sorted(Path(sim_dir).glob("comm-*-r*")):
        if path.name.endswith(".tmp"):
            continue
        owner, prepared, _, tc, sl, device = HEAD.unpack_from(path.read_bytes())
        if owner == pid:
            out.append({"device": device, "tc": tc, "sl": sl, "prepared": prepared})
    return out


def _device_init(role: str, cluster: int, device: int, listen: str | None = None, **options: str) -> dict:
    return {"role": role, "cluster_id": cluster, "listen": listen, "mem_pool": 4 << 20,
            "remote_cache_accessible": True, "extra": {"ge.exec.deviceId": str(device), **options}}


def test_engines_on_several_npus_of_one_daemon(daemon_factory, worker_factory) -> None:
    """Two prompt engines of one node on NPUs 1 and 3, a decoder on NPU 2 of the other node: each engine's caches
    and communicators are on its own NPU, byte-exact both ways; the per-engine CANN options reach HCCL."""
    dp, dd = daemon_factory.many("p", "d")
    ports = free_port(), free_port()
    prompts = [worker_factory(dp), worker_factory(dp)]
    decoder = worker_factory(dd)
    prompts[0].call("init", **_device_init("PROMPT", 1, 1, f"127.0.0.1:{ports[0]}",
                                           **{"llm.RdmaTrafficClass": "132", "llm.RdmaServiceLevel": "4"}))
    prompts[1].call("init", **_device_init("PROMPT", 3, 3, f"127.0.0.1:{ports[1]}"))
    decoder.call("init", **_device_init("DECODER", 2, 2))
    for w in (*prompts, decoder):
        w.call("register_blocks", "kv", 2, BLOCKS, (4, 64), dtype="uint8", model_id=0)   # the worker's NPU memory
        w.call("allocate", "pool", 1, (BLOCKS, 256), dtype="uint8", blocks=True, model_id=1)   # the daemon's pool
    prompts[0].call("fill", "kv", 11)
    prompts[1].call("fill", "kv", 13)
    decoder.call("fill", "pool", 17)
    for cluster, port in zip((1, 3), ports, strict=True):
        assert decoder.call("link", cluster, "127.0.0.1", port) == (0, [0])

    decoder.call("pull_blocks", 1, "kv", [0, 5], [0, 1])
    decoder.call("pull_blocks", 3, "kv", [7], [2])
    got = decoder.call("rows", "kv")
    np.testing.assert_array_equal(got[:, [0, 1]], prompts[0].call("rows", "kv")[:, [0, 5]])
    np.testing.assert_array_equal(got[:, 2], prompts[1].call("rows", "kv")[:, 7])
    # push from the decoder's pool (NPU 2) into the prompts' pools (NPUs 1 and 3), by the link the decoder made
    decoder.call("push_blocks", 1, "pool", [3], [4], model_id=1)
    decoder.call("push_blocks", 3, "pool", [8], [9], model_id=1)
    mine = decoder.call("rows", "pool")
    np.testing.assert_array_equal(prompts[0].call("rows", "pool")[:, 4], mine[:, 3])
    np.testing.assert_array_equal(prompts[1].call("rows", "pool")[:, 9], mine[:, 8])

    sim = dp.env.get("ASCEND_SIM_DIR")
    if sim is None:   # make test-ascend: real HCCL publishes nothing to read
        return
    on_p = sorted((c["device"], c["tc"], c["sl"]) for c in _comms(sim, dp.pid))
    assert on_p == [(1, 132, 4), (3, NOT_SET, NOT_SET)]
    assert sorted(c["device"] for c in _comms(sim, dd.pid)) == [2, 2]


def _register_foreign_npu_memory(state: dict, device: int) -> int:
    """The worker hands its engine NPU memory of ``device`` through the raw RPCs, naming that device itself (what a
    client that does not choose the engine's device would do): the status the daemon answers."""
    import llm_datadist as ld
    from datadist.v1 import datadist_pb2
    from llm_datadist._cache_ops import desc_pb, device_memory
    from tests.worker_ops import NpuTensor

    dd = state["dd"]
    client = dd._check_init()
    tensor = NpuTensor.allocate((4, 64), np.uint8, device)
    desc = ld.CacheDesc(1, [4, 64], ld.DataType.DT_UINT8, ld.Placement.DEVICE)
    try:
        mem = device_memory(client, tensor.addr, tensor.nbytes, "register_cache", device)
        client.call("RegisterCache", datadist_pb2.RegisterCacheRequest(
            engine_id=dd._engine_id, desc=desc_pb(desc), tensors=[mem]), "register_cache")
    except ld.LLMException as exc:
        return int(exc.status_code)
    return 0


def _register_other_npu_tensor(state: dict, device: int) -> int:
    """``register_cache`` of a tensor on NPU ``device`` through the public API: the status it raised."""
    import llm_datadist as ld
    from tests.worker_ops import NpuTensor

    tensor = NpuTensor.allocate((4, 64), np.uint8, device)
    desc = ld.CacheDesc(1, [4, 64], ld.DataType.DT_UINT8, ld.Placement.DEVICE)
    try:
        state["dd"].cache_manager.register_cache(desc, [tensor.addr])
    except ld.LLMException as exc:
        return int(exc.status_code)
    return 0


def test_npu_memory_of_another_device_is_refused(daemon_factory, worker_factory) -> None:
    """A worker cannot give its engine another NPU's memory: the client exports on the engine's device (where the
    runtime does not know another device's memory), and the daemon refuses memory handed over on another device
    even when the worker names that device itself. Devices the host does not have are refused at init."""
    d = daemon_factory("d")
    w = worker_factory(d)
    w.call("init", **_device_init("DECODER", 2, 1))
    assert w.call("run", __name__, "_register_other_npu_tensor", 0) == S.LLM_PARAM_INVALID
    assert w.call("run", __name__, "_register_foreign_npu_memory", 0) == S.LLM_PARAM_INVALID
    assert w.call("run", __name__, "_register_foreign_npu_memory", 1) == 0      # its own device: taken
    assert w.call("run", __name__, "_register_other_npu_tensor", 1) == 0
    bad = worker_factory(d)
    with pytest.raises(WorkerError) as info:
        bad.call("init", **_device_init("DECODER", 3, 99))
    assert info.value.status_code == S.LLM_PARAM_INVALID and "99" in str(info.value)


def _physical_id(state: dict, device: int) -> int:
    from datadist_ascend.acl import acl
    return acl().physical_id(device)


def test_local_comm_res_names_the_engines_device(daemon_factory, worker_factory) -> None:
    """``llm.LocalCommRes`` (a rank table of the engine's one device) gives the address HCCL uses; a table naming
    another device than the engine's, or malformed, fails init with LLM_PARAM_INVALID."""
    d = daemon_factory("d")

    def table(device_id: str, ip: str = "10.9.0.2") -> str:
        return json.dumps({"server_list": [{"device": [{"device_id": device_id, "device_ip": ip}],
                                            "server_id": "node-a"}], "status": "completed", "version": "1.0"})

    ok = worker_factory(d)
    physical = ok.call("run", __name__, "_physical_id", 2)
    ok.call("init", **_device_init("PROMPT", 1, 2, **{"llm.LocalCommRes": table(str(physical))}))
    for bad_res in (table(str(physical + 1)), table(str(physical), ip="not-an-ip"), "{",
                    json.dumps({"version": "2.0"})):
        w = worker_factory(d)
        with pytest.raises(WorkerError) as info:
            w.call("init", **_device_init("PROMPT", 2, 2, **{"llm.LocalCommRes": bad_res}))
        assert info.value.status_code == S.LLM_PARAM_INVALID, bad_res


def _ledger(sim_dir: str, pid: int, call: str) -> list[int]:
    """The physical NPUs on which process ``pid`` made ``call`` (the simulated runtime's ledger)."""
    out = []
    for line in Path(sim_dir, "ledger").read_text().splitlines():
        owner, what, npu = line.split()[:3]
        if int(owner) == pid and what == call:
            out.append(int(npu[len("npu"):]))
    return out


def _pid(state: dict) -> int:
    import os
    return os.getpid()


def test_visible_devices_pair_linked_inside_one_daemon(daemon_factory, worker_factory) -> None:
    """vllm-ascend's P/D example on one node: the prefill worker with ASCEND_RT_VISIBLE_DEVICES=0,1,2,3 and the
    decode worker with 4,5,6,7, each on its logical NPU 0, one node daemon that sees all eight -- and its two engines
    linked to each other (one process: the daemon copies between its two NPUs, no communicator). Each worker names
    its NPU by physical id: the decoder's pool and the daemon's import of its cache are on physical NPU 4, the
    prompt's on 0; byte-exact both ways. A worker whose NPU the daemon does not see is refused, naming it."""
    d = daemon_factory("d")
    port = free_port()
    prompt = worker_factory(d, ASCEND_RT_VISIBLE_DEVICES="0,1,2,3")
    decoder = worker_factory(d, ASCEND_RT_VISIBLE_DEVICES="4,5,6,7")
    prompt.call("init", **_device_init("PROMPT", 1, 0, f"127.0.0.1:{port}"))
    decoder.call("init", **_device_init("DECODER", 2, 0))
    for w in (prompt, decoder):
        w.call("register_blocks", "kv", 2, BLOCKS, (4, 64), dtype="uint8", model_id=0)   # the worker's NPU memory
        w.call("allocate", "pool", 1, (BLOCKS, 256), dtype="uint8", blocks=True, model_id=1)   # the daemon's pool
    prompt.call("fill", "kv", 11)
    decoder.call("fill", "pool", 17)
    assert decoder.call("link", 1, "127.0.0.1", port) == (0, [0])
    decoder.call("pull_blocks", 1, "kv", [0, 5], [0, 1])
    np.testing.assert_array_equal(decoder.call("rows", "kv")[:, [0, 1]], prompt.call("rows", "kv")[:, [0, 5]])
    decoder.call("push_blocks", 1, "pool", [3], [4], model_id=1)
    np.testing.assert_array_equal(prompt.call("rows", "pool")[:, 4], decoder.call("rows", "pool")[:, 3])

    sim = d.env.get("ASCEND_SIM_DIR")
    if sim is not None:   # make test-ascend: the real runtime keeps no ledger
        assert sorted(set(_ledger(sim, d.pid, "aclrtMalloc"))) == [0, 4]               # the two engines' pools
        assert sorted(set(_ledger(sim, d.pid, "aclrtIpcMemImportByKey"))) == [0, 4]   # the workers' caches
        assert _comms(sim, d.pid) == []   # a link inside one daemon is its own copy (memory/copy.py), no HCCL
        assert set(_ledger(sim, decoder.call("run", __name__, "_pid"), "aclrtMalloc")) == {4}
        assert set(_ledger(sim, prompt.call("run", __name__, "_pid"), "aclrtMalloc")) == {0}

    narrow = daemon_factory("narrow", env={"ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3"})
    w = worker_factory(narrow, ASCEND_RT_VISIBLE_DEVICES="4,5,6,7")
    with pytest.raises(WorkerError) as info:
        w.call("init", **_device_init("DECODER", 3, 0))
    assert info.value.status_code == S.LLM_PARAM_INVALID and "NPU 4 (physical id) is not visible" in str(info.value)


def test_an_a3_pair_links_with_a_1_2_rank_table(daemon_factory, worker_factory) -> None:
    """Two Atlas A3 nodes of one super pod: the rank table is version 1.2 with each NPU's super device id (the
    simulated A3 fails Prepare on a 1.0 table, R21); byte-exact both ways."""
    a3 = {"ASCEND_SIM_SOC_VERSION": "Ascend910_9391", "ASCEND_SIM_SUPER_POD_ID": "7"}
    dp = daemon_factory("p", env={**a3, "ASCEND_SIM_SUPER_DEVICE_BASE": "0"})
    dd = daemon_factory("d", env={**a3, "ASCEND_SIM_SUPER_DEVICE_BASE": "16"})
    port = free_port()
    prompt, decoder = worker_factory(dp, **a3), worker_factory(dd, **a3)
    prompt.call("init", **_device_init("PROMPT", 1, 0, f"127.0.0.1:{port}"))
    decoder.call("init", **_device_init("DECODER", 2, 1))
    for w in (prompt, decoder):
        w.call("register_blocks", "kv", 2, BLOCKS, (4, 64), dtype="uint8", model_id=0)
    prompt.call("fill", "kv", 5)
    decoder.call("fill", "kv", 9)
    assert decoder.call("link", 1, "127.0.0.1", port) == (0, [0])
    decoder.call("pull_blocks", 1, "kv", [2, 3], [0, 1])
    np.testing.assert_array_equal(decoder.call("rows", "kv")[:, [0, 1]], prompt.call("rows", "kv")[:, [2, 3]])
    decoder.call("push_blocks", 1, "kv", [7], [8])
    np.testing.assert_array_equal(prompt.call("rows", "kv")[:, 8], decoder.call("rows", "kv")[:, 7])


def test_a_device_ip_claimed_twice_is_refused_naming_it(daemon_factory, worker_factory, tmp_path) -> None:
    """Two daemons that read one hccn.conf (one node's NIC addresses) with an engine each on NPU 0: both would put
    192.168.150.101 in the rank table, which HCCL refuses at init. The link is refused before HCCL, and the linking
    worker hears why (LLM_LINK_FAILED, not a timeout): the refusing side says so on the channel."""
    from tests.sim import write_hccn_conf

    sim = daemon_factory.data_plane.get("ASCEND_SIM_DIR")
    if sim is None:
        pytest.skip("needs the simulated runtime (one hccn.conf for two daemons)")
    conf = write_hccn_conf(Path(sim) / "hccn-150.conf", 150)
    node = {"ASCEND_SIM_HCCN_CONF": conf, "DATADISTD_TRANSPORT_HCCL_HCCN_CONF": conf}
    dp, dd = daemon_factory.many("p", "d", env=node)
    port = free_port()
    prompt, decoder = worker_factory(dp), worker_factory(dd)
    prompt.call("init", **_device_init("PROMPT", 1, 0, f"127.0.0.1:{port}"))
    decoder.call("init", **_device_init("DECODER", 2, 0))
    assert decoder.call("link", 1, "127.0.0.1", port) == (S.LLM_LINK_FAILED, [S.LLM_LINK_FAILED])
    assert "192.168.150.101" in Path(dp.log_path).read_text() + Path(dd.log_path).read_text()
