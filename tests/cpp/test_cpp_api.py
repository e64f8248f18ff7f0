"""CANN's C++ API (``llm_datadist::LlmDataDist``, client/cpp) through real daemons: every method, its bytes and
its status codes (tests/cpp/api_test.cc runs the checks; each test here starts the daemons one scenario needs);
a daemon below attach protocol 4 fails Initialize (tests/hostile_daemon.py)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests import hostile_daemon
from tests.cpp import ROOT, compile_program
from tests.harness import free_port

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def api_test(cpp_install: Path, tmp_path_factory) -> Path:
    """api_test.cc built against the installed header and library with CANN's sample flag (the old libstdc++
    ABI); the examples (test_cpp_examples.py) use the default ABI."""
    out = tmp_path_factory.mktemp("cpp") / "api_test"
    return compile_program(HERE / "api_test.cc", out, "-D_GLIBCXX_USE_CXX11_ABI=0", "-pthread")


def run(binary: Path, *args: str, env: dict[str, str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess:
    r = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **(env or {})})
    failed = [line for line in r.stdout.splitlines() if line.startswith("FAIL")]
    assert r.returncode == 0 and not failed, f"{failed}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    return r


def test_every_method_on_one_engine(api_test, daemon_factory) -> None:
    """Register (host and kDevice-on-host memory), allocate (mapped here), copies, roles, unlink/unregister of
    unknown ids, and every argument error -> CANN's status codes, each logged by the library."""
    d = daemon_factory("d")
    r = run(api_test, "local", d.target)
    assert r.stdout.count("\nok ") >= 50
    assert "[RegisterKvCache] failed, error code is LLM_PARAM_INVALID" in r.stderr
    assert "[PullKvCache] failed, error code is LLM_NOT_YET_LINK" in r.stderr


def test_transfers_between_two_daemons(api_test, daemon_factory) -> None:
    """A prompt on one daemon, a decoder on another: PullKvCache / PullKvBlocks / PushKvCache / PushKvBlocks
    byte for byte (layer ranges, tensor_num_per_layer), per-cluster rets, the error codes of unknown caches,
    out-of-range blocks and batches, mismatched layer ranges and unlinked clusters, then the roles switched."""
    dp, dd = daemon_factory.many("p", "d")
    r = run(api_test, "pair", dp.target, dd.target, str(free_port()), env={"DATADIST_CPP_LOG": "debug"})
    assert "ok pull_kv_blocks_bytes" in r.stdout and "ok pull_switched_bytes" in r.stdout
    # 20,000 + 20,000 block numbers go as attach frames (first and continuation), never the gRPC Pull; the log
    # would say so (it is on: the attach line is an info one)
    assert "ok pull_20000_blocks_bytes" in r.stdout and "attached to datadistd" in r.stderr
    assert "40000 block numbers as the gRPC" not in r.stderr
    # the library's log says why, and so does the daemon's
    # ... naming the CacheIndex the caller passed, not the blocks twin's key it never used (issue 44, trip 10)
    assert ("[PullKvBlocks] failed, error code is LLM_KV_CACHE_NOT_EXIST(0x5010B002), no cache is bound to "
            "CacheIndex(cluster_id=1, cache_id=9999)") in r.stderr
    assert "BlocksCacheKey(model_id=9999)" not in r.stderr
    assert "[PullKvBlocks] failed, error code is LLM_PARAM_INVALID(0x5010B005), src_blocks[0] = 8 out of range" \
        in r.stderr
    owner_log, requester_log = Path(dp.log_path).read_text(), Path(dd.log_path).read_text()
    assert "LLM_KV_CACHE_NOT_EXIST: no cache is bound to BlocksCacheKey(model_id=9999)" in requester_log
    assert "serve_read peer cluster 2 failed" in owner_log and "src_blocks[0] = 8 out of range" in owner_log


