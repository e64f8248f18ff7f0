"""Owner calls to and from the other end of a link, as frames on its data channel (``ownercalls``): sending
one (``_frame_calls``), handing an incoming frame from a reader thread to the event loop
(``_control_handler``; a call with a long block list is decoded on the peer's threads, ``_decode_aside``), and
the one place that runs a call of the other end (``_answer``)."""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import threading
import time
from typing import Any, Callable, Coroutine

from ..core.errors import DataDistError, StatusCode
from ..engine import readview
from ..transport.base import CONTROL_CALL, CONTROL_DOWN, CONTROL_REPLY, Channel, ControlRefused, SendsParts
from .model import LinkState, RemoteLink
from .owner import Owner
from .table import LinkTable
from .wire import ownerwire
from .wire.framecalls import FrameCalls
from .wire.ownercalls import (
    CommitWriteCmd,
    NotifyCmd,
    OpenWriteCmd,
    OwnerCall,
    OwnerReply,
    PingCmd,
    ReadCmd,
    RefusedCall,
    ReleaseCmd,
    UnlinkCmd,
    WriteCmd,
)

log = logging.getLogger("datadistd.links")

#: control frames one wake-up of the event loop handles before it lets other work run ...
_CONTROL_DRAIN = 64
#: ... and bytes of the frames it decodes itself (a frame at least): a turn ends at whichever comes first
_DRAIN_BYTES = 256 << 10
#: a CALL frame whose decode reads more bytes than this (``ownerwire.parsed_size``: a block list of more than ~500
#: numbers) is decoded -- its lists turned into ints and their bounds worked out (``core.types.BlockList``) -- on the
#: daemon's threads as the link's peer (its share, ``guard.executor``), never on the event loop; the rest (a small
#: pull's or push's frame, a ping, a reply) is decoded on the loop, no thread hop
_OFF_LOOP = 4 << 10
#: what one link's other end may have waiting here: control frames its connections' readers handed over
#: that the event loop has not taken yet, plus its calls being answered -- at most ``_QUEUED_FRAMES`` of those and
#: ``_QUEUED_BYTES`` of frames. A peer past either bound sends faster than it is answered (an honest one has no
#: more calls at once than its own pulls and pushes on the link, far fewer; ``[quota] link_calls_queued`` refuses
#: more than 1,024 waiting reads): its link is dropped, the reason logged (``transport.base.ControlRefused``).
_QUEUED_FRAMES = 4096
_QUEUED_BYTES = 64 << 20


