"""NPU memory of workers that share one daemon (backend ``acl`` on the SIMULATED runtime, tests/sim): a worker
cannot hand another worker's NPU memory over as its own, even knowing its IPC key.

An IPC key is only a name (ACL tells an importer nothing of who exported it) and the victim white-listed
the daemon's pid, as register_cache does. The daemon therefore asks for a proof of possession
(``datadist_ascend.proof``) that only the memory's owner can have put there."""

from __future__ import annotations

import hashlib

import numpy as np

from llm_datadist.status import LLMException, LLMStatusCode
from tests.harness import ACL_PLANE, over_planes
from tests.worker_ops import NpuTensor

pytestmark = over_planes(ACL_PLANE)

NBYTES = 64 << 10


def _attach(state: dict):  # noqa: ANN202
    return state["dd"]._check_init().attach()


def leak_npu_key(state: dict, seed: int) -> tuple[str, int]:
    """Victim: NPU memory of its own, exported for the daemon as register_cache exports it; the key leaks."""
    from datadist_ascend.acl import acl

    attach = _attach(state)
    t = NpuTensor.allocate((NBYTES,), np.uint8)
    t.store(np.random.default_rng(seed).integers(0, 256, NBYTES, dtype=np.uint8))
    state["victim"] = t
    key = acl().ipc_export(attach.device_id, t.addr, NBYTES)
    acl().ipc_allow(attach.device_id, key, [attach.daemon_tgid])
    return key, attach.device_id


def victim_digest(state: dict) -> str:
    return hashlib.sha256(state["victim"].load().tobytes()).hexdigest()


def present_key(state: dict, key: str, device: int, length: int) -> int:
    """Attacker: hand the key over as its own memory on its own attach connection; the status it got."""
    try:
        _attach(state).import_device_memory(key, device, length, "register_cache")
    except LLMException as exc:
        return int(exc.status_code)
    return 0


def test_a_worker_cannot_hand_over_another_workers_npu_memory(daemon_factory, worker_factory):
    d = daemon_factory("npu")
    victim, attacker = worker_factory(d), worker_factory(d)
    victim.call("init", "PROMPT", 1)
    attacker.call("init", "DECODER", 2)
    key, device = victim.call("run", __name__, "leak_npu_key", 7)
    before = victim.call("run", __name__, "victim_digest")
    for length in (NBYTES, 16, NBYTES + 1):
        assert attacker.call("run", __name__, "present_key", key, device, length) == LLMStatusCode.LLM_PARAM_INVALID
    assert victim.call("run", __name__, "victim_digest") == before   # only read, never written
    # the attacker's own NPU memory goes over: register_cache proves possession and leaves its bytes as they were
    assert attacker.call("run", __name__, "register_own", 3)


def register_own(state: dict, seed: int) -> bool:
    """register_cache of NPU memory of this worker's, filled first; its bytes after are the bytes before."""
    import llm_datadist as ld

    t = NpuTensor.allocate((4, 256), np.uint8)
    t.store(np.random.default_rng(seed).integers(0, 256, t.shape, dtype=np.uint8))
    before = t.load()
    desc = ld.CacheDesc(1, [4, 256], ld.DataType.DT_UINT8, ld.Placement.DEVICE)
    cache = state["dd"].cache_manager.register_cache(desc, [t.addr])
    return cache.cache_id >= 0 and np.array_equal(t.load(), before)
