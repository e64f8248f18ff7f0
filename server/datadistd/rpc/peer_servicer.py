"""The daemon-to-daemon ``Peer`` service of one listening engine."""

from __future__ import annotations

from datadist.v1 import common_pb2, peer_pb2, peer_pb2_grpc

from ..core.errors import require
from ..core.types import CacheKeyRef, IdIndexRef
from ..node import EngineSlot
from . import convert
from .errors import guarded

EMPTY = common_pb2.Empty()


class PeerServicer(peer_pb2_grpc.PeerServicer):
    def __init__(self, slot: EngineSlot) -> None:
        self.slot = slot

    @property
    def links(self):  # noqa: ANN201
        return self.slot.links

    @guarded
    async def Handshake(self, request, context):  # noqa: N802, ANN001, ANN201
        answer = await self.links.serve_handshake(convert.offer_from_pb(request))
        return convert.answer_to_pb(answer)

    @guarded
    async def Unlink(self, request, context):  # noqa: N802, ANN001, ANN201
        self.links.serve_unlink(request.session)
        return EMPTY

    @guarded
    async def Ping(self, request, context):  # noqa: N802, ANN001, ANN201
        self.links.session_link(request.session)
        return EMPTY

    @guarded
    async def Read(self, request, context):  # noqa: N802, ANN001, ANN201
        nbytes, release = await self.links.serve_read(request.session, request.transfer_id,
                                                      convert.spec_from_pb(request), request.timeout_ms)
        return peer_pb2.ReadResponse(bytes=nbytes, release_needed=release)

    @guarded
    async def Release(self, request, context):  # noqa: N802, ANN001, ANN201
        key = convert.key_from_pb(request.key)
        require(isinstance(key, (CacheKeyRef, IdIndexRef)), "only CacheKey / CacheKeyByIdAndIndex pulls are released")
        self.links.serve_release(request.session, key, request.tensor_start, request.tensor_count)  # type: ignore[arg-type]
        return EMPTY

    @guarded
    async def OpenWrite(self, request, context):  # noqa: N802, ANN001, ANN201
        tid = self.links.serve_open_write(request.session, convert.spec_from_pb(request), request.timeout_ms)
        return peer_pb2.WriteResponse(transfer_id=tid)

    @guarded
    async def CommitWrite(self, request, context):  # noqa: N802, ANN001, ANN201
        await self.links.serve_commit_write(request.session, request.transfer_id, request.timeout_ms)
        return EMPTY
