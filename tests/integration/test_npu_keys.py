"""A worker's export keys of its own NPU memory (issue 45, finding 11): each ``register_cache`` of DEVICE tensors on
an ``acl`` daemon exports them by ACL IPC key; the worker closes a key (``aclrtIpcMemClose`` as the exporter) once
the daemon no longer imports it -- after the unregistration, the engine's finalize -- importer first, exporter
second, and a key shared by two registrations of one range only when the last goes. On the SIMULATED runtime,
which keeps each open export key where a test counts it (``tests.sim.open_export_keys``) and ledgers each close."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.harness import ACL_PLANE, over_planes
from tests.integration.test_npus import _device_init
from tests.sim import open_export_keys

pytestmark = over_planes(ACL_PLANE)

DEVICE = 1
TENSORS = 2


def _register(state: dict, tag: str) -> int:
    """``register_cache`` of the worker's NPU tensors ``tag`` (allocated once, on the engine's NPU): the cache id."""
    import llm_datadist as ld
    from tests.worker_ops import NpuTensor

    tensors = state.setdefault(f"keys-{tag}", None) or [NpuTensor.allocate((4, 64), np.uint8, DEVICE)
                                                       for _ in range(TENSORS)]
    state[f"keys-{tag}"] = tensors
    desc = ld.CacheDesc(TENSORS, [4, 64], ld.DataType.DT_UINT8, ld.Placement.DEVICE)
    return state["dd"].cache_manager.register_cache(desc, [t.addr for t in tensors]).cache_id


def _pid(state: dict) -> int:
    import os
    return os.getpid()


def _unregister(state: dict, cache_id: int) -> None:
    state["dd"].cache_manager.unregister_cache(cache_id)


def _finalize(state: dict) -> None:
    state["dd"].finalize()


def _closes(sim: str, pid: int) -> list[str]:
    """The keys process ``pid`` closed (``aclrtIpcMemClose``), in order."""
    out = []
    for line in Path(sim, "ledger").read_text().splitlines():
        owner, what, *_, key = line.split()
        if int(owner) == pid and what == "aclrtIpcMemClose":
            out.append(key)
    return out


@pytest.fixture
def npu_worker(daemon_factory, worker_factory):
    d = daemon_factory("d")
    sim = d.env.get("ASCEND_SIM_DIR")
    if sim is None:
        pytest.skip("counts the simulated runtime's open export keys (make test-ascend: tests/hw/first_hour.py)")
    w = worker_factory(d)
    w.call("init", **_device_init("DECODER", 2, DEVICE))
    return d, w, sim, w.call("run", __name__, "_pid")


def test_registering_and_unregistering_npu_memory_leaves_no_export_key(npu_worker) -> None:
    """Register and unregister DEVICE tensors five times: each registration's keys are open while it lives and
    closed by the worker after its unregistration, each after the daemon closed its import of it."""
    d, w, sim, pid = npu_worker
    for _ in range(5):
        cache_id = w.call("run", __name__, "_register", "a")
        keys = open_export_keys(sim, pid)
        assert len(keys) == TENSORS
        w.call("run", __name__, "_unregister", cache_id)
        assert open_export_keys(sim, pid) == []
        daemon = _closes(sim, d.pid)
        assert all(k in daemon for k in keys)   # the importer closed first
    assert len(_closes(sim, pid)) == 5 * TENSORS


def test_finalize_closes_the_export_keys_of_its_registrations(npu_worker) -> None:
    """An engine finalized with registrations still in place leaves no export key open."""
    _, w, sim, pid = npu_worker
    w.call("run", __name__, "_register", "a")
    w.call("run", __name__, "_register", "b")
    assert len(open_export_keys(sim, pid)) == 2 * TENSORS
    w.call("run", __name__, "_finalize")
    assert open_export_keys(sim, pid) == []


def test_a_range_registered_twice_shares_one_key_closed_after_the_second_unregistration(npu_worker) -> None:
    """The same tensors registered twice: one key per tensor, for both registrations; the first unregistration
    closes nothing, the second closes each key once."""
    d, w, sim, pid = npu_worker
    first = w.call("run", __name__, "_register", "a")
    keys = open_export_keys(sim, pid)
    second = w.call("run", __name__, "_register", "a")
    assert open_export_keys(sim, pid) == keys and len(keys) == TENSORS
    w.call("run", __name__, "_unregister", first)
    assert open_export_keys(sim, pid) == keys and _closes(sim, pid) == []
    w.call("run", __name__, "_unregister", second)
    assert open_export_keys(sim, pid) == [] and sorted(_closes(sim, pid)) == keys
    assert sorted(_closes(sim, d.pid)) == sorted(keys * 2)   # the daemon's two imports of each, closed first
