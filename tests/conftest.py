from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: no timing thresholds in the tests: Hypothesis's default 200 ms deadline per example failed a property test whose
#: example took 345 ms once on a loaded machine (and 184 ms when Hypothesis ran it again)
settings.register_profile("datadist", deadline=None)
settings.load_profile("datadist")

from tests.harness import ACL_PLANE, DATA_PLANES, WORKER_ENV, Daemon, Worker, nixl_installed  # noqa: E402


@pytest.fixture
def data_plane(request) -> dict[str, str]:
    """The daemon environment of a data plane (``tests.harness.DATA_PLANES``): tcp unless a module
    parametrizes it (``indirect``) to run its transfers over nixl too."""
    name = getattr(request, "param", "tcp")
    if name == ACL_PLANE:
        return {**DATA_PLANES[name], **ascend_runtime(request)}
    if name != "tcp" and not nixl_installed():
        pytest.skip("NIXL is not installed (make nixl)")
    return DATA_PLANES[name]


def ascend_runtime(request) -> dict[str, str]:
    """The Ascend runtime for the acl plane: CANN's own when ``DATADIST_ASCEND_REAL=1`` (``make test-ascend``,
    ``ASCEND_HOME_PATH`` set), else the simulated one, built once (skipped without a C compiler), with a state
    directory of this test's own."""
    if os.environ.get("DATADIST_ASCEND_REAL") == "1":
        if not os.environ.get("ASCEND_HOME_PATH"):
            pytest.skip("DATADIST_ASCEND_REAL=1 needs ASCEND_HOME_PATH (source CANN's set_env.sh)")
        return {"ASCEND_HOME_PATH": os.environ["ASCEND_HOME_PATH"]}
    from tests.sim import build, sim_env
    root = build()
    if root is None:
        pytest.skip("no C compiler (cc/gcc): the simulated Ascend runtime cannot be built")
    state = request.getfixturevalue("tmp_path") / "ascend-sim"
    state.mkdir()
    return sim_env(root, str(state))


@pytest.fixture(scope="session")
def sim_root():
    """The SIMULATED Ascend runtime's root (``tests.sim.build``, built once), for tests that call it directly;
    skipped without a C compiler."""
    from tests.sim import build
    root = build()
    if root is None:
        pytest.skip("no C compiler: the simulated Ascend runtime cannot be built")
    return root


class DaemonFactory:
    """``daemon_factory(name, **kwargs)`` starts one daemon on the test's data plane; ``.many(*names)``
    starts several at once (their start-ups overlap: about half the wait of starting them in turn)."""

    def __init__(self, data_plane: dict[str, str]) -> None:
        self.data_plane = data_plane
        self.daemons: list[Daemon] = []
        self._servers = 0

    def _new(self, name: str, kwargs: dict) -> Daemon:
        own = kwargs.get("env") or {}
        env = {**self.data_plane, **own}
        named = own.get("ASCEND_SIM_HCCN_CONF")   # a node the test chose (not the runtime's generated default)
        chosen = named is not None and named != os.path.join(env.get("ASCEND_SIM_DIR", ""), "hccn-100.conf")
        kwargs["env"] = {**env, **({} if chosen else self._server(env))}
        return Daemon(name, **kwargs)

    def _server(self, env: dict[str, str]) -> dict[str, str]:
        """On the simulated Ascend runtime each daemon is a server of its own: eight NPUs whose NIC addresses
        (its hccn.conf) are no other daemon's -- two daemons on one NPU number would otherwise claim one device ip,
        which HCCL refuses (tests/sim/hccl.c R18, R20). A test names a daemon's node in its ``env``."""
        sim = env.get("ASCEND_SIM_DIR")
        if not sim:
            return {}
        from tests.sim import write_hccn_conf
        subnet = 100 + self._servers
        self._servers += 1
        conf = write_hccn_conf(os.path.join(sim, f"hccn-{subnet}.conf"), subnet)
        return {"ASCEND_SIM_HCCN_CONF": conf, "DATADISTD_TRANSPORT_HCCL_HCCN_CONF": conf}

    def __call__(self, name: str = "d", **kwargs) -> Daemon:  # noqa: ANN003
        d = self._new(name, kwargs).start()
        self.daemons.append(d)
        return d

    def many(self, *names: str, **kwargs) -> list[Daemon]:  # noqa: ANN003
        started = Daemon.start_all([self._new(n, dict(kwargs)) for n in names])
        self.daemons.extend(started)
        return started

    def close(self) -> None:
        for d in self.daemons:  # stopped, and their directories (socket, log, pools) removed
            d.discard()


@pytest.fixture
def daemon_factory(data_plane):
    factory = DaemonFactory(data_plane)
    yield factory
    factory.close()


@pytest.fixture
def worker_factory():
    workers: list[Worker] = []

    def make(daemon: Daemon | None = None, **env: str) -> Worker:
        if daemon is not None:
            plane = {k: daemon.env[k] for k in WORKER_ENV if k in daemon.env}
            env = {"DATADIST_DAEMON": daemon.target, **plane, **env}
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
