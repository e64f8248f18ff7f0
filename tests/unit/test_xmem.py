"""Cross-memory attach against a real child process holding an anonymous numpy buffer."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from datadistd.core.errors import DataDistError, StatusCode
from datadistd.memory import xmem
from datadistd.memory.base import ProcessRef
from datadistd.memory.host import HostBackend, ProcessHandle

pytestmark = pytest.mark.skipif(not xmem.available(), reason="process_vm_readv is not available")

SIZE = 1 << 20  # large enough that numpy takes it from an anonymous mmap

_CHILD = textwrap.dedent(f"""
    import ctypes, hashlib, os, sys
    import numpy as np
    libc = ctypes.CDLL(None)
    libc.prctl(0x59616D61, ctypes.c_ulong(-1), 0, 0, 0)  # PR_SET_PTRACER_ANY; fails harmlessly without Yama
    buf = (np.arange({SIZE}) % 251).astype(np.uint8)
    print(os.getpid(), buf.ctypes.data, buf.nbytes, flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "get":
            start, n = int(cmd[1]), int(cmd[2])
            print(buf[start:start + n].tobytes().hex(), flush=True)
        elif cmd[0] == "sha":
            print(hashlib.sha256(buf.tobytes()).hexdigest(), flush=True)
        else:
            break
""")


class Child:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        pid, addr, n = self.proc.stdout.readline().split()
        self.pid, self.addr, self.nbytes = int(pid), int(addr), int(n)
        self.expected = (np.arange(SIZE) % 251).astype(np.uint8)

    def ask(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def get(self, start: int, n: int) -> bytes:
        return bytes.fromhex(self.ask(f"get {start} {n}"))

    def close(self) -> None:
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except Exception:  # noqa: BLE001
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


@pytest.fixture
def child():
    c = Child()
    yield c
    c.close()


def test_read_whole_buffer(child):
    dst = bytearray(child.nbytes)
    assert xmem.read_remote(child.pid, child.addr, memoryview(dst)) == child.nbytes
    assert bytes(dst) == child.expected.tobytes()


def test_write_then_child_sees_it(child):
    payload = bytes(range(200, 256)) * 3
    assert xmem.write_remote(child.pid, child.addr + 1000, payload) == len(payload)
    assert child.get(1000, len(payload)) == payload
    assert child.get(990, 10) == child.expected[990:1000].tobytes()  # neighbours untouched
    arr = np.full(4096, 9, dtype=np.uint8)  # numpy arrays and read-only views work as sources too
    xmem.write_remote(child.pid, child.addr + 8192, memoryview(arr.tobytes()))
    assert child.get(8192, 4096) == arr.tobytes()


def test_vectored_many_pieces_cross_iov_max(child):
    rng = np.random.default_rng(7)
    n = 3 * xmem.IOV_MAX + 17
    offsets = rng.choice(SIZE // 64, size=n, replace=False) * 64
    lengths = rng.integers(1, 64, size=n)
    bufs = [bytearray(int(k)) for k in lengths]
    pieces = [(child.addr + int(o), memoryview(b)) for o, b in zip(offsets, bufs, strict=True)]
    assert xmem.readv_remote(child.pid, pieces) == int(lengths.sum())
    for o, b in zip(offsets, bufs, strict=True):
        assert bytes(b) == child.expected[o:o + len(b)].tobytes()
    # write them back shifted by one value, then compare the child's whole buffer
    expected = child.expected.copy()
    src = []
    for o, b in zip(offsets, bufs, strict=True):
        new = bytes((x + 1) % 256 for x in b)
        expected[o:o + len(new)] = np.frombuffer(new, dtype=np.uint8)
        src.append((child.addr + int(o), new))
    assert xmem.writev_remote(child.pid, src) == int(lengths.sum())
    assert child.ask("sha") == hashlib.sha256(expected.tobytes()).hexdigest()


def test_raw_pieces(child):
    dst = np.zeros(300, dtype=np.uint8)
    base = int(dst.ctypes.data)
    assert xmem.readv_raw(child.pid, [(child.addr + 10, base, 100), (child.addr + 500, base + 100, 0),
                                      (child.addr + 5000, base + 100, 200)]) == 300
    assert dst[:100].tobytes() == child.expected[10:110].tobytes()
    assert dst[100:].tobytes() == child.expected[5000:5200].tobytes()


def test_bad_address_is_param_invalid(child):
    with pytest.raises(DataDistError) as e:
        xmem.read_remote(child.pid, 0x10, memoryview(bytearray(8)))
    assert e.value.code == StatusCode.LLM_PARAM_INVALID
    assert str(child.pid) in e.value.message and "Bad address" in e.value.message
    # a batch whose second piece is unmapped fails as a whole (after a partial transfer)
    bufs = [bytearray(16), bytearray(16)]
    with pytest.raises(DataDistError) as e:
        xmem.readv_remote(child.pid, [(child.addr, memoryview(bufs[0])), (0x10, memoryview(bufs[1]))])
    assert e.value.code == StatusCode.LLM_PARAM_INVALID
    # a range running past the end of the mapping
    with pytest.raises(DataDistError):
        xmem.read_remote(child.pid, child.addr + child.nbytes - 8, memoryview(bytearray(1 << 24)))


def test_bad_pid_and_readonly_destination(child):
    with pytest.raises(DataDistError) as e:
        xmem.read_remote(2**22 + 12345, child.addr, memoryview(bytearray(1)))
    assert e.value.code == StatusCode.LLM_PARAM_INVALID and "No such process" in e.value.message
    with pytest.raises(DataDistError):
        xmem.read_remote(child.pid, child.addr, memoryview(b"read-only"))


def test_backend_import_probes_the_process(child, tmp_path):
    backend = HostBackend(shm_dir=str(tmp_path))
    try:
        h = backend.import_memory(ProcessRef(child.pid, child.addr, child.nbytes))
        assert isinstance(h, ProcessHandle) and h.view() is None
        out = bytearray(64)
        h.read_into(SIZE - 64, memoryview(out))
        assert bytes(out) == child.expected[-64:].tobytes()
        h.write_from(0, b"\xff\xfe")
        assert child.get(0, 2) == b"\xff\xfe"
        with pytest.raises(DataDistError):
            h.read_into(SIZE - 1, memoryview(bytearray(2)))  # outside the registered range
        h.close()
        with pytest.raises(DataDistError) as e:  # the last byte is not mapped in the child
            backend.import_memory(ProcessRef(child.pid, child.addr, 1 << 40))
        assert e.value.code == StatusCode.LLM_PARAM_INVALID
        assert "cross-memory attach" in e.value.message and "Bad address" in e.value.message
    finally:
        backend.close()
