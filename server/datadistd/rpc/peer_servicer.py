"""The daemon-to-daemon ``Peer`` service of one listening engine."""

from __future__ import annotations

import asyncio

from datadist.v1 import common_pb2, peer_pb2, peer_pb2_grpc

from ..core.errors import DataDistError, StatusCode, require
from ..core.types import CacheKeyRef, IdIndexRef
from ..metrics import DaemonMetrics
from ..node import EngineSlot
from ..peering import PROTOCOL_VERSION
from . import convert
from .errors import abort_with, guarded
from .front import PeerFront

EMPTY = common_pb2.Empty()


def _refuse_oversized(request, kind: type) -> None:  # noqa: ANN001
    """``rpc.server`` hands an unauthenticated request over ``MAX_UNAUTHENTICATED_BYTES`` over unparsed."""
    if not isinstance(request, kind):
        raise DataDistError(StatusCode.LLM_LINK_FAILED,
                            f"{kind.__name__} of {request.size} bytes refused: an unauthenticated request is at "
                            f"most {request.limit} bytes")


class PeerServicer(peer_pb2_grpc.PeerServicer):
    def __init__(self, slot: EngineSlot, metrics: DaemonMetrics | None = None, front: PeerFront | None = None) -> None:
        self.slot = slot
        self.metrics = metrics
        self.front = front      # told when a connection proved the secret (see rpc/front.py)

    @property
    def links(self):  # noqa: ANN201
        return self.slot.links

    @guarded
    async def Challenge(self, request, context):  # noqa: N802, ANN001, ANN201
        _refuse_oversized(request, peer_pb2.ChallengeRequest)
        source = self.front.admit_challenge(context.peer()) if self.front is not None else ""
        challenge = self.links.serve_challenge(request.client_cluster_id, request.server_cluster_id, source)
        return peer_pb2.ChallengeResponse(protocol_version=PROTOCOL_VERSION, challenge=challenge)

    @guarded
    async def Handshake(self, request, context):  # noqa: N802, ANN001, ANN201
        _refuse_oversized(request, peer_pb2.HandshakeRequest)
        answer = await self.links.serve_handshake(convert.offer_from_pb(request))
        if self.front is not None:
            self.front.authenticate(context.peer())
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
        spec = convert.spec_from_pb(request)   # counted in the metrics by the link manager (every path)
        nbytes, release = await self.links.serve_read(request.session, request.transfer_id, spec, request.timeout_ms)
        return peer_pb2.ReadResponse(bytes=nbytes, release_needed=release)

    @guarded
    async def Release(self, request, context):  # noqa: N802, ANN001, ANN201
        key = convert.key_from_pb(request.key)
        require(isinstance(key, (CacheKeyRef, IdIndexRef)), "only CacheKey / CacheKeyByIdAndIndex pulls are released")
        self.links.serve_release(request.session, key, request.tensor_start, request.tensor_count)  # type: ignore[arg-type]
        return EMPTY

    @guarded
    async def OpenWrite(self, request, context):  # noqa: N802, ANN001, ANN201
        tids = self.links.serve_open_write(request.session, convert.specs_from_write_pb(request), request.timeout_ms,
                                           request.hold_ms)
        return peer_pb2.WriteResponse(**convert.ids_to_pb(tids))

    @guarded
    async def CommitWrite(self, request, context):  # noqa: N802, ANN001, ANN201
        await self.links.serve_commit_write(request.session, convert.ids_from_pb(request), request.timeout_ms)
        return EMPTY

    async def Reverse(self, request_iterator, context):  # noqa: N802, ANN001, ANN201
        """The reverse control path of a link (see ``datadistd.reverse``): commands out, replies in."""
        try:
            first = await request_iterator.__anext__()
            hub = self.links.attach_reverse(first.session)
            if self.front is not None:
                self.front.authenticate(context.peer())
        except StopAsyncIteration:
            return
        except DataDistError as exc:
            await abort_with(context, exc)
            return

        async def replies() -> None:
            async for msg in request_iterator:
                hub.on_reply(convert.reverse_reply_from_pb(msg))
            hub.close("the linking side closed the reverse path")

        reader = asyncio.get_running_loop().create_task(replies())
        try:
            while True:
                cmd = await hub.next_command()
                if cmd is None:
                    return
                yield convert.reverse_command_to_pb(cmd)
        finally:
            reader.cancel()
            hub.close("reverse stream ended")
