"""The host memory backend: shared-memory pools, zero-copy handles, importing worker memory."""

from __future__ import annotations

import fcntl
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from datadistd.core.errors import DataDistError, StatusCode
from datadistd.core.types import Placement
from datadistd.memory import get_backend, handover
from datadistd.memory.base import Allocation, FdPiece, FdRef, MemoryHandle, ProcessRef
from datadistd.memory.host import HostBackend, HostPool
from datadistd.memory.imported import DirectHandle, FdHandle, MappedFdHandle, PiecesHandle

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
    b = get_backend("host", shm_dir=shm_dir)
    try:
        assert isinstance(b, HostBackend) and b.name == "host"
    finally:
        b.close()


def _fd_target(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


@pytest.mark.parametrize("placement", [Placement.HOST, Placement.DEVICE])
def test_pool_is_a_sealed_private_memfd(backend, shm_dir, placement):
    pool = backend.create_pool(placement, 1 * MiB, page_shift=12)
    prefix, pid, place, token = pool.name.split("-")
    assert (prefix, int(pid), place) == ("datadist", os.getpid(), placement.name.lower())
    int(token, 16)
    fd = pool.export_fd()
    assert _fd_target(fd).startswith(f"/memfd:{pool.name}")     # no file in any directory
    assert os.listdir(shm_dir) == []
    assert os.fstat(fd).st_size == 1 * MiB
    seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    assert seals & fcntl.F_SEAL_SHRINK and seals & fcntl.F_SEAL_GROW and seals & fcntl.F_SEAL_SEAL
    with pytest.raises(OSError):
        os.ftruncate(fd, 4096)      # a worker holding the descriptor cannot shrink it under the daemon
    assert pool.placement == placement and pool.capacity == 1 * MiB and pool.used == 0


def test_allocate_free_accounting(backend):
    pool = backend.create_pool(Placement.DEVICE, 1 * MiB, page_shift=12)
    a = pool.allocate(5000)
    b = pool.allocate(4096)
    assert isinstance(a, Allocation) and isinstance(a.handle, MemoryHandle)
    assert a.pool == pool.name and a.length == 5000 and a.handle.size == 5000
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
    assert os.listdir(backend.shm_dir) == []  # a failed pool leaves nothing


def test_close_closes_the_memfd_and_is_idempotent(backend):
    pool = backend.create_pool(Placement.HOST, 256 * KiB, page_shift=12)
    a = pool.allocate(1000)
    view = a.handle.view()
    view[:3] = b"abc"
    del view
    fd = pool.export_fd()
    pool.close()
    with pytest.raises(OSError):
        os.fstat(fd)
    with pytest.raises(DataDistError):
        pool.export_fd()
    pool.close()
    pool.free(a)  # after close: a no-op
    with pytest.raises(DataDistError):
        pool.allocate(10)


def test_close_with_live_views_keeps_them_valid(backend):
    pool = backend.create_pool(Placement.HOST, 64 * KiB, page_shift=12)
    a = pool.allocate(1000)
    arr = np.frombuffer(a.handle.view(), dtype=np.uint8)  # an export the pool cannot revoke
    pool.close()
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


def test_zero_copy_views_alias_the_memfd(backend):
    pool = backend.create_pool(Placement.HOST, 256 * KiB, page_shift=12)
    a = pool.allocate(10_000)
    v = a.handle.view()
    assert isinstance(v, memoryview) and v.format == "B" and not v.readonly and len(v) == 10_000
    v[:] = bytes(range(256)) * 39 + bytes(16)
    with mmap.mmap(pool.export_fd(), 0) as m:   # what the worker maps
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

def _memfd(data: bytes, sealed: bool) -> int:
    fd = os.memfd_create("datadist-test", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, len(data))
    os.pwrite(fd, data, 0)
    if sealed:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    return fd


def test_import_sealed_memfd_is_mapped_zero_copy(backend):
    data = np.random.default_rng(1).integers(0, 256, 64 * KiB, dtype=np.uint8).tobytes()
    fd = _memfd(data, sealed=True)
    keep = os.dup(fd)
    h = backend.import_memory(FdRef((FdPiece(fd, 0, len(data)),), 5000, 20_000))
    try:
        assert isinstance(h, MappedFdHandle) and h.size == 20_000
        v = h.view()
        assert bytes(v) == data[5000:25_000]
        v[0] = (data[5000] + 1) % 256
        assert os.pread(keep, 1, 5000)[0] == v[0]      # the same pages
    finally:
        h.close()
        h.close()
        os.close(keep)


def test_import_unsealed_file_is_never_mapped_and_survives_truncation(backend, shm_dir):
    """A file the worker could shrink is read and written through the descriptor: truncating it makes the next
    access fail with LLM_PARAM_INVALID instead of killing the daemon with SIGBUS."""
    path = os.path.join(shm_dir, "worker-file")
    with open(path, "wb") as f:
        f.write(b"y" * 3 * 4096)
    fd = os.open(path, os.O_RDWR)
    h = backend.import_memory(FdRef((FdPiece(fd, 4096, 8192),), 10, 8000))
    try:
        assert isinstance(h, FdHandle) and h.view() is None and h.size == 8000
        h.write_from(0, b"abc")
        with open(path, "rb") as f:
            f.seek(4096 + 10)
            assert f.read(3) == b"abc"
        out = bytearray(5)
        h.read_into(1, memoryview(out))
        assert bytes(out) == b"bcyyy"
        os.truncate(path, 4096)                         # the worker shrinks it under the daemon
        with pytest.raises(DataDistError) as e:
            h.read_into(0, memoryview(bytearray(100)))
        assert _code(e) == StatusCode.LLM_PARAM_INVALID and "shrank" in e.value.message
    finally:
        h.close()


def test_import_pieces_are_laid_end_to_end(backend):
    page = mmap.PAGESIZE
    a, b = _memfd(b"A" * page, sealed=True), _memfd(b"B" * 2 * page, sealed=True)
    h = backend.import_memory(FdRef((FdPiece(a, 0, page), FdPiece(b, page, page)), page - 3, 6))
    try:
        assert isinstance(h, PiecesHandle) and bytes(h.view()) == b"AAABBB"
        h.write_from(2, b"xy")
        assert bytes(h.view()) == b"AAxyBB"
    finally:
        h.close()


def _shm_file(d: str, size: int) -> str:
    path = os.path.join(d, "ro")
    with open(path, "wb") as f:
        f.write(b"r" * size)
    return path


def _hugetlb() -> int:
    """A sealed hugetlb memfd (no huge page needed: it is refused before anything maps it)."""
    fd = os.memfd_create("huge", os.MFD_HUGETLB | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, 2 * MiB)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    return fd


def test_import_refusals(backend, shm_dir):
    page = mmap.PAGESIZE

    def sealed() -> int:
        return _memfd(b"z" * 2 * page, sealed=True)

    cases = [
        (lambda: FdRef((FdPiece(sealed(), 0, 2 * page),), 0, 2 * page + 1), "outside"),
        (lambda: FdRef((FdPiece(sealed(), 0, 3 * page),), 0, 10), "does not fit"),
        (lambda: FdRef((FdPiece(sealed(), 1, page),), 0, 10), "page-aligned"),
        (lambda: FdRef((FdPiece(sealed(), 0, page),), 0, 0), "length"),
        (lambda: FdRef((FdPiece(sealed(), 0, page),), 2**64 - 1, 2), "outside"),          # offset + length wraps
        (lambda: FdRef((FdPiece(sealed(), 2**63, page),), 0, 1), "out of range"),
        (lambda: FdRef((FdPiece(sealed(), 0, page), FdPiece(_memfd(b"u" * page, False), 0, page)), 0, 10),
         "sealed"),
        (lambda: FdRef((FdPiece(os.open("/dev/null", os.O_RDWR), 0, 1),), 0, 1), "regular file"),
        (lambda: FdRef((FdPiece(os.open(_shm_file(shm_dir, page), os.O_RDONLY), 0, 1),), 0, 1), "read-write"),
        (lambda: FdRef((FdPiece(os.open(__file__, os.O_RDWR), 0, 1),), 0, 1), "not shared memory"),
        (lambda: FdRef((FdPiece(_hugetlb(), 0, 1),), 0, 1), "hugetlbfs"),
        (lambda: FdRef(tuple(FdPiece(sealed(), 0, page) for _ in range(17)), 0, 1), "pieces"),
        (lambda: FdRef((), 0, 1), "pieces"),
    ]
    before = len(os.listdir("/proc/self/fd"))
    for make, words in cases:
        with pytest.raises(DataDistError) as e:
            backend.import_memory(make())
        assert _code(e) == StatusCode.LLM_PARAM_INVALID and words in e.value.message, (words, e.value.message)
    assert handover.settle(10)
    assert len(os.listdir("/proc/self/fd")) <= before   # every refused descriptor was closed (off the caller)


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


def test_import_process_memory_of_another_process_is_refused(backend):
    """The daemon never attaches to a process: a pid other than its own gets nothing."""
    for pid in (1, _dead_pid()):
        with pytest.raises(DataDistError) as e:
            backend.import_memory(ProcessRef(pid, 0x10000, 16))
        assert _code(e) == StatusCode.LLM_PARAM_INVALID and "never attaches" in e.value.message


def test_pool_is_a_hostpool(backend):
    assert isinstance(backend.create_pool(Placement.HOST, 64 * KiB, 12), HostPool)


U64 = 2**64 - 1


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pages=st.lists(st.integers(1, 3), min_size=1, max_size=3), sealed=st.booleans(),
       offset=st.one_of(st.integers(0, 4 * 4096), st.integers(0, U64)),
       length=st.one_of(st.integers(0, 4 * 4096), st.integers(0, U64)),
       file_offset_pages=st.integers(0, 1))
