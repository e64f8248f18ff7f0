"""Scenario 15: CANN's HIXL engine API over datadistd (docs/hixl.md), beside the LLM-DataDist pull of the same size.

One prefill and one decode worker on two daemons (tcp), each with an ``LLMDataDist`` engine (a blocks cache of 256
4 KiB blocks, as scenario 3) and a HIXL engine (one 1 MiB registration) side by side; the decode worker's HIXL engine
connects to the prefill worker's. Measured in the same rounds, alternating: a raw Python TCP request/response
(16 B -> 4 KiB, as scenario 3's baseline), ``transfer_sync`` READs of one 4 KiB extent, ``pull_blocks`` of one 4 KiB
block; then the same with every thread of the five processes on one CPU (scenario 3's pinned pass). In flight: one
thread keeping 64 ``transfer_async`` READs of 4 KiB in flight, against the raw round trip pipelined 64 deep and
against 64 ``pull_blocks`` in flight (64 threads, the only way LLM-DataDist's API keeps 64 in flight).
Stated, not judged: no target names these ratios yet.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

from . import baselines
from .procs import Pinned, free_port
from .stats import Figure, Row, figure, paired, percentile

if TYPE_CHECKING:
    from .scenarios import Run

SCENARIO = "15 hixl engine"
SIZE = 4 << 10
SLOTS = 256
DEPTH = 64
P = 1


def _p50(rounds: list[list[float]]) -> Figure:
    per_round = [percentile([x * 1e6 for x in lst], 50) for lst in rounds]
    return Figure(percentile([x * 1e6 for lst in rounds for x in lst], 50), min(per_round), max(per_round),
                  len(rounds), "µs")


def _rounds(run: Run, wd, rr: baselines.RequestReply, rounds: int, per: int, label: str  # noqa: ANN001
            ) -> tuple[list[list[float]], list[list[float]], list[list[float]]]:
    """``rounds`` rounds of (raw round trips, transfer_sync READs, pull_blocks), each ``per`` calls."""
    raws, syncs, pulls = [], [], []
    for r in range(rounds):
        raws.append(rr.loop(per))
        syncs.append(wd.call("hixl_sync_loop", per, SIZE, SLOTS, warmup=20 if r else 100))
        pulls.append(wd.call("latency_loop", P, "lat", per, SLOTS, warmup=20)[0])
        run.step(f"{SCENARIO}: {label}round {r + 1}/{rounds}")
    return raws, syncs, pulls


def _sync_rows(run: Run, raws: list, syncs: list, pulls: list, how: str) -> None:
    n = sum(len(x) for x in syncs)
    med, lo, hi = paired([percentile(x, 50) for x in syncs], [percentile(x, 50) for x in raws])
    run.add(Row(SCENARIO, f"transfer_sync READ of one 4 KiB extent p50{how}", _p50(syncs),
                "raw Python TCP request/response (16 B -> 4 KiB, TCP_NODELAY) p50", _p50(raws), ratio=med,
                ratio_min=lo, ratio_max=hi,
                note=f"{n} calls over tcp between two daemons in {len(syncs)} rounds alternating with the baselines; "
                     f"p99 {percentile([x * 1e6 for lst in syncs for x in lst], 99):.0f} µs; ratio = median of "
                     "per-round ratios"))
    med, lo, hi = paired([percentile(x, 50) for x in syncs], [percentile(x, 50) for x in pulls])
    run.add(Row(SCENARIO, f"transfer_sync READ of one 4 KiB extent p50, against the pull{how}", _p50(syncs),
                "pull_blocks of 1 block (4 KiB) p50, same rounds", _p50(pulls), ratio=med, ratio_min=lo,
                ratio_max=hi, note="the two APIs of one worker over the same daemons and link path"))


def hixl_engine(run: Run) -> None:
    """Scenario 15 (the module doc)."""
    from .scenarios import _both, _pair

    cfg = run.cfg
    wp, wd, _ = _pair(run, 0)
    _both(wp, wd, "cache", "lat", "registered", 1, SLOTS, SIZE, model_id=0)
    engine = f"127.0.0.1:{free_port()}"
    remote = wp.call("hixl_engine", engine, SLOTS * SIZE, 7)
    wd.call("hixl_engine", "127.0.0.1", SLOTS * SIZE)
    wd.call("hixl_connect", engine, remote)
    rounds = max(2, min(cfg.reps, 10))
    per = max(1, math.ceil(cfg.latency_calls / rounds))
    calls = DEPTH * max(1, math.ceil(cfg.inflight_pulls / DEPTH))
    rr = baselines.RequestReply(16, SIZE)
    try:
        rr.loop(100)
        rr.pipelined(4 * DEPTH, DEPTH)
        raws, syncs, pulls = _rounds(run, wd, rr, rounds, per, "")
        flight: dict[str, list] = {"rate": [], "pipe": [], "pulls": [], "lat": []}
        for r in range(rounds):
            wall, _ = rr.pipelined(calls, DEPTH)
            flight["pipe"].append(calls / wall)
            wall, lat = wd.call("hixl_async_flight", DEPTH, calls, SIZE, SLOTS)
            flight["rate"].append(calls / wall)
            flight["lat"].append(lat)
            wall, _, _ = wd.call("in_flight_pulls", P, "lat", DEPTH, calls // DEPTH, SLOTS, timeout=cfg.timeout_s)
            flight["pulls"].append(calls / wall)
            run.step(f"{SCENARIO}: in flight, round {r + 1}/{rounds}")
        pin_cpu = max(os.sched_getaffinity(0))
        procs = [wd.call("pid"), wp.call("pid"), run.daemons["D"].pid, run.daemons["P"].pid, *rr.pids]
        with Pinned(procs, pin_cpu):
            pinned = _rounds(run, wd, rr, rounds, per, "pinned ")
    finally:
        rr.close()
        for w in (wd, wp):
            w.call("hixl_close")
    _sync_rows(run, raws, syncs, pulls, "")
    _sync_rows(run, *pinned, f", pinned pass (every thread of the five processes on CPU {pin_cpu})")
    note = (f"one decoder thread keeps {DEPTH} transfer_async READs of one 4 KiB extent in flight ({calls} per round, "
            f"{rounds} rounds; status polled with get_transfer_status); p50 from submit to the poll that saw it "
            f"COMPLETED {percentile([x * 1e6 for lst in flight['lat'] for x in lst], 50):.0f} µs")
    med, lo, hi = paired(flight["rate"], flight["pipe"])
    run.add(Row(SCENARIO, f"{DEPTH} transfer_async READs of 4 KiB in flight from one thread: throughput",
                figure(flight["rate"], "requests/s"),
                f"raw request/response pipelined {DEPTH} deep over one TCP connection",
                figure(flight["pipe"], "round trips/s"), ratio=med, ratio_min=lo, ratio_max=hi, note=note))
    med, lo, hi = paired(flight["rate"], flight["pulls"])
    run.add(Row(SCENARIO, f"{DEPTH} transfer_async READs of 4 KiB in flight from one thread, against the pull",
                figure(flight["rate"], "requests/s"), f"{DEPTH} pull_blocks of 1 block (4 KiB) in flight "
                f"({DEPTH} threads)", figure(flight["pulls"], "pulls/s"), ratio=med, ratio_min=lo, ratio_max=hi,
                note="same rounds, alternating"))
