"""Private: what ``CacheManager`` (v2) and ``KvCacheManager`` (v1) share -- the daemon RPCs behind them.

Both managers validate their own public arguments (CANN's two APIs differ in names, roles and
rules), then call these helpers, which build the protobuf requests, map daemon-owned memory into
this process and tell the daemon where the worker sees it.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from datadist.fastframe import KIND_BLOCKS, KIND_CACHE, PULL, PUSH, TransferFrame
from datadist.v1 import datadist_pb2

from . import _memory
from . import _validate as v
from ._convert import any_key_pb, blocks_key_pb, cache_key_pb, desc_pb, frame_key, range_pb, transfer_pb
from ._engine import EngineView
from ._exports import Range, export_keys
from ._layerwise import check_transfer_args, start_transfer
from ._rpc import RPC_MARGIN_S, DaemonClient
from .llm_types import TENSORS_PER_LAYER, BlocksCacheKey, CacheDesc, CacheKey, Placement
from .status import LLMException, LLMStatusCode

__all__ = ["CacheOps", "desc_pb", "cache_key_pb", "blocks_key_pb", "any_key_pb", "worker_memory", "check_range",
           "range_pb", "check_blocks", "check_block_lists", "ALL_LAYERS",
           "UINT64_MAX",   # the *_pb helpers live in _convert, re-exported here
           "PULL", "PUSH", "KIND_CACHE", "KIND_BLOCKS", "TransferFrame"]   # and the frame's, from datadist.fastframe

log = logging.getLogger(__name__)

UINT64_MAX = 2**64 - 1
_SEQUENCES = (list, tuple)
_INTS = {int}
#: "grpc" sends pulls and pushes as gRPC calls instead of on the attach connection (for comparison)
LOCAL_TRANSFERS_ENV = "DATADIST_LOCAL_TRANSFERS"


def _npu_error(func: str, message: str) -> LLMException:
    return LLMException(f"[{func}] failed, error code is {LLMStatusCode.LLM_PARAM_INVALID}, {message}",
                        status_code=LLMStatusCode.LLM_PARAM_INVALID)


def physical_npus(device_ids: str, func: str) -> str:
    """``ge.exec.deviceId`` ("0", or "0;1" in v1) as the daemon is told it: each of this process's logical NPU ids
    as its PHYSICAL id (``aclrtGetPhyDevIdByLogicDevId`` in this process, as CANN's LLM-DataDist converts:
    ``ASCEND_RT_VISIBLE_DEVICES`` and container mounts make logical ids per process); the node daemon maps it to
    its own."""
    from datadist_ascend import AscendError
    from datadist_ascend.acl import acl

    out = []
    for dev in str(device_ids).split(";"):
        if not dev.strip().isdigit():
            return device_ids   # the daemon refuses it, naming the option
        try:
            out.append(str(acl().physical_id(int(dev))))
        except AscendError as exc:
            raise _npu_error(func, f"ge.exec.deviceId {dev} is not an NPU of this process ({exc})") from None
    return ";".join(out)


def local_npu(physical: int, func: str) -> int:
    """This process's logical id of physical NPU ``physical`` (as the daemon names NPUs)."""
    from datadist_ascend import AscendError
    from datadist_ascend.acl import acl

    try:
        device = acl().logical_id(physical)
    except AscendError as exc:
        raise _npu_error(func, f"the NPUs of this process: {exc}") from None
    if device is None:
        raise _npu_error(func, f"datadistd names NPU {physical} (physical id), which this process does not see "
                               "(ASCEND_RT_VISIBLE_DEVICES)")
    return device


def _unless(done: Any, then: Any, *args: Any) -> None:
    if not done():
        then(*args)


