"""Security: peers authenticate before touching memory; hostile bytes change nothing; nothing listens
or opens wider than configured; peer requests outside a cache's bounds are refused before a byte moves.

Here the peer plane runs without ``[tls]`` (the default): peers prove a shared secret with HMAC in
the handshake and the data plane admits only the token derived from it. Mutual TLS on top of that:
``test_tls.py``.
"""

from __future__ import annotations

import errno
import glob
import os
import socket
import stat
import struct
import time
from typing import Any

import grpc
import numpy as np
import pytest

from datadist.status import LLMStatusCode as S
from datadist.v1 import datadist_pb2, datadist_pb2_grpc, peer_pb2
from datadistd.core.types import BlocksKeyRef, IdIndexRef, ReadMode, RemoteSpec
from datadistd.links.wire import ownerwire
from datadistd.links.wire.ownercalls import CommitWriteCmd, OpenWriteCmd, ReadCmd
from datadistd.links.wire.peering import PROTOCOL_VERSION
from datadistd.ops.peersecret import PeerSecret
from tests.harness import Daemon, WorkerError, free_port, pool_memfds
from tests.reliability.common import (
    DEV_SECRET,
    Buffer,
    CallFailed,
    PeerAgent,
    code_of,
    fd_count,
    links,
    listening_sockets,
    wait_until,
)
from tests.reliability.ops import OPS

pytestmark = pytest.mark.integration

P, D = 1, 2
SECRET_A = "alpha-5e1f0c-peer-secret"
SECRET_B = "bravo-9a7d31-peer-secret"
TENSORS, BLOCKS, BLOCK_SHAPE = 4, 16, (8, 32)     # float16: 512 bytes per block per tensor
ROW = 8 * 32 * 2


def _prompt(daemon_factory, worker_factory, env=None, port=None):  # noqa: ANN001, ANN202
    dp = daemon_factory("p", env=env or {})
    port = port or free_port()
    prompt = worker_factory(dp)
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True,
                sync_kv_timeout=3000, mem_pool=4 << 20)
    prompt.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE, model_id=0)
    prompt.call("fill", "kv", 1)
    return dp, prompt, port


def _decoder(daemon, worker_factory, cluster=D, remote=True):  # noqa: ANN001, ANN202
    decoder = worker_factory(daemon)
    decoder.call("init", "DECODER", cluster, remote_cache_accessible=remote, sync_kv_timeout=3000, mem_pool=1 << 20)
    decoder.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE)
    return decoder


def _pull_and_check(decoder, prompt, src, dst) -> None:  # noqa: ANN001
    decoder.call("pull_blocks", P, "kv", src, dst)
    np.testing.assert_array_equal(decoder.call("rows", "kv", None, dst), prompt.call("rows", "kv", None, src))


# ---- authentication -----------------------------------------------------------------------------

