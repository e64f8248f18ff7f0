"""The Ascend bindings and the acl backend against the SIMULATED runtime (tests/sim), in child processes
(a process loads CANN's libraries once): the status table, and what a hostile neighbour tries."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from datadist.status import LLMStatusCode as S
from datadist_ascend.errors import ACL_STATUS, HCCL_STATUS
from tests.harness import ROOT
from tests.sim import sim_env


def run(code: str, env: dict[str, str], expect_rc: int = 0) -> str:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env={**os.environ, **env}, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == expect_rc, proc.stdout + proc.stderr
    return proc.stdout.strip()


def test_status_table_follows_cann() -> None:
    # ConvertCommErrorToStatus: PARA, TIMEOUT, NOT_SUPPORT; ConvertAclError2Ge: stream sync timeout
    assert HCCL_STATUS == {1: S.LLM_PARAM_INVALID, 9: S.LLM_TIMEOUT, 5: S.LLM_FEATURE_NOT_ENABLED}
    assert ACL_STATUS[507046] == S.LLM_TIMEOUT and ACL_STATUS[207001] == S.LLM_DEVICE_OUT_OF_MEMORY


def test_missing_cann_is_feature_not_enabled_naming_the_library(tmp_path) -> None:
    out = run("""
        from datadistd.memory.acl import AclBackend
        from datadistd.core.errors import DataDistError
        try:
            AclBackend()
        except DataDistError as exc:
            print(exc.code.name, exc.message)
        """, {"ASCEND_HOME_PATH": str(tmp_path), "LD_LIBRARY_PATH": ""})
    assert out.startswith("LLM_FEATURE_NOT_ENABLED") and f"{tmp_path}/lib64/libascendcl.so" in out


def test_pool_key_imports_only_in_the_white_listed_process(sim_root, tmp_path) -> None:
    """A DEVICE pool's key names one pid (the worker the kernel vouched for): any other process is refused."""
    out = run("""
        import os
        from datadistd.memory.acl import AclBackend
        from datadistd.core.types import Placement
        from datadist_ascend import AscendError
        from datadist_ascend.acl import acl
        pool = AclBackend().create_pool(Placement.DEVICE, 1 << 20)
        key = pool.export_key(os.getpid() + 1)           # another process's key
        try:
            acl().ipc_import(0, key)
        except AscendError as exc:
            print(exc.status.name, exc.code)
        print(acl().ipc_import(0, pool.export_key(os.getpid())) > 0)
        pool.close()
        """, sim_env(sim_root, str(tmp_path)))
    assert out.splitlines() == ["LLM_PARAM_INVALID 207006", "True"]


def test_device_memory_is_not_host_memory(sim_root, tmp_path) -> None:
    """The simulation's device pointers fault on a host load, as on an NPU: code that worked here never
    dereferenced one (copies go through aclrtMemcpy)."""
    run("""
        import ctypes
        from datadist_ascend.acl import acl
        ctypes.string_at(acl().malloc(0, 4096), 1)
        """, sim_env(sim_root, str(tmp_path)), expect_rc=-11)


def test_device_handle_copies_and_bounds(sim_root, tmp_path) -> None:
    out = run("""
        from datadistd.memory.acl import AclBackend
        from datadistd.core.errors import DataDistError
        from datadistd.core.types import Placement
        pool = AclBackend().create_pool(Placement.DEVICE, 1 << 20, 16)
        a, b = pool.allocate(4096), pool.allocate(4096)
        a.handle.write_from(10, b"npu bytes")
        a.handle.copy_moves([(b.handle.address, a.handle.address, 4096)])
        out = bytearray(9)
        b.handle.read_into(10, memoryview(out))
        print(out.decode(), a.handle.view())
        try:
            a.handle.read_into(4090, memoryview(bytearray(9)))
        except DataDistError as exc:
            print(exc.code.name)
        try:
            pool.allocate(2 << 20)
        except DataDistError as exc:
            print(exc.code.name)
        pool.close()
        """, sim_env(sim_root, str(tmp_path)))
    assert out.splitlines() == ["npu bytes None", "LLM_PARAM_INVALID", "LLM_OUT_OF_MEMORY"]