class OwnerCalls:
    """Both directions of a link's owner calls: this end's calls on the other (``frame_calls``) and the other
    end's calls on this one (``control_handler`` -> ``_answer`` -> ``owner``)."""

    def __init__(self, table: LinkTable, owner: Owner) -> None:
        self.table = table
        self.owner = owner
        # what peers' small reads and writes are served by (``readview``), published anew at each registry change
        table.watchers.append(self._publish)
        self._publish()

    def _publish(self) -> None:
        readview.publish(self.table.engine)

    def frame_calls(self, remote_cluster: int, channel: Callable[[], Channel | None]) -> FrameCalls:
        """Owner calls on the other end of a link whose data channel ``channel()`` returns."""
        async def send(payload: bytes, deadline: float) -> None:
            await self._control_frame(channel(), remote_cluster, CONTROL_CALL, payload, deadline, "")

        def try_send(payload: bytes, deadline: float) -> bool:
            ch = channel()
            if ch is None or ch.broken:
                raise DataDistError(StatusCode.LLM_LINK_FAILED, f"no live data connection to cluster {remote_cluster}")
            return ch.try_control(CONTROL_CALL, payload, deadline)

        return FrameCalls(remote_cluster, send, try_send)

    async def _control_frame(self, channel: Channel | None, remote_cluster: int, kind: int, payload: bytes,
                             deadline: float, principal: str) -> None:
        """One control frame on a link's channel: from the event loop when a connection is idle (no thread
        hop), else from the executor, waiting for a connection until ``deadline``; as ``principal`` (a reply:
        the link's peer), else as this engine's worker (a call of its own)."""
        if channel is None or channel.broken:
            raise DataDistError(StatusCode.LLM_LINK_FAILED, f"no live data connection to cluster {remote_cluster}")
        if not channel.try_control(kind, payload, deadline):
            if principal:
                await self.table.in_thread_of(principal, channel.send_control, kind, payload, deadline)
            else:
                await self.table.in_thread(channel.send_control, kind, payload, deadline)

    def control_handler(self, link: RemoteLink) -> Callable[[int, bytes], None]:
        """What the data channel's reader threads call with a control frame: a small pull's or push's reply landed
        there (``FrameCalls.take_reply``), a small read or write of the other end settled there (``_read_here``,
        ``_write_here``), anything else queued for the event loop (``_Inbox``)."""
        read_here = self._read_here(link)
        write_here = self._write_here(link, asyncio.get_running_loop())
        inbox = _Inbox(self, link)
        take_reply, put = link.calls.take_reply, inbox.put
        small_call, cluster = ownerwire.small_call, self.table.cluster_id

        def handler(kind: int, payload: bytes) -> None:
            if kind == CONTROL_REPLY and take_reply(payload):   # a small pull's or push's reply, landed here
                link.last_seen = time.monotonic()   # as ``_on_control``: the sweeper must hear of this frame
                return
            if kind == CONTROL_CALL:
                # one small read or write that the reader thread settles (``small_call`` tells which)
                got = small_call(payload, cluster)
                if got is not None and (write_here(got, payload) if got[0] else read_here(got)):
                    return
            put(kind, payload)

        return handler

    def _read_here(self, link: RemoteLink) -> Callable[[ownerwire.SmallCall], bool]:
        """The link's answer to a small read by ``BlocksCacheKey`` that the engine's published read view settles
        (``readview.read``), from whichever thread has the frame -- the data reader thread that read it, or the
        event loop after republishing a stale view: the frame as ``ownerwire.small_call`` read it (one
        ``unpack_from``), the blocks resolved by the view's geometry, and the REPLY's head and the cache's bytes
        sent as one ``sendmsg`` straight from its memory on an idle connection (the channel's
        ``try_control_parts``, under the engine's ``read_lock``). It returns False, with nothing sent and nothing
        counted, for anything else -- a stale view, a refusal, memory not mapped here, a busy connection, the link's
        call cap reached, any error: the event loop answers it (``_on_control``), with its status code. One frame
        at a time per thread, so this holds at most one reply per connection."""
        table = self.table
        engine = table.engine
        cluster = table.cluster_id
        limits = table.node.link_limits
        usage = link.usage
        metrics = table.node.metrics
        bound = metrics.bound("serve_read", str(cluster), str(link.remote_cluster)) if metrics is not None else None
        sends: list[readview.Send] = []   # the link's channel's ``try_control_parts`` for a REPLY, once found
        read, now = readview.read, time.monotonic

        def read_here(got: ownerwire.SmallCall) -> bool:
            if (table.closed or link.state != LinkState.ESTABLISHED
                    or not usage.has_turn(limits)):   # at its call cap: the loop queues or refuses
                return False
            started = link.last_seen = now()   # as ``_on_control``: the sweeper must hear of this frame
            _, _, model_id, tensor_start, tensor_count, blocks, nbytes, _, reply = got
            if not sends:
                channel = table.channel_of(link)
                if not isinstance(channel, SendsParts):
                    return False
                sends.append(functools.partial(channel.try_control_parts, CONTROL_REPLY))
            try:
                if read(engine, model_id, tensor_start, tensor_count, blocks, nbytes, sends[0], reply) != readview.SENT:
                    return False
            except Exception:   # noqa: BLE001 - anything unusual is the event loop's to answer
                return False
            if bound is not None:
                bound.begin()
                bound.end("success", now() - started, nbytes, len(blocks))
            with link.reader_lock:
                link.reader_bytes_out += nbytes
            return True

        return read_here

    def _write_here(self, link: RemoteLink,
                    loop: asyncio.AbstractEventLoop) -> Callable[[ownerwire.SmallCall, bytes], bool]:
        """The link's answer to a small push by ``BlocksCacheKey`` carrying its bytes (``WriteCmd``) that the
        engine's published view settles (``readview.write``), from whichever thread has the frame, as
        ``_read_here``: the frame as ``ownerwire.small_call`` read it (the byte count it carries is its spec's),
        every block range-checked by the view's geometry, the bytes copied into the rows under the engine's
        ``read_lock`` once the view is checked current, then the REPLY (status 0) sent on an idle connection -- or,
        the connections busy, by the event loop. False, nothing written or counted, for anything else (a stale view,
        memory not mapped writable here, the link's call cap reached, any error): the event loop answers it
        (``_on_control`` -> ``Owner.write_small``, ``prepare_write``'s status codes)."""
        table = self.table
        engine = table.engine
        cluster = table.cluster_id
        limits = table.node.link_limits
        usage = link.usage
        metrics = table.node.metrics
        bound = metrics.bound("serve_write", str(cluster), str(link.remote_cluster)) if metrics is not None else None
        sends: list[Callable[[list], bool]] = []
        write, now = readview.write, time.monotonic

        def write_here(got: ownerwire.SmallCall, payload: bytes) -> bool:
            if (table.closed or link.state != LinkState.ESTABLISHED
                    or not usage.has_turn(limits)):
                return False
            started = link.last_seen = now()
            _, cid, model_id, tensor_start, tensor_count, blocks, nbytes, at, reply = got
            if not sends:
                channel = table.channel_of(link)
                if not isinstance(channel, SendsParts):
                    return False
                sends.append(functools.partial(channel.try_control_parts, CONTROL_REPLY))
            try:
                if write(engine, model_id, tensor_start, tensor_count, blocks,
                         memoryview(payload)[at:]) != readview.WRITTEN:
                    return False
            except Exception:   # noqa: BLE001 - anything unusual is the event loop's to answer
                return False
            # the bytes are in: from here on the call is answered with success, whatever the connections do
            if bound is not None:
                bound.begin()
                bound.end("success", now() - started, nbytes, len(blocks))
            with link.reader_lock:
                link.reader_bytes_in += nbytes
            try:
                sent = sends[0]([reply])
            except Exception:   # noqa: BLE001 - the connection broke: the loop's reply finds out and logs it
                sent = False
            if not sent:
                try:
                    loop.call_soon_threadsafe(self._reply_later, link, OwnerReply(cid, nbytes=nbytes))
                except RuntimeError:   # the loop is closed: the daemon is stopping
                    pass
            return True

        return write_here

    def _reply_later(self, link: RemoteLink, reply: OwnerReply) -> None:
        """A reply the reader thread could not send at once, from the event loop (``_write_here``)."""
        self.table.spawn(self._reply(link, reply))

    def _on_control(self, link: RemoteLink, kind: int, payload: bytes) -> None:
        if kind == CONTROL_DOWN:   # the channel went down, after every frame it handed over (``transport.base``)
            self.table.channel_went(link, payload.decode(errors="replace"))
            return
        link.last_seen = time.monotonic()   # any frame of the other end proves it alive (the sweeper reads this)
        try:
            if kind == CONTROL_REPLY:       # answers still count while the engine finalizes (its unlink calls)
                link.calls.on_reply(ownerwire.decode_reply(payload))
                return
            if self.table.closed:
                return
            cmd = ownerwire.decode_call(payload)
        except DataDistError as exc:
            self._undecodable(link, exc)
            return
        if isinstance(cmd, UnlinkCmd):
            # in frame order: the channel's end queued after this call (``CONTROL_DOWN``) is the unlink's, not a
            # fault, even when it is handled before the task answering the call has run
            link.unlinked_by_peer = True
        self._answering(link, self._answer(link, cmd))

    def _undecodable(self, link: RemoteLink, exc: DataDistError) -> None:
        """A frame of the other end that did not decode: a call that named its id is answered with the code
        (``RefusedCall``), anything else is dropped, logged."""
        if isinstance(exc, RefusedCall):
            self._answering(link, self._reply(link, OwnerReply(exc.command_id, int(exc.code), exc.message)))
        else:
            log.warning("cluster %s: dropped a control frame of cluster %s: %s", self.table.cluster_id,
                        link.remote_cluster, exc.message)

    async def _decode_aside(self, link: RemoteLink, payload: bytes, decoded: Callable[[], None]) -> None:
        """A call frame over ``_OFF_LOOP`` (a long block list: up to 2^20 numbers, 8 MiB), decoded on the daemon's
        threads as the link's peer -- so a peer's maximal frames cost its own thread share, not the event loop
        that answers every link's heartbeat and every tenant -- then answered as ``_on_control`` answers a call
        (its lists' bounds known: the owner's check is O(log n), ``core.layout``). ``decoded`` once it is."""
        try:
            if self.table.closed:   # as ``_on_control``: a finalizing engine answers no call
                return
            cmd = await self.table.in_thread_of(link.principal, ownerwire.decode_call, payload)
        except DataDistError as exc:
            self._undecodable(link, exc)
            return
        finally:
            decoded()
        if not self.table.closed:
            await self._answer(link, cmd)

    def _answering(self, link: RemoteLink, work: Coroutine[Any, Any, None]) -> None:
        """``work`` -- the answer to a call of the other end -- as a task, counted in ``link.usage.answering`` until
        it ends (``control_handler`` bounds what one link's other end holds here)."""
        link.usage.answering += 1

        async def counted() -> None:
            try:
                await work
            finally:
                link.usage.answering -= 1

        self.table.spawn(counted())

    async def _answer(self, link: RemoteLink, cmd: OwnerCall) -> None:
        """Run one owner call of the other end (any number run at once) and answer it with a REPLY frame."""
        try:
            if isinstance(cmd, OpenWriteCmd):
                tids = await self.owner.open_write_for(link, cmd.specs, cmd.timeout_ms, cmd.hold_ms)
                reply = OwnerReply(cmd.command_id, transfer_ids=tuple(tids))
            elif isinstance(cmd, CommitWriteCmd):
                await self.owner.commit_write_for(link, cmd.transfer_ids, cmd.timeout_ms)
                reply = OwnerReply(cmd.command_id)
            elif isinstance(cmd, ReadCmd) and cmd.inline:
                await self._answer_small(link, cmd)
                return
            elif isinstance(cmd, WriteCmd):
                await self._answer_write(link, cmd)
                return
            elif isinstance(cmd, ReadCmd):
                nbytes, release = await self.owner.read_for(link, cmd.transfer_id, cmd.spec, cmd.timeout_ms)
                reply = OwnerReply(cmd.command_id, nbytes=nbytes, release_needed=release)
            elif isinstance(cmd, ReleaseCmd):
                self.table.engine.release_pulled(cmd.key, cmd.tensor_start, cmd.tensor_count)
                reply = OwnerReply(cmd.command_id)
            elif isinstance(cmd, PingCmd):
                reply = OwnerReply(cmd.command_id)
            elif isinstance(cmd, NotifyCmd):
                self.table.engine.notifies.push(cmd.name, cmd.msg, link.remote_cluster)
                reply = OwnerReply(cmd.command_id)
            else:
                assert isinstance(cmd, UnlinkCmd)
                if self.table.links.get(link.remote_cluster) is link:  # gone before the other end hears back
                    del self.table.links[link.remote_cluster]
                self.table.peer_went(link.remote_cluster)
                reply = OwnerReply(cmd.command_id)
        except DataDistError as exc:
            reply = OwnerReply(cmd.command_id, int(exc.code), exc.message)
        await self._reply(link, reply, behind_reads=isinstance(cmd, ReadCmd))   # a read's, after its bytes
        if isinstance(cmd, UnlinkCmd):
            log.info("cluster %s: cluster %s unlinked from its end", self.table.cluster_id, link.remote_cluster)
            await self.table.forget(link)

    async def _answer_small(self, link: RemoteLink, cmd: ReadCmd) -> None:
        """A small read answered with its bytes (``Owner.read_small``), as a task: what ``_read_here`` did not
        settle. It counts as one of the link's owner calls until the reply is out, so a peer that asks and stops
        reading holds at most ``link_calls_in_flight`` replies here."""
        limits = self.table.node.link_limits
        timeout = limits.clamp(cmd.timeout_ms or self.table.engine.options.sync_kv_timeout_ms)
        try:
            await link.usage.enter_call(limits, time.monotonic() + timeout / 1000)
        except DataDistError as exc:
            await self._reply(link, OwnerReply(cmd.command_id, int(exc.code), exc.message))
            return
        try:
            try:
                data, release = await self.owner.read_small(link, cmd.spec)
                reply = OwnerReply(cmd.command_id, nbytes=len(data), release_needed=release, data=data)
            except DataDistError as exc:
                reply = OwnerReply(cmd.command_id, int(exc.code), exc.message)
            await self._reply(link, reply)
        finally:
            link.usage.exit_call()

    async def _answer_write(self, link: RemoteLink, cmd: WriteCmd) -> None:
        """A small push carrying its bytes (``Owner.write_small``), as a task: what ``_write_here`` did not settle;
        one of the link's owner calls while it runs (as ``_answer_small``)."""
        limits = self.table.node.link_limits
        timeout = limits.clamp(cmd.timeout_ms or self.table.engine.options.sync_kv_timeout_ms)
        try:
            await link.usage.enter_call(limits, time.monotonic() + timeout / 1000)
        except DataDistError as exc:
            await self._reply(link, OwnerReply(cmd.command_id, int(exc.code), exc.message))
            return
        try:
            try:
                nbytes = await self.owner.write_small(link, cmd.spec, cmd.data)
                reply = OwnerReply(cmd.command_id, nbytes=nbytes)
            except DataDistError as exc:
                reply = OwnerReply(cmd.command_id, int(exc.code), exc.message)
            await self._reply(link, reply)
        finally:
            link.usage.exit_call()

    def _reply_seconds(self) -> float:
        return max(1.0, self.table.engine.options.sync_kv_timeout_ms / 1000)

    async def _reply(self, link: RemoteLink, reply: OwnerReply, behind_reads: bool = False) -> None:
        """A REPLY on the link's channel: from the loop on an idle connection or the executor (a connection's lock
        is handed over per frame: it waits for one frame of the link's reads at most) -- but a read's own
        (``behind_reads``) goes behind the link's reads being sent when a sender drains them
        (``Owner.queued_control``). Only a read's: any other answer, a heartbeat's ping above all, queued there
        would wait for every byte of the reads before it (a 256 MB read: seconds; the linking daemon breaks the
        link after max(interval, 1 s) without an answer, the serving end drops it after 3 intervals silent)."""
        deadline = time.monotonic() + self._reply_seconds()
        payload = ownerwire.encode_reply(reply)
        try:
            channel = self.table.channel_of(link)
            queued = None
            if behind_reads and channel is not None and not channel.broken:
                queued = self.owner.queued_control(link, channel, CONTROL_REPLY, payload, deadline)
            if queued is not None:
                await queued
            else:
                await self._control_frame(channel, link.remote_cluster, CONTROL_REPLY, payload, deadline,
                                          link.principal)
        except DataDistError as exc:   # a link dropped (its reason logged once) may leave thousands unanswered
            log.log(logging.DEBUG if link.calls.closed else logging.INFO, "cluster %s: cannot answer call %s of "
                    "cluster %s: %s", self.table.cluster_id, reply.command_id, link.remote_cluster, exc)


