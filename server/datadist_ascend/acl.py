"""``Acl``: the ACL runtime calls datadist makes (``libascendcl.so``), typed and checked.

ACL keeps the current device per thread: every method that needs one takes ``device`` and sets it in the
calling thread first (``aclrtSetDevice`` once per thread and device). Device pointers are plain ``int``
addresses; nothing here dereferences one (on an NPU the host cannot).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from ctypes import POINTER, c_char_p, c_int, c_int32, c_size_t, c_uint32, c_uint64, c_void_p
from typing import Iterator, Sequence

from .errors import AscendError, acl_status
from .loader import find_library, once

__all__ = ["Acl", "acl", "MEMCPY_HOST_TO_HOST", "MEMCPY_HOST_TO_DEVICE", "MEMCPY_DEVICE_TO_HOST",
           "MEMCPY_DEVICE_TO_DEVICE", "MALLOC_HUGE_FIRST", "MEM_TYPE_HIGH_BAND_WIDTH", "IPC_KEY_LEN",
           "ASYNC_D2D_ALIGN"]

LIBRARY = "libascendcl.so"

# aclrtMemcpyKind
MEMCPY_HOST_TO_HOST, MEMCPY_HOST_TO_DEVICE, MEMCPY_DEVICE_TO_HOST, MEMCPY_DEVICE_TO_DEVICE = 0, 1, 2, 3
# aclrtMemMallocPolicy: what CANN's own buffers use (comm_entity.cc): high bandwidth memory, huge pages first
MALLOC_HUGE_FIRST = 0
MEM_TYPE_HIGH_BAND_WIDTH = 0x1000
# aclrtIpcMemGetExportKey: key buffer length ("fixed at 65"); flags 0 = pid white list on
IPC_KEY_LEN = 65
IPC_EXPORT_FLAG_DEFAULT = 0
IPC_IMPORT_FLAG_DEFAULT = 0
ACL_ERROR_REPEAT_INITIALIZE = 100002
#: aclrtMemcpyAsync device to device: both addresses 64-byte aligned (acl_rt.h's restriction)
ASYNC_D2D_ALIGN = 64

_PROTOTYPES: dict[str, list] = {
    "aclInit": [c_char_p],
    "aclrtSetDevice": [c_int32],
    "aclrtGetDevice": [POINTER(c_int32)],
    "aclrtGetDeviceCount": [POINTER(c_uint32)],
    "aclrtGetPhyDevIdByLogicDevId": [c_int32, POINTER(c_int32)],
    "aclrtMalloc": [POINTER(c_void_p), c_size_t, c_int],
    "aclrtFree": [c_void_p],
    "aclrtMemcpy": [c_void_p, c_size_t, c_void_p, c_size_t, c_int],
    "aclrtMemcpyAsync": [c_void_p, c_size_t, c_void_p, c_size_t, c_int, c_void_p],
    "aclrtMemGetAddressRange": [c_void_p, POINTER(c_void_p), POINTER(c_size_t)],
    "aclrtCreateStream": [POINTER(c_void_p)],
    "aclrtDestroyStream": [c_void_p],
    "aclrtSynchronizeStreamWithTimeout": [c_void_p, c_int32],
    "aclrtStreamAbort": [c_void_p],
    "aclrtIpcMemGetExportKey": [c_void_p, c_size_t, ctypes.c_char_p, c_size_t, c_uint64],
    "aclrtIpcMemSetImportPid": [c_char_p, POINTER(c_int32), c_size_t],
    "aclrtIpcMemImportByKey": [POINTER(c_void_p), c_char_p, c_uint64],
    "aclrtIpcMemClose": [c_char_p],
    "aclrtDeviceGetBareTgid": [POINTER(c_int32)],
    "aclrtGetDeviceInfo": [c_uint32, c_int, POINTER(ctypes.c_int64)],
}
#: aclrtDevAttr (acl_rt.h): an A3's super pod, and the NPU's id within it (hixl rank_table_generator_v2.cc)
DEV_ATTR_SUPER_POD_DEVICE_ID = 403
DEV_ATTR_SUPER_POD_ID = 405
#: the Atlas A3 SoCs, whose rank table is version 1.2 (hixl rank_table_generator.cc kV2Version, hixl_utils.cc kSocV3)
A3_SOCS = frozenset({"Ascend910_9391", "Ascend910_9381", "Ascend910_9392", "Ascend910_9382", "Ascend910_9372",
                     "Ascend910_9362", "Ascend910_9363"})


class Acl:
    """The ACL runtime of this process (``acl()`` gives the shared one)."""

    def __init__(self) -> None:
        lib = find_library(LIBRARY)
        self._fn = {}
        for name, args in _PROTOTYPES.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                raise AscendError(name, -1, acl_status(-1), f"{LIBRARY} has no {name}: CANN too old?") from None
            fn.argtypes = args
            fn.restype = c_int   # aclError
            self._fn[name] = fn
        try:
            self._soc = lib.aclrtGetSocName
        except AttributeError:
            raise AscendError("aclrtGetSocName", -1, acl_status(-1), f"{LIBRARY} has no aclrtGetSocName") from None
        self._soc.argtypes = []
        self._soc.restype = c_char_p
        self._local = threading.local()
        self._call("aclInit", None, ok=(ACL_ERROR_REPEAT_INITIALIZE,))

    def _call(self, name: str, *args: object, ok: Sequence[int] = ()) -> None:
        code = self._fn[name](*args)
        if code != 0 and code not in ok:
            raise AscendError(name, code, acl_status(code))

    def current(self) -> int | None:
        """The calling thread's device (``aclrtGetDevice``), ``None`` when it has none."""
        dev = c_int32()
        return dev.value if self._fn["aclrtGetDevice"](ctypes.byref(dev)) == 0 else None

    def set_device(self, device: int) -> None:
        """Make ``device`` current in the calling thread (ACL contexts are per thread): ``aclrtSetDevice`` only when
        the thread's current device -- asked of the runtime, never a cache: user code such as ``torch_npu`` may
        change it -- is another (each call takes a reference on the device's primary context; CANN sets a thread's
        context once). The top of every path that touches HCCL state or IPC keys (HCCL's registry is the current
        device's)."""
        if self.current() != device:
            self._call("aclrtSetDevice", device)

    use = set_device

    @contextlib.contextmanager
    def on_device(self, device: int) -> Iterator[None]:
        """``device`` current in the calling thread for the block, the caller's device current again after it: for
        a worker's own threads, which may drive other NPUs (a thread without a device keeps ``device``)."""
        before = self.current()
        self.set_device(device)
        try:
            yield
        finally:
            if before is not None and before != device:
                self._call("aclrtSetDevice", before)

    def bare_tgid(self) -> int:
        """This process's pid as the device driver sees it (``aclrtDeviceGetBareTgid``): what an IPC allow list
        names; differs from ``os.getpid()`` in a container with its own PID namespace, or in a VM."""
        pid = c_int32()
        self._call("aclrtDeviceGetBareTgid", ctypes.byref(pid))
        return pid.value

    def device_count(self) -> int:
        n = c_uint32()
        self._call("aclrtGetDeviceCount", ctypes.byref(n))
        return n.value

    def physical_id(self, device: int) -> int:
        """The physical NPU of this process's logical ``device`` (``ASCEND_RT_VISIBLE_DEVICES`` maps them)."""
        phy = c_int32()
        self._call("aclrtGetPhyDevIdByLogicDevId", device, ctypes.byref(phy))
        return phy.value

    def logical_id(self, physical: int) -> int | None:
        """This process's logical id of physical NPU ``physical``; ``None`` when this process does not see it."""
        for device in range(self.device_count()):
            if self.physical_id(device) == physical:
                return device
        return None

    def physical_ids(self) -> list[int]:
        """The physical NPUs this process sees, by logical id."""
        return [self.physical_id(d) for d in range(self.device_count())]

    def soc_name(self) -> str:
        """``aclrtGetSocName``: "Ascend910B1" (an A2), "Ascend910_9391" (an A3), ..."""
        name = self._soc()
        return name.decode() if name else ""

    def is_a3(self) -> bool:
        return self.soc_name() in A3_SOCS

    def device_info(self, device: int, attr: int) -> int:
        """``aclrtGetDeviceInfo(device, attr)`` of logical ``device``."""
        value = ctypes.c_int64()
        self._call("aclrtGetDeviceInfo", device, attr, ctypes.byref(value))
        return value.value

    # -- memory --

    def malloc(self, device: int, size: int, policy: int = MALLOC_HUGE_FIRST | MEM_TYPE_HIGH_BAND_WIDTH) -> int:
        self.use(device)
        ptr = c_void_p()
        self._call("aclrtMalloc", ctypes.byref(ptr), size, policy)
        return int(ptr.value or 0)

    def free(self, device: int, ptr: int) -> None:
        self.use(device)
        self._call("aclrtFree", c_void_p(ptr))

    def memcpy(self, device: int, dst: int, dst_max: int, src: int, count: int, kind: int) -> None:
        self.use(device)
        self._call("aclrtMemcpy", c_void_p(dst), dst_max, c_void_p(src), count, kind)

    def memcpy_batch(self, device: int, moves: Sequence[tuple[int, int, int]], kind: int, timeout_ms: int) -> None:
        """``aclrtMemcpyAsync`` of every ``(dst, src, count)`` move on this thread's stream of ``device``, then one
        ``aclrtSynchronizeStreamWithTimeout``; on any failure the stream is aborted (``aclrtStreamAbort``) so it
        is empty for the next batch. Device to device moves must be ``ASYNC_D2D_ALIGN``-aligned (the caller
        checks); host memory of H2D/D2H moves should be ``aclrtMallocHost``'d (pageable memory: use ``memcpy``)."""
        self.use(device)
        streams = self._local.__dict__.setdefault("streams", {})
        stream = streams.get(device)
        if stream is None:
            stream = streams[device] = self.create_stream(device)
        try:
            fn = self._fn["aclrtMemcpyAsync"]
            for dst, src, count in moves:
                code = fn(c_void_p(dst), count, c_void_p(src), count, kind, c_void_p(stream))
                if code != 0:
                    raise AscendError("aclrtMemcpyAsync", code, acl_status(code))
            self.synchronize(device, stream, timeout_ms)
        except AscendError:
            try:
                self.abort(device, stream)
            except AscendError:
                streams.pop(device, None)   # unusable: the next batch makes a new one
            raise

    def address_range(self, device: int, ptr: int) -> tuple[int, int]:
        """``(base, size)`` of the memory block ``ptr`` lies in (``aclrtMemGetAddressRange``)."""
        self.use(device)
        base, size = c_void_p(), c_size_t()
        self._call("aclrtMemGetAddressRange", c_void_p(ptr), ctypes.byref(base), ctypes.byref(size))
        return int(base.value or 0), int(size.value)

    # -- streams --

    def create_stream(self, device: int) -> int:
        self.use(device)
        stream = c_void_p()
        self._call("aclrtCreateStream", ctypes.byref(stream))
        return int(stream.value or 0)

    def destroy_stream(self, device: int, stream: int) -> None:
        self.use(device)
        self._call("aclrtDestroyStream", c_void_p(stream))

    def synchronize(self, device: int, stream: int, timeout_ms: int) -> None:
        """Wait for the stream's work; ``AscendError`` with ``LLM_TIMEOUT`` after ``timeout_ms`` (>= 1)."""
        self.use(device)
        self._call("aclrtSynchronizeStreamWithTimeout", c_void_p(stream), max(1, int(timeout_ms)))

    def abort(self, device: int, stream: int) -> None:
        self.use(device)
        self._call("aclrtStreamAbort", c_void_p(stream))

    # -- inter-process memory (IPC keys with a pid white list) --

    def ipc_export(self, device: int, ptr: int, size: int) -> str:
        """A key for ``size`` bytes of device memory at ``ptr``; only pids set with ``ipc_allow`` may import it."""
        self.use(device)
        key = ctypes.create_string_buffer(IPC_KEY_LEN)
        self._call("aclrtIpcMemGetExportKey", c_void_p(ptr), size, key, IPC_KEY_LEN, IPC_EXPORT_FLAG_DEFAULT)
        return key.value.decode()

    def ipc_allow(self, device: int, key: str, pids: Sequence[int]) -> None:
        """Let the processes ``pids`` (bare tgids: ``bare_tgid``) import ``key``; needs ``device``'s context."""
        self.set_device(device)
        arr = (c_int32 * len(pids))(*pids)
        self._call("aclrtIpcMemSetImportPid", key.encode(), arr, len(pids))

    def ipc_import(self, device: int, key: str) -> int:
        """This process's address of the memory behind ``key``."""
        self.use(device)
        ptr = c_void_p()
        self._call("aclrtIpcMemImportByKey", ctypes.byref(ptr), key.encode(), IPC_IMPORT_FLAG_DEFAULT)
        return int(ptr.value or 0)

    def ipc_close(self, device: int, key: str) -> None:
        """Close an exported or imported key; needs a context (``device``'s) in the calling thread, which may be
        whatever thread freed the memory."""
        self.set_device(device)
        self._call("aclrtIpcMemClose", key.encode())


#: the process's ``Acl`` (loaded and initialised on first use)
acl = once(Acl)
