"""The worker-side memory helper: ``share`` (descriptors, re-backing private memory), Mapper, numpy views.

Each sharing test hands the descriptors to the daemon's real host backend (in this process) and checks
both directions byte-exact: what the worker writes the daemon reads, and the other way round.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from datadistd.core.types import Placement
from datadistd.memory.base import FdPiece, FdRef
from datadistd.memory.host import HostBackend
from datadistd.memory.imported import FdHandle
from llm_datadist import _memory

PAGE = mmap.PAGESIZE


@pytest.fixture
def shm_dir():
    d = tempfile.mkdtemp(prefix="datadist-test-", dir="/dev/shm")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def backend():
    b = HostBackend(shm_dir=tempfile.gettempdir())
    yield b
    b.close()


def daemon_handle(backend: HostBackend, shared: _memory.Shared):  # noqa: ANN201
    """What the daemon makes of the descriptors (as the attach socket would hand them over: duplicates)."""
    try:
        pieces = tuple(FdPiece(os.dup(fd), off, n) for fd, (off, n) in zip(shared.fds, shared.pieces, strict=True))
        return backend.import_memory(FdRef(pieces, shared.offset, shared.length))
    finally:
        shared.close()


def region_of(address: int) -> str:
    """The /proc/self/maps line covering ``address``."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= address < hi:
                return line.strip()
    return ""


