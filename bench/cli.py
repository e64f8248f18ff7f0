"""``python -m bench`` (``make bench``): run the scenarios, write JSON, Markdown and PNG plots."""

from __future__ import annotations

import argparse
import datetime as _dt
import logging
import os
import platform
import shutil
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from .npu import ASCEND_MODES, SIM_MIB
from .report import markdown_table, write_json, write_markdown, write_plots
from .scenarios import MODELS, NIXL_TLS, SCENARIOS, Config, Run, count_steps
from .stats import Row

__all__ = ["main", "parse"]

DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _words(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parse(argv: list[str] | None = None) -> tuple[Config, argparse.Namespace]:
    d = Config()
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__ + "\n\nScenarios: " +
                                ", ".join(f"{k} {v[0]}" for k, v in SCENARIOS.items()))
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results directory (default: bench/results)")
    p.add_argument("--scenarios", type=_ints, default=d.scenarios, help="which scenarios, e.g. 1,3 (default: all)")
    p.add_argument("--reps", type=int, default=d.reps, help="repetitions behind every figure")
    p.add_argument("--memory", type=_words, default=d.memory,
                   help="cache memory kinds: allocated (daemon pool, zero copy), registered (worker numpy memory, "
                        "re-backed in place by a sealed memfd, zero copy)")
    p.add_argument("--bulk-mib", type=int, default=d.bulk_mib, help="MiB per bulk request (scenarios 1, 2, 11)")
    p.add_argument("--block-kib", type=_ints, default=d.block_kib, help="block sizes in KiB (scenarios 1, 2)")
    p.add_argument("--layers", type=int, default=d.layers, help="layers (K and V tensors each) of bulk caches")
    p.add_argument("--no-iperf3", dest="iperf3", action="store_false", help="skip the iperf3 baseline")
    p.add_argument("--latency-calls", type=int, default=d.latency_calls, help="1-block pulls (scenario 3)")
    p.add_argument("--inflight-depth", type=int, default=d.inflight_depth,
                   help="1-block pulls in flight from one decoder worker, and the raw round trip's depth (scenario 3)")
    p.add_argument("--inflight-pulls", type=int, default=d.inflight_pulls,
                   help="in-flight pulls per round (scenario 3)")
    p.add_argument("--inflight-deep", type=int, default=d.inflight_deep,
                   help="a second in-flight depth, the same rows against the raw round trip as deep; 0: none "
                        "(scenario 3)")
    p.add_argument("--pin", type=int, default=None, metavar="CPU",
                   help="run every process (this one, the daemons, the workers, the baselines) on CPU only: the "
                        "affinity is set before anything spawns and inherited; the report says pinned or unpinned")
    p.add_argument("--scaling-blocks", type=_ints, default=d.scaling_blocks, help="blocks per call (scenario 4)")
    p.add_argument("--scaling-tensors", type=int, default=d.scaling_tensors, help="tensors (scenario 4)")
    p.add_argument("--concurrency", type=_ints, default=d.concurrency, help="concurrent pulls (scenario 5)")
    p.add_argument("--conc-workers", type=int, default=d.conc_workers, help="decode worker processes (scenario 5)")
    p.add_argument("--conc-blocks", type=int, default=d.conc_blocks, help="blocks per pull (scenario 5)")
    p.add_argument("--conc-pulls", type=int, default=d.conc_pulls, help="pulls per level and repetition (scenario 5)")
    p.add_argument("--conc-block-kib", type=int, default=d.conc_block_kib, help="block size in KiB (scenario 5)")
    p.add_argument("--flight-depth", type=int, default=d.flight_depth,
                   help="small pulls kept in flight across the decode workers, against raw request/replies "
                        "pipelined as deep; 0: none (scenario 5)")
    p.add_argument("--flight-blocks", type=int, default=d.flight_blocks, help="blocks per in-flight pull (scenario 5)")
    p.add_argument("--flight-block-kib", type=int, default=d.flight_block_kib,
                   help="block size in KiB of the in-flight pulls (scenario 5)")
    p.add_argument("--flight-calls", type=int, default=d.flight_calls,
                   help="in-flight pulls per thread and repetition (scenario 5)")
    p.add_argument("--lw-layers", type=int, default=d.lw_layers, help="layers (scenario 6)")
    p.add_argument("--lw-blocks", type=int, default=d.lw_blocks, help="blocks per layer (scenario 6)")
    p.add_argument("--lw-block-kib", type=int, default=d.lw_block_kib, help="block size (scenario 6)")
    p.add_argument("--lw-compute-ms", type=float, default=d.lw_compute_ms,
                   help="simulated compute per layer; 0 = --lw-compute-factor x one layer's transfer (scenario 6)")
    p.add_argument("--lw-compute-factor", type=float, default=d.lw_compute_factor,
                   help="compute per layer as a multiple of one layer's measured transfer time (scenario 6)")
    p.add_argument("--link-reps", type=int, default=d.link_reps, help="link/unlink rounds (scenario 7)")
    p.add_argument("--models", type=_words, default=d.models,
                   help="model shapes (scenario 8): deepseek-r1 (MLA), llama-3-8b (GQA)")
    p.add_argument("--model-layers", type=int, default=d.model_layers,
                   help="layers of the model-shaped caches; 0 = each model's own (scenario 8)")
    p.add_argument("--model-in-flight", type=_ints, default=d.model_in_flight,
                   help="requests in flight (scenario 8)")
    p.add_argument("--nixl-tls", type=_words, default=d.nixl_tls,
                   help="UCX transports of scenario 9: tcp (UCX over TCP on lo), shm (shared memory)")
    p.add_argument("--hccl-mib", type=int, default=d.hccl_mib,
                   help=f"MiB per request of scenario 10 (hccl); 0 = {SIM_MIB} on the simulated runtime, --bulk-mib on "
                        f"NPUs")
    p.add_argument("--perblock-blocks", type=int, default=d.perblock_blocks,
                   help="blocks of the per-block Python cost rows (scenarios 9, 10)")
    p.add_argument("--perblock-kib", type=int, default=d.perblock_kib,
                   help="block size in KiB of the per-block Python cost rows (scenarios 9, 10)")
    p.add_argument("--ascend", choices=ASCEND_MODES, default=d.ascend,
                   help="scenario 10's runtime: auto = CANN if ASCEND_HOME_PATH is set and npu-smi info succeeds, "
                        "else the SIMULATED one of tests/sim (needs a C compiler); real = CANN or fail; "
                        "sim = the simulation")
    p.add_argument("--count-calls", type=int, default=d.count_calls,
                   help="1-block pulls per counted window (scenario 12)")
    p.add_argument("--rest-links", type=_ints, default=d.rest_links,
                   help="links between two daemons at which threads, fds and idle CPU are read (scenario 13)")
    p.add_argument("--rest-seconds", type=float, default=d.rest_seconds,
                   help="seconds of each idle window; CPU is scaled to a minute (scenario 13)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, 2 repetitions: checks the bench runs")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    a = p.parse_args(argv)
    cfg = Config(reps=a.reps, scenarios=a.scenarios, memory=a.memory, bulk_mib=a.bulk_mib, block_kib=a.block_kib,
                 layers=a.layers, iperf3=a.iperf3, latency_calls=a.latency_calls, inflight_depth=a.inflight_depth,
                 inflight_pulls=a.inflight_pulls, inflight_deep=a.inflight_deep, pin=a.pin,
                 scaling_blocks=a.scaling_blocks,
                 scaling_tensors=a.scaling_tensors, concurrency=a.concurrency, conc_workers=a.conc_workers,
                 conc_blocks=a.conc_blocks, conc_block_kib=a.conc_block_kib, conc_pulls=a.conc_pulls,
                 flight_depth=a.flight_depth, flight_blocks=a.flight_blocks, flight_block_kib=a.flight_block_kib,
                 flight_calls=a.flight_calls,
                 lw_layers=a.lw_layers, lw_blocks=a.lw_blocks,
                 lw_block_kib=a.lw_block_kib, lw_compute_ms=a.lw_compute_ms,
                 lw_compute_factor=a.lw_compute_factor, link_reps=a.link_reps, models=a.models,
                 model_layers=a.model_layers, model_in_flight=a.model_in_flight, nixl_tls=a.nixl_tls,
                 hccl_mib=a.hccl_mib, ascend=a.ascend, perblock_blocks=a.perblock_blocks,
                 perblock_kib=a.perblock_kib, count_calls=a.count_calls, rest_links=a.rest_links,
                 rest_seconds=a.rest_seconds)
    if a.smoke:
        cfg = Config(reps=2, scenarios=a.scenarios, memory=a.memory, bulk_mib=2, block_kib=[16, 256], layers=2,
                     iperf3=False, latency_calls=20, inflight_depth=a.inflight_depth,
                     inflight_pulls=2 * a.inflight_depth, inflight_deep=a.inflight_deep, pin=a.pin,
                     scaling_blocks=[100, 1000],
                     concurrency=[1, 4], conc_workers=2,
                     conc_blocks=4, conc_pulls=8, flight_depth=a.flight_depth, flight_blocks=a.flight_blocks,
                     flight_block_kib=a.flight_block_kib, flight_calls=1, lw_layers=2, lw_blocks=4, lw_block_kib=16,
                     lw_compute_ms=1.0,
                     link_reps=2, models=a.models, model_layers=2, model_in_flight=[1, 4], model_tokens=1024,
                     nixl_tls=a.nixl_tls[:1],   # one UCX set: the same datadist path
                     hccl_mib=2, ascend=a.ascend, perblock_blocks=2000, perblock_kib=a.perblock_kib,
                     count_calls=20, rest_links=[1, 4], rest_seconds=1.0, timeout_s=120.0)
    bad = [s for s in cfg.scenarios if s not in SCENARIOS]
    if bad:
        p.error(f"unknown scenarios {bad}; known: {sorted(SCENARIOS)}")
    if any(t not in NIXL_TLS for t in cfg.nixl_tls):
        p.error(f"unknown --nixl-tls {cfg.nixl_tls}; known: {', '.join(NIXL_TLS)}")
    unknown = [m for m in cfg.models if m not in MODELS]
    if unknown:
        p.error(f"unknown models {unknown}; known: {', '.join(MODELS)}")
    if a.pin is not None and a.pin not in os.sched_getaffinity(0):
        p.error(f"--pin {a.pin}: not one of this process's CPUs {sorted(os.sched_getaffinity(0))}")
    if cfg.inflight_depth < 1 or cfg.inflight_deep < 0 or cfg.flight_depth < 0:
        p.error("--inflight-depth must be at least 1, --inflight-deep and --flight-depth at least 0")
    if cfg.flight_blocks < 1 or cfg.flight_block_kib < 1 or cfg.flight_calls < 1:
        p.error("--flight-blocks, --flight-block-kib and --flight-calls must be positive")
    if cfg.count_calls < 1 or cfg.rest_seconds <= 0 or not cfg.rest_links or min(cfg.rest_links) < 1:
        p.error("--count-calls, --rest-seconds and every --rest-links must be positive")
    if any(m not in ("allocated", "registered") for m in cfg.memory) or not cfg.memory:
        p.error("--memory takes allocated and/or registered")
    return cfg, a


