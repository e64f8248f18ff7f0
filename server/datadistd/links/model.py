"""The records of the link code: link states, a link's two ends, cluster specs."""

from __future__ import annotations

import abc
import enum
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence

from ..core.errors import StatusCode
from ..engine.engine import Engine
from ..guard.quota import LinkUsage
from ..transport.base import Channel, Receipt
from .wire.framecalls import FrameCalls

#: clusters one link_clusters / unlink_clusters call may name (CANN: LLM_CLUSTER_NUM_EXCEED_LIMIT past it)
MAX_CLUSTERS_PER_CALL = 16


def too_many_clusters(n: int) -> str:
    """Why a call naming ``n`` clusters (more than ``MAX_CLUSTERS_PER_CALL``) was refused, said to each one."""
    return (f"{n} clusters in one call, more than the limit of {MAX_CLUSTERS_PER_CALL} per link_clusters or "
            f"unlink_clusters call (LLM_CLUSTER_NUM_EXCEED_LIMIT): nothing was done; split the list into calls of "
            f"at most {MAX_CLUSTERS_PER_CALL}")


def refuse_too_many(n: int) -> tuple[int, list[int], list[str]]:
    """The answer to a call naming ``n`` clusters, more than ``MAX_CLUSTERS_PER_CALL``: refused whole (the overall
    code, one per cluster) and one reason that stands for every cluster (so the answer of a huge list stays as
    small as its codes)."""
    code = int(StatusCode.LLM_CLUSTER_NUM_EXCEED_LIMIT)
    return code, [code] * n, [too_many_clusters(n)]


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


@dataclass(kw_only=True)
class Link(abc.ABC):
    """What every link has, whichever kind (``OutboundLink``, ``InboundLink``, ``LocalLink``): its other
    engine, its link nonce, its state and counters. Only the three kinds are made."""

    remote_cluster: int
    transport: str                                  # "tcp", "nixl:UCX(...)", "local": ListLinks, metrics
    link_nonce: bytes
    address: str = ""
    data_endpoint: str = ""
    state: LinkState = LinkState.ESTABLISHED
    reason: str = ""
    inflight: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    last_seen: float = field(default_factory=time.monotonic)
    pulls: int = 0                                  # pulls in flight (LLM_LINK_BUSY rules, docs/spec.md §1.4)
    layerwise: int = 0                              # transfer_cache_async tasks using this link
    usage: LinkUsage = field(default_factory=LinkUsage)   # what the other end holds here ([quota] link_*)
    peer: str = ""                                  # the other daemon's source address (admission.source_key)
    peer_daemon: bytes = b""                        # the other daemon's id from the handshake (``liveness``)
    unlinked_by_peer: bool = False                  # the other end's unlink call arrived (its answer may be running)
    unlinking: bool = False                         # this end is tearing it down (its unlink call may be out)
    # reads answered by the data reader threads (``readview``, ``OwnerCalls._read_here``): bytes and count,
    # under ``reader_lock`` (``bytes_out`` stays the event loop's)
    reader_bytes_out: int = 0
    reader_bytes_in: int = 0                        # small pushes written by the reader threads (``_write_here``)
    reader_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def bytes_sent(self) -> int:
        """Bytes this end sent the other over the link: the event loop's count and the reader threads'."""
        return self.bytes_out + self.reader_bytes_out

    @property
    def bytes_received(self) -> int:
        """Bytes the other end sent this one over the link: the event loop's count and the reader threads'."""
        return self.bytes_in + self.reader_bytes_in

    @property
    def principal(self) -> str:
        """Whose turn the other end's owner calls take on the daemon's threads (``executor.Threads``): its daemon's
        address, over all its links, so many links from one peer still hold one share."""
        return f"peer {self.peer}"

    @property
    @abc.abstractmethod
    def initiator(self) -> bool:
        """Whether this engine is the linking end (it called ``link_clusters``)."""

    @property
    def streams(self) -> int:
        """Connections of the data channel this end opened (0 at a serving or same-daemon end)."""
        return 0

    def begin_layerwise(self) -> None:
        """A ``transfer_cache_async`` task uses this link (pulls on it are refused meanwhile)."""
        self.layerwise += 1

    def end_layerwise(self) -> None:
        self.layerwise = max(0, self.layerwise - 1)


@dataclass(kw_only=True)
class OutboundLink(Link):
    """This engine linked to an engine of another daemon: the data channel it opened with ``token`` carries
    the bytes and, as frames, the owner calls both ways (``calls``: this end's calls on the other)."""

    channel: Channel
    token: bytes
    calls: FrameCalls

    @property
    def initiator(self) -> bool:
        return True

    @property
    def streams(self) -> int:
        return self.channel.streams


@dataclass(kw_only=True)
class InboundLink(Link):
    """An engine of another daemon linked to this one: its data channel is the one the linking daemon opened
    with ``token`` (found through the transport); ``calls``: this end's owner calls on the other, as frames."""

    token: bytes
    calls: FrameCalls

    @property
    def initiator(self) -> bool:
        return False


@dataclass(kw_only=True)
class LocalLink(Link):
    """Both engines live in this daemon: one ``LocalLink`` at each end, each naming the other end's link
    manager; transfers are memory copies, no channel, no peer."""

    local_peer: "LocalEnd"                          # the other engine's link table
    linking: bool                                   # this is the end that called link_clusters

    @property
    def initiator(self) -> bool:
        return self.linking


class LocalEnd(Protocol):
    """What a same-daemon link sees of the other engine: its engine and its link tables (``table.LinkTable``)."""

    engine: Engine
    links: dict[int, "LinkingEnd"]
    served: dict[int, "ServingEnd"]

    def peer_went(self, cluster: int) -> None: ...


#: the links an engine set up (``LinkTable.links``) and the ones set up to it (``LinkTable.served``)
LinkingEnd = OutboundLink | LocalLink
ServingEnd = InboundLink | LocalLink
RemoteLink = OutboundLink | InboundLink
AnyLink = OutboundLink | InboundLink | LocalLink


@dataclass
class _PendingWrite:
    receipt: Receipt
    cache_id: int
    deadline: float
    link: Link
    blocks: int = 0
    nbytes: int = 0                     # booked to ``link.usage`` until the write ends


def _overall(codes: Sequence[int]) -> int:
    for code in codes:
        if code != StatusCode.LLM_SUCCESS:
            return code
    return int(StatusCode.LLM_SUCCESS)