def test_hccl_refuses_unregistered_memory_and_puts_before_prepare(sim_root, tmp_path) -> None:
    out = run("""
        from datadist_ascend import AscendError
        from datadist_ascend.acl import MEMCPY_DEVICE_TO_HOST, acl
        from datadist_ascend.hccl import MEM_DEVICE, CommConfig, hccl
        from datadistd.transport.hccl.agent import cluster_table
        a, h = acl(), hccl()
        table, order = cluster_table([{"name": n, "server_id": "10.0.0.1", "device_id": "0", "device_ip": ip}
                                      for n, ip in (("b", "192.168.100.102"), ("a", "192.168.100.101"))])
        print(order)
        try:   # a communicator is made in a context: the thread's device (CANN sets it before the call)
            h.init_comm(table, 0, CommConfig.make("t"))
        except AscendError as exc:
            print("no device", exc.func, exc.status.name)
        p, s = a.malloc(0, 4096), a.create_stream(0)
        comm = h.init_comm(table, 0, CommConfig.make("t"))
        other = a.malloc(1, 4096)            # memory of NPU 1; the thread is on NPU 1 now
        a.use(0)
        for what, call in (("before prepare", lambda: h.batch(True, comm, 1, [p], [p], [16], s)),
                           ("host memory", lambda: h.register(MEM_DEVICE, id(order), 16)),
                           ("other NPU", lambda: h.bind(comm, h.register(MEM_DEVICE, other, 4096))),
                           ("other NPU copy", lambda: a.memcpy(0, id(order), 16, other, 16, MEMCPY_DEVICE_TO_HOST))):
            try:
                call()
            except AscendError as exc:
                print(what, exc.func, exc.status.name)
        """, sim_env(sim_root, str(tmp_path)))
    assert out.splitlines() == ["['a', 'b']", "no device HcclCommInitClusterInfoMemConfig LLM_PARAM_INVALID",
                                "before prepare HcclBatchPut LLM_FAILED",
                                "host memory HcclRegisterGlobalMem LLM_PARAM_INVALID",
                                "other NPU HcclCommBindMem LLM_PARAM_INVALID",
                                "other NPU copy aclrtMemcpy LLM_PARAM_INVALID"]


def test_device_memory_is_taken_only_with_the_presenters_proof_and_its_true_length(sim_root, tmp_path) -> None:
    """An IPC key is a name: the daemon takes the memory behind it only when it holds the presenting
    connection's proof of possession (the presenter could write it: the memory is its own), and only for
    as many bytes as the key really has."""
    out = run("""
        import ctypes, os
        from datadist_ascend.acl import MEMCPY_HOST_TO_DEVICE, acl
        from datadist_ascend.proof import possession_proof
        from datadistd.core.errors import DataDistError
        from datadistd.memory.acl import AclBackend
        from datadistd.memory.base import DeviceRef
        a, backend = acl(), AclBackend()
        mem = a.malloc(0, 4096)
        key = a.ipc_export(0, mem, 4096)
        a.ipc_allow(0, key, [os.getpid()])
        owner, presenter = b"o" * 32, b"p" * 32

        def holds(data):
            buf = ctypes.create_string_buffer(data, len(data))
            a.memcpy(0, mem, 4096, ctypes.addressof(buf), len(data), MEMCPY_HOST_TO_DEVICE)

        def present(length, proof):
            try:
                h = backend.import_memory(DeviceRef(key, 0, length, proof))
            except DataDistError as exc:
                return exc.code.name
            h.close()
            return "taken"

        holds(possession_proof(owner, key))       # its owner is handing it over: the owner's proof is there
        print(present(4096, possession_proof(presenter, key)))
        print(present(4096, possession_proof(owner, key)))
        holds(b"\\0" * 16)                        # nothing there: no proof at all
        print(present(4096, possession_proof(presenter, key)))
        holds(possession_proof(presenter, key))
        print(present(4097, possession_proof(presenter, key)), present(8, possession_proof(presenter, key)[:8]))
        print(present(4096, possession_proof(presenter, key)))
        """, sim_env(sim_root, str(tmp_path)))
    assert out.splitlines() == ["LLM_PARAM_INVALID", "taken", "LLM_PARAM_INVALID",
                                "LLM_PARAM_INVALID LLM_PARAM_INVALID", "taken"]


