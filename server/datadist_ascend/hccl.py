"""``Hccl``: the one-sided HCCL calls of CANN's LLM-DataDist (``libhcomm.so``, ``libhccl.so`` before it).

Call order per link (LLM-DataDist ``link_mgr/comm_entity.cc``): ``HcclCommInitClusterInfoMemConfig`` on a
two-rank cluster table -> ``HcclCommBindMem`` of every ``HcclRegisterGlobalMem``'d range -> ``HcclCommPrepare``
(both ranks; ``link_retry_count`` tries sharing ``link_total_time``) -> ``HcclBatchPut`` / ``HcclBatchGet`` on a
stream, then ``aclrtSynchronizeStreamWithTimeout``; teardown ``HcclCommUnbindMem`` each, ``HcclCommDestroy``.
"""

from __future__ import annotations

import ctypes
import math
from ctypes import POINTER, Structure, c_char, c_int, c_int32, c_uint32, c_uint64, c_void_p

import numpy as np
from numpy.typing import ArrayLike

from datadist.status import LLMStatusCode

from .errors import AscendError, hccl_status
from .loader import find_library, once

__all__ = ["Hccl", "hccl", "CommConfig", "CommMem", "OneSideOpDesc", "PrepareConfig", "MEM_DEVICE", "MEM_HOST",
           "DATA_TYPE_UINT8", "CONFIG_NOT_SET", "LIBRARIES", "DESC_DTYPE", "DESCS_PER_CALL", "descriptors",
           "prepare_seconds"]

#: CANN 8.2+ ships the one-sided calls in libhcomm.so (LLM-DataDist dlopens it); older releases in libhccl.so
LIBRARIES = ("libhcomm.so", "libhccl.so")

# hccl_types.h
COMM_CONFIG_INFO_BYTES, COMM_NAME_MAX_LENGTH, UDI_MAX_LENGTH = 24, 128, 128
COMM_CONFIG_MAGIC_WORD = 0xF0F0F0F0
COMM_CONFIG_VERSION = 5              # what LLM-DataDist's CommAdapter::DlHcclCommConfigInit writes
COMM_DEFAULT_BUFFSIZE = 200
CONFIG_NOT_SET = 0xFFFFFFFF          # traffic class / service level the user did not set
DATA_TYPE_UINT8 = 7
# hcomm_res_defs.h CommMemType
MEM_DEVICE, MEM_HOST = 0, 1
HCCL_SUCCESS = 0
#: descriptors per ``HcclBatchPut``/``HcclBatchGet`` call: hcomm refuses more than 256 (``MAX_DESC_NUM``, 64 on its
#: V2 path) with HCCL_E_PARA; LLM-DataDist sends 64 per call (``comm_entity.cc`` ``kMaxOpDescNum``), so does datadist
DESCS_PER_CALL = 64


class CommConfig(Structure):
    """``HcclCommConfig`` (hccl_types.h); the first 24 bytes are ``{size_t size; u32 magic; u32 version; u64 0}``."""

    _fields_ = [("reserved", c_char * COMM_CONFIG_INFO_BYTES), ("hcclBufferSize", c_uint32),
                ("hcclDeterministic", c_uint32), ("hcclCommName", c_char * COMM_NAME_MAX_LENGTH),
                ("hcclUdi", c_char * UDI_MAX_LENGTH), ("hcclOpExpansionMode", c_uint32),
                ("hcclRdmaTrafficClass", c_uint32), ("hcclRdmaServiceLevel", c_uint32),
                ("hcclWorldRankID", c_uint32), ("hcclJobID", c_uint64)]

    @classmethod
    def make(cls, name: str, traffic_class: int | None = None, service_level: int | None = None) -> "CommConfig":
        """As ``DlHcclCommConfigInit``, then the communicator's name and the RDMA options the user set."""
        cfg = cls()
        header = ctypes.c_size_t(ctypes.sizeof(cls)).value.to_bytes(8, "little") + \
            COMM_CONFIG_MAGIC_WORD.to_bytes(4, "little") + COMM_CONFIG_VERSION.to_bytes(4, "little") + bytes(8)
        ctypes.memmove(ctypes.addressof(cfg), header, COMM_CONFIG_INFO_BYTES)
        cfg.hcclBufferSize = COMM_DEFAULT_BUFFSIZE
        encoded = name.encode()
        if not encoded or len(encoded) >= COMM_NAME_MAX_LENGTH:
            raise ValueError(f"communicator name must be 1..{COMM_NAME_MAX_LENGTH - 1} bytes")
        cfg.hcclCommName = encoded
        cfg.hcclRdmaTrafficClass = CONFIG_NOT_SET if traffic_class is None else traffic_class
        cfg.hcclRdmaServiceLevel = CONFIG_NOT_SET if service_level is None else service_level
        return cfg


