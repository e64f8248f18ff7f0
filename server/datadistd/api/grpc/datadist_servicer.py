"""The worker-facing ``DataDist`` service: converts, calls the node/engine, converts back."""

from __future__ import annotations

import asyncio
import os
from typing import Callable, Sequence

from datadist.v1 import common_pb2, datadist_pb2, datadist_pb2_grpc

from ... import __version__
from ...core.errors import DataDistError, StatusCode, require
from ...core.plan import LayerTask, TransferOrder
from ...core.registry import CacheEntry
from ...core.types import BlocksKeyRef
from ...engine.engine import MAX_REGISTERED_ADDRS, Operand, memory_of
from ...engine.extents import ExtentOrder
from ...links import MAX_CLUSTERS_PER_CALL, refuse_too_many
from ...links.layerwise import LayerPush
from ...memory.base import DeviceMemory, MemoryHandle, ProcessRef, Segment
from ...node.node import EngineSlot, Node
from ...node.sessions import WorkerSession
from ...ops.metrics import DaemonMetrics
from ..transfers import start_transfer
from . import convert
from .errors import abort_with, guarded

EMPTY = common_pb2.Empty()
#: metadata key of the capability a worker got on the attach socket (hex)
CAPABILITY_METADATA_KEY = "datadist-capability"
#: CANN's engine options are a few dozen keys; a bigger map is refused before it is converted
MAX_INIT_OPTIONS = 1024


def cache_info(entry: CacheEntry, slot: EngineSlot) -> datadist_pb2.CacheInfo:
    memory = memory_of(entry)
    info = datadist_pb2.CacheInfo(cache_id=entry.cache_id, desc=convert.desc_to_pb(entry.desc),
                                  is_blocks=entry.is_blocks, registered=not entry.owned,
                                  remote_accessible=entry.remote_accessible)
    for pool, offset in memory.exports:
        info.tensors.add(pool=pool, file_offset=offset, length=entry.desc.tensor_size)
    for key in slot.engine.registry.keys_of(entry.cache_id):
        info.keys.append(convert.owner_key_to_pb(key, slot.engine.cluster_id))
    return info


