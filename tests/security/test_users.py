"""Two real users' workers on one daemon that runs as a third user with no capability (as the unit runs it).

Needs root (to make throwaway users and drop to them) and ``setpriv``; skips with the reason otherwise.
Alice registers her numpy memory and allocates a cache; Bob, in the same group, then tries everything
the security issue reproduced against Alice and the daemon; Alice's bytes are untouched and her work
goes on. The uids the daemon reports are the kernel's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import grpc
import pytest

from datadist.status import LLMStatusCode as S
from datadist.v1 import datadist_pb2, datadist_pb2_grpc

from .users import as_user, end, hold, ids, runtime_dir, why_not

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def users():
    why = why_not()
    if why:
        pytest.skip(why)
    with hold():
        probe = as_user("ddtest-alice", ["-c", "import grpc, numpy, llm_datadist"], stderr=subprocess.PIPE)
        if probe.wait(60) != 0:
            pytest.skip(f"another user cannot import the project: {probe.stderr.read().decode()[-300:]}")
        yield


@pytest.fixture
def daemon(users):
    base, d = runtime_dir("datadist-users-")
    sock = os.path.join(d, "datadistd.sock")
    log = open(os.path.join(d, "daemon.log"), "wb")  # noqa: SIM115 - closed below
    proc = as_user("ddtest-daemon", ["-m", "datadistd", "--socket", sock], env={"XDG_RUNTIME_DIR": d}, stdout=log,
                   stderr=log)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(sock + ".admin"):
            assert proc.poll() is None and time.monotonic() < deadline, open(log.name).read()
            time.sleep(0.1)
        yield proc, sock
    finally:
        end(proc)
        log.close()
        shutil.rmtree(base, ignore_errors=True)


ALICE = """
import json, sys, numpy as np, llm_datadist as ld
cfg = ld.LLMConfig(); cfg.device_id = 0; cfg.enable_cache_manager = True
cfg.mem_pool_cfg = '{"memory_size": 1048576}'
dd = ld.LLMDataDist(ld.LLMRole.DECODER, 1); dd.init(cfg.generate_options())
kv = [np.full((8, 1024), 7 + i, np.uint8) for i in range(2)]
desc = ld.CacheDesc(2, [8, 1024], ld.DataType.DT_UINT8)
reg = dd.cache_manager.register_blocks_cache(desc, [a.ctypes.data for a in kv], ld.BlocksCacheKey(1, 0))
own = dd.cache_manager.allocate_blocks_cache(desc)
from llm_datadist import views
k, v = views.numpy_views(own); k[:] = 3
print(json.dumps({"engine": dd._engine_id, "addr": kv[0].ctypes.data}), flush=True)
sys.stdin.readline()                      # Bob does his worst meanwhile
ok = bool((kv[0] == 7).all() and (kv[1] == 8).all() and (k == 3).all())
dd.cache_manager.copy_blocks(reg, {0: [5]}); kv[0][0] = 99; dd.cache_manager.copy_blocks(reg, {0: [6]})
ok = ok and bool((kv[0][6] == 99).all() and (kv[0][5] == 7).all())
print(json.dumps({"ok": ok}), flush=True)
dd.finalize()
"""

BOB = """
import json, os, sys, grpc
from datadist.v1 import common_pb2, datadist_pb2, datadist_pb2_grpc
from llm_datadist._attach import AttachClient
from llm_datadist.status import LLMException
target, engine, alice_addr, daemon_pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
att = AttachClient(target)
md = att.metadata
stub = datadist_pb2_grpc.DataDistStub(grpc.insecure_channel(target))
out = {"refused": {}, "uid": att.uid}
def code(fn):
    try:
        fn(); return 0
    except grpc.RpcError as e:
        return int(dict(e.trailing_metadata()).get("datadist-status-code", -1))
    except LLMException as e:
        return int(e.status_code)
mine = stub.Init(datadist_pb2.InitRequest(cluster_id=2, role=common_pb2.ROLE_DECODER, pid=os.getpid(),
                 options={"llm.EnableCacheManager": "1"}), metadata=md, timeout=10).engine_id
out["sees"] = [e.engine_id for e in stub.GetStatus(datadist_pb2.StatusRequest(), metadata=md, timeout=10).engines]
for name, req in [("Finalize", datadist_pb2.EngineRef(engine_id=engine)),
                  ("GetStatus", datadist_pb2.StatusRequest(engine_id=engine)),
                  ("ListCaches", datadist_pb2.StatusRequest(engine_id=engine)),
                  ("CopyBlocks", datadist_pb2.CopyBlocksRequest(engine_id=engine, cache_id=1,
                       copies=[datadist_pb2.BlockCopy(src_block=1, dst_blocks=[0])])),
                  ("DeallocateCache", datadist_pb2.CacheRef(engine_id=engine, cache_id=2, is_blocks=True))]:
    out["refused"][name] = code(lambda: getattr(stub, name)(req, metadata=md, timeout=10))