def test_import_accepts_exactly_the_ranges_inside(backend, pages, sealed, offset, length, file_offset_pages):
    """Property: memory handed over is accepted iff 0 < length and offset + length fits the pieces (no wrap,
    whatever uint64 the wire carries); an accepted handle reads exactly those bytes."""
    page = mmap.PAGESIZE
    data = bytes(np.random.default_rng(len(pages)).integers(0, 256, (sum(pages) + 1) * page, dtype=np.uint8))
    pieces, blobs, at = [], [], file_offset_pages * page
    for n in pages:
        fd = _memfd(data, sealed=sealed)
        pieces.append(FdPiece(fd, at, n * page))
        blobs.append(data[at:at + n * page])
    joined = b"".join(blobs)
    ok = 0 < length and offset + length <= len(joined) and (sealed or len(pieces) == 1)
    before = len(os.listdir("/proc/self/fd"))
    try:
        h = backend.import_memory(FdRef(tuple(pieces), offset, length))
    except DataDistError as e:
        assert not ok and e.code == StatusCode.LLM_PARAM_INVALID, e
    else:
        assert ok
        try:
            got = bytearray(length)
            h.read_into(0, memoryview(got))
            assert bytes(got) == joined[offset:offset + length]
            with pytest.raises(DataDistError):
                h.read_into(1, memoryview(bytearray(length)))        # one past the end
        finally:
            h.close()
    assert len(os.listdir("/proc/self/fd")) <= before                 # every descriptor taken over was closed


def test_a_pool_backend_must_say_what_a_handle_is() -> None:
    """``PoolBase`` is an abstract base: a backend's pool that does not define ``_handle`` cannot be made (at its
    construction, not at its first allocation); ``_release`` is optional."""
    from datadistd.memory.pool import PoolBase

    class NoHandle(PoolBase[MemoryHandle]):  # type: ignore[type-var]
        pass

    with pytest.raises(TypeError, match="_handle"):
        NoHandle("half", Placement.HOST, 64 * KiB, 12)  # type: ignore[abstract]
