"""A worker can register only its own memory: never another process's (by pid or /proc path)."""

from __future__ import annotations

import ctypes
import os

import grpc
import numpy as np
import pytest

from datadist.status import LLMStatusCode
from datadist.v1 import common_pb2, datadist_pb2, datadist_pb2_grpc


def code_of(err: grpc.RpcError) -> int:
    return int(dict(err.trailing_metadata())["datadist-status-code"])


@pytest.fixture
def stub(daemon_factory):
    d = daemon_factory()
    with grpc.insecure_channel(d.target) as ch:
        yield datadist_pb2_grpc.DataDistStub(ch)


def init(stub, cluster: int, pid: int) -> datadist_pb2.InitResponse:  # noqa: ANN001
    return stub.Init(datadist_pb2.InitRequest(cluster_id=cluster, role=common_pb2.ROLE_DECODER, pid=pid,
                                              options={"llm.EnableCacheManager": "1"}), timeout=10)


def register(stub, engine_id: int, memory: datadist_pb2.WorkerMemory):  # noqa: ANN001, ANN201
    desc = common_pb2.CacheDesc(num_tensors=1, shape=[4, 16], data_type=4, placement=common_pb2.PLACEMENT_DEVICE)
    return stub.RegisterCache(datadist_pb2.RegisterCacheRequest(engine_id=engine_id, desc=desc, is_blocks=True,
                                                                tensors=[memory]), timeout=10)


def test_unproven_pid_cannot_register_process_memory(stub) -> None:
    buf = np.zeros(64, np.uint8)
    resp = init(stub, 1, os.getpid())
    mem = datadist_pb2.WorkerMemory(process=datadist_pb2.ProcessMemory(pid=os.getpid(), address=buf.ctypes.data,
                                                                       length=64))
    with pytest.raises(grpc.RpcError) as info:  # no ProvePid yet
        register(stub, resp.engine_id, mem)
    assert code_of(info.value) == LLMStatusCode.LLM_PARAM_INVALID
    # prove it: the challenge sits in our memory
    proof = ctypes.create_string_buffer(resp.pid_challenge, len(resp.pid_challenge))
    stub.ProvePid(datadist_pb2.ProvePidRequest(engine_id=resp.engine_id, address=ctypes.addressof(proof)), timeout=10)
    assert register(stub, resp.engine_id, mem).cache_id == 1


def test_claiming_another_pid_fails_the_proof(stub) -> None:
    resp = init(stub, 2, 1)  # claims to be pid 1 (init)
    proof = ctypes.create_string_buffer(resp.pid_challenge, len(resp.pid_challenge))
    with pytest.raises(grpc.RpcError) as info:
        stub.ProvePid(datadist_pb2.ProvePidRequest(engine_id=resp.engine_id, address=ctypes.addressof(proof)),
                      timeout=10)
    assert code_of(info.value) == LLMStatusCode.LLM_PARAM_INVALID
    mem = datadist_pb2.WorkerMemory(process=datadist_pb2.ProcessMemory(pid=1, address=0x400000, length=64))
    with pytest.raises(grpc.RpcError) as info:
        register(stub, resp.engine_id, mem)
    assert code_of(info.value) == LLMStatusCode.LLM_PARAM_INVALID


def test_other_process_proc_path_is_refused(stub) -> None:
    resp = init(stub, 3, os.getpid())
    proof = ctypes.create_string_buffer(resp.pid_challenge, len(resp.pid_challenge))
    stub.ProvePid(datadist_pb2.ProvePidRequest(engine_id=resp.engine_id, address=ctypes.addressof(proof)), timeout=10)
    mem = datadist_pb2.WorkerMemory(shared_file=datadist_pb2.SharedFileMemory(path="/proc/1/fd/0", file_offset=0,
                                                                              length=64))
    with pytest.raises(grpc.RpcError) as info:
        register(stub, resp.engine_id, mem)
    assert code_of(info.value) == LLMStatusCode.LLM_PARAM_INVALID
    assert "process 1" in info.value.details()
