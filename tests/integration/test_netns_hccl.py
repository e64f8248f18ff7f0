"""Two simulated Atlas A2 servers in two network namespaces: a daemon in each (memory backend ``acl``, transport
``hccl``), each namespace a server of eight NPUs with its own hccn.conf of real-looking NIC addresses (never
127.0.0.1), a prefill engine in one and a decode engine in the other. They link, pull and push byte-exact, and the
simulated HCCL records that each end's Prepare chose RoCE -- two server ids on an A2, as hcomm's ``IsUsedRdma``
chooses (tests/sim/hccl.c R27) -- so each end opened its NPU's NIC by the device ip its daemon derived from its own
hccn.conf (R20). The namespaces, the veth pair and its addresses are the test's own (``Hosts``). Needs root."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from tests.conftest import ascend_runtime
from tests.harness import ACL_PLANE, DATA_PLANES

pytestmark = [pytest.mark.integration, pytest.mark.netns]

if os.geteuid() != 0 or shutil.which("ip") is None:
    pytest.skip("network-namespace tests need root and iproute2 (ip netns)", allow_module_level=True)

from .test_netns import Hosts  # noqa: E402  (after the skip: it needs root too)

P, D = 1, 2
PORT = 26000


@pytest.fixture
def hosts():
    h = Hosts()
    yield h
    h.remove()


def test_two_a2_servers_in_namespaces_link_over_roce(hosts, daemon_factory, worker_factory, request) -> None:
    from tests.sim import transports, write_hccn_conf

    runtime = ascend_runtime(request)
    sim = runtime["ASCEND_SIM_DIR"]
    nodes = {}
    for ns, subnet in ((hosts.a, 120), (hosts.b, 121)):   # the servers' NPU NICs: 192.168.12x.101-108
        conf = write_hccn_conf(os.path.join(sim, f"hccn-{subnet}.conf"), subnet, devices=8)
        env = {**DATA_PLANES[ACL_PLANE], **runtime, "ASCEND_SIM_DEVICES": "8", "ASCEND_SIM_SOC_VERSION": "Ascend910B1",
               "ASCEND_SIM_HCCN_CONF": conf, "DATADISTD_TRANSPORT_HCCL_HCCN_CONF": conf}
        env.pop("HCCL_INTRA_ROCE_ENABLE", None)
        nodes[ns] = daemon_factory(ns, netns=ns, env=env)
    prompt, decoder = worker_factory(nodes[hosts.a]), worker_factory(nodes[hosts.b])
    for worker, name, cluster, listen, seed in ((prompt, "PROMPT", P, f"{hosts.ip_a}:{PORT}", 5),
                                                (decoder, "DECODER", D, None, 9)):
        worker.call("init", name, cluster, listen=listen, remote_cache_accessible=True, sync_kv_timeout=5000)
        worker.call("register_blocks", "kv", 4, 32, (16, 8, 64), model_id=0)
        worker.call("fill", "kv", seed)
    assert decoder.call("link", P, hosts.ip_a, PORT, local_ip=hosts.ip_b) == (0, [0])

    src = prompt.call("rows", "kv", None, [3, 9, 31])
    decoder.call("pull_blocks", P, "kv", [3, 9, 31], [0, 1, 2])
    np.testing.assert_array_equal(decoder.call("rows", "kv", None, [0, 1, 2]), src)
    mine = decoder.call("rows", "kv", None, [10, 11])
    decoder.call("push_blocks", P, "kv", [10, 11], [20, 21])
    np.testing.assert_array_equal(prompt.call("rows", "kv", None, [20, 21]), mine)

    chosen = transports(sim)   # both ends of the link's communicator, each in its own namespace's daemon
    assert sorted(chosen.values()) == ["roce", "roce"], chosen
    # RoCE opened each end's NPU NIC by the address its daemon read from its own namespace's hccn.conf (NPU 0 of
    # each server) and listened there, at the daemon's device port
    listeners = sorted(n for n in os.listdir(sim) if n.startswith("listen-"))
    assert listeners == ["listen-192.168.120.101-16667", "listen-192.168.121.101-16667"], listeners
