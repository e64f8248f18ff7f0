"""Tenants as real users of one daemon (issue 27): same-daemon links (attack 2), per-uid quotas (attack 4).

One daemon running as a throwaway user (as the unit runs it), Alice and Bob as two more (root only; skipped
with the reason otherwise). Alice's prompt engine listens on loopback; her decoder links to it within the
daemon (memory copies) and pulls. Bob, who found the port in ``/proc/net/tcp``, links to it as a stranger
and as the cluster id of Alice's decoder: refused both times, and Alice's link and bytes are untouched.
A stranger's ``Peer/Challenge`` naming the wrong cluster learns no cluster id.
"""

from __future__ import annotations

import json
import subprocess

import grpc
import pytest

from datadist.status import LLMStatusCode as S
from datadist.v1 import peer_pb2, peer_pb2_grpc
from datadistd.links.wire.peering import PROTOCOL_VERSION
from tests.daemonproc import free_port

from .test_users import daemon, users  # noqa: F401 - the throwaway-users fixtures
from .users import as_user, end, runtime_dir

pytestmark = pytest.mark.integration

WORKER = """
import json, sys, numpy as np, llm_datadist as ld
role, port, cluster, remote = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cfg = ld.LLMConfig(); cfg.device_id = 0; cfg.enable_cache_manager = True; cfg.enable_remote_cache_accessible = True
if role == "prompt":
    cfg.listen_ip_info = f"127.0.0.1:{port}"
dd = ld.LLMDataDist(ld.LLMRole.PROMPT if role == "prompt" else ld.LLMRole.DECODER, cluster)
dd.init(cfg.generate_options())
kv = [np.full((4, 1024), 7 if role == "prompt" else 0, np.uint8)]
cache = dd.cache_manager.register_blocks_cache(ld.CacheDesc(1, [4, 1024], ld.DataType.DT_UINT8),
                                               [kv[0].ctypes.data], ld.BlocksCacheKey(cluster, 0))
def say(**kw):
    print(json.dumps(kw), flush=True)
def pull():
    kv[0][:] = 0
    dd.cache_manager.pull_blocks(ld.BlocksCacheKey(remote, 0), cache, [0, 1, 2, 3], [0, 1, 2, 3])
    return bool((kv[0] == 7).all())
if role == "prompt":
    say(ready=True)
    sys.stdin.readline()
    say(untouched=bool((kv[0] == 7).all()))
else:
    info = ld.LLMClusterInfo(); info.remote_cluster_id = remote
    info.append_local_ip_info("127.0.0.1", 0); info.append_remote_ip_info("127.0.0.1", port)
    code, _ = dd.link_clusters([info], 5000)
    pulled = pull() if int(code) == 0 else None
    say(link=int(code), pulled=pulled)
    if role == "stay":
        sys.stdin.readline()
        say(pulled=pull())
dd.finalize()
"""


