"""Ascend device memory (``acl``): pools in NPU memory through CANN's C runtime (``datadist_ascend.acl``).

* DEVICE pools: one ``aclrtMalloc`` of the pool's capacity on the engine's NPU (``ge.exec.deviceId``; engines
  that name none: ``[memory] device_id``; one daemon serves every NPU of the host),
  with the policy CANN's own buffers use (huge pages first, high bandwidth), carved by the same page
  allocator as ``host`` pools (``LLM_OUT_OF_MEMORY`` when full; an ``aclrtMalloc`` the device cannot
  hold: ``LLM_DEVICE_OUT_OF_MEMORY``), registered whole with HCCL (``datadist_ascend.globalmem``). A worker
  reaches a pool by an IPC key the daemon exports for it with the pid white list on, naming only the worker's
  bare tgid (``export_key``); the worker imports it (``aclrtIpcMemImportByKey``) and gets its own addresses.
* HOST pools: memfd pools as in ``host`` (workers map them by descriptor). The ``hccl`` transport does not move
  them (HCCL registers host memory only from ``aclrtMallocHost``, which workers could not map): a transfer
  touching a HOST cache over hccl fails with ``LLM_FEATURE_NOT_ENABLED``; ``acl`` + ``tcp`` moves both.
* Worker NPU memory (``register_cache`` of NPU tensors) arrives as an IPC key the worker exported with
  the daemon's bare tgid on its white list (``DeviceRef``); the daemon imports it and registers it with HCCL.

Device memory has no host mapping: handles give ``view() -> None`` and copy with ``aclrtMemcpy``
(``read_into`` device to host, ``write_from`` host to device, ``copy_moves`` device to device: a batch of
``aclrtMemcpyAsync`` on a stream, one synchronisation with a deadline).
Run against CANN on an Ascend host, or against the simulated runtime of ``tests/sim`` (docs/ascend.md).
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
from typing import Any, Sequence

import numpy as np

from datadist_ascend import AscendError
from datadist_ascend.acl import (
    ASYNC_D2D_ALIGN,
    MEMCPY_DEVICE_TO_DEVICE,
    MEMCPY_DEVICE_TO_HOST,
    MEMCPY_HOST_TO_DEVICE,
    Acl,
    acl,
)
from datadist_ascend.globalmem import global_mem
from datadist_ascend.proof import PROOF_LEN

from ..core.errors import DataDistError, StatusCode, require
from ..core.types import Placement
from .base import DeviceRef, MemoryRef
from .host import HostBackend
from .pool import PoolBase

__all__ = ["AclBackend", "AclPool", "DeviceHandle", "DeviceRef", "ascend_error"]

log = logging.getLogger("datadistd.memory.acl")


def ascend_error(exc: AscendError, what: str) -> DataDistError:
    """The status table's error for a failed CANN call, saying what was being done."""
    return DataDistError(exc.status, f"{what}: {exc}")


#: a local device copy's deadline: this floor, plus a second per GiB (HBM copies run at hundreds of GB/s)
COPY_TIMEOUT_FLOOR_MS = 10_000


def _copy_timeout_ms(nbytes: int) -> int:
    return COPY_TIMEOUT_FLOOR_MS + nbytes // (1 << 20)


def _buffer_address(buf: memoryview | bytes) -> int:
    return int(np.frombuffer(buf, dtype=np.uint8).ctypes.data) if len(buf) else 0


