"""Comm-domain links: CANN's ``link(comm_name, cluster_rank_info, rank_table)``.

Every member calls ``link``; each returns a comm id at once (a per-engine counter from 1) and
links to every other member in the background, then ``query_register_mem_status`` turns from
PREPARING to OK (or FAILED). A rank's daemon is found on its server: the server's ``server_id`` when it is an IP
address -- the host, as CANN's rank tables and vllm-ascend's name it, while ``device_ip`` is the NPU's NIC address,
which no daemon listens on -- else the device's ``device_ip``; at the peer port: the device's ``device_port`` (a
datadist extension of the rank table, so several daemons can share one host) or ``[peer] default_port``. Unlike
``link_clusters`` a comm domain is two-sided: each member links to each other member, so either side can pull or
push.
"""

from __future__ import annotations

import asyncio
import enum
import ipaddress
import itertools
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Sequence

from ..core.errors import DataDistError, StatusCode, require
from . import ClusterSpec, LinkManager

__all__ = ["CommManager", "CommState", "parse_rank_table"]

log = logging.getLogger(__name__)

MAX_NAME = 128
DEFAULT_LINK_SECONDS = 120  # HCCL_CONNECT_TIMEOUT's default; llm.LinkTotalTime overrides
RETRY_SECONDS = 0.2


class CommState(enum.IntEnum):
    """Values of ``llm_datadist.RegisterMemStatus``."""

    OK = 0
    PREPARING = 1
    FAILED = 2


@dataclass
class CommDomain:
    comm_id: int
    name: str
    members: dict[int, int]                 # cluster id -> rank
    peers: dict[int, tuple[str, int]]       # other members: cluster id -> (ip, port)
    state: CommState = CommState.PREPARING
    detail: str = ""
    task: "asyncio.Task[None] | None" = field(default=None, repr=False)


def parse_rank_table(text: str, ranks: Sequence[int], default_port: int) -> dict[int, tuple[str, int]]:
    """rank -> (the address of its daemon, port) for the given ranks, from an HCCL rank table (version 1.0 / 1.2):
    the server's ``server_id`` when it is an IP address, else the device's ``device_ip`` (module doc)."""
    try:
        table = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"rank_table is not JSON: {exc.msg}") from None
    require(isinstance(table, dict) and isinstance(table.get("server_list"), list),
            "rank_table needs a server_list (HCCL rank table version 1.0 / 1.2)")
    found: dict[int, tuple[str, int]] = {}
    for server in table["server_list"]:
        host = _ip_or_none(server.get("server_id")) if isinstance(server, dict) else None
        for device in (server.get("device") or []) if isinstance(server, dict) else []:
            try:
                rank = int(device["rank_id"])
                ip = host or str(device["device_ip"])
                port = int(device.get("device_port", default_port))
                ipaddress.ip_address(ip)
            except (KeyError, TypeError, ValueError) as exc:
                raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                    f"rank_table device entry {device!r} is invalid: {exc}") from None
            require(rank not in found, f"rank_table lists rank {rank} twice")
            require(0 < port < 65536, f"rank_table device_port {port} out of range")
            found[rank] = (ip, port)
    missing = [r for r in ranks if r not in found]
    require(not missing, f"rank_table has no device for rank(s) {missing}")
    return {r: found[r] for r in ranks}


def _ip_or_none(server_id: object) -> str | None:
    """``server_id`` when it is an IP address (the host's, as CANN writes it), else None (a name)."""
    try:
        return str(ipaddress.ip_address(str(server_id)))
    except ValueError:
        return None


