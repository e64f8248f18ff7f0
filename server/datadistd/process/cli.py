"""``datadistd``: run the daemon in the foreground (systemd ``Type=notify``)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
from typing import Mapping

from .. import __version__
from ..ops.config import ConfigError, load_config
from .app import DaemonApp
from .sdnotify import notify, watchdog_interval

__all__ = ["main"]

log = logging.getLogger("datadistd")

#: set by whoever starts the daemon as its child (tests/daemonproc.py): the daemon stops when that parent dies
PARENT_PID_ENV = "DATADIST_DIE_WITH_PARENT"


# syslog priorities journald reads from a "<N>" line prefix (SyslogLevelPrefix=yes, the default).
_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}


class JournalFormatter(logging.Formatter):
    """``<priority>logger: message`` — journald adds the timestamp, pid and unit itself.

    journald splits its input stream at newlines, so every line of a multi-line record (a
    traceback) carries the record's priority prefix.
    """

    def __init__(self) -> None:
        super().__init__("%(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        level = max((lv for lv in _PRIORITY if lv <= record.levelno), default=logging.DEBUG)
        prefix = f"<{_PRIORITY[level]}>"
        return "\n".join(prefix + line for line in super().format(record).split("\n"))


def stderr_is_journal(env: Mapping[str, str] | None = None) -> bool:
    """True when stderr is the journal stream systemd connected (``$JOURNAL_STREAM`` = its device:inode)."""
    value = (os.environ if env is None else env).get("JOURNAL_STREAM", "")
    dev, _, ino = value.partition(":")
    if not (dev.isdigit() and ino.isdigit()):
        return False
    try:
        st = os.fstat(2)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (int(dev), int(ino))


def _setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if stderr_is_journal():
        handler.setFormatter(JournalFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="datadistd", description="datadist KV-cache transfer daemon")
    p.add_argument("--config", "-c", help="TOML config file (see deploy/datadistd.toml)")
    p.add_argument("--socket", help="worker socket path ([daemon] socket)")
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING, ERROR ([daemon] log_level)")
    p.add_argument("--backend", help="memory backend ([memory] backend)")
    p.add_argument("--transport", help="data-plane transport ([transport] name)")
    p.add_argument("--metrics", help="Prometheus address host:port ([metrics] listen)")
    p.add_argument("--version", action="version", version=f"datadistd {__version__}")
    return p.parse_args(argv)


async def _run(app: DaemonApp) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await app.start()
    # what start-up made (modules, protobuf descriptors, grpc, config) lives as long as the daemon: frozen, out of the
    # cyclic collector's sight, a full collection walks only what serving made (gc_collect_main was ~9% of the
    # requester loop's samples under 64 x 1 MiB pulls in flight; CPU per MiB ~6% lower A/B, docs/performance.md)
    gc.collect()
    gc.freeze()
    notify(f"READY=1\nSTATUS=serving on {app.socket_path}\nMAINPID={os.getpid()}")
    watchdog = watchdog_interval()
    pinger = None
    if watchdog:
        async def ping() -> None:
            while True:
                notify("WATCHDOG=1")
                await asyncio.sleep(watchdog)
        pinger = loop.create_task(ping())
    await stop.wait()
    log.info("signal received: draining (up to %.1fs)", app.config.daemon.drain_seconds)
    notify("STOPPING=1\nSTATUS=draining")
    if pinger is not None:
        pinger.cancel()
    await app.stop()


def _die_with_parent() -> None:
    """Started by a test, bench or demo process (``tests/daemonproc.py``, ``die_with_parent``): SIGTERM when
    that process dies, so no daemon outlives a crashed run; at once if it is already gone."""
    parent = os.environ.pop(PARENT_PID_ENV, "")
    if not parent.isdigit():
        return
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != int(parent):  # reparented: did the parent die before the line above?
        try:
            os.kill(int(parent), 0)
        except ProcessLookupError:
            os.kill(os.getpid(), signal.SIGTERM)
        except PermissionError:
            pass


def main(argv: list[str] | None = None) -> int:
    _die_with_parent()
    args = parse_args(argv)
    _setup_logging("WARNING")   # what loading the config warns of (a key it does not read)
    try:
        config = load_config(args.config, overrides={
            "daemon.socket": args.socket, "daemon.log_level": args.log_level, "memory.backend": args.backend,
            "transport.name": args.transport, "metrics.listen": args.metrics,
        })
    except ConfigError as exc:
        print(f"datadistd: {exc}", file=sys.stderr)
        return 2
    _setup_logging(config.daemon.log_level)
    try:
        asyncio.run(_run(DaemonApp(config)))
    except ConfigError as exc:  # found at start (the socket directory, ...): restarting will not help
        log.error("cannot start: %s", exc)
        return 2
    except OSError as exc:
        log.error("cannot start: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
