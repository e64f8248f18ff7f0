from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.harness import Daemon, Worker  # noqa: E402


@pytest.fixture
def daemon_factory():
    daemons: list[Daemon] = []

    def make(name: str = "d", **kwargs) -> Daemon:  # noqa: ANN003
        d = Daemon(name, **kwargs).start()
        daemons.append(d)
        return d

    yield make
    for d in daemons:  # stopped, and their directories (socket, log, pools) removed
        d.discard()


@pytest.fixture
def worker_factory():
    workers: list[Worker] = []

    def make(daemon: Daemon | None = None, **env: str) -> Worker:
        if daemon is not None:
            env = {"DATADIST_DAEMON": daemon.target, **env}
        w = Worker(env)
        workers.append(w)
        return w

    yield make
    for w in workers:
        w.close()


@pytest.fixture(autouse=True)
def _no_daemon_env(monkeypatch):
    """Tests choose their daemon explicitly; a DATADIST_DAEMON from the shell must not leak in."""
    monkeypatch.delenv("DATADIST_DAEMON", raising=False)
    yield


_ = os
