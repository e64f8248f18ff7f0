"""Scenarios 12-14 (issue 36, item 7): what a pull and a link cost per process, and how soon a dead peer is noticed.

* 12, Python calls per pull: a warm 1-block pull between two daemons, the profile hook's ``"call"`` events per
  pull in the worker (a hook on its calling thread) and in each daemon (``callcount``: a ``sitecustomize`` on the
  daemons' ``PYTHONPATH``, from outside the package; a window opened and closed by signals), the daemons' counts
  less those of an idle window as long (heartbeat, sweeper). Deterministic up to that background. Over tcp, then
  over nixl (UCX shared memory; skipped without NIXL), where the owner daemon's count is the owner's work per
  pull (issue 36: none, no owner call).
* 13, links at rest: threads (``/proc/<pid>/status``), fds (``/proc/<pid>/fd``) and idle CPU
  (``/proc/<pid>/task/<tid>/schedstat``: nanoseconds each thread ran, over an idle window, scaled to a minute) of
  both daemons at 1, 16, 64, 256 links between them, less the same with the engines made and no link; per link, at
  each end.
* 14, a peer's death: the owner daemon is stopped (SIGSTOP) with a 1-block pull on its way, then killed (SIGKILL:
  its kernel ends the connections at once); the time from the kill to the pull's failure at the worker.

Targets beside the figures are the issue's: <= 15 calls in the worker and <= 20 per daemon; <= 1 thread, <= 1 fd
and <= 2 CPU-ms (0.002 CPU-s) per minute per link at each end; a pull failed within 100 ms of its peer's death.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

from . import callcount
from .procs import Daemon, cpu_between, free_port, thread_cpu
from .stats import Figure, Row, Target, figure

if TYPE_CHECKING:
    from .scenarios import Run

KIB = 1 << 10
P = 1
D = 2
_WAIT = 10.0   # bound on a daemon opening or closing its counting window


# ---- 12: Python calls per pull ----------------------------------------------------------------------------------

def _window(daemons: list[Daemon], where: str, sig: int, name: str) -> list[int]:
    """Signal each daemon and wait (bounded) for the file it writes: its count when closing, [] when opening."""
    for d in daemons:
        Path(where, f"{name}-{d.pid}").unlink(missing_ok=True)
        os.kill(d.pid, sig)
    limit = time.monotonic() + _WAIT
    files = [Path(where, f"{name}-{d.pid}") for d in daemons]
    while not all(f.exists() for f in files):
        if time.monotonic() > limit:
            raise TimeoutError(f"a daemon did not write its {name} file within {_WAIT}s")
        time.sleep(0.01)
    return [int(f.read_text()) for f in files] if name == "calls" else []


def nixl_env(ucx_tls: str) -> dict[str, str]:
    """The environment of a daemon whose transport is nixl over the UCX transports ``ucx_tls`` on loopback
    (scenarios 9 and 12)."""
    return {"DATADISTD_TRANSPORT_NAME": "nixl", "DATADISTD_TRANSPORT_NIXL_FABRIC_TRUSTED": "true",
            "UCX_TLS": ucx_tls, "UCX_NET_DEVICES": "lo"}


def calls_per_pull(run: Run) -> None:
    """The counts over tcp, then over nixl (UCX shared memory) when NIXL is installed: issue 36 wants a nixl pull
    to make no owner call (one data-plane round trip), which shows as the owner daemon's count."""
    from datadistd.transport.nixl.ucx import MODULES

    _calls_per_pull(run, "", ("CP", "CD"), {})
    if any(importlib.util.find_spec(m) for m in MODULES):
        _calls_per_pull(run, "over nixl (UCX shm), ", ("CPN", "CDN"), nixl_env("shm,tcp"))
    else:
        run.add(Row("12 python calls per pull", "over nixl", None, note="NIXL is not installed (make nixl): skipped"))


