"""``switch_role`` in both modes (spec §4, §10.3): the listener starts, moves and stops; LLM_EXIST_LINK while
links exist; v1 needs ``enable_switch_role`` and a different role, and PROMPT needs ``llm.listenIpInfo``."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from datadist.v1 import datadist_pb2
from llm_datadist import LLMException, LLMRole
from llm_datadist import LLMStatusCode as S
from tests.harness import ACL_PLANE, free_port, over_planes

OPS = "tests.api._ops"


def run(worker, op: str, *args, **kw):  # noqa: ANN001, ANN002, ANN003, ANN201
    return worker.call("run", OPS, op, *args, **kw)


def listen_address(dd) -> str:  # noqa: ANN001
    status = dd._call("GetStatus", datadist_pb2.StatusRequest(engine_id=dd._engine_id), "test")
    return status.engines[0].listen_address


def test_v2_listener_starts_moves_and_stops(local_dd) -> None:
    dd = local_dd("DECODER")
    assert listen_address(dd) == ""
    port1, port2 = free_port(), free_port()
    dd.switch_role(LLMRole.PROMPT, {"llm.listenIpInfo": f"127.0.0.1:{port1}"})
    assert listen_address(dd) == f"127.0.0.1:{port1}"
    dd.switch_role(LLMRole.PROMPT, {"llm.listenIpInfo": f"127.0.0.1:{port2}"})  # same role is allowed in v2
    assert listen_address(dd) == f"127.0.0.1:{port2}"
    dd.switch_role(LLMRole.DECODER)  # no listen option: the server becomes a client
    assert listen_address(dd) == ""
    with pytest.raises(LLMException) as info:
        dd.switch_role(LLMRole.PROMPT, {"llm.listenIpInfo": "127.0.0.1"})
    assert info.value.status_code is S.LLM_PARAM_INVALID
    with pytest.raises(TypeError):
        dd.switch_role("PROMPT")
    with pytest.raises(TypeError):
        dd.switch_role(LLMRole.PROMPT, {"llm.listenIpInfo": 1})


def test_a_listen_address_that_cannot_be_served_is_refused_alike(local_dd) -> None:
    """Issue 44, trip 10: a port in use was LLM_PARAM_INVALID, an address not on this host LLM_LINK_FAILED naming
    port :0 (the data plane's); both are LLM_PARAM_INVALID naming the address:port asked for, and the cause."""
    dd = local_dd("DECODER")
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        for address, cause in ((f"127.0.0.1:{taken.getsockname()[1]}", "in use"),
                               (f"192.0.2.1:{free_port()}", "is 192.0.2.1 an address of this host?")):   # TEST-NET-1
            with pytest.raises(LLMException) as info:
                dd.switch_role(LLMRole.PROMPT, {"llm.listenIpInfo": address})
            assert info.value.status_code is S.LLM_PARAM_INVALID, info.value
            assert f"cannot listen on {address} (llm.listenIpInfo): " in str(info.value), info.value
            assert cause in str(info.value) and ":0" not in str(info.value), info.value
            assert listen_address(dd) == ""
    finally:
        taken.close()


def test_v1_rules(local_dd) -> None:
    dd = local_dd("DECODER", v1=True)
    with pytest.raises(LLMException) as info:  # enable_switch_role was not set at init
        dd.switch_role(LLMRole.PROMPT, {"llm.listenIpInfo": f"127.0.0.1:{free_port()}"})
    assert info.value.status_code is S.LLM_FEATURE_NOT_ENABLED
    dd.finalize()
    dd = local_dd("DECODER", cluster_id=8, v1=True, switch=True)
    with pytest.raises(LLMException) as info:
        dd.switch_role(LLMRole.DECODER)  # v1: the role must change
    assert info.value.status_code is S.LLM_PARAM_INVALID
    with pytest.raises(LLMException) as info:
        dd.switch_role(LLMRole.PROMPT)  # v1: PROMPT needs llm.listenIpInfo
    assert info.value.status_code is S.LLM_PARAM_INVALID
    port = free_port()
    dd.switch_role(LLMRole.PROMPT, {"llm.listenIpInfo": f"127.0.0.1:{port}"})
    assert listen_address(dd) == f"127.0.0.1:{port}"
    import llm_datadist as ld

    kv = dd.kv_cache_manager  # the role rules follow the new role: keys are allowed now, pulls are not
    cache = kv.allocate_cache(ld.CacheDesc(2, [2, 8], ld.DataType.DT_UINT8), [ld.CacheKey(8, 1)])
    with pytest.raises(LLMException) as info:
        kv.pull_cache(ld.CacheKey(9, 1), cache)
    assert info.value.status_code is S.LLM_PARAM_INVALID
    kv.deallocate_cache(cache)
    dd.switch_role(LLMRole.DECODER)
    assert listen_address(dd) == ""


@pytest.mark.integration
def test_exist_link_both_modes_and_the_new_listener_serves(daemon_factory, worker_factory) -> None:
    d = daemon_factory()
    a, b = worker_factory(d), worker_factory(d)
    a.call("init", "DECODER", 1)
    b.call("init", "DECODER", 2)
    port = free_port()
    assert run(a, "switch_role", "PROMPT", f"127.0.0.1:{port}") == "ok"
    assert b.call("link", 1, "127.0.0.1", port) == (0, [0])  # the new listener serves links
    assert run(a, "switch_role", "DECODER") == "LLM_EXIST_LINK"  # the serving side has a link
    assert run(b, "switch_role", "PROMPT", f"127.0.0.1:{free_port()}") == "LLM_EXIST_LINK"  # and the linking side
    assert b.call("unlink", 1, "127.0.0.1", port) == (0, [0])
    assert run(a, "switch_role", "DECODER") == "ok"
    code, _ = b.call("link", 1, "127.0.0.1", port, timeout=500)  # nobody listens there any more
    assert code in (S.LLM_LINK_FAILED, S.LLM_TIMEOUT)
    a.call("finalize")
    b.call("finalize")
    # v1: LLM_EXIST_LINK as well (after the enable_switch_role check)
    port = free_port()
    run(a, "init_v1", "PROMPT", 3, listen=f"127.0.0.1:{port}", switch=True)
    run(b, "init_v1", "DECODER", 4, switch=True)
    assert b.call("link", 3, "127.0.0.1", port) == (0, [0])
    assert run(a, "switch_role", "DECODER") == "LLM_EXIST_LINK"
    assert run(b, "switch_role", "PROMPT", f"127.0.0.1:{free_port()}") == "LLM_EXIST_LINK"


@pytest.mark.integration
@over_planes("tcp", ACL_PLANE)
def test_switched_roles_transfer_over_the_data_plane_both_ways(daemon_factory, worker_factory) -> None:
    """Two daemons: a decoder that became PROMPT serves a link whose pulls and pushes move bytes over the data
    plane (acl-hccl: NPU caches, a communicator between the two devices); after unlink both switch back the other
    way and the link in the opposite direction moves bytes too (hccl: a new communicator between the same two
    agents, the old one destroyed)."""
    da, db = daemon_factory.many("a", "b")
    a, b = worker_factory(da), worker_factory(db)
    for worker, cluster, seed in ((a, 1, 1), (b, 2, 2)):
        worker.call("init", "DECODER", cluster, remote_cache_accessible=True, sync_kv_timeout=3000)
        worker.call("register_blocks", "kv", 4, 16, (8, 16), dtype="uint8", model_id=0)
        worker.call("fill", "kv", seed)
    for server, client, server_cluster in ((a, b, 1), (b, a, 2)):
        port = free_port()
        assert run(server, "switch_role", "PROMPT", f"127.0.0.1:{port}") == "ok"
        assert client.call("link", server_cluster, "127.0.0.1", port) == (0, [0])
        client.call("pull_blocks", server_cluster, "kv", [3, 5, 15], [0, 1, 2])
        np.testing.assert_array_equal(client.call("rows", "kv", None, [0, 1, 2]),
                                      server.call("rows", "kv", None, [3, 5, 15]))
        client.call("push_blocks", server_cluster, "kv", [7], [9])
        np.testing.assert_array_equal(server.call("rows", "kv", None, [9]), client.call("rows", "kv", None, [7]))
        assert client.call("unlink", server_cluster, "127.0.0.1", port) == (0, [0])
        assert run(server, "switch_role", "DECODER") == "ok"
