"""Remote attacks on the peer plane (security issue, items 8 and 9), each refused next to the legitimate use.

8. A daemon with no secret of its own (the public development secret: set explicitly, or the fallback of a user
   with no place for a per-user secret) listens on loopback only: a non-loopback ``listen_ip_info`` is refused at
   ``init``, a non-loopback ``[transport] host`` stops the start with exit 2, both naming the fix; loopback
   development keeps working, with one warning. A per-user secret (nothing configured) is a real one.
9. An unauthenticated ``Handshake`` over 4 KiB is refused before it is parsed; the peer listener takes
   messages up to what an authenticated request needs (16 MiB), not 64 MiB.
10. Strangers holding silent connections to the data-plane port do not keep a linking peer out;
    a connection that has not sent a good hello within ``[peer] preauth_seconds`` is closed; the
    refusals cost the log a line per interval, not one each.
11. The same on the gRPC peer port (through its admission front), where idle connections were
    unlimited: they are capped per source and in all, closed at the pre-auth deadline (also when
    they keep making unauthenticated calls), and the daemon's descriptors stay bounded; the
    private gRPC port behind the front refuses calls that did not come through it.
12. A captured handshake is worthless: the serving engine issues each handshake's challenge and
    accepts it once, so replaying it fails -- after the daemon restarted, after the serving worker
    restarted, and right away.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import grpc
import pytest

from datadist.status import LLMStatusCode
from datadist.v1 import peer_pb2, peer_pb2_grpc
from datadistd.links.wire.peering import PROTOCOL_VERSION
from datadistd.ops.config import load_config
from tests.daemonproc import DaemonProcess, free_port
from tests.harness import Worker, WorkerError
from tests.reliability.common import PeerAgent, fd_count, listening_sockets, wait_until

pytestmark = pytest.mark.integration

P, D = 1, 2


#: the two ways a one-user daemon (sockets 0600) is left with the public development secret
#: (``datadistd.ops.peersecret``): set, or fallen back to where asked for
ONE_USER = {"DATADISTD_DAEMON_SOCKET_MODE": "0o600"}
NO_PLACE = {"XDG_RUNTIME_DIR": "", "STATE_DIRECTORY": "", "XDG_CONFIG_HOME": "/proc/datadist-none",
            "HOME": "/proc/datadist-none"}
PUBLIC = {"explicit": {"DATADISTD_PEER_SECRET": "datadist-development-secret", **ONE_USER},
          "no per-user place": {**NO_PLACE, "DATADISTD_PEER_DEV_SECRET_FALLBACK": "true", **ONE_USER}}


@pytest.fixture(params=sorted(PUBLIC))
def dev_daemon(request):
    d = DaemonProcess("dev", env=PUBLIC[request.param])
    d.start()
    yield d
    d.discard()


@pytest.fixture
def plain_daemon():
    d = DaemonProcess("plain")   # nothing configured: this user's own secret
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
        assert dev_daemon.log().count("listens on loopback addresses only") == 1
        assert "the public development secret" in dev_daemon.log() and "secret_file" in dev_daemon.log()
    finally:
        w.close()


def test_8_a_real_secret_lifts_the_rule(tmp_path):
    ip = _non_loopback_ip()
    if ip is None:
        pytest.skip("this host has no non-loopback IPv4 address to bind")
    secret = tmp_path / "peer.secret"
    secret.write_text("a-cluster-secret\n")
    secret.chmod(0o600)
    for env in ({"DATADISTD_PEER_SECRET_FILE": str(secret)}, {}):   # configured, or this user's own
        d = DaemonProcess("real", env=env).start()
        w = Worker({"DATADIST_DAEMON": d.target})
        try:
            w.call("init", "PROMPT", P, listen=f"{ip}:{free_port()}")   # bound, nothing else is sent there
            assert "loopback addresses only" not in d.log()
        finally:
            w.close()
            d.discard()


def test_8_a_public_data_plane_without_a_secret_does_not_start(tmp_path):
    for name, env in PUBLIC.items():
        done = subprocess.run([sys.executable, "-m", "datadistd", "--socket", str(tmp_path / "d" / "x.sock")],
                              env={**os.environ, "DATADISTD_TRANSPORT_HOST": "0.0.0.0", **env},
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "secret_file" in done.stderr, (name, done.stderr[-500:])
        assert "public development secret" in done.stderr, (name, done.stderr[-500:])
    assert load_config(env={"DATADISTD_TRANSPORT_HOST": "0.0.0.0", "DATADISTD_PEER_SECRET": "s3cret"})


def test_8_the_public_secret_never_serves_other_users(tmp_path):
    """A daemon whose sockets its group may use (the default 0660: it serves other users) does not start on the
    public secret, set or fallen back to; nor does one with no place for a secret that did not ask for it."""
    cases = {name: {**env, "DATADISTD_DAEMON_SOCKET_MODE": "0o660"} for name, env in PUBLIC.items()}
    cases["no place, no fallback"] = {**NO_PLACE, **ONE_USER}
    for name, env in cases.items():
        done = subprocess.run([sys.executable, "-m", "datadistd", "--socket", str(tmp_path / "d" / "x.sock")],
                              env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, (name, done.stderr[-500:])
        assert "StateDirectory=datadist" in done.stderr and "secret_file" in done.stderr, (name, done.stderr[-500:])


def test_8_a_secret_file_others_may_read_stops_a_daemon_and_an_embedded_worker_alike(tmp_path):
    """One rule for secret files in every mode (issue 37, item 4): the standalone daemon used to take a 0644 one."""
    secret = tmp_path / "peer.secret"
    secret.write_text("a-cluster-secret\n")
    secret.chmod(0o644)
    env = {**os.environ, "DATADISTD_PEER_SECRET_FILE": str(secret)}
    done = subprocess.run([sys.executable, "-m", "datadistd", "--socket", str(tmp_path / "d" / "x.sock")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "has mode 0o644" in done.stderr and f"chmod 600 {secret}" in done.stderr, \
        done.stderr[-1000:]
    w = Worker({"DATADISTD_PEER_SECRET_FILE": str(secret)})   # embedded: the same file, the same refusal
    try:
        with pytest.raises(WorkerError) as info:
            w.call("init", "DECODER", D)
        assert info.value.kind == "LLMException" and info.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
        assert f"chmod 600 {secret}" in info.value.message
    finally:
        w.close()


def test_9_oversized_unauthenticated_handshakes_are_refused_unparsed(plain_daemon):
    port = free_port()
    w = Worker({"DATADIST_DAEMON": plain_daemon.target})
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
        # a real peer still links with the daemon's secret
        agent = PeerAgent(f"127.0.0.1:{port}", 77, P).handshake(streams=1)
        assert agent.link_nonce
        agent.close()
        assert plain_daemon.proc.poll() is None
    finally:
        w.close()


def test_12_a_captured_handshake_is_refused_after_restarts():
    port = free_port()
    d = DaemonProcess("replay").start()
    w = Worker({"DATADIST_DAEMON": d.target})
    agent = PeerAgent(f"127.0.0.1:{port}", 77, P)
    try:
        w.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}")
        captured = agent.offer()                      # what an eavesdropper saw on the wire ...
        agent.peer.Handshake(captured, timeout=10)    # ... of a handshake that worked
        for restart in ("none", "serving worker", "daemon"):
            if restart == "serving worker":
                w.close()
                w = Worker({"DATADIST_DAEMON": d.target})
                w.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}")
            elif restart == "daemon":
                w.close()
                d.discard()
                d = DaemonProcess("replay").start()
                w = Worker({"DATADIST_DAEMON": d.target})
                w.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}")
            agent.close()
            agent = PeerAgent(f"127.0.0.1:{port}", 77, P)
            with pytest.raises(grpc.RpcError) as info:
                agent.peer.Handshake(captured, timeout=10)
            assert int(dict(info.value.trailing_metadata())["datadist-status-code"]) == \
                LLMStatusCode.LLM_LINK_FAILED, restart
            assert "challenge is unknown, already used or expired" in info.value.details(), restart
        # the legitimate handshake next to it: a fresh challenge links
        assert agent.handshake(streams=1).link_nonce
    finally:
        agent.close()
        w.close()
        d.discard()


PREAUTH = 2.0   # [peer] preauth_seconds of the daemons below
TENSORS, BLOCKS, BLOCK_SHAPE = 2, 8, (8, 32)


def _connect_from(source: str, port: int) -> socket.socket:
    """A stranger's TCP connection to loopback ``port`` from the loopback address ``source``."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    return sock