def test_device_copies_stay_on_the_device(sim_root, tmp_path) -> None:
    """copy_blocks / swap_blocks / copy_cache and same-host transfers between NPU memories of one device go device
    to device (aclrtMemcpyAsync batches when 64-byte aligned, aclrtMemcpy D2D otherwise), never through the host;
    another device's memory is staged through the host (no peer access assumed). The runtime is a recording fake
    wrapped round the real (simulated) one."""
    out = run("""
        import numpy as np
        from datadist_ascend.acl import MEMCPY_DEVICE_TO_HOST, MEMCPY_HOST_TO_DEVICE, acl
        from datadistd.memory.acl import DeviceHandle
        from datadistd.memory.base import Segment
        from datadistd.memory.copy import copy_segments

        class Recording:
            def __init__(self, real):
                self.real, self.calls = real, []
            def use(self, device):
                self.real.use(device)
            def memcpy(self, device, dst, dst_max, src, count, kind):
                self.calls.append(("memcpy", kind))
                self.real.memcpy(device, dst, dst_max, src, count, kind)
            def memcpy_batch(self, device, rows, kind, timeout_ms):
                self.calls.append(("batch", kind, len(rows)))
                self.real.memcpy_batch(device, rows, kind, timeout_ms)

        real = acl()
        rec = Recording(real)
        size = 1 << 16
        src = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
        def handle(device):
            h = DeviceHandle(rec, device, real.malloc(device, size), size)
            real.memcpy(device, h.address, size, src.ctypes.data, size, MEMCPY_HOST_TO_DEVICE)
            return h
        def load(h):
            out = np.empty(size, np.uint8)
            real.memcpy(h.device, out.ctypes.data, size, h.address, size, MEMCPY_DEVICE_TO_HOST)
            return out
        a, b, c = handle(0), handle(0), handle(1)
        for name, dst, srcs in (
                ("aligned", [Segment(b, 0, 1024), Segment(b, 4096, 1024)], [Segment(a, 8192, 2048)]),
                ("unaligned", [Segment(b, 1, 100), Segment(b, 300, 100)], [Segment(a, 7, 200)]),
                ("other device", [Segment(c, 0, 512)], [Segment(a, 512, 512)])):
            rec.calls.clear()
            copy_segments(dst, srcs)
            got = np.concatenate([load(s.handle)[s.offset:s.offset + s.length] for s in dst])
            want = np.concatenate([src[s.offset:s.offset + s.length] for s in srcs])
            print(name, sorted(set(rec.calls)), bool((got == want).all()))
        """, sim_env(sim_root, str(tmp_path)))
    assert out.splitlines() == ["aligned [('batch', 3, 2)] True", "unaligned [('memcpy', 3)] True",
                                "other device [('memcpy', 1), ('memcpy', 2)] True"]


def test_libraries_come_from_ascend_home_before_the_system_search(sim_root, tmp_path) -> None:
    """``find_library("libhcomm.so", "libhccl.so")`` with a tree that has only ``libhccl.so`` (the simulation)
    takes that one, not another install's ``libhcomm.so`` on ``LD_LIBRARY_PATH``: no mixing of two runtimes."""
    import shutil

    home, other = tmp_path / "home", tmp_path / "other"
    (home / "lib64").mkdir(parents=True)
    other.mkdir()
    shutil.copy(sim_root / "lib64" / "libascendcl.so", home / "lib64" / "libsecond.so")
    shutil.copy(sim_root / "lib64" / "libascendcl.so", other / "libfirst.so")
    out = run("""
        from datadist_ascend.loader import find_library
        print(find_library("libfirst.so", "libsecond.so")._name)
        """, {"ASCEND_HOME_PATH": str(home), "LD_LIBRARY_PATH": str(other)})
    assert out == str(home / "lib64" / "libsecond.so")


def test_a_thread_sets_its_device_once_and_a_workers_thread_keeps_its_own(sim_root, tmp_path) -> None:
    """``aclrtSetDevice`` takes a reference on the device's primary context at every call: a thread sets its device
    once, not per operation (issue 45, finding 8). A worker's call on the engine's NPU leaves the caller's thread on
    the device it had (a worker may drive several NPUs), as the client's hand-over does."""
    env = sim_env(sim_root, str(tmp_path))
    out = run("""
        import os
        from datadist_ascend.acl import MEMCPY_HOST_TO_DEVICE, acl
        a = acl()
        mem = a.malloc(0, 4096)
        for _ in range(10):
            a.memcpy(0, mem, 16, id(a), 16, MEMCPY_HOST_TO_DEVICE)
            key = a.ipc_export(0, mem, 4096)
            a.ipc_allow(0, key, [a.bare_tgid()])
            a.ipc_close(0, key)
        ledger = open(os.path.join(os.environ["ASCEND_SIM_DIR"], "ledger")).read().split()
        print(ledger.count("aclrtSetDevice"))
        a.set_device(1)
        with a.on_device(0):
            key = a.ipc_export(0, mem, 4096)
            a.ipc_allow(0, key, [a.bare_tgid()])
        print(a.current())
        """, env)
    assert out.split() == ["1", "1"]
