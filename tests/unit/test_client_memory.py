"""The worker-side memory helper: describe(), Mapper, numpy_view, address_of, allow_ptrace."""

from __future__ import annotations

import ctypes
import mmap
import os
import shutil
import tempfile

import numpy as np
import pytest

from llm_datadist import _memory


@pytest.fixture
def shm_dir():
    d = tempfile.mkdtemp(prefix="datadist-test-", dir="/dev/shm")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _read_file(path: str, offset: int, length: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)


def test_describe_devshm_mapping(shm_dir):
    path = os.path.join(shm_dir, "kv")
    with open(path, "w+b") as f:
        f.truncate(3 * mmap.PAGESIZE)
        m = mmap.mmap(f.fileno(), 2 * mmap.PAGESIZE, offset=mmap.PAGESIZE)
    try:
        arr = np.frombuffer(m, dtype=np.uint8)
        arr[100:110] = np.arange(10)
        info = _memory.describe(_memory.address_of(arr) + 100, 10)
        assert info == {"kind": "shared_file", "path": path, "file_offset": mmap.PAGESIZE + 100, "length": 10}
        assert _read_file(info["path"], info["file_offset"], 10) == bytes(range(10))
        del arr
    finally:
        m.close()


def test_describe_deleted_devshm_file(shm_dir):
    path = os.path.join(shm_dir, "gone")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, 8192)
        m = mmap.mmap(fd, 8192)
        os.unlink(path)
        m[5000:5004] = b"live"
        arr = np.frombuffer(m, dtype=np.uint8)
        info = _memory.describe(_memory.address_of(arr) + 5000, 4)
        assert info["kind"] == "shared_file" and info["path"] == f"/proc/{os.getpid()}/fd/{fd}"
        assert _read_file(info["path"], info["file_offset"], 4) == b"live"
        del arr
        m.close()
    finally:
        os.close(fd)


def test_describe_memfd():
    fd = os.memfd_create("kv-cache")
    try:
        os.ftruncate(fd, 4 * mmap.PAGESIZE)
        m = mmap.mmap(fd, 4 * mmap.PAGESIZE)
        arr = np.frombuffer(m, dtype=np.uint8)
        arr[mmap.PAGESIZE:mmap.PAGESIZE + 5] = np.frombuffer(b"memfd", dtype=np.uint8)
        info = _memory.describe(_memory.address_of(arr) + mmap.PAGESIZE, 2 * mmap.PAGESIZE)
        assert info["kind"] == "shared_file" and info["length"] == 2 * mmap.PAGESIZE
        assert info["file_offset"] == mmap.PAGESIZE
        assert info["path"].startswith(f"/proc/{os.getpid()}/")
        assert _read_file(info["path"], info["file_offset"], 5) == b"memfd"
        del arr
        m.close()
    finally:
        os.close(fd)


def _libc():  # noqa: ANN202
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


PROT_RW, MAP_SHARED, MAP_PRIVATE_ANON, MAP_FIXED = 3, 0x01, 0x22, 0x10


def test_describe_memfd_without_open_fd_uses_map_files():
    # Python's mmap keeps a dup of the descriptor, so map with libc to hold no descriptor at all
    libc = _libc()
    size = 2 * mmap.PAGESIZE
    fd = os.memfd_create("kv-cache-closed")
    os.ftruncate(fd, size)
    os.pwrite(fd, b"abc", 10)
    base = libc.mmap(None, size, PROT_RW, MAP_SHARED, fd, 0)
    os.close(fd)
    try:
        info = _memory.describe(base + 10, 3)
        assert info["kind"] == "shared_file" and info["file_offset"] == 10
        assert info["path"] == f"/proc/{os.getpid()}/map_files/{base:x}-{base + size:x}"
        try:
            assert _read_file(info["path"], info["file_offset"], 3) == b"abc"
        except PermissionError:
            pytest.skip("opening map_files needs CAP_SYS_ADMIN")
    finally:
        libc.munmap(base, size)


def test_describe_numpy_array_is_process_memory():
    arr = np.zeros(1 << 20, dtype=np.float32)
    addr = _memory.address_of(arr)
    assert _memory.describe(addr, arr.nbytes) == {"kind": "process", "pid": os.getpid(), "address": addr,
                                                 "length": arr.nbytes}
    small = bytearray(64)  # heap
    assert _memory.describe(_memory.address_of(small), 64)["kind"] == "process"


def test_describe_private_file_mapping_is_process_memory(shm_dir):
    path = os.path.join(shm_dir, "private")
    with open(path, "w+b") as f:
        f.truncate(mmap.PAGESIZE)
        m = mmap.mmap(f.fileno(), mmap.PAGESIZE, flags=mmap.MAP_PRIVATE)
    try:
        arr = np.frombuffer(m, dtype=np.uint8)
        assert _memory.describe(_memory.address_of(arr), 10)["kind"] == "process"
        del arr
    finally:
        m.close()


