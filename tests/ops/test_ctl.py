"""``datadistctl`` against real daemons: JSON that matches the daemon, tables, ping, clear errors."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import grpc
import pytest

from datadist.v1 import datadist_pb2, datadist_pb2_grpc
from tests.harness import free_port

from .conftest import BLOCK_BYTES, PULLED, TENSORS, D, P, run, tool

pytestmark = pytest.mark.integration

SCRIPT = tool("datadistctl")


def ctl(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """The installed console script when present (it is after ``pip install -e .``), else the module."""
    cmd = [SCRIPT] if SCRIPT else [sys.executable, "-m", "datadistd.process.ctl"]
    env = {**(env or {})}
    env.setdefault("DATADIST_DAEMON", "")
    done = run([*cmd, *args], env=env)
    return done.returncode, done.stdout, done.stderr


def get_status(daemon) -> datadist_pb2.DaemonStatus:  # noqa: ANN001
    with grpc.insecure_channel(daemon.admin_target) as ch:
        return datadist_pb2_grpc.DataDistStub(ch).GetStatus(datadist_pb2.StatusRequest(), timeout=5)


def test_console_script_is_installed() -> None:
    if SCRIPT is None:
        pytest.skip("datadistctl entry point not installed in this venv (pip install -e .)")
    code, out, _ = ctl("--version")
    assert code == 0 and out.startswith("datadistctl ")


def test_status_json_matches_the_daemon(pair) -> None:
    d = pair.decoder_daemon
    code, out, err = ctl("status", "--json", "--socket", d.socket)
    assert code == 0, err
    mine = json.loads(out)
    truth = get_status(d)
    assert mine["version"] == truth.version and mine["backend"] == truth.backend
    assert mine["transport"] == truth.transport and mine["socket"] == truth.socket == d.socket
    assert 0 < mine["uptime_seconds"] <= truth.uptime_seconds
    assert len(mine["engines"]) == len(truth.engines) == 1
    (engine,), (expected,) = mine["engines"], truth.engines
    assert int(engine["engine_id"]) == expected.engine_id and int(engine["cluster_id"]) == expected.cluster_id == D
    assert engine["role"] == "ROLE_DECODER" and engine["pid"] == expected.pid
    assert engine["caches"] == expected.caches and engine["links"] == expected.links == 1
    assert [(p["placement"], int(p["capacity"]), int(p["used"])) for p in engine["pools"]] == \
        [("PLACEMENT_DEVICE", p.capacity, p.used) for p in expected.pools]


def test_links_and_caches_after_a_transfer(pair) -> None:
    env = {"DATADIST_DAEMON": pair.decoder_daemon.target}  # found through the environment this time
    code, out, err = ctl("links", "--json", env=env)
    assert code == 0, err
    (link,) = json.loads(out)["links"]
    assert int(link["remote_cluster_id"]) == P and link["state"] == "established" and link["initiator"]
    assert int(link["bytes_in"]) == len(PULLED[0]) * TENSORS * BLOCK_BYTES

    code, out, err = ctl("caches", "--json", env=env)
    assert code == 0, err
    (group,) = json.loads(out)["engines"]
    (cache,) = group["caches"]
    assert int(group["cluster_id"]) == D and cache["is_blocks"] and cache["registered"]
    assert cache["keys"] == [{"blocks_key": {"cluster_id": str(D), "model_id": "0"}}]


def test_human_tables(pair) -> None:
    sock = pair.prompt_daemon.socket
    code, out, err = ctl("--socket", sock, "status")
    assert code == 0, err
    assert out.startswith("datadistd ") and "backend host, transport tcp" in out
    header, row = out.strip().splitlines()[-2:]
    assert header.split()[:4] == ["ENGINE", "CLUSTER", "ROLE", "PID"]
    assert row.split()[1:3] == [str(P), "PROMPT"] and f"127.0.0.1:{pair.listen_port}" in row
    code, out, err = ctl("--socket", sock, "links")
    assert code == 0, err
    assert "established" in out and "serving" in out
    code, out, err = ctl("--socket", sock, "caches")
    assert code == 0, err
    assert "blocks(cluster=1,model=0)" in out and "float16" in out and "16x4x32" in out


def test_a_reader_that_goes_away_is_no_traceback(pair) -> None:
    """`datadistctl status | head -1`: the pipe's reader is gone before the tables are written."""
    read_end, write_end = os.pipe()
    os.close(read_end)   # as head does after its first line, here before anything was written: always EPIPE
    try:
        cmd = [SCRIPT] if SCRIPT else [sys.executable, "-m", "datadistd.process.ctl"]
        done = subprocess.run([*cmd, "status", "--socket", pair.decoder_daemon.socket], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=30, env={**os.environ, "DATADIST_DAEMON": ""})
    finally:
        os.close(write_end)
    assert done.returncode == 141 and done.stderr == "", done.stderr


def test_ping_a_peer_listener(pair) -> None:
    code, out, err = ctl("ping", f"127.0.0.1:{pair.listen_port}", "--count", "2", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["status"] == "SERVING" and len(result["rtt_ms"]) == 2
    assert result["min_ms"] <= result["avg_ms"] <= result["max_ms"]
    code, out, err = ctl("ping", f"127.0.0.1:{pair.listen_port}", "-n", "1")
    assert code == 0, err
    assert "SERVING" in out and " ms" in out


def test_ping_nobody_fails_with_one_line() -> None:
    code, out, err = ctl("ping", f"127.0.0.1:{free_port()}", "--timeout", "5")
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("datadistctl: cannot reach peer 127.0.0.1:")


def test_engine_filter_error_names_the_status_code(pair) -> None:
    code, out, err = ctl("status", "--engine", "999", "--socket", pair.decoder_daemon.socket)
    assert code == 1 and out == ""
    assert err.startswith("datadistctl: LLM_ENGINE_FINALIZED: engine 999")


@pytest.mark.parametrize("command", ["status", "links", "caches"])
def test_no_daemon_is_a_clear_one_line_error(tmp_path, command) -> None:
    missing = tmp_path / "datadistd.sock"
    code, out, err = ctl(command, "--socket", str(missing))
    assert code == 1 and out == ""
    assert err == f"datadistctl: no daemon socket at {missing} (is datadistd running? choose it with --socket or " \
                  "DATADIST_DAEMON)\n"


def test_stale_socket_of_a_dead_daemon(tmp_path) -> None:
    path = str(tmp_path / "datadistd.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:  # bound, never listening: like a crashed daemon
        s.bind(path)
    os.chmod(path, 0o660)
    code, out, err = ctl("status", "--json", env={"DATADIST_DAEMON": f"unix://{path}"})
    assert code == 1 and out == ""
    assert err.startswith(f"datadistctl: cannot reach datadistd at {path}") and err.count("\n") == 1
