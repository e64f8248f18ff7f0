"""Mutual TLS on the peer plane (``[tls]``): daemons that share a CA link and move bytes; a peer with
no certificate, a certificate of another CA, or no TLS at all is refused before any RPC runs and never
reaches a cache; listeners are verified by the address dialled (or ``[tls] server_name``); certificate
files rotate without a restart; the diagnostics (grpcurl, ``datadistctl ping``) speak TLS too.

Certificates come from ``trustme`` (a throwaway CA per module, written to a private directory).
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import time

import grpc
import numpy as np
import pytest
import trustme

from datadist.status import LLMStatusCode as S
from datadist.v1 import peer_pb2, peer_pb2_grpc
from tests.harness import WorkerError, free_port
from tests.ops.conftest import tool
from tests.reliability.common import links, status, wait_until

pytestmark = pytest.mark.integration

P, D = 1, 2
TENSORS, BLOCKS, BLOCK_SHAPE = 4, 16, (8, 32)


class Pki:
    """A CA and the certificates it issues, as files; ``env(name)`` configures a daemon with them."""

    def __init__(self, directory: str, name: str) -> None:
        self.dir = directory
        self.ca = trustme.CA(organization_name=f"datadist test {name}")
        self.ca_file = os.path.join(directory, f"{name}-ca.pem")
        self.ca.cert_pem.write_to_path(self.ca_file)

    def issue(self, name: str, *identities: str) -> tuple[str, str]:
        cert = self.ca.issue_cert(*(identities or ("127.0.0.1", "localhost")), common_name=name)
        cert_file, key_file = os.path.join(self.dir, f"{name}.pem"), os.path.join(self.dir, f"{name}.key")
        self._write(cert_file, b"".join(blob.bytes() for blob in cert.cert_chain_pems))
        self._write(key_file, cert.private_key_pem.bytes())
        return cert_file, key_file

    @staticmethod
    def _write(path: str, data: bytes) -> None:
        """Replace atomically, as a rotation tool would (a new inode; readers never see half a file)."""
        tmp = path + ".tmp"
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(data)
        os.replace(tmp, path)

    def env(self, name: str, *identities: str, **extra: str) -> dict[str, str]:
        cert_file, key_file = self.issue(name, *identities)
        return {"DATADISTD_TLS_ENABLED": "true", "DATADISTD_TLS_CERT_FILE": cert_file,
                "DATADISTD_TLS_KEY_FILE": key_file, "DATADISTD_TLS_CA_FILE": self.ca_file, **extra}


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:  # noqa: ANN001
    return Pki(str(tmp_path_factory.mktemp("pki")), "cluster")


@pytest.fixture(scope="module")
def rogue(tmp_path_factory) -> Pki:  # noqa: ANN001
    return Pki(str(tmp_path_factory.mktemp("rogue")), "rogue")


def _prompt(daemon_factory, worker_factory, env):  # noqa: ANN001, ANN202
    dp = daemon_factory("tls-p", env=env)
    port = free_port()
    prompt = worker_factory(dp)
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True,
                sync_kv_timeout=3000, mem_pool=4 << 20)
    prompt.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE, model_id=0)
    prompt.call("fill", "kv", 1)
    return dp, prompt, port


def _decoder(daemon, worker_factory, cluster=D):  # noqa: ANN001, ANN202
    decoder = worker_factory(daemon)
    decoder.call("init", "DECODER", cluster, remote_cache_accessible=True, sync_kv_timeout=3000, mem_pool=1 << 20)
    decoder.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE)
    return decoder


def _pull_and_check(decoder, prompt, src, dst) -> None:  # noqa: ANN001
    decoder.call("pull_blocks", P, "kv", src, dst)
    np.testing.assert_array_equal(decoder.call("rows", "kv", None, dst), prompt.call("rows", "kv", None, src))


def _server_certificate(port: int, pki: Pki, client: tuple[str, str]) -> bytes:
    """The DER certificate the listener presents to a new connection (a fresh TLS handshake)."""
    context = ssl.create_default_context(cafile=pki.ca_file)
    context.load_cert_chain(*client)
    context.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.getpeercert(binary_form=True)


def _pem_to_der(path: str) -> bytes:
    with open(path) as f:
        return ssl.PEM_cert_to_DER_cert(f.read().split("-----END CERTIFICATE-----")[0] + "-----END CERTIFICATE-----\n")


def test_mutual_tls_links_and_moves_bytes(daemon_factory, worker_factory, pki) -> None:  # noqa: ANN001
    dp, prompt, port = _prompt(daemon_factory, worker_factory, pki.env("prompt-node"))
    dd = daemon_factory("tls-d", env=pki.env("decoder-node"))
    decoder = _decoder(dd, worker_factory)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    _pull_and_check(decoder, prompt, [0, 5, 9], [1, 2, 3])
    decoder.call("fill", "kv", 7)
    decoder.call("push_blocks", P, "kv", [4, 6], [10, 11])
    np.testing.assert_array_equal(prompt.call("rows", "kv", None, [10, 11]), decoder.call("rows", "kv", None, [4, 6]))
    assert status(dp).peer_security == status(dd).peer_security == "mtls"
    assert "(mutual TLS)" in dp.log() and "peers=mutual TLS" in dd.log()
    assert decoder.call("unlink", P, "127.0.0.1", port) == (0, [0])


def test_peers_without_a_cluster_certificate_are_refused(daemon_factory, worker_factory, pki, rogue) -> None:  # noqa: ANN001
    dp, prompt, port = _prompt(daemon_factory, worker_factory, pki.env("prompt-node"))
    refused = {
        "no TLS at all": daemon_factory("plain"),
        "certificate of another CA": daemon_factory("rogue", env=rogue.env("rogue-node")),
    }
    for cluster, (why, daemon) in enumerate(refused.items(), start=D):
        decoder = _decoder(daemon, worker_factory, cluster)
        assert decoder.call("link", P, "127.0.0.1", port) == (S.LLM_LINK_FAILED, [S.LLM_LINK_FAILED]), why
        with pytest.raises(WorkerError) as info:  # no link: nothing to pull through, no cache address learnt
            decoder.call("pull_blocks", P, "kv", [0], [0])
        assert info.value.status_code == S.LLM_NOT_YET_LINK, why
        assert not decoder.call("rows", "kv").any(), why
        assert links(daemon) == [], why
        assert f"link_one cluster 1 at 127.0.0.1:{port} failed" in daemon.log(), why  # logged by the linking side
    # hand-made clients: plaintext, and TLS that trusts the CA but shows no certificate
    with open(pki.ca_file, "rb") as f:
        server_only = grpc.ssl_channel_credentials(root_certificates=f.read())
    for why, channel in (("plaintext client", grpc.insecure_channel(f"127.0.0.1:{port}")),
                         ("no client certificate", grpc.secure_channel(f"127.0.0.1:{port}", server_only))):
        with channel:
            with pytest.raises(grpc.RpcError) as err:
                peer_pb2_grpc.PeerStub(channel).Handshake(peer_pb2.HandshakeRequest(), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE, why
    assert links(dp) == []
    assert "enable [tls] on this node too" in refused["no TLS at all"].log()
    assert "chain to each other's [tls] ca_file" in refused["certificate of another CA"].log()
    # the listener's side: grpc records refused TLS handshakes in the daemon's log (the journal); a client
    # of another CA gives up on the listener's certificate first, so only the client logs that one
    assert wait_until(lambda: "PEER_DID_NOT_RETURN_A_CERTIFICATE" in dp.log() and "WRONG_VERSION_NUMBER" in dp.log(),
                      5), dp.log()
    # the prompt still serves a peer of its own CA ...
    good = daemon_factory("good", env=pki.env("good-node"))
    decoder = _decoder(good, worker_factory, D + 5)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    _pull_and_check(decoder, prompt, [2, 3], [7, 8])
    # ... and a TLS node never falls back to plaintext: a plaintext listener is refused
    _, _, plain_port = _prompt(daemon_factory, worker_factory, {})
    decoder = _decoder(good, worker_factory, D + 6)
    assert decoder.call("link", P, "127.0.0.1", plain_port) == (S.LLM_LINK_FAILED, [S.LLM_LINK_FAILED])
    assert "that the peer has [tls] enabled" in good.log()


def test_listener_certificate_must_match_the_address_or_server_name(daemon_factory, worker_factory, pki) -> None:  # noqa: ANN001
    # the prompt's certificate names a DNS name only: dialling 127.0.0.1 cannot verify it ...
    dp, prompt, port = _prompt(daemon_factory, worker_factory, pki.env("dns-only", "prompt.kv.internal"))
    decoder = _decoder(daemon_factory("by-ip", env=pki.env("by-ip")), worker_factory)
    assert decoder.call("link", P, "127.0.0.1", port) == (S.LLM_LINK_FAILED, [S.LLM_LINK_FAILED])
    # ... unless the decoder's node is told which name to verify
    named = daemon_factory("by-name", env=pki.env("by-name", DATADISTD_TLS_SERVER_NAME="prompt.kv.internal"))
    decoder = _decoder(named, worker_factory, D + 1)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    _pull_and_check(decoder, prompt, [4], [4])


def test_certificates_rotate_without_a_restart(daemon_factory, worker_factory, pki, tmp_path) -> None:  # noqa: ANN001
    env = pki.env("rotating")
    dp, prompt, port = _prompt(daemon_factory, worker_factory, env)
    probe = pki.issue("probe")
    cert_file = env["DATADISTD_TLS_CERT_FILE"]
    first = _server_certificate(port, pki, probe)
    assert first == _pem_to_der(cert_file)
    pki.issue("rotating")  # a new certificate and key over the same paths, as cert-manager/certbot do
    second = _server_certificate(port, pki, probe)
    assert second == _pem_to_der(cert_file) != first
    # a broken set (the key of another certificate) is refused with a warning; the last good set stays
    other_cert, _ = pki.issue("unrelated")
    with open(other_cert, "rb") as f:
        Pki._write(cert_file, f.read())
    assert _server_certificate(port, pki, probe) == second
    assert wait_until(lambda: "do not load" in dp.log(), 5)
    decoder = _decoder(daemon_factory("after-rotation", env=pki.env("after-rotation")), worker_factory)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    _pull_and_check(decoder, prompt, [1], [2])


def test_grpcurl_and_ctl_ping_speak_tls(daemon_factory, worker_factory, pki, tmp_path) -> None:  # noqa: ANN001
    dp, _prompt_worker, port = _prompt(daemon_factory, worker_factory, pki.env("prompt-node"))
    cert_file, key_file = pki.issue("operator")
    grpcurl = tool("grpcurl")
    if grpcurl is not None:
        def run(*flags: str) -> subprocess.CompletedProcess:
            return subprocess.run([grpcurl, *flags, f"127.0.0.1:{port}", "list"], capture_output=True, text=True,
                                  timeout=30)

        listed = run("-cacert", pki.ca_file, "-cert", cert_file, "-key", key_file)
        assert listed.returncode == 0, listed.stderr
        assert "datadist.v1.Peer" in listed.stdout.split()
        # refused handshakes: grpcurl retries them until its connect timeout (10 s by default)
        assert run("-cacert", pki.ca_file, "-connect-timeout", "2").returncode != 0   # no client certificate
        assert run("-plaintext", "-connect-timeout", "2").returncode != 0             # no TLS
    config = tmp_path / "ctl.toml"
    config.write_text(f'[tls]\nenabled = true\ncert_file = "{cert_file}"\nkey_file = "{key_file}"\n'
                      f'ca_file = "{pki.ca_file}"\n')
    ctl = [sys.executable, "-m", "datadistd.process.ctl"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATADISTD_")}
    ok = subprocess.run([*ctl, "--config", str(config), "ping", f"127.0.0.1:{port}", "-n", "1", "--json"],
                        capture_output=True, text=True, timeout=30, env=env)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["tls"] is True and json.loads(ok.stdout)["status"] == "SERVING"
    flags = subprocess.run([*ctl, "ping", f"127.0.0.1:{port}", "-n", "1", "--tls-cert", cert_file, "--tls-key",
                            key_file, "--tls-ca", pki.ca_file], capture_output=True, text=True, timeout=30, env=env)
    assert flags.returncode == 0 and "(mutual TLS)" in flags.stdout, flags.stderr
    plain = subprocess.run([*ctl, "ping", f"127.0.0.1:{port}", "-n", "1", "--timeout", "2"], capture_output=True,
                           text=True, timeout=30, env=env)
    assert plain.returncode == 1 and "cannot reach peer" in plain.stderr
    half = subprocess.run([*ctl, "ping", f"127.0.0.1:{port}", "--tls-ca", pki.ca_file], capture_output=True,
                          text=True, timeout=30, env=env)
    assert half.returncode == 1 and "go together" in half.stderr


@pytest.mark.parametrize("case", ["missing files", "key of another certificate", "not PEM"])
def test_bad_tls_config_stops_the_daemon_with_a_clear_message(pki, tmp_path, case: str) -> None:  # noqa: ANN001
    cert_file, key_file = pki.issue("bad-config")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATADISTD_")}
    env.update({"DATADISTD_TLS_ENABLED": "1", "DATADISTD_MEMORY_SHM_DIR": str(tmp_path)})
    if case == "missing files":
        want_code, needle = 2, "tls.enabled needs tls.cert_file, tls.key_file, tls.ca_file"
    elif case == "key of another certificate":
        _, other_key = pki.issue("bad-config-other")
        env.update({"DATADISTD_TLS_CERT_FILE": cert_file, "DATADISTD_TLS_KEY_FILE": other_key,
                    "DATADISTD_TLS_CA_FILE": pki.ca_file})
        want_code, needle = 1, "are not a matching PEM certificate and private key"
    else:
        garbage = tmp_path / "ca.pem"
        garbage.write_text("not a certificate\n")
        env.update({"DATADISTD_TLS_CERT_FILE": cert_file, "DATADISTD_TLS_KEY_FILE": key_file,
                    "DATADISTD_TLS_CA_FILE": str(garbage)})
        want_code, needle = 1, f"ca_file {garbage} is not a PEM CA bundle"
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "datadistd", "--socket", str(tmp_path / "d.sock")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == want_code, done.stderr
    assert needle in done.stderr
    assert not (tmp_path / "d.sock").exists() and time.monotonic() - t0 < 60
    assert not [p for p in os.listdir(tmp_path) if p.startswith("datadist")]  # nothing left behind
