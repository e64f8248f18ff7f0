"""``datadistd``: run the daemon in the foreground (systemd ``Type=notify``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from . import __version__
from .app import DaemonApp
from .config import ConfigError, load_config
from .sdnotify import notify, watchdog_interval

__all__ = ["main"]

log = logging.getLogger("datadistd")


def _setup_logging(level: str) -> None:
    under_journal = bool(os.environ.get("JOURNAL_STREAM"))
    fmt = "%(levelname)s %(name)s: %(message)s" if under_journal else "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), format=fmt, stream=sys.stderr)


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
    log.info("signal received: draining")
    notify("STOPPING=1")
    if pinger is not None:
        pinger.cancel()
    await app.stop()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
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
    except OSError as exc:
        log.error("cannot start: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
