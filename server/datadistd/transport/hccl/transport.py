"""``HcclTransport``: a one-sided transport (``transport.onesided``) with an HCCL agent (see the package doc)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from datadist_ascend import AscendError
from datadist_ascend.acl import acl
from datadist_ascend.hccl import hccl

from ...core.errors import DataDistError
from ..onesided import LinkPeer, PublishedTables
from .agent import DONE, HcclAgent

__all__ = ["HcclTransport", "SCHEME", "npu_address"]

SCHEME = "hccl+tcp"
#: how long ``hccn_tool -i N -ip -g`` may take
HCCN_TOOL_SECONDS = 10.0


def npu_address(physical: int, configured: str = "", hccn_conf: str = "/etc/hccn.conf",
                hccn_tool: str = "") -> tuple[str, str]:
    """The NIC address of physical NPU ``physical`` and where it came from, as CANN derives it (hixl
    ``hixl_utils.cc`` ``GetDeviceIp``): ``configured`` first (``[transport] hccl_device_ip``: one address, or a list
    by physical id), then ``hccn_conf``'s ``address_<physical>=``, else -- only when that file does not exist --
    ``hccn_tool -i <physical> -ip -g`` (``hccn_tool`` at its path, else on ``PATH``); ``("", why)`` when none
    names one (the link says so: ``check_device_ip``)."""
    ips = [ip.strip() for ip in configured.split(",")] if configured.strip() else []
    if len(ips) == 1 or 0 <= physical < len(ips) > 1:
        return ips[0 if len(ips) == 1 else physical], "[transport] hccl_device_ip"
    conf = Path(hccn_conf)
    if conf.exists():
        key = f"address_{physical}="
        try:
            for line in conf.read_text().splitlines():
                if line.startswith(key):
                    return line[len(key):].strip(), f"{hccn_conf} {key[:-1]}"
        except OSError as exc:
            return "", f"{hccn_conf}, which cannot be read ({exc.strerror})"
        return "", f"{hccn_conf}, which has no {key[:-1]}"
    tool = hccn_tool if hccn_tool and os.access(hccn_tool, os.X_OK) else shutil.which("hccn_tool")
    what = f"hccn_tool -i {physical} -ip -g"
    if tool is None:
        return "", f"nothing: no hccl_device_ip, no {hccn_conf} and no hccn_tool"
    try:
        out = subprocess.run([tool, "-i", str(physical), "-ip", "-g"], capture_output=True, text=True,
                             timeout=HCCN_TOOL_SECONDS).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "", f"`{what}`, which failed ({exc})"
    for line in out.splitlines():
        if line.startswith("ipaddr:"):
            return line[len("ipaddr:"):].strip(), f"`{what}`"
    return "", f"`{what}`, which names no ipaddr"


class HcclTransport(PublishedTables):
    """Links whose bytes move by ``HcclBatchPut`` between NPU memories (``[transport] name = "hccl"``). A pull reads
    rows of the table the owner published to the link (``onesided.tables``) by ``HcclBatchGet``, on a worker thread
    (the get and its stream's synchronisation are one call: nothing to post from the event loop)."""

    name = "hccl"
    scheme = SCHEME
    posts_reads = False
    unpublished = ("the hccl transport moves NPU memory of the engine's device only (memory backend acl, DEVICE "
                   "caches); the peer's cache is not: use transport tcp")

    def __init__(self, device_id: int = 0, device_ip: str = "", server_id: str = "", physical_id: int = -1,
                 traffic_class: int = -1, service_level: int = -1, prepare_timeout: float = 10.0, retries: int = 1,
                 device_ips: str = "", hccn_conf: str = "/etc/hccn.conf", hccn_tool: str = "", device_port: int = 0,
                 **tcp: Any) -> None:
        """An engine's transport on the daemon's logical NPU ``device_id``: its communicators carry the engine's CANN
        options (``TransportSection.settings``); ``server_id`` / ``physical_id`` / ``device_ip`` from
        ``llm.LocalCommRes`` when it names them (``physical_id`` then must be the NPU's), else the listen address,
        the runtime's physical id and the NPU's NIC address (``npu_address``: ``device_ips``, ``hccn_conf``,
        ``hccn_tool``); its communicators listen on ``device_port`` of the NIC (0: HCCL's 16666)."""
        self.device_id = device_id
        self.device_ip = device_ip
        self.device_ips = device_ips
        self.hccn_conf = hccn_conf
        self.hccn_tool = hccn_tool
        self.device_port = device_port
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
        ip, source = self.device_ip, "the engine's llm.LocalCommRes"
        if not ip:
            try:
                physical = acl().physical_id(self.device_id)
            except AscendError as exc:
                raise DataDistError(exc.status, f"hccl: device {self.device_id}: {exc}") from None
            ip, source = npu_address(physical, self.device_ips, self.hccn_conf, self.hccn_tool)
        return HcclAgent(f"datadistd-{os.getpid()}-{os.urandom(4).hex()}", self.device_id,
                         server_id=self.server_id or self._host, device_ip=ip, device_ip_source=source,
                         traffic_class=self.traffic_class, service_level=self.service_level,
                         prepare_timeout=self.prepare_timeout, retries=self.retries,
                         physical_id=None if self.physical_id < 0 else self.physical_id,
                         device_port=self.device_port)

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
        """A notification the peer's agent sent after its put or get (``DONE``); else a table's message."""
        if payload[:1] != DONE:
            super()._on_extra(peer, payload)
            return
        if peer.agent_name is None:
            raise ValueError("a notification before the peer's agent")
        agent = self._agent()
        assert isinstance(agent, HcclAgent)
        agent.deliver(peer.agent_name, payload[1:])
        self.poll()
