"""One way to read the node: frozen records of its engines, pools, links and listeners.

``Node.snapshot(slots)`` builds them on the event loop, in one pass; the status RPCs
(``GetStatus``/``ListLinks``, hence ``datadistctl`` and grpcurl) and the Prometheus collector render
them. Nothing here reaches back into the live objects, so a reader can neither change the node nor
see it half-updated, and a new field is added in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PoolView", "LinkView", "ListenerView", "EngineView", "NodeView"]


@dataclass(frozen=True)
class PoolView:
    placement: int          # core.types.Placement value
    placement_name: str
    capacity: int
    used: int


@dataclass(frozen=True)
class LinkView:
    remote_cluster: int
    state: str              # "established" | "broken"
    transport: str
    initiator: bool         # this engine set the link up
    peer_address: str
    data_endpoint: str
    streams: int
    inflight: int
    bytes_in: int
    bytes_out: int


@dataclass(frozen=True)
class ListenerView:
    """A peer-reachable listener of an engine and its admission books (``admission.Admission.stats``)."""

    kind: str               # "peer" (gRPC front) | "data" (data plane)
    address: str
    preauth: int
    authenticated: int
    evicted: int
    expired: int
    refused: int


@dataclass(frozen=True)
class EngineView:
    engine_id: int
    cluster_id: int
    role: int
    role_name: str
    listen_address: str
    pid: int
    uid: int
    caches: int
    pools: tuple[PoolView, ...]
    links: tuple[LinkView, ...]
    listeners: tuple[ListenerView, ...]


@dataclass(frozen=True)
class NodeView:
    version: str
    backend: str
    transport: str
    peer_security: str      # "mtls" | "plaintext"
    uptime_seconds: float
    engines: tuple[EngineView, ...]
