"""The records of the link code: link states, a link's two ends, cluster specs, what it needs of its daemon."""

from __future__ import annotations

import asyncio
import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from ..core.errors import StatusCode
from ..metrics import DaemonMetrics
from ..peering import (
    PeerClient,
)
from ..reverse import (
    CallCodec,
    FrameCalls,
    ReverseHub,
)
from ..transport.base import Channel, Receipt

if TYPE_CHECKING:
    from .core import LinkCore


MAX_CLUSTERS_PER_CALL = 16


class LinkState(str, enum.Enum):
    ESTABLISHED = "established"
    BROKEN = "broken"


@dataclass(frozen=True)
class ClusterSpec:
    remote_cluster_id: int
    remote_ip: str = ""
    remote_port: int = 0
    local_ip: str = ""

    @property
    def address(self) -> str:
        host = f"[{self.remote_ip}]" if ":" in self.remote_ip else self.remote_ip
        return f"{host}:{self.remote_port}"


@dataclass
class Link:
    remote_cluster: int
    initiator: bool
    transport: str
    session: bytes
    address: str = ""
    data_endpoint: str = ""
    peer: PeerClient | None = None
    channel: Channel | None = None
    token: bytes = b""
    local_peer: "LinkCore | None" = None
    state: LinkState = LinkState.ESTABLISHED
    reason: str = ""
    inflight: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    last_seen: float = field(default_factory=time.monotonic)
    heartbeat: "asyncio.Task[None] | None" = None
    reverse: "ReverseHub | None" = None             # serving end: its owner calls to the linking end
    reverse_task: "asyncio.Task[None] | None" = None  # linking end: answers the serving end's calls
    pulls: int = 0                                  # pulls in flight (LLM_LINK_BUSY rules, docs/spec.md §1.4)
    layerwise: int = 0                              # transfer_cache_async tasks using this link
    frames: "FrameCalls | None" = None              # owner calls as data-channel frames (both ends; protocol 2)

    def begin_layerwise(self) -> None:
        """A ``transfer_cache_async`` task uses this link (pulls on it are refused meanwhile)."""
        self.layerwise += 1

    def end_layerwise(self) -> None:
        self.layerwise = max(0, self.layerwise - 1)


@dataclass
class _PendingWrite:
    receipt: Receipt
    cache_id: int
    deadline: float
    link: Link
    blocks: int = 0


class NodeContext(Protocol):
    """What a link manager needs from its daemon."""

    secret: bytes
    version: str
    streams: int
    heartbeat_seconds: float
    peer_connector: Callable[[str], PeerClient]
    call_codec: "CallCodec | None"
    metrics: "DaemonMetrics | None"     # owner-side transfers are counted here, whichever path asked

    def local_links_at(self, address: str) -> "LinkCore | None": ...


def _overall(codes: Sequence[int]) -> int:
    for code in codes:
        if code != StatusCode.LLM_SUCCESS:
            return code
    return int(StatusCode.LLM_SUCCESS)
