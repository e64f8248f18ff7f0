"""Foundation, end to end: a real daemon process, real worker processes, real shared memory."""

from __future__ import annotations

import glob
import os
import signal
import time

import grpc
import numpy as np
import pytest

from datadist.status import LLMStatusCode
from datadist.v1 import datadist_pb2, datadist_pb2_grpc
from tests.harness import ACL_PLANE, WorkerError, over_planes, pool_memfds

pytestmark = pytest.mark.integration

MIB = 1 << 20


def status(daemon) -> datadist_pb2.DaemonStatus:  # noqa: ANN001
    with grpc.insecure_channel(daemon.admin_target) as ch:
        return datadist_pb2_grpc.DataDistStub(ch).GetStatus(datadist_pb2.StatusRequest(), timeout=5)


def pool_used(daemon) -> int:  # noqa: ANN001
    return sum(p.used for e in status(daemon).engines for p in e.pools)


@over_planes("tcp", ACL_PLANE)   # acl: copies on the NPU and out of it by aclrtMemcpy (D2D, D2H)
def test_allocate_write_copy_swap_read_back(daemon_factory, worker_factory) -> None:
    d = daemon_factory()
    w = worker_factory(d)
    w.call("init", "PROMPT", 11, mem_pool=16 * MIB, host_mem_pool=16 * MIB)
    # cache ids start at 1, shared by allocate and register (CANN clients hard-code them)
    assert w.call("allocate", "dev", 4, (8, 16, 32), blocks=True, model_id=0) == 1
    assert w.call("allocate", "host", 4, (8, 16, 32), blocks=True, placement="HOST") == 2
    w.call("fill", "dev", 3)
    before = w.call("rows", "dev")
    # copy_blocks runs in the daemon: block 1 -> 5 and 6, block 2 -> 7
    w.call("copy_blocks", "dev", {1: [5, 6], 2: [7]})
    after = w.call("rows", "dev")
    np.testing.assert_array_equal(after[:, 5], before[:, 1])
    np.testing.assert_array_equal(after[:, 6], before[:, 1])
    np.testing.assert_array_equal(after[:, 7], before[:, 2])
    np.testing.assert_array_equal(after[:, :5], before[:, :5])
    # swap_blocks DEVICE -> HOST, then read the host cache through the worker's own mapping
    w.call("swap_blocks", "dev", "host", {0: 3, 7: 0})
    host = w.call("rows", "host")
    np.testing.assert_array_equal(host[:, 3], after[:, 0])
    np.testing.assert_array_equal(host[:, 0], after[:, 7])
    assert not host[:, 1].any()


def test_register_worker_numpy_memory_and_copy_into_it(daemon_factory, worker_factory) -> None:
    d = daemon_factory()
    w = worker_factory(d)
    w.call("init", "DECODER", 12, mem_pool=8 * MIB)
    # anonymous numpy memory of the worker
    w.call("register_blocks", "mine", 2, 10, (4, 64), model_id=0, placement="HOST")
    w.call("allocate", "pool", 2, (10, 4, 64), blocks=True, placement="DEVICE")
    w.call("fill", "pool", 9)
    src = w.call("rows", "pool")
    # registered memory is HOST placement: swap DEVICE(pool) -> HOST(registered)
    w.call("swap_blocks", "pool", "mine", {4: 1, 9: 2})
    mine = w.call("rows", "mine")
    np.testing.assert_array_equal(mine[:, 1], src[:, 4])
    np.testing.assert_array_equal(mine[:, 2], src[:, 9])
    assert not mine[:, 0].any()
    # copy_blocks inside the registered cache writes the worker's own numpy arrays via cross-memory attach
    w.call("copy_blocks", "mine", {1: [7]})
    np.testing.assert_array_equal(w.call("rows", "mine")[:, 7], src[:, 4])


