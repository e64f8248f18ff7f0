"""Data-plane transports: move bytes between daemons' memory.

``get_transport(name)`` loads by name, lazily: ``tcp`` (default), ``nixl`` (NIXL: RDMA fabrics, over
a tcp channel for everything but the bytes), ``hccl`` (Ascend; not verifiable here). Same-daemon links
need no transport: they are memory copies (``links/setup.py``, ``memory/copy.py``).
"""

from __future__ import annotations

from ..core.plugins import load_named
from .base import Channel, Receipt, Transport

__all__ = ["Channel", "Receipt", "Transport", "TRANSPORTS", "get_transport"]

TRANSPORTS: dict[str, str] = {
    "tcp": "datadistd.transport.tcp:TcpTransport",
    "hccl": "datadistd.transport.hccl:HcclTransport",
    "nixl": "datadistd.transport.nixl:NixlTransport",
}


def get_transport(name: str, **kwargs: object) -> Transport:
    return load_named("transport", TRANSPORTS, name, **kwargs)
