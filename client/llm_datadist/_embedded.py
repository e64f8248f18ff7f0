"""Private: embedded mode — the daemon's app inside this worker process, on a private socket.

Used when neither the ``datadist.daemon`` option nor ``DATADIST_DAEMON`` names a daemon. The
client still talks gRPC to it, through the same code path as to a system daemon. ``DATADISTD_*``
environment variables configure it like the system daemon (except the socket); without a peer secret
it uses this user's own, as a daemon of this user does (``datadistd.state.peersecret``), and never falls back to
the public development secret.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
from concurrent.futures import Future
from typing import Any


class EmbeddedDaemon:
    def __init__(self) -> None:
        from datadistd.process.app import DaemonApp  # the daemon package, loaded only in embedded mode
        from datadistd.state.config import load_config
        from datadistd.state.peersecret import peer_secret

        self._dir = tempfile.mkdtemp(prefix="datadist-embedded-")
        os.chmod(self._dir, 0o700)
        overrides: dict[str, Any] = {"daemon.socket": os.path.join(self._dir, "datadistd.sock"),
                                     "daemon.socket_mode": 0o600, "daemon.drain_seconds": 1.0,
                                     "peer.dev_secret_fallback": False}
        try:   # a bad DATADISTD_* variable or secret file: ConfigError naming it, and no directory left behind
            config = load_config(overrides=overrides)
            self.app = DaemonApp(config, peer_secret=peer_secret(config.peer))
        except BaseException:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        self._loop = asyncio.new_event_loop()
        started: Future[Any] = Future()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self.app.start())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                started.set_exception(exc)
                return
            started.set_result(None)
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="datadist-embedded-daemon", daemon=True)
        self._thread.start()
        started.result(timeout=30)

    @property
    def target(self) -> str:
        return self.app.target

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        fut = asyncio.run_coroutine_threadsafe(self.app.stop(grace=1.0), self._loop)
        try:
            fut.result(timeout=15)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            shutil.rmtree(self._dir, ignore_errors=True)
