"""LLMRole, LLMConfig and LLMClusterInfo: CANN's option keys, value formats and validation tiers."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llm_datadist import LLMClusterInfo, LLMConfig, LlmConfig, LLMException, LLMRole, LLMStatusCode
from llm_datadist.configs import _ip_int_to_str

PARAM_INVALID = LLMStatusCode.LLM_PARAM_INVALID


def _param_invalid(excinfo: pytest.ExceptionInfo) -> None:
    assert excinfo.value.status_code == PARAM_INVALID


# ---- LLMRole -------------------------------------------------------------------------------------


def test_role_values_and_str() -> None:
    assert [int(r) for r in LLMRole] == [1, 2, 3]
    assert (LLMRole.PROMPT, LLMRole.DECODER, LLMRole.MIX) == (1, 2, 3)
    assert str(LLMRole.PROMPT) == "LLMRole.PROMPT"
    assert str(LLMRole.DECODER) == "LLMRole.DECODER"
    assert str(LLMRole.MIX) == "LLMRole.MIX"


# ---- generate_options ----------------------------------------------------------------------------


def test_alias_and_defaults() -> None:
    assert LlmConfig is LLMConfig
    cfg = LLMConfig()
    assert cfg.generate_options() == {"llm.MemoryUtilization": "0.95"}
    assert cfg.device_id is None and cfg.sync_kv_timeout is None
    assert cfg.listen_ip_info == "" and cfg.deploy_res_path == "" and cfg.ge_options == {}
    assert cfg.enable_switch_role is False and cfg.mem_utilization == 0.95
    assert cfg.buf_pool_cfg == "" and cfg.mem_pool_cfg == "" and cfg.host_mem_pool_cfg == ""
    assert cfg.enable_cache_manager is False and cfg.enable_remote_cache_accessible is False
    assert cfg.rdma_traffic_class is None and cfg.rdma_service_level is None
    assert cfg.local_comm_res == "" and cfg.transfer_backend == "" and cfg.global_resource_config == ""
    assert cfg.link_total_time == 0 and cfg.link_retry_count == 1
    assert cfg.cluster_info == "" and cfg.output_max_size is None


def test_every_option_key_and_format() -> None:
    cfg = LLMConfig()
    cfg.device_id = 3
    cfg.sync_kv_timeout = 2500
    cfg.listen_ip_info = "10.0.0.1:26000"
    cfg.deploy_res_path = "/tmp/res"
    cfg.enable_switch_role = True
    cfg.mem_utilization = 0.5
    cfg.buf_pool_cfg = '{"buf_pool_size": 1}'
    cfg.mem_pool_cfg = '{"memory_size": 67108864}'
    cfg.host_mem_pool_cfg = '{"memory_size": 4096, "page_shift": 12}'
    cfg.enable_cache_manager = True
    cfg.enable_remote_cache_accessible = False
    cfg.rdma_traffic_class = 132
    cfg.rdma_service_level = 4
    cfg.local_comm_res = '{"version": "1.3"}'
    cfg.link_total_time = 1080
    cfg.link_retry_count = 80
    cfg.transfer_backend = "hixl"
    cfg.global_resource_config = '{"comm_resource_config.listen_port": 26666}'
    cfg.output_max_size = 64
    assert cfg.generate_options() == {
        "ge.exec.deviceId": "3",
        "ge.session_device_id": "3",
        "llm.SyncKvCacheWaitTime": "2500",
        "llm.deployResPath": "/tmp/res",
        "llm.BufPoolCfg": '{"buf_pool_size": 1}',
        "llm.MemPoolConfig": '{"memory_size": 67108864}',
        "llm.HostMemPoolConfig": '{"memory_size": 4096, "page_shift": 12}',
        "llm.EnableCacheManager": "1",
        "llm.EnableRemoteCacheAccessible": "0",
        "llm.listenIpInfo": "10.0.0.1:26000",
        "llm.LinkTotalTime": "1080",
        "llm.LinkRetryCount": "80",
        "llm.RdmaTrafficClass": "132",
        "llm.RdmaServiceLevel": "4",
        "llm.LocalCommRes": '{"version": "1.3"}',
        "llm.TransferBackend": "hixl",
        "llm.GlobalResourceConfig": '{"comm_resource_config.listen_port": 26666}',
        "llm.OutputMaxSize": "64",
        "llm.EnableSwitchRole": "1",
        "llm.MemoryUtilization": "0.5",
    }
    assert cfg.gen_options() is cfg.generate_options() is cfg.options


def test_device_id_list_and_tuple() -> None:
    cfg = LLMConfig()
    cfg.device_id = [0, 1, 7]
    opts = cfg.generate_options()
    assert opts["ge.exec.deviceId"] == "0;1;7" and opts["ge.session_device_id"] == "0"
    cfg.device_id = (5,)
    assert cfg.generate_options()["ge.exec.deviceId"] == "5"
    assert cfg.device_id == (5,)


def test_ge_options_merged_first_and_overridden_by_properties() -> None:
    cfg = LLMConfig()
    cfg.ge_options = {"ge.flowGraphMemMaxSize": "4106127360", "ge.exec.deviceId": "9",
                      "llm.MemoryUtilization": "0.1"}
    cfg.device_id = 1
    opts = cfg.generate_options()
    assert opts["ge.flowGraphMemMaxSize"] == "4106127360"
    assert opts["ge.exec.deviceId"] == "1"
    assert opts["llm.MemoryUtilization"] == "0.95"
    assert list(opts)[0] == "ge.flowGraphMemMaxSize"


def test_generate_options_is_cumulative_internal_dict() -> None:
    cfg = LLMConfig()
    first = cfg.generate_options()
    cfg.listen_ip_info = "1.1.1.1:1"
    second = cfg.generate_options()
    assert first is second and first["llm.listenIpInfo"] == "1.1.1.1:1"
    first["user.extra"] = "x"  # the caller's edits live in the internal dict, as in CANN
    cfg.listen_ip_info = ""  # clearing a property does not remove an emitted key
    assert cfg.generate_options() == {"llm.listenIpInfo": "1.1.1.1:1", "user.extra": "x",
                                      "llm.MemoryUtilization": "0.95"}


def test_memory_utilization_always_emitted() -> None:
    cfg = LLMConfig()
    assert cfg.generate_options()["llm.MemoryUtilization"] == "0.95"
    cfg.mem_utilization = 1.0
    assert cfg.generate_options()["llm.MemoryUtilization"] == "1.0"
    cfg.mem_utilization = 0.0
    assert cfg.generate_options()["llm.MemoryUtilization"] == "0.0"


def test_local_comm_res_empty_string_still_emitted() -> None:
    cfg = LLMConfig()
    cfg.local_comm_res = ""
    assert cfg.generate_options()["llm.LocalCommRes"] == ""
    assert cfg.local_comm_res == ""


def test_booleans_emitted_only_when_set() -> None:
    cfg = LLMConfig()
    cfg.enable_switch_role = False
    cfg.enable_cache_manager = False
    cfg.enable_remote_cache_accessible = True
    opts = cfg.generate_options()
    assert "llm.EnableSwitchRole" not in opts
    assert opts["llm.EnableCacheManager"] == "0" and opts["llm.EnableRemoteCacheAccessible"] == "1"
    assert cfg.enable_remote_cache_accessible is True


def test_empty_strings_not_emitted() -> None:
    cfg = LLMConfig()
    cfg.listen_ip_info = ""
    cfg.deploy_res_path = ""
    cfg.buf_pool_cfg = ""
    cfg.mem_pool_cfg = ""
    cfg.host_mem_pool_cfg = ""
    assert cfg.generate_options() == {"llm.MemoryUtilization": "0.95"}


def test_sync_kv_timeout_digit_string_kept() -> None:
    cfg = LLMConfig()
    cfg.sync_kv_timeout = "3000"
    assert cfg.sync_kv_timeout == "3000"
    assert cfg.generate_options()["llm.SyncKvCacheWaitTime"] == "3000"


def test_none_resets_string_and_bool_options() -> None:
    cfg = LLMConfig()
    cfg.enable_cache_manager = True
    cfg.enable_cache_manager = None
    cfg.local_comm_res = None
    cfg.transfer_backend = None
    cfg.listen_ip_info = None
    cfg.enable_switch_role = None
    assert cfg.enable_cache_manager is False and cfg.listen_ip_info == "" and cfg.enable_switch_role is False
    assert cfg.generate_options() == {"llm.MemoryUtilization": "0.95"}


def test_cluster_info_converts_ips() -> None:
    cfg = LLMConfig()
    cfg.cluster_info = json.dumps({"cluster_id": 1, "logic_device_id": ["0:0:0:0"],
                                   "listen_ip_info": [{"ip": "1.2.3.4", "port": 26000}, {"ip": 7, "port": 1}]})
    info = json.loads(cfg.generate_options()["llm.ClusterInfo"])
    assert info["listen_ip_info"] == [{"ip": 0x04030201, "port": 26000}, {"ip": 7, "port": 1}]
    with pytest.raises(ValueError):
        cfg.cluster_info = "{not json"
    with pytest.raises(RuntimeError):
        cfg.cluster_info = json.dumps({"listen_ip_info": [{"ip": "no.such.ip", "port": 1}]})


# ---- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("prop", "value"), [
    ("device_id", "0"), ("device_id", 1.0), ("device_id", None), ("device_id", [0, "1"]),
    ("sync_kv_timeout", 1.5), ("sync_kv_timeout", None),
    ("listen_ip_info", 1), ("deploy_res_path", 1),
    ("ge_options", None), ("ge_options", []), ("ge_options", {"k": 1}), ("ge_options", {1: "v"}),
    ("enable_switch_role", 1), ("enable_cache_manager", "1"), ("enable_remote_cache_accessible", 0),
    ("mem_utilization", 1), ("mem_utilization", "0.5"), ("mem_utilization", None),
    ("buf_pool_cfg", {}), ("mem_pool_cfg", 1), ("host_mem_pool_cfg", 1),
    ("rdma_traffic_class", "132"), ("rdma_service_level", 4.0),
    ("local_comm_res", 1), ("link_total_time", "1"), ("link_total_time", None), ("link_retry_count", 1.0),
    ("transfer_backend", 1), ("global_resource_config", {}), ("cluster_info", {}), ("output_max_size", "1"),
])
def test_wrong_type_is_type_error(prop: str, value: object) -> None:
    with pytest.raises(TypeError):
        setattr(LLMConfig(), prop, value)


@pytest.mark.parametrize(("prop", "value"), [
    ("device_id", 2**31), ("device_id", [0, 2**31]),
    ("sync_kv_timeout", 2**31), ("sync_kv_timeout", str(2**31)),
    ("rdma_traffic_class", -1), ("rdma_traffic_class", 2**32), ("rdma_service_level", -1),
])
def test_integer_out_of_range_is_value_error(prop: str, value: object) -> None:
    with pytest.raises(ValueError):
        setattr(LLMConfig(), prop, value)


@pytest.mark.parametrize(("prop", "value"), [
    ("device_id", -1), ("device_id", [0, -1]), ("device_id", []),
    ("sync_kv_timeout", 0), ("sync_kv_timeout", -5), ("sync_kv_timeout", "0"), ("sync_kv_timeout", "abc"),
    ("sync_kv_timeout", "-1"),
    ("mem_utilization", 1.01), ("mem_utilization", -0.1),
    ("link_total_time", -1), ("link_total_time", 2**32),
    ("link_retry_count", 0), ("link_retry_count", 101),
])
def test_semantic_rule_is_param_invalid(prop: str, value: object) -> None:
    with pytest.raises(LLMException) as excinfo:
        setattr(LLMConfig(), prop, value)
    _param_invalid(excinfo)


def test_boundaries_accepted() -> None:
    cfg = LLMConfig()
    cfg.device_id = 2**31 - 1
    cfg.sync_kv_timeout = 2**31 - 1
    cfg.link_total_time = 0
    cfg.link_total_time = 2**32 - 1
    cfg.link_retry_count = 1
    cfg.link_retry_count = 100
    cfg.rdma_traffic_class = 2**32 - 1
    cfg.rdma_service_level = 0
    cfg.device_id = True  # bool is an int, as in CANN
    assert cfg.generate_options()["ge.exec.deviceId"] == "True"


def test_failed_setter_keeps_old_value() -> None:
    cfg = LLMConfig()
    cfg.link_retry_count = 5
    with pytest.raises(LLMException):
        cfg.link_retry_count = 0
    assert cfg.link_retry_count == 5


# ---- LLMClusterInfo ------------------------------------------------------------------------------


def test_cluster_info_defaults() -> None:
    info = LLMClusterInfo()
    assert info.remote_cluster_id is None and info.remote_role_type is None
    assert info.local_ip_info_list == [] and info.remote_ip_info_list == []


def test_cluster_info_ip_conversion() -> None:
    info = LLMClusterInfo()
    info.remote_cluster_id = 2**64 - 1
    info.remote_role_type = LLMRole.PROMPT
    info.append_local_ip_info("1.2.3.4", 0)
    info.append_remote_ip_info("192.168.1.10", 26000)
    info.append_remote_ip_info(0x0100007F, 65535)
    assert info.local_ip_info_list == [(0x04030201, 0)]
    assert info.remote_ip_info_list == [(0x0A01A8C0, 26000), (0x0100007F, 65535)]
    assert _ip_int_to_str(0x0100007F) == "127.0.0.1"
    assert "192.168.1.10:26000" in repr(info)


def test_cluster_info_lists_are_read_only_properties() -> None:
    info = LLMClusterInfo()
    with pytest.raises(AttributeError):
        info.local_ip_info_list = []  # type: ignore[misc]
    with pytest.raises(AttributeError):
        info.remote_ip_info_list = []  # type: ignore[misc]


def test_cluster_info_validation() -> None:
    info = LLMClusterInfo()
    with pytest.raises(RuntimeError, match="Can not parse ip str"):
        info.append_remote_ip_info("300.1.1.1", 1)
    with pytest.raises(RuntimeError):
        info.append_local_ip_info("localhost", 1)
    with pytest.raises(TypeError):
        info.append_local_ip_info(None, 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        info.append_local_ip_info(b"1.2.3.4", 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        info.append_local_ip_info("1.2.3.4", "1")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        info.append_local_ip_info("1.2.3.4", 65536)
    with pytest.raises(ValueError):
        info.append_local_ip_info("1.2.3.4", -1)
    with pytest.raises(ValueError):
        info.append_local_ip_info(2**32, 1)
    with pytest.raises(ValueError):
        info.remote_cluster_id = -1
    with pytest.raises(ValueError):
        info.remote_cluster_id = 2**64
    with pytest.raises(TypeError):
        info.remote_cluster_id = "1"  # type: ignore[assignment]
    with pytest.raises(TypeError):
        info.remote_role_type = "PROMPT"  # type: ignore[assignment]
    info.remote_role_type = 2
    assert info.remote_role_type == LLMRole.DECODER
    assert info.local_ip_info_list == [] and info.remote_ip_info_list == []


@given(st.tuples(*[st.integers(0, 255)] * 4))
def test_ip_round_trip(octets: tuple) -> None:
    text = ".".join(map(str, octets))
    info = LLMClusterInfo()
    info.append_remote_ip_info(text, 1)
    ip_int = info.remote_ip_info_list[0][0]
    assert ip_int == octets[0] | octets[1] << 8 | octets[2] << 16 | octets[3] << 24
    assert _ip_int_to_str(ip_int) == text
