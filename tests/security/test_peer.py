"""Remote attacks on the peer plane (security issue, items 8 and 9), each refused next to the legitimate use.

8. A daemon with no secret of its own (the public development secret) listens on loopback only: a
   non-loopback ``listen_ip_info`` is refused at ``init``, a non-loopback ``[transport] host`` stops the
   start with exit 2, both naming the fix; loopback development keeps working, with one warning.
9. An unauthenticated ``Handshake`` over 4 KiB is refused before it is parsed; the peer listener takes
   messages up to what an authenticated request needs (16 MiB), not 64 MiB.
"""

from __future__ import annotations

import os
import subprocess
import sys

import grpc
import pytest

from datadist.status import LLMStatusCode
from datadist.v1 import peer_pb2, peer_pb2_grpc
from datadistd.config import ConfigError, load_config
from datadistd.tools.daemonproc import DaemonProcess, free_port
from tests.harness import Worker, WorkerError
from tests.reliability.common import PeerAgent

pytestmark = pytest.mark.integration

P, D = 1, 2


@pytest.fixture
def dev_daemon():
    d = DaemonProcess("dev")   # no [peer] secret: the development secret
    d.start()
    yield d
    d.discard()


def _non_loopback_ip() -> str | None:
    """An IPv4 address of this host's own interfaces other than loopback (bound only; nothing is sent to it)."""
    import shutil

    if shutil.which("ip") is None:
        return None
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        ip = line.split()[3].split("/")[0]
        if not ip.startswith("127."):
            return ip
    return None


def test_8_no_real_secret_means_loopback_only(dev_daemon):
    w = Worker({"DATADIST_DAEMON": dev_daemon.target})
    try:
        for host in ("0.0.0.0", "10.11.12.13", "::"):
            with pytest.raises(WorkerError) as info:
                w.call("init", "PROMPT", P, listen=f"{host}:{free_port()}")
            assert info.value.status_code == LLMStatusCode.LLM_PARAM_INVALID, host
            assert "secret_file" in str(info.value)
        # loopback development works, and the daemon said once why it stays there
        w.call("init", "PROMPT", P, listen=f"127.0.0.1:{free_port()}")
        assert dev_daemon.log().count("no [peer] secret is set") == 1
        assert "secret_file" in dev_daemon.log()
    finally:
        w.close()


def test_8_a_real_secret_lifts_the_rule(tmp_path):
    ip = _non_loopback_ip()
    if ip is None:
        pytest.skip("this host has no non-loopback IPv4 address to bind")
    secret = tmp_path / "peer.secret"
    secret.write_text("a-cluster-secret\n")
    d = DaemonProcess("real", env={"DATADISTD_PEER_SECRET_FILE": str(secret)}).start()
    w = Worker({"DATADIST_DAEMON": d.target})
    try:
        w.call("init", "PROMPT", P, listen=f"{ip}:{free_port()}")   # bound, nothing else is sent there
        assert "no [peer] secret is set" not in d.log()
    finally:
        w.close()
        d.discard()


def test_8_a_public_data_plane_without_a_secret_does_not_start():
    with pytest.raises(ConfigError, match="secret_file"):
        load_config(env={"DATADISTD_TRANSPORT_HOST": "0.0.0.0"})
    for env in ({"DATADISTD_PEER_SECRET": "datadist-development-secret"}, {}):
        done = subprocess.run([sys.executable, "-m", "datadistd", "--socket", "/nonexistent/x.sock"],
                              env={**os.environ, "DATADISTD_TRANSPORT_HOST": "0.0.0.0", **env},
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "secret_file" in done.stderr, done.stderr[-500:]
    assert load_config(env={"DATADISTD_TRANSPORT_HOST": "0.0.0.0", "DATADISTD_PEER_SECRET": "s3cret"})


def test_9_oversized_unauthenticated_handshakes_are_refused_unparsed(dev_daemon):
    port = free_port()
    w = Worker({"DATADIST_DAEMON": dev_daemon.target})
    try:
        w.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}")
        big = [("grpc.max_send_message_length", 64 << 20)]
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=big) as ch:
            stub = peer_pb2_grpc.PeerStub(ch)
            with pytest.raises(grpc.RpcError) as info:   # 5 KiB of "version string": refused by size
                stub.Handshake(peer_pb2.HandshakeRequest(protocol_version=1, client_version="x" * 5000), timeout=10)
            assert int(dict(info.value.trailing_metadata())["datadist-status-code"]) == LLMStatusCode.LLM_LINK_FAILED
            assert "at most 4096 bytes" in info.value.details()
            with pytest.raises(grpc.RpcError) as info:   # 20 MiB: over what the listener takes at all
                stub.Handshake(peer_pb2.HandshakeRequest(client_version="x" * (20 << 20)), timeout=30)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # a real peer still links with the (development) secret on loopback
        agent = PeerAgent(f"127.0.0.1:{port}", 77, P).handshake(streams=1)
        assert agent.session
        agent.close()
        assert dev_daemon.proc.poll() is None
    finally:
        w.close()
