"""The daemon-to-daemon ``Peer`` service of one listening engine: what happens before a link's data channel
exists (``Challenge``, ``Handshake``). Everything after the handshake is frames on that channel
(``datadistd.links.wire.ownercalls``)."""

from __future__ import annotations

from datadist.v1 import peer_pb2, peer_pb2_grpc

from ...core.errors import DataDistError, StatusCode
from ...links.wire.peering import PROTOCOL_VERSION, check_version
from ...node.node import EngineSlot
from ...ops.metrics import DaemonMetrics
from . import convert
from .errors import guarded
from .front import PeerFront


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
        self.front = front      # told when a connection proved the secret (see api/grpc/front.py)

    @property
    def links(self):  # noqa: ANN201
        return self.slot.links

    @guarded
    async def Challenge(self, request, context):  # noqa: N802, ANN001, ANN201
        _refuse_oversized(request, peer_pb2.ChallengeRequest)
        check_version(request.protocol_version, "the linking peer")
        asker = self.front.admit_challenge(context.peer()) if self.front is not None else None
        challenge = self.links.serve_challenge(request.client_cluster_id, request.server_cluster_id, asker)
        return peer_pb2.ChallengeResponse(protocol_version=PROTOCOL_VERSION, challenge=challenge)

    @guarded
    async def Handshake(self, request, context):  # noqa: N802, ANN001, ANN201
        _refuse_oversized(request, peer_pb2.HandshakeRequest)
        source = self.front.source_of(context.peer()) if self.front is not None else ""
        answer = await self.links.serve_handshake(convert.offer_from_pb(request), source)
        if self.front is not None:
            self.front.authenticate(context.peer())
        return convert.answer_to_pb(answer)
