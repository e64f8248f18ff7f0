"""Private: ``Hixl.initialize``'s options, checked as HIXL checks them (hicann/hixl src/hixl/engine/hixl_options.cc,
hixl_engine.cc ``kSupportedOptions``, engine_factory.cc, connect_pool_executor.cc) -- every refusal is
``PARAM_INVALID``, as HIXL's (a parse failure makes ``EngineFactory::CreateEngine`` return null, which
``HIXL_CHECK_NOTNULL`` answers with ``PARAM_INVALID``).

What each option means here (docs/hixl.md):

- ``AutoConnect`` "0"/"1": connect at the first transfer (``TransferSync``/``TransferAsync``), as HIXL does.
- ``RdmaTrafficClass`` (0..255, a multiple of 4) / ``RdmaServiceLevel`` (0..7), or their ``adxl.`` spellings, else
  ``HCCL_RDMA_TC`` / ``HCCL_RDMA_SL``: handed to the daemon as ``llm.RdmaTrafficClass`` / ``llm.RdmaServiceLevel``.
- ``GlobalResourceConfig``: a JSON object, every field HIXL reads checked as HIXL checks it; ``connect_pool.thread_num``
  and ``connect_pool.task_queue_capacity`` size ``ConnectAsync``'s pool; the rest has no meaning here.
- ``LocalCommRes`` (or ``adxl.LocalCommRes``, or the file ``GlobalResourceConfig.local_comm_res_path`` names): JSON,
  checked, otherwise unused (the daemon finds the engine's NIC itself).
- ``BufferPool``: only "0:0" (no buffer pool), as HIXL's ``HixlEngine`` takes it.
- ``EnableUseFabricMem``: its value checked ("0"/"1"), then refused as HIXL's ``HixlEngine`` refuses an option it does
  not support (``CheckSupportedOptions``: ``PARAM_INVALID``, "Unsupported option"): there is no fabric memory here.
- any other key: refused the same way, except ``datadist.daemon`` (the daemon's address, as ``llm_datadist`` takes it).
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

from datadist.hixl import PARAM_INVALID
from llm_datadist._daemon import DAEMON_OPTION

__all__ = ["HixlOptions", "Refused", "parse_options"]

# hixl_types.h (and adxl_types.h for the adxl.* spellings HIXL also reads)
ENABLE_USE_FABRIC_MEM = "EnableUseFabricMem"
RDMA_TRAFFIC_CLASS = "RdmaTrafficClass"
RDMA_SERVICE_LEVEL = "RdmaServiceLevel"
BUFFER_POOL = "BufferPool"
GLOBAL_RESOURCE_CONFIG = "GlobalResourceConfig"
AUTO_CONNECT = "AutoConnect"
LOCAL_COMM_RES = "LocalCommRes"
_ADXL = {RDMA_TRAFFIC_CLASS: "adxl.RdmaTrafficClass", RDMA_SERVICE_LEVEL: "adxl.RdmaServiceLevel",
         BUFFER_POOL: "adxl.BufferPool", LOCAL_COMM_RES: "adxl.LocalCommRes"}
#: hixl_engine.cc HixlEngine::kSupportedOptions, and the daemon's address
_SUPPORTED = frozenset({RDMA_TRAFFIC_CLASS, RDMA_SERVICE_LEVEL, LOCAL_COMM_RES, BUFFER_POOL, AUTO_CONNECT,
                        GLOBAL_RESOURCE_CONFIG, *_ADXL.values(), DAEMON_OPTION})
_BUFFER_POOL_DISABLED = "0:0"
#: connect_pool_executor.cc: the pool's defaults
DEFAULT_CONNECT_THREADS = 2
DEFAULT_CONNECT_QUEUE = 128
_MAX_LOCAL_COMM_RES_FILE = 1024 * 1024
_INT32 = (-(2**31), 2**31 - 1)
_UINT32 = (0, 2**32 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_NUMBER = re.compile(r"\s*([+-]?\d+)")


class Refused(Exception):
    """An option HIXL refuses: ``status`` (``PARAM_INVALID``) and why."""

    def __init__(self, why: str, status: int = PARAM_INVALID) -> None:
        super().__init__(why)
        self.status = status


@dataclass(frozen=True)
class HixlOptions:
    """What the options decide here."""

    auto_connect: bool = False
    rdma_traffic_class: Optional[int] = None
    rdma_service_level: Optional[int] = None
    connect_threads: int = DEFAULT_CONNECT_THREADS
    connect_queue: int = DEFAULT_CONNECT_QUEUE
    daemon: Optional[str] = None          # the datadist.daemon option


def _to_number(text: str, bounds: tuple[int, int], what: str) -> int:
    """HIXL's ``ToNumber`` (``std::stringstream >> T``, the whole string consumed): optional leading blanks and sign,
    decimal digits, nothing after, within the type's range."""
    match = _NUMBER.fullmatch(text)
    if match is None or not bounds[0] <= int(match.group(1)) <= bounds[1]:
        raise Refused(f"{what} is invalid, value = {text!r}")
    return int(match.group(1))