def test_describe_unmapped_and_mixed_ranges(shm_dir):
    m = mmap.mmap(-1, 3 * mmap.PAGESIZE)
    arr = np.frombuffer(m, dtype=np.uint8)
    addr = _memory.address_of(arr)
    del arr
    m.close()
    with pytest.raises(ValueError, match="not mapped"):
        _memory.describe(addr, 10)
    with pytest.raises(ValueError):
        _memory.describe(0, 10)
    with pytest.raises(ValueError):
        _memory.describe(4096, 0)
    # a shared file mapping directly followed by anonymous memory: reserve, then map the file in front
    path = os.path.join(shm_dir, "mixed")
    with open(path, "w+b") as f:
        f.truncate(mmap.PAGESIZE)
    libc = _libc()
    base = libc.mmap(None, 2 * mmap.PAGESIZE, PROT_RW, MAP_PRIVATE_ANON, -1, 0)
    fd = os.open(path, os.O_RDWR)
    try:
        assert libc.mmap(base, mmap.PAGESIZE, PROT_RW, MAP_SHARED | MAP_FIXED, fd, 0) == base
        assert _memory.describe(base, 100)["kind"] == "shared_file"
        assert _memory.describe(base + mmap.PAGESIZE, 100)["kind"] == "process"
        with pytest.raises(ValueError, match="different backing"):
            _memory.describe(base + mmap.PAGESIZE - 10, 20)
    finally:
        os.close(fd)
        libc.munmap(base, 2 * mmap.PAGESIZE)


def test_describe_mapping_split_by_mprotect_is_one_file(shm_dir):
    path = os.path.join(shm_dir, "split")
    with open(path, "w+b") as f:
        f.truncate(3 * mmap.PAGESIZE)
        m = mmap.mmap(f.fileno(), 3 * mmap.PAGESIZE)
    try:
        arr = np.frombuffer(m, dtype=np.uint8)
        addr = _memory.address_of(arr)
        libc = _libc()
        assert libc.mprotect(addr + mmap.PAGESIZE, mmap.PAGESIZE, 1) == 0  # PROT_READ splits the VMA
        info = _memory.describe(addr + 10, 2 * mmap.PAGESIZE)
        assert info == {"kind": "shared_file", "path": path, "file_offset": 10, "length": 2 * mmap.PAGESIZE}
        libc.mprotect(addr + mmap.PAGESIZE, mmap.PAGESIZE, 3)
        del arr
    finally:
        m.close()


def test_mapper_round_trip_with_daemon_pool(shm_dir):
    from datadistd.core.types import Placement
    from datadistd.memory.host import HostBackend

    backend = HostBackend(shm_dir=shm_dir)
    mapper = _memory.Mapper()
    try:
        pool = backend.create_pool(Placement.DEVICE, 1 << 20, page_shift=12)
        a = pool.allocate(4 * 1024)
        b = pool.allocate(4 * 1024)
        addr_a = mapper.map(a.path, a.file_offset, a.length)
        addr_b = mapper.map(b.path, b.file_offset, b.length)
        assert mapper.mapped_paths() == [pool.path]  # one mapping per file
        assert addr_b - addr_a == b.file_offset - a.file_offset
        # daemon writes, worker reads
        a.handle.view()[:8] = np.arange(2, dtype=np.float32).tobytes()
        worker = _memory.numpy_view(addr_a, (4, 256), np.float32)
        assert worker.flags.writeable and worker[0, 0] == 0.0 and worker[0, 1] == 1.0
        # worker writes, daemon reads
        worker[3, 255] = 42.5
        assert np.frombuffer(a.handle.view(), dtype=np.float32)[-1] == 42.5
        # the worker would register its mapped cache as a shared file pointing back at the pool
        info = _memory.describe(addr_b, b.length)
        assert info == {"kind": "shared_file", "path": pool.path, "file_offset": b.file_offset, "length": b.length}
        with pytest.raises(ValueError):
            mapper.map(a.path, (1 << 20) - 10, 11)
        del worker
    finally:
        mapper.unmap_all()
        mapper.unmap_all()
        backend.close()
    assert mapper.mapped_paths() == [] and os.listdir(shm_dir) == []


def test_numpy_view_and_address_of():
    arr = np.arange(24, dtype=np.int16).reshape(2, 3, 4)
    v = _memory.numpy_view(_memory.address_of(arr), (2, 3, 4), np.int16)
    np.testing.assert_array_equal(v, arr)
    v[1, 2, 3] = -7
    assert arr[1, 2, 3] == -7  # aliasing, not a copy
    assert _memory.numpy_view(1234, (0, 5), np.float32).shape == (0, 5)
    buf = bytearray(b"hello")
    assert _memory.numpy_view(_memory.address_of(buf), (5,), np.uint8).tobytes() == b"hello"
    data = b"read-only bytes"
    assert _memory.numpy_view(_memory.address_of(data), (4,), np.uint8).tobytes() == b"read"
    with mmap.mmap(-1, 4096) as m:
        m[:3] = b"abc"
        assert _memory.numpy_view(_memory.address_of(m), (3,), np.uint8).tobytes() == b"abc"
    with pytest.raises(ValueError):
        _memory.numpy_view(0, (4,), np.uint8)


def test_allow_ptrace_is_idempotent():
    first = _memory.allow_ptrace()
    assert isinstance(first, bool)
    assert _memory.allow_ptrace() == first or _memory.allow_ptrace() is True
    if os.path.exists("/proc/sys/kernel/yama/ptrace_scope"):
        assert first is True