def _closed_by_peer(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1 << 16) == b""
    except BlockingIOError:
        return False
    except OSError:   # reset
        return True


def _strangers(port: int, per_source: dict[str, int]) -> list[socket.socket]:
    return [_connect_from(source, port) for source, n in per_source.items() for _ in range(n)]


@pytest.fixture
def pair():
    """One daemon, a prompt engine listening on loopback with blocks filled, a decoder engine (not linked)."""
    d = DaemonProcess("admission", env={"DATADISTD_PEER_PREAUTH_SECONDS": str(PREAUTH),
                                        "DATADISTD_METRICS_LISTEN": f"127.0.0.1:{free_port()}"}).start()
    port = free_port()
    prompt, decoder = Worker({"DATADIST_DAEMON": d.target}), Worker({"DATADIST_DAEMON": d.target})
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True, mem_pool=1 << 20)
    prompt.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE, model_id=0)
    prompt.call("fill", "kv", 7)
    decoder.call("init", "DECODER", D, mem_pool=1 << 20)
    decoder.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE)
    yield d, port, prompt, decoder
    for w in (prompt, decoder):
        w.close()
    d.discard()


def _closed_count(d: DaemonProcess, listener: str, reason: str) -> float:
    """``datadist_listener_connections_closed_total`` of the prompt engine's ``listener`` (data/peer)."""
    import urllib.request

    address = d.env["DATADISTD_METRICS_LISTEN"]
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    want = f'datadist_listener_connections_closed_total{{cluster_id="{P}",listener="{listener}",reason="{reason}"}}'
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(want))


