"""Worker-side operations of the daemon's HIXL calls (``worker.call("run", "tests.integration.extent_ops", ...)``):
``TransferExtents``, ``SendNotify`` and ``GetNotifies`` sent as the clients send them, on memory registered with
the worker ops (``tests.worker_ops.register_cache``: one uint8 tensor of one row a registration, shape [1, len], as
the clients register HIXL's ``RegisterMem``)."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

import llm_datadist as ld
from datadist.v1 import datadist_pb2
from tests.worker_ops import NpuTensor, _addr, _load


def base(state: dict, name: str) -> int:
    """The address of registration ``name`` in this worker."""
    return _addr(state["arrays"][name][0])


def put(state: dict, name: str, offset: int, data: bytes) -> None:
    """Bytes into registration ``name`` (NPU memory on an acl plane: loaded, changed, stored by aclrtMemcpy)."""
    tensor = state["arrays"][name][0]
    arr = _load(tensor).copy() if isinstance(tensor, NpuTensor) else tensor
    arr.reshape(-1)[offset:offset + len(data)] = np.frombuffer(data, np.uint8)
    if isinstance(tensor, NpuTensor):
        tensor.store(arr)


def get(state: dict, name: str, offset: int = 0, n: int = -1) -> bytes:
    arr = _load(state["arrays"][name][0]).reshape(-1)
    return arr[offset:offset + n if n >= 0 else None].tobytes()


def extents(state: dict, remote_cluster: int, write: bool, rows: list, timeout_ms: int | None = None) -> str:
    """One ``TransferExtents`` of ``rows`` (local_addr, remote_addr, len); "LLM_SUCCESS" or the code's name."""
    raw = b"".join(struct.pack("<QQQ", *r) for r in rows)
    request = datadist_pb2.ExtentTransferRequest(engine_id=state["dd"]._engine_id, remote_cluster_id=remote_cluster,
                                                 write=write, extents=raw, timeout_ms=timeout_ms)
    return _outcome(state, "TransferExtents", request)


def notify(state: dict, remote_cluster: int, name: bytes, msg: bytes) -> str:
    request = datadist_pb2.NotifyRequest(engine_id=state["dd"]._engine_id, remote_cluster_id=remote_cluster,
                                         name=name, msg=msg)
    return _outcome(state, "SendNotify", request)


def notifies(state: dict) -> list:
    reply = state["dd"]._call("GetNotifies", datadist_pb2.EngineRef(engine_id=state["dd"]._engine_id), "GetNotifies")
    return [(n.name, n.msg) for n in reply.notifies]


def _outcome(state: dict, method: str, request: Any) -> str:
    try:
        state["dd"]._call(method, request, method)
    except ld.LLMException as exc:
        return exc.status_code.name
    return "LLM_SUCCESS"


def withdraw(state: dict, name: str) -> None:
    """Unregister registration ``name`` (HIXL's ``DeregisterMem``); the memory stays in this worker."""
    state["dd"].cache_manager.unregister_cache(state["caches"].pop(name).cache_id)