def anon(pages: int) -> tuple[mmap.mmap, np.ndarray]:
    m = mmap.mmap(-1, pages * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    arr = np.frombuffer(m, np.uint8)
    arr[:] = np.random.default_rng(pages).integers(0, 256, arr.size, dtype=np.uint8)
    return m, arr


# ---- private memory is re-backed in place -----------------------------------------------------

def test_numpy_array_is_rebacked_in_place_and_shared_zero_copy(backend):
    arr = np.arange(300_000, dtype=np.uint8)          # big enough for its own mmap from malloc
    before = arr.copy()
    address = arr.ctypes.data
    h = daemon_handle(backend, _memory.share(address, arr.nbytes))
    try:
        assert arr.ctypes.data == address and np.array_equal(arr, before)   # same address, same bytes
        assert "/memfd:datadist-registered" in region_of(address)
        v = h.view()
        assert v is not None and bytes(v) == before.tobytes()               # mapped by the daemon: zero copy
        v[7] = 201                                                          # daemon writes, worker reads
        assert arr[7] == 201
        arr[299_999] = 9                                                    # worker writes, daemon reads
        assert v[299_999] == 9
    finally:
        h.close()
    arr[0] = 1   # still the worker's memory after the daemon let go


def test_unaligned_range_keeps_neighbours_and_seals(backend):
    m, whole = anon(4)
    want = whole.copy()
    start, length = PAGE + 123, 2 * PAGE - 200          # starts and ends inside pages
    shared = _memory.share(whole.ctypes.data + start, length)
    assert shared.offset == 123 and shared.length == length and len(shared.fds) == 1
    assert fcntl.fcntl(shared.fds[0], fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK
    h = daemon_handle(backend, shared)
    try:
        np.testing.assert_array_equal(whole, want)                          # neighbours intact
        assert bytes(h.view()) == want[start:start + length].tobytes()
        whole[PAGE + 5] = want[PAGE + 5] ^ 0xFF                             # a neighbour in the same page
        assert whole[PAGE + 5] == want[PAGE + 5] ^ 0xFF
    finally:
        h.close()
    del whole
    m.close()


def test_neighbouring_registrations_share_the_page_they_meet_in(backend):
    m, whole = anon(3)
    base = whole.ctypes.data
    first = daemon_handle(backend, _memory.share(base + 100, PAGE + 200))    # pages 0-1
    shared = _memory.share(base + PAGE + 100, PAGE + 50)                      # pages 1-2: page 1 is first's memfd
    assert len(shared.fds) == 2 and shared.pieces[0] == (PAGE, PAGE)
    second = daemon_handle(backend, shared)
    try:
        second.view()[0] = 77                                               # both daemon views see one page
        assert first.view()[PAGE] == 77 and whole[PAGE + 100] == 77
        first.view()[PAGE - 1] = 66                                         # the byte just before second's range
        assert whole[PAGE + 99] == 66 and second.view()[0] == 77
    finally:
        first.close()
        second.close()
    del whole
    m.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pages=st.integers(1, 6), data=st.data())
def test_any_range_round_trips_byte_exact(backend, pages, data):
    """Property: for any range inside private memory, the daemon's view is exactly those bytes, both ways."""
    m, whole = anon(pages + 1)
    want = whole.copy()
    start = data.draw(st.integers(0, pages * PAGE - 1))
    length = data.draw(st.integers(1, pages * PAGE - start))
    h = daemon_handle(backend, _memory.share(whole.ctypes.data + start, length))
    try:
        np.testing.assert_array_equal(whole, want)
        assert bytes(h.view()) == want[start:start + length].tobytes()
        h.view()[length - 1] ^= 0xFF
        assert whole[start + length - 1] == want[start + length - 1] ^ 0xFF
    finally:
        h.close()
    del whole
    m.close()


FORK_SCRIPT = """
import mmap, os, numpy as np
from llm_datadist import _memory
m = mmap.mmap(-1, 2 * mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
whole = np.frombuffer(m, np.uint8)
whole[:] = 5
shared = _memory.share(whole.ctypes.data, whole.nbytes)
fd = os.dup(shared.fds[0])
shared.close()
pid = os.fork()
if pid == 0:  # the child writes its copy; it must not reach the parent's (shared) pages
    code = 4
    try:
        whole[0] = 200
        code = 0 if "memfd" not in open("/proc/self/maps").read() else 3
    finally:
        os._exit(code)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
assert os.pread(fd, 1, 0)[0] == whole[0] == 5       # the parent's byte, unchanged by the child
whole[1] = 6
assert os.pread(fd, 2, 0)[1] == 6                    # and the parent still shares its pages
print("ok")
"""


def test_fork_child_gets_private_copies():
    """In a fresh interpreter (a test runner with live gRPC threads is no place to fork)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", FORK_SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


# ---- shared mappings go as their file ----------------------------------------------------------

def test_devshm_mapping_goes_as_its_file_unsealed(backend, shm_dir):
    path = os.path.join(shm_dir, "worker")
    with open(path, "wb") as f:
        f.write(b"s" * 4 * PAGE)
    with open(path, "r+b") as f:
        m = mmap.mmap(f.fileno(), 4 * PAGE)
    arr = np.frombuffer(m, np.uint8)
    shared = _memory.share(arr.ctypes.data + PAGE + 10, 100)
    assert shared.pieces == [(PAGE, PAGE)] and shared.offset == 10
    assert os.readlink(f"/proc/self/fd/{shared.fds[0]}") == path     # the file itself: nothing re-backed
    h = daemon_handle(backend, shared)
    try:
        assert isinstance(h, FdHandle)                   # a file the worker could shrink: never mapped
        h.write_from(0, b"hi")
        assert bytes(arr[PAGE + 10:PAGE + 12]) == b"hi"
    finally:
        h.close()
    del arr
    m.close()


def test_memfd_mapping_goes_as_its_descriptor(backend):
    fd = os.memfd_create("worker-memfd")
    os.ftruncate(fd, 2 * PAGE)
    m = mmap.mmap(fd, 2 * PAGE)
    arr = np.frombuffer(m, np.uint8)
    h = daemon_handle(backend, _memory.share(arr.ctypes.data, 2 * PAGE))
    h.write_from(5, b"x")
    assert arr[5] == ord("x")
    h.close()
    os.close(fd)
    del arr
    m.close()


@pytest.mark.parametrize("what", ["unmapped", "readonly", "private_file", "stack_overflow"])
def test_what_cannot_be_shared(what, tmp_path):
    if what == "unmapped":
        m = mmap.mmap(-1, PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        address = ctypes.addressof(ctypes.c_char.from_buffer(m))
        m.close()
        with pytest.raises(ValueError, match="not mapped"):
            _memory.share(address, 10)
    elif what == "readonly":
        m = mmap.mmap(-1, PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=mmap.PROT_READ)
        address = int(np.frombuffer(m, np.uint8).ctypes.data)
        with pytest.raises(ValueError, match="cannot be handed"):
            _memory.share(address, 10)
    elif what == "private_file":
        p = tmp_path / "f"
        p.write_bytes(b"x" * PAGE)
        with open(p, "r+b") as f:
            m = mmap.mmap(f.fileno(), PAGE, flags=mmap.MAP_PRIVATE)
        arr = np.frombuffer(m, np.uint8)
        with pytest.raises(ValueError, match="cannot be handed"):
            _memory.share(arr.ctypes.data, 10)
    else:
        with pytest.raises(ValueError, match="overflows"):
            _memory.share(2**64 - 10, 20)
    for bad in ((0, 10), (4096, 0), (-5, 5)):
        with pytest.raises(ValueError):
            _memory.share(*bad)


# ---- daemon pools --------------------------------------------------------------------------------

def test_mapper_round_trip_with_daemon_pool():
    backend = HostBackend()
    fetched = []

    def fetch(pool_name: str) -> tuple[int, int]:
        fetched.append(pool_name)
        return os.dup(pool.export_fd()), pool.capacity, "", 0

    mapper = _memory.Mapper(fetch)
    try:
        pool = backend.create_pool(Placement.DEVICE, 1 << 20, page_shift=12)
        a = pool.allocate(4 * 1024)
        b = pool.allocate(4 * 1024)
        addr_a = mapper.map(a.pool, a.file_offset, a.length)
        addr_b = mapper.map(b.pool, b.file_offset, b.length)
        assert fetched == [pool.name] and mapper.mapped_pools() == [pool.name]   # one mapping per pool
        assert addr_b - addr_a == b.file_offset - a.file_offset
        a.handle.view()[:8] = np.arange(2, dtype=np.float32).tobytes()           # daemon writes, worker reads
        worker = _memory.numpy_view(addr_a, (4, 256), np.float32)
        assert worker.flags.writeable and worker[0, 0] == 0.0 and worker[0, 1] == 1.0
        worker[3, 255] = 42.5                                                    # worker writes, daemon reads
        assert np.frombuffer(a.handle.view(), dtype=np.float32)[-1] == 42.5
        # registering a mapped pool cache again goes as the pool's own (sealed) memfd: no re-backing
        shared = _memory.share(addr_b, b.length)
        assert shared.pieces == [(b.file_offset - b.file_offset % PAGE, PAGE)]
        assert fcntl.fcntl(shared.fds[0], fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK
        shared.close()
        with pytest.raises(ValueError):
            mapper.map(a.pool, (1 << 20) - 10, 11)
        del worker
    finally:
        mapper.unmap_all()
        mapper.unmap_all()
        backend.close()
    assert mapper.mapped_pools() == []


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


def test_a_pool_shrunk_and_sealed_after_its_size_is_read_is_never_mapped(monkeypatch) -> None:
    """The sender of a pool descriptor keeps its own copy: it may shrink the pool right after the client read its
    size and seal it then. The seals are read first, so that size read is one that cannot change any more: the pool
    is refused as unsealed. (Read in the other order, the shrunk pool was mapped at its old size: SIGBUS at the
    first touch past its new end.)"""
    fd = os.memfd_create("hostile-pool", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, 4 * PAGE)
    theirs = os.dup(fd)                                  # the sender's own copy
    real_fstat = os.fstat

    def fstat_then_shrink(f: int) -> os.stat_result:     # the sender acts the moment the size has been read
        st = real_fstat(f)
        if f == fd:
            os.ftruncate(theirs, PAGE)
            fcntl.fcntl(theirs, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        return st

    monkeypatch.setattr(_memory.os, "fstat", fstat_then_shrink)
    try:
        with pytest.raises(ValueError, match="not sealed against shrinking and growing"):
            _memory._map_fd(fd, 4 * PAGE)                 # closes fd
    finally:
        os.close(theirs)