class _Inbox:
    """One link's control frames on their way from its connections' reader threads to the event loop, which
    drains every queued frame per wake-up (``_CONTROL_DRAIN`` frames and ``_DRAIN_BYTES`` decoded at most per
    turn; a call with a long list is decoded off the loop, ``OwnerCalls._decode_aside``): many replies and calls in
    flight cost one wake-up, not one each. Bounded with the answers running (``_QUEUED_FRAMES``,
    ``_QUEUED_BYTES``): a frame past the bound drops the link (``ControlRefused``); the channel's end
    (``CONTROL_DOWN``) is always queued."""

    __slots__ = ("calls", "link", "loop", "frames", "held", "lock")

    def __init__(self, calls: OwnerCalls, link: RemoteLink) -> None:
        self.calls = calls
        self.link = link
        self.loop = asyncio.get_running_loop()
        self.frames: collections.deque[tuple[int, bytes]] = collections.deque()
        self.held = 0                   # bytes of the frames queued (and of the ones being decoded off the loop)
        self.lock = threading.Lock()    # the readers of the link's connections (one thread each) and the loop

    def put(self, kind: int, payload: bytes) -> None:
        """A reader thread: queue the frame, waking the loop when the queue was empty."""
        link = self.link
        with self.lock:
            queued = len(self.frames) + link.usage.answering
            over = kind != CONTROL_DOWN and (queued >= _QUEUED_FRAMES or self.held + len(payload) > _QUEUED_BYTES)
            if not over:
                self.frames.append((kind, payload))
                self.held += len(payload)
            first = not over and len(self.frames) == 1   # nothing scheduled to drain it yet
        if over:
            log.warning("cluster %s: cluster %s has more than %d control frames (or %d MiB) waiting here: it sends "
                        "faster than it is answered; dropping its link", self.calls.table.cluster_id,
                        link.remote_cluster, _QUEUED_FRAMES, _QUEUED_BYTES >> 20)
            raise ControlRefused(f"more than {_QUEUED_FRAMES} control frames (or {_QUEUED_BYTES >> 20} MiB) waiting "
                                 f"for the link of cluster {link.remote_cluster}")
        if first:
            try:
                self.loop.call_soon_threadsafe(self.drain)
            except RuntimeError:   # the loop is closed: the daemon is stopping
                pass

    def decoded(self, size: int) -> None:
        """A frame decoded off the loop no longer counts in ``held``."""
        with self.lock:
            self.held -= size

    def drain(self) -> None:
        """The loop: a turn's worth of queued frames, each handled (``OwnerCalls._on_control``); the rest after the
        loop's other work."""
        calls, link, budget = self.calls, self.link, _DRAIN_BYTES
        for _ in range(_CONTROL_DRAIN):
            with self.lock:
                if not self.frames:
                    return
                kind, payload = self.frames.popleft()
                size = len(payload)
                aside = kind == CONTROL_CALL and size > _OFF_LOOP and ownerwire.parsed_size(payload) > _OFF_LOOP
                if not aside:   # else it counts until decoded (``decoded``)
                    self.held -= size
            if aside:
                link.last_seen = time.monotonic()   # as ``_on_control``: the sweeper must hear of this frame
                calls._answering(link, calls._decode_aside(link, payload, functools.partial(self.decoded, size)))
                continue
            calls._on_control(link, kind, payload)
            budget -= size
            if budget <= 0:
                break
        if self.frames:
            self.loop.call_soon(self.drain)
