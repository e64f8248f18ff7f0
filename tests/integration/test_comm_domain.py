"""Comm-domain links (CANN ``link``/``unlink``/``query_register_mem_status``) between two daemons."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from datadist.status import LLMStatusCode as S
from tests.harness import ACL_PLANE, WorkerError, free_port, over_planes

pytestmark = pytest.mark.integration

P, D = 10, 20


def rank_table(ports: dict[int, int]) -> str:
    """An HCCL v1.2 rank table as CANN's callers write it: ``server_id`` the host's address, ``device_ip`` the NPU's
    NIC address (which no daemon listens on); ``device_port`` is datadist's extension for several daemons on one
    host."""
    servers = [{"server_id": "127.0.0.1", "device": [
        {"device_id": str(rank), "device_ip": f"192.0.2.{rank + 1}", "device_port": str(port), "rank_id": str(rank)}]}
        for rank, port in ports.items()]
    return json.dumps({"version": "1.2", "server_count": str(len(servers)), "status": "completed",
                       "server_list": servers})


def wait_ok(worker, comm_id: int, timeout: float = 20.0) -> str:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    status = "PREPARING"
    while time.monotonic() < deadline:
        status = worker.call("comm_status", comm_id)
        if status != "PREPARING":
            return status
        time.sleep(0.1)
    return status


@over_planes("tcp", ACL_PLANE)   # acl-hccl: the comm domain's transfers as HCCL puts between NPU caches
def test_comm_domain_link_pull_push_unlink(daemon_factory, worker_factory) -> None:
    dp, dd = daemon_factory.many("p", "d")
    prompt, decoder = worker_factory(dp), worker_factory(dd)
    prompt.call("init", "PROMPT", P, extra={"llm.LocalCommRes": ""}, sync_kv_timeout=3000)
    decoder.call("init", "DECODER", D, extra={"llm.LocalCommRes": ""}, sync_kv_timeout=3000)
    prompt.call("register_blocks", "kv", 4, 16, (8, 16), model_id=0)
    decoder.call("register_blocks", "kv", 4, 16, (8, 16), model_id=0)
    prompt.call("fill", "kv", 2)
    table = rank_table({0: free_port(), 1: free_port()})
    name = "pd_comm_127.0.0.1_127.0.0.1"
    members = [(P, 0), (D, 1)]
    assert prompt.call("comm_link", name, members, table) == 1   # comm ids start at 1
    assert decoder.call("comm_link", name, members, table) == 1
    assert wait_ok(decoder, 1) == "OK" and wait_ok(prompt, 1) == "OK"
    # two-sided: the decoder pulls from the prompt, and the prompt pushes to the decoder
    decoder.call("pull_blocks", P, "kv", [1, 2, 3], [5, 6, 7])
    np.testing.assert_array_equal(decoder.call("rows", "kv", None, [5, 6, 7]),
                                  prompt.call("rows", "kv", None, [1, 2, 3]))
    prompt.call("push_blocks", D, "kv", [9], [0])
    np.testing.assert_array_equal(decoder.call("rows", "kv", None, [0]), prompt.call("rows", "kv", None, [9]))
    # registrations after link() cannot be made remotely accessible
    assert decoder.call("try_register_after_link") == "LLM_PARAM_INVALID"
    decoder.call("comm_unlink", 1)
    prompt.call("comm_unlink", 1)
    with pytest.raises(WorkerError) as info:
        decoder.call("pull_blocks", P, "kv", [1], [1])
    assert info.value.status_code == S.LLM_NOT_YET_LINK
    with pytest.raises(WorkerError):  # unknown comm id
        decoder.call("comm_status", 1)


def test_comm_domain_validation(daemon_factory, worker_factory) -> None:
    d = daemon_factory()
    w = worker_factory(d)
    w.call("init", "DECODER", D, extra={"llm.LocalCommRes": ""})
    table = rank_table({0: free_port(), 1: free_port()})
    for members, kind in (([(P, 1), (D, 0)], "LLMException"),        # ranks not ascending
                          ([(P, 0)], "LLMException"),                # fewer than 2 members
                          ([(P, 0), (30, 1)], "LLMException")):      # this engine is not a member
        with pytest.raises(WorkerError) as info:
            w.call("comm_link", "x", members, table)
        assert info.value.kind == kind
    with pytest.raises(WorkerError) as info:
        w.call("comm_link", "x", [(P, 0), (D, 1)], "{not json")
    assert info.value.kind == "LLMException"
    with pytest.raises(WorkerError) as info:
        w.call("comm_link", "", [(P, 0), (D, 1)], table)
    assert info.value.kind == "LLMException"
