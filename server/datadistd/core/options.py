"""Parse an ``LLMDataDist.init`` options dict (CANN option keys, string values) into a frozen record.

The client validates the same options first; the daemon validates again because anything
(grpcurl included) can call it. Bad values -> ``DataDistError(LLM_PARAM_INVALID)`` naming the key.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from typing import Mapping

from .errors import DataDistError, StatusCode
from .types import Placement, Role

__all__ = ["EngineOptions", "PoolConfig", "parse_options", "parse_listen", "DEFAULT_SYNC_KV_TIMEOUT_MS"]

DEFAULT_SYNC_KV_TIMEOUT_MS = 1000
UINT32_MAX = 2**32 - 1


@dataclass(frozen=True)
class PoolConfig:
    memory_size: int
    page_shift: int = 16


@dataclass(frozen=True)
class EngineOptions:
    role: Role
    cluster_id: int
    cache_manager: bool                 # v2 CacheManager mode
    remote_cache_accessible: bool
    sync_kv_timeout_ms: int = DEFAULT_SYNC_KV_TIMEOUT_MS
    listen: tuple[str, int] | None = None
    pools: tuple[tuple[Placement, PoolConfig], ...] = ()
    link_total_time_s: int = 0
    link_retry_count: int = 1
    device_id: str = "0"

    def pool(self, placement: Placement) -> PoolConfig | None:
        return dict(self.pools).get(placement)


def _bad(key: str, value: object, why: str) -> DataDistError:
    return DataDistError(StatusCode.LLM_PARAM_INVALID, f"option {key}={value!r}: {why}")


def parse_listen(value: str, key: str = "llm.listenIpInfo") -> tuple[str, int]:
    """``"ip:port"`` (exactly one; IPv6 as ``[ip]:port``) -> (ip, port)."""
    host, sep, port_text = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port_text.isdigit():
        raise _bad(key, value, 'expected exactly one "ip:port"')
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise _bad(key, value, f"{host!r} is not an IP address") from None
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise _bad(key, value, "port must be in [0, 65535]")
    return host, port


def _pool(key: str, value: str) -> PoolConfig:
    try:
        data = json.loads(value)
    except json.JSONDecodeError as exc:
        raise _bad(key, value, f"not JSON ({exc.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("memory_size"), int) or data["memory_size"] <= 0:
        raise _bad(key, value, 'expected {"memory_size": <bytes > 0>, "page_shift": 16}')
    page_shift = data.get("page_shift", 16)
    if not isinstance(page_shift, int) or not 10 <= page_shift < 31:
        raise _bad(key, value, "page_shift must be an int in [10, 31)")
    if (data["memory_size"] >> page_shift) >= UINT32_MAX:
        raise _bad(key, value, "memory_size >> page_shift must be < 2**32-1")
    return PoolConfig(data["memory_size"], page_shift)


def _int(options: Mapping[str, str], key: str, default: int, lo: int, hi: int) -> int:
    raw = options.get(key)
    if raw is None or raw == "":
        return default
    text = str(raw).strip()
    if not text.lstrip("-").isdigit():
        raise _bad(key, raw, "expected a decimal integer")
    value = int(text)
    if not lo <= value <= hi:
        raise _bad(key, raw, f"must be in [{lo}, {hi}]")
    return value


def parse_options(role: Role, cluster_id: int, options: Mapping[str, str]) -> EngineOptions:
    if not 0 <= cluster_id < 2**64:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"cluster_id {cluster_id} is not a uint64")
    local_comm_res = "llm.LocalCommRes" in options
    cache_manager = options.get("llm.EnableCacheManager", "1" if local_comm_res else "0") == "1"
    remote_default = "1" if local_comm_res else "0"
    remote = options.get("llm.EnableRemoteCacheAccessible", remote_default) == "1"
    if local_comm_res and not cache_manager:
        raise _bad("llm.LocalCommRes", options["llm.LocalCommRes"], "requires llm.EnableCacheManager=1")
    if "llm.TransferBackend" in options:
        if not cache_manager:
            raise _bad("llm.TransferBackend", options["llm.TransferBackend"], "requires cache-manager mode")
        if "llm.listenIpInfo" not in options:
            raise _bad("llm.TransferBackend", options["llm.TransferBackend"], "requires llm.listenIpInfo")
        remote = True
    listen = None
    if options.get("llm.listenIpInfo"):
        listen = parse_listen(options["llm.listenIpInfo"])
    pools: list[tuple[Placement, PoolConfig]] = []
    if options.get("llm.MemPoolConfig"):
        pools.append((Placement.DEVICE, _pool("llm.MemPoolConfig", options["llm.MemPoolConfig"])))
    if options.get("llm.HostMemPoolConfig"):
        pools.append((Placement.HOST, _pool("llm.HostMemPoolConfig", options["llm.HostMemPoolConfig"])))
    flow = options.get("ge.flowGraphMemMaxSize")
    if flow is not None and not str(flow).isdigit():
        raise _bad("ge.flowGraphMemMaxSize", flow, "must be a single decimal byte count")
    return EngineOptions(
        role=Role(role),
        cluster_id=cluster_id,
        cache_manager=cache_manager,
        remote_cache_accessible=remote,
        sync_kv_timeout_ms=_int(options, "llm.SyncKvCacheWaitTime", DEFAULT_SYNC_KV_TIMEOUT_MS, 1, 2**31 - 1),
        listen=listen,
        pools=tuple(pools),
        link_total_time_s=_int(options, "llm.LinkTotalTime", 0, 0, UINT32_MAX),
        link_retry_count=_int(options, "llm.LinkRetryCount", 1, 1, 100),
        device_id=str(options.get("ge.exec.deviceId", "0")),
    )
