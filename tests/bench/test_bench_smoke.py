"""``make bench`` cannot rot: the whole benchmark at tiny sizes, real daemons, no timing thresholds.

Runs ``python -m bench --smoke`` into a temporary directory and checks that every scenario produced
rows (none "failed"), that figures are finite and positive, and that the JSON, the Markdown table
and (with matplotlib installed) the plots were written. The numbers themselves are not judged.
Scenario 10 (hccl) also runs alone on the simulated Ascend runtime, where every row must say so.

The runs of the benchmark (``bench_run``) are measurements: ``make bench-check`` runs them (CI does, after
``make test``); ``make test`` skips them, saying so (tests/bench/conftest.py).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
bench_run = pytest.mark.bench_run

ROOT = Path(__file__).resolve().parents[2]


@bench_run
def test_bench_smoke_run_writes_every_scenario(tmp_path: Path) -> None:
    # scenario 10 runs on its own below (forced onto the simulation, checked in detail): not twice
    proc = subprocess.run([sys.executable, "-m", "bench", "--smoke", "--scenarios", "1,2,3,4,5,6,7,8,9,11",
                           "--no-progress", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    data = json.loads((tmp_path / "latest.json").read_text())
    rows = data["rows"]
    scenarios = {r["scenario"].split()[0] for r in rows}
    assert scenarios == {"1", "2", "3", "4", "5", "6", "7", "8", "9", "11"}, scenarios
    failed = [r for r in rows if r["case"] == "scenario failed"]
    assert not failed, failed
    for r in rows:
        if r["figure"] is None:  # only "not available yet" / "not installed" rows carry no figure
            assert r["note"], r
            continue
        assert math.isfinite(r["figure"]["median"]), r
        if r["ratio"] is not None:
            assert math.isfinite(r["ratio"]) and r["ratio"] > 0, r
    judged = [r for r in rows if r["target"] is not None and r["figure"] is not None]
    assert judged and all(r["met"] in (True, False) for r in judged)
    _check_per_request_rows(rows, pinned=False)
    r = {r["case"]: r for r in rows}["64 pulls of 64 x 16 KiB (1 MiB) in flight (2 processes): aggregate"]
    assert r["figure"]["unit"] == "GiB/s" and r["ratio"] > 0 and r["target"]["value"] == 0.8, r
    assert "pipelined 64 deep" in r["baseline_name"] and r["met"] in (True, False), r
    assert data["meta"]["pinned"] == "unpinned"
    table = (tmp_path / "latest.md").read_text()
    assert "| scenario | case |" in table and "1 tcp bulk" in table and "8 model-shaped" in table
    assert "Pinning: unpinned." in table
    assert list(tmp_path.glob("run-*.json"))
    if importlib.util.find_spec("matplotlib") is not None:
        pngs = {p.name for p in tmp_path.glob("*.png")}
        assert {"bulk_tcp.png", "same_host.png", "latency.png", "scaling.png", "concurrency.png", "link.png",
                "summary.png"} <= pngs, pngs
        assert all(p.stat().st_size > 1000 for p in tmp_path.glob("*.png"))


def _check_per_request_rows(rows: list[dict], pinned: bool) -> None:
    """Scenario 3's rows of issues 28 and 36: 1-block p50/p99 (and, in an unpinned run, a pinned pass of the same
    processes) and 64 and 256 in flight against same-run raw round trips, a 1-block push against the pull, CPU µs
    per pull of the worker and both daemons and their sum; the ratio targets judged only when pinned."""
    cases = {r["case"]: r for r in rows if r["scenario"] == "3 latency"}
    what = "pinned: every process on CPU" if pinned else "unpinned"
    for q, limit in ((50, 4.0 if pinned else 6.0), (99, 8.0 if pinned else 15.0)):
        r = cases[f"pull_blocks of 1 block (4 KiB) p{q}"]
        assert r["figure"]["unit"] == "µs" and r["baseline"]["median"] > 0 and r["ratio"] > 0, r
        assert r["target"]["value"] == limit and r["note"].startswith(what), r
        r = cases.get(f"pull_blocks of 1 block (4 KiB) p{q}, pinned pass")
        assert (r is None) == pinned, r   # --pin: the whole run is pinned, no second pass
        if r is not None:
            assert r["figure"]["unit"] == "µs" and r["baseline"]["median"] > 0 and r["ratio"] > 0, r
            assert r["target"]["value"] == (4.0 if q == 50 else 8.0) and r["note"].startswith("pinned pass"), r
    r = cases["push_blocks of 1 block (4 KiB) p50, against the pull"]
    assert r["figure"]["unit"] == "µs" and r["baseline"]["median"] > 0 and r["ratio"] > 0, r
    assert r["target"]["value"] == 1.2 and r["met"] in (True, False), r
    flights = [f"{depth} pulls of 1 block (4 KiB) in flight" for depth in (64, 256)]
    for depth, flight in zip((64, 256), flights, strict=True):
        r = cases[f"{flight}: throughput"]
        assert r["figure"]["unit"] == "pulls/s" and r["baseline"]["unit"] == "round trips/s", r
        assert f"pipelined {depth} deep" in r["baseline_name"] and r["ratio"] > 0 and r["note"].startswith(what), r
        assert (r["target"] is not None) == pinned and (r["met"] in (True, False)) == pinned, r
        r = cases[f"{flight}: p50 latency"]
        assert r["figure"]["unit"] == "µs" and r["baseline"]["median"] > 0 and r["ratio"] > 0, r
    for each in ("1 block (4 KiB)", *flights):
        for proc in ("worker", "requester daemon", "owner daemon"):
            r = cases[f"CPU per pull, {each}: {proc}"]
            assert r["figure"]["unit"] == "µs/pull" and r["figure"]["median"] >= 0, r
        r = cases[f"CPU per pull, {each}: sum of the three"]
        assert r["baseline"]["unit"] == "µs/round trip" and r["baseline"]["median"] > 0, r
    assert cases["CPU per pull, 1 block (4 KiB): sum of the three"]["target"]["value"] == 120.0


def test_bench_flags_of_the_per_request_rows_reach_the_config() -> None:
    from bench.cli import parse

    cpu = max(os.sched_getaffinity(0))
    for extra in ([], ["--smoke"]):
        cfg, _ = parse(["--pin", str(cpu), "--inflight-depth", "8", "--inflight-pulls", "40", "--inflight-deep", "32",
                        "--flight-depth", "16", "--flight-blocks", "8", "--flight-block-kib", "4", *extra])
        assert cfg.pin == cpu and cfg.inflight_depth == 8 and cfg.inflight_pulls == (16 if extra else 40), cfg
        assert cfg.inflight_deep == 32 and (cfg.flight_depth, cfg.flight_blocks, cfg.flight_block_kib) == (16, 8, 4)
    default = parse([])[0]
    assert default.pin is None and default.inflight_deep == 256, default
    assert (default.flight_depth, default.flight_blocks, default.flight_block_kib) == (64, 64, 16), default


def test_bench_nixl_rows_over_shared_memory_are_judged_at_every_block_size() -> None:
    """Issue 36: NIXL over UCX shared memory at 16 KiB blocks >= 0.9x bare NIXL; over UCX tcp small blocks stay
    stated, not judged."""
    from bench.scenarios import KIB, _bulk_target
    from bench.stats import Target

    assert _bulk_target("9 nixl bulk, UCX shm", 16 * KIB) == Target(">=", 0.9)
    assert _bulk_target("9 nixl bulk, UCX tcp", 16 * KIB) is None
    assert _bulk_target("9 nixl bulk, UCX tcp", 256 * KIB) == Target(">=", 0.9)


@bench_run
@pytest.mark.timeout(60)
def test_bench_pin_runs_every_process_on_one_cpu(tmp_path: Path) -> None:
    """``--pin CPU``: the worker and both daemons of scenario 3 run on that CPU alone, the report says so, and issue
    28's pinned targets are the ones judged."""
    cpu = max(os.sched_getaffinity(0))
    proc = subprocess.run([sys.executable, "-m", "bench", "--smoke", "--scenarios", "3", "--pin", str(cpu),
                           "--no-progress", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    data = json.loads((tmp_path / "latest.json").read_text())
    _check_per_request_rows(data["rows"], pinned=True)
    assert data["meta"]["pinned"] == f"every process on CPU {cpu}"
    assert data["series"]["3 latency"]["affinity"] == {p: [cpu] for p in ("worker", "requester daemon",
                                                                           "owner daemon")}
    assert f"Pinning: every process on CPU {cpu}." in (tmp_path / "latest.md").read_text()


@bench_run
@pytest.mark.timeout(180)
def test_bench_link_scenarios_count_calls_links_and_a_peer_death(tmp_path: Path) -> None:
    """Scenarios 12-14 at smoke sizes: Python calls per pull in the worker and both daemons
    (counted from outside the package: a sitecustomize on the daemons' path), threads, fds and idle CPU per link at
    each end at 1 and 4 links, and the time from a peer's SIGKILL to the failure of a pull in flight -- each with
    the issue's target beside it."""
    proc = subprocess.run([sys.executable, "-m", "bench", "--smoke", "--scenarios", "12,13,14", "--no-progress",
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    rows = json.loads((tmp_path / "latest.json").read_text())["rows"]
    cases = {(r["scenario"].split()[0], r["case"]): r for r in rows}
    from datadistd.transport.nixl.ucx import MODULES

    nixl = any(importlib.util.find_spec(m) for m in MODULES)
    for over in ("", *(["over nixl (UCX shm), "] if nixl else [])):
        for proc_name, limit in (("worker", 15.0), ("requester daemon", 20.0), ("owner daemon", 20.0)):
            r = cases[("12", f"Python calls per 1-block pull (4 KiB): {over}{proc_name}")]
            # every pull enters at least the API's own function; a daemon's count is the pulls' share, idle
            # subtracted (over nixl an owner that is not called may count none)
            least = 0 if over and proc_name == "owner daemon" else 1
            assert r["figure"]["unit"] == "calls/pull" and r["figure"]["median"] >= least, r
            assert r["target"]["value"] == limit and r["met"] in (True, False), r
    if not nixl:
        assert cases[("12", "over nixl")]["note"].startswith("NIXL is not installed"), cases
    for n in (1, 4):
        for end in ("linking end", "serving end"):
            what = f"{n} link{'s' if n > 1 else ''} at rest, {end}"
            for measure, unit, limit in (("threads", "threads/link", 1.0), ("fds", "fds/link", 1.0),
                                         ("idle CPU", "CPU-ms/min/link", 2.0)):
                r = cases[("13", f"{what}: {measure} per link")]
                assert r["figure"]["unit"] == unit and math.isfinite(r["figure"]["median"]), r
                assert r["target"]["value"] == limit, r
            # a link holds at least one connection at each end
            assert cases[("13", f"{what}: fds per link")]["figure"]["median"] >= 1
    r = cases[("14", "a 1-block pull in flight when its peer daemon is SIGKILLed: time to its failure")]
    assert r["figure"]["unit"] == "ms" and r["figure"]["median"] > 0 and r["target"]["value"] == 100.0, r
    assert "LLM_FAILED" in r["note"], r


@bench_run
def test_bench_hixl_scenario_rows(tmp_path: Path) -> None:
    """Scenario 15 at smoke sizes: transfer_sync of 4 KiB against the raw round trip and against the pull of the
    same size (unpinned and pinned), 64 transfer_async in flight from one thread against the raw round trip
    pipelined 64 deep and against 64 pulls in flight -- finite figures and ratios, no target judged."""
    proc = subprocess.run([sys.executable, "-m", "bench", "--smoke", "--scenarios", "15", "--no-progress",
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    rows = [r for r in json.loads((tmp_path / "latest.json").read_text())["rows"] if r["scenario"].startswith("15")]
    cases = {r["case"]: r for r in rows}
    assert len(rows) == 6 and not any(r["case"] == "scenario failed" for r in rows), rows
    for case, unit in (("transfer_sync READ of one 4 KiB extent p50", "µs"),
                       ("transfer_sync READ of one 4 KiB extent p50, against the pull", "µs"),
                       ("64 transfer_async READs of 4 KiB in flight from one thread: throughput", "requests/s"),
                       ("64 transfer_async READs of 4 KiB in flight from one thread, against the pull",
                        "requests/s")):
        r = cases[case]
        assert r["figure"]["unit"] == unit and math.isfinite(r["ratio"]) and r["ratio"] > 0, r
        assert r["target"] is None, r
    assert any("pinned pass" in c for c in cases)


SIMULATED = "SIMULATED runtime (tests/sim) — not NPU numbers"


@bench_run
@pytest.mark.timeout(180)
def test_bench_hccl_scenario_on_the_simulated_runtime(tmp_path: Path) -> None:
    """Scenario 10 alone, forced onto tests/sim (``--ascend sim``), smoke sizes (2 MiB requests, 16 and 256 KiB
    blocks, 2 repetitions): datadist rows per block size, memory kind and direction whose bytes were verified,
    the three bare-HCCL baselines, no target judged, and SIMULATED in every row, the Markdown and the plot."""
    if not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler (cc/gcc): the simulated Ascend runtime of tests/sim cannot be built")
    proc = subprocess.run([sys.executable, "-m", "bench", "--smoke", "--scenarios", "10", "--ascend", "sim",
                           "--no-progress", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    rows = json.loads((tmp_path / "latest.json").read_text())["rows"]
    assert rows and all(r["scenario"] == f"10 hccl bulk ({SIMULATED})" for r in rows), rows
    per_block = [r for r in rows if r["case"].startswith("per-block Python, hccl")]
    # the per-block Python cost is datadist's arithmetic, the same on either runtime: the one target judged here
    assert {r["case"].split(" (")[0] for r in per_block} == {
        f"per-block Python, hccl, {part}" for part in ("both daemons", "receiver", "sender", "descriptors")}
    assert all(math.isfinite(r["figure"]["median"]) and r["figure"]["unit"] == "ns" for r in per_block)
    assert [r["met"] in (True, False) for r in per_block if r["target"] is not None] == [True]
    assert all(r["target"] is None and r["met"] is None for r in rows if r not in per_block)
    cases = {r["case"]: r for r in rows}
    for block in ("16 KiB", "256 KiB"):
        for base in ("bare HCCL put", "bare HCCL get", "bare HCCL put, binding fills descriptors"):
            r = cases[f"baseline: {base} ({block} blocks)"]
            assert r["figure"]["median"] > 0 and SIMULATED in r["note"], r
        for memory in ("allocated", "registered"):
            for op in ("pull", "push"):
                r = cases[f"{op} {block} blocks, {memory}"]
                judged = "bare HCCL get" if op == "pull" else "bare HCCL put"   # a pull gets (issue 28, item 3)
                assert r["figure"]["median"] > 0 and r["baseline_name"] == judged, r
                assert math.isfinite(r["ratio"]) and r["ratio"] > 0, r
                assert "bytes verified" in r["note"], r
    table = (tmp_path / "latest.md").read_text()
    assert f"ran on the {SIMULATED}" in table
    assert all(SIMULATED in line for line in table.splitlines() if line.startswith("| 10 "))
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "hccl.png").stat().st_size > 1000


def test_pinned_moves_every_thread_of_a_running_process_and_back() -> None:
    """``bench.procs.Pinned`` (scenario 3's pinned pass): every thread of a process already running, not only its
    main thread, runs on the one CPU inside, and where this process may run after."""
    from bench.procs import Pinned

    script = "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n" \
             "print('ready', flush=True)\ntime.sleep(60)\n"
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        tasks = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        assert len(tasks) == 2
        everywhere, cpu = os.sched_getaffinity(0), max(os.sched_getaffinity(0))
        with Pinned([child.pid], cpu):
            assert [os.sched_getaffinity(t) for t in tasks] == [{cpu}, {cpu}]
        assert [os.sched_getaffinity(t) for t in tasks] == [everywhere, everywhere]
    finally:
        child.kill()
        child.wait(10)