class CommMem(Structure):
    _fields_ = [("type", c_int), ("addr", c_void_p), ("size", c_uint64)]


class OneSideOpDesc(Structure):
    _fields_ = [("localAddr", c_void_p), ("remoteAddr", c_void_p), ("count", c_uint64), ("dataType", c_int)]


class PrepareConfig(Structure):
    _fields_ = [("topoType", c_int), ("rsvd0", c_uint64), ("rsvd1", c_uint64), ("rsvd2", c_uint64)]


_PROTOTYPES: dict[str, list] = {
    "HcclCommInitClusterInfoMemConfig": [ctypes.c_char_p, c_uint32, POINTER(CommConfig), POINTER(c_void_p)],
    "HcclCommDestroy": [c_void_p],
    "HcclRegisterGlobalMem": [POINTER(CommMem), POINTER(c_void_p)],
    "HcclDeregisterGlobalMem": [c_void_p],
    "HcclCommBindMem": [c_void_p, c_void_p],
    "HcclCommUnbindMem": [c_void_p, c_void_p],
    "HcclCommPrepare": [c_void_p, POINTER(PrepareConfig), c_int32],
    "HcclBatchPut": [c_void_p, c_uint32, POINTER(OneSideOpDesc), c_uint32, c_void_p],
    "HcclBatchGet": [c_void_p, c_uint32, POINTER(OneSideOpDesc), c_uint32, c_void_p],
}


