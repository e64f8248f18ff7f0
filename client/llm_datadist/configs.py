"""``LLMRole``, ``LLMConfig`` (alias ``LlmConfig``) and ``LLMClusterInfo`` (CANN ``llm_datadist.configs``).

``LLMConfig.generate_options()`` produces the ``Dict[str, str]`` that ``LLMDataDist.init`` takes,
with CANN's exact option keys and value formats (docs/spec.md §3.1, §12).
"""

from __future__ import annotations

import json
import socket
from enum import IntEnum
from typing import Dict, List, Optional, Tuple, Union

from . import _validate as v

__all__ = ["LLMRole", "LLMConfig", "LlmConfig", "LLMClusterInfo"]


class LLMRole(IntEnum):
    """A node's role: ``PROMPT`` (1), ``DECODER`` (2) or ``MIX`` (3); ``str()`` gives ``"LLMRole.PROMPT"``."""

    PROMPT = 1
    DECODER = 2
    MIX = 3

    def __str__(self) -> str:
        return f"{self.__class__.__name__}.{self.name}"


def _ip_to_int(ip: Union[str, int]) -> int:
    """IPv4 string -> int, little-endian as CANN (``"1.2.3.4"`` -> ``0x04030201``); ints pass through."""
    if isinstance(ip, str):
        try:
            return int.from_bytes(socket.inet_aton(ip), "little")
        except (OSError, ValueError):
            raise RuntimeError(f"Can not parse ip str:{ip}") from None
    return ip


def _ip_int_to_str(ip_int: int) -> str:
    """Inverse of the little-endian conversion: ``0x04030201`` -> ``"1.2.3.4"``."""
    v.check_uint32("ip", ip_int)
    return socket.inet_ntoa(ip_int.to_bytes(4, "little"))


class LLMClusterInfo:
    """One peer for ``link_clusters`` / ``unlink_clusters``.

    ``remote_*`` is the server's listen address, ``local_*`` this node's own address. IPs are
    stored as little-endian ints, as CANN does; an int IP must fit in uint32 (ValueError otherwise).
    """

    def __init__(self) -> None:
        self._remote_cluster_id: Optional[int] = None
        self._remote_role_type: Optional[Union[LLMRole, int]] = None
        self._local_ip_info_list: List[Tuple[int, int]] = []
        self._remote_ip_info_list: List[Tuple[int, int]] = []

    @property
    def remote_cluster_id(self) -> Optional[int]:
        """The peer's cluster id (uint64; None until set)."""
        return self._remote_cluster_id

    @remote_cluster_id.setter
    def remote_cluster_id(self, remote_cluster_id: int) -> None:
        v.check_uint64("remote_cluster_id", remote_cluster_id)
        self._remote_cluster_id = remote_cluster_id

    @property
    def remote_role_type(self) -> Optional[Union[LLMRole, int]]:
        """The peer's role (``LLMRole`` or int; not used in v2)."""
        return self._remote_role_type

    @remote_role_type.setter
    def remote_role_type(self, remote_role_type: Union[LLMRole, int]) -> None:
        v.check_isinstance("remote_role_type", remote_role_type, [LLMRole, int])
        self._remote_role_type = remote_role_type

    @property
    def local_ip_info_list(self) -> List[Tuple[int, int]]:
        """This node's addresses, as ``(ip as little-endian int, port)``."""
        return self._local_ip_info_list

    @property
    def remote_ip_info_list(self) -> List[Tuple[int, int]]:
        """The peer's listen addresses, as ``(ip as little-endian int, port)``."""
        return self._remote_ip_info_list

    @staticmethod
    def _ip_info(ip: Union[str, int], port: int) -> Tuple[int, int]:
        v.check_isinstance("ip", ip, [str, int], allow_none=False)
        v.check_uint16("port", port)
        ip_int = _ip_to_int(ip)
        v.check_uint32("ip", ip_int)
        return ip_int, port

    def append_local_ip_info(self, ip: Union[str, int], port: int) -> None:
        """Add this node's address (port 0 when it does not listen).

        Args:
            ip: dotted IPv4 text or its little-endian int (uint32).
            port: the port (uint16).

        Raises:
            TypeError, ValueError: an ``ip`` or ``port`` of the wrong type or range.
            RuntimeError: text that is no IPv4 address.
        """
        self._local_ip_info_list.append(self._ip_info(ip, port))

    def append_remote_ip_info(self, ip: Union[str, int], port: int) -> None:
        """Add the peer's listen address.

        Args:
            ip: dotted IPv4 text or its little-endian int (uint32).
            port: the port (uint16).

        Raises:
            TypeError, ValueError: an ``ip`` or ``port`` of the wrong type or range.
            RuntimeError: text that is no IPv4 address.
        """
        self._remote_ip_info_list.append(self._ip_info(ip, port))

    def __repr__(self) -> str:
        def fmt(infos: List[Tuple[int, int]]) -> List[str]:
            return [f"{_ip_int_to_str(ip)}:{port}" for ip, port in infos]

        return (f"LLMClusterInfo(remote_cluster_id={self._remote_cluster_id}, "
                f"remote_role_type={self._remote_role_type}, local_ip_info_list={fmt(self._local_ip_info_list)}, "
                f"remote_ip_info_list={fmt(self._remote_ip_info_list)})")