def test_wrong_or_missing_secret_is_refused_and_logged(daemon_factory, worker_factory) -> None:
    dp, prompt, port = _prompt(daemon_factory, worker_factory, env={"DATADISTD_PEER_SECRET": SECRET_A})
    wrong = daemon_factory("wrong", env={"DATADISTD_PEER_SECRET": SECRET_B})
    missing = daemon_factory("missing")           # no secret configured: this user's own
    for daemon, cluster in ((wrong, D), (missing, D + 1)):
        decoder = _decoder(daemon, worker_factory, cluster)
        assert decoder.call("link", P, "127.0.0.1", port) == (S.LLM_LINK_FAILED, [S.LLM_LINK_FAILED])
        with pytest.raises(WorkerError) as info:  # no link, so no transfer and no cache address learnt
            decoder.call("pull_blocks", P, "kv", [0], [0])
        assert info.value.status_code == S.LLM_NOT_YET_LINK
        assert not decoder.call("rows", "kv").any()
        assert links(daemon) == []
    assert links(dp) == []
    assert "refused a handshake from cluster 2 at 127.0.0.1: bad credential" in dp.log()
    assert "refused a handshake from cluster 3 at 127.0.0.1: bad credential" in dp.log()
    assert "authentication failed: wrong or missing shared secret" in wrong.log()
    # which secret each side holds, told apart by fingerprint (both are "the [peer] secret")
    fingerprints = [PeerSecret(s.encode(), "", True).fingerprint for s in (SECRET_A, SECRET_B)]
    assert f"the serving daemon uses the [peer] secret (DATADISTD_PEER_SECRET or the config file) (fingerprint " \
           f"{fingerprints[0]})" in wrong.log()
    assert f"this worker's daemon uses the [peer] secret (DATADISTD_PEER_SECRET or the config file) (fingerprint " \
           f"{fingerprints[1]})" in wrong.log()
    assert "this worker's daemon uses the per-user secret" in missing.log()
    for daemon in (dp, wrong, missing):  # the secret is never logged
        assert SECRET_A not in daemon.log() and SECRET_B not in daemon.log()
    # the right secret links and moves bytes
    right = daemon_factory("right", env={"DATADISTD_PEER_SECRET": SECRET_A})
    decoder = _decoder(right, worker_factory, D + 2)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    _pull_and_check(decoder, prompt, [1, 2, 3], [3, 4, 5])


def test_handshake_forgeries_are_refused(daemon_factory, worker_factory) -> None:
    dp, prompt, port = _prompt(daemon_factory, worker_factory, env={"DATADISTD_PEER_SECRET": SECRET_A})
    agent = PeerAgent(f"127.0.0.1:{port}", 77, P, secret=SECRET_A.encode())
    wrong = PeerAgent(f"127.0.0.1:{port}", 77, P, secret=SECRET_B.encode())
    dev = PeerAgent(f"127.0.0.1:{port}", 77, P, secret=DEV_SECRET)
    try:
        forgeries = {
            "empty request": peer_pb2.HandshakeRequest(),
            "wrong secret": wrong.offer(),
            "development secret": dev.offer(),
            "mac cut short": agent.offer(mac=agent.offer().mac[:16]),
            "mac of other fields": agent.offer(client_cluster_id=78),
            # correctly signed, but over a challenge this engine never issued (the protocol-1 way: own nonce)
            "challenge never issued": agent.offer(challenge=os.urandom(32)),
            "no challenge": agent.offer(challenge=b""),
            "other server cluster": None,
        }
        from datadistd.api.grpc.convert import offer_to_pb
        from datadistd.links.wire.peering import make_offer

        forgeries["other server cluster"] = offer_to_pb(make_offer(SECRET_A.encode(), 77, P + 40, agent.challenge()))
        for name, request in forgeries.items():
            with pytest.raises(grpc.RpcError) as info:
                agent.peer.Handshake(request, timeout=10)
            assert code_of(info.value) == S.LLM_LINK_FAILED, name
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE, name
            assert links(dp) == [], name
        # a replayed (captured) handshake is refused: it would let an eavesdropper take over the link
        offer = agent.offer()
        agent.peer.Handshake(offer, timeout=10)
        with pytest.raises(grpc.RpcError) as info:
            agent.peer.Handshake(offer, timeout=10)
        assert code_of(info.value) == S.LLM_LINK_FAILED
        assert "replayed" in info.value.details()
        # asking for a challenge of another cluster id is refused before anything is issued
        with pytest.raises(grpc.RpcError) as info:
            agent.peer.Challenge(peer_pb2.ChallengeRequest(protocol_version=PROTOCOL_VERSION, client_cluster_id=77,
                                                           server_cluster_id=P + 40), timeout=10)
        assert code_of(info.value) == S.LLM_LINK_FAILED and "cluster id mismatch" in info.value.details()
        assert "refused a handshake from cluster 77" in dp.log()
    finally:
        for a in (agent, wrong, dev):
            a.close()