class CommManager:
    def __init__(self, links: LinkManager, ensure_listener: Callable[[str, int], Awaitable[None]],
                 default_port: int) -> None:
        self.links = links
        self.ensure_listener = ensure_listener
        self.default_port = default_port
        self.domains: dict[int, CommDomain] = {}
        self._ids = itertools.count(1)

    @property
    def cluster_id(self) -> int:
        return self.links.cluster_id

    async def link(self, name: str, members: Sequence[tuple[int, int]], rank_table: str) -> int:
        require(0 < len(name) < MAX_NAME, f"comm_name must have 1 to {MAX_NAME - 1} characters")
        require(2 <= len(members) <= 4, f"cluster_rank_info must have 2 to 4 members, got {len(members)}")
        clusters = [c for c, _ in members]
        ranks = [r for _, r in members]
        require(len(set(clusters)) == len(clusters), "cluster_rank_info lists a cluster twice")
        require(ranks == sorted(ranks) and len(set(ranks)) == len(ranks),
                f"cluster_rank_info ranks must be unique and ascending in order, got {ranks}")
        require(self.cluster_id in clusters, f"this engine's cluster {self.cluster_id} is not a member")
        if any(d.name == name for d in self.domains.values()):
            raise DataDistError(StatusCode.LLM_ALREADY_LINK, f"comm domain {name!r} already exists")
        addresses = parse_rank_table(rank_table, ranks, self.default_port)
        member_map = dict(members)
        own_ip, own_port = addresses[member_map[self.cluster_id]]
        await self.ensure_listener(own_ip, own_port)
        self.links.engine.linked_once = True  # later registrations default to remote_accessible=False
        peers = {c: addresses[r] for c, r in member_map.items() if c != self.cluster_id}
        domain = CommDomain(next(self._ids), name, member_map, peers)
        self.domains[domain.comm_id] = domain
        total = self.links.engine.options.link_total_time_s or DEFAULT_LINK_SECONDS
        domain.task = asyncio.get_running_loop().create_task(self._establish(domain, time.monotonic() + total))
        log.info("cluster %s: comm domain %r (id %d) with %s: linking", self.cluster_id, name, domain.comm_id,
                 {c: f"{ip}:{port}" for c, (ip, port) in peers.items()})
        return domain.comm_id

    async def _establish(self, domain: CommDomain, deadline: float) -> None:
        async def one(cluster: int, ip: str, port: int) -> str:
            spec = ClusterSpec(cluster, ip, port)
            last = ""
            while time.monotonic() < deadline:  # the other member may not listen yet: retry until the deadline
                attempt = min(deadline, time.monotonic() + 5.0)
                code = await self.links.link_one(spec, attempt)
                if code in (StatusCode.LLM_SUCCESS, StatusCode.LLM_ALREADY_LINK):
                    return ""
                last = StatusCode(code).name
                await asyncio.sleep(RETRY_SECONDS)
            return f"cluster {cluster} at {ip}:{port}: {last or 'timed out'}"

        failures = [f for f in await asyncio.gather(*(one(c, ip, port) for c, (ip, port) in domain.peers.items())) if f]
        if failures:
            domain.state, domain.detail = CommState.FAILED, "; ".join(failures)
            log.warning("cluster %s: comm domain %r failed: %s", self.cluster_id, domain.name, domain.detail)
        else:
            domain.state = CommState.OK
            log.info("cluster %s: comm domain %r (id %d) ready", self.cluster_id, domain.name, domain.comm_id)

    def status(self, comm_id: int) -> tuple[CommState, str]:
        domain = self.domains.get(comm_id)
        if domain is None:
            raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"unknown comm id {comm_id}")
        return domain.state, domain.detail

    async def unlink(self, comm_id: int) -> None:
        domain = self.domains.pop(comm_id, None)
        if domain is None:
            raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"unknown comm id {comm_id}")
        if domain.task is not None:
            domain.task.cancel()
        for cluster in domain.peers:
            if any(cluster in d.peers for d in self.domains.values()):
                continue  # still needed by another domain
            for link in (self.links.links.get(cluster), self.links.served.get(cluster)):
                if link is not None:
                    try:
                        await self.links.drop_link(link, notify=True, deadline=time.monotonic() + 1.0)
                    except DataDistError as exc:
                        log.info("cluster %s: comm unlink %r: %s", self.cluster_id, domain.name, exc)
        log.info("cluster %s: comm domain %r (id %d) unlinked", self.cluster_id, domain.name, comm_id)

    async def close(self) -> None:
        for domain in self.domains.values():
            if domain.task is not None:
                domain.task.cancel()
        self.domains.clear()
