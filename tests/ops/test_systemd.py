"""The systemd side: the unit verifies, and the daemon speaks sd_notify and journald's format."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.harness import ROOT

from .conftest import run, tool

pytestmark = pytest.mark.integration


def test_unit_passes_systemd_analyze_verify() -> None:
    """The same check as ``make deploy-check`` (deploy/check.sh renders ExecStart to this venv's datadistd)."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed: cannot verify the unit here")
    exe = tool("datadistd")
    if exe is None:
        pytest.skip("the datadistd console script is not installed in this venv (pip install -e .)")
    done = run([str(ROOT / "deploy" / "check.sh"), exe], timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "deploy-check: datadistd.service: ok" in done.stdout


class Notifications:
    """A unix datagram socket standing in for systemd's ``$NOTIFY_SOCKET``."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="datadist-notify-")
        self.path = os.path.join(self.dir, "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.seen: list[str] = []

    def wait_for(self, line: str, proc: subprocess.Popen, timeout: float = 20.0) -> list[str]:
        """Receive datagrams until one carries ``line``; returns that message's lines."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.05, min(0.5, deadline - time.monotonic())))
            try:
                message = self.sock.recv(4096).decode()
            except socket.timeout:
                if proc.poll() is not None:
                    break
                continue
            self.seen.append(message)
            if line in message.splitlines():
                return message.splitlines()
        raise AssertionError(f"no {line!r} within {timeout}s; received {self.seen}")

    def close(self) -> None:
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def start_daemon(tmp: Path, env: dict[str, str], *args: str, stderr: object = None) -> subprocess.Popen:
    full_env = {**os.environ, "DATADISTD_MEMORY_SHM_DIR": str(tmp), **env}
    for name in ("WATCHDOG_USEC", "WATCHDOG_PID", "JOURNAL_STREAM"):
        if name not in env:
            full_env.pop(name, None)
    return subprocess.Popen([sys.executable, "-m", "datadistd", "--socket", str(tmp / "d.sock"), *args],
                            env=full_env, stdout=subprocess.DEVNULL, stderr=stderr or subprocess.DEVNULL)


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
        raise


def test_ready_then_stopping_then_exit_0_with_journal_format(tmp_path: Path) -> None:
    notes = Notifications()
    log_path = tmp_path / "stderr.log"
    with open(log_path, "wb") as log:
        st = os.fstat(log.fileno())
        # JOURNAL_STREAM names stderr's device:inode, as systemd sets it when stderr is the journal
        proc = start_daemon(tmp_path, {"NOTIFY_SOCKET": notes.path, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"},
                            stderr=log)
        try:
            ready = notes.wait_for("READY=1", proc)
            assert f"MAINPID={proc.pid}" in ready
            assert any(line.startswith("STATUS=serving on ") for line in ready)
            assert (tmp_path / "d.sock").exists()  # READY only once the worker socket is up
            proc.send_signal(signal.SIGTERM)
            notes.wait_for("STOPPING=1", proc)
            assert stop(proc) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
            notes.close()
    lines = log_path.read_text().splitlines()
    assert any(line.startswith("<6>datadistd.process.app: datadistd ready: ") for line in lines), lines
    for line in lines:  # journald adds time and pid itself; each line starts with a <priority>
        assert line[:1] == "<" and line[2:3] == ">", line
        assert not line[3:7].isdigit(), line


def test_watchdog_pings_and_log_level_from_config(tmp_path: Path) -> None:
    notes = Notifications()
    log_path = tmp_path / "stderr.log"
    with open(log_path, "wb") as log:
        proc = start_daemon(tmp_path, {"NOTIFY_SOCKET": notes.path, "WATCHDOG_USEC": "200000",
                                       "DATADISTD_DAEMON_LOG_LEVEL": "WARNING"}, stderr=log)
        try:
            notes.wait_for("READY=1", proc)
            notes.wait_for("WATCHDOG=1", proc)
            notes.wait_for("WATCHDOG=1", proc)  # periodic, not once
            assert stop(proc) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
            notes.close()
    text = log_path.read_text()
    assert " INFO " not in text, text  # WARNING level: the INFO lines of start and stop are gone


def test_no_watchdog_pings_without_watchdog_usec(tmp_path: Path) -> None:
    notes = Notifications()
    proc = start_daemon(tmp_path, {"NOTIFY_SOCKET": notes.path})
    try:
        notes.wait_for("READY=1", proc)
        proc.send_signal(signal.SIGTERM)
        notes.wait_for("STOPPING=1", proc)
        assert stop(proc) == 0
        assert not any("WATCHDOG=1" in m for m in notes.seen), notes.seen
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        notes.close()


def test_bad_log_level_is_a_config_error(tmp_path: Path) -> None:
    done = run([sys.executable, "-m", "datadistd", "--socket", str(tmp_path / "d.sock"), "--log-level", "LOUD"])
    assert done.returncode == 2
    assert done.stderr.strip() == "datadistd: daemon.log_level: expected one of DEBUG, INFO, WARNING, ERROR, " \
                                  "CRITICAL, got 'LOUD'"


def test_journal_stream_of_another_file_keeps_timestamps(tmp_path: Path) -> None:
    from datadistd.process.cli import stderr_is_journal

    assert not stderr_is_journal({"JOURNAL_STREAM": "1:2"})
    assert not stderr_is_journal({"JOURNAL_STREAM": "garbage"})
    assert not stderr_is_journal({})
    st = os.fstat(2)
    assert stderr_is_journal({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
