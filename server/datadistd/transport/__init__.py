"""Data-plane transports: move bytes between daemons' memory.

``get_transport(name)`` loads by name, lazily: ``tcp`` (default), ``local`` (same daemon,
plain memory copies), ``hccl`` (Ascend; not verifiable here).
"""

from __future__ import annotations

from ..plugins import load_named
from .base import Channel, Receipt, Transport

__all__ = ["Channel", "Receipt", "Transport", "TRANSPORTS", "get_transport"]

TRANSPORTS: dict[str, str] = {
    "tcp": "datadistd.transport.tcp:TcpTransport",
    "local": "datadistd.transport.local:LocalTransport",
    "hccl": "datadistd.transport.hccl:HcclTransport",
}


def get_transport(name: str, **kwargs: object) -> Transport:
    return load_named("transport", TRANSPORTS, name, **kwargs)