def device_memory(client: DaemonClient, address: int, length: int, func: str, device: int,
                  held: Optional[List[Range]] = None) -> datadist_pb2.WorkerMemory:
    """Hand NPU memory over (daemon backend ``acl``): an IPC key that only the daemon's pid -- as the kernel
    reports it on the attach socket -- may import, one per range (``_exports``: shared by registrations of the same
    range). The range is appended to ``held``: its caller gives it back (``export_keys.release``) once the daemon no
    longer imports it, and the key is closed when its last user goes (CANN: the importer closes first). Without
    ``held`` nobody closes the key.

    While the daemon imports it, the memory's first 16 bytes hold this connection's proof of possession
    (``datadist_ascend.proof``); they are restored before this returns, whatever the answer."""
    import contextlib
    import ctypes

    from datadist_ascend import AscendError
    from datadist_ascend.acl import MEMCPY_DEVICE_TO_HOST, MEMCPY_HOST_TO_DEVICE, acl
    from datadist_ascend.proof import PROOF_LEN, possession_proof

    if length < PROOF_LEN:
        raise LLMException(f"[{func}] failed, error code is {LLMStatusCode.LLM_PARAM_INVALID}, NPU memory handed to "
                           f"the daemon must be at least {PROOF_LEN} bytes, got {length}",
                           status_code=LLMStatusCode.LLM_PARAM_INVALID)
    attach = client.attach()
    saved = ctypes.create_string_buffer(PROOF_LEN)
    imported = False
    with contextlib.ExitStack() as stack:
        try:
            runtime = acl()
            stack.enter_context(runtime.on_device(device))   # the caller's thread keeps its own device afterwards
            key = export_keys.acquire(runtime, (device, address, length), attach.daemon_tgid)
            stack.callback(_unless, lambda: imported, export_keys.release, [(device, address, length)])
            proof = ctypes.create_string_buffer(possession_proof(attach.capability, key), PROOF_LEN)
            physical = runtime.physical_id(device)   # how the daemon, which has logical ids of its own, knows the NPU
            runtime.memcpy(device, ctypes.addressof(saved), PROOF_LEN, address, PROOF_LEN, MEMCPY_DEVICE_TO_HOST)
            runtime.memcpy(device, address, PROOF_LEN, ctypes.addressof(proof), PROOF_LEN, MEMCPY_HOST_TO_DEVICE)
        except AscendError as exc:
            raise LLMException(f"[{func}] failed, error code is {exc.status}, {exc}",
                               status_code=exc.status) from None
        try:
            memory_id = attach.import_device_memory(key, physical, length, func)
            imported = True   # the daemon imports it: the user is held's now (or nobody's: never closed under it)
            if held is not None:
                held.append((device, address, length))
        finally:
            try:
                runtime.memcpy(device, address, PROOF_LEN, ctypes.addressof(saved), PROOF_LEN, MEMCPY_HOST_TO_DEVICE)
            except AscendError as exc:
                raise LLMException(f"[{func}] failed, error code is {exc.status}, could not restore the first "
                                   f"{PROOF_LEN} bytes of the NPU memory: {exc}", status_code=exc.status) from None
    return datadist_pb2.WorkerMemory(attached=datadist_pb2.AttachedMemory(memory_id=memory_id))


def device_to_host(address: int, shape: Tuple[int, ...], dtype: Any, func: str, device: int) -> np.ndarray:
    """A host copy of the NPU tensor at ``address`` on NPU ``device`` (daemon backend ``acl``): ``aclrtMemcpy``
    device to host -- the host cannot load NPU memory itself."""
    from datadist_ascend import AscendError
    from datadist_ascend.acl import MEMCPY_DEVICE_TO_HOST, acl

    out = np.empty(shape, dtype)
    try:
        with acl().on_device(device):
            acl().memcpy(device, out.ctypes.data, out.nbytes, address, out.nbytes, MEMCPY_DEVICE_TO_HOST)
    except AscendError as exc:
        raise LLMException(f"[{func}] failed, error code is {exc.status}, {exc}", status_code=exc.status) from None
    return out


def worker_memory(client: DaemonClient, address: int, length: int, func: str, npu: Optional[int] = None,
                  held: Optional[List[Range]] = None) -> datadist_pb2.WorkerMemory:
    """Hand ``length`` bytes at ``address`` of this process to the daemon (``ValueError`` when impossible).

    Embedded mode: the daemon is this process and takes the address as it is. Otherwise the memory
    crosses as file descriptors on the attach socket (``_memory.share``); NPU memory of device ``npu`` (daemon
    backend ``acl``) by IPC key (``device_memory``, which appends its range to ``held``)."""
    if client.embedded:
        if address <= 0 or length <= 0 or address + length > 1 << 64:
            raise ValueError(f"invalid memory range: address={address!r}, length={length!r}")
        return datadist_pb2.WorkerMemory(process=datadist_pb2.ProcessMemory(pid=os.getpid(), address=address,
                                                                            length=length))
    if npu is not None:
        return device_memory(client, address, length, func, npu, held)
    shared = _memory.share(address, length)
    try:
        memory_id = client.attach().import_memory(shared.fds, shared.pieces, shared.offset, shared.length, func)
    finally:
        shared.close()
    return datadist_pb2.WorkerMemory(attached=datadist_pb2.AttachedMemory(memory_id=memory_id))


