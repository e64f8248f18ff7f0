"""The attach connection's binary pull/push frames (protocol 3) against a real daemon: a pull moves the exact bytes,
and what a worker can send wrong -- a truncated frame, a frame naming another worker's engine, a block count past
the datagram cap, a frame before hello, descriptors riding along -- gets the protobuf path's codes (with the
request id) or, for a frame too short to name one, the connection dropped; the daemon serves on."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

import llm_datadist as ld
from datadist import fastframe as ff
from datadist.status import LLMStatusCode
from datadist.v1 import attach_pb2, datadist_pb2
from llm_datadist._attach import AttachClient
from tests.daemonproc import free_port

from .test_local import Worker, attach_ask

pytestmark = pytest.mark.integration


def raw_attach(daemon, hello: bool = True) -> socket.socket:  # noqa: ANN001
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(10)
    s.connect(daemon.socket + ".attach")
    if hello:
        assert attach_ask(s, attach_pb2.AttachRequest(hello=attach_pb2.AttachHello(
            protocol_version=3)).SerializeToString(), []).welcome.protocol_version == 3
    return s


def ask(s: socket.socket, payload: bytes, fds: list[int] = ()) -> ff.FrameReply:  # noqa: B006
    socket.send_fds(s, [payload], list(fds))
    return ff.decode_reply(s.recv(1 << 16))


def frame(engine: int, remote: tuple[int, ...] = (0,), local: tuple[int, ...] = (0,),
          op: int = ff.PULL) -> ff.TransferFrame:
    return ff.TransferFrame(op, engine, ff.KIND_BLOCKS, ff.KEY_BLOCKS, (9, 0, 0, 0), 1, remote, local)


N = 8192   # blocks of 64 bytes: enough for a pull whose block lists do not fit one attach datagram
PROMPT = f"""
N = {N}
import sys, numpy as np, llm_datadist as ld
cfg = ld.LLMConfig(); cfg.device_id = 0; cfg.enable_cache_manager = True; cfg.enable_remote_cache_accessible = True
cfg.listen_ip_info = f"127.0.0.1:{{sys.argv[1]}}"
dd = ld.LLMDataDist(ld.LLMRole.PROMPT, 1)
dd.init(cfg.generate_options())
kv = (np.arange(N) % 251 + 1).astype(np.uint8).repeat(64).reshape(N, 64)
dd.cache_manager.register_blocks_cache(ld.CacheDesc(1, [N, 64], ld.DataType.DT_UINT8), [kv.ctypes.data],
                                       ld.BlocksCacheKey(1, 0))
