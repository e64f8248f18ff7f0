from __future__ import annotations

import pytest


@pytest.fixture(params=["embedded", "daemons"])
def spawn(request, daemon_factory, worker_factory):
    """``spawn()`` -> a worker process, as the scenario's caller runs: with an embedded daemon in the
    process (no daemon configured), or through a node daemon of its own (``spawn(node=...)`` shares one)."""

    def make(node: object = None):  # noqa: ANN202
        if request.param == "embedded":
            return worker_factory()
        return worker_factory(node if node is not None else daemon_factory("node"))

    make.mode = request.param  # type: ignore[attr-defined]
    make.daemon = (lambda: daemon_factory("node")) if request.param == "daemons" else (lambda: None)  # type: ignore[attr-defined]
    return make
