"""The C++ client once under AddressSanitizer and UndefinedBehaviorSanitizer (``make cpp-asan``; the programs built
with the same flags): against a real daemon (api_test's one-engine scenario: every method, memory handed over and
mapped) and against a hostile fake daemon (tests/hostile_daemon.py) that hands over an unsealed pool it then
shrinks, or tensors past the pool's end or shorter than the cache's description. The client refuses each with
LLM_FAILED, hands the fake no memory, and neither crashes nor makes a sanitizer speak."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests import hostile_daemon
from tests.cpp import ASAN_INSTALL, SANITIZE, compile_program

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
#: a sanitizer's report fails the program (exit 66) and is what the assertions look for; leaks too (LeakSanitizer)
SANITIZER_ENV = {"ASAN_OPTIONS": "halt_on_error=1:exitcode=66:detect_leaks=1",
                 "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}
REPORTS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")
FAILED = 0xFFFFFFFF


@pytest.fixture(scope="module")
def asan(cpp_asan_install: Path, tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("cpp-asan")
    return {name: compile_program(HERE / f"{name}.cc", out / name, *SANITIZE, "-pthread", install=ASAN_INSTALL)
            for name in ("api_test", "hostile_test")}


def run(binary: Path, *args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=120,
                       env={**os.environ, **SANITIZER_ENV})
    said = [line for line in r.stderr.splitlines() if any(s in line for s in REPORTS)]
    assert r.returncode == 0 and not said, f"exit {r.returncode} {said}\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return r


def test_every_method_on_one_engine_under_sanitizers(asan, daemon_factory) -> None:
    """The real daemon: test_cpp_api.py's one-engine scenario, every check passing, nothing reported."""
    d = daemon_factory("d")
    r = run(asan["api_test"], "local", d.target)
    failed = [line for line in r.stdout.splitlines() if line.startswith("FAIL")]
    assert not failed and r.stdout.count("\nok ") >= 50, failed


@pytest.mark.parametrize("mode", ["unsealed", "past_end", "short"])
def test_a_hostile_daemon_gets_nothing_and_crashes_nothing(asan, tmp_path, mode) -> None:
    """Initialize succeeds (the fake runs as this user), AllocateCache is refused with LLM_FAILED saying why, no
    byte of the cache is touched, no memory is handed to the fake (no ImportMemory), nothing crashes."""
    sock, report = str(tmp_path / "d" / "datadistd.sock"), str(tmp_path / "report.jsonl")
    proc = hostile_daemon.start(sock, mode, report)
    try:
        r = run(asan["hostile_test"], f"unix://{sock}")
    finally:
        hostile_daemon.stop(proc)
    assert "initialize 0x0" in r.stdout and f"allocate 0x{FAILED:X}" in r.stdout and "touched" not in r.stdout, \
        r.stdout + r.stderr[-3000:]
    why = {"unsealed": "not sealed against shrinking and growing", "past_end": "a tensor lies outside its pool",
           "short": "tensor 1 is 4096 bytes where the description makes 32768"}[mode]
    assert why in r.stderr, r.stderr[-3000:]
    seen = hostile_daemon.events(report)
    assert not [e for e in seen if e["event"] == "import_memory"], seen


def test_an_honest_fake_is_taken(asan, tmp_path) -> None:
    """The control: the same fake answering as a daemon would is taken, the cache written, its blocks twin handed
    over -- so the refusals above are the client's checks, not a fake too broken to use."""
    sock, report = str(tmp_path / "d" / "datadistd.sock"), str(tmp_path / "report.jsonl")
    proc = hostile_daemon.start(sock, "honest", report)
    try:
        r = run(asan["hostile_test"], f"unix://{sock}")
    finally:
        hostile_daemon.stop(proc)
    assert "allocate 0x0" in r.stdout and "touched" in r.stdout, r.stdout + r.stderr[-3000:]
    imported = [e for e in hostile_daemon.events(report) if e["event"] == "import_memory"]
    assert len(imported) == 2 and all(e["bytes"] == 8 * 4096 for e in imported), imported
