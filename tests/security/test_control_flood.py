"""An authenticated peer flooding its link with control frames is dropped, its memory bounded.

The other end of a link (a ``PeerAgent``: the right secret, a real data connection, written by hand) sends
100,000 ping calls (``ownerwire`` frames) in one burst and never reads the answers. The frames its connection's
reader hands to the event loop, and the answers running for them, are bounded per link
(``links.calls._QUEUED_FRAMES``, ``_QUEUED_BYTES``): past the bound the daemon drops that link with the reason in
its log, its memory grows by less than the burst would hold, and an honest peer linked to the same engine is
answered throughout. Before, every frame was queued and answered (a task each), whatever the rate.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from datadistd.links.calls import _QUEUED_FRAMES
from datadistd.links.wire import ownerwire
from datadistd.links.wire.ownercalls import PingCmd
from datadistd.transport.base import CONTROL_CALL
from datadistd.transport.tcp import HEADER
from tests.daemonproc import DaemonProcess, free_port
from tests.harness import Worker
from tests.reliability.common import PeerAgent, links, wait_until
from tests.unit.test_transport_tcp import raw_hello

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

P = 1
FLOOD = 100_000


def _peak_kib(pid: int) -> int:
    """The process's peak resident memory so far (``VmHWM``), KiB."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def _closed_by_the_daemon(sock: socket.socket, timeout: float) -> bool:
    """Read (and throw away) what the daemon sent until it closes the connection; False if it never does."""
    sock.settimeout(timeout)
    try:
        while sock.recv(1 << 20):
            pass
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return True


def test_a_peer_flooding_control_frames_loses_its_link_and_nobody_else_does() -> None:
    port = free_port()
    d = DaemonProcess("flood").start()
    w = Worker({"DATADIST_DAEMON": d.target})
    honest = PeerAgent(f"127.0.0.1:{port}", 77, P)
    hostile = PeerAgent(f"127.0.0.1:{port}", 66, P)
    try:
        w.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}")
        honest.handshake(streams=1)
        hostile.handshake(connect=False)
        sock = raw_hello(hostile.endpoint, hostile.token)   # a data connection of its own
        honest.call(PingCmd(0), timeout=10)
        assert sorted(lk.remote_cluster_id for lk in links(d)) == [66, 77]
        before = _peak_kib(d.proc.pid)
        burst = b"".join(HEADER.pack(b"DDFR", CONTROL_CALL, 0, 0, len(p)) + p for p in (
            ownerwire.encode_call(PingCmd(i + 1)) for i in range(FLOOD)))
        sender = threading.Thread(target=lambda: _send_all(sock, burst), daemon=True)
        sender.start()
        # the daemon drops the flooder's link, saying why, and closes its connection
        assert _closed_by_the_daemon(sock, 30), "the flooding connection was never closed"
        assert wait_until(lambda: [lk.remote_cluster_id for lk in links(d)] == [77], 10), links(d)
        # its memory never held more than a few thousand of the 100,000 frames (and answers)
        grown = _peak_kib(d.proc.pid) - before
        print(f"\nthe daemon's peak RSS grew by {grown >> 10} MiB under the flood")
        assert grown < 48 << 10, (before, grown)
        logged = Path(d.log_path).read_text()
        assert f"more than {_QUEUED_FRAMES} control frames" in logged and "dropping its link" in logged
        # the honest peer's link to the same engine is answered throughout
        for _ in range(20):
            honest.call(PingCmd(0), timeout=10)
        sender.join(10)
        sock.close()
    finally:
        hostile.close()
        honest.close()
        w.close()
        d.discard()


def _send_all(sock: socket.socket, data: bytes) -> None:
    sock.settimeout(30)
    try:
        sock.sendall(data)
    except OSError:
        pass   # the daemon closed the connection mid-burst: what the test waits for
