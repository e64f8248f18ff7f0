"""``HcclTransport``: a one-sided transport (``transport.onesided``) with an HCCL agent (see the package doc)."""

from __future__ import annotations

import os
from typing import Any

from datadist_ascend import AscendError
from datadist_ascend.acl import acl
from datadist_ascend.hccl import hccl

from ...core.errors import DataDistError
from ..onesided import GrantedReads, LinkPeer
from .agent import DONE, HcclAgent

__all__ = ["HcclTransport", "SCHEME"]

SCHEME = "hccl+tcp"


class HcclTransport(GrantedReads):
    """Links whose bytes move by ``HcclBatchPut`` between NPU memories (``[transport] name = "hccl"``)."""

    name = "hccl"
    scheme = SCHEME

    def __init__(self, device_id: int = 0, device_ip: str = "", server_id: str = "", physical_id: int = -1,
                 traffic_class: int = -1, service_level: int = -1, prepare_timeout: float = 10.0, retries: int = 1,
                 **tcp: Any) -> None:
        """An engine's transport on logical NPU ``device_id``: its communicators carry the engine's CANN options
        (``TransportSection.settings``); ``server_id`` / ``physical_id`` / ``device_ip`` from ``llm.LocalCommRes``
        when it names them (``physical_id`` then must be the NPU's), else the host address and the runtime's id."""
        self.device_id = device_id
        self.device_ip = device_ip
        self.server_id = server_id
        self.physical_id = physical_id
        self.traffic_class = None if traffic_class < 0 else traffic_class
        self.service_level = None if service_level < 0 else service_level
        self.prepare_timeout = prepare_timeout
        self.retries = retries
        self._host = str(tcp.get("host") or "127.0.0.1")
        super().__init__(backend="HCCL", **tcp)

    def _check_engine(self) -> None:
        try:
            acl()
            hccl()
        except AscendError as exc:
            raise DataDistError(exc.status, f"the hccl transport needs Ascend CANN: {exc}") from None

    def _new_agent(self) -> HcclAgent:
        return HcclAgent(f"datadistd-{os.getpid()}-{os.urandom(4).hex()}", self.device_id,
                         server_id=self.server_id or self._host, device_ip=self.device_ip or self._host,
                         traffic_class=self.traffic_class, service_level=self.service_level,
                         prepare_timeout=self.prepare_timeout, retries=self.retries,
                         physical_id=None if self.physical_id < 0 else self.physical_id)

    @property
    def label(self) -> str:
        return f"hccl:device{self.device_id}"

    def _bind_agent(self, peer: LinkPeer, name: str, metadata: bytes) -> None:
        agent = self._agent()
        assert isinstance(agent, HcclAgent)
        if agent.identity_name(metadata) != name:   # before its communicator retires that agent's
            raise ValueError(f"peer metadata is not of agent {name!r}")
        super()._bind_agent(peer, name, metadata)
        agent.route(name, lambda message: peer.send(DONE + message))

    def _on_extra(self, peer: LinkPeer, payload: bytes) -> None:
        if payload[:1] != DONE or peer.agent_name is None:
            raise ValueError(f"unknown message {payload[:1]!r}")
        agent = self._agent()
        assert isinstance(agent, HcclAgent)
        agent.deliver(peer.agent_name, payload[1:])
        self.poll()