out["refused"]["export_pool"] = code(lambda: att.export_pool(engine, "datadist-x", "t"))
out["refused"]["prove_daemon_pid"] = code(lambda: stub.ProvePid(datadist_pb2.ProvePidRequest(
    engine_id=mine, address=4096), metadata=md, timeout=10))
desc = common_pb2.CacheDesc(num_tensors=1, shape=[8, 1024], data_type=4, placement=common_pb2.PLACEMENT_DEVICE)
for who, pid in (("alice_memory", None), ("daemon_memory", daemon_pid)):
    mem = datadist_pb2.WorkerMemory(process=datadist_pb2.ProcessMemory(pid=pid or 1, address=alice_addr, length=8192))
    out["refused"][who] = code(lambda: stub.RegisterCache(datadist_pb2.RegisterCacheRequest(
        engine_id=mine, desc=desc, is_blocks=True, tensors=[mem]), metadata=md, timeout=10))
try:
    open(f"/proc/{daemon_pid}/mem", "rb").read(1); out["proc_mem"] = "open"
except OSError as e:
    out["proc_mem"] = e.strerror
import socket
try:
    socket.socket(socket.AF_UNIX).connect(target[len("unix://"):] + ".admin"); out["admin"] = "connected"
except OSError as e:
    out["admin"] = e.strerror
print(json.dumps(out), flush=True)
"""


def test_two_users_one_daemon_without_capabilities(daemon):
    proc, sock = daemon
    status = open(f"/proc/{proc.pid}/status").read()
    caps = {line.split(":")[0]: int(line.split()[1], 16) for line in status.splitlines() if line.startswith("Cap")}
    assert caps["CapEff"] == caps["CapPrm"] == caps["CapBnd"] == 0, caps          # no capability at all
    target = f"unix://{sock}"
    alice = as_user("ddtest-alice", ["-c", ALICE], env={"DATADIST_DAEMON": target}, stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first = json.loads(alice.stdout.readline() or b"{}")
        assert "engine" in first, alice.stderr.read().decode()[-2000:]
        bob = as_user("ddtest-bob", ["-c", BOB, target, str(first["engine"]), str(first["addr"]), str(proc.pid)],
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = bob.communicate(timeout=120)
        assert bob.returncode == 0, err.decode()[-2000:]
        seen = json.loads(out)
        finalized, invalid, disabled = int(S.LLM_ENGINE_FINALIZED), int(S.LLM_PARAM_INVALID), \
            int(S.LLM_FEATURE_NOT_ENABLED)
        assert first["engine"] not in seen["sees"] and len(seen["sees"]) == 1
        assert seen["uid"] == ids("ddtest-bob")[0]
        for name in ("Finalize", "GetStatus", "ListCaches", "CopyBlocks", "DeallocateCache", "export_pool"):
            assert seen["refused"][name] == finalized, (name, seen)
        assert seen["refused"]["prove_daemon_pid"] == disabled
        assert seen["refused"]["alice_memory"] == invalid and seen["refused"]["daemon_memory"] == invalid
        assert seen["proc_mem"] != "open"
        assert seen["admin"] == "Permission denied"                         # the whole-node view is not Bob's
        # the whole-node view (root here) shows Alice's engine with the uid the kernel reported; Bob's went
        # with his attach connection when he exited
        with grpc.insecure_channel(f"unix://{sock}.admin") as ch:
            stub = datadist_pb2_grpc.DataDistStub(ch)
            deadline = time.monotonic() + 10
            while len(stub.GetStatus(datadist_pb2.StatusRequest(), timeout=10).engines) > 1:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            engines = stub.GetStatus(datadist_pb2.StatusRequest(), timeout=10).engines
        assert [(e.engine_id, e.uid) for e in engines] == [(first["engine"], ids("ddtest-alice")[0])]
        alice.stdin.write(b"go\n")
        alice.stdin.flush()
        assert json.loads(alice.stdout.readline() or b"{}") == {"ok": True}, alice.stderr.read().decode()[-2000:]
        assert alice.wait(60) == 0
    finally:
        if alice.poll() is None:
            alice.kill()