def _calls_per_pull(run: Run, what: str, names: tuple[str, str], transport: dict[str, str]) -> None:
    cfg = run.cfg
    scenario = "12 python calls per pull"
    block, num_blocks, calls = 4 * KIB, 256, cfg.count_calls
    where = callcount.sitecustomize_dir()
    env = {**transport, **callcount.env_for(where)}
    try:
        dp, dd = run.daemon(names[0], env), run.daemon(names[1], env)
        wp, wd = run.worker(dp), run.worker(dd)
        port = free_port()
        wp.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}")
        wd.call("init", "DECODER", D)
        wd.call("link", P, f"127.0.0.1:{port}")
        for w in (wp, wd):
            w.call("cache", "lat", "registered", 1, num_blocks, block, model_id=0)
        wd.call("latency_loop", P, "lat", 1, num_blocks, warmup=100)   # warm: the counted pulls are steady ones
        daemons = [dd, dp]                                            # requester, owner
        per: dict[str, list[float]] = {"worker": [], "requester daemon": [], "owner daemon": []}
        for r in range(cfg.reps):
            _window(daemons, where, signal.SIGUSR1, "on")
            t0 = time.monotonic()
            worker = wd.call("count_pull_calls", P, "lat", calls, num_blocks)
            busy = _window(daemons, where, signal.SIGUSR2, "calls")
            wall = time.monotonic() - t0
            _window(daemons, where, signal.SIGUSR1, "on")
            time.sleep(wall)                                          # the same window, idle: background calls
            idle = _window(daemons, where, signal.SIGUSR2, "calls")
            per["worker"].append(worker / calls)
            for proc, b, i in zip(("requester daemon", "owner daemon"), busy, idle, strict=True):
                per[proc].append(max(0, b - i) / calls)
            run.step(f"{scenario}: {what}round {r + 1}/{cfg.reps}")
        for proc, values in per.items():
            limit = 15.0 if proc == "worker" else 20.0
            owner = ("; over nixl issue 36 wants no owner call per pull (one data-plane round trip): this count "
                     "is what the owner daemon still does per pull" if what and proc == "owner daemon" else "")
            run.add(Row(scenario, f"Python calls per 1-block pull ({block // KIB} KiB): {what}{proc}",
                        figure(values, "calls/pull"), target=Target("<=", limit, on="figure"),
                        note=f"profile 'call' events (Python functions entered, generators resumed; C functions not "
                             f"counted) over {calls} warm pulls per round, {cfg.reps} rounds; "
                             + ("a hook on the worker's calling thread, the API entry included" if proc == "worker"
                                else "a sitecustomize hook on every thread of the daemon, less an idle window as "
                                     "long") + "; issue 36's target beside; today 42 / 219 / 106 (cProfile)"
                             + owner))
        run.series[f"{scenario}{', ' + what.rstrip(', ') if what else ''}"] = per
    finally:
        run.close_workers()
        run.stop_daemons(*names)
        shutil.rmtree(where, ignore_errors=True)


# ---- 13: links at rest ------------------------------------------------------------------------------------------

def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise RuntimeError(f"no Threads line in /proc/{pid}/status")


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _at_rest(pids: list[int], seconds: float) -> list[tuple[int, int, float]]:
    """(threads, fds, CPU seconds over ``seconds`` of rest) of each process."""
    before = [thread_cpu(pid) for pid in pids]
    time.sleep(seconds)
    used = [cpu_between(b, thread_cpu(pid)) for pid, b in zip(pids, before, strict=True)]
    return [(_threads(pid), _fds(pid), cpu) for pid, cpu in zip(pids, used, strict=True)]


