"""``NixlTransport``: bytes by NIXL WRITE, everything else over a tcp channel (see the package doc; the link
machinery is ``transport.onesided``'s, shared with ``hccl``)."""

from __future__ import annotations

import os
from typing import Any

from ...guard.admission import AdmissionLimits
from ..onesided import PublishedTables
from .agent import Agent
from .ucx import load_api, ucx_transports

__all__ = ["NixlTransport", "SCHEME"]

SCHEME = "nixl+tcp"


class NixlTransport(PublishedTables):
    """Links whose bytes move by NIXL (``[transport] name = "nixl"``): see the package doc. A pull reads the rows
    the owner published to the link (``onesided.tables``)."""

    name = "nixl"
    scheme = SCHEME
    progress_window = 2.0

    def __init__(self, host: str = "127.0.0.1", port: int = 0, backend: str = "UCX", chunk_size: int = 4 << 20,
                 connect_timeout: float = 5.0, admission: AdmissionLimits | None = None, **tcp: Any) -> None:
        super().__init__(host, port, backend, chunk_size, connect_timeout, admission, **tcp)

    def _check_engine(self) -> None:
        load_api()

    def _new_agent(self) -> Agent:
        return Agent(f"datadistd-{os.getpid()}-{os.urandom(4).hex()}", self.backend)

    @property
    def label(self) -> str:
        return f"nixl:{self.backend}(UCX_TLS={ucx_transports()})" if self.backend == "UCX" else f"nixl:{self.backend}"