@over_planes("tcp", ACL_PLANE)   # acl: the DEVICE pool is one aclrtMalloc carved like a host pool
def test_pool_errors_have_the_spec_codes(daemon_factory, worker_factory) -> None:
    d = daemon_factory()
    w = worker_factory(d)
    w.call("init", "PROMPT", 13, mem_pool=1 * MIB)
    with pytest.raises(WorkerError) as info:  # beyond capacity
        w.call("allocate", "big", 2, (1024, 1024), dtype="uint8", blocks=True)
    assert info.value.status_code == LLMStatusCode.LLM_OUT_OF_MEMORY
    with pytest.raises(WorkerError) as info:  # no HOST pool configured
        w.call("allocate", "h", 1, (4, 4), placement="HOST")
    assert info.value.status_code == LLMStatusCode.LLM_FEATURE_NOT_ENABLED
    w.call("allocate", "a", 1, (4, 16), keys=[(100, 0)])
    with pytest.raises(WorkerError) as info:  # key already bound
        w.call("allocate", "b", 1, (4, 16), keys=[(100, 0)])
    assert info.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
    with pytest.raises(WorkerError) as info:  # duplicate keys in one call
        w.call("allocate", "c", 1, (4, 16), keys=[(101, 0), (101, 0)])
    assert info.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
    w.call("allocate", "kb", 1, (4, 16), blocks=True, model_id=3)
    with pytest.raises(WorkerError) as info:  # allocate_blocks_cache with a bound BlocksCacheKey
        w.call("allocate", "kb2", 1, (4, 16), blocks=True, model_id=3)
    assert info.value.status_code == LLMStatusCode.LLM_PARAM_INVALID


@over_planes(ACL_PLANE)
def test_a_device_pool_the_npu_cannot_hold_is_device_out_of_memory(daemon_factory, worker_factory) -> None:
    """acl: an engine's DEVICE pool is one aclrtMalloc; when the NPU's memory cannot hold it, init fails with
    LLM_DEVICE_OUT_OF_MEMORY (ACL_ERROR_RT_MEMORY_ALLOCATION) and nothing is held; a finalized engine's pool
    goes back to the NPU (aclrtFree)."""
    if os.environ.get("DATADIST_ASCEND_REAL") == "1":
        pytest.skip("sizes its pools against the simulated NPU's memory (ASCEND_SIM_HBM_MB)")
    d = daemon_factory(env={"ASCEND_SIM_HBM_MB": "16"})
    first, second = worker_factory(d), worker_factory(d)
    with pytest.raises(WorkerError) as info:
        first.call("init", "PROMPT", 15, mem_pool=32 * MIB)
    assert info.value.status_code == LLMStatusCode.LLM_DEVICE_OUT_OF_MEMORY
    assert status(d).engines == []
    first.call("init", "PROMPT", 15, mem_pool=12 * MIB)
    with pytest.raises(WorkerError) as info:   # 12 + 8 MiB: more than the NPU has
        second.call("init", "DECODER", 16, mem_pool=8 * MIB)
    assert info.value.status_code == LLMStatusCode.LLM_DEVICE_OUT_OF_MEMORY
    first.call("finalize")
    second.call("init", "DECODER", 16, mem_pool=8 * MIB)
    second.call("allocate", "x", 2, (8, 64), dtype="uint8", blocks=True)
    second.call("fill", "x", 3)
    second.call("copy_blocks", "x", {1: [2]})
    rows = second.call("rows", "x")
    np.testing.assert_array_equal(rows[:, 2], rows[:, 1])


def test_refcount_frees_only_after_deallocate_and_key_removal(daemon_factory, worker_factory) -> None:
    d = daemon_factory()
    w = worker_factory(d)
    w.call("init", "PROMPT", 14, mem_pool=4 * MIB)
    base = pool_used(d)
    w.call("allocate", "a", 2, (2, 65536), dtype="uint8", keys=[(7, 0)])
    held = pool_used(d)
    assert held > base
    w.call("deallocate", "a")
    assert pool_used(d) == held  # the key still holds the memory
    w.call("remove_cache_key", 7)
    assert pool_used(d) == base


def test_worker_death_returns_its_memory(daemon_factory, worker_factory) -> None:
    d = daemon_factory()
    survivor = worker_factory(d)
    survivor.call("init", "DECODER", 21, mem_pool=4 * MIB)
    survivor.call("allocate", "keep", 1, (4, 4096), dtype="uint8", blocks=True)
    doomed = worker_factory(d)
    doomed.call("init", "PROMPT", 22, mem_pool=8 * MIB)
    doomed.call("allocate", "x", 2, (16, 65536), dtype="uint8", blocks=True)
    assert len(status(d).engines) == 2
    doomed.kill()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(status(d).engines) != 1:
        time.sleep(0.05)
    engines = status(d).engines
    assert [e.cluster_id for e in engines] == [21]
    survivor.call("fill", "keep", 1)  # the other worker is unaffected
    assert survivor.call("rows", "keep").any()


