from __future__ import annotations

import pytest

from datadist.status import LLMStatusCode as S
from datadistd.core.errors import DataDistError
from datadistd.core.options import parse_listen, parse_options
from datadistd.core.types import Placement, Role


def test_defaults() -> None:
    o = parse_options(Role.DECODER, 5, {})
    assert o.sync_kv_timeout_ms == 1000 and o.listen is None and o.pools == ()
    assert not o.cache_manager and not o.remote_cache_accessible


def test_local_comm_res_implies_cache_manager_and_remote_access() -> None:
    o = parse_options(Role.PROMPT, 1, {"llm.LocalCommRes": ""})
    assert o.cache_manager and o.remote_cache_accessible
    with pytest.raises(DataDistError) as info:
        parse_options(Role.PROMPT, 1, {"llm.LocalCommRes": "", "llm.EnableCacheManager": "0"})
    assert info.value.code == S.LLM_PARAM_INVALID


def test_pools_and_listen() -> None:
    o = parse_options(Role.PROMPT, 1, {"llm.MemPoolConfig": '{"memory_size": 1048576, "page_shift": 12}',
                                       "llm.HostMemPoolConfig": '{"memory_size": 4096}',
                                       "llm.listenIpInfo": "127.0.0.1:26000", "llm.SyncKvCacheWaitTime": "2500"})
    assert o.pool(Placement.DEVICE).page_shift == 12 and o.pool(Placement.HOST).memory_size == 4096
    assert o.listen == ("127.0.0.1", 26000) and o.sync_kv_timeout_ms == 2500


@pytest.mark.parametrize("key,value", [
    ("llm.MemPoolConfig", "{not json"),
    ("llm.MemPoolConfig", '{"memory_size": 0}'),
    ("llm.MemPoolConfig", '{"memory_size": 1024, "page_shift": 31}'),
    ("llm.listenIpInfo", "127.0.0.1"),
    ("llm.listenIpInfo", "host:80"),
    ("llm.listenIpInfo", "127.0.0.1:70000"),
    ("llm.SyncKvCacheWaitTime", "0"),
    ("llm.SyncKvCacheWaitTime", "soon"),
    ("ge.flowGraphMemMaxSize", "1,2"),
    ("ge.exec.deviceId", "npu0"),
    ("ge.exec.deviceId", "-1"),
    ("llm.RdmaTrafficClass", "high"),
    ("llm.RdmaServiceLevel", str(2**32)),
    ("llm.LinkRetryCount", "101"),
    ("llm.LocalCommRes", "{"),
    ("llm.LocalCommRes", '{"version": "2.0"}'),
    ("llm.LocalCommRes", '{"version": "1.0", "server_list": []}'),
    ("llm.LocalCommRes", '{"version": "1.0", "server_list": [{"device": [{"device_id": "0"}, {"device_id": "1"}]}]}'),
    ("llm.LocalCommRes", '{"version": "1.0", "server_list": [{"device": [{"device_id": 0}]}]}'),
    ("llm.LocalCommRes", '{"version": "1.0", "server_list": [{"device": [{"device_ip": "10.0.0.300"}]}]}'),
])
def test_bad_values_name_the_key(key: str, value: str) -> None:
    with pytest.raises(DataDistError) as info:
        parse_options(Role.PROMPT, 1, {key: value})
    assert info.value.code == S.LLM_PARAM_INVALID and key in info.value.message


def test_hccl_options_are_per_engine() -> None:
    """The CANN options HCCL's communicators take: unset stays ``None`` (the daemon's default applies)."""
    o = parse_options(Role.PROMPT, 1, {"ge.exec.deviceId": "3", "llm.RdmaTrafficClass": "132",
                                       "llm.RdmaServiceLevel": "4", "llm.LinkRetryCount": "7",
                                       "llm.LinkTotalTime": "30"})
    assert (o.npu, o.rdma_traffic_class, o.rdma_service_level, o.link_retry_count, o.link_total_time_s) == \
        (3, 132, 4, 7, 30)
    o = parse_options(Role.PROMPT, 1, {"ge.exec.deviceId": "5;6"})   # v1: several devices, the first is the engine's
    assert (o.npu, o.rdma_traffic_class, o.rdma_service_level, o.link_retry_count, o.comm_res) == \
        (5, None, None, None, None)
    assert parse_options(Role.PROMPT, 1, {}).npu is None


def test_local_comm_res_names_device_ip_and_server() -> None:
    table = ('{"version": "1.0", "status": "completed", "server_list": [{"server_id": "node-a", '
             '"device": [{"device_id": "4", "device_ip": "10.20.0.4"}]}]}')
    res = parse_options(Role.PROMPT, 1, {"llm.LocalCommRes": table}).comm_res
    assert res is not None and (res.device_id, res.device_ip, res.server_id) == (4, "10.20.0.4", "node-a")
    for auto in ("", '{"version": "1.3"}'):   # generated (CANN: auto / HixlCS): the daemon's settings apply
        assert parse_options(Role.PROMPT, 1, {"llm.LocalCommRes": auto}).comm_res is None


def test_parse_listen_ipv6() -> None:
    assert parse_listen("[::1]:9000") == ("::1", 9000)
