"""HIXL engines of two real users on one daemon (docs/hixl.md, docs/security.md): the same-daemon link rule holds
for the engine API as for LLM-DataDist's. Alice's HIXL server engine listens on loopback with one registration;
her own client engine connects and reads it. Bob knows her engine string and her buffer's address (a sample's
socket exchange hands it to anyone who asks): his Connect is refused, his AutoConnect transfer is refused, and his
WRITE to her address is refused -- Alice's bytes are untouched, and her own client then reads and writes them.

Root only (throwaway users, as tests/security/test_users.py); skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.daemonproc import free_port

from .test_users import daemon, users  # noqa: F401 - the throwaway-users fixtures
from .users import as_user

pytestmark = pytest.mark.integration

SERVER = """
import json, sys, numpy as np, hixl
engine = hixl.Hixl()
assert engine.initialize(sys.argv[1]) == hixl.SUCCESS
mem = np.full(1 << 16, 7, np.uint8)
status, handle = engine.register_mem(hixl.MemDesc(mem.ctypes.data, mem.nbytes), hixl.MemType.MEM_HOST)
print(json.dumps({"status": status, "addr": mem.ctypes.data}), flush=True)
for _ in sys.stdin:
    print(json.dumps({"untouched": bool((mem == 7).all())}), flush=True)
engine.finalize()
"""

CLIENT = """
import json, sys, numpy as np, hixl
remote, addr, auto = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "auto"
engine = hixl.Hixl()
assert engine.initialize("127.0.0.1", {hixl.OPTION_AUTO_CONNECT: "1"} if auto else {}) == hixl.SUCCESS
mem = np.zeros(1 << 16, np.uint8)
status, handle = engine.register_mem(hixl.MemDesc(mem.ctypes.data, mem.nbytes), hixl.MemType.MEM_HOST)
assert status == hixl.SUCCESS
connect = None if auto else engine.connect(remote, timeout_in_millis=5000)
ops = [hixl.TransferOpDesc(mem.ctypes.data, addr, 4096)]
read = engine.transfer_sync(remote, hixl.TransferOp.READ, ops, timeout_in_millis=5000)
got = bool((mem[:4096] == 7).all())
mem[:] = 9
write = engine.transfer_sync(remote, hixl.TransferOp.WRITE, ops, timeout_in_millis=5000)
print(json.dumps({"connect": connect, "read": read, "got": got, "write": write}), flush=True)
engine.finalize()
"""


def _line(p: subprocess.Popen) -> dict:
    line = p.stdout.readline()
    assert line, p.stderr.read()[-2000:] if p.poll() is not None else "no answer"
    return json.loads(line)


def _client(user: str, target: str, remote: str, addr: int, mode: str) -> dict:
    p = as_user(user, ["-c", CLIENT, remote, str(addr), mode], env={"DATADIST_DAEMON": target},
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-2000:]
    return json.loads(out.splitlines()[-1])


def test_another_users_hixl_engine_reaches_nothing(daemon):  # noqa: F811
    import hixl

    _, sock = daemon
    target = f"unix://{sock}"
    remote = f"127.0.0.1:{free_port()}"
    server = as_user("ddtest-alice", ["-c", SERVER, remote], env={"DATADIST_DAEMON": target},
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = _line(server)
        assert first["status"] == hixl.SUCCESS
        addr = first["addr"]
        bob = _client("ddtest-bob", target, remote, addr, "connect")
        assert bob["connect"] not in (hixl.SUCCESS, hixl.ALREADY_CONNECTED), bob
        assert bob["read"] != hixl.SUCCESS and bob["write"] != hixl.SUCCESS and not bob["got"], bob
        bob = _client("ddtest-bob", target, remote, addr, "auto")
        assert bob["read"] != hixl.SUCCESS and bob["write"] != hixl.SUCCESS and not bob["got"], bob
        server.stdin.write("check\n")
        server.stdin.flush()
        assert _line(server) == {"untouched": True}
        alice = _client("ddtest-alice", target, remote, addr, "connect")   # her own client: reads, then writes
        assert alice == {"connect": hixl.SUCCESS, "read": hixl.SUCCESS, "got": True, "write": hixl.SUCCESS}, alice
        server.stdin.write("check\n")
        server.stdin.flush()
        assert _line(server) == {"untouched": False}
    finally:
        if server.poll() is None:
            server.stdin.close()
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                server.kill()