def test_sigterm_drains_frees_and_removes_segments(daemon_factory, worker_factory) -> None:
    # a connected worker's lease (its attach connection) ends at once: it must not hold the stop for
    # the whole drain time (60 s here; the harness kills after 30 s, which fails the exit code)
    d = daemon_factory(env={"DATADISTD_DAEMON_DRAIN_SECONDS": "60"})
    w = worker_factory(d)
    w.call("init", "PROMPT", 31, mem_pool=4 * MIB)
    w.call("allocate", "x", 1, (4, 4096), dtype="uint8", blocks=True)
    assert pool_memfds(d.proc.pid)          # the pool: a private memfd, no file in any directory
    assert not glob.glob(os.path.join(d.shm_dir, "datadist-*"))
    w.call("capture_logs")
    assert d.stop(signal.SIGTERM, timeout=30) == 0
    assert "is gone (it stopped or died): this engine and its caches are released" in w.call("logs", "is gone")
    assert not os.path.exists(d.socket)
    assert not os.path.exists(d.socket + ".attach") and not os.path.exists(d.socket + ".admin")


def test_socket_is_private(daemon_factory) -> None:
    d = daemon_factory()
    mode = os.stat(d.socket).st_mode & 0o777
    assert mode & 0o007 == 0, oct(mode)


def test_calls_before_init_raise_runtime_error() -> None:
    import llm_datadist as ld

    dd = ld.LLMDataDist(ld.LLMRole.DECODER, 5)
    with pytest.raises(RuntimeError, match="not initialized"):
        dd.cache_manager  # noqa: B018
    with pytest.raises(RuntimeError, match="not initialized"):
        dd.link_clusters([], 1000)


def test_embedded_mode_in_process(monkeypatch) -> None:
    """No daemon configured: init starts the daemon app inside this process, same client path."""
    import llm_datadist as ld
    from llm_datadist import views

    monkeypatch.setenv("DATADISTD_MEMORY_SHM_DIR", "/dev/shm")
    cfg = ld.LLMConfig()
    cfg.device_id = 0
    cfg.enable_cache_manager = True
    cfg.mem_pool_cfg = '{"memory_size": 4194304}'
    dd = ld.LLMDataDist(ld.LLMRole.PROMPT, 77)
    dd.init(cfg.generate_options())
    try:
        dd.init(cfg.generate_options())  # second init is a no-op
        other = ld.LLMDataDist(ld.LLMRole.DECODER, 78)
        with pytest.raises(ld.LLMException) as info:
            other.init(cfg.generate_options())
        assert info.value.status_code == ld.LLMStatusCode.LLM_FAILED
        cache = dd.cache_manager.allocate_blocks_cache(ld.CacheDesc(2, [4, 8], ld.DataType.DT_FLOAT16))
        assert cache.cache_id == 1
        k, v = views.numpy_views(cache)
        k[:] = 1.5
        dd.cache_manager.copy_blocks(cache, {0: [3]})
        assert (k[3] == 1.5).all()
        dd.cache_manager.deallocate_blocks_cache(cache)
        assert cache.tensor_addrs == []
    finally:
        dd.finalize()
    assert ld.LLMDataDist.llm_engine_instance is None


@pytest.mark.parametrize("kind", ["shm", "memfd"])
def test_register_shareable_mapping_is_mapped_by_the_daemon(daemon_factory, worker_factory, kind: str) -> None:
    d = daemon_factory()
    w = worker_factory(d)
    w.call("init", "PROMPT", 41, host_mem_pool=4 * MIB)
    assert w.call("register_shared", "shared", kind, 2, 8, 512) == "shared_file"
    w.call("allocate", "pool", 2, (8, 512), dtype="uint8", blocks=True, placement="HOST")
    w.call("fill", "shared", 11)
    src = w.call("rows", "shared")
    # DEVICE (registered, mapped by the daemon) -> HOST pool, then back into other blocks
    w.call("swap_blocks", "shared", "pool", {1: 0, 6: 5})
    np.testing.assert_array_equal(w.call("rows", "pool")[:, [0, 5]], src[:, [1, 6]])
    w.call("copy_blocks", "shared", {1: [3]})
    np.testing.assert_array_equal(w.call("rows", "shared")[:, 3], src[:, 1])
