"""The attach socket's control-plane messages (protobuf ``AttachRequest``): hello, memory by descriptor or IPC
key, pools, releases -- one handler, ``handle`` (``api/attach.py`` reads and answers the messages)."""

from __future__ import annotations

from typing import Protocol

from datadist.v1 import attach_pb2
from datadist_ascend.proof import possession_proof

from .. import __version__
from ..core.errors import DataDistError, StatusCode, require
from ..memory.base import DeviceBackend, DeviceRef, FdPiece, FdRef, KeyExport, MemoryRef
from ..node.node import Node
from ..node.sessions import WorkerSession

__all__ = ["PROTOCOL_VERSION", "handle"]

#: pulls and pushes as binary frames (datadist/fastframe.py), block lists past one datagram in continuation frames;
#: a hello announcing an older protocol is refused
PROTOCOL_VERSION = 4


class Greeted(Protocol):
    """What a message handler reads and sets of an attach connection."""

    session: WorkerSession
    greeted: bool


def handle(node: Node, conn: Greeted, request: attach_pb2.AttachRequest, fds: list[int]
           ) -> tuple[attach_pb2.AttachReply, int | None]:
    """One protobuf ``AttachRequest`` of ``conn``: the reply and the descriptor it hands over (or None); a
    ``DataDistError`` refuses it. The descriptors in ``fds`` are the handler's once it took them (cleared)."""
    which = request.WhichOneof("msg")
    session = conn.session
    if which != "import_memory":
        require(not fds, f"{which or 'this message'} carries no descriptors")
    if which == "hello":
        announced = request.hello.protocol_version
        require(not 0 < announced < PROTOCOL_VERSION,
                f"attach protocol {announced} is not served: this daemon speaks {PROTOCOL_VERSION} (pulls and "
                "pushes as binary frames, datadist/fastframe.py); update the client")
        conn.greeted = True
        cred = session.cred
        return attach_pb2.AttachReply(welcome=attach_pb2.Welcome(
            capability=session.capability, uid=cred.uid, gid=cred.gid, pid=cred.pid,
            daemon_version=__version__, protocol_version=PROTOCOL_VERSION,
            memory_backend=node.backend.name,
            device_id=node.physical_device(backend.device_id) if isinstance(backend := node.backend, DeviceBackend)
            else 0,
            bare_tgid=backend.bare_tgid if isinstance(backend, DeviceBackend) else 0)), None
    require(conn.greeted, "the first attach message must be hello")
    if which == "import_memory":
        msg = request.import_memory
        if msg.device_key:
            require(not fds and not msg.pieces, "device memory comes as a key alone, with no descriptors")
            ref: MemoryRef = DeviceRef(msg.device_key, msg.device_id, msg.length,
                                       possession_proof(session.capability, msg.device_key))
        elif len(fds) != len(msg.pieces):
            raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                f"{len(msg.pieces)} memory pieces but {len(fds)} descriptors")
        else:
            pieces = tuple(FdPiece(fd, p.file_offset, p.length) for fd, p in zip(fds, msg.pieces, strict=True))
            uid = session.cred.uid    # booked once checked, before anything is mapped; the handle gives it back
            ref = FdRef(pieces, msg.offset, msg.length, lambda n, maps: node.quota.take(
                uid, imported_bytes=n, imported_mappings=maps))
        fds.clear()
        handle = node.backend.import_memory(ref)   # owns the descriptors from here on
        memory_id = next(node.sessions.memory_ids)
        session.add_memory(memory_id, handle)
        return attach_pb2.AttachReply(imported=attach_pb2.MemoryImported(
            memory_id=memory_id, mapped=handle.view() is not None)), None
    if which == "export_pool":
        msg = request.export_pool
        slot = node.owned_slot(session, msg.engine_id)
        pool = slot.engine.pool_named(msg.pool)
        if isinstance(pool, KeyExport):   # NPU memory: a key only this worker (as the driver knows it) imports
            backend = node.backend
            pid = session.cred.pid        # the kernel's word, where it is also the driver's (see attach.proto)
            if isinstance(backend, DeviceBackend) and not backend.pid_is_bare_tgid and msg.bare_tgid > 0:
                pid = msg.bare_tgid
            return attach_pb2.AttachReply(pool=attach_pb2.PoolExported(
                size=pool.capacity, device_key=pool.export_key(pid), device_id=node.physical_device(pool.device))), None
        return attach_pb2.AttachReply(pool=attach_pb2.PoolExported(size=pool.capacity)), pool.export_fd()
    if which == "release_memory":
        session.release_memory(request.release_memory.memory_id)
        return attach_pb2.AttachReply(), None
    raise DataDistError(StatusCode.LLM_PARAM_INVALID, "unknown attach message (pulls and pushes go as binary "
                                                      "frames: datadist/fastframe.py)")
