"""What an hccl agent tells its peer and checks of it: the rank table both ends build from the two identities (CANN's
version 1.0, or 1.2 on Atlas A3), the communicator's name, and the device-ip check that runs before HCCL sees an
address (docs/ascend.md, "Device identity")."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import socket
from typing import Sequence

from datadist.status import LLMStatusCode

from ...core.errors import DataDistError

__all__ = ["check_device_ip", "cluster_table", "comm_name", "host_address"]


def cluster_table(members: Sequence[dict[str, str]]) -> tuple[str, list[str]]:
    """The rank table of ``members`` -- each ``{"name", "server_id", "device_id", "device_ip"}``, with
    ``"device_port"``, ``"super_pod_id"`` and ``"super_device_id"`` where known -- and the agent names in rank order:
    servers sorted by id, devices in name order within a server, ranks counted in that order. Both daemons build the
    same. Version "1.2" with each device's ``super_device_id`` and the ``super_pod_list`` when every member names its
    super pod (an Atlas A3: hixl ``rank_table_generator_v2.cc``; the lower of two versions otherwise, as
    ``RankTableGeneratorFactory`` takes), else "1.0" (``rank_table_generator_v1.cc``)."""
    v12 = all(m.get("super_device_id") and m.get("super_pod_id") for m in members)
    servers: dict[str, list[dict[str, str]]] = {}
    for m in sorted(members, key=lambda m: m["name"]):
        servers.setdefault(m["server_id"], []).append(m)
    server_list: list[dict[str, object]] = []
    pods: dict[str, list[str]] = {}
    order: list[str] = []
    for server_id in sorted(servers):
        devices = []
        for m in servers[server_id]:
            device = {"device_id": m["device_id"], "device_ip": m["device_ip"]}
            if m.get("device_port"):
                device["device_port"] = m["device_port"]
            if v12:
                device["super_device_id"] = m["super_device_id"]
                if server_id not in pods.setdefault(m["super_pod_id"], []):
                    pods[m["super_pod_id"]].append(server_id)
            device["rank_id"] = str(len(order))
            devices.append(device)
            order.append(m["name"])
        server_list.append({"server_id": server_id, "device": devices})
    table: dict[str, object] = {"version": "1.2" if v12 else "1.0", "server_count": str(len(server_list)),
                                "server_list": server_list, "status": "completed"}
    if v12:
        table["super_pod_list"] = [{"super_pod_id": pod, "server_list": [{"server_id": s} for s in ids]}
                                   for pod, ids in sorted(pods.items())]
    return json.dumps(table, separators=(",", ":")), order


def host_address(address: str) -> bool:
    """``address`` is one of this host's own (its network stack can bind it): a host NIC's, never an NPU's -- an
    NPU's RoCE port is not a host interface."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.bind((address, 0))
        return True
    except (ValueError, OSError):
        return False


def check_device_ip(ip: str, source: str, physical: int, peer_ip: str | None = None) -> None:
    """Refuse, before HCCL sees it, a device ip HCCL could only fail on (a duplicate at init, the rest after
    Prepare's whole timeout): none, not an address, loopback, one of this host's own, or the peer's. The message
    names the address, where it came from and how to set it."""
    how = (f"set the NPU's own NIC address (hccn_tool -i {physical} -ip -g; /etc/hccn.conf address_{physical}=): "
           "[transport] hccl_hccn_conf / hccl_device_ip (by physical id) or the engine's llm.LocalCommRes device_ip")
    why = ""
    try:
        addr = ipaddress.ip_address(ip) if ip else None
    except ValueError:
        addr = None
    if not ip:
        why = "has no NIC address"
    elif addr is None:
        why = f"has device ip {ip!r}, which is not an address"
    elif addr.is_loopback:
        why = f"has device ip {ip}, a loopback address"
    elif peer_ip is not None and ip == peer_ip:
        why = f"has device ip {ip}, the peer's too (HCCL refuses a rank table naming one device ip twice)"
    elif host_address(ip):
        why = f"has device ip {ip}, an address of this host's network, not an NPU NIC's"
    if why:
        raise DataDistError(LLMStatusCode.LLM_LINK_FAILED,
                            f"hccl: the engine's NPU (physical {physical}) {why} (from {source}); {how}")


def comm_name(names: Sequence[str], link: bytes) -> str:
    """The communicator of the link ``link`` (its token, which both ends hold) between agents ``names``: both ranks
    derive the same; a relink's is never an older link's. HCCL tells the ends of a Prepare's connection apart by the
    communicator's name and the two addresses only (hcomm ``HcclOneSidedConn::Connect``), so a relink's communicator
    named as the old link's could meet the peer's old one still waiting in its Prepare -- and lose its connection
    when that one is torn down (docs/ascend.md, "Communicators and relinks"). One-way: the name shows nothing of
    the token."""
    digest = hashlib.sha256(b"datadist-hccl-comm|" + link + b"|" + "|".join(sorted(names)).encode()).hexdigest()
    return "datadist-" + digest[:32]
