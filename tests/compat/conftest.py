from __future__ import annotations

import pytest


class Spawner:
    """Worker processes as a scenario's caller runs them: ``embedded`` (a daemon inside each process, no
    daemon configured) or ``daemons`` (through a node daemon). ``spawn()`` gives each worker a daemon of
    its own; ``spawn(node)`` with ``node = spawn.node()`` puts several workers on one node daemon."""

    def __init__(self, mode: str, daemon_factory, worker_factory) -> None:  # noqa: ANN001
        self.mode = mode
        self._daemons = daemon_factory
        self._workers = worker_factory

    def node(self):  # noqa: ANN201 - a Daemon, or None in embedded mode
        return self._daemons("node") if self.mode == "daemons" else None

    def __call__(self, node=None):  # noqa: ANN001, ANN204
        if self.mode == "embedded":
            return self._workers()
        return self._workers(node if node is not None else self.node())


@pytest.fixture(params=["embedded", "daemons"])
def spawn(request, daemon_factory, worker_factory) -> Spawner:
    return Spawner(request.param, daemon_factory, worker_factory)