def test_the_removed_owner_call_rpcs_are_not_served(daemon_factory, worker_factory) -> None:
    """Owner calls, unlink and pings are frames on the authenticated data channel only. The
    gRPC methods that carried them are gone (UNIMPLEMENTED, whatever the request names), and a peer of
    protocol 2 is refused at the challenge, naming both versions."""
    dp, prompt, port = _prompt(daemon_factory, worker_factory)
    prompt.call("allocate", "c", 2, (4, 64), dtype="uint8", keys=[(10, 0)])
    prompt.call("fill", "c", 2)
    before = prompt.call("digest", "kv"), prompt.call("digest", "c")
    agent = PeerAgent(f"127.0.0.1:{port}", 77, P).handshake(connect=False)
    request = ownerwire.encode_call(ReadCmd(1, 1, RemoteSpec(BlocksKeyRef(P, 0), ReadMode.BLOCKS, (0, 1),
                                                             expected_bytes=2 * TENSORS * ROW), 3000))
    try:
        for method in ("Read", "Release", "OpenWrite", "CommitWrite", "Ping", "Unlink"):
            call = agent._grpc.unary_unary(f"/datadist.v1.Peer/{method}")
            with pytest.raises(grpc.RpcError) as info:
                call(request, timeout=10)
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED, method
        with pytest.raises(grpc.RpcError) as info:
            agent.peer.Challenge(peer_pb2.ChallengeRequest(protocol_version=2, client_cluster_id=77,
                                                           server_cluster_id=P), timeout=10)
        assert code_of(info.value) == S.LLM_LINK_FAILED
        assert f"speaks v2, this daemon v{PROTOCOL_VERSION}" in info.value.details()
        # nothing moved, nothing was consumed: the cache bytes are the same and the key still pulls
        assert (prompt.call("digest", "kv"), prompt.call("digest", "c")) == before
        dd = daemon_factory("d")
        decoder = _decoder(dd, worker_factory, remote=False)
        decoder.call("allocate", "c", 2, (4, 64), dtype="uint8")
        assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
        decoder.call("pull_cache", P, "c", ("key", 10, 0), batch_index=3)
        np.testing.assert_array_equal(decoder.call("rows", "c")[:, 3], prompt.call("rows", "c")[:, 0])
    finally:
        agent.close()


# ---- bounds of peer requests ------------------------------------------------------------------------

#: a key of no kind (``ownerwire`` KEY kind 0): what no record carries
NO_KEY = None


def _spec(fields: dict) -> RemoteSpec:
    """A spec of loose field values (an int ``mode`` no ``ReadMode`` has is sent as it is)."""
    fields = {"key": BlocksKeyRef(P, 0), "mode": ReadMode.BLOCKS, "size": -1, **fields}
    fields["blocks"] = tuple(fields.get("blocks", ()))
    return RemoteSpec(**{**fields, "key": fields["key"] or BlocksKeyRef(P, 0)})


def _frame(cmd: Any, fields: dict) -> bytes:
    """``cmd``'s frame; ``key=NO_KEY`` in ``fields``: its (first) spec's key of kind 0."""
    frame = bytearray(ownerwire.encode_call(cmd))
    if "key" in fields and fields["key"] is NO_KEY:
        frame[ownerwire.HEAD.size + 8] = 0   # the key kind of a READ's spec and of an OPEN_WRITE's first piece
    return bytes(frame)


def _read(agent: PeerAgent, tid: int, **fields) -> None:  # noqa: ANN003
    agent.call_raw(_frame(ReadCmd(0, tid, _spec(fields), 3000), fields))


def _open_write(agent: PeerAgent, **fields) -> int:  # noqa: ANN003
    return agent.call_raw(_frame(OpenWriteCmd(0, (_spec(fields),), 3000), fields)).transfer_ids[0]


def _commit_write(agent: PeerAgent, tid: int) -> None:
    agent.call(CommitWriteCmd(0, (tid,), 3000))


