"""``PublishedTables``: pulls by READ of the rows an owner published to the link, no owner call.

The link knows its memory. The owner's link manager publishes each cache the engine made remotely accessible
(``publish``): the agent registers exactly that cache's tensors on their own (NIXL; HCCL bound its memory before
Prepare), and every ready peer gets a ``P`` message: an integer handle, its generation, the rows (``rows`` rows of
``row_size`` bytes per tensor, each tensor's address), the registration's partial metadata and the link manager's
description of the cache (``info``: its keys, opaque here). A change (a key bound or unbound) sends ``P`` again
with the next generation (``update``); a cache that goes is withdrawn (``withdraw``): ``W`` to every peer, then its
registration is deregistered -- both before ``withdraw`` returns, which the owner calls before the cache's memory
goes back to its pool. A peer a ``P`` or ``W`` cannot go to at once (``_to_peers``: the event loop
waits for no peer) is dropped with its channel: a peer never holds a row it was not told is gone.

Every control frame of a one-sided link -- these messages, and the owner calls' replies -- goes on the channel's
first connection (``TcpChannel.send_control_first``): one reader thread applies a ``P`` or ``W`` before it hands
over any reply the owner sent after it, so a puller that was answered (a RELEASE that consumed a key, a ping) sees
every table change made before that answer. Defensively, out of order arrivals are also harmless: a ``P`` before
the peer's ``M`` waits for it; an update older than the entry (its generation) is ignored; handles are never
reused, so a ``P`` of a handle already withdrawn (``LinkPeer.withdrawn``) is stale and ignored.

The requester keeps each peer's table (``LinkPeer.table``): on ``P`` it loads the metadata and prepares the rows
once (``agent.prepare_rows``; NIXL refuses rows outside what the owner described, HCCL at each get); a pull is then
one READ of rows by index (``read_rows``), carrying a notification (``DDR``, handle, bytes) that tells the owner
after the fact -- it is never asked before or after. A handle withdrawn (even while it was read: ``_end``), or never
published on this link, fails the pull with ``LLM_KV_CACHE_NOT_EXIST``, the owner's code for a cache it lacks.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from datadist.status import LLMStatusCode

from ...core.errors import DataDistError
from ...memory.base import Segment
from ..base import CONTROL_TRANSPORT, Channel
from ..registrations import Registration
from .agent import InFlight, PostingAgent, TableAgent
from .link import _CONTROL_TIMEOUT, LinkPeer
from .rows import ReadPlan, RemoteEntry, by_rows, row_indices, settle_future
from .transport import OneSidedTransport, _peer_of
from .wire import ID, MD_LEN, NOTIF_READ, PUBLISH, PUBLISH_HEAD, WITHDRAW, parse_publish

__all__ = ["PublishedTables", "RemoteEntry", "PUBLISH", "WITHDRAW", "NOTIF_READ"]

log = logging.getLogger("datadistd.transport.onesided")

MAX_TENSORS = 4096
MAX_ROWS_TOTAL = 1 << 22      # rows of one cache (tensors x rows): one descriptor each in the prepared list
MAX_ENTRIES = 1 << 16         # published handles one peer may hold at this end
MAX_ROWS_LINK = 1 << 23       # rows (prepared descriptors) of all the caches one peer published here
MAX_INFO = 1 << 20
MAX_WITHDRAWN = 1 << 16       # withdrawn handles remembered per link (a P that overtook its W is ignored)
_READ_NAP = 0.00002           # progress thread: the nap between two rounds of checks of the READs in flight
_FENCE_NAP = 0.002            # the same when every READ in flight is past its deadline, waited for in its fence
_BUSY_GRACE = 0.05            # the loop's wait for a peer's first connection another thread's frame holds (not socket)


@dataclass
class _Published:
    """An entry at the owner: the cache's registration and the ``P`` message every peer gets."""

    token: Any
    message: bytes
    generation: int
    ranges: np.ndarray           # (address, length) of each tensor, as registered


