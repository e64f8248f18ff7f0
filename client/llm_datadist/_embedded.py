"""Private: embedded mode — the daemon's app inside this worker process, on a private socket.

Used when neither the ``datadist.daemon`` option nor ``DATADIST_DAEMON`` names a daemon. The
client still talks gRPC to it, through the same code path as to a system daemon. ``DATADISTD_*``
environment variables configure it like the system daemon (except the socket); without a peer secret
it uses this user's own, as a daemon of this user does (``datadistd.ops.peersecret``), and never falls back to
the public development secret.

What goes wrong at its start reaches ``init``'s caller as an ``LLMException``, never as one of the daemon's own
exceptions: a bad ``DATADISTD_*`` variable or secret file (the daemon's ``ConfigError``, ``UnsafeSecret``) is
``LLM_PARAM_INVALID``, a socket or file it cannot make (``OSError``) ``LLM_FAILED``; the message names the cause.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
from concurrent.futures import Future
from typing import Any

from .status import LLMException, LLMStatusCode

#: how long ``init`` waits for the embedded daemon's start
START_TIMEOUT_S = 30


class EmbeddedDaemon:
    def __init__(self) -> None:
        from datadistd.ops.config import ConfigError, load_config
        from datadistd.ops.peersecret import peer_secret
        from datadistd.process.app import DaemonApp  # the daemon package, loaded only in embedded mode

        self._dir = tempfile.mkdtemp(prefix="datadist-embedded-")
        os.chmod(self._dir, 0o700)
        overrides: dict[str, Any] = {"daemon.socket": os.path.join(self._dir, "datadistd.sock"),
                                     "daemon.socket_mode": 0o600, "daemon.drain_seconds": 1.0,
                                     "peer.dev_secret_fallback": False}
        try:   # a bad DATADISTD_* variable or secret file: ConfigError naming it, and no directory left behind
            config = load_config(overrides=overrides)
            # $STATE_DIRECTORY is the worker's own unit's (systemd's StateDirectory= of the inference service), not
            # a datadist node's: this daemon uses this user's secret, as every embedded one of the user does
            env = {k: v for k, v in os.environ.items() if k != "STATE_DIRECTORY"}
            self.app = DaemonApp(config, peer_secret=peer_secret(config.peer, env=env))
        except (ConfigError, OSError) as exc:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise _refused(exc, isinstance(exc, ConfigError)) from exc
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
        try:
            started.result(timeout=START_TIMEOUT_S)
        except TimeoutError:   # (an OSError too) the start still runs: nothing here is ours to remove
            raise LLMException(f"[init] failed, error code is {LLMStatusCode.LLM_FAILED}, the embedded datadistd did "
                               f"not start within {START_TIMEOUT_S} s.", status_code=LLMStatusCode.LLM_FAILED) from None
        except (ConfigError, OSError) as exc:   # its start ended: its thread with it
            self._thread.join(timeout=5)
            self._loop.close()
            shutil.rmtree(self._dir, ignore_errors=True)
            raise _refused(exc, isinstance(exc, ConfigError)) from exc

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


def _refused(exc: BaseException, bad_config: bool) -> LLMException:
    """``init``'s exception for the embedded daemon's failed start (``exc``: a ``ConfigError`` when ``bad_config``):
    see the module doc."""
    code = LLMStatusCode.LLM_PARAM_INVALID if bad_config else LLMStatusCode.LLM_FAILED
    return LLMException(f"[init] failed, error code is {code}, the embedded datadistd did not start: {exc}.",
                        status_code=code)
