from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.harness import DATA_PLANES, Daemon, Worker, nixl_installed  # noqa: E402


@pytest.fixture
def data_plane(request) -> dict[str, str]:
    """The daemon environment of a data plane (``tests.harness.DATA_PLANES``): tcp unless a module
    parametrizes it (``indirect``) to run its transfers over nixl too."""
    name = getattr(request, "param", "tcp")
    if name != "tcp" and not nixl_installed():
        pytest.skip("NIXL is not installed (make nixl)")
    return DATA_PLANES[name]


@pytest.fixture
def daemon_factory(data_plane):
    daemons: list[Daemon] = []

    def make(name: str = "d", **kwargs) -> Daemon:  # noqa: ANN003
        kwargs["env"] = {**data_plane, **(kwargs.get("env") or {})}
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