class DeviceHandle:
    """``size`` bytes of device memory at ``address`` (this process's address) on ``device``, inside the
    allocation ``region`` (``(base, size)``: its pool, or itself when imported) -- the range HCCL registered."""

    kind = "device"

    def __init__(self, runtime: Acl, device: int, address: int, size: int, key: str | None = None,
                 region: tuple[int, int] | None = None) -> None:
        self._acl = runtime
        self.device = device
        self.address = address
        self._size = size
        self.region = region or (address, size)
        self._key = key        # imported memory: closed with the handle
        self._closed = False

    @property
    def size(self) -> int:
        return self._size

    def view(self) -> memoryview | None:
        return None   # the host cannot load from device memory

    def _check(self, offset: int, n: int) -> None:
        if self._closed:
            raise DataDistError(StatusCode.LLM_FAILED, "device memory was released")
        require(0 <= offset and offset + n <= self._size, f"range [{offset}, {offset + n}) is outside {self._size} "
                                                          f"bytes of device memory")

    def read_into(self, offset: int, dst: memoryview) -> None:
        n = len(dst)
        self._check(offset, n)
        if n:
            try:
                self._acl.memcpy(self.device, _buffer_address(dst), n, self.address + offset, n,
                                 MEMCPY_DEVICE_TO_HOST)
            except AscendError as exc:
                raise ascend_error(exc, "device to host copy") from None

    def write_from(self, offset: int, src: memoryview | bytes) -> None:
        n = len(src)
        self._check(offset, n)
        if n:
            if isinstance(src, bytes):
                src = memoryview(bytearray(src))
            try:
                self._acl.memcpy(self.device, self.address + offset, n, _buffer_address(src), n,
                                 MEMCPY_HOST_TO_DEVICE)
            except AscendError as exc:
                raise ascend_error(exc, "host to device copy") from None

    def copy_moves(self, moves: Sequence[tuple[int, int, int]]) -> None:
        """Device to device on this handle's device (``access.DeviceCopy``; ``memory/copy.py`` checked every move
        against its handles): one ``aclrtMemcpyAsync`` batch on a stream and one synchronisation when every
        address is 64-byte aligned (the asynchronous copy's restriction), else ``aclrtMemcpy`` per move."""
        if self._closed:
            raise DataDistError(StatusCode.LLM_FAILED, "device memory was released")
        try:
            if len(moves) > 1 and all((d | s) % ASYNC_D2D_ALIGN == 0 for d, s, _ in moves):
                total = sum(n for _, _, n in moves)
                self._acl.memcpy_batch(self.device, moves, MEMCPY_DEVICE_TO_DEVICE, _copy_timeout_ms(total))
                return
            for d, s, n in moves:
                self._acl.memcpy(self.device, d, n, s, n, MEMCPY_DEVICE_TO_DEVICE)
        except AscendError as exc:
            raise ascend_error(exc, "device to device copy") from None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        key, self._key = self._key, None
        if key is not None:   # closed once HCCL let it go: deregistered when no link binds it
            global_mem().retire(self.device, self.address, lambda: self._close_key(key))

    def _close_key(self, key: str) -> None:
        try:
            self._acl.ipc_close(self.device, key)
        except AscendError as exc:
            log.warning("closing imported device memory: %s", exc)

    def __repr__(self) -> str:
        return f"DeviceHandle(device={self.device}, address={self.address:#x}, size={self._size})"


class AclPool(PoolBase[DeviceHandle]):
    """A DEVICE pool: one ``aclrtMalloc`` carved by a page allocator; thread-safe; never over-commits."""

    def __init__(self, runtime: Acl, device: int, name: str, capacity: int, page_shift: int) -> None:
        super().__init__(name, Placement.DEVICE, capacity, page_shift)
        self._acl = runtime
        self.device = device
        self._keys: list[str] = []
        try:
            self.address = runtime.malloc(device, capacity)
        except AscendError as exc:
            raise ascend_error(exc, f"aclrtMalloc of a {capacity}-byte DEVICE pool on device {device}") from None
        try:   # registered with HCCL once, whole (now if the device's hccl transport runs): see globalmem
            global_mem().announce(device, self.address, capacity)
        except AscendError as exc:
            runtime.free(device, self.address)
            raise ascend_error(exc, f"registering a {capacity}-byte DEVICE pool with HCCL") from None

    def export_fd(self) -> int:
        raise DataDistError(StatusCode.LLM_FEATURE_NOT_ENABLED, f"pool {self._name!r} is device memory: workers "
                                                                f"import it by IPC key, not by descriptor")

    def export_key(self, pid: int) -> str:
        """An IPC key of the whole pool that only process ``pid`` may import: the worker's pid as the device driver
        sees it (its bare tgid, which the worker sends on its authenticated attach connection; ``SO_PEERCRED``'s
        pid when it sends none)."""
        require(pid > 0, f"pid must be > 0, got {pid}")
        with self._lock:
            if self._closed:
                raise self._closed_error()
        try:
            key = self._acl.ipc_export(self.device, self.address, self._capacity)
            self._acl.ipc_allow(self.device, key, [pid])
        except AscendError as exc:
            raise ascend_error(exc, f"exporting pool {self._name!r}") from None
        with self._lock:
            self._keys.append(key)
        return key

    def _handle(self, offset: int, size: int) -> DeviceHandle:
        return DeviceHandle(self._acl, self.device, self.address + offset, size,
                            region=(self.address, self._capacity))

    def _release(self) -> None:
        """Close the pool's IPC keys, then ``aclrtFree`` it (CANN's order: importers close first; a worker
        still holding an import keeps its mapping, as with ``host`` pools)."""
        with self._lock:
            keys, self._keys = self._keys, []
        for key in keys:
            try:
                self._acl.ipc_close(self.device, key)
            except AscendError as exc:
                log.warning("pool %s: %s", self._name, exc)
        global_mem().retire(self.device, self.address, self._free)   # freed once HCCL let it go

    def _free(self) -> None:
        try:
            self._acl.free(self.device, self.address)
        except AscendError as exc:
            log.warning("pool %s: %s", self._name, exc)

    def __repr__(self) -> str:
        return f"AclPool({self._name!r}, device={self.device}, capacity={self._capacity}, used={self.used})"


