"""The host memory backend: shared-memory pools, zero-copy handles, importing worker memory."""

from __future__ import annotations

import mmap
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading

import numpy as np
import pytest

from datadistd.core.errors import DataDistError, StatusCode
from datadistd.core.types import Placement
from datadistd.memory import get_backend
from datadistd.memory.base import Allocation, MemoryHandle, ProcessRef, SharedFileRef
from datadistd.memory.host import DirectHandle, HostBackend, HostPool, MappedFileHandle

KiB = 1024
MiB = 1024 * KiB


@pytest.fixture
def shm_dir():
    d = tempfile.mkdtemp(prefix="datadist-test-", dir="/dev/shm")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def backend(shm_dir):
    b = HostBackend(shm_dir=shm_dir)
    yield b
    b.close()


def _code(exc_info) -> StatusCode:  # noqa: ANN001
    return exc_info.value.code


# ---- pools ------------------------------------------------------------------------------------

def test_registry_loads_host_backend(shm_dir):
    b = get_backend("host", shm_dir=shm_dir, file_mode=0o600)
    try:
        assert isinstance(b, HostBackend) and b.name == "host"
    finally:
        b.close()


@pytest.mark.parametrize("placement", [Placement.HOST, Placement.DEVICE])
def test_pool_file_name_size_and_mode(backend, shm_dir, placement):
    pool = backend.create_pool(placement, 1 * MiB, page_shift=12)
    name = os.path.basename(pool.path)
    prefix, pid, place, token = name.split("-")
    assert (prefix, int(pid), place) == ("datadist", os.getpid(), placement.name.lower())
    int(token, 16)
    st = os.stat(pool.path)
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_size == 1 * MiB
    assert pool.placement == placement and pool.capacity == 1 * MiB and pool.used == 0


def test_file_mode_ignores_umask(shm_dir):
    old = os.umask(0o077)
    try:
        b = HostBackend(shm_dir=shm_dir, file_mode=0o660)
        pool = b.create_pool(Placement.HOST, 64 * KiB, page_shift=12)
        assert stat.S_IMODE(os.stat(pool.path).st_mode) == 0o660
        b.close()
    finally:
        os.umask(old)


def test_allocate_free_accounting(backend):
    pool = backend.create_pool(Placement.DEVICE, 1 * MiB, page_shift=12)
    a = pool.allocate(5000)
    b = pool.allocate(4096)
    assert isinstance(a, Allocation) and isinstance(a.handle, MemoryHandle)
    assert a.path == pool.path and a.length == 5000 and a.handle.size == 5000
    assert a.file_offset % 4096 == 0 and b.file_offset % 4096 == 0
    assert pool.used == 8192 + 4096
    assert a.file_offset + 8192 <= b.file_offset or b.file_offset + 4096 <= a.file_offset
    pool.free(a)
    assert pool.used == 4096
    with pytest.raises(DataDistError) as e:
        pool.free(a)
    assert _code(e) == StatusCode.LLM_PARAM_INVALID
    with pytest.raises(DataDistError):
        a.handle.view()  # freed: the handle no longer gives memory
    pool.free(b)
    assert pool.used == 0


def test_out_of_memory(backend):
    pool = backend.create_pool(Placement.HOST, 64 * KiB, page_shift=12)
    with pytest.raises(DataDistError) as e:
        pool.allocate(64 * KiB + 1)
    assert _code(e) == StatusCode.LLM_OUT_OF_MEMORY
    allocs = [pool.allocate(4096) for _ in range(16)]
    with pytest.raises(DataDistError) as e:
        pool.allocate(1)
    assert _code(e) == StatusCode.LLM_OUT_OF_MEMORY
    pool.free(allocs[3])
    assert pool.allocate(4096).file_offset == allocs[3].file_offset
    with pytest.raises(DataDistError) as e:
        pool.allocate(0)
    assert _code(e) == StatusCode.LLM_PARAM_INVALID


def test_bad_capacity_and_page_shift(backend):
    with pytest.raises(DataDistError):
        backend.create_pool(Placement.HOST, 0)
    with pytest.raises(DataDistError):
        backend.create_pool(Placement.HOST, 1 * MiB, page_shift=40)
    assert os.listdir(backend.shm_dir) == []  # a failed pool leaves no file