def _bad_specs() -> list[tuple[str, dict, set[int]]]:
    good = 2 * TENSORS * ROW
    by_id = lambda cid, batch=0: IdIndexRef(P, cid, batch)  # noqa: E731
    inval, missing = {S.LLM_PARAM_INVALID}, {S.LLM_KV_CACHE_NOT_EXIST}
    slot = {"mode": ReadMode.SLOT, "key": by_id(2)}  # cache 2: contiguous, 4 slots of 64 bytes, 2 tensors
    return [
        ("block past the end", {"blocks": [0, BLOCKS], "expected_bytes": good}, inval),
        ("block 2**64-1", {"blocks": [2**64 - 1, 0], "expected_bytes": good}, inval),
        ("tensor range past the end", {"blocks": [0, 1], "tensor_start": 3, "tensor_count": 2,
                                       "expected_bytes": 2 * 2 * ROW}, inval),
        ("tensor_start 2**32-1", {"blocks": [0, 1], "tensor_start": 2**32 - 1, "tensor_count": 1,
                                  "expected_bytes": 2 * ROW}, inval),
        ("one byte more than the blocks", {"blocks": [0, 1], "expected_bytes": good + 1}, inval),
        ("expected_bytes 2**64-1", {"blocks": [0, 1], "expected_bytes": 2**64 - 1}, inval),
        ("unbound model id", {"key": BlocksKeyRef(P, 99), "blocks": [0, 1], "expected_bytes": good}, missing),
        ("not remotely accessible", {"key": BlocksKeyRef(P, 7), "blocks": [0, 1], "expected_bytes": good}, missing),
        ("slot mode on a blocks cache", {"mode": ReadMode.SLOT, "size": -1, "expected_bytes": good}, inval),
        ("unknown mode", {"mode": 9, "blocks": [0, 1], "expected_bytes": good}, inval),
        ("no key", {"key": NO_KEY, "blocks": [0, 1], "expected_bytes": good}, inval),
        ("slot size past the slot", {**slot, "size": 65, "expected_bytes": 2 * 65}, inval),
        ("slot size 2**62", {**slot, "size": 2**62, "expected_bytes": 2**63}, inval),
        ("slot size -5", {**slot, "size": -5, "expected_bytes": 10}, inval),
        ("slot offset 2**63", {**slot, "size": 1, "offset": 2**63, "expected_bytes": 2}, inval),
        ("slot offset past the slot", {**slot, "size": -1, "offset": 64, "expected_bytes": 0}, inval),
        ("batch index past the end", {**slot, "key": by_id(2, 4), "size": -1, "expected_bytes": 128},
         inval | missing),
        ("cache id -1", {**slot, "key": by_id(-1), "size": -1, "expected_bytes": 128}, inval | missing),
        ("cache id 2**63-1", {**slot, "key": by_id(2**63 - 1), "size": -1, "expected_bytes": 128}, inval | missing),
        ("a cache of another cluster", {"key": BlocksKeyRef(P + 1, 0), "blocks": [0, 1], "expected_bytes": good},
         inval | missing),
        ("(1 << 20) + 1 blocks", {"blocks": [0] * ((1 << 20) + 1), "expected_bytes": ((1 << 20) + 1) * TENSORS * ROW},
         inval),
    ]


