"""``Liveness``: one heartbeat per pair of daemons, not per link.

A link's data channel tells its end at once when it breaks or closes (``transport.base.CONTROL_DOWN``: a dead peer's
connections end with an EOF), so what is left to notice is a peer daemon that holds its connections open and answers
nothing: hung, stopped (SIGSTOP), starved. That is a property of the daemon, not of a link, so one question per
daemon answers it for all its links.

Linking end: every link this daemon set up is watched here, grouped by the daemon it reaches (``Link.peer_daemon``:
the id the serving daemon gave in its handshake answer; a peer that gave none is a group of its own link, as before).
One task per daemon wakes every ``[peer] heartbeat_seconds`` -- only while a link is watched -- and pings one link of
each group (an owner call, ``ping``). An answer proves the daemon alive for every link of its group; no answer
within ``max(interval, 1 s)`` marks every established link of the group broken (their pending owner calls fail
then); a link whose own channel failed instead is marked alone and the group asks its next link.

Serving end: the linking daemon's pings arrive on one link of each group, so a serving end that let each link go
after ``3 x interval`` without a frame of its own would drop the rest; ``seen`` holds, per linking daemon, the last
time any of its links had a frame (the sweeper, ``LinkTable._sweep``, folds each link's ``last_seen`` into it and
drops a link only when its whole daemon went silent).

The ids are outside the handshake's mac (older daemons must still link): one forged by a man in the middle of the
handshake only changes which links share a heartbeat.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from typing import Protocol

from ..core.errors import DataDistError, StatusCode
from .model import Link, LinkState, OutboundLink


class LinkTable(Protocol):
    """What the heartbeat needs of the table a link belongs to (``table.LinkTable``), declared here so that this
    module names nothing above it."""

    closed: bool

    def mark_broken(self, link: Link, reason: str) -> None: ...


class Liveness:
    """The daemon's heartbeats (linking end) and the time each linking daemon was last heard (serving end)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.daemon_id = os.urandom(16)    # this daemon, in its handshakes (random per process: a restart is new)
        #: linking end: peer daemon -> its links this daemon set up, each with the table it belongs to
        self._groups: dict[bytes, dict[int, tuple[OutboundLink, LinkTable]]] = {}
        #: serving end: linking daemon -> when any of its links last had a frame (``LinkTable._sweep``)
        self.seen: dict[bytes, float] = {}
        self._task: asyncio.Task[None] | None = None
        self.passes = 0                    # heartbeat passes done (one per interval while a link is watched)
        self.pings = 0                     # heartbeat pings sent (one per peer daemon per pass)
        self.history: deque[int] = deque(maxlen=64)   # pings of each pass done, the last 64

    @staticmethod
    def key(link: OutboundLink) -> bytes:
        """The group of ``link``: the daemon it reaches, or the link alone when that daemon gave no id."""
        return link.peer_daemon or b"link:" + link.link_nonce

    def watch(self, link: OutboundLink, table: LinkTable) -> None:
        """Heartbeat ``link`` (just established) with the other links to its daemon; the task starts with the
        first link watched."""
        self._groups.setdefault(self.key(link), {})[id(link)] = (link, table)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def unwatch(self, link: OutboundLink) -> None:
        key = self.key(link)
        group = self._groups.get(key)
        if group is not None:
            group.pop(id(link), None)
            if not group:
                del self._groups[key]
        if not self._groups and self._task is not None:   # no link left: no task waiting on the loop
            self._task.cancel()
            self._task = None

    def watched(self) -> int:
        return sum(len(g) for g in self._groups.values())

    async def _run(self) -> None:
        """One pass per interval while any link is watched: one ping per peer daemon, all at once."""
        while self._groups:
            await asyncio.sleep(self.interval)
            pings = self.pings
            await asyncio.gather(*(self._check(key) for key in list(self._groups)))
            self.history.append(self.pings - pings)
            self.passes += 1

    async def _check(self, key: bytes) -> None:
        """Ping one established link of the group ``key``; see the module doc for what an answer or none means."""
        timeout = max(self.interval, 1.0)
        while True:  # bounded: each pass pings a link not pinged before (it leaves the group or the loop ends)
            group = self._groups.get(key)
            if not group:
                return
            live: list[tuple[OutboundLink, LinkTable]] = []
            for lid, (link, table) in list(group.items()):
                if link.state == LinkState.ESTABLISHED and not table.closed:
                    live.append((link, table))
                else:
                    del group[lid]   # broken or finalized: its end's teardown forgets it too
            if not live:
                if not group:
                    self._groups.pop(key, None)
                return
            link, table = live[0]
            self.pings += 1
            try:
                await link.calls.ping(timeout)
            except DataDistError as exc:
                if exc.code == StatusCode.LLM_TIMEOUT:   # the daemon answers nothing: every link to it is dead
                    for other, its_table in live:
                        its_table.mark_broken(other, f"heartbeat failed: the peer daemon did not answer within "
                                                     f"{timeout:g}s ({exc.message})")
                    return
                table.mark_broken(link, f"heartbeat failed: {exc}")   # this link's own failure: ask the next one
                group.pop(id(link), None)
                continue
            now = time.monotonic()
            for other, _ in live:
                other.last_seen = now
            return