class DataDistServicer(datadist_pb2_grpc.DataDistServicer):
    """The DataDist service. On the worker socket (``admin=False``) a call reaches only the engines of the
    worker whose capability it carries; on the admin socket (mode 0600: root and the daemon's user) it
    reaches every engine."""

    def __init__(self, node: Node, socket_path: str = "", metrics: DaemonMetrics | None = None,
                 admin: bool = False) -> None:
        self.node = node
        self.socket_path = socket_path
        self.metrics = metrics
        self.admin = admin

    # ---- who is calling ------------------------------------------------------------------------

    def _session(self, context) -> WorkerSession | None:  # noqa: ANN001
        for key, value in context.invocation_metadata() or ():
            if key == CAPABILITY_METADATA_KEY:
                try:
                    return self.node.sessions.find(bytes.fromhex(value))
                except ValueError:
                    return None
        return None

    def _slot(self, context, engine_id: int) -> EngineSlot:  # noqa: ANN001
        """The engine if the caller may reach it (see the class doc); otherwise LLM_ENGINE_FINALIZED."""
        if self.admin:
            return self.node.slot(engine_id)
        return self.node.owned_slot(self._session(context), engine_id)

    def _memory(self, context, slot: EngineSlot,  # noqa: ANN001
                msgs: Sequence[datadist_pb2.WorkerMemory]) -> list[MemoryHandle]:
        """Worker memory the caller handed over on the attach socket (or its own addresses in embedded mode) for
        engine ``slot``: NPU memory must be on the engine's NPU (its caches, pools and links are there)."""
        session = self._session(context)
        handles: list[MemoryHandle] = []
        try:
            for msg in msgs:
                which = msg.WhichOneof("kind")
                if which == "attached":
                    require(session is not None, "attached memory needs the capability of the worker that handed "
                                                 "it over")
                    assert session is not None
                    handles.append(session.take_memory(msg.attached.memory_id))
                elif which == "process":
                    require(session is not None and session.embedded and msg.process.pid == os.getpid(),
                            "process memory is accepted only from the daemon's own process (embedded mode); "
                            "hand memory over as a file descriptor on the attach socket")
                    handles.append(self.node.backend.import_memory(
                        ProcessRef(msg.process.pid, msg.process.address, msg.process.length)))
                else:
                    raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                        "the daemon never opens a path a worker names: hand memory over as a file "
                                        "descriptor on the attach socket (llm_datadist does this)")
                handle = handles[-1]
                if isinstance(handle, DeviceMemory) and handle.device != slot.device:
                    raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                        f"NPU memory of device {handle.device} cannot serve engine {slot.engine_id}, "
                                        f"which is on device {slot.device} (ge.exec.deviceId)")
        except BaseException:
            for handle in handles:
                handle.close()
            raise
        return handles

    # ---- life cycle --------------------------------------------------------------------------

    @guarded
    async def Init(self, request, context):  # noqa: N802, ANN001, ANN201
        require(len(request.options) <= MAX_INIT_OPTIONS,  # before converting a map of any size
                f"{len(request.options)} options; at most {MAX_INIT_OPTIONS} are accepted")
        session = self._session(context)
        require(session is not None,
                f"attach first: a worker connects to {self.socket_path}.attach, gets its capability and sends it "
                f"as metadata {CAPABILITY_METADATA_KEY!r} (llm_datadist does this)")
        assert session is not None
        slot = await self.node.init_engine(request.cluster_id, convert.role_from_pb(request.role),
                                           dict(request.options), session)
        return datadist_pb2.InitResponse(engine_id=slot.engine_id, daemon_version=__version__,
                                         listen_address=slot.listen_address,
                                         device_id=self.node.physical_device(slot.device))

    @guarded
    async def ProvePid(self, request, context):  # noqa: N802, ANN001, ANN201
        raise DataDistError(StatusCode.LLM_FEATURE_NOT_ENABLED,
                            "ProvePid is retired: the daemon takes a worker's identity from the kernel on the attach "
                            "socket, and never reaches a process's memory by pid")

    @guarded
    async def Finalize(self, request, context):  # noqa: N802, ANN001, ANN201
        session = self._session(context)
        if not self.admin and session is not None and request.engine_id in session.retired:
            return EMPTY  # this worker's own engine, already finalized: finalize is idempotent
        slot = self._slot(context, request.engine_id)
        await self.node.finalize_engine(slot.engine_id)
        return EMPTY

    # ---- caches ------------------------------------------------------------------------------

    @guarded
    async def AllocateCache(self, request, context):  # noqa: N802, ANN001, ANN201
        slot = self._slot(context, request.engine_id)
        _check_counts(request)
        desc = convert.desc_from_pb(request.desc)
        keys = [convert.cache_key_from_pb(k) for k in request.cache_keys]
        blocks_key = (BlocksKeyRef(request.blocks_key.cluster_id, request.blocks_key.model_id)
                      if request.HasField("blocks_key") else None)
        entry = slot.engine.allocate_cache(desc, is_blocks=request.is_blocks, keys=keys, blocks_key=blocks_key)
        return cache_info(entry, slot)

    @guarded
    async def RegisterCache(self, request, context):  # noqa: N802, ANN001, ANN201
        slot = self._slot(context, request.engine_id)
        _check_counts(request)
        require(len(request.tensors) <= MAX_REGISTERED_ADDRS,
                f"{len(request.tensors)} addresses; at most {MAX_REGISTERED_ADDRS} may be registered per engine")
        desc = convert.desc_from_pb(request.desc)
        keys = [convert.cache_key_from_pb(k) for k in request.cache_keys]
        blocks_key = (BlocksKeyRef(request.blocks_key.cluster_id, request.blocks_key.model_id)
                      if request.HasField("blocks_key") else None)
        remote = request.remote_accessible if request.HasField("remote_accessible") else None
        handles = self._memory(context, slot, request.tensors)
        entry = slot.engine.register_cache(desc, is_blocks=request.is_blocks, handles=handles, keys=keys,
                                           blocks_key=blocks_key, remote_accessible=remote,
                                           worker_addrs=list(request.worker_addrs))
        return cache_info(entry, slot)

    @guarded
    async def SetWorkerAddrs(self, request, context):  # noqa: N802, ANN001, ANN201
        self._slot(context, request.engine_id).engine.set_worker_addrs(request.cache_id, list(request.addrs))
        return EMPTY

    @guarded
    async def DeallocateCache(self, request, context):  # noqa: N802, ANN001, ANN201
        self._slot(context, request.engine_id).engine.deallocate_cache(request.cache_id, is_blocks=request.is_blocks)
        return EMPTY

    @guarded
    async def UnregisterCache(self, request, context):  # noqa: N802, ANN001, ANN201
        self._slot(context, request.engine_id).engine.unregister_cache(request.cache_id)
        return EMPTY

    @guarded
    async def RemoveCacheKey(self, request, context):  # noqa: N802, ANN001, ANN201
        self._slot(context, request.engine_id).engine.remove_cache_key(convert.cache_key_from_pb(request.cache_key))
        return EMPTY

    @guarded
    async def CopyCache(self, request, context):  # noqa: N802, ANN001, ANN201
        engine = self._slot(context, request.engine_id).engine
        await engine.copy_cache(request.dst_cache_id, request.src_cache_id, request.dst_batch_index,
                                request.src_batch_index, request.offset, request.size)
        return EMPTY

    @guarded
    async def CopyBlocks(self, request, context):  # noqa: N802, ANN001, ANN201
        engine = self._slot(context, request.engine_id).engine
        copies = {c.src_block: list(c.dst_blocks) for c in request.copies}
        require(len(copies) == len(request.copies), "copy_block_info has a source block twice")
        await engine.copy_blocks(request.cache_id, copies)
        return EMPTY

    def _operand(self, context, slot: EngineSlot, msg: datadist_pb2.CacheOperand) -> Operand:  # noqa: ANN001
        if msg.cache_id >= 0 and not msg.tensors:
            return slot.engine.operand(msg.cache_id)
        desc = convert.desc_from_pb(msg.desc)
        require(len(msg.tensors) == desc.num_tensors,
                f"a CPU cache needs one address per tensor: {len(msg.tensors)} for {desc.num_tensors} tensors")
        handles = self._memory(context, slot, msg.tensors)
        if any(h.size < desc.tensor_size for h in handles):
            for h in handles:
                h.close()
            raise DataDistError(StatusCode.LLM_PARAM_INVALID, "CPU cache memory smaller than one tensor")
        return Operand(desc, tuple(Segment(h, 0, desc.tensor_size) for h in handles), True, -1, tuple(handles))

    @guarded
    async def SwapBlocks(self, request, context):  # noqa: N802, ANN001, ANN201
        slot = self._slot(context, request.engine_id)
        src = self._operand(context, slot, request.src)
        try:
            dst = self._operand(context, slot, request.dst)
        except BaseException:
            for h in src.handles:
                h.close()
            raise
        try:
            await slot.engine.swap_blocks(src, dst, dict(request.src_to_dst))
        finally:
            for h in (*src.handles, *dst.handles):
                h.close()
        return EMPTY

    # ---- links and transfers -------------------------------------------------------------------

    @guarded
    async def LinkClusters(self, request, context):  # noqa: N802, ANN001, ANN201
        slot = self._slot(context, request.engine_id)
        if len(request.clusters) > MAX_CLUSTERS_PER_CALL:  # before converting a list of any length
            return _too_many_clusters(len(request.clusters))
        reasons: list[str] = []
        code, codes = await slot.links.link_clusters([convert.cluster_from_pb(c) for c in request.clusters],
                                                     request.timeout_ms or 3000, reasons)
        return datadist_pb2.LinkClustersResponse(status=code, statuses=codes, reasons=reasons)

    @guarded
    async def UnlinkClusters(self, request, context):  # noqa: N802, ANN001, ANN201
        slot = self._slot(context, request.engine_id)
        if len(request.clusters) > MAX_CLUSTERS_PER_CALL:
            return _too_many_clusters(len(request.clusters))
        reasons: list[str] = []
        code, codes = await slot.links.unlink_clusters([convert.cluster_from_pb(c) for c in request.clusters],
                                                       request.timeout_ms or 3000, request.force, reasons)
        return datadist_pb2.LinkClustersResponse(status=code, statuses=codes, reasons=reasons)

    @guarded
    async def SwitchRole(self, request, context):  # noqa: N802, ANN001, ANN201
        slot = self._slot(context, request.engine_id)
        await self.node.switch_role(slot.engine_id, convert.role_from_pb(request.role), dict(request.options))
        return EMPTY

    @guarded
    async def Link(self, request, context):  # noqa: N802, ANN001, ANN201
        slot = self._slot(context, request.engine_id)
        assert slot.comm is not None
        comm_id = await slot.comm.link(request.comm_name, [(m.cluster_id, m.rank) for m in request.members],
                                       request.rank_table)
        return datadist_pb2.CommLinkResponse(comm_id=comm_id)

    @guarded
    async def Unlink(self, request, context):  # noqa: N802, ANN001, ANN201
        slot = self._slot(context, request.engine_id)
        assert slot.comm is not None
        await slot.comm.unlink(request.comm_id)
        return EMPTY

    @guarded
    async def QueryRegisterMemStatus(self, request, context):  # noqa: N802, ANN001, ANN201
        slot = self._slot(context, request.engine_id)
        assert slot.comm is not None
        state, detail = slot.comm.status(request.comm_id)
        return datadist_pb2.RegisterMemStatusResponse(status=int(state), detail=detail)

    async def Pull(self, request, context):  # noqa: N802, ANN001, ANN201
        return await self._transfer(request, context, push=False)

    async def Push(self, request, context):  # noqa: N802, ANN001, ANN201
        return await self._transfer(request, context, push=True)

    async def TransferExtents(self, request, context):  # noqa: N802, ANN001, ANN201
        return await self._transfer(request, context, push=request.write, method="TransferExtents",
                                    order_of=lambda: convert.extents_from_pb(request))

    async def _transfer(self, request: datadist_pb2.TransferRequest | datadist_pb2.ExtentTransferRequest,
                        context, push: bool, method: str = "",  # noqa: ANN001
                        order_of: Callable[[], TransferOrder | ExtentOrder] | None = None
                        ) -> datadist_pb2.TransferResponse:
        """Pull/Push (and HIXL's TransferExtents, ``order_of``): the order entry the attach socket shares
        (``start_transfer``: the checks, the one transfer path, the error count) with the order of the protobuf
        request; a failure ends the call with its status."""
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[tuple[int, int, str, str]] = loop.create_future()

        def settle(result: tuple[int, int, str, str]) -> None:
            if not outcome.done():   # the call was cancelled meanwhile
                outcome.set_result(result)

        def done(status: int, nbytes: int, transport: str, why: str) -> None:   # any thread (``start_transfer``)
            try:
                loop.call_soon_threadsafe(settle, (status, nbytes, transport, why))
            except RuntimeError:   # the loop is closed: the daemon is stopping
                pass

        start_transfer(self.node, self._session(context), request.engine_id,
                       order_of or (lambda: convert.order_from_pb(request)), push=push, done=done,
                       metrics=self.metrics, admin=self.admin, method=method)
        status, nbytes, transport, why = await outcome
        if status:
            await abort_with(context, DataDistError(StatusCode(status), why))
        return datadist_pb2.TransferResponse(bytes=nbytes, transport=transport)

    @guarded
    async def SendNotify(self, request, context):  # noqa: N802, ANN001, ANN201
        slot = self._slot(context, request.engine_id)
        await slot.links.notify(request.remote_cluster_id, request.name, request.msg,
                                request.timeout_ms if request.HasField("timeout_ms") else None)
        return EMPTY

    @guarded
    async def GetNotifies(self, request, context):  # noqa: N802, ANN001, ANN201
        slot = self._slot(context, request.engine_id)
        return datadist_pb2.NotifyList(notifies=[datadist_pb2.Notify(name=name, msg=msg)
                                                 for name, msg in slot.engine.notifies.take()])

    @guarded
    async def CheckLinkStatus(self, request, context):  # noqa: N802, ANN001, ANN201
        slot = self._slot(context, request.engine_id)
        await slot.links.check_link(request.remote_cluster_id,
                                    request.timeout_ms if request.HasField("timeout_ms") else None)
        return EMPTY

    async def TransferCacheAsync(self, request_iterator, context):  # noqa: N802, ANN001, ANN201
        """Layer-wise push: the first message describes the task, then one message per ready layer."""
        task: LayerPush | None = None
        try:
            first = await request_iterator.__anext__()
            require(first.WhichOneof("msg") == "start", "the first message of a layer-wise transfer must be start")
            start = first.start
            slot = self._slot(context, start.engine_id)
            targets = tuple(convert.layer_target_from_pb(t) for t in start.targets)
            desc = slot.engine.entry(start.src_cache_id).desc
            task = LayerPush(slot.links, start.src_cache_id, LayerTask(
                desc, False, targets, tuple(start.src_block_indices), tuple(start.dst_block_indices),
                start.dst_block_memory_size), start.timeout_ms if start.HasField("timeout_ms") else None)
        except StopAsyncIteration:
            return
        except DataDistError as exc:
            await abort_with(context, exc)
            return
        try:
            yield datadist_pb2.LayerTransferEvent(accepted=True)
            async for msg in request_iterator:
                which = msg.WhichOneof("msg")
                events = (await task.ready(msg.ready_layer) if which == "ready_layer"
                          else task.abort(msg.abort_layer) if which == "abort_layer" else [])
                for ev in events:
                    yield datadist_pb2.LayerTransferEvent(target=ev.target, layer=ev.layer, status=ev.status,
                                                          final=ev.final, message=ev.message)
                if task.done:
                    return
        finally:
            task.close()

    # ---- diagnostics -----------------------------------------------------------------------------

    def _slots(self, context, engine_id: int) -> list[EngineSlot]:  # noqa: ANN001
        """What a diagnostics call shows: one engine, or all the caller may see (own ones; every one on admin)."""
        if engine_id:
            return [self._slot(context, engine_id)]
        if self.admin:
            return list(self.node.engines.values())
        session = self._session(context)
        return [slot for slot in self.node.engines.values() if session is not None and slot.session is session]

    @guarded
    async def GetStatus(self, request, context):  # noqa: N802, ANN001, ANN201
        view = self.node.snapshot(self._slots(context, request.engine_id))
        status = datadist_pb2.DaemonStatus(version=view.version, backend=view.backend, transport=view.transport,
                                           uptime_seconds=view.uptime_seconds, socket=self.socket_path,
                                           peer_security=view.peer_security)
        for ev in view.engines:
            e = status.engines.add(engine_id=ev.engine_id, cluster_id=ev.cluster_id, role=ev.role,
                                   listen_address=ev.listen_address, caches=ev.caches, links=len(ev.links),
                                   pid=ev.pid, uid=ev.uid)
            for pool in ev.pools:
                e.pools.add(placement=pool.placement, capacity=pool.capacity, used=pool.used)
        return status

    @guarded
    async def ListLinks(self, request, context):  # noqa: N802, ANN001, ANN201
        out = datadist_pb2.LinkList()
        for ev in self.node.snapshot(self._slots(context, request.engine_id)).engines:
            for link in ev.links:
                out.links.add(engine_id=ev.engine_id, local_cluster_id=ev.cluster_id,
                              remote_cluster_id=link.remote_cluster, state=link.state, transport=link.transport,
                              peer_address=link.peer_address, data_endpoint=link.data_endpoint,
                              streams=link.streams, initiator=link.initiator, bytes_in=link.bytes_in,
                              bytes_out=link.bytes_out)
        return out

    @guarded
    async def ListCaches(self, request, context):  # noqa: N802, ANN001, ANN201
        out = datadist_pb2.CacheList()
        for slot in self._slots(context, request.engine_id):
            group = out.engines.add(engine_id=slot.engine_id, cluster_id=slot.engine.cluster_id)
            for entry in slot.engine.registry.entries():
                group.caches.append(cache_info(entry, slot))
        return out


def _check_counts(request: datadist_pb2.AllocateCacheRequest | datadist_pb2.RegisterCacheRequest) -> None:
    """O(1) bounds before any per-item conversion: an outsized list must not stall the daemon's event loop."""
    rows = request.desc.shape[0] if len(request.desc.shape) else 0
    require(len(request.cache_keys) <= max(rows, 0),
            f"{len(request.cache_keys)} cache keys for a batch size of {rows}")


def _too_many_clusters(n: int) -> datadist_pb2.LinkClustersResponse:
    """Refused before converting a list of any length (``links.refuse_too_many``)."""
    code, codes, reasons = refuse_too_many(n)
    return datadist_pb2.LinkClustersResponse(status=code, statuses=codes, reasons=reasons)