def links_at_rest(run: Run) -> None:
    cfg = run.cfg
    scenario = "13 links at rest"
    levels = sorted(cfg.rest_links)
    # every engine of the linking side is made before the baseline; a link per engine, between the same two daemons
    env = {"DATADISTD_QUOTA_ENGINES_PER_UID": "0", "DATADISTD_PEER_MAX_CONNECTIONS": str(64 * max(levels) + 64)}
    names = ("RP", "RD")
    try:
        dp, dd = run.daemon(names[0], env), run.daemon(names[1], env)
        wp, wd = run.worker(dp), run.worker(dd)
        port = free_port()
        address = f"127.0.0.1:{port}"
        wp.call("init", "PROMPT", P, listen=address)
        clusters = [100 + k for k in range(max(levels))]
        wd.call("make_engines", clusters, timeout=cfg.timeout_s)
        pids = [dd.pid, dp.pid]                                      # linking end, serving end
        time.sleep(min(2.0, cfg.rest_seconds))                       # the engines' start-up settles
        base = _at_rest(pids, cfg.rest_seconds)
        run.step(f"{scenario}: no link")
        linked = 0
        series: dict[int, dict[str, list[float]]] = {}
        for n in levels:
            wd.call("link_engines", clusters[linked:n], P, address, timeout=cfg.timeout_s)
            linked = n
            time.sleep(min(2.0, cfg.rest_seconds))                   # connections settle (hellos, first pings)
            now = _at_rest(pids, cfg.rest_seconds)
            per_min = 60.0 / cfg.rest_seconds
            series[n] = {}
            for end, (t0, f0, c0), (t1, f1, c1) in zip(("linking end", "serving end"), base, now, strict=True):
                what = f"{n} link{'s' if n > 1 else ''} at rest, {end}"
                values = {"threads": (t1 - t0) / n, "fds": (f1 - f0) / n, "cpu": (c1 - c0) / n * per_min * 1e3}
                series[n][end] = list(values.values())
                run.add(Row(scenario, f"{what}: threads per link", Figure(values["threads"], values["threads"],
                                                                          values["threads"], 1, "threads/link"),
                            target=Target("<=", 1.0, on="figure"),
                            note=f"/proc/<pid>/status Threads with {n} links less with none (the engines made); "
                                 f"today 4 per end (a reader thread per connection, [transport] streams = 4)"))
                run.add(Row(scenario, f"{what}: fds per link", Figure(values["fds"], values["fds"], values["fds"], 1,
                                                                      "fds/link"),
                            target=Target("<=", 1.0, on="figure"),
                            note=f"/proc/<pid>/fd with {n} links less with none; today 4 per end"))
                run.add(Row(scenario, f"{what}: idle CPU per link", Figure(values["cpu"], values["cpu"], values["cpu"],
                                                                           1, "CPU-ms/min/link"),
                            target=Target("<=", 2.0, on="figure"),
                            note=f"CPU over {cfg.rest_seconds:g} s of rest, scaled to a minute, less the same "
                                 f"with no link (per thread, /proc/<pid>/task/<tid>/schedstat: nanoseconds, not "
                                 f"ticks); heartbeat [peer] heartbeat_seconds = 2; the issue's 27-30 before"))
            run.step(f"{scenario}: {n} links")
        run.series[scenario] = series
    finally:
        run.close_workers()
        run.stop_daemons(*names)


# ---- 14: a peer's death -----------------------------------------------------------------------------------------

def peer_death(run: Run) -> None:
    cfg = run.cfg
    scenario = "14 peer death"
    block, num_blocks = 4 * KIB, 16
    names = ("KP", "KD")
    seconds: list[float] = []
    outcomes: list[str] = []
    try:
        dd = run.daemon(names[1])
        wd = run.worker(dd)
        wd.call("init", "DECODER", D)
        wd.call("cache", "lat", "registered", 1, num_blocks, block, model_id=0)
        for r in range(cfg.reps):
            dp = run.daemon(names[0])                                  # a fresh owner daemon each round
            wp = run.worker(dp)
            port = free_port()
            wp.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}")
            wp.call("cache", "lat", "registered", 1, num_blocks, block, model_id=0)
            wd.call("link", P, f"127.0.0.1:{port}")
            wd.call("pull_outcome", P, "lat", [0], [1])                # the link works
            os.kill(dp.pid, signal.SIGSTOP)                            # its kernel takes the pull; nothing answers
            wd.send("pull_outcome", P, "lat", [2], [3])
            time.sleep(0.3)                                            # the pull is on its way
            killed = time.monotonic()
            os.kill(dp.pid, signal.SIGKILL)
            outcome, ended = wd.result(cfg.timeout_s)
            seconds.append(ended - killed)
            outcomes.append(outcome)
            wp.kill()
            run.workers.remove(wp)
            run.stop_daemons(names[0])
            wd.call("unlink", P)
            run.step(f"{scenario}: round {r + 1}/{cfg.reps}")
        ms = [s * 1e3 for s in seconds]
        run.add(Row(scenario, "a 1-block pull in flight when its peer daemon is SIGKILLed: time to its failure",
                    figure(ms, "ms"), target=Target("<=", 100.0, on="figure"),
                    note=f"owner stopped (SIGSTOP) with the pull on its way, then killed; from the kill to the "
                         f"worker's answer ({', '.join(sorted(set(outcomes)))}); [peer] heartbeat_seconds = 2; "
                         f"{cfg.reps} rounds, a fresh owner daemon each; today 1.4-1.5 s (the next heartbeat)"))
        run.series[scenario] = {"ms": ms, "outcomes": outcomes}
    finally:
        run.close_workers()
        run.stop_daemons(*names)