def _run(user: str, target: str, *args: object, **kw) -> subprocess.Popen:  # noqa: ANN003
    return as_user(user, ["-c", WORKER, *map(str, args)], env={"DATADIST_DAEMON": target}, stdin=subprocess.PIPE,
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _line(p: subprocess.Popen) -> dict:
    line = p.stdout.readline()
    assert line, p.stderr.read()[-2000:] if p.poll() is not None else "no answer"
    return json.loads(line)


def test_2_same_daemon_links_stay_within_one_user(daemon):  # noqa: F811
    _, sock = daemon
    target = f"unix://{sock}"
    port = free_port()
    prompt = _run("ddtest-alice", target, "prompt", port, 1, 0)
    decoder = None
    try:
        assert _line(prompt) == {"ready": True}
        decoder = _run("ddtest-alice", target, "stay", port, 2, 1)          # Alice's own decoder: links, pulls
        assert _line(decoder) == {"link": 0, "pulled": True}
        for cluster in (3, 2):                                              # Bob: a stranger, then Alice's decoder
            bob = _run("ddtest-bob", target, "decoder", port, cluster, 1)
            out, err = bob.communicate(timeout=120)
            assert bob.returncode == 0, err[-2000:]
            assert json.loads(out.splitlines()[-1]) == {"link": int(S.LLM_LINK_FAILED), "pulled": None}, out
        decoder.stdin.write("go\n")
        decoder.stdin.flush()
        assert _line(decoder) == {"pulled": True}                           # Alice's link was not dropped
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:              # a stranger asks the wrong cluster
            with pytest.raises(grpc.RpcError) as info:
                peer_pb2_grpc.PeerStub(ch).Challenge(peer_pb2.ChallengeRequest(
                    protocol_version=PROTOCOL_VERSION, client_cluster_id=9, server_cluster_id=77), timeout=10)
            assert "77" in info.value.details() and "cluster 1" not in info.value.details()
        prompt.stdin.write("go\n")
        prompt.stdin.flush()
        assert _line(prompt) == {"untouched": True}
    finally:
        for p in (prompt, decoder):
            if p is not None and p.poll() is None:
                p.stdin.close()
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()


# ---- issue 27, attack 4: one uid at its quota does not stop another ------------------------------------

TENANT = """
import fcntl, json, os, sys, grpc
from datadist.v1 import common_pb2, datadist_pb2, datadist_pb2_grpc
from llm_datadist._attach import AttachClient
from llm_datadist.status import LLMException
target, hog = sys.argv[1], sys.argv[2] == "hog"
att = AttachClient(target)
stub = datadist_pb2_grpc.DataDistStub(grpc.insecure_channel(target))
engine = stub.Init(datadist_pb2.InitRequest(cluster_id=1, role=common_pb2.ROLE_DECODER,
                   options={"llm.EnableCacheManager": "1"}), metadata=att.metadata, timeout=10).engine_id
fd = os.memfd_create("t", os.MFD_ALLOW_SEALING)
os.ftruncate(fd, 1 << 30)
fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
held, code = [], 0
for _ in range(10000 if hog else 1):      # the hog: one-page pieces until the daemon says no
    try:
        held.append(att.import_memory([fd] * 16, [(i * 4096, 4096) for i in range(16)], 0, 4096, "t"))
    except LLMException as e:
        code = int(e.status_code)
        break
print(json.dumps({"engine": engine, "imported": len(held), "code": code}), flush=True)
sys.stdin.readline()
"""


def _run_tenant(user: str, target: str, mode: str) -> subprocess.Popen:
    return as_user(user, ["-c", TENANT, target, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                   stderr=subprocess.PIPE, text=True)


def test_4_one_uid_at_its_quota_leaves_another_uid_alone(users):  # noqa: F811
    import os
    import shutil
    import time

    base, d = runtime_dir("datadist-quota-")
    sock = os.path.join(d, "datadistd.sock")
    proc = as_user("ddtest-daemon", ["-m", "datadistd", "--socket", sock],
                   env={"DATADISTD_QUOTA_IMPORTED_MAPPINGS_PER_UID": "256", "XDG_RUNTIME_DIR": d},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    hog = None
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(sock + ".admin"):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        target = f"unix://{sock}"
        hog = _run_tenant("ddtest-alice", target, "hog")
        took = _line(hog)
        assert took["imported"] == 256 // 16 and took["code"] == int(S.LLM_OUT_OF_MEMORY), took
        other = _run_tenant("ddtest-bob", target, "one")                  # while Alice holds her whole quota
        seen = _line(other)
        assert seen["engine"] > 0 and (seen["imported"], seen["code"]) == (1, 0), seen
        other.stdin.close()
        other.wait(60)
    finally:
        if hog is not None:
            hog.stdin.close()
            hog.wait(60)
        end(proc)
        shutil.rmtree(base, ignore_errors=True)