class AclBackend:
    """DEVICE pools in NPU memory, HOST pools as ``host`` (see the module doc)."""

    name = "acl"

    def __init__(self, device_id: int = 0, **host: Any) -> None:
        try:
            self._acl = acl()
            self._count = self._acl.device_count()
        except AscendError as exc:
            raise DataDistError(exc.status, f"memory backend 'acl': {exc}") from None
        require(0 <= device_id < self._count,
                f"[memory] device_id {device_id} is not one of this host's {self._count} NPUs")
        self.device_id = device_id
        try:   # the physical NPU of each of this process's logical ids (ASCEND_RT_VISIBLE_DEVICES maps them)
            self._physical = self._acl.physical_ids()
        except AscendError as exc:
            raise DataDistError(exc.status, f"memory backend 'acl': {exc}") from None
        try:
            self.bare_tgid = self._acl.bare_tgid()
        except AscendError as exc:
            raise DataDistError(exc.status, f"memory backend 'acl': {exc}") from None
        self.pid_is_bare_tgid = self.bare_tgid == os.getpid()
        self._host = HostBackend(**host)

    @property
    def runtime(self) -> Acl:
        return self._acl

    def check_device(self, device: int) -> None:
        require(0 <= device < self._count, f"device {device} is not one of this host's {self._count} NPUs "
                                           f"(logical ids 0..{self._count - 1})")

    def physical(self, device: int) -> int:
        """The physical id of this daemon's logical NPU ``device``: how a device is named to another process."""
        self.check_device(device)
        return self._physical[device]

    def local_device(self, physical: int) -> int:
        """This daemon's logical id of the NPU a worker names by its PHYSICAL id (a worker's logical ids are its
        own: ``ASCEND_RT_VISIBLE_DEVICES``, container device mounts); ``LLM_PARAM_INVALID`` naming the NPU when
        this daemon does not see it."""
        if physical in self._physical:
            return self._physical.index(physical)
        visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
        raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                            f"NPU {physical} (physical id) is not visible to datadistd, which sees physical NPUs "
                            f"{self._physical}" + (f" (its ASCEND_RT_VISIBLE_DEVICES={visible})" if visible else "") +
                            ": run the node daemon with every NPU of the node visible")

    def create_pool(self, placement: Placement, capacity: int, page_shift: int = 16) -> Any:
        return self.create_pool_on(self.device_id, placement, capacity, page_shift)

    def create_pool_on(self, device: int, placement: Placement, capacity: int, page_shift: int = 16) -> Any:
        placement = Placement(placement)
        if placement != Placement.DEVICE:
            return self._host.create_pool(placement, capacity, page_shift)
        self.check_device(device)
        name = f"datadist-{os.getpid()}-device{device}-{secrets.token_hex(8)}"
        return AclPool(self._acl, device, name, capacity, page_shift)

    def import_memory(self, ref: MemoryRef) -> Any:
        if not isinstance(ref, DeviceRef):
            return self._host.import_memory(ref)
        require(ref.length > 0, f"length must be > 0, got {ref.length}")
        device = self.local_device(ref.device)   # the worker names its NPU by physical id
        require(len(ref.proof) == PROOF_LEN <= ref.length,
                f"NPU memory is handed over with a {PROOF_LEN}-byte proof of possession, in at least {PROOF_LEN} "
                f"bytes (got {len(ref.proof)} bytes of proof for {ref.length} bytes)")
        try:
            address = self._acl.ipc_import(device, ref.key)
        except AscendError as exc:
            raise ascend_error(exc, "importing the worker's device memory") from None
        handle = DeviceHandle(self._acl, device, address, ref.length, key=ref.key)
        try:
            self._check_import(handle, ref)
            global_mem().announce(device, address, ref.length)   # links made from now on reach it
        except AscendError as exc:
            handle.close()
            raise ascend_error(exc, "registering the worker's device memory with HCCL") from None
        except BaseException:
            handle.close()
            raise
        return handle

    def _check_import(self, handle: DeviceHandle, ref: DeviceRef) -> None:
        """The memory behind the key is as long as the worker says, and holds the worker's proof (the worker
        wrote it there: the memory is its own). Nothing read is told to anyone."""
        try:
            base, size = self._acl.address_range(handle.device, handle.address)
        except AscendError as exc:
            raise ascend_error(exc, "the extent of the worker's device memory") from None
        require(base <= handle.address and handle.address + ref.length <= base + size,
                f"the NPU memory behind the key holds {base + size - handle.address} bytes, not {ref.length}")
        held = bytearray(PROOF_LEN)
        handle.read_into(0, memoryview(held))
        require(hmac.compare_digest(bytes(held), ref.proof),
                "the NPU memory behind this key does not hold this worker's proof of possession: a worker hands "
                "over only its own memory (datadist_ascend.proof)")

    def close(self) -> None:
        self._host.close()