def _attached_ids(mem: Sequence[datadist_pb2.WorkerMemory]) -> List[int]:
    return [m.attached.memory_id for m in mem if m.WhichOneof("kind") == "attached"]


def check_range(name: str, value: Optional[range]) -> None:
    v.check_isinstance(name, value, [range])
    if value is not None:
        v.raise_if_false(value.step == 1, f"{name} step must be 1, got {value.step}")
        v.raise_if_false(0 <= value.start < value.stop, f"{name} must satisfy 0 <= start < stop, got {value}")


def check_blocks(name: str, blocks: Any) -> List[int]:
    v.check_isinstance(name, blocks, [list, tuple])
    out = list(blocks or ())
    if out and set(map(type, out)) == {int} and min(out) >= 0 and max(out) <= UINT64_MAX:
        return out   # every element a plain int in range, found by C loops (the usual list of block numbers)
    for b in out:   # anything else: element by element, each refusal as check_uint64 words it
        v.check_uint64(f"{name} element", b)
    return out


def check_block_lists(src_blocks: Any, dst_blocks: Any) -> Tuple[List[int], List[int]]:
    """``check_blocks`` of ``src_blocks`` then ``dst_blocks`` in one call (a pull's or push's hot path): the usual
    lists of plain ints in range pass by C loops; anything else goes through ``check_blocks``, which words the
    refusal."""
    if type(src_blocks) in _SEQUENCES and type(dst_blocks) in _SEQUENCES:
        both = [*src_blocks, *dst_blocks]
        if both and set(map(type, both)) == _INTS and min(both) >= 0 and max(both) <= UINT64_MAX:
            return list(src_blocks), list(dst_blocks)
    return check_blocks("src_blocks", src_blocks), check_blocks("dst_blocks", dst_blocks)


#: the layers of a pull given no layer kwargs: all of them, the default tensors per layer
ALL_LAYERS: Tuple[Optional[range], Optional[range], int] = (None, None, TENSORS_PER_LAYER)


def layer_kwargs(kwargs: Dict[str, Any], extra: Sequence[str] = ()) -> Tuple[Optional[range], Optional[range], int]:
    """``src_layer_range`` / ``dst_layer_range`` / ``tensor_num_per_layer`` of pull_* (docs/spec.md §6)."""
    if not kwargs:
        return ALL_LAYERS
    unknown = set(kwargs) - {"src_layer_range", "dst_layer_range", "tensor_num_per_layer", *extra}
    v.raise_if_true(bool(unknown), f"unsupported kwargs: {sorted(unknown)}")
    src = kwargs.get("src_layer_range")
    dst = kwargs.get("dst_layer_range")
    per = kwargs.get("tensor_num_per_layer", TENSORS_PER_LAYER)
    check_range("src_layer_range", src)
    check_range("dst_layer_range", dst)
    v.check_uint32("tensor_num_per_layer", per)
    v.raise_if_false(per > 0, "tensor_num_per_layer must be > 0")
    if src is not None and dst is not None:
        v.raise_if_false(len(src) == len(dst), f"src_layer_range {src} and dst_layer_range {dst} differ in length")
    return src, dst, per


