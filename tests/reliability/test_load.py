"""Load and soak: 32 worker processes on three daemons, mixed pulls and pushes with random block
tables, every transfer checked by hash; zero corruption, zero hangs, daemon RSS and fds flat over
more than 10 000 measured operations.

Every worker listens, registers a paged cache, fills it from its seed and links to three others (two
on other daemons over TCP, one on its own daemon over the local path). The defaults are the issue's
numbers and fit the time budget of ``make test`` on a 2-core machine (about 70 s; docs/reliability.md
records what was run). Knobs:

* ``DATADIST_SOAK_WORKERS`` — worker processes (default 32);
* ``DATADIST_SOAK_OPS`` — operations per worker in the measured soak (default 320: 10 240 with 32
  workers; a push counts once although it is checked with a second transfer, its read-back). It runs
  in two halves, the daemons' figures taken after the warm-up, after each half;
* ``DATADIST_SOAK_WARMUP`` — operations per worker before the RSS/fd baseline (default 100, see
  ``RSS_SLACK_KIB``).

Deterministic: seeds, ports-to-workers, the peer graph and every worker's sequence of operations and
block tables depend only on the knobs (the interleaving of the 32 processes does not, which is the
point). Bounded: every wait on a worker has a timeout scaled to its work, every transfer has
``sync_kv_timeout`` (10 s; a stuck one is reported as a failure) and the whole test a pytest timeout.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.harness import free_port
from tests.reliability.common import fd_count, links, rss_kib, status, thread_count
from tests.reliability.ops import OPS

WORKERS = int(os.environ.get("DATADIST_SOAK_WORKERS", "32"))
OPS_PER_WORKER = int(os.environ.get("DATADIST_SOAK_OPS", "320"))
WARMUP = int(os.environ.get("DATADIST_SOAK_WARMUP", "100"))
DAEMONS = 3
BASE_CLUSTER = 1000
HALVES = (OPS_PER_WORKER - OPS_PER_WORKER // 2, OPS_PER_WORKER // 2)

# RSS allowance of a daemon from the baseline (after the warm-up) to the end of the measured soak.
# Where the daemon's memory goes: each TCP stream reader keeps a 4 MiB receive staging buffer, made on
# its first payload, and the I/O pool grows threads on demand (max 128); with 32 workers that is
# ~490 MiB per daemon, reached step by step (4 MiB at a time) over the first ~150-200 operations per
# worker (measured: 145 MiB after 1 op, 460-495 after 40, 477-501 after 80, flat at 485-510 from 200
# on, through 480). The warm-up of 100 leaves a few such steps for the measured soak: +4..+12 MiB
# measured. That settling is bounded by the number of readers and threads; a leak grows with the work.
# Each daemon is an end of ~8 500 of the ~15 300 measured transfers (pulls + pushes + read-backs, 5/3
# daemon ends per transfer as one peer in three is on the same daemon), moving ~24 KiB on average.
# The allowance, 24 MiB + 1 MiB per worker (56 MiB by default: 4x the worst settling seen) is ~6.7 KiB
# per transfer end: keeping any transfer's payload, staging buffer or frame (>= 2 KiB per block,
# ~12 blocks-tensors on average) blows it 3-4 times over, so does per-transfer bookkeeping from ~7 KiB.
# Smaller per-transfer leaks are below what RSS can tell apart at this length; leaked fds and threads
# (a connection, a channel, a thread per transfer) are caught exactly by the other two bounds.
RSS_SLACK_KIB = (24 + WORKERS) * 1024


def _ops_timeout(ops: int) -> float:
    """Wait for one worker's ``ops`` operations: 60 s + 0.5 s per op. Measured ~0.1 s per op per worker
    (32 workers on 2 cores, ~250-350 ops/s in all), so > 4x headroom."""
    return 60 + 0.5 * ops


# whole test: daemon start-ups (3 x 20 s), setup (120 s), links (3 x 60 s), the soak waits, worker and
# daemon shutdown (15 s + 3 x 15 s) -- the sum of every bounded wait below, so a hang fails the test
TEST_TIMEOUT = 420 + _ops_timeout(WARMUP) + sum(_ops_timeout(h) for h in HALVES)
pytestmark = [pytest.mark.integration, pytest.mark.timeout(TEST_TIMEOUT)]


def _all(pool: ThreadPoolExecutor, fn, items):  # noqa: ANN001, ANN202
    """Run ``fn(item)`` for every item at once; re-raise the first failure (after all have ended)."""
    futures = [pool.submit(fn, item) for item in items]
    return [f.result() for f in futures]


def _figures(daemons) -> list[dict]:  # noqa: ANN001
    return [{"rss": rss_kib(d.proc.pid), "fds": fd_count(d.proc.pid), "threads": thread_count(d.proc.pid)}
            for d in daemons]


def test_many_workers_mixed_transfers_zero_corruption_flat_resources(daemon_factory, worker_factory) -> None:
    t_begin = time.monotonic()
    # spawn the workers first (each names its daemon in soak_setup): their imports (numpy, grpc,
    # llm_datadist: ~50 MiB RSS each, 1.6 GiB in all) overlap the daemons' start-up
    workers = [worker_factory() for _ in range(WORKERS)]
    daemons = daemon_factory.many(*(f"soak{i}" for i in range(DAEMONS)), env={"DATADISTD_TRANSPORT_STREAMS": "2"})
    home = [daemons[i % DAEMONS].target for i in range(WORKERS)]
    clusters = [BASE_CLUSTER + i for i in range(WORKERS)]
    ports = [free_port() for _ in range(WORKERS)]
    seeds = [100 + i for i in range(WORKERS)]
    # peers of worker i: i+1 and i+2 (other daemons), i+3 (same daemon: the local path)
    peers = {i: sorted({(i + d) % WORKERS for d in (1, 2, DAEMONS)} - {i}) for i in range(WORKERS)}

    def setup(i: int) -> None:
        workers[i].call("run", OPS, "soak_setup", clusters[i], f"127.0.0.1:{ports[i]}", seeds[i], WORKERS, home[i],
                        timeout=120)

    def link(i: int) -> None:
        for j in peers[i]:  # link_clusters with a 5 s timeout; the answer awaited 60 s at most
            assert workers[i].call("link", clusters[j], "127.0.0.1", ports[j], 5000, timeout=60) == (0, [0]), (i, j)

    def soak(i: int, ops: int, salt: int) -> dict:
        remotes = [(clusters[j], seeds[j]) for j in peers[i]]
        return workers[i].call("run", OPS, "soak_run", i, remotes, ops, seeds[i] * 7919 + salt,
                               timeout=_ops_timeout(ops))

    t_start = time.monotonic()
    pool = ThreadPoolExecutor(max_workers=WORKERS)
    try:
        _all(pool, setup, range(WORKERS))
        t_setup = time.monotonic()
        _all(pool, link, range(WORKERS))
        t_ready = time.monotonic()
        warm = _all(pool, lambda i: soak(i, WARMUP, 1), range(WORKERS))
        t_warm = time.monotonic()
        time.sleep(0.5)
        samples = [_figures(daemons)]
        t_soak = time.monotonic()
        results: list[dict] = []
        for h, ops in enumerate(HALVES):
            results += _all(pool, lambda i: soak(i, ops, 2 + h), range(WORKERS))  # noqa: B023 - used at once
            time.sleep(0.5)
            samples.append(_figures(daemons))
        t_end = time.monotonic()
        up = [all(lk.state == "established" for lk in links(d)) for d in daemons]
        link_ends = sum(len(links(d)) for d in daemons)
        engines = sum(len(status(d).engines) for d in daemons)
    finally:
        # end the workers all at once (bounded by Worker.close); the fixture would do it one by one
        _all(pool, lambda w: w.close(), workers)
        pool.shutdown()
    t_closed = time.monotonic()

    before, mid, after = samples
    failures = [f for r in warm + results for f in r["failures"]]
    total = {k: sum(r[k] for r in warm + results) for k in ("pulls", "pushes", "readbacks", "bytes")}
    measured = {k: sum(r[k] for r in results) for k in ("pulls", "pushes", "readbacks")}
    transfers = total["pulls"] + total["pushes"] + total["readbacks"]
    slowest = max(r["slowest"] for r in warm + results)
    soak_s = t_end - t_soak - 0.5 * len(HALVES)
    print(f"\nsoak: {WORKERS} workers on {DAEMONS} daemons, {link_ends} link ends; daemons+spawn "
          f"{t_start - t_begin:.1f}s, setup {t_setup - t_start:.1f}s, links {t_ready - t_setup:.1f}s, "
          f"warm-up {t_warm - t_ready:.1f}s, measured soak {soak_s:.1f}s "
          f"({OPS_PER_WORKER * WORKERS / soak_s:.0f} ops/s), workers closed in {t_closed - t_end:.1f}s")
    print(f"  {WARMUP} warm-up + {OPS_PER_WORKER} ops per worker = {WORKERS * WARMUP} + "
          f"{WORKERS * OPS_PER_WORKER} ops: {total['pulls']} pulls, {total['pushes']} pushes, "
          f"{total['readbacks']} read-backs = {transfers} checked transfers "
          f"({sum(measured.values())} in the measured soak), {total['bytes'] >> 20} MiB; "
          f"slowest transfer {slowest * 1000:.0f} ms; failures {len(failures)}")
    for i, (b, m, a) in enumerate(zip(before, mid, after, strict=True)):
        print(f"  daemon {i}: rss {b['rss']} -> {m['rss']} -> {a['rss']} KiB ({(a['rss'] - b['rss']) / 1024:+.1f} "
              f"MiB, allowance {RSS_SLACK_KIB >> 10}), fds {b['fds']} -> {m['fds']} -> {a['fds']}, "
              f"threads {b['threads']} -> {m['threads']} -> {a['threads']}")
    assert failures == [], failures[:20]
    assert measured["pulls"] + measured["pushes"] == WORKERS * OPS_PER_WORKER
    assert total["pulls"] + total["pushes"] == WORKERS * (WARMUP + OPS_PER_WORKER)
    assert total["readbacks"] == total["pushes"]
    for b, a in zip(before, after, strict=True):
        assert a["fds"] <= b["fds"] + 2, (b, a)
        assert a["threads"] <= b["threads"] + 8, (b, a)   # the daemon's I/O pool grows on demand (max 128)
        assert a["rss"] <= b["rss"] + RSS_SLACK_KIB, (b, a)
    # every link still up and every engine still there at the end of the soak
    assert all(up), up
    assert engines == WORKERS, engines