print("ready", flush=True)
sys.stdin.readline()
dd.finalize()
"""


def test_a_binary_pull_moves_the_exact_bytes(daemon, monkeypatch):
    """Two engines of one daemon (a same-daemon link): this process's decoder pulls with one binary frame each
    way, and every block lands where it was asked to; block lists past one datagram go as the gRPC call."""
    sent: list[ff.TransferFrame] = []
    real = AttachClient.transfer

    def spy(self, f, func, timeout):  # noqa: ANN001, ANN202
        assert self.protocol == 3
        sent.append(f)
        return real(self, f, func, timeout)
    monkeypatch.setattr(AttachClient, "transfer", spy)
    monkeypatch.setenv("DATADIST_DAEMON", daemon.target)
    monkeypatch.delenv("DATADIST_LOCAL_TRANSFERS", raising=False)
    port = free_port()
    prompt = subprocess.Popen([sys.executable, "-c", PROMPT, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "DATADIST_DAEMON": daemon.target})
    dd = None
    try:
        assert prompt.stdout is not None and prompt.stdout.readline().strip() == "ready"
        cfg = ld.LLMConfig()
        cfg.device_id = 0
        cfg.enable_cache_manager = True
        cfg.enable_remote_cache_accessible = True
        dd = ld.LLMDataDist(ld.LLMRole.DECODER, 2)
        dd.init(cfg.generate_options())
        kv = np.zeros((N, 64), np.uint8)
        cache = dd.cache_manager.register_blocks_cache(ld.CacheDesc(1, [N, 64], ld.DataType.DT_UINT8),
                                                       [kv.ctypes.data], ld.BlocksCacheKey(2, 0))
        info = ld.LLMClusterInfo()
        info.remote_cluster_id = 1
        info.append_local_ip_info("127.0.0.1", 0)
        info.append_remote_ip_info("127.0.0.1", port)
        code, _ = dd.link_clusters([info], 5000)
        assert int(code) == 0
        dd.cache_manager.pull_blocks(ld.BlocksCacheKey(1, 0), cache, [5, 0, 7], [1, 6, 2])
        expected = np.zeros((N, 64), np.uint8)
        expected[[1, 6, 2]] = np.array([6, 1, 8], np.uint8)[:, None]
        assert (kv == expected).all()
        assert [(f.op, f.remote_blocks, f.local_blocks) for f in sent] == [(ff.PULL, (5, 0, 7), (1, 6, 2))]
        src = list(range(N - 1, N - 5001, -1))
        dst = list(range(5000))
        assert not ff.blocks_fit(src, dst)
        dd.cache_manager.pull_blocks(ld.BlocksCacheKey(1, 0), cache, src, dst)
        assert len(sent) == 1                                  # not a frame: the gRPC call
        assert (kv[:5000, 0] == (np.array(src) % 251 + 1)).all() and (kv[:5000] == kv[:5000, :1]).all()
    finally:
        if dd is not None:
            dd.finalize()
        prompt.communicate("\n", timeout=30)


def test_a_frame_before_hello_is_refused_with_its_request_id(daemon):
    s = raw_attach(daemon, hello=False)
    try:
        reply = ask(s, ff.encode_request(41, frame(1)))
        assert (reply.request_id, reply.status) == (41, LLMStatusCode.LLM_PARAM_INVALID) and "hello" in reply.message
    finally:
        s.close()


def test_a_frame_naming_another_workers_engine_gets_what_protobuf_gets(daemon):
    victim, intruder = Worker(daemon), Worker(daemon)
    try:
        engine = victim.init(1)
        s = raw_attach(daemon)
        try:
            for op in (ff.PULL, ff.PUSH):
                reply = ask(s, ff.encode_request(7, frame(engine, op=op)))
                assert (reply.request_id, reply.status) == (7, LLMStatusCode.LLM_ENGINE_FINALIZED)
                msg = datadist_pb2.TransferRequest(engine_id=engine, kind=datadist_pb2.TRANSFER_BLOCKS,
                                                   local_cache_id=1, remote_blocks=[0], local_blocks=[0])
                request = (attach_pb2.AttachRequest(request_id=8, push=msg) if op == ff.PUSH
                           else attach_pb2.AttachRequest(request_id=8, pull=msg))
                old = attach_ask(s, request.SerializeToString(), [])
                assert (old.request_id, old.status, old.message) == (8, reply.status, reply.message)
        finally:
            s.close()
    finally:
        victim.close()
        intruder.close()


def test_malformed_frames_are_answered_or_dropped_and_the_daemon_serves_on(daemon):
    victim = Worker(daemon)
    try:
        engine = victim.init(1)
        s = raw_attach(daemon)
        try:
            good = ff.encode_request(5, frame(engine))
            for bad in (good[:-1], good[:20], good + b"\0" * 8):                   # truncated, padded
                reply = ask(s, bad)
                assert (reply.request_id, reply.status) == (5, LLMStatusCode.LLM_PARAM_INVALID), reply
            claims = bytearray(good)                                             # a count past any datagram
            claims[136:140] = (2**32 - 1).to_bytes(4, "little")
            reply = ask(s, bytes(claims))
            assert (reply.request_id, reply.status) == (5, LLMStatusCode.LLM_PARAM_INVALID)
            huge = ff.encode_request(6, frame(engine, tuple(range(9000)), tuple(range(9000))))
            assert len(huge) > ff.MAX_DATAGRAM
            reply = ask(s, huge)                                                 # cut by the kernel at the cap
            assert (reply.request_id, reply.status) == (6, LLMStatusCode.LLM_PARAM_INVALID)
            assert "at most" in reply.message
            r, w = os.pipe()
            try:
                reply = ask(s, good, [r])
                assert reply.status == LLMStatusCode.LLM_PARAM_INVALID and "no descriptors" in reply.message
            finally:
                os.close(r)
                os.close(w)
            reply = ask(s, good)          # the connection still serves: past decoding, to the ownership check
            assert (reply.request_id, reply.status) == (5, LLMStatusCode.LLM_ENGINE_FINALIZED)
            s.send(b"\xff" * 10)          # too short to name a request: dropped
            assert s.recv(1 << 16) == b""
        finally:
            s.close()
        assert victim.attach.protocol == 3 and daemon.proc.poll() is None
    finally:
        victim.close()