class PublishedTables(OneSidedTransport):
    """A one-sided transport whose pulls read published tables (``transport.base.ReadTables``)."""

    #: a few rows' READ is posted from the event loop, ended by the progress thread (``start_rows``; a ``PostingAgent``)
    posts_reads = True
    #: why a pull of a cache published with no tensor (``publish``: one this agent cannot move) is refused
    unpublished = ("the nixl transport moves only memory mapped into the daemon; the peer's cache is worker memory "
                   "reached through a file (unsealed)")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._published: dict[int, _Published] = {}
        self._infos: dict[int, bytes] = {}        # the link manager's description of each published handle
        self._spans = (np.empty(0, np.uint64), np.empty(0, np.uint64))   # published tensors: starts, ends (sorted)
        self._table_lock = threading.RLock()   # publish/update/withdraw go out in order; a new peer's snapshot
        self.bytes_read_by_peers = 0           # counted from the peers' READ notifications

    def _agent(self) -> TableAgent:
        return super()._agent()  # type: ignore[return-value]  # a TableAgent (``_new_agent``); no cast call

    def _live_agent(self) -> TableAgent | None:
        return self._running_agent  # type: ignore[return-value]

    def _poster(self) -> PostingAgent | None:   # the running agent, of a transport that ``posts_reads``
        return self._running_agent if self.posts_reads else None  # type: ignore[return-value]

    # -- the owner's side --

    def publish(self, tensors: Sequence[Segment], row_size: int, rows: int, info: bytes) -> int:
        """Publish a cache (its ``tensors``, each ``rows`` rows of ``row_size`` bytes) to every link: its handle.
        A cache whose memory the agent does not move (``TableAgent.ranges``) is published with no tensor: a pull of
        it is refused with ``LLM_FEATURE_NOT_ENABLED`` (``unpublished``) at the requester."""
        agent = self._agent()
        ranges = agent.ranges(tensors)
        token, metadata = agent.publish(ranges) if ranges is not None and len(ranges) else (None, b"")
        handle = int(self._next_id())
        bases = ranges[:, 0] if ranges is not None else np.empty(0, np.uint64)
        message = (PUBLISH_HEAD.pack(PUBLISH, handle, 1, row_size, rows, len(bases)) + bases.astype("<u8").tobytes()
                   + MD_LEN.pack(len(metadata)) + metadata)
        entry = _Published(token, message, 1, ranges if ranges is not None else np.empty((0, 2), np.uint64))
        with self._table_lock:
            self._published[handle] = entry
            self._infos[handle] = info
            self._index_spans()
            self._to_peers(entry.message + MD_LEN.pack(len(info)) + info)
        return handle

    def update(self, handle: int, info: bytes) -> None:
        """The cache of ``handle`` is described anew (a key bound or unbound): ``P`` again, next generation."""
        with self._table_lock:
            entry = self._published.get(handle)
            if entry is None:
                return
            entry.generation += 1
            entry.message = entry.message[:9] + struct.pack("<Q", entry.generation) + entry.message[17:]
            self._infos[handle] = info
            self._to_peers(entry.message + MD_LEN.pack(len(info)) + info)

    def withdraw(self, handle: int) -> None:
        """Withdraw ``handle`` from every link and deregister its memory; returns when both are done (call it
        before the memory can be reused)."""
        with self._table_lock:
            entry = self._published.pop(handle, None)
            self._infos.pop(handle, None)
            if entry is None:
                return
            self._index_spans()
            self._to_peers(ID.pack(WITHDRAW, handle))
        agent = self._live_agent()
        if entry.token is not None and agent is not None:
            agent.unpublish(entry.token)

    def _index_spans(self) -> None:
        """The published tensors' ranges, sorted (under ``_table_lock``): what a push's destination is looked up in."""
        ranges = [entry.ranges for entry in self._published.values() if len(entry.ranges)]
        both = np.concatenate(ranges) if ranges else np.empty((0, 2), np.uint64)
        both = both[np.argsort(both[:, 0], kind="stable")]
        self._spans = (both[:, 0].copy(), both[:, 0] + both[:, 1])

    def _describe(self, peer: LinkPeer, segments: Sequence[Segment]) -> tuple[np.ndarray, bytes, list[Registration]]:
        """A push's destination, described to the pusher: when every extent lies in a published cache -- always, for
        a cache the owner validated, unless it could not be published -- by that cache's registration, which the
        peer has (its ``P`` went before, on the same connection): no metadata, and so no key to the pool the cache
        lies in. Otherwise as every one-sided transport does (the handle's registration)."""
        agent = self._agent()
        extents, _, _ = agent.addresses(segments)
        starts, ends = self._spans
        if len(extents) and len(starts):
            at = np.searchsorted(starts, extents[:, 0], side="right") - 1
            if bool((at >= 0).all()) and bool((extents[:, 0] + extents[:, 1] <= ends[np.maximum(at, 0)]).all()):
                return extents, b"", []
        return super()._describe(peer, segments)

    def _to_peers(self, message: bytes, peers: Sequence[LinkPeer] | None = None, wait: bool = False) -> None:
        """``message`` to every ready peer: at once from the loop (``try_control_first``, ``_BUSY_GRACE``), or
        (``wait``: a new peer's catch-up, its reader thread) within ``_CONTROL_TIMEOUT``. One it misses is dropped."""
        if peers is None:
            with self._lock:
                peers = [peer for peer in self._peers.values() if peer.ready.is_set() and not peer.broken]
        for peer in peers:
            deadline = time.monotonic() + _CONTROL_TIMEOUT
            try:
                if wait:
                    peer.channel().send_control_first(CONTROL_TRANSPORT, message, deadline)
                sent = wait or peer.channel().try_control_first(CONTROL_TRANSPORT, message, deadline, _BUSY_GRACE)
            except DataDistError:
                sent = False
            if not sent:
                log.warning("%s: the table of link %s could not be updated at once; dropping its channel", self.name,
                            peer.what)
                self._drop(peer, "its table could not be updated")

    def _ready(self, peer: LinkPeer) -> None:
        """``peer`` loaded this agent (its reader thread): every entry, sent outside ``_table_lock`` (the loop never
        waits for this socket); a change overtaking one is safe (``_on_publish`` ignores a stale ``P``)."""
        with self._table_lock:
            messages = [entry.message + MD_LEN.pack(len(self._infos[handle])) + self._infos[handle]
                        for handle, entry in self._published.items()]
        for message in messages:
            if peer.broken:
                return
            self._to_peers(message, [peer], wait=True)

    # -- the requester's side --

    def _on_extra(self, peer: LinkPeer, payload: bytes) -> None:
        letter = payload[:1]
        if letter == PUBLISH:
            self._on_publish(peer, payload)
        elif letter == WITHDRAW:
            _, handle = ID.unpack_from(payload)
            with peer.table_lock:
                entry = peer.table.pop(handle, None)
                peer.table_version += 1
                peer.withdrawn[handle] = None   # handles are never reused: a later P of it is stale
                while len(peer.withdrawn) > MAX_WITHDRAWN:
                    peer.withdrawn.popitem(last=False)
            if entry is not None:
                self._retire(entry)
        else:
            super()._on_extra(peer, payload)

    def _on_publish(self, peer: LinkPeer, payload: bytes) -> None:
        handle, generation, row_size, rows, bases, metadata, info = parse_publish(payload)   # ValueError: cut short
        count = len(bases)
        if count > MAX_TENSORS or count * rows > MAX_ROWS_TOTAL or (count and not row_size) or row_size >> 40 or \
                len(info) > MAX_INFO:
            raise ValueError(f"a published cache of {count} tensors x {rows} rows of {row_size} bytes, "
                             f"{len(info)} bytes of info")
        if peer.agent_name is None:   # control frames are spread over the link's connections: its M may be behind
            peer.ready.wait(_CONTROL_TIMEOUT)
            if peer.agent_name is None:
                raise ValueError("a published cache before the peer's agent")
        with peer.table_lock:
            if handle in peer.withdrawn:   # a P overtaken by the W of its handle (another connection): stale
                return
            old = peer.table.get(handle)
            if old is None and len(peer.table) >= MAX_ENTRIES:
                raise ValueError(f"more than {MAX_ENTRIES} published caches")
            held = sum(len(e.bases) * e.rows for e in peer.table.values() if e is not old)
            if held + count * rows > MAX_ROWS_LINK:
                raise ValueError(f"more than {MAX_ROWS_LINK} published rows on one link")
        if old is not None and old.row_size == row_size and old.rows == rows and np.array_equal(old.bases, bases):
            if generation > old.generation:   # the same memory, described anew: keep the prepared rows
                with peer.table_lock:
                    old.generation, old.info = generation, info
                    peer.table_version += 1
            return
        entry = RemoteEntry(handle, generation, row_size, rows, bases, info)
        if count:
            agent = self._agent()
            if metadata and agent.add_peer(metadata, peer.token) != peer.agent_name:
                raise ValueError("a published cache of another agent")
            starts = (bases[:, None] + np.arange(rows, dtype=np.uint64) * np.uint64(row_size)).reshape(-1)
            entry.prepared = agent.prepare_rows(peer.agent_name, np.stack(
                [starts, np.full(len(starts), row_size, np.uint64)], axis=1))
            entry.order = np.argsort(starts, kind="stable")
            entry.starts = starts[entry.order]
        with peer.table_lock:
            stale = handle in peer.withdrawn   # withdrawn while its rows were prepared
            old = entry if stale else peer.table.get(handle)
            if not stale:
                peer.table[handle] = entry
                peer.table_version += 1
        if old is not None:
            self._retire(old)

    def _retire(self, entry: RemoteEntry) -> None:
        release = None
        with self._lock:
            entry.gone = True
            if entry.busy == 0 and entry.prepared is not None:
                release, entry.prepared = entry.prepared, None
        agent = self._live_agent()
        if release is not None and agent is not None:
            agent.release_rows(release)

    def table_of(self, channel: Channel, known: int) -> tuple[int, dict[int, bytes] | None]:
        """The version of the table published on ``channel``'s link and, unless it is ``known``, every entry's
        info by handle."""
        peer = _peer_of(self.name, channel)
        with peer.table_lock:
            if peer.table_version == known:
                return known, None
            return peer.table_version, {handle: entry.info for handle, entry in peer.table.items()}

    def read_rows(self, channel: Channel, handle: int, spans: np.ndarray, segments: Sequence[Segment],
                  deadline: float) -> None:
        """Read ``spans`` (``(tensor, offset, length)`` rows, in the published cache's tensors) of ``handle`` into
        ``segments`` (as many bytes): one READ of the prepared rows, with a notification to the owner. Blocks (a
        worker thread's); ``start_rows`` posts it from the event loop instead."""
        plan = self._plan(channel, handle, spans, segments)
        if plan is None:
            return
        peer, entry = plan.peer, plan.entry
        if not peer.ready.wait(max(0.0, deadline - time.monotonic())) or peer.agent_name is None:
            raise DataDistError(LLMStatusCode.LLM_TIMEOUT, f"the peer {peer.what} never sent its agent metadata")
        agent = self._agent()
        self._begin(plan)
        try:
            if plan.indices is not None:
                agent.read_rows(plan.dst, entry.prepared, plan.indices, peer.agent_name, plan.notif, deadline,
                                plan.reg)
            else:
                rows = by_rows(entry, plan.src, plan.dst)
                if rows is not None:
                    agent.read_rows(rows[1], entry.prepared, rows[0], peer.agent_name, plan.notif, deadline)
                else:   # rows cut by the destination's segments: the extents themselves (still no owner call)
                    agent.read(plan.dst, plan.src, peer.agent_name, deadline)
                    agent.notify(peer.agent_name, plan.notif)
        except DataDistError as exc:
            raise self._failed(plan, exc) from None
        finally:
            withdrawn = self._end(plan)
        if withdrawn is not None:
            raise withdrawn
        self.bytes_received += plan.nbytes

    def start_rows(self, channel: Channel, handle: int, spans: np.ndarray, segments: Sequence[Segment],
                   deadline: float, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None] | None:
        """``read_rows`` from the event loop, without a worker thread: a few whole rows are checked and posted
        here (NIXL's post does not block), and the progress thread -- which checks the READs in flight between
        its looks for notifications, napping ``_READ_NAP``, never spinning -- settles the future on ``loop`` when
        the READ ends (``LLM_TIMEOUT`` at ``deadline``). None when the READ needs a worker thread (``read_rows``):
        more rows, rows cut by the destination, a peer whose agent is not loaded yet, a transport that does not post
        (``posts_reads``). Refusals raise here."""
        agent = self._poster()
        if agent is None:
            return None
        plan = self._plan(channel, handle, spans, segments)
        future: asyncio.Future[None] = loop.create_future()
        if plan is None:
            future.set_result(None)
            return future
        peer = plan.peer
        if plan.indices is None or peer.agent_name is None or not peer.ready.is_set():
            return None
        self._begin(plan)
        try:
            request, made, done = agent.post_rows(plan.dst, plan.entry.prepared, plan.indices, peer.agent_name,
                                                  plan.notif, plan.reg)
        except DataDistError as exc:
            self._end(plan)
            raise self._failed(plan, exc) from None
        if done:
            agent.end_rows(request, made, peer.agent_name)
            withdrawn = self._end(plan)
            if withdrawn is not None:
                raise withdrawn
            self.bytes_received += plan.nbytes
            future.set_result(None)
            return future
        plan.request, plan.made, plan.deadline, plan.loop, plan.future = request, made, deadline, loop, future
        with self._lock:
            self._reading[plan.tid] = plan
            first = len(self._reading) == 1
        if first:   # else the progress thread is checking READs already (it looks at ``_reading`` before it naps)
            self._kick.set()
        if self._stopping.is_set():   # stopped meanwhile: its progress thread may have gone
            self._fail_reads()
        return future

    def _check_reads(self, until: float) -> None:
        """The progress thread: check the READs ``start_rows`` posted, each by one C call, napping ``_READ_NAP``
        between rounds, until none is left or ``until``; each that ended (or passed its deadline) is settled."""
        agent = self._poster()
        while True:
            with self._lock:
                reads: list[ReadPlan] = list(self._reading.values())
            if not reads:
                return
            now = time.monotonic()
            live = False   # a READ not past its deadline: checked every _READ_NAP; in their fence only, _FENCE_NAP
            for read in reads:
                live = live or now < read.deadline
                error: DataDistError | None = None
                try:
                    if agent is None:
                        error = DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"{self.name}: the transport stopped")
                    elif not agent.rows_done(read.request, read.peer.agent_name or ""):
                        if now < read.deadline:
                            continue
                        if not read.probed:   # past its deadline: a dead connection is made to end it
                            read.probed = True
                            agent.probe(read.peer.agent_name or "")
                        if now < read.deadline + agent.fence:   # and it is waited for as long as it may end
                            continue
                        error = InFlight(LLMStatusCode.LLM_TIMEOUT, f"NIXL READ from {read.peer.what} not done by "
                                                                    f"the deadline, nor ended in the fence after it")
                    elif now >= read.deadline:   # it ended in the fence: given up all the same, nothing more lands
                        error = DataDistError(LLMStatusCode.LLM_TIMEOUT, f"NIXL READ from {read.peer.what} not "
                                                                         f"done by the deadline")
                except DataDistError as exc:
                    error = exc
                self._settle(read, agent, error)
            if time.monotonic() >= until:
                return
            time.sleep(_READ_NAP if live else _FENCE_NAP)

    def _settle(self, plan: ReadPlan, agent: PostingAgent | None, error: DataDistError | None) -> None:
        """A READ of ``start_rows`` ended: released, its future settled on its loop (once: the first caller)."""
        with self._lock:
            if self._reading.pop(plan.tid, None) is None:
                return
        if agent is not None:
            agent.end_rows(plan.request, plan.made, plan.peer.agent_name or "")
        failure = self._failed(plan, error) if error is not None else None
        withdrawn = self._end(plan)
        failure = failure or withdrawn
        if failure is None:
            self.bytes_received += plan.nbytes
        assert plan.loop is not None and plan.future is not None
        try:
            plan.loop.call_soon_threadsafe(settle_future, plan.future, failure)
        except RuntimeError:   # the loop closed: nobody waits
            pass

    def _fail_reads(self) -> None:
        """The transport stopped: every READ ``start_rows`` posted ends (``LLM_LINK_FAILED``)."""
        with self._lock:
            reads = list(self._reading.values())
        for read in reads:
            self._settle(read, self._poster(), DataDistError(LLMStatusCode.LLM_LINK_FAILED,
                                                                 f"{self.name}: the transport stopped"))

    def _plan(self, channel: Channel, handle: int, spans: np.ndarray, segments: Sequence[Segment]) -> ReadPlan | None:
        """A READ of ``spans`` of ``handle`` into ``segments``, checked: the entry published on the link (else
        ``LLM_KV_CACHE_NOT_EXIST``), every span inside it and the destination as many bytes (else
        ``LLM_PARAM_INVALID``). None: nothing to read."""
        peer = _peer_of(self.name, channel)
        agent = self._agent()
        with peer.table_lock:
            entry = peer.table.get(handle)
        if entry is None:
            raise DataDistError(LLMStatusCode.LLM_KV_CACHE_NOT_EXIST,
                                f"{self.name}: cache {handle} is not published on the link {peer.what} (withdrawn)")
        if not len(entry.bases):
            raise DataDistError(LLMStatusCode.LLM_FEATURE_NOT_ENABLED, self.unpublished)
        indices = row_indices(entry, spans, handle, self.name)
        reg = None
        src = dst = np.empty((0, 2), np.uint64)
        if indices is not None:   # whole rows: paired one for one with the destination's extents, or not at all
            dst, used, _ = agent.addresses(segments)
            lengths = dst[:, 1].tolist()
            if lengths.count(entry.row_size) == len(lengths) == len(indices):
                reg = used[0] if len(used) == 1 else None
            else:
                indices = None
        if indices is None:
            tensor, offset, length = (spans[:, i].astype(np.uint64) for i in range(3))
            remote = np.stack([entry.bases[tensor.astype(np.int64)] + offset, length], axis=1) if len(spans) \
                else np.empty((0, 2), np.uint64)
            src, dst = self._paired(remote, segments, LLMStatusCode.LLM_PARAM_INVALID, f"the rows of cache {handle}")
            if not len(src):
                return None
        nbytes = len(indices) * entry.row_size if indices is not None else int(src[:, 1].sum())
        return ReadPlan(peer, entry, handle, indices, src, dst, reg, nbytes, NOTIF_READ.pack(b"DDR", handle, nbytes))

    def _begin(self, plan: ReadPlan) -> None:
        """``plan``'s READ starts: the entry's prepared rows stay until it ended, the peer's agent stays loaded."""
        plan.tid = int(self._next_id())
        with self._lock:
            if plan.entry.gone or plan.entry.prepared is None:
                raise DataDistError(LLMStatusCode.LLM_KV_CACHE_NOT_EXIST,
                                    f"{self.name}: cache {plan.handle} was withdrawn from the link {plan.peer.what}")
            plan.entry.busy += 1
        plan.peer.reading(plan.tid)    # until this READ ended (``LinkPeer.sent``)

    def _failed(self, plan: ReadPlan, exc: DataDistError) -> DataDistError:
        """What a failed READ of ``plan`` raises; a READ past its deadline may still be in flight: its link is
        dropped (``_abandon_read``)."""
        if exc.code == LLMStatusCode.LLM_TIMEOUT:
            self._abandon_read(plan.peer, exc)
        elif plan.entry.gone:
            return DataDistError(LLMStatusCode.LLM_KV_CACHE_NOT_EXIST,
                                 f"{self.name}: cache {plan.handle} was withdrawn during the READ ({exc.message})")
        return exc

    def _end(self, plan: ReadPlan) -> DataDistError | None:
        """``plan``'s READ ended: what ``_begin`` holds is let go. Its entry withdrawn meanwhile (under the lock the
        withdrawal takes) is what it fails with: the owner may have let the memory go under a READ (HCCL's runs on)."""
        plan.peer.sent(plan.tid)
        entry = plan.entry
        with self._lock:
            entry.busy -= 1
            gone = entry.gone
            release = entry.prepared if gone and entry.busy == 0 else None
            if release is not None:
                entry.prepared = None
        agent = self._live_agent()
        if release is not None and agent is not None:
            agent.release_rows(release)
        return DataDistError(LLMStatusCode.LLM_KV_CACHE_NOT_EXIST, f"{self.name}: cache {plan.handle} was withdrawn "
                             f"from the link {plan.peer.what} while it was read") if gone else None

    def _on_notification(self, name: str, message: bytes) -> bool:
        if len(message) == NOTIF_READ.size and message.startswith(b"DDR"):
            _, _, nbytes = NOTIF_READ.unpack(message)
            self.bytes_read_by_peers += nbytes
            if self.progress_window:
                self._progress_until = time.monotonic() + self.progress_window
            return True
        return super()._on_notification(name, message)
