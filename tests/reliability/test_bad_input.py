"""Bad input: every RPC of both services fed hostile protobuf messages, and every owner call a peer sends as a
frame on its data channel fed hostile ``ownerwire`` frames, straight to a running daemon.

Hypothesis draws messages from the descriptors of the request types (fields missing or set, huge and
negative numbers, unknown enum values, ids that exist next to ids that do not, mismatched lists),
biased towards the ids of a real context (engines, caches, a link, a link nonce) so the checks
behind the first lookup are reached too; owner-call frames are valid ones with fields set to edge values,
bodies overwritten, cut or grown, and ops no daemon knows. The daemon must answer every one with a status carrying a
datadist status code (never UNKNOWN/INTERNAL, never a hang or a crash), serve a legitimate request
correctly afterwards, and end with its engines, open fds, threads and RSS back at the baseline.
Examples per RPC: ``DATADIST_FUZZ_EXAMPLES`` (default 30; more for a longer hunt), derandomized (same run every time).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import grpc
import numpy as np
import pytest
from google.protobuf import message_factory
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from datadist.status import LLMStatusCode as S
from datadist.v1 import common_pb2, datadist_pb2, datadist_pb2_grpc, peer_pb2, peer_pb2_grpc
from datadistd.core.types import BlocksKeyRef, CacheKeyRef, ReadMode, RemoteSpec
from datadistd.links.wire import ownerwire
from datadistd.links.wire.ownercalls import CommitWriteCmd, OpenWriteCmd, ReadCmd, ReleaseCmd
from tests.harness import Daemon, free_port
from tests.reliability.common import (
    Buffer,
    CallFailed,
    PeerAgent,
    blocks_key,
    code_of,
    fd_count,
    hand_over,
    map_tensors,
    rss_kib,
    status,
    stub,
    thread_count,
    wait_until,
    with_capability,
)

pytestmark = pytest.mark.integration

EXAMPLES = int(os.environ.get("DATADIST_FUZZ_EXAMPLES", "30"))
U64MAX = 2**64 - 1
P_CLUSTER, D_CLUSTER, AGENT_CLUSTER = 101, 102, 103
ROWS, ROW_SHAPE = 16, (64,)          # blocks caches: 2 tensors x 16 blocks x 64 float16 (128 bytes per block)
ROW_BYTES = 128
CALL_TIMEOUT = 20.0
NOT_BUGS = (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)

DATADIST = datadist_pb2.DESCRIPTOR.services_by_name["DataDist"]
PEER = peer_pb2.DESCRIPTOR.services_by_name["Peer"]

FUZZ_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                         phases=(Phase.explicit, Phase.generate),
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                HealthCheck.large_base_example])


# ---- a daemon with real engines, caches, a link and a link nonce ----------------------------------

@pytest.fixture(scope="module")
def fuzz_daemon():
    # One malloc arena: glibc gives threads their own arenas, each keeping its high-water mark after
    # frees, so which I/O-pool thread serves a million-block read decided whether RSS stepped up by
    # one round's transient tables (~50 MiB; seen once in CI: 246 -> 301 MiB, while 38 repeated rounds
    # in four other runs stayed within 1 MiB). With one arena freed chunks are reused round after
    # round (measured: 8 rounds, loaded machine, identical RSS), so only a real leak grows.
    d = Daemon("fuzz", env={"DATADISTD_MEMORY_MAX_TOTAL_BYTES": str(64 << 20),
                            "DATADISTD_PEER_HEARTBEAT_SECONDS": "1", "MALLOC_ARENA_MAX": "1"}).start()
    try:
        # warm up every code path once (engines, pools, listeners, a link, a peer), then take the baseline
        for _ in range(2):
            ctx = Ctx.build(d)
            legit_roundtrip(d)
            ctx.close()
        time.sleep(1.0)
        d.baseline = {"fds": fd_count(d.proc.pid), "rss": rss_kib(d.proc.pid), "threads": thread_count(d.proc.pid)}
        yield d
    finally:
        d.discard()


def _options(port: int | None, role: str) -> dict[str, str]:
    opts = {"llm.EnableCacheManager": "1", "llm.EnableRemoteCacheAccessible": "1", "llm.Role": role,
            "llm.MemPoolConfig": '{"memory_size": 8388608, "page_shift": 16}',
            "llm.HostMemPoolConfig": '{"memory_size": 2097152, "page_shift": 16}',
            "llm.SyncKvCacheWaitTime": "2000"}
    if port is not None:
        opts["llm.listenIpInfo"] = f"127.0.0.1:{port}"
    return opts


def _init(s: Any, cluster: int, role: int, port: int | None) -> int:
    resp = s.Init(datadist_pb2.InitRequest(cluster_id=cluster, role=role,
                                           options=_options(port, "Prompt" if role == 1 else "Decoder")), timeout=10)
    return resp.engine_id


def _desc(placement: int = common_pb2.PLACEMENT_DEVICE, rows: int = ROWS) -> common_pb2.CacheDesc:
    return common_pb2.CacheDesc(num_tensors=2, shape=[rows, *ROW_SHAPE], data_type=1, placement=placement)


@dataclass
class Ctx:
    daemon: Any
    port: int
    e1: int = 0
    e2: int = 0
    caches1: list[int] = field(default_factory=list)
    caches2: list[int] = field(default_factory=list)
    buf: Buffer = field(default_factory=lambda: Buffer(1 << 16))
    pool_path: str = ""
    agent: PeerAgent | None = None
    tensors: list[np.ndarray] = field(default_factory=list)   # E1's blocks cache, mapped here
    mine: list[np.ndarray] = field(default_factory=list)      # E2's blocks cache, mapped here

    @classmethod
    def build(cls, daemon: Any) -> "Ctx":
        ctx = cls(daemon, free_port())
        with stub(daemon) as s:
            ctx.e1 = _init(s, P_CLUSTER, common_pb2.ROLE_PROMPT, ctx.port)
            blocks = s.AllocateCache(datadist_pb2.AllocateCacheRequest(
                engine_id=ctx.e1, desc=_desc(), is_blocks=True,
                blocks_key=common_pb2.BlocksCacheKey(cluster_id=P_CLUSTER, model_id=0)), timeout=10)
            ctx.tensors = map_tensors(daemon, ctx.e1, blocks)
            for i, t in enumerate(ctx.tensors):
                t[:] = np.random.default_rng(i).integers(0, 256, t.size, dtype=np.uint8)
            ctx.pool_path = blocks.tensors[0].pool
            cont = s.AllocateCache(datadist_pb2.AllocateCacheRequest(
                engine_id=ctx.e1, desc=_desc(rows=4), cache_keys=[
                    common_pb2.CacheKey(cluster_id=P_CLUSTER, req_id=r, model_id=0, prefix_id=U64MAX)
                    for r in (10, 11)]), timeout=10)
            host = s.AllocateCache(datadist_pb2.AllocateCacheRequest(
                engine_id=ctx.e1, desc=_desc(common_pb2.PLACEMENT_HOST), is_blocks=True), timeout=10)
            mem = [hand_over(daemon, ctx.buf.address + i * ROWS * ROW_BYTES, ROWS * ROW_BYTES) for i in range(2)]
            reg = s.RegisterCache(datadist_pb2.RegisterCacheRequest(
                engine_id=ctx.e1, desc=_desc(), is_blocks=True, tensors=mem, remote_accessible=True,
                blocks_key=common_pb2.BlocksCacheKey(cluster_id=P_CLUSTER, model_id=1)), timeout=10)
            ctx.caches1 = [blocks.cache_id, cont.cache_id, host.cache_id, reg.cache_id]
            ctx.e2 = _init(s, D_CLUSTER, common_pb2.ROLE_DECODER, None)
            mine = s.AllocateCache(datadist_pb2.AllocateCacheRequest(
                engine_id=ctx.e2, desc=_desc(), is_blocks=True,
                blocks_key=common_pb2.BlocksCacheKey(cluster_id=D_CLUSTER, model_id=0)), timeout=10)
            ctx.caches2 = [mine.cache_id]
            ctx.mine = map_tensors(daemon, ctx.e2, mine)
            resp = s.LinkClusters(datadist_pb2.LinkClustersRequest(engine_id=ctx.e2, timeout_ms=3000, clusters=[
                datadist_pb2.ClusterLink(remote_cluster_id=P_CLUSTER, remote_ip_info=[
                    datadist_pb2.IpPort(ip="127.0.0.1", port=ctx.port)])]), timeout=10)
            assert resp.status == 0, resp
        ctx.agent = PeerAgent(f"127.0.0.1:{ctx.port}", AGENT_CLUSTER, P_CLUSTER).handshake(streams=1)
        return ctx

    @property
    def engines(self) -> list[int]:
        return [self.e1, self.e2]

    @property
    def link_nonce(self) -> bytes:
        assert self.agent is not None
        return self.agent.link_nonce

    def legit_pull(self) -> bool:
        """E2 pulls blocks of E1 over their link; the bytes must match. False: the fuzzing removed a piece."""
        with stub(self.daemon) as s:
            try:
                s.Pull(datadist_pb2.TransferRequest(engine_id=self.e2, kind=datadist_pb2.TRANSFER_BLOCKS,
                                                    remote=blocks_key(P_CLUSTER), local_cache_id=self.caches2[0],
                                                    remote_blocks=[7, 2, 3], local_blocks=[9, 11, 12]), timeout=10)
            except grpc.RpcError as err:
                assert err.code() not in NOT_BUGS, err
                return False
        for a, b in zip(self.tensors, self.mine, strict=True):
            np.testing.assert_array_equal(b.reshape(ROWS, ROW_BYTES)[[9, 11, 12]],
                                          a.reshape(ROWS, ROW_BYTES)[[7, 2, 3]])
        return True

    def close(self) -> None:
        if self.agent is not None:
            self.agent.close()
        with stub(self.daemon) as s:
            for engine in (self.e2, self.e1):
                s.Finalize(datadist_pb2.EngineRef(engine_id=engine), timeout=20)
        self.tensors, self.mine = [], []


def legit_roundtrip(daemon: Any) -> None:
    """Two fresh engines, a link and a pull whose bytes are checked: the daemon still works correctly."""
    port = free_port()
    with stub(daemon) as s:
        e1 = _init(s, 201, common_pb2.ROLE_PROMPT, port)
        e2 = _init(s, 202, common_pb2.ROLE_DECODER, None)
        try:
            src = map_tensors(daemon, e1, s.AllocateCache(datadist_pb2.AllocateCacheRequest(
                engine_id=e1, desc=_desc(), is_blocks=True,
                blocks_key=common_pb2.BlocksCacheKey(cluster_id=201, model_id=0)), timeout=10))
            dst_info = s.AllocateCache(datadist_pb2.AllocateCacheRequest(engine_id=e2, desc=_desc(), is_blocks=True),
                                       timeout=10)
            dst = map_tensors(daemon, e2, dst_info)
            for i, t in enumerate(src):
                t[:] = np.random.default_rng(50 + i).integers(0, 256, t.size, dtype=np.uint8)
            resp = s.LinkClusters(datadist_pb2.LinkClustersRequest(engine_id=e2, timeout_ms=3000, clusters=[
                datadist_pb2.ClusterLink(remote_cluster_id=201, remote_ip_info=[
                    datadist_pb2.IpPort(ip="127.0.0.1", port=port)])]), timeout=10)
            assert resp.status == 0, resp
            s.Pull(datadist_pb2.TransferRequest(engine_id=e2, kind=datadist_pb2.TRANSFER_BLOCKS,
                                                remote=blocks_key(201), local_cache_id=dst_info.cache_id,
                                                remote_blocks=[3, 1, 15], local_blocks=[0, 5, 6]), timeout=10)
            for a, b in zip(src, dst, strict=True):
                rows_a, rows_b = a.reshape(ROWS, ROW_BYTES), b.reshape(ROWS, ROW_BYTES)
                np.testing.assert_array_equal(rows_b[[0, 5, 6]], rows_a[[3, 1, 15]])
                assert not rows_b[[1, 2, 3, 4, 7]].any()
        finally:
            for engine in (e2, e1):
                s.Finalize(datadist_pb2.EngineRef(engine_id=engine), timeout=20)


def legit_peer_read(ctx: Ctx) -> None:
    """A fresh authenticated peer reads blocks of E1 and gets exactly its bytes."""
    agent = PeerAgent(f"127.0.0.1:{ctx.port}", AGENT_CLUSTER + 1, P_CLUSTER).handshake(streams=1)
    try:
        buf = Buffer(2 * 2 * ROW_BYTES)
        receipt = agent.expect(buf)
        agent.call(ReadCmd(0, receipt.transfer_id, RemoteSpec(BlocksKeyRef(P_CLUSTER, 0), ReadMode.BLOCKS, (7, 2),
                                                              expected_bytes=buf.size), 3000))
        receipt.wait(time.monotonic() + 10)
        expected = np.stack([t.reshape(ROWS, ROW_BYTES)[[7, 2]] for t in ctx.tensors])
        np.testing.assert_array_equal(buf.array.reshape(2, 2, ROW_BYTES), expected)
    finally:
        agent.close()


# ---- strategies: protobuf messages from their descriptors ----------------------------------------------

INT = {3: (-2**63, 2**63 - 1), 4: (0, U64MAX), 5: (-2**31, 2**31 - 1), 13: (0, 2**32 - 1), 14: (-2**31, 2**31 - 1),
       15: (-2**31, 2**31 - 1), 16: (-2**63, 2**63 - 1), 17: (-2**31, 2**31 - 1), 18: (-2**63, 2**63 - 1),
       6: (0, U64MAX), 7: (0, 2**32 - 1)}
EDGES = [0, 1, 2, 3, 15, 16, 17, 255, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53, 2**62, 2**63 - 1, 2**63,
         U64MAX, -1, -2, -2**31, -2**63]
BLOCKISH = ("blocks", "remote_blocks", "local_blocks", "dst_blocks", "src_block_indices", "dst_block_indices",
            "dst_addrs", "shape", "worker_addrs")
OPTION_KEYS = ["llm.EnableCacheManager", "llm.EnableRemoteCacheAccessible", "llm.listenIpInfo", "llm.MemPoolConfig",
               "llm.HostMemPoolConfig", "llm.SyncKvCacheWaitTime", "llm.LinkTotalTime", "llm.LinkRetryCount",
               "llm.LocalCommRes", "llm.TransferBackend", "ge.flowGraphMemMaxSize", "llm.Role", "llm.ListenIp",
               "ge.exec.deviceId", "datadist.daemon"]
RANK_TABLE = ('{"version": "1.0", "server_count": "1", "server_list": [{"server_id": "s", "device": ['
              '{"device_id": "0", "device_ip": "127.0.0.1", "device_port": "%d", "rank_id": "0"}, '
              '{"device_id": "1", "device_ip": "127.0.0.1", "device_port": "%d", "rank_id": "1"}]}]}')


def _pool(ctx: Ctx, name: str) -> list[Any] | None:
    """Values that mean something to the daemon, by field name (None: no special pool)."""
    caches = ctx.caches1 + ctx.caches2
    pools: dict[str, list[Any]] = {
        "engine_id": ctx.engines + [0, 1, U64MAX, ctx.e1 + 1000],
        "cache_id": caches + [-1, 0, 2**63 - 1, -2**63, 999],
        "local_cache_id": caches + [-1, 0, 999], "src_cache_id": caches + [-1, 0, 999],
        "dst_cache_id": caches + [-1, 999],
        "cluster_id": [P_CLUSTER, D_CLUSTER, AGENT_CLUSTER, 0, U64MAX],
        "remote_cluster_id": [P_CLUSTER, D_CLUSTER, 0, U64MAX], "dst_cluster_id": [P_CLUSTER, D_CLUSTER, 0],
        "client_cluster_id": [AGENT_CLUSTER, P_CLUSTER, 0, U64MAX], "server_cluster_id": [P_CLUSTER, 0, U64MAX],
        "model_id": [0, 1, 2, U64MAX], "req_id": [10, 11, 12, U64MAX, 0], "prefix_id": [U64MAX, 0, 1],
        "batch_index": [0, 1, 3, 4, 2**32 - 1], "local_batch_index": [0, 1, 3, 4, 2**32 - 1],
        "src_batch_index": [0, 1, 4], "dst_batch_index": [0, 1, 4],
        "address": [0, 1, ctx.buf.address, ctx.buf.address + 7, 2**47, U64MAX],
        "addr": [0, ctx.buf.address, U64MAX], "pid": [0, 1, os.getpid(), 999_999, 2**32 - 1],
        "timeout_ms": [0, 1, 100, 1000, 2000],
        "num_tensors": [0, 1, 2, 3, 241, 2**32 - 1], "data_type": [0, 1, 2, 4, 27, 28, 9999, 2**32 - 1],
        "port": [0, 1, ctx.port, 65535, 65536, 2**32 - 1],
        "tensor_num_per_layer": [0, 1, 2, 3, 2**32 - 1], "tensor_start": [0, 1, 2, 2**32 - 1],
        "tensor_count": [0, 1, 2, 3, 2**32 - 1], "expected_bytes": [0, 128, 256, 512, 2**63, U64MAX],
        "size": [-2**63, -2, -1, 0, 1, 128, 129, 2**63 - 1], "offset": [0, 1, 127, 128, U64MAX],
        "length": [0, 1, 2048, 1 << 16, 1 << 17, U64MAX], "file_offset": [0, 1, 4096, 1 << 30, U64MAX],
        "start": [-2**63, -1, 0, 1, 2, 2**62], "stop": [-1, 0, 1, 2, 3, 2**62, 2**63 - 1],
        "ready_layer": [0, 1, 2, 2**32 - 1], "abort_layer": [0, 1, 2**32 - 1],
        "rank": [0, 1, 2, 2**32 - 1], "comm_id": [0, 1, 2, U64MAX],
        "src_block": [0, 1, 15, 16, U64MAX], "transfer_id": [0, 1, 2, U64MAX],
        "dst_block_memory_size": [0, 1, 128, 2**63], "block_size": [0, 1, 128, U64MAX],
        "protocol_version": [0, 1, 2, 2**32 - 1], "timestamp_ms": [0, int(time.time() * 1000), U64MAX],
        "status": [0, -1, 1, 2**63 - 1, -2**63], "command_id": [0, 1, U64MAX], "streams": [0, 1, 64, 65],
        "ip": ["127.0.0.1", "", "::1", "256.1.1.1", "localhost", "1.2.3", "127.0.0.1:80", "\x00"],
        "path": ["", "/etc/passwd", "/dev/shm/../../etc/shadow", "/proc/self/mem", "/proc/1/fd/0",
                 f"/proc/{os.getpid()}/fd/0", ctx.pool_path, ctx.pool_path + "/../x", "/dev/zero", "x" * 5000],
        "comm_name": ["", "c", "comm-a", "x" * 127, "x" * 128, "\x00\xff"],
        "rank_table": ["", "{", "[]", '{"server_list": 5}', RANK_TABLE % (ctx.port, free_port()),
                       RANK_TABLE % (0, 70000), RANK_TABLE.replace("127.0.0.1", "not-an-ip") % (1, 2)],
        "link_nonce": [ctx.link_nonce, b"", os.urandom(16), bytes(16), os.urandom(300)],
    }
    return pools.get(name)


def _option_values(ctx: Ctx) -> list[str]:
    return ["", "0", "1", "-1", "2", "x", "1e9", "99999999999999999999", '{"memory_size": 1048576}',
            '{"memory_size": 1099511627776}', '{"memory_size": -1}', '{"memory_size": 65536, "page_shift": 40}',
            "{", "127.0.0.1:0", f"127.0.0.1:{ctx.port}", "127.0.0.1:65536", "999.1.1.1:80", "[::1]:x", "a:b:c",
            "Prompt", "Decoder", "unix:///nonexistent"]


def _valid(ctx: Ctx, name: str) -> list[Any]:
    """The values of the live context (drawn often, so the checks behind the first lookup are reached)."""
    return {"engine_id": ctx.engines, "link_nonce": [ctx.link_nonce], "cache_id": ctx.caches1 + ctx.caches2,
            "local_cache_id": ctx.caches2 + ctx.caches1[:1], "src_cache_id": ctx.caches1, "dst_cache_id": ctx.caches1,
            "cluster_id": [P_CLUSTER], "remote_cluster_id": [P_CLUSTER], "dst_cluster_id": [P_CLUSTER]}.get(name, [])


# fields that are present in most examples (a request without them stops at the first check)
IMPORTANT = {"engine_id", "link_nonce", "cache_id", "local_cache_id", "src_cache_id", "dst_cache_id", "key", "remote",
             "desc", "role", "kind", "blocks", "remote_blocks", "local_blocks", "start", "targets", "copies",
             "cluster_id", "remote_cluster_id", "expected_bytes", "tensors", "src", "dst", "src_to_dst",
             "members", "rank_table", "comm_name", "clusters", "remote_ip_info", "options"}


def _scalar(ctx: Ctx, f: Any) -> st.SearchStrategy:
    t, name = f.type, f.name
    pool = _pool(ctx, name)
    if t in INT:
        lo, hi = INT[t]
        if f.enum_type is not None:
            known = [v.number for v in f.enum_type.values]
            return st.one_of(st.sampled_from(known), st.sampled_from(known),
                             st.sampled_from([-1, 7, 99, 2**31 - 1, -2**31]))
        fitting = [v for v in (pool or EDGES) if isinstance(v, int) and lo <= v <= hi]
        valid = [v for v in _valid(ctx, name) if lo <= v <= hi]
        if valid:
            return st.one_of(st.sampled_from(valid), st.sampled_from(valid), st.sampled_from(fitting),
                             st.integers(lo, hi))
        return st.one_of(st.sampled_from(fitting), st.integers(lo, hi)) if pool is None else \
            st.one_of(st.sampled_from(fitting), st.sampled_from(fitting), st.integers(lo, hi))
    if t == 8:
        return st.booleans()
    if t in (1, 2):
        return st.floats(allow_nan=True)
    if t == 9:
        strings = [v for v in (pool or []) if isinstance(v, str)]
        base = st.text(max_size=24)
        return st.one_of(st.sampled_from(strings), base) if strings else base
    if t == 12:
        blobs = [v for v in (pool or []) if isinstance(v, bytes)]
        base = st.binary(max_size=48)
        valid = _valid(ctx, name)
        if valid:
            return st.one_of(st.sampled_from(valid), st.sampled_from(valid), st.sampled_from(blobs), base)
        return st.one_of(st.sampled_from(blobs), st.sampled_from(blobs), base) if blobs else base
    raise AssertionError(f"no strategy for field {f.full_name} of type {t}")


@st.composite
def message(draw: Callable, descriptor: Any, ctx: Ctx, depth: int = 0) -> Any:
    msg = message_factory.GetMessageClass(descriptor)()
    chosen_oneofs: dict[str, str | None] = {}
    for oneof in descriptor.oneofs:
        if not oneof.name.startswith("_"):  # proto3 'optional' fields are synthetic oneofs
            chosen_oneofs[oneof.name] = draw(st.sampled_from([None] + [f.name for f in oneof.fields]))
    for f in descriptor.fields:
        oneof = f.containing_oneof
        if oneof is not None and oneof.name in chosen_oneofs:
            if chosen_oneofs[oneof.name] != f.name:
                continue
        elif draw(st.integers(0, 9)) >= (9 if f.name in IMPORTANT else 5):   # a missing field
            continue
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            key_f, value_f = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            if key_f.type == 9:
                keys = st.one_of(st.sampled_from(OPTION_KEYS), st.text(max_size=12))
                values = st.one_of(st.sampled_from(_option_values(ctx)), st.text(max_size=16))
            else:
                keys, values = _scalar(ctx, key_f), _scalar(ctx, value_f)
            getattr(msg, f.name).update(draw(st.dictionaries(keys, values, max_size=6)))
        elif f.message_type is not None:
            if depth >= 4:
                continue
            sub = message(f.message_type, ctx, depth + 1)
            if f.is_repeated:
                for item in draw(st.lists(sub, max_size=3)):
                    getattr(msg, f.name).add().CopyFrom(item)
            else:
                getattr(msg, f.name).CopyFrom(draw(sub))
        elif f.is_repeated:
            size = 48 if f.name in BLOCKISH else 4
            if f.name in BLOCKISH and f.type in INT:
                lo, hi = INT[f.type]
                item = st.one_of(st.integers(max(lo, 0), min(hi, ROWS + 1)),
                                 st.sampled_from([v for v in EDGES if lo <= v <= hi]))
            else:
                item = _scalar(ctx, f)
            getattr(msg, f.name).extend(draw(st.lists(item, max_size=size)))
        else:
            setattr(msg, f.name, draw(_scalar(ctx, f)))
    return msg


def _templates(ctx: Ctx) -> dict[str, Any]:
    """A valid request per RPC: hostile variants change one or two of its fields."""
    e1, e2 = ctx.e1, ctx.e2
    blocks1, cont1, host1, reg1 = ctx.caches1
    (blocks2,) = ctx.caches2
    mem = [datadist_pb2.WorkerMemory(process=datadist_pb2.ProcessMemory(
        pid=os.getpid(), address=ctx.buf.address + 4096 + i * 2048, length=2048)) for i in range(2)]
    transfer = dict(engine_id=e2, kind=datadist_pb2.TRANSFER_BLOCKS, remote=blocks_key(P_CLUSTER),
                    local_cache_id=blocks2, remote_blocks=[1, 2], local_blocks=[3, 4], timeout_ms=2000)
    key10 = common_pb2.AnyKey(cache_key=common_pb2.CacheKey(cluster_id=P_CLUSTER, req_id=10, model_id=0,
                                                            prefix_id=U64MAX))
    return {
        "Init": datadist_pb2.InitRequest(cluster_id=150, role=common_pb2.ROLE_PROMPT, pid=os.getpid(),
                                         options=_options(None, "Prompt")),
        "AllocateCache": datadist_pb2.AllocateCacheRequest(engine_id=e1, desc=_desc(), is_blocks=True),
        "RegisterCache": datadist_pb2.RegisterCacheRequest(engine_id=e1, desc=_desc(), is_blocks=True, tensors=mem),
        "DeallocateCache": datadist_pb2.CacheRef(engine_id=e1, cache_id=cont1),
        "UnregisterCache": datadist_pb2.CacheRef(engine_id=e1, cache_id=reg1),
        "RemoveCacheKey": datadist_pb2.RemoveCacheKeyRequest(engine_id=e1, cache_key=key10.cache_key),
        "CopyCache": datadist_pb2.CopyCacheRequest(engine_id=e1, dst_cache_id=cont1, src_cache_id=cont1,
                                                   dst_batch_index=1, src_batch_index=0, size=-1),
        "CopyBlocks": datadist_pb2.CopyBlocksRequest(engine_id=e1, cache_id=blocks1, copies=[
            datadist_pb2.BlockCopy(src_block=1, dst_blocks=[5, 6])]),
        "SwapBlocks": datadist_pb2.SwapBlocksRequest(engine_id=e1, src=datadist_pb2.CacheOperand(cache_id=blocks1),
                                                     dst=datadist_pb2.CacheOperand(cache_id=host1), src_to_dst={1: 2}),
        "LinkClusters": datadist_pb2.LinkClustersRequest(engine_id=e2, timeout_ms=2000, clusters=[
            datadist_pb2.ClusterLink(remote_cluster_id=P_CLUSTER, remote_ip_info=[
                datadist_pb2.IpPort(ip="127.0.0.1", port=ctx.port)])]),
        "UnlinkClusters": datadist_pb2.UnlinkClustersRequest(engine_id=e2, timeout_ms=2000, clusters=[
            datadist_pb2.ClusterLink(remote_cluster_id=P_CLUSTER, remote_ip_info=[
                datadist_pb2.IpPort(ip="127.0.0.1", port=ctx.port)])]),
        "Link": datadist_pb2.CommLinkRequest(engine_id=e1, comm_name="c", rank_table=RANK_TABLE % (ctx.port, 1),
                                             members=[datadist_pb2.CommMember(cluster_id=P_CLUSTER, rank=0),
                                                      datadist_pb2.CommMember(cluster_id=D_CLUSTER, rank=1)]),
        "Pull": datadist_pb2.TransferRequest(**transfer),
        "Push": datadist_pb2.TransferRequest(**transfer),
        "SetWorkerAddrs": datadist_pb2.WorkerAddrsRequest(engine_id=e1, cache_id=blocks1,
                                                          addrs=[ctx.buf.address, ctx.buf.address + 2048]),
        "CheckLinkStatus": datadist_pb2.LinkStatusRequest(engine_id=e2, remote_cluster_id=P_CLUSTER, timeout_ms=1000),
        "TransferCacheAsync": [
            datadist_pb2.LayerTransferRequest(start=datadist_pb2.LayerTransferStart(
                engine_id=e1, src_cache_id=blocks1, src_block_indices=[1], dst_block_indices=[2], timeout_ms=2000,
                targets=[datadist_pb2.LayerTransferTarget(
                    dst_cluster_id=D_CLUSTER, cache_key=blocks_key(D_CLUSTER),
                    src_layer_range=common_pb2.LayerRange(start=0, stop=1),
                    dst_layer_range=common_pb2.LayerRange(start=0, stop=1))])),
            datadist_pb2.LayerTransferRequest(ready_layer=0)],
        "Handshake": ctx.agent.offer() if ctx.agent is not None else peer_pb2.HandshakeRequest(),
    }


def _graft(msg: Any, other: Any, name: str) -> None:
    """Field ``name`` of ``other`` into ``msg`` (absent in ``other`` -> absent in ``msg``)."""
    f = msg.DESCRIPTOR.fields_by_name[name]
    msg.ClearField(name)
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        getattr(msg, name).update(dict(getattr(other, name)))
    elif f.is_repeated:
        getattr(msg, name).extend(getattr(other, name))
    elif f.message_type is not None or f.has_presence:
        if other.HasField(name):
            field_value = getattr(other, name)
            if f.message_type is not None:
                getattr(msg, name).CopyFrom(field_value)
            else:
                setattr(msg, name, field_value)
    else:
        setattr(msg, name, getattr(other, name))


@st.composite
def mutated(draw: Callable, template: Any, ctx: Ctx) -> Any:
    """The valid ``template`` with one or two fields (top level or one level down) replaced by hostile ones."""
    msg = type(template)()
    msg.CopyFrom(template)
    other = draw(message(template.DESCRIPTOR, ctx))
    names = [f.name for f in template.DESCRIPTOR.fields]
    for name in draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True)):
        f = template.DESCRIPTOR.fields_by_name[name]
        if (f.message_type is not None and not f.is_repeated and msg.HasField(name)
                and draw(st.booleans())):  # go one level down: keep the sub-message, replace one of its fields
            sub, sub_other = getattr(msg, name), draw(message(f.message_type, ctx))
            _graft(sub, sub_other, draw(st.sampled_from([g.name for g in f.message_type.fields])))
        else:
            _graft(msg, other, name)
    return msg


def request_strategy(method: Any, ctx: Ctx) -> st.SearchStrategy:
    template = _templates(ctx).get(method.name)
    if method.client_streaming:
        free = st.lists(message(method.input_type, ctx), min_size=1, max_size=4)
        if template is None:
            return free
        return st.one_of(free, st.builds(lambda first, rest: [first, *rest], mutated(template[0], ctx),
                                         st.lists(message(method.input_type, ctx), max_size=2)),
                         st.just(template))
    free = message(method.input_type, ctx)
    if template is None:
        return free
    return st.one_of(free, mutated(template, ctx), mutated(template, ctx))


# ---- the oracle -------------------------------------------------------------------------------------

@dataclass
class Tally:
    calls: int = 0
    ok: int = 0
    codes: dict[str, int] = field(default_factory=dict)


TALLY: dict[str, Tally] = {}


def judge(method: str, err: grpc.RpcError | None, tally: Tally) -> None:
    tally.calls += 1
    if err is None:
        tally.ok += 1
        return
    grpc_code = err.code()
    llm = code_of(err)
    name = S(llm).name if llm is not None else f"grpc:{grpc_code.name}"
    tally.codes[name] = tally.codes.get(name, 0) + 1
    assert grpc_code not in NOT_BUGS, f"{method}: {grpc_code.name}: {err.details()}"
    assert grpc_code != grpc.StatusCode.DEADLINE_EXCEEDED or llm is not None, f"{method}: no answer (hang?)"
    if grpc_code in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.CANCELLED):
        return
    assert llm is not None, f"{method}: {grpc_code.name} without a datadist status code: {err.details()}"
    assert llm not in (S.LLM_FAILED, S.LLM_UNKNOWN_ERROR), f"{method}: {name}: {err.details()}"


def _cleanup(s: Any, method: str, request: Any, response: Any) -> None:
    """Undo what an accepted request created, so a run of examples does not pile up state."""
    try:
        if method == "Init":
            s.Finalize(datadist_pb2.EngineRef(engine_id=response.engine_id), timeout=20)
        elif method == "AllocateCache":
            s.DeallocateCache(datadist_pb2.CacheRef(engine_id=request.engine_id, cache_id=response.cache_id,
                                                    is_blocks=response.is_blocks), timeout=10)
        elif method == "RegisterCache":
            s.UnregisterCache(datadist_pb2.CacheRef(engine_id=request.engine_id, cache_id=response.cache_id),
                              timeout=10)
        elif method == "Link":
            s.Unlink(datadist_pb2.CommRef(engine_id=request.engine_id, comm_id=response.comm_id), timeout=10)
    except grpc.RpcError:
        pass


def _call_datadist(s: datadist_pb2_grpc.DataDistStub, method: str, request: Any) -> tuple[Any, grpc.RpcError | None]:
    try:
        if method == "TransferCacheAsync":
            return list(s.TransferCacheAsync(iter(request), timeout=CALL_TIMEOUT)), None
        return getattr(s, method)(request, timeout=CALL_TIMEOUT), None
    except grpc.RpcError as err:
        return None, err


def _call_peer(p: peer_pb2_grpc.PeerStub, method: str, request: Any) -> grpc.RpcError | None:
    try:
        getattr(p, method)(request, timeout=CALL_TIMEOUT)
    except grpc.RpcError as err:
        return err
    return None


#: the owner calls a peer sends as CALL frames (``ownerwire``), fuzzed field by field from a valid one: its
#: layout and the frame (unlink and ping end or keep the agent's link: not fuzzed)
def _frame_templates() -> dict[str, tuple[Any, bytes]]:
    spec = RemoteSpec(BlocksKeyRef(P_CLUSTER, 0), ReadMode.BLOCKS, (1, 2), expected_bytes=2 * 2 * ROW_BYTES)
    return {
        "read": (ownerwire.READ, ownerwire.encode_call(ReadCmd(0, 1, spec, 2000))),
        "open_write": (ownerwire.OPEN, ownerwire.encode_call(OpenWriteCmd(0, (spec, spec), 2000))),
        "commit_write": (ownerwire.COMMIT, ownerwire.encode_call(CommitWriteCmd(0, (1,), 500))),
        "release": (ownerwire.RELEASE, ownerwire.encode_call(ReleaseCmd(0, CacheKeyRef(P_CLUSTER, 10, 0, U64MAX),
                                                                        0, 0))),
    }


FRAME_CALLS = sorted(_frame_templates())
#: what each ``struct`` field code may hold
_FIELD_RANGE = {"B": (0, 255), "H": (0, 2**16 - 1), "I": (0, 2**32 - 1), "Q": (0, U64MAX), "q": (-2**63, 2**63 - 1)}
#: byte runs written over a frame's body: counts and lengths at their edges, unknown kinds and modes
_RUNS = [b"\xff\xff\xff\xff", b"\0\0\0\0", b"\x01\0\0\0", b"\0\0\x10\0", b"\x01\0\x10\0", b"\x09", b"\x80",
         b"\xff" * 8]


@st.composite
def hostile_frame(draw: Callable, layout: Any, template: bytes) -> bytes:
    """``template`` with one or two fixed fields set to hostile values (any but the tag, the op and the command id:
    the call stays one the owner answers), its body overwritten, cut or grown -- or with an op no daemon knows."""
    fields = list(layout.unpack_from(template))
    codes = [c for c in layout.format if c.isalpha()]
    free = [i for i in range(2, len(fields)) if i != 4]
    for i in draw(st.lists(st.sampled_from(free), min_size=0, max_size=2, unique=True)):
        lo, hi = _FIELD_RANGE[codes[i]]
        fields[i] = draw(st.one_of(st.sampled_from([v for v in EDGES if lo <= v <= hi] + [ROWS, 1 << 20]),
                                   st.integers(lo, hi)))
    if draw(st.integers(0, 9)) == 0:
        fields[1] = draw(st.sampled_from([0, 9, 99, 255]))
    data = bytearray(layout.pack(*fields) + template[layout.size:])
    head = ownerwire.HEAD.size
    for _ in range(draw(st.integers(0, 3))):
        if len(data) > head:
            at = draw(st.integers(head, len(data) - 1))
            data[at:at + 8] = draw(st.sampled_from(_RUNS))[:8]
    if draw(st.booleans()):
        del data[draw(st.integers(head, len(data))):]
    return bytes(data) + draw(st.binary(max_size=24))


def judge_frame(name: str, exc: CallFailed | None, tally: Tally) -> None:
    """An owner call must be answered (no hang) with success or a datadist code other than the catch-alls."""
    tally.calls += 1
    if exc is None:
        tally.ok += 1
        return
    code = S(exc.status).name if exc.status in S._value2member_map_ else f"status:{exc.status}"
    tally.codes[code] = tally.codes.get(code, 0) + 1
    assert exc.status != 0, f"{name}: no answer (hang?): {exc.message}"
    assert exc.status not in (S.LLM_FAILED, S.LLM_UNKNOWN_ERROR), f"{name}: {code}: {exc.message}"


def _still_serving(daemon: Any) -> None:
    assert daemon.proc.poll() is None, f"the daemon died:\n{daemon.log()}"
    assert daemon.serving()


# ---- one test per RPC --------------------------------------------------------------------------------

@pytest.mark.parametrize("method", [m.name for m in DATADIST.methods])
def test_datadist_rpc_survives_hostile_messages(method: str, fuzz_daemon) -> None:
    d = fuzz_daemon
    ctx = Ctx.build(d)
    m = DATADIST.methods_by_name[method]
    tally = TALLY.setdefault(f"DataDist.{method}", Tally())
    strategy = request_strategy(m, ctx)
    try:
        with grpc.insecure_channel(d.target, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
            s = datadist_pb2_grpc.DataDistStub(with_capability(d, ch))   # as the worker that owns the engines

            @FUZZ_SETTINGS
            @given(request=strategy)
            def run(request: Any) -> None:
                response, err = _call_datadist(s, method, request)
                judge(f"DataDist.{method}", err, tally)
                if err is None and response is not None:
                    _cleanup(s, method, request, response)

            run()
        _still_serving(d)
        in_place = ctx.legit_pull()
    finally:
        ctx.close()
    if not in_place:  # the context lost its link or caches to the fuzzing: check with fresh engines
        legit_roundtrip(d)
    assert status(d).engines == [], "engines left behind"


@pytest.mark.parametrize("method", [m.name for m in PEER.methods])
def test_peer_rpc_survives_hostile_messages(method: str, fuzz_daemon) -> None:
    d = fuzz_daemon
    ctx = Ctx.build(d)
    m = PEER.methods_by_name[method]
    tally = TALLY.setdefault(f"Peer.{method}", Tally())
    strategy = request_strategy(m, ctx)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{ctx.port}") as ch:
            p = peer_pb2_grpc.PeerStub(ch)

            @FUZZ_SETTINGS
            @given(request=strategy)
            def run(request: Any) -> None:
                judge(f"Peer.{method}", _call_peer(p, method, request), tally)

            run()
        _still_serving(d)
        legit_peer_read(ctx)
    finally:
        ctx.close()
    assert status(d).engines == [], "engines left behind"


@pytest.mark.parametrize("which", FRAME_CALLS)
def test_owner_call_frames_survive_hostile_messages(which: str, fuzz_daemon) -> None:
    d = fuzz_daemon
    ctx = Ctx.build(d)
    tally = TALLY.setdefault(f"frame.{which}", Tally())
    strategy = hostile_frame(*_frame_templates()[which])
    agent = ctx.agent
    assert agent is not None
    try:
        @FUZZ_SETTINGS
        @given(request=strategy)
        def run(request: bytes) -> None:
            try:
                agent.call_raw(request, timeout=CALL_TIMEOUT)
                judge_frame(f"frame.{which}", None, tally)
            except CallFailed as exc:
                judge_frame(f"frame.{which}", exc, tally)

        run()
        _still_serving(d)
        legit_peer_read(ctx)
    finally:
        ctx.close()
    assert status(d).engines == [], "engines left behind"


# ---- after the fuzzing ----------------------------------------------------------------------------------

def _settled(d: Any, slack_fds: int = 2, slack_threads: int = 4) -> dict[str, int]:
    """Engines gone, fds and threads back to the baseline (bounded wait); returns the current figures."""
    pid, base = d.proc.pid, d.baseline
    assert status(d).engines == []
    assert wait_until(lambda: fd_count(pid) <= base["fds"] + slack_fds, 10), (fd_count(pid), base)
    assert wait_until(lambda: thread_count(pid) <= base["threads"] + slack_threads, 10), (thread_count(pid), base)
    return {"fds": fd_count(pid), "threads": thread_count(pid), "rss": rss_kib(pid)}


def test_y_fuzzing_left_nothing_behind(fuzz_daemon) -> None:
    d = fuzz_daemon
    _still_serving(d)
    legit_roundtrip(d)
    now = _settled(d)
    print(f"\nfuzz daemon after {sum(t.calls for t in TALLY.values())} hostile calls: rss {d.baseline['rss']} -> "
          f"{now['rss']} KiB, fds {d.baseline['fds']} -> {now['fds']}, threads {d.baseline['threads']} -> "
          f"{now['threads']}")
    for name, t in sorted(TALLY.items()):
        print(f"  {name}: {t.calls} calls, {t.ok} accepted, {dict(sorted(t.codes.items()))}")
    assert now["rss"] <= d.baseline["rss"] + 32 * 1024, (now, d.baseline)


# ---- block lists of a million entries, and other outsized requests ---------------------------------------

MILLION = 1_000_000
ALTERNATING = [0, 2] * (MILLION // 2)   # valid indices that never merge into runs: the costly case
ONE_BAD = ALTERNATING[:-1] + [ROWS]     # a million entries, the last one out of range


def _times(head: Any, field_name: str, element: Any, n: int) -> bytes:
    """``head`` serialized, plus ``n`` copies of ``element`` in its repeated field ``field_name``, on the wire.

    Repeated fields are concatenations of their entries, so a million entries cost one byte copy here
    instead of a million Python messages (the daemon parses exactly the same bytes).
    """
    one = type(head)()
    getattr(one, field_name).add().CopyFrom(element)
    return head.SerializeToString() + one.SerializeToString() * n


def _options_map(n: int) -> bytes:
    """An InitRequest options map of ``n`` distinct entries (field 3), wire-encoded."""
    out = []
    for i in range(n):
        key = b"k%d" % i
        entry = b"\x0a" + bytes([len(key)]) + key + b"\x12\x01v"
        out.append(b"\x1a" + bytes([len(entry)]) + entry)
    return b"".join(out)


def _huge_cases(ctx: Ctx) -> list[tuple[str, str, Callable[[], bytes], set[int]]]:
    e1, e2 = ctx.e1, ctx.e2
    dst = ctx.caches2[0]
    transfer = lambda remote, local: datadist_pb2.TransferRequest(  # noqa: E731
        engine_id=e2, kind=datadist_pb2.TRANSFER_BLOCKS, remote=blocks_key(P_CLUSTER), local_cache_id=dst,
        remote_blocks=remote, local_blocks=local, timeout_ms=30000).SerializeToString()
    read = lambda blocks: ownerwire.encode_call(ReadCmd(0, 1, RemoteSpec(  # noqa: E731
        BlocksKeyRef(P_CLUSTER, 0), ReadMode.BLOCKS, tuple(blocks), expected_bytes=len(blocks) * 2 * ROW_BYTES),
        30000))
    inval = {S.LLM_PARAM_INVALID}
    over = [0] * ((1 << 20) + 1)
    return [
        ("Pull", "a million valid, unmergeable blocks", lambda: transfer(ALTERNATING, ALTERNATING), {0}),
        ("Pull", "a million blocks, the last out of range", lambda: transfer(ONE_BAD, ALTERNATING), inval),
        ("Pull", "a million src blocks vs one dst block", lambda: transfer(ALTERNATING, [0]), inval),
        ("Pull", "(1 << 20) + 1 blocks", lambda: transfer(over, over), inval),
        ("Push", "a million blocks, the last out of range", lambda: transfer(ALTERNATING, ONE_BAD), inval),
        ("CopyBlocks", "a million destinations, the last out of range", lambda: datadist_pb2.CopyBlocksRequest(
            engine_id=e1, cache_id=ctx.caches1[0],
            copies=[datadist_pb2.BlockCopy(src_block=1, dst_blocks=ONE_BAD)]).SerializeToString(), inval),
        ("SwapBlocks", "a million-entry mapping", lambda: datadist_pb2.SwapBlocksRequest(
            engine_id=e1, src=datadist_pb2.CacheOperand(cache_id=ctx.caches1[0]),
            dst=datadist_pb2.CacheOperand(cache_id=ctx.caches1[2]),
            src_to_dst={i: i for i in range(MILLION)}).SerializeToString(), inval),
        ("LinkClusters", "a million clusters", lambda: _times(
            datadist_pb2.LinkClustersRequest(engine_id=e2, timeout_ms=1000), "clusters",
            datadist_pb2.ClusterLink(remote_cluster_id=7), MILLION), {S.LLM_CLUSTER_NUM_EXCEED_LIMIT}),
        ("RegisterCache", "a million tensors", lambda: _times(
            datadist_pb2.RegisterCacheRequest(engine_id=e1, desc=_desc(), is_blocks=True), "tensors",
            datadist_pb2.WorkerMemory(process=datadist_pb2.ProcessMemory(pid=os.getpid(), address=ctx.buf.address,
                                                                         length=64)), MILLION), inval),
        ("AllocateCache", "a million cache keys", lambda: _times(
            datadist_pb2.AllocateCacheRequest(engine_id=e1, desc=_desc(rows=4)), "cache_keys",
            common_pb2.CacheKey(cluster_id=P_CLUSTER, req_id=5), MILLION), inval),
        ("Init", "a million options", lambda: datadist_pb2.InitRequest(cluster_id=999, role=1).SerializeToString()
         + _options_map(MILLION), inval),  # refused by count before the map is converted
        ("frame.read", "a million valid, unmergeable blocks", lambda: read(ALTERNATING), {0}),
        ("frame.read", "a million blocks, the last out of range", lambda: read(ONE_BAD), inval),
    ]


def _run_huge(ch: Any, agent: PeerAgent, method: str, request: bytes) -> tuple[Any, float]:
    """Send the raw request bytes (a ``frame.`` method: an ``ownerwire`` CALL frame on the agent's data channel);
    (datadist status code or 0, seconds)."""
    if method.startswith("frame."):
        t0 = time.monotonic()
        try:
            agent.call_raw(request, timeout=90)
            return 0, time.monotonic() - t0
        except CallFailed as exc:
            assert exc.status, (method, exc.message)
            return exc.status, time.monotonic() - t0
    else:
        m = DATADIST.methods_by_name[method]
        call = ch.unary_unary(f"/{DATADIST.full_name}/{m.name}", request_serializer=None,
                              response_deserializer=message_factory.GetMessageClass(m.output_type).FromString)
    t0 = time.monotonic()
    try:
        response = call(request, timeout=90)
        if method == "Init":
            datadist_pb2_grpc.DataDistStub(ch).Finalize(datadist_pb2.EngineRef(engine_id=response.engine_id),
                                                        timeout=20)
        code: Any = getattr(response, "status", 0)  # LinkClusters answers with in-band codes
    except grpc.RpcError as err:
        assert err.code() not in NOT_BUGS, (method, err.code(), err.details())
        code = code_of(err) or f"grpc:{err.code().name}"
    return code, time.monotonic() - t0


def test_z_outsized_requests_are_bounded_and_leave_nothing(fuzz_daemon) -> None:
    d = fuzz_daemon
    ctx = Ctx.build(d)
    results: dict[str, tuple[str, float]] = {}
    big = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
    assert ctx.agent is not None
    try:
        with grpc.insecure_channel(d.target, options=big) as raw:
            ch = with_capability(d, raw)
            cases = _huge_cases(ctx)
            for method, name, build, allowed in cases:
                code, seconds = _run_huge(ch, ctx.agent, method, build())
                results[f"{method}: {name}"] = (S(code).name if isinstance(code, int) and code else str(code or "OK"),
                                                round(seconds, 2))
                assert code in allowed, (method, name, code)
                _still_serving(d)
            # memory: the costly peer read twice more; the allocator keeps a high-water mark after the
            # first rounds, but a leak would grow with every repetition
            rss = []
            again = [c for c in cases if c[0] == "frame.read" and "valid" in c[1]]
            for _round in range(2):
                for method, _name, build, _allowed in again:
                    assert _run_huge(ch, ctx.agent, method, build())[0] == 0
                time.sleep(0.5)
                rss.append(rss_kib(d.proc.pid))
            after_first, after_second = rss
        legit_peer_read(ctx)
    finally:
        ctx.close()
        print("\noutsized requests (answer, seconds):", *(f"  {k}: {v}" for k, v in results.items()), sep="\n")
    legit_roundtrip(d)
    now = _settled(d)
    print(f"rss after repeating the costly peer read: {after_first} KiB, once more: {after_second} KiB, "
          f"settled {now['rss']} KiB")
    assert after_second <= after_first + 32 * 1024, (after_first, after_second)