def _machine() -> str:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{os.cpu_count()} CPUs ({cpu or platform.machine()}), Linux {platform.release()}, "
            f"Python {platform.python_version()}")


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)   # so the finally blocks stop daemons and remove the simulation's memory


def main(argv: list[str] | None = None) -> int:
    cfg, args = parse(argv)
    if cfg.pin is not None:   # before anything spawns: daemons, workers and baselines inherit the affinity
        os.sched_setaffinity(0, {cfg.pin})
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_sigterm)   # make bench under `timeout`, a CI job cancelled
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    started = _dt.datetime.now().astimezone()
    meta = {"started": started.isoformat(timespec="seconds"), "machine": _machine(),
            "argv": " ".join(["python -m bench", *(argv if argv is not None else sys.argv[1:])]),
            "config": cfg.__dict__, "pinned": "unpinned" if cfg.pin is None else f"every process on CPU {cfg.pin}",
            "iperf3": shutil.which("iperf3") is not None}
    progress = None
    if args.progress:
        from tqdm import tqdm

        progress = tqdm(total=count_steps(cfg), unit="step", desc="bench", file=sys.stderr, dynamic_ncols=True)
    run = Run(cfg, progress, log=(progress.write if progress is not None else print))
    t0 = time.monotonic()
    failed = 0
    try:
        for number in cfg.scenarios:
            name, fn = SCENARIOS[number]
            if progress is not None:
                progress.set_description(f"{number} {name}")
            try:
                fn(run)
            except Exception as exc:  # noqa: BLE001 - one broken scenario must not lose the others' results
                failed += 1
                run.log(f"scenario {number} ({name}) failed: {exc!r}\n{traceback.format_exc()}")
                for d in run.daemons.values():
                    run.log(f"--- daemon {d.name} log tail ---\n{d.log()[-2000:]}")
                why = (str(exc).splitlines() or [repr(exc)])[0][:200]
                run.add(Row(f"{number} {name}", "scenario failed", None, note=f"failed: {why}"))
                run.close_workers()
    finally:
        run.close()
        if progress is not None:
            progress.close()
    meta["seconds"] = time.monotonic() - t0
    stamp = started.strftime("%Y%m%d-%H%M%S")
    write_json(out / "latest.json", meta, run.rows, run.series)
    shutil.copyfile(out / "latest.json", out / f"run-{stamp}.json")
    write_markdown(out / "latest.md", meta, run.rows)
    plots = write_plots(out, run.rows, run.series)
    print(markdown_table(run.rows))
    print(f"\nwrote {out / 'latest.json'}, {out / 'latest.md'} and {len(plots)} plots in {out} "
          f"({meta['seconds']:.0f} s)")
    return 1 if failed else 0