def test_out_of_range_peer_requests_move_no_byte(daemon_factory, worker_factory) -> None:
    dp, prompt, port = _prompt(daemon_factory, worker_factory)
    prompt.call("allocate", "c", 2, (4, 64), dtype="uint8", keys=[(10, 0)])
    prompt.call("register_blocks", "hidden", TENSORS, BLOCKS, BLOCK_SHAPE, model_id=7, remote_accessible=False)
    prompt.call("fill", "c", 2)
    prompt.call("fill", "hidden", 3)
    digests = [prompt.call("digest", name) for name in ("kv", "c", "hidden")]
    agent = PeerAgent(f"127.0.0.1:{port}", 77, P).handshake()
    try:
        buf = Buffer(64 * TENSORS * ROW)
        receipt = agent.expect(buf, 2 * TENSORS * ROW)
        for name, fields, codes in _bad_specs():
            for verb in ("Read", "OpenWrite"):
                with pytest.raises(CallFailed) as info:
                    if verb == "Read":
                        _read(agent, receipt.transfer_id, **fields)
                    else:
                        _open_write(agent, **fields)
                    pytest.fail(f"{verb} {name}: accepted")
                assert info.value.status in codes, (verb, name, info.value.message)
        time.sleep(0.3)  # a stray frame would land by now
        assert receipt.received == 0 and not buf.array.any()
        assert agent.transport.stats()["bytes_received"] == agent.control_bytes   # the answers, no data
        assert [prompt.call("digest", name) for name in ("kv", "c", "hidden")] == digests
        # the same agent, in bounds: the bytes arrive exactly, and a write lands exactly where asked
        _read(agent, receipt.transfer_id, blocks=[3, 9], expected_bytes=2 * TENSORS * ROW)
        receipt.wait(time.monotonic() + 10)
        src = prompt.call("rows", "kv", None, [3, 9])
        np.testing.assert_array_equal(buf.array[:2 * TENSORS * ROW].reshape(TENSORS, 2, ROW), src)
        buf.array[:] = np.random.default_rng(4).integers(0, 256, buf.size, dtype=np.uint8)
        tid = _open_write(agent, blocks=[12, 5], expected_bytes=2 * TENSORS * ROW)
        agent.send(tid, buf, 2 * TENSORS * ROW)
        _commit_write(agent, tid)
        np.testing.assert_array_equal(prompt.call("rows", "kv", None, [12, 5]),
                                      buf.array[:2 * TENSORS * ROW].reshape(TENSORS, 2, ROW))
        assert [prompt.call("digest", name) for name in ("c", "hidden")] == digests[1:]
    finally:
        agent.close()


def test_a_peer_cannot_write_into_another_links_transfer(daemon_factory, worker_factory) -> None:
    """Authenticated peers share the secret, but a transfer id of one link is not a door for another."""
    dp, prompt, port = _prompt(daemon_factory, worker_factory)
    honest = PeerAgent(f"127.0.0.1:{port}", 77, P).handshake(streams=1)
    intruder = PeerAgent(f"127.0.0.1:{port}", 78, P).handshake(streams=1)
    try:
        n = 2 * TENSORS * ROW
        good, junk = Buffer(n), Buffer(n)
        good.array[:] = np.random.default_rng(21).integers(0, 256, n, dtype=np.uint8)
        junk.array[:] = 0xEE
        tid = _open_write(honest, blocks=[6, 7], expected_bytes=n)
        intruder.send(tid, junk, n)           # the intruder's frames name the honest link's transfer
        time.sleep(0.3)
        honest.send(tid, good, n)
        _commit_write(honest, tid)
        np.testing.assert_array_equal(prompt.call("rows", "kv", None, [6, 7]), good.array.reshape(TENSORS, 2, ROW))
    finally:
        honest.close()
        intruder.close()


def test_out_of_range_via_the_client_is_refused(daemon_factory, worker_factory) -> None:
    dp, prompt, port = _prompt(daemon_factory, worker_factory)
    dd = daemon_factory("d")
    decoder = _decoder(dd, worker_factory)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    decoder.call("fill", "kv", 5)
    mine, theirs = decoder.call("digest", "kv"), prompt.call("digest", "kv")
    cases = [
        ("pull_blocks", ([BLOCKS], [0]), {}),
        ("pull_blocks", ([0], [BLOCKS]), {}),
        ("pull_blocks", ([2**64 - 1], [0]), {}),
        ("pull_blocks", ([0, 1], [0]), {}),
        ("pull_blocks", ([0], [0]), {"src_layer_range": (0, 3), "dst_layer_range": (0, 3)}),
        ("pull_blocks", ([0], [0]), {"src_layer_range": (1, 2), "dst_layer_range": (0, 2)}),
        ("push_blocks", ([0], [BLOCKS]), {}),
        ("push_blocks", ([BLOCKS], [0]), {}),
        ("push_blocks", ([0, 1, 2], [0, 1]), {}),
        ("push_blocks", ([0], [0]), {"src_layer_range": (2, 3), "dst_layer_range": (2, 3)}),
    ]
    for op, (a, b), kw in cases:
        outcome, message = decoder.call("run", OPS, "try_op", op, P, "kv", a, b, **kw)
        assert outcome in ("LLM_PARAM_INVALID", "ValueError"), (op, a, b, kw, outcome, message)
    assert decoder.call("digest", "kv") == mine and prompt.call("digest", "kv") == theirs
    _pull_and_check(decoder, prompt, [0, 15], [15, 0])