def _either(options: Mapping[str, str], key: str) -> Optional[str]:
    """The value of ``key``, else of its ``adxl.`` spelling (HIXL: the hixl key wins)."""
    value = options.get(key)
    return value if value is not None else options.get(_ADXL[key])


def _rdma(options: Mapping[str, str], key: str, env_key: str, env: Mapping[str, str]) -> Optional[int]:
    text = _either(options, key) or env.get(env_key) or ""
    if not text:
        return None
    value = _to_number(text, _INT32, key)
    if key == RDMA_TRAFFIC_CLASS and not (0 <= value <= 255 and value % 4 == 0):
        raise Refused(f"Traffic class is invalid, value = {value}, must be between 0-255 and a multiple of 4")
    if key == RDMA_SERVICE_LEVEL and not 0 <= value <= 7:
        raise Refused(f"service_level must be in [0, 7], value = {value}")
    return value


def _json_int(cfg: Mapping[str, Any], name: str, lo: int, hi: int) -> Optional[int]:
    """hixl_options.cc ParseIntegerFieldInRange: an integer, or a string ``ToNumber`` reads, in ``[lo, hi]``."""
    if name not in cfg:
        return None
    raw = cfg[name]
    if isinstance(raw, str):
        value = _to_number(raw, _INT64, name)
    elif isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    else:
        raise Refused(f"{name}: expected an integer, got {json.dumps(raw)}")
    if not lo <= value <= hi:
        raise Refused(f"{name} must be in [{lo}, {hi}], got {value}")
    return value


def _json_bool(cfg: Mapping[str, Any], name: str) -> Optional[bool]:
    if name not in cfg:
        return None
    if not isinstance(cfg[name], bool):
        raise Refused(f"{name}: expected true or false, got {json.dumps(cfg[name])}")
    return bool(cfg[name])


def _fabric_memory(cfg: Mapping[str, Any], prefix: str) -> tuple[Optional[int], Optional[bool]]:
    """The fabric_memory fields (nested, or dotted at the top level): checked, of no use here; (task_stream_num,
    enable_aicpu_unfold) for the check across both."""
    _json_int(cfg, f"{prefix}max_capacity", 1, 1024)
    _json_int(cfg, f"{prefix}start_address", 0, 1024)
    return _json_int(cfg, f"{prefix}task_stream_num", 1, 8), _json_bool(cfg, f"{prefix}enable_aicpu_unfold")


def _global_resource_config(text: str) -> Dict[str, Any]:
    """hixl_options.cc ParseGlobalResourceConfig: a JSON object whose known fields are in range."""
    try:
        cfg = json.loads(text)
    except ValueError as exc:
        raise Refused(f"Failed to parse GlobalResourceConfig json: {exc}") from None
    if not isinstance(cfg, dict):
        raise Refused("GlobalResourceConfig must be a JSON object.")
    streams, unfold = None, None
    nested = cfg.get("fabric_memory")
    if isinstance(nested, dict):
        streams, unfold = _fabric_memory(nested, "")
    top_streams, top_unfold = _fabric_memory(cfg, "fabric_memory.")
    streams = top_streams if top_streams is not None else streams
    unfold = top_unfold if top_unfold is not None else unfold
    if (unfold is None or unfold) and streams is not None and streams != 1:
        raise Refused(f"aicpu_unfold mode only supports fabric_memory.task_stream_num=1, got {streams}")
    _json_int(cfg, "connect_pool.thread_num", 1, 64)
    _json_int(cfg, "connect_pool.task_queue_capacity", 1, 65535)
    desc = cfg.get("comm_resource_config.protocol_desc", "")
    if not isinstance(desc, str) and not (isinstance(desc, list) and all(isinstance(d, str) for d in desc)):
        raise Refused("comm_resource_config.protocol_desc must be a string or a list of strings")
    _json_int(cfg, "comm_resource_config.listen_port", 1, 65535)
    _json_int(cfg, "comm_resource_config.qos", 0, 7)
    _json_int(cfg, "comm_resource_config.max_active_channels", 1, 2**32 - 1)
    path = cfg.get("local_comm_res_path")
    if path is not None and (not isinstance(path, str) or not path):
        raise Refused("local_comm_res_path must be a non-empty file path")
    return cfg