class Hccl:
    def __init__(self) -> None:
        lib = find_library(*LIBRARIES)
        self._fn = {}
        for name, args in _PROTOTYPES.items():
            fn = getattr(lib, name, None)
            if fn is None:
                raise AscendError(name, 5, LLMStatusCode.LLM_FEATURE_NOT_ENABLED,
                                  "this HCCL has no one-sided API (CANN 8.0.RC3 or newer needed)")
            fn.argtypes = args
            fn.restype = c_int   # HcclResult
            self._fn[name] = fn

    def _call(self, name: str, *args: object, default: LLMStatusCode = LLMStatusCode.LLM_FAILED) -> None:
        code = self._fn[name](*args)
        if code != HCCL_SUCCESS:
            raise AscendError(name, code, hccl_status(code, default))

    def init_comm(self, cluster_info: str, rank: int, config: CommConfig) -> int:
        comm = c_void_p()
        self._call("HcclCommInitClusterInfoMemConfig", cluster_info.encode(), rank, ctypes.byref(config),
                   ctypes.byref(comm), default=LLMStatusCode.LLM_LINK_FAILED)
        return int(comm.value or 0)

    def destroy(self, comm: int) -> None:
        self._call("HcclCommDestroy", c_void_p(comm), default=LLMStatusCode.LLM_UNLINK_FAILED)

    def register(self, kind: int, addr: int, size: int) -> int:
        mem = CommMem(kind, c_void_p(addr), size)
        handle = c_void_p()
        self._call("HcclRegisterGlobalMem", ctypes.byref(mem), ctypes.byref(handle))
        return int(handle.value or 0)

    def deregister(self, handle: int) -> None:
        self._call("HcclDeregisterGlobalMem", c_void_p(handle))

    def bind(self, comm: int, handle: int) -> None:
        self._call("HcclCommBindMem", c_void_p(comm), c_void_p(handle), default=LLMStatusCode.LLM_LINK_FAILED)

    def unbind(self, comm: int, handle: int) -> None:
        self._call("HcclCommUnbindMem", c_void_p(comm), c_void_p(handle), default=LLMStatusCode.LLM_UNLINK_FAILED)

    def prepare(self, comm: int, timeout_s: int) -> None:
        """``HcclCommPrepare`` waiting at most ``timeout_s`` SECONDS (hccl_one_sided_services.h: -1 for ever, 0 the
        default connect timeout; callers holding milliseconds round up, as LLM-DataDist does: ``prepare_seconds``)."""
        cfg = PrepareConfig()
        self._call("HcclCommPrepare", c_void_p(comm), ctypes.byref(cfg), int(timeout_s),
                   default=LLMStatusCode.LLM_LINK_FAILED)

    def batch(self, put: bool, comm: int, remote_rank: int, local: ArrayLike, remote: ArrayLike,
              lengths: ArrayLike, stream: int) -> None:
        """``HcclBatchPut`` (``put``) or ``HcclBatchGet`` of ``len(lengths)`` byte ranges, enqueued on ``stream``
        ``DESCS_PER_CALL`` descriptors per call (one array filled by numpy, ``descriptors``). Raises at the first
        failing call -- descriptors enqueued before it stay queued: the caller aborts the stream."""
        descs = descriptors(local, remote, lengths)
        fn = "HcclBatchPut" if put else "HcclBatchGet"
        base = descs.ctypes.data
        for at in range(0, len(descs), DESCS_PER_CALL):
            n = min(DESCS_PER_CALL, len(descs) - at)
            self._call(fn, c_void_p(comm), remote_rank,
                       ctypes.cast(base + at * descs.itemsize, POINTER(OneSideOpDesc)), n, c_void_p(stream))


#: ``OneSideOpDesc`` as a numpy record (same offsets and size): an array of it is an ``OneSideOpDesc[n]``
DESC_DTYPE = np.dtype({"names": ["localAddr", "remoteAddr", "count", "dataType"],
                       "formats": ["<u8", "<u8", "<u8", "<i4"],
                       "offsets": [OneSideOpDesc.localAddr.offset, OneSideOpDesc.remoteAddr.offset,
                                   OneSideOpDesc.count.offset, OneSideOpDesc.dataType.offset],
                       "itemsize": ctypes.sizeof(OneSideOpDesc)})


def prepare_seconds(total_ms: float, retries: int) -> int:
    """Seconds for each of ``retries`` ``HcclCommPrepare`` tries sharing ``total_ms`` milliseconds: rounded up
    (LLM-DataDist ``link_msg_handler.cc``), never 0 (which would mean HCCL's default connect timeout)."""
    return max(1, math.ceil(total_ms / max(1, retries) / 1000))


def descriptors(local: ArrayLike, remote: ArrayLike, lengths: ArrayLike) -> np.ndarray:
    """``OneSideOpDesc`` of the byte ranges ``lengths[i]`` at ``local[i]`` / ``remote[i]`` (``uint8`` data), as a
    ``DESC_DTYPE`` array (``lengths`` may be one number for all); the array must outlive the call it is passed to."""
    local_a = np.asarray(local, dtype=np.uint64).reshape(-1)
    descs = np.empty(len(local_a), DESC_DTYPE)
    descs["localAddr"] = local_a
    descs["remoteAddr"] = np.asarray(remote, dtype=np.uint64).reshape(-1)
    descs["count"] = np.asarray(lengths, dtype=np.uint64)
    descs["dataType"] = DATA_TYPE_UINT8
    return descs


#: the process's ``Hccl`` (loaded on first use)
hccl = once(Hccl)


assert ctypes.sizeof(CommConfig) == 312, "HcclCommConfig layout"

