"""NPU memory of workers that share one daemon (backend ``acl`` on the SIMULATED runtime, tests/sim): a worker
cannot hand another worker's NPU memory over as its own, even knowing its IPC key.

An IPC key is only a name (ACL tells an importer nothing of who exported it) and the victim white-listed
the daemon's pid, as register_cache does. The daemon therefore asks for a proof of possession
(``datadist_ascend.proof``) that only the memory's owner can have put there. And a worker cannot point its
engine's pool key at another process by claiming that process's bare tgid where the kernel's pid is the driver's."""

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


def bare_tgid(state: dict) -> int:
    from datadist_ascend.acl import acl

    return acl().bare_tgid()


def allocate_claiming(state: dict, tgid: int) -> tuple[str, int]:
    """A worker whose ``ExportPool`` names another process's bare tgid; the pool key it got (its own import of
    the pool worked, or allocate would have failed)."""
    from tests.worker_ops import allocate

    attach = _attach(state)
    attach._bare_tgid = lambda: tgid
    keys: list[str] = []
    export = attach.export_pool

    def spy(*args):  # noqa: ANN002, ANN202
        got = export(*args)
        keys.append(got[2])
        return got
    attach.export_pool = spy
    allocate(state, "kv", 1, (4, 1024), "uint8")
    return keys[0], attach.device_id


def try_import(state: dict, key: str, device: int) -> int:
    from datadist_ascend import AscendError
    from datadist_ascend.acl import acl

    try:
        acl().ipc_import(device, key)
    except AscendError as exc:
        return exc.code
    return 0


def test_a_pool_key_names_the_kernels_pid_where_it_is_the_drivers(daemon_factory, worker_factory):
    """In the driver's PID namespace (here: no simulated one) the daemon allow-lists the pid the kernel reports for
    the worker's attach connection, whatever bare tgid the worker claims: a worker cannot point its engine's pool
    key at another process."""
    d = daemon_factory("npu")
    owner, other = worker_factory(d), worker_factory(d)
    owner.call("init", "PROMPT", 1, mem_pool=4 << 20)
    other.call("init", "DECODER", 2)
    key, device = owner.call("run", __name__, "allocate_claiming", other.call("run", __name__, "bare_tgid"))
    assert other.call("run", __name__, "try_import", key, device) == 207006   # ACL_ERROR_RT_NO_PERMISSION
