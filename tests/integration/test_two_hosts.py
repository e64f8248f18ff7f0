"""docs/operations.md "Two hosts", followed step by step between two network namespaces whose firewalls
(nftables) open only the ports that checklist lists (issue 29, finding 4).

Prompt host ``a``: a secret file, ``[transport] data_ports``, the prompt example listening on its own address;
its firewall accepts the listen port and the data ports, nothing else new. Decoder host ``b``: the same secret
file, no inbound port at all. Then ``datadistctl ping`` from ``b`` and the two examples. The same firewall with
the data plane on a port the kernel picks (the default) lets the handshake through but not the data connections:
the link fails -- what an operator without the port list met. Needs root, iproute2 and nft; skipped otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import Daemon
from tests.reliability.common import status, wait_until

from .test_examples import Script, run_pair, user_env
from .test_netns import Hosts

pytestmark = [pytest.mark.integration, pytest.mark.netns]

if os.geteuid() != 0 or shutil.which("ip") is None:
    pytest.skip("network-namespace tests need root and iproute2 (ip netns)", allow_module_level=True)
if shutil.which("nft") is None:
    pytest.skip("the two-host firewall test needs nft (apt-get install nftables; .ci/run installs it)",
                allow_module_level=True)

LISTEN_PORT = 26000                  # the prompt worker's listen_ip_info port
DATA_PORTS = (26100, 26101)          # [transport] data_ports of the prompt host


def firewall(ns: str, *accept_ports: str) -> None:
    """The checklist's rules: inbound dropped except replies, loopback and ``accept_ports`` (TCP)."""
    rules = ["add table inet datadist",
             "add chain inet datadist input { type filter hook input priority 0 ; policy drop ; }",
             "add rule inet datadist input ct state established,related accept",
             "add rule inet datadist input iif lo accept"]
    if accept_ports:
        rules.append(f"add rule inet datadist input tcp dport {{ {', '.join(accept_ports)} }} accept")
    subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input="\n".join(rules) + "\n", text=True,
                   check=True, capture_output=True, timeout=10)


@pytest.fixture
def hosts(tmp_path):
    h = Hosts(rate="1gbit")
    secret = tmp_path / "peer.secret"
    secret.write_text("two-host-checklist-secret\n")   # step 1: the same secret file on both hosts
    os.chmod(secret, 0o600)
    h.secret_file = str(secret)
    firewall(h.a, str(LISTEN_PORT), f"{DATA_PORTS[0]}-{DATA_PORTS[1]}")   # step 4: the prompt host's ports
    firewall(h.b)                                                          # the decoder host: none
    yield h
    h.remove()


def daemons(hosts: Hosts, data_ports: str) -> list[Daemon]:
    env = {"DATADISTD_PEER_SECRET_FILE": hosts.secret_file}
    a = {**env, "DATADISTD_TRANSPORT_DATA_PORTS": data_ports} if data_ports else env                 # step 3
    b = {**env, "DATADISTD_TRANSPORT_CONNECT_TIMEOUT_SECONDS": "2"}
    return Daemon.start_all([Daemon("host-a", env=a, netns=hosts.a), Daemon("host-b", env=b, netns=hosts.b)])


def ping(hosts: Hosts) -> subprocess.CompletedProcess[str]:
    """Step 5: ``datadistctl ping <prompt listen address>`` from the decoder host."""
    return subprocess.run(["ip", "netns", "exec", hosts.b, sys.executable, "-m", "datadistd.process.ctl", "ping",
                           f"{hosts.ip_a}:{LISTEN_PORT}", "-n", "1"], capture_output=True, text=True, timeout=60)


def test_two_hosts_behind_firewalls_from_the_checklist(hosts) -> None:
    da, db = daemons(hosts, f"{DATA_PORTS[0]}-{DATA_PORTS[1]}")
    try:
        listen = f"{hosts.ip_a}:{LISTEN_PORT}"                                                       # step 2
        prompt = Script("prompt_worker.py", ["--listen", listen, "--timeout", "60"],
                        user_env(DATADIST_DAEMON=da.target))
        try:
            prompt.wait_for("serves")
            done = ping(hosts)
            assert done.returncode == 0 and "SERVING" in done.stdout, done.stdout + done.stderr
        finally:
            prompt.kill()
        # the daemon finalizes the killed worker's engine (and closes its listener) once it sees the lease end
        assert wait_until(lambda: not status(da).engines, 30), status(da)
        run_pair(user_env(DATADIST_DAEMON=da.target), user_env(DATADIST_DAEMON=db.target), listen,
                 local_ip=hosts.ip_b)
    finally:
        for d in (da, db):
            d.discard()


def test_without_data_ports_the_firewall_stops_the_data_plane(hosts) -> None:
    """The default (a data port the kernel picks) behind the same firewall: the handshake on the listen port
    passes, the data connections do not, and the decoder's reason says why and what to set."""
    da, db = daemons(hosts, "")
    try:
        listen = f"{hosts.ip_a}:{LISTEN_PORT}"
        prompt = Script("prompt_worker.py", ["--listen", listen, "--timeout", "60"],
                        user_env(DATADIST_DAEMON=da.target))
        try:
            prompt.wait_for("serves")
            assert ping(hosts).returncode == 0        # the listen port is open
            decoder = Script("decoder_worker.py", ["--prompt", listen, "--local-ip", hosts.ip_b, "--wait", "0"],
                             user_env(DATADIST_DAEMON=db.target))
            code, out = decoder.finish()
        finally:
            prompt.kill()
        assert code == 1 and "link_clusters to" in out and "LLM_LINK_FAILED" in out, out
        # the reason names the fix and where it was tried, and the prompt host had warned (issue 44, trip 7)
        assert f"TCP to {hosts.ip_a}:" in out and "[transport] data_ports" in out and "firewall" in out, out
        assert Path(da.log_path).read_text().count("data_ports is unset") == 1, da.log()
    finally:
        for d in (da, db):
            d.discard()