def test_dead_daemon_fails_cleanly(api_test, daemon_factory) -> None:
    """The daemon killed under an initialized engine: every call returns LLM_FAILED (no crash, no hang), and
    the library logs that the daemon is gone."""
    d = daemon_factory("d")
    proc = subprocess.Popen([str(api_test), "dead", d.target], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.strip() == "READY":
                break
        assert lines and lines[-1].strip() == "READY", "".join(lines)
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(timeout=10)
        out, err = proc.communicate("go\n", timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, f"{out}\n{err[-3000:]}"
    assert "FAIL" not in out and "ok dead_finalize" in out, out
    assert "is gone" in err or "not reachable" in err, err[-3000:]


@pytest.fixture
def private_tmp():  # noqa: ANN201
    """A temporary directory of this test's private daemon alone (its ``TMPDIR``: other tests' private daemons,
    running at the same time, make theirs elsewhere), short enough for a unix socket path inside it."""
    path = Path(tempfile.mkdtemp(prefix="ddc-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _private_dirs(private_tmp: Path, env: dict[str, str]) -> Path:
    env["TMPDIR"] = str(private_tmp)
    return private_tmp


def test_private_daemon_without_configuration(api_test, tmp_path, private_tmp) -> None:
    """No DATADIST_DAEMON: the library starts a datadistd of its own (from PATH), with this user's own peer secret,
    and stops it at Finalize."""
    env = {"PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ.get('PATH', '')}", "XDG_RUNTIME_DIR": str(tmp_path),
           "DATADIST_CPP_LOG": "info"}
    os.chmod(tmp_path, 0o700)
    private_dirs = _private_dirs(private_tmp, env)
    r = run(api_test, "private", env=env, timeout=120)
    assert "started a private datadistd" in r.stderr
    assert (tmp_path / "datadist" / "peer.secret").stat().st_mode & 0o077 == 0
    assert not list(private_dirs.glob("datadist-cpp-*"))   # its directory is gone with it


@pytest.mark.parametrize("plant", ["group_readable_file", "symlink", "open_directory"])
def test_private_daemon_refuses_a_secret_others_can_read_or_plant(api_test, tmp_path, plant, private_tmp) -> None:
    """The per-user secret must be this user's alone: a file others can read, a symlink someone planted, or a
    directory others can write stops Initialize (LLM_FAILED, saying which path) -- no daemon runs with it."""
    os.chmod(tmp_path, 0o700)
    secret_dir = tmp_path / "datadist"
    secret_dir.mkdir(mode=0o700)
    secret = secret_dir / "peer.secret"
    if plant == "group_readable_file":
        secret.write_text("known\n")
        secret.chmod(0o644)
    elif plant == "symlink":
        target = tmp_path / "elsewhere"
        target.write_text("known\n")
        target.chmod(0o600)
        secret.symlink_to(target)
    else:
        secret_dir.chmod(0o777)
    env = {"PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ.get('PATH', '')}", "XDG_RUNTIME_DIR": str(tmp_path)}
    private_dirs = _private_dirs(private_tmp, env)
    r = run(api_test, "private_refused", env=env, timeout=60)
    assert str(secret_dir) in r.stderr, r.stderr
    assert not list(private_dirs.glob("datadist-cpp-*"))


def test_a_daemon_below_attach_protocol_4_fails_initialize(cpp_install, tmp_path) -> None:
    """A daemon whose welcome says attach protocol 3 takes no continuation frames: Initialize fails with LLM_FAILED
    saying so (the transfers have no second way to go), and no memory is handed over."""
    program = compile_program(HERE / "hostile_test.cc", tmp_path / "hostile_test", "-pthread")
    sock, report = str(tmp_path / "d" / "datadistd.sock"), str(tmp_path / "report.jsonl")
    proc = hostile_daemon.start(sock, "protocol_3", report)
    try:
        r = subprocess.run([str(program), f"unix://{sock}"], capture_output=True, text=True, timeout=120)
    finally:
        hostile_daemon.stop(proc)
    assert r.returncode == 0 and "initialize 0xFFFFFFFF" in r.stdout, r.stdout + r.stderr[-3000:]
    assert "speaks attach protocol 3, this client 4: update datadistd" in r.stderr, r.stderr[-3000:]
    assert not [e for e in hostile_daemon.events(report) if e["event"] == "import_memory"]