def _read_local_comm_res(path: str) -> str:
    """hixl_options.cc ResolveLocalCommResFromFile: a regular file of 1 byte to 1 MiB, opened without following a
    symbolic link at its last component (after ``realpath``)."""
    resolved = os.path.realpath(path)
    try:
        fd = os.open(resolved, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as exc:
        raise Refused(f"local_comm_res_path {path!r}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"local_comm_res_path must reference a regular file, path:{resolved}")
        if not 0 < st.st_size <= _MAX_LOCAL_COMM_RES_FILE:
            raise Refused(f"local_comm_res_path file size {st.st_size} is not in [1, {_MAX_LOCAL_COMM_RES_FILE}]")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read().decode("utf-8", "replace")
    finally:
        os.close(fd)


def parse_options(options: Mapping[str, str], env: Optional[Mapping[str, str]] = None) -> HixlOptions:
    """The options as HIXL checks them (see the module doc); ``Refused`` saying why otherwise."""
    env = os.environ if env is None else env
    traffic_class = _rdma(options, RDMA_TRAFFIC_CLASS, "HCCL_RDMA_TC", env)
    service_level = _rdma(options, RDMA_SERVICE_LEVEL, "HCCL_RDMA_SL", env)
    local_comm_res = _either(options, LOCAL_COMM_RES)
    fabric = options.get(ENABLE_USE_FABRIC_MEM, "")
    if fabric and _to_number(fabric, _UINT32, ENABLE_USE_FABRIC_MEM) not in (0, 1):
        raise Refused(f"{ENABLE_USE_FABRIC_MEM} is invalid, should be zero or one.")
    auto_connect = False
    if AUTO_CONNECT in options:
        text = options[AUTO_CONNECT]
        if not text:
            raise Refused(f"{AUTO_CONNECT} value is empty, should be zero or one.")
        value = _to_number(text, _UINT32, AUTO_CONNECT)
        if value not in (0, 1):
            raise Refused(f"{AUTO_CONNECT} is invalid, should be zero or one.")
        auto_connect = value == 1
    cfg: Dict[str, Any] = {}
    if options.get(GLOBAL_RESOURCE_CONFIG):
        cfg = _global_resource_config(options[GLOBAL_RESOURCE_CONFIG])
    if cfg.get("local_comm_res_path") and not local_comm_res:
        local_comm_res = _read_local_comm_res(cfg["local_comm_res_path"])
    if local_comm_res:   # engine_factory.cc parses it to choose an engine: invalid JSON is refused
        try:
            json.loads(local_comm_res)
        except ValueError as exc:
            raise Refused(f"LocalCommRes is not valid JSON: {exc}") from None
    for key in options:
        if key not in _SUPPORTED:
            raise Refused(f"Unsupported option '{key}' for this engine")
    pool = _either(options, BUFFER_POOL)
    if pool is not None and pool != _BUFFER_POOL_DISABLED:
        raise Refused(f"Invalid option fields, OPTION_BUFFER_POOL for hixl engine only supports "
                      f"{_BUFFER_POOL_DISABLED}")
    threads = _json_int(cfg, "connect_pool.thread_num", 1, 64)   # (checked already: a string may hold the number)
    queue = _json_int(cfg, "connect_pool.task_queue_capacity", 1, 65535)
    return HixlOptions(auto_connect=auto_connect, rdma_traffic_class=traffic_class, rdma_service_level=service_level,
                       connect_threads=DEFAULT_CONNECT_THREADS if threads is None else threads,
                       connect_queue=DEFAULT_CONNECT_QUEUE if queue is None else queue,
                       daemon=options.get(DAEMON_OPTION) or None)