def _link_and_pull(port: int, prompt: Worker, decoder: Worker) -> None:
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    decoder.call("pull_blocks", P, "kv", [1, 2, 3], [5, 6, 7])
    assert (decoder.call("rows", "kv", None, [5, 6, 7]) == prompt.call("rows", "kv", None, [1, 2, 3])).all()


def test_10_silent_strangers_on_the_data_plane_do_not_keep_a_peer_out(pair):
    d, port, prompt, decoder = pair
    probe = PeerAgent(f"127.0.0.1:{port}", 77, P).handshake(connect=False)   # learns the data endpoint
    data_port = int(probe.endpoint.rsplit(":", 1)[1])
    probe.close()
    fds = fd_count(d.proc.pid)
    # 80 silent connections from the linking peer's own address, 40 more from four others: far over the
    # 64 unauthenticated slots the data plane had, which used to make link_clusters fail
    held = _strangers(data_port, {"127.0.0.1": 80, **{f"127.0.0.{i}": 10 for i in range(2, 6)}})
    try:
        assert fd_count(d.proc.pid) <= fds + 64 + 8        # the pre-auth total, not one per stranger
        _link_and_pull(port, prompt, decoder)              # the peer gets in: the oldest strangers make room
        assert wait_until(lambda: all(_closed_by_peer(s) for s in held), PREAUTH + 10)   # the deadline
    finally:
        for s in held:
            s.close()
    # still linked and moving bytes after the deadline: an authenticated connection has none
    time.sleep(PREAUTH + 0.5)
    decoder.call("pull_blocks", P, "kv", [4], [0])
    assert (decoder.call("rows", "kv", None, [0]) == prompt.call("rows", "kv", None, [4])).all()
    refusals = [line for line in d.log().splitlines() if "connection refused or closed" in line]
    assert refusals and len(refusals) <= 6, refusals[:10]   # 120+ refusals, a handful of lines
    # ... and the operator sees them counted
    assert _closed_count(d, "data", "evicted") >= 50 and _closed_count(d, "data", "expired") >= 1


def test_11_idle_strangers_on_the_peer_port_are_capped_and_timed_out(pair):
    d, port, prompt, decoder = pair
    fds = fd_count(d.proc.pid)
    held = _strangers(port, {"127.0.0.1": 150, **{f"127.0.0.{i}": 30 for i in range(2, 7)}})   # 300 idle
    try:
        # the front holds at most 64 pre-auth connections (each with its private twin): not 300
        assert wait_until(lambda: fd_count(d.proc.pid) <= fds + 2 * 64 + 8, 10), fd_count(d.proc.pid)
        _link_and_pull(port, prompt, decoder)
        assert wait_until(lambda: all(_closed_by_peer(s) for s in held), PREAUTH + 10)
    finally:
        for s in held:
            s.close()
    # a stranger that speaks gRPC but never authenticates (health checks, challenges) is closed on time too
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        states: list[grpc.ChannelConnectivity] = []
        ch.subscribe(states.append)
        stub = peer_pb2_grpc.PeerStub(ch)
        stub.Challenge(peer_pb2.ChallengeRequest(protocol_version=PROTOCOL_VERSION, client_cluster_id=9,
                                                 server_cluster_id=P),
                       timeout=10)
        # connectivity callbacks arrive on gRPC's own thread, possibly after the call returned
        assert wait_until(lambda: grpc.ChannelConnectivity.READY in states, 10), states
        ready = states.index(grpc.ChannelConnectivity.READY)
        assert wait_until(lambda: len(states) > ready + 1, PREAUTH + 10), states   # the front hung up
    # the legitimate link outlived the deadline: still established, still moving bytes
    decoder.call("pull_blocks", P, "kv", [4], [0])
    assert (decoder.call("rows", "kv", None, [0]) == prompt.call("rows", "kv", None, [4])).all()
    assert wait_until(lambda: fd_count(d.proc.pid) <= fds + 16, 10), (fd_count(d.proc.pid), fds)
    assert _closed_count(d, "peer", "evicted") >= 200 and _closed_count(d, "peer", "expired") >= 1


def test_11_the_private_port_behind_the_front_serves_nobody_directly(pair):
    d, port, prompt, decoder = pair
    private = [p for ip, p in listening_sockets(d.proc.pid) if ip == "127.0.0.1" and p != port]
    assert private, listening_sockets(d.proc.pid)
    denied = 0
    for candidate in private:   # the data plane's port does not speak gRPC at all; the private one refuses
        with grpc.insecure_channel(f"127.0.0.1:{candidate}") as ch:
            try:
                peer_pb2_grpc.PeerStub(ch).Challenge(peer_pb2.ChallengeRequest(protocol_version=PROTOCOL_VERSION,
                                                                                server_cluster_id=P), timeout=5)
            except grpc.RpcError as err:
                denied += err.code() == grpc.StatusCode.PERMISSION_DENIED
            else:
                raise AssertionError(f"port {candidate} answered a call that bypassed the front")
    assert denied == 1
    _link_and_pull(port, prompt, decoder)    # through the front, all is well