class CacheOps:
    """The daemon side of a cache manager: one engine, its mapped memory, its RPCs."""

    def __init__(self, owner: EngineView) -> None:
        self._owner = owner
        self._cluster_id = owner.cluster_id      # fixed at the engine's construction
        self._initialized = True
        self._mapper = _memory.Mapper(self._fetch_pool)
        self._grpc_transfers = os.environ.get(LOCAL_TRANSFERS_ENV) == "grpc"   # read once, as the engine starts
        self._transfer_timeout_s: Optional[float] = None    # sync_kv_timeout + margin, read at the first transfer
        self._exports: Dict[int, List[Range]] = {}   # cache id -> the export keys' ranges its registration holds

    # ---- plumbing ------------------------------------------------------------------------------

    def _finalize(self) -> None:
        self._initialized = False
        self._mapper.unmap_all()

    def _call(self, method: str, request: Any, func_name: str, timeout: Optional[float] = None) -> Any:
        if not self._initialized:
            raise RuntimeError("llm datadist is not initialized")
        return self._owner._call(method, request, func_name, timeout)

    @property
    def _engine_id(self) -> int:
        return self._owner._engine_id

    @property
    def _client(self) -> DaemonClient:
        return self._owner._check_init()

    def _fetch_pool(self, pool: str) -> Tuple[int, int, str, int]:
        return self._client.attach().export_pool(self._engine_id, pool, "allocate_cache")

    def _hand_over(self, func: str, addrs: Sequence[int], size: int, placement: Any = None,
                   held: Optional[List[Range]] = None) -> List[datadist_pb2.WorkerMemory]:
        """Hand the tensors at ``addrs`` over; DEVICE tensors of a daemon on NPU memory (``acl``) by IPC key, whose
        ranges are appended to ``held`` (given back by the caller once the daemon no longer imports them)."""
        client = self._client
        npu = self._owner._device_id if self._in_npu_memory(placement) else None
        mem: List[datadist_pb2.WorkerMemory] = []
        held = [] if held is None else held
        try:
            for a in addrs:
                mem.append(worker_memory(client, a, size, func, npu, held))
        except ValueError as exc:
            self._release(mem, held)
            raise LLMException(f"[{func}] failed, error code is {LLMStatusCode.LLM_PARAM_INVALID}, {exc}.",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID) from None
        except BaseException:
            self._release(mem, held)
            raise
        return mem

    def _in_npu_memory(self, placement: Any) -> bool:
        """Tensors of ``placement`` are NPU memory: DEVICE, and the daemon's backend is ``acl``."""
        client = self._client
        return placement == Placement.DEVICE and not client.embedded and client.attach().memory_backend == "acl"

    def _release(self, mem: Sequence[datadist_pb2.WorkerMemory], held: Sequence[Range] = ()) -> None:
        """Give back memory handed over for a call that failed (the daemon may not have used it), then the export
        keys of ``held`` (importer first, exporter second)."""
        ids = _attached_ids(mem)
        try:
            if ids and self._client.attachment is not None:
                self._client.attachment.release_memory(ids)
        finally:
            export_keys.release(held)

    def _drop_exports(self, cache_id: int) -> None:
        """The daemon acknowledged that cache ``cache_id`` is gone: its export keys' users go."""
        export_keys.release(self._exports.pop(cache_id, ()))

    def _release_exports(self) -> None:
        """After the engine's finalize (or the attach connection's end): every export key's user of this engine."""
        held, self._exports = self._exports, {}
        export_keys.release(r for ranges in held.values() for r in ranges)

    # ---- memory --------------------------------------------------------------------------------

    def _allocate_rpc(self, func: str, desc: CacheDesc, is_blocks: bool, keys: Sequence[CacheKey] = (),
                      blocks_key: Optional[BlocksCacheKey] = None) -> Tuple[Any, List[int]]:
        """Allocate from the engine pool and map it here; returns (CacheInfo, addresses in this process)."""
        req = datadist_pb2.AllocateCacheRequest(engine_id=self._engine_id, desc=desc_pb(desc), is_blocks=is_blocks,
                                                cache_keys=[cache_key_pb(k) for k in keys])
        if blocks_key is not None:
            req.blocks_key.CopyFrom(blocks_key_pb(blocks_key))
        info = self._call("AllocateCache", req, func)
        try:
            addrs = self._map_tensors(desc, info.tensors)
        except ValueError as exc:
            try:
                self._deallocate_rpc(func, info.cache_id, is_blocks)
            except LLMException:
                pass    # refused as it is: the cache goes with the engine
            raise LLMException(f"[{func}] failed, error code is {LLMStatusCode.LLM_FAILED}, the daemon's answer "
                               f"is refused: {exc}.", status_code=LLMStatusCode.LLM_FAILED) from None
        # so that peers can name these tensors by raw address (TransferConfig.dst_addrs)
        self._call("SetWorkerAddrs", datadist_pb2.WorkerAddrsRequest(engine_id=self._engine_id,
                                                                     cache_id=info.cache_id, addrs=addrs), func)
        return info, addrs

    def _map_tensors(self, desc: CacheDesc, tensors: Sequence[Any]) -> List[int]:
        """The addresses here of an allocated cache's tensors, each checked against the cache's description before
        its pool is mapped: ``num_tensors`` of them, each ``desc.size`` bytes (what views of the cache cover) inside
        its pool (the mapper checks that). ValueError saying what does not fit."""
        if len(tensors) != desc.num_tensors:
            raise ValueError(f"{len(tensors)} tensors for a description of {desc.num_tensors}")
        for i, t in enumerate(tensors):
            if t.length != desc.size:
                raise ValueError(f"tensor {i} is {t.length} bytes where the description makes {desc.size}")
        return [self._mapper.map(t.pool, t.file_offset, t.length) for t in tensors]

    def _register_rpc(self, func: str, desc: CacheDesc, addrs: Sequence[int], is_blocks: bool,
                      keys: Sequence[CacheKey] = (), blocks_key: Optional[BlocksCacheKey] = None,
                      remote_accessible: Optional[bool] = None) -> Any:
        held: List[Range] = []
        mem = self._hand_over(func, addrs, desc.size, desc.placement, held)
        req = datadist_pb2.RegisterCacheRequest(engine_id=self._engine_id, desc=desc_pb(desc), is_blocks=is_blocks,
                                                tensors=mem, cache_keys=[cache_key_pb(k) for k in keys],
                                                worker_addrs=list(addrs))
        if blocks_key is not None:
            req.blocks_key.CopyFrom(blocks_key_pb(blocks_key))
        if remote_accessible is not None:
            req.remote_accessible = remote_accessible
        try:
            info = self._call("RegisterCache", req, func)
        except LLMException:
            self._release(mem, held)
            raise
        if held:
            self._exports.setdefault(info.cache_id, []).extend(held)
        return info

    def _unregister_rpc(self, func: str, cache_id: int) -> None:
        """End a registration; its export keys' users go once the daemon acknowledged it."""
        self._call("UnregisterCache", datadist_pb2.CacheRef(engine_id=self._engine_id, cache_id=cache_id), func)
        self._drop_exports(cache_id)   # the daemon no longer imports its NPU memory: the export keys may close

    def _deallocate_rpc(self, func: str, cache_id: int, is_blocks: bool) -> None:
        self._call("DeallocateCache", datadist_pb2.CacheRef(engine_id=self._engine_id, cache_id=cache_id,
                                                            is_blocks=is_blocks), func)
        self._drop_exports(cache_id)

    def _remove_key_rpc(self, func: str, key: CacheKey) -> None:
        self._call("RemoveCacheKey", datadist_pb2.RemoveCacheKeyRequest(engine_id=self._engine_id,
                                                                        cache_key=cache_key_pb(key)), func)

    # ---- local copies --------------------------------------------------------------------------

    def _copy_cache_rpc(self, func: str, dst_id: int, src_id: int, dst_batch_index: int, src_batch_index: int,
                        offset: int, size: int) -> None:
        self._call("CopyCache", datadist_pb2.CopyCacheRequest(
            engine_id=self._engine_id, dst_cache_id=dst_id, src_cache_id=src_id, dst_batch_index=dst_batch_index,
            src_batch_index=src_batch_index, offset=offset, size=size), func)

    def _copy_blocks_rpc(self, func: str, cache_id: int, copy_block_info: Dict[int, List[int]]) -> None:
        v.check_isinstance("copy_block_info", copy_block_info, [dict], allow_none=False)
        copies = []
        for src, dsts in copy_block_info.items():
            v.check_uint64("src block", src)
            v.check_isinstance("dst blocks", dsts, [list, tuple], allow_none=False)
            for d in dsts:
                v.check_uint64("dst block", d)
            copies.append(datadist_pb2.BlockCopy(src_block=src, dst_blocks=list(dsts)))
        self._call("CopyBlocks", datadist_pb2.CopyBlocksRequest(engine_id=self._engine_id, cache_id=cache_id,
                                                                copies=copies), func)

    def _operand_pb(self, func: str, cache_id: int, desc: CacheDesc, addrs: Sequence[int], held: List[Range]
                    ) -> datadist_pb2.CacheOperand:
        if cache_id >= 0:
            return datadist_pb2.CacheOperand(cache_id=cache_id)
        return datadist_pb2.CacheOperand(cache_id=-1, desc=desc_pb(desc),
                                         tensors=self._hand_over(func, addrs, desc.size, desc.placement, held))

    def _swap_rpc(self, func: str, src: Tuple[int, CacheDesc, Sequence[int]], dst: Tuple[int, CacheDesc, Sequence[int]],
                  src_to_dst: Dict[int, int]) -> None:
        v.check_isinstance("src_to_dst", src_to_dst, [dict], allow_none=False)
        for s, d in src_to_dst.items():
            v.check_uint64("src block", s)
            v.check_uint64("dst block", d)
        held: List[Range] = []   # a transient operand's export keys: the daemon closes its import as the call ends
        src_op = self._operand_pb(func, *src, held)
        try:
            dst_op = self._operand_pb(func, *dst, held)
        except BaseException:
            self._release(src_op.tensors, held)
            raise
        try:
            self._call("SwapBlocks", datadist_pb2.SwapBlocksRequest(engine_id=self._engine_id, src=src_op, dst=dst_op,
                                                                    src_to_dst=dict(src_to_dst)), func)
        except LLMException:
            # a transient CPU cache: whatever the daemon did not take (the call failed first) goes back
            self._release([*src_op.tensors, *dst_op.tensors], held)
            raise
        export_keys.release(held)

    # ---- transfers -----------------------------------------------------------------------------

    def _transfer(self, func: str, frame: TransferFrame) -> None:
        """Pull/Push on the attach connection (no gRPC call: the local hot path; binary frames, continued when the
        block lists do not fit one datagram), or over gRPC where ``DATADIST_LOCAL_TRANSFERS=grpc`` asks for it."""
        if not self._initialized:
            raise RuntimeError("llm datadist is not initialized")
        timeout_s = self._transfer_timeout_s     # (the engine's options are fixed from init to finalize)
        if timeout_s is None:
            timeout_s = self._transfer_timeout_s = self._owner._sync_kv_timeout_s + RPC_MARGIN_S
        attachment = self._owner._check_init().attachment
        if attachment is not None and not self._grpc_transfers:
            attachment.transfer(frame, func, timeout_s)
            return
        self._call("Push" if frame.op == PUSH else "Pull", transfer_pb(frame), func, timeout_s)

    def _request(self, op: int, kind: int, remote: Any, local_cache_id: int, remote_blocks: Sequence[int],
                 local_blocks: Sequence[int], batch_index: int, size: int, src: Optional[range],
                 dst: Optional[range], per: int, src_offset: Optional[int] = None,
                 dst_offset: Optional[int] = None) -> TransferFrame:
        """The pull (``op`` PULL) or push of ``kind`` (KIND_CACHE / KIND_BLOCKS) the caller validated."""
        key_kind, key = frame_key(remote)
        return TransferFrame(op, self._owner._engine_id, kind, key_kind, key, local_cache_id, tuple(remote_blocks),
                             tuple(local_blocks), batch_index, size, per,
                             None if src is None else (src.start, src.stop),
                             None if dst is None else (dst.start, dst.stop), None, src_offset, dst_offset)

    def _transfer_async(self, src_cache_id: int, src_desc: CacheDesc, layer_synchronizer: Any,
                        transfer_configs: Sequence[Any], src_block_indices: Optional[Sequence[int]],
                        dst_block_indices: Optional[Sequence[int]], dst_block_memory_size: Optional[int],
                        default_error: LLMStatusCode, remote_cache_accessible: bool, v1: bool) -> Any:
        """Validate as CANN does, then start the layer-wise push (``_layerwise``)."""
        ranges = check_transfer_args(src_desc.num_tensors, src_desc.batch_size, layer_synchronizer, transfer_configs,
                                     src_block_indices, dst_block_indices, dst_block_memory_size,
                                     remote_cache_accessible, v1)
        if not self._initialized:
            raise RuntimeError("llm datadist is not initialized")
        return start_transfer(self._owner, src_cache_id, src_desc, layer_synchronizer, list(transfer_configs),
                              src_block_indices, dst_block_indices, dst_block_memory_size, default_error, ranges)