def test_close_removes_file_and_is_idempotent(backend):
    pool = backend.create_pool(Placement.HOST, 256 * KiB, page_shift=12)
    a = pool.allocate(1000)
    view = a.handle.view()
    view[:3] = b"abc"
    del view
    pool.close()
    assert not os.path.exists(pool.path)
    pool.close()
    pool.free(a)  # after close: a no-op
    with pytest.raises(DataDistError):
        pool.allocate(10)


def test_close_with_live_views_still_unlinks(backend):
    pool = backend.create_pool(Placement.HOST, 64 * KiB, page_shift=12)
    a = pool.allocate(1000)
    arr = np.frombuffer(a.handle.view(), dtype=np.uint8)  # an export the pool cannot revoke
    pool.close()
    assert not os.path.exists(pool.path)
    arr[0] = 7  # still mapped until the array goes
    assert arr[0] == 7


def test_backend_close_closes_pools(shm_dir):
    b = HostBackend(shm_dir=shm_dir)
    pools = [b.create_pool(Placement.HOST, 64 * KiB, 12), b.create_pool(Placement.DEVICE, 64 * KiB, 12)]
    pools[0].close()
    b.close()
    b.close()
    assert all(p.closed for p in pools)
    assert os.listdir(shm_dir) == []


def test_zero_copy_views_alias_the_file(backend):
    pool = backend.create_pool(Placement.HOST, 256 * KiB, page_shift=12)
    a = pool.allocate(10_000)
    v = a.handle.view()
    assert isinstance(v, memoryview) and v.format == "B" and not v.readonly and len(v) == 10_000
    v[:] = bytes(range(256)) * 39 + bytes(16)
    with open(a.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        assert m[a.file_offset:a.file_offset + 10_000] == bytes(v)
        m[a.file_offset + 5] = 0xEE  # the other way round: a worker's write shows in the daemon's view
    assert v[5] == 0xEE
    # handle I/O helpers
    out = bytearray(4)
    a.handle.read_into(2, memoryview(out))
    assert bytes(out) == bytes(v[2:6])
    a.handle.write_from(9_996, b"wxyz")
    assert bytes(v[9_996:]) == b"wxyz"
    with pytest.raises(DataDistError) as e:
        a.handle.write_from(9_998, b"wxyz")
    assert _code(e) == StatusCode.LLM_PARAM_INVALID


def test_concurrent_allocations_are_disjoint(backend):
    pool = backend.create_pool(Placement.HOST, 4 * MiB, page_shift=12)
    got: list[Allocation] = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(50):
            a = pool.allocate(4096)
            with lock:
                got.append(a)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    offsets = sorted(a.file_offset for a in got)
    assert len(set(offsets)) == 400 and pool.used == 400 * 4096


# ---- cleanup of dead daemons' files -----------------------------------------------------------

def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_cleanup_stale(shm_dir):
    dead = _dead_pid()
    names = [f"datadist-{dead}-host-aa", f"datadist-{dead}-device-bb", f"datadist-{os.getpid()}-host-cc",
             "datadist-1-host-dd", "other-123-host-ee", f"datadist-{dead}"]
    for n in names:
        open(os.path.join(shm_dir, n), "wb").close()
    removed = HostBackend.cleanup_stale(shm_dir)
    assert sorted(os.path.basename(p) for p in removed) == sorted(names[:2])
    assert sorted(os.listdir(shm_dir)) == sorted(names[2:])
    assert HostBackend.cleanup_stale(os.path.join(shm_dir, "missing")) == []


def test_cleanup_stale_other_prefix(shm_dir):
    dead = _dead_pid()
    open(os.path.join(shm_dir, f"mine-{dead}-host-aa"), "wb").close()
    open(os.path.join(shm_dir, f"datadist-{dead}-host-aa"), "wb").close()
    assert [os.path.basename(p) for p in HostBackend.cleanup_stale(shm_dir, prefix="mine")] == [f"mine-{dead}-host-aa"]


# ---- importing worker memory ------------------------------------------------------------------

def test_import_shared_file_unaligned(backend, shm_dir):
    path = os.path.join(shm_dir, "worker-file")
    data = np.random.default_rng(1).integers(0, 256, 64 * KiB, dtype=np.uint8)
    with open(path, "wb") as f:
        f.write(data.tobytes())
    h = backend.import_memory(SharedFileRef(path, 5000, 20_000))
    try:
        assert isinstance(h, MappedFileHandle) and h.size == 20_000
        v = h.view()
        assert bytes(v) == data[5000:25_000].tobytes()
        v[0] = (int(data[5000]) + 1) % 256
        with open(path, "rb") as f:
            f.seek(5000)
            assert f.read(1)[0] == v[0]
    finally:
        h.close()
        h.close()


def test_import_devshm_file_and_memfd(backend):
    fd = os.memfd_create("datadist-test")
    try:
        os.ftruncate(fd, 8192)
        os.pwrite(fd, b"memfd!", 4096)
        h = backend.import_memory(SharedFileRef(f"/proc/{os.getpid()}/fd/{fd}", 4096, 4096))
        assert bytes(h.view()[:6]) == b"memfd!"
        h.write_from(0, b"M")
        assert os.pread(fd, 1, 4096) == b"M"
        h.close()
    finally:
        os.close(fd)
    with tempfile.NamedTemporaryFile(dir="/dev/shm", prefix="datadist-test-") as f:
        f.write(b"x" * 4096)
        f.flush()
        h = backend.import_memory(SharedFileRef(f.name, 0, 4096))
        assert bytes(h.view()[:2]) == b"xx"
        h.close()


@pytest.mark.parametrize("ref, words", [
    (SharedFileRef("/etc/hostname", 0, 1), "not under"),
    (SharedFileRef("relative", 0, 1), "not under"),
    (SharedFileRef("/dev/shm/../../etc/hostname", 0, 1), "not under"),
    (SharedFileRef("/dev/shm/datadist-test-missing-file", 0, 1), "cannot open"),
    (SharedFileRef("/dev/shm/x", -1, 1), "file_offset"),
    (SharedFileRef("/dev/shm/x", 0, 0), "length"),
])
def test_import_shared_file_refused(backend, ref, words):
    with pytest.raises(DataDistError) as e:
        backend.import_memory(ref)
    assert _code(e) == StatusCode.LLM_PARAM_INVALID and words in e.value.message


def test_import_proc_link_to_regular_file_refused(backend, tmp_path):
    path = tmp_path / "plain"
    path.write_bytes(b"x" * 4096)
    with open(path, "r+b") as f:
        with pytest.raises(DataDistError) as e:
            backend.import_memory(SharedFileRef(f"/proc/self/fd/{f.fileno()}", 0, 10))
    assert "neither a memfd" in e.value.message


def test_import_shared_file_range_too_large(backend, shm_dir):
    path = os.path.join(shm_dir, "small")
    with open(path, "wb") as f:
        f.write(b"x" * 100)
    with pytest.raises(DataDistError) as e:
        backend.import_memory(SharedFileRef(path, 50, 51))
    assert _code(e) == StatusCode.LLM_PARAM_INVALID and "does not fit" in e.value.message


def test_import_process_memory_in_process(backend):
    arr = np.arange(100_000, dtype=np.uint8)
    h = backend.import_memory(ProcessRef(os.getpid(), arr.ctypes.data, arr.nbytes))
    assert isinstance(h, DirectHandle)
    v = h.view()
    assert bytes(v[:5]) == bytes(range(5))
    v[10] = 200
    assert arr[10] == 200  # zero copy: the same bytes
    h.write_from(20, b"\x01\x02")
    assert list(arr[20:22]) == [1, 2]
    h.close()


def test_import_process_memory_in_process_bad_ranges(backend):
    m = mmap.mmap(-1, 8192, prot=mmap.PROT_READ)
    ro = np.frombuffer(m, dtype=np.uint8)
    ro_addr = ro.ctypes.data
    with pytest.raises(DataDistError) as e:
        backend.import_memory(ProcessRef(os.getpid(), ro_addr, 100))
    assert _code(e) == StatusCode.LLM_PARAM_INVALID and "not writable" in e.value.message
    del ro
    m.close()
    with pytest.raises(DataDistError) as e:  # unmapped now
        backend.import_memory(ProcessRef(os.getpid(), ro_addr, 100))
    assert _code(e) == StatusCode.LLM_PARAM_INVALID
    for ref in (ProcessRef(0, 4096, 1), ProcessRef(os.getpid(), 0, 1), ProcessRef(os.getpid(), 4096, 0)):
        with pytest.raises(DataDistError):
            backend.import_memory(ref)


def test_import_process_memory_dead_pid(backend):
    with pytest.raises(DataDistError) as e:
        backend.import_memory(ProcessRef(_dead_pid(), 0x10000, 16))
    assert _code(e) == StatusCode.LLM_PARAM_INVALID and "cross-memory attach" in e.value.message


def test_pool_is_a_hostpool(backend):
    assert isinstance(backend.create_pool(Placement.HOST, 64 * KiB, 12), HostPool)
