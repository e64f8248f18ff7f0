"""Test harness: real ``datadistd`` processes and remote-controlled worker processes.

``Daemon`` starts ``python -m datadistd`` on a private socket and waits for health SERVING
(``tests.daemonproc``, shared with the bench and the demo).
``Worker`` is a spawned process that runs functions of ``tests.worker_ops`` on request
(``tests.workerproc``, shared with the bench), so a test can drive a prompt worker and a
decoder worker step by step, each with its own ``LLMDataDist`` singleton, exactly as two real
worker processes would.
"""

from __future__ import annotations

import os
import re
import time
import urllib.request
from pathlib import Path

from tests.daemonproc import DaemonProcess, free_port
from tests.workerproc import WorkerError, WorkerProcess

__all__ = ["ROOT", "Daemon", "Worker", "WorkerError", "free_port", "fd_targets", "pool_memfds", "DATA_PLANES",
           "NIXL_PLANES", "nixl_installed", "nixl_plane", "ACL_PLANE", "WORKER_ENV",
           "ALL_PLANES", "DEFAULT_PLANES", "metrics_address", "scrape", "series_sum"]

ROOT = Path(__file__).resolve().parents[1]


def fd_targets(pid: int) -> list[str]:
    """What every open descriptor of process ``pid`` points at (``readlink /proc/<pid>/fd/N``)."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:  # closed meanwhile
            continue
    return out


def pool_memfds(pid: int) -> set[str]:
    """The pool memfds process ``pid`` holds open (``/memfd:datadist-<pid>-<placement>-<id> (deleted)``):
    pools are in no directory, so this is how a test sees one exist and go."""
    return {t for t in fd_targets(pid) if t.startswith("/memfd:datadist-")}


def nixl_plane(tls: str, devices: str = "lo") -> dict[str, str]:
    """Daemon environment for the nixl transport with UCX limited to ``tls`` on network ``devices``."""
    return {"DATADISTD_TRANSPORT_NAME": "nixl", "DATADISTD_TRANSPORT_NIXL_FABRIC_TRUSTED": "true",
            "UCX_TLS": tls, "UCX_NET_DEVICES": devices}


#: daemon environments of the data planes transfer tests run over: tcp, and nixl with UCX over TCP on the
#: loopback device or over shared memory (the two UCX paths this host has; no RDMA NIC here). UCX does
#: not start without one network transport: ``shm,tcp`` moves bytes by shared memory / CMA between the
#: two daemons of one host and keeps tcp (loopback) for its wire-up.
DATA_PLANES: dict[str, dict[str, str]] = {
    "tcp": {},
    "nixl-ucx-tcp": nixl_plane("tcp"),
    "nixl-ucx-shm": nixl_plane("shm,tcp"),
}
NIXL_PLANES = ["nixl-ucx-tcp", "nixl-ucx-shm"]
#: NPU memory and HCCL on the SIMULATED Ascend runtime (tests/sim; its environment is added by the
#: ``data_plane`` fixture, which builds it): DEVICE caches are simulated NPU memory, bytes move by HcclBatchPut
ACL_PLANE = "acl-hccl"
DATA_PLANES[ACL_PLANE] = {"DATADISTD_MEMORY_BACKEND": "acl", "DATADISTD_TRANSPORT_NAME": "hccl",
                          "DATADIST_TEST_NPU": "1"}
#: what a worker of a daemon on a plane needs of the plane's environment (the runtime it loads)
WORKER_ENV = ("ASCEND_HOME_PATH", "ASCEND_SIM_DIR", "DATADIST_TEST_NPU")
ALL_PLANES = ["tcp", *NIXL_PLANES, ACL_PLANE]
#: the planes a transfer test runs over unless it names them: UCX's shared-memory transport moves the same
#: datadist code path as its TCP one, so it runs only in the tests that name every plane (``ALL_PLANES``: the
#: byte-exact random tables, pushes, two-way links, layer-wise) -- make test's time budget
DEFAULT_PLANES = ["tcp", "nixl-ucx-tcp", ACL_PLANE]


def over_planes(*planes: str):
    """Run a test once per named data plane (default: ``DEFAULT_PLANES``) through the indirect ``data_plane``
    fixture. Tests that move bytes run over tcp, nixl and acl-hccl, a few (``ALL_PLANES``) over UCX's shared
    memory too; tests of the control path (errors, limits, the local path) over tcp, at most one nixl plane and
    acl-hccl, so ``make test`` keeps its time budget."""
    import pytest

    names = list(planes) or DEFAULT_PLANES
    unknown = [p for p in names if p not in DATA_PLANES]
    if unknown:
        raise ValueError(f"unknown data planes {unknown}; known: {list(DATA_PLANES)}")
    return pytest.mark.parametrize("data_plane", names, indirect=True)


def nixl_installed() -> bool:
    """NIXL's Python module is importable (``make nixl``)."""
    import importlib.util

    from datadistd.transport.nixl.ucx import MODULES
    return any(importlib.util.find_spec(m) is not None for m in MODULES)


#: the secret of test daemons that listen on non-loopback addresses (network namespaces): a daemon with the
#: public development secret listens on loopback only
NETNS_SECRET = "datadist-test-hosts-secret"


class Daemon(DaemonProcess):
    """A test daemon (``ip netns exec`` in ``netns`` if given); its directory outlives ``stop``, so it can restart.

    In a network namespace it gets ``NETNS_SECRET``: it listens on the namespace's own address."""

    def __init__(self, name: str = "d", env: dict[str, str] | None = None, args: list[str] | None = None,
                 shm_dir: str | None = None, netns: str | None = None) -> None:
        if netns:
            env = {"DATADISTD_PEER_SECRET": NETNS_SECRET, **(env or {})}
        super().__init__(name, env, args or (), shm_dir=shm_dir, keep_dir=True, dir_prefix="datadist-test-",
                         command=["ip", "netns", "exec", netns] if netns else ())


class Worker(WorkerProcess):
    """A worker process; ``w.call("op", ...)`` runs ``tests.worker_ops.op(state, ...)`` in it (60 s by default)."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        super().__init__("tests.worker_ops", env, path=str(ROOT))


def metrics_address(daemon: DaemonProcess, deadline: float = 10.0) -> str:
    """host:port of the daemon's metrics endpoint (it binds port 0 and logs the real one)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:   # the whole log, not its tail: a DEBUG daemon logs past the start-up line fast
        try:
            text = Path(daemon.log_path).read_text(errors="replace")
        except OSError:
            text = ""
        found = re.search(r"metrics on http://([^/\s]+)/metrics", text)
        if found:
            return found.group(1)
        time.sleep(0.05)
    raise TimeoutError(f"no metrics address in the daemon log:\n{daemon.log()}")


def scrape(address: str, timeout: float = 5.0) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://{address}/metrics", timeout=timeout) as resp:
        assert resp.status == 200
        return resp.read().decode()


def series_sum(address: str, name: str, labels: str) -> float:
    """The sum of metric ``name``'s series at ``address`` whose labels include every one of ``labels``
    (``'op="pull",outcome="success"'``)."""
    total = 0.0
    for line in scrape(address).splitlines():
        m = re.match(rf"{name}{{([^}}]*)}} (\S+)$", line)
        if m and all(part in m.group(1).split(",") for part in labels.split(",")):
            total += float(m.group(2))
    return total