# ---- the data-plane port ----------------------------------------------------------------------------

def _raw(endpoint: str) -> socket.socket:
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    return socket.create_connection((host.strip("[]"), int(port)), timeout=10)


def _refused(sock: socket.socket, payload: bytes) -> bool:
    """Send ``payload``; True when the listener closes without its one-byte ACK."""
    try:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(10)
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except OSError as exc:  # ENOTCONN: the listener already closed it - also a refusal
        if exc.errno == errno.ENOTCONN:
            return True
        raise
    finally:
        sock.close()


def test_garbage_on_the_data_plane_changes_nothing(daemon_factory, worker_factory) -> None:
    dp, prompt, port = _prompt(daemon_factory, worker_factory)
    dd = daemon_factory("d")
    decoder = _decoder(dd, worker_factory)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    _pull_and_check(decoder, prompt, [0], [0])  # warm: every connection of the link is up
    (link,) = links(dd)
    endpoint = link.data_endpoint
    fds = fd_count(dp.proc.pid)
    hello = struct.Struct("<4sBBHH")
    rng = np.random.default_rng(11)
    garbage = {
        "random bytes": rng.integers(0, 256, 4096, dtype=np.uint8).tobytes(),
        "http": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        "tls client hello": bytes.fromhex("160301002a0100002603035f") + bytes(40),
        "wrong token": hello.pack(b"DDHL", 1, 32, 0, 1) + os.urandom(32),
        "token length 0": hello.pack(b"DDHL", 1, 0, 0, 1),
        "token length 255": hello.pack(b"DDHL", 1, 255, 0, 1) + os.urandom(255),
        "stream index past count": hello.pack(b"DDHL", 1, 32, 5, 2) + os.urandom(32),
        "protocol version 9": hello.pack(b"DDHL", 9, 32, 0, 1) + os.urandom(32),
        "closed mid-token": hello.pack(b"DDHL", 1, 32, 0, 1) + os.urandom(5),
        "frame without hello": struct.pack("<4sBxxxQQQ", b"DDFR", 1, 1, 0, 1 << 20) + bytes(1024),
    }
    for name, payload in garbage.items():
        assert _refused(_raw(endpoint), payload), name
    # a flood of silent connections beyond the pending-handshake limit, held open during a transfer
    silent = [_raw(endpoint) for _ in range(72)]
    try:
        _pull_and_check(decoder, prompt, [2, 3, 4], [7, 8, 9])
    finally:
        for s in silent:
            s.close()
    # an authenticated peer that turns hostile: bad frames break only its own channel
    agent = PeerAgent(f"127.0.0.1:{port}", 77, P).handshake(streams=1)
    try:
        sock = agent.channel._live()[0].sock  # noqa: SLF001 - raw frames on the agent's own socket
        sock.sendall(struct.pack("<4sBxxxQQQ", b"DDFR", 1, 12345, 0, 64) + bytes(64))  # an unknown transfer
        sock.sendall(struct.pack("<4sBxxxQQQ", b"DDFR", 7, 1, 0, 0))                    # an unknown frame kind
    finally:
        agent.close()
    # the stale token of that agent is refused once its link is gone
    assert wait_until(lambda: all(lk.remote_cluster_id != 77 for lk in links(dp)), 10)
    assert _refused(_raw(agent.endpoint), hello.pack(b"DDHL", 1, len(agent.token), 0, 1) + agent.token)
    # the legitimate link never noticed
    assert [lk.state for lk in links(dd)] == ["established"]
    decoder.call("zero", "kv")
    _pull_and_check(decoder, prompt, list(range(BLOCKS)), list(range(BLOCKS))[::-1])
    assert wait_until(lambda: fd_count(dp.proc.pid) <= fds, 10), (fd_count(dp.proc.pid), fds)
    assert "connection refused or closed" in dp.log()   # rate-limited: the first at once