class LLMConfig:
    """Options of ``LLMDataDist.init``; every attribute is a type-checked property.

    ``generate_options()`` (alias ``gen_options()``) returns the internal dict, updated in place on
    every call as in CANN: ``ge_options`` first, then the properties that are set (so properties win),
    and ``llm.MemoryUtilization`` always. A key once emitted stays even if its property is cleared.
    Setters of string/bool options accept ``None`` as "unset" (CANN lets ``None`` through there);
    numeric setters, ``device_id``, ``ge_options`` and ``cluster_info`` reject it with TypeError.
    """

    def __init__(self) -> None:
        self._options: Dict[str, str] = {}
        self._device_id: Optional[Union[int, List[int], Tuple[int, ...]]] = None
        self._sync_kv_timeout: Optional[Union[int, str]] = None
        self._listen_ip_info = ""
        self._deploy_res_path = ""
        self._ge_options: Dict[str, str] = {}
        self._enable_switch_role = False
        self._mem_utilization = 0.95
        self._buf_pool_cfg = ""
        self._mem_pool_cfg = ""
        self._host_mem_pool_cfg = ""
        self._enable_cache_manager: Optional[bool] = None
        self._enable_remote_cache_accessible: Optional[bool] = None
        self._rdma_traffic_class: Optional[int] = None
        self._rdma_service_level: Optional[int] = None
        self._local_comm_res: Optional[str] = None
        self._link_total_time: Optional[int] = None
        self._link_retry_count: Optional[int] = None
        self._transfer_backend: Optional[str] = None
        self._global_resource_config: Optional[str] = None
        self._cluster_info = ""
        self._output_max_size: Optional[int] = None

    # ---- options -----------------------------------------------------------------------------

    def generate_options(self) -> Dict[str, str]:
        """The options dict for ``LLMDataDist.init`` (the same dict object on every call).

        Returns:
            ``ge_options`` first, then every property that is set, as option keys (``llm.*``, ``ge.exec.deviceId``).
        """
        opts = self._options
        opts.update(self._ge_options)
        if self._device_id is not None:
            if isinstance(self._device_id, int):
                opts["ge.exec.deviceId"] = str(self._device_id)
                opts["ge.session_device_id"] = str(self._device_id)
            else:
                opts["ge.session_device_id"] = str(self._device_id[0])
                opts["ge.exec.deviceId"] = ";".join(str(d) for d in self._device_id)
        if self._sync_kv_timeout is not None:
            opts["llm.SyncKvCacheWaitTime"] = str(self._sync_kv_timeout)
        if self._deploy_res_path:
            opts["llm.deployResPath"] = self._deploy_res_path
        # memory
        if self._buf_pool_cfg:
            opts["llm.BufPoolCfg"] = self._buf_pool_cfg
        if self._mem_pool_cfg:
            opts["llm.MemPoolConfig"] = self._mem_pool_cfg
        if self._host_mem_pool_cfg:
            opts["llm.HostMemPoolConfig"] = self._host_mem_pool_cfg
        if self._enable_cache_manager is not None:
            opts["llm.EnableCacheManager"] = "1" if self._enable_cache_manager else "0"
        if self._enable_remote_cache_accessible is not None:
            opts["llm.EnableRemoteCacheAccessible"] = "1" if self._enable_remote_cache_accessible else "0"
        # connection
        if self._listen_ip_info:
            opts["llm.listenIpInfo"] = self._listen_ip_info
        if self._link_total_time is not None:
            opts["llm.LinkTotalTime"] = str(self._link_total_time)
        if self._link_retry_count is not None:
            opts["llm.LinkRetryCount"] = str(self._link_retry_count)
        if self._rdma_traffic_class is not None:
            opts["llm.RdmaTrafficClass"] = str(self._rdma_traffic_class)
        if self._rdma_service_level is not None:
            opts["llm.RdmaServiceLevel"] = str(self._rdma_service_level)
        if self._local_comm_res is not None:
            opts["llm.LocalCommRes"] = self._local_comm_res
        if self._transfer_backend is not None:
            opts["llm.TransferBackend"] = self._transfer_backend
        if self._global_resource_config is not None:
            opts["llm.GlobalResourceConfig"] = self._global_resource_config
        # legacy
        if self._cluster_info:
            opts["llm.ClusterInfo"] = self._cluster_info
        if self._output_max_size is not None:
            opts["llm.OutputMaxSize"] = str(self._output_max_size)
        if self._enable_switch_role:
            opts["llm.EnableSwitchRole"] = "1"
        opts["llm.MemoryUtilization"] = str(self._mem_utilization)
        return opts

    def gen_options(self) -> Dict[str, str]:
        """Alias of ``generate_options``.

        Returns:
            The options dict.
        """
        return self.generate_options()

    @property
    def options(self) -> Dict[str, str]:
        """The internal dict as last generated."""
        return self._options

    # ---- properties --------------------------------------------------------------------------

    @property
    def device_id(self) -> Optional[Union[int, List[int], Tuple[int, ...]]]:
        """The NPU id(s): ``ge.exec.deviceId`` (an int >= 0, or a list: ``"0;1"``)."""
        return self._device_id

    @device_id.setter
    def device_id(self, device_id: Union[int, List[int], Tuple[int, ...]]) -> None:
        """int >= 0 (int32) or a non-empty list/tuple of them; negative -> LLMException, > int32 -> ValueError."""
        v.check_isinstance("device_id", device_id, [list, tuple, int], allow_none=False)
        ids = device_id if isinstance(device_id, (list, tuple)) else [device_id]
        if isinstance(device_id, (list, tuple)):
            v.check_isinstance("device_id", device_id, [list, tuple], inner_class=int)
            v.raise_if_false(len(device_id) > 0, "device_id should not be empty.")
        for dev in ids:
            v.raise_if_false(dev >= 0, "device_id should be greater than or equal to zero.")
            v.check_int32("device_id", dev)
        self._device_id = device_id

    @property
    def sync_kv_timeout(self) -> Optional[Union[int, str]]:
        """Milliseconds a pull or push may take (``llm.SyncKvCacheWaitTime``; engine default 1000)."""
        return self._sync_kv_timeout

    @sync_kv_timeout.setter
    def sync_kv_timeout(self, sync_kv_timeout: Union[int, str]) -> None:
        """Milliseconds, int or digit string, > 0 and int32."""
        v.check_isinstance("sync_kv_timeout", sync_kv_timeout, [int, str], allow_none=False)
        if isinstance(sync_kv_timeout, str):
            v.raise_if_false(sync_kv_timeout.isdigit(), "sync_kv_timeout must be digit.")
        v.raise_if_false(int(sync_kv_timeout) > 0, "sync_kv_timeout should be greater than zero.")
        v.check_int32("sync_kv_timeout", int(sync_kv_timeout))
        self._sync_kv_timeout = sync_kv_timeout

    @property
    def listen_ip_info(self) -> str:
        """``"ip:port"`` this node listens on (``llm.listenIpInfo``): set, it is a link server."""
        return self._listen_ip_info

    @listen_ip_info.setter
    def listen_ip_info(self, listen_ip_info: str) -> None:
        """``"ip:port"``; the format itself is checked by ``LLMDataDist.init``."""
        v.check_isinstance("listen_ip_info", listen_ip_info, [str])
        self._listen_ip_info = "" if listen_ip_info is None else listen_ip_info

    @property
    def deploy_res_path(self) -> str:
        """The deployment resource path (``llm.deployResPath``; v1)."""
        return self._deploy_res_path

    @deploy_res_path.setter
    def deploy_res_path(self, deploy_res_path: str) -> None:
        v.check_isinstance("deploy_res_path", deploy_res_path, [str])
        self._deploy_res_path = "" if deploy_res_path is None else deploy_res_path

    @property
    def ge_options(self) -> Dict[str, str]:
        """GE options merged into the generated options first (e.g. ``ge.flowGraphMemMaxSize``)."""
        return self._ge_options

    @ge_options.setter
    def ge_options(self, ge_options: Dict[str, str]) -> None:
        """``Dict[str, str]`` merged verbatim before the properties; the dict is kept, not copied."""
        v.check_dict("ge_options", ge_options, str, str, allow_none=False)
        self._ge_options = ge_options

    @property
    def enable_switch_role(self) -> bool:
        """Whether v1 ``switch_role`` is allowed (``llm.EnableSwitchRole``)."""
        return self._enable_switch_role

    @enable_switch_role.setter
    def enable_switch_role(self, enable_switch_role: bool) -> None:
        v.check_isinstance("enable_switch_role", enable_switch_role, [bool])
        self._enable_switch_role = bool(enable_switch_role)

    @property
    def mem_utilization(self) -> float:
        """Share of the memory the engine may use, in [0, 1] (``llm.MemoryUtilization``, default 0.95)."""
        return self._mem_utilization

    @mem_utilization.setter
    def mem_utilization(self, mem_utilization: float) -> None:
        """float in [0, 1] (an int is a TypeError, as in CANN)."""
        v.check_isinstance("mem_utilization", mem_utilization, [float], allow_none=False)
        v.raise_if_false(0.0 <= mem_utilization <= 1.0,
                         f"mem_utilization must be in range [0,1], current:{mem_utilization}")
        self._mem_utilization = mem_utilization

    @property
    def buf_pool_cfg(self) -> str:
        """v1 buffer pool tiers, JSON (``llm.BufPoolCfg``)."""
        return self._buf_pool_cfg

    @buf_pool_cfg.setter
    def buf_pool_cfg(self, buf_pool_cfg: str) -> None:
        v.check_isinstance("buf_pool_cfg", buf_pool_cfg, [str])
        self._buf_pool_cfg = "" if buf_pool_cfg is None else buf_pool_cfg

    @property
    def mem_pool_cfg(self) -> str:
        """The device pool, JSON ``{"memory_size": N, "page_shift": 16}`` (``llm.MemPoolConfig``)."""
        return self._mem_pool_cfg

    @mem_pool_cfg.setter
    def mem_pool_cfg(self, mem_pool_cfg: str) -> None:
        """JSON ``{"memory_size": N, "page_shift": 16}``; the content is checked by the daemon."""
        v.check_isinstance("mem_pool_cfg", mem_pool_cfg, [str])
        self._mem_pool_cfg = "" if mem_pool_cfg is None else mem_pool_cfg

    @property
    def host_mem_pool_cfg(self) -> str:
        """The host pool, JSON as ``mem_pool_cfg`` (``llm.HostMemPoolConfig``)."""
        return self._host_mem_pool_cfg

    @host_mem_pool_cfg.setter
    def host_mem_pool_cfg(self, host_mem_pool_cfg: str) -> None:
        v.check_isinstance("host_mem_pool_cfg", host_mem_pool_cfg, [str])
        self._host_mem_pool_cfg = "" if host_mem_pool_cfg is None else host_mem_pool_cfg

    @property
    def enable_cache_manager(self) -> bool:
        """Cache-manager mode (v2, ``CacheManager``) instead of ``KvCacheManager`` (``llm.EnableCacheManager``)."""
        return bool(self._enable_cache_manager)

    @enable_cache_manager.setter
    def enable_cache_manager(self, enable_cache_manager: bool) -> None:
        v.check_isinstance("enable_cache_manager", enable_cache_manager, [bool])
        self._enable_cache_manager = enable_cache_manager

    @property
    def enable_remote_cache_accessible(self) -> bool:
        """Whether peers may reach caches by id and push (``llm.EnableRemoteCacheAccessible``)."""
        return bool(self._enable_remote_cache_accessible)

    @enable_remote_cache_accessible.setter
    def enable_remote_cache_accessible(self, enable_remote_cache_accessible: bool) -> None:
        v.check_isinstance("enable_remote_cache_accessible", enable_remote_cache_accessible, [bool])
        self._enable_remote_cache_accessible = enable_remote_cache_accessible

    @property
    def rdma_traffic_class(self) -> Optional[int]:
        """RDMA traffic class, uint32 (``llm.RdmaTrafficClass``; HCCL_RDMA_TC)."""
        return self._rdma_traffic_class

    @rdma_traffic_class.setter
    def rdma_traffic_class(self, rdma_traffic_class: int) -> None:
        """uint32, as CANN's Python checks; the documented [0, 255] / multiple-of-4 rule is left to the engine."""
        v.check_uint32("rdma_traffic_class", rdma_traffic_class)
        self._rdma_traffic_class = rdma_traffic_class

    @property
    def rdma_service_level(self) -> Optional[int]:
        """RDMA service level, uint32 (``llm.RdmaServiceLevel``; HCCL_RDMA_SL)."""
        return self._rdma_service_level

    @rdma_service_level.setter
    def rdma_service_level(self, rdma_service_level: int) -> None:
        """uint32, as CANN's Python checks; the documented [0, 7] rule is left to the engine."""
        v.check_uint32("rdma_service_level", rdma_service_level)
        self._rdma_service_level = rdma_service_level

    @property
    def local_comm_res(self) -> str:
        """Local communication resources, JSON or ``""`` (``llm.LocalCommRes``; implies cache-manager mode)."""
        return "" if self._local_comm_res is None else self._local_comm_res

    @local_comm_res.setter
    def local_comm_res(self, local_comm_res: str) -> None:
        """JSON or ``""``; once set (even to ``""``) ``llm.LocalCommRes`` is emitted, selecting cache-manager mode."""
        v.check_isinstance("local_comm_res", local_comm_res, [str])
        self._local_comm_res = local_comm_res

    @property
    def link_total_time(self) -> int:
        """Seconds a link may take to set up, 0: HCCL's default (``llm.LinkTotalTime``)."""
        return 0 if self._link_total_time is None else self._link_total_time

    @link_total_time.setter
    def link_total_time(self, link_total_time: int) -> None:
        """Seconds in [0, 2**32 - 1]; out of range -> LLMException(LLM_PARAM_INVALID), as CANN."""
        v.check_isinstance("link_total_time", link_total_time, [int], allow_none=False)
        v.raise_if_false(0 <= link_total_time <= v.UINT32_MAX,
                         f"link_total_time should be an integer between [0, 2^32-1], "
                         f"given value is {link_total_time}")
        self._link_total_time = link_total_time

    @property
    def link_retry_count(self) -> int:
        """Link attempts, in [1, 100] (``llm.LinkRetryCount``, default 1)."""
        return 1 if self._link_retry_count is None else self._link_retry_count

    @link_retry_count.setter
    def link_retry_count(self, link_retry_count: int) -> None:
        """In [1, 100]; out of range -> LLMException(LLM_PARAM_INVALID), as CANN."""
        v.check_isinstance("link_retry_count", link_retry_count, [int], allow_none=False)
        v.raise_if_false(1 <= link_retry_count <= 100,
                         f"link_retry_count should be an integer between [1, 100], given value is {link_retry_count}")
        self._link_retry_count = link_retry_count

    @property
    def transfer_backend(self) -> str:
        """The transfer backend, only ``"hixl"`` (``llm.TransferBackend``)."""
        return "" if self._transfer_backend is None else self._transfer_backend

    @transfer_backend.setter
    def transfer_backend(self, transfer_backend: str) -> None:
        """Only ``"hixl"`` is meaningful; like CANN the setter checks the type only."""
        v.check_isinstance("transfer_backend", transfer_backend, [str])
        self._transfer_backend = transfer_backend

    @property
    def global_resource_config(self) -> str:
        """JSON handed to the hixl backend (``llm.GlobalResourceConfig``)."""
        return "" if self._global_resource_config is None else self._global_resource_config

    @global_resource_config.setter
    def global_resource_config(self, global_resource_config: str) -> None:
        v.check_isinstance("global_resource_config", global_resource_config, [str])
        self._global_resource_config = global_resource_config

    @property
    def cluster_info(self) -> str:
        """The v1 cluster description, JSON (``llm.ClusterInfo``; ``init`` makes it when absent)."""
        return self._cluster_info

    @cluster_info.setter
    def cluster_info(self, cluster_info: str) -> None:
        """v1 JSON; string IPs under ``listen_ip_info`` become little-endian ints. Bad JSON -> ValueError."""
        v.check_isinstance("cluster_info", cluster_info, [str], allow_none=False)
        info = json.loads(cluster_info)
        if isinstance(info, dict):
            for ip_info in info.get("listen_ip_info", []):
                ip_info["ip"] = _ip_to_int(ip_info["ip"])
        self._cluster_info = json.dumps(info)

    @property
    def output_max_size(self) -> Optional[int]:
        """Legacy: ``llm.OutputMaxSize``."""
        return self._output_max_size

    @output_max_size.setter
    def output_max_size(self, output_max_size: int) -> None:
        v.check_isinstance("output_max_size", output_max_size, [int])
        self._output_max_size = output_max_size


LlmConfig = LLMConfig