# ---- what is open, and to whom -------------------------------------------------------------------------

def test_worker_socket_and_pools_are_private(daemon_factory, worker_factory) -> None:
    d = daemon_factory()
    w = worker_factory(d)
    w.call("init", "PROMPT", P, mem_pool=1 << 20)
    w.call("allocate", "x", 1, (4, 64), dtype="uint8", blocks=True)
    for path, allowed in ((d.socket, 0o660), (d.socket + ".attach", 0o660), (d.socket + ".admin", 0o600)):
        mode = stat.S_IMODE(os.stat(path).st_mode)
        assert mode & ~allowed == 0, (path, oct(mode))
    # pools are memfds: open in the daemon, in no directory anyone could list or open
    assert pool_memfds(d.proc.pid)
    assert not glob.glob(os.path.join(d.shm_dir, "datadist-*")) and not glob.glob("/dev/shm/datadist-*-device-*")
    # a world-accessible mode is a configuration error, not a silent exposure
    for env in ({"DATADISTD_DAEMON_SOCKET_MODE": "0o666"},):
        bad = Daemon("bad", env=env)
        with pytest.raises(RuntimeError, match="world"):
            bad.start(timeout=20)
        bad.discard()


def test_tcp_listeners_bind_where_configured_and_nowhere_else(daemon_factory, worker_factory) -> None:
    d = daemon_factory()
    pid = d.proc.pid
    assert listening_sockets(pid) == set()  # the worker socket is a unix socket; metrics are off
    port = free_port("127.0.0.2")
    prompt = worker_factory(d)
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.2:{port}")
    decoder = worker_factory(d)
    decoder.call("init", "DECODER", D)
    found = listening_sockets(pid)
    assert ("127.0.0.2", port) in found
    # one data-plane listener per engine: the listening engine's on its listen ip, the other on
    # [transport] host (loopback); the peer listener's private gRPC port behind its front, on
    # 127.0.0.1; no wildcard address anywhere
    assert len(found) == 4, found
    others = found - {("127.0.0.2", port)}
    assert sorted(ip for ip, _ in others) == ["127.0.0.1", "127.0.0.1", "127.0.0.2"], found
    prompt.call("register_blocks", "kv", 1, 4, (4, 4), model_id=0)
    decoder.call("register_blocks", "kv", 1, 4, (4, 4))
    assert decoder.call("link", P, "127.0.0.2", port, local_ip="127.0.0.1") == (0, [0])
    # the peer port serves Peer only: memory is allocated and registered through the worker socket alone
    with grpc.insecure_channel(f"127.0.0.2:{port}") as ch:
        s = datadist_pb2_grpc.DataDistStub(ch)
        for method, request in (("Init", datadist_pb2.InitRequest(cluster_id=9, role=1)),
                                ("AllocateCache", datadist_pb2.AllocateCacheRequest(engine_id=1)),
                                ("RegisterCache", datadist_pb2.RegisterCacheRequest(engine_id=1)),
                                ("GetStatus", datadist_pb2.StatusRequest())):
            with pytest.raises(grpc.RpcError) as info:
                getattr(s, method)(request, timeout=10)
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED, method
    # finalize: every listener goes
    prompt.call("finalize")
    decoder.call("finalize")
    assert wait_until(lambda: listening_sockets(pid) == set(), 10), listening_sockets(pid)
