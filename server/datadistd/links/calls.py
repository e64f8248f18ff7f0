"""Owner calls to and from the other end of a link, as frames on its data channel (``ownercalls``): sending
one (``_frame_calls``), handing an incoming frame from a reader thread to the event loop
(``_control_handler``), and the one place that runs a call of the other end (``_answer``)."""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from typing import Any, Callable, Coroutine

from ..core.errors import DataDistError, StatusCode
from ..state import readview
from ..state.metrics import track_transfer
from ..transport.base import CONTROL_CALL, CONTROL_DOWN, CONTROL_REPLY, Channel, ControlRefused
from .model import LinkState, RemoteLink
from .owner import Owner
from .table import LinkTable
from .wire import ownerwire
from .wire.framecalls import FrameCalls
from .wire.ownercalls import (
    INLINE_READ_MAX,
    CommitWriteCmd,
    DoneReadCmd,
    GrantReadCmd,
    OpenWriteCmd,
    OwnerCall,
    OwnerReply,
    PingCmd,
    ReadCmd,
    RefusedCall,
    ReleaseCmd,
    UnlinkCmd,
)

log = logging.getLogger("datadistd.links")

#: control frames one wake-up of the event loop handles before it lets other work run
_CONTROL_DRAIN = 64
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
        """What the data channel's reader threads call with a control frame: queue it for the event loop, which
        drains every queued frame per wake-up (``_CONTROL_DRAIN`` at most per turn): many replies and calls in
        flight cost one wake-up, not one each. The queue is bounded with the answers running (``_QUEUED_FRAMES``,
        ``_QUEUED_BYTES``): a frame past the bound drops the link (``ControlRefused``); the channel's end
        (``CONTROL_DOWN``) is always queued."""
        loop = asyncio.get_running_loop()
        inbox: collections.deque[tuple[int, bytes]] = collections.deque()
        held = [0]                  # bytes of the frames in ``inbox``
        lock = threading.Lock()     # the readers of the link's connections (one thread each) and the loop

        def drain() -> None:
            for _ in range(_CONTROL_DRAIN):
                with lock:
                    if not inbox:
                        return
                    kind, payload = inbox.popleft()
                    held[0] -= len(payload)
                self._on_control(link, kind, payload)
            if inbox:   # more than a turn's worth: the rest after the loop's other work
                loop.call_soon(drain)

        take_reply = link.calls.take_reply

        def handler(kind: int, payload: bytes) -> None:
            if kind == CONTROL_REPLY and take_reply(payload):   # a small pull's reply, landed here (``fast_pull``)
                link.last_seen = time.monotonic()   # as ``_on_control``: the sweeper must hear of this frame
                return
            if kind == CONTROL_CALL and ownerwire.is_inline_read(payload) and self._answer_here(link, payload):
                return
            first = False
            with lock:
                queued = len(inbox) + link.usage.answering
                over = kind != CONTROL_DOWN and (queued >= _QUEUED_FRAMES or held[0] + len(payload) > _QUEUED_BYTES)
                if not over:
                    inbox.append((kind, payload))
                    held[0] += len(payload)
                    first = len(inbox) == 1   # the queue was empty: nothing scheduled to drain it (``drain``)
            if over:
                log.warning("cluster %s: cluster %s has more than %d control frames (or %d MiB) waiting here: it "
                            "sends faster than it is answered; dropping its link", self.table.cluster_id,
                            link.remote_cluster, _QUEUED_FRAMES, _QUEUED_BYTES >> 20)
                raise ControlRefused(f"more than {_QUEUED_FRAMES} control frames (or {_QUEUED_BYTES >> 20} MiB) "
                                     f"waiting for the link of cluster {link.remote_cluster}")
            if first:
                try:
                    loop.call_soon_threadsafe(drain)
                except RuntimeError:   # the loop is closed: the daemon is stopping
                    pass

        return handler

    def _answer_here(self, link: RemoteLink, payload: bytes) -> bool:
        """A small read answered by the data reader thread that read it (``readview``): the bytes by the
        engine's published read view, the reply sent on an idle connection without blocking. False, with
        nothing sent and nothing counted, for anything else -- a stale view, another key, a refusal, a busy
        connection, an error: the event loop answers it as before, with its status code. A reader thread
        answers one frame at a time, so this holds at most one reply per connection."""
        table = self.table
        if (table.closed or table.reads is not None or link.state != LinkState.ESTABLISHED
                or not link.usage.has_turn(table.node.link_limits)):   # at its call cap: the loop queues or refuses
            return False
        link.last_seen = time.monotonic()   # as ``_on_control``: the sweeper must hear of this frame
        try:
            cmd = ownerwire.decode_call(payload)
        except DataDistError:   # a frame the event loop refuses (or drops) with its status code
            return False
        assert isinstance(cmd, ReadCmd)   # ``is_inline_read`` said so
        with track_transfer(table.node.metrics, "serve_read", table.cluster_id, link.remote_cluster) as tracked:
            try:
                data = readview.read_now(table.engine, cmd.spec, INLINE_READ_MAX)
                sent = data is not None and self._try_reply(link, OwnerReply(cmd.command_id, nbytes=len(data),
                                                                             data=data))
            except Exception:   # noqa: BLE001 - anything unusual is the event loop's to answer
                sent = False
            if not sent or data is None:
                tracked.hand_on()
                return False
            tracked.done(len(data), len(cmd.spec.blocks))
        with link.reader_lock:
            link.reader_bytes_out += len(data)
        return True

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
        except RefusedCall as exc:
            self._answering(link, self._reply(link, OwnerReply(exc.command_id, int(exc.code), exc.message)))
            return
        except DataDistError as exc:
            log.warning("cluster %s: dropped a control frame of cluster %s: %s", self.table.cluster_id,
                        link.remote_cluster, exc.message)
            return
        if isinstance(cmd, UnlinkCmd):
            # in frame order: the channel's end queued after this call (``CONTROL_DOWN``) is the unlink's, not a
            # fault, even when it is handled before the task answering the call has run
            link.unlinked_by_peer = True
        if isinstance(cmd, ReadCmd) and cmd.inline:
            if self.table.reads is None and not readview.current(self.table.engine):
                readview.publish(self.table.engine)   # what the reader threads read the next ones by
            if self._answer_inline_now(link, cmd):
                return
        self._answering(link, self._answer(link, cmd))

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
                tids = self.owner.open_write_for(link, cmd.specs, cmd.timeout_ms, cmd.hold_ms)
                reply = OwnerReply(cmd.command_id, transfer_ids=tuple(tids))
            elif isinstance(cmd, CommitWriteCmd):
                await self.owner.commit_write_for(link, cmd.transfer_ids, cmd.timeout_ms)
                reply = OwnerReply(cmd.command_id)
            elif isinstance(cmd, ReadCmd) and cmd.inline:
                await self._answer_inline(link, cmd)
                return
            elif isinstance(cmd, ReadCmd):
                nbytes, release = await self.owner.read_for(link, cmd.transfer_id, cmd.spec, cmd.timeout_ms)
                reply = OwnerReply(cmd.command_id, nbytes=nbytes, release_needed=release)
            elif isinstance(cmd, ReleaseCmd):
                self.table.engine.release_pulled(cmd.key, cmd.tensor_start, cmd.tensor_count)
                reply = OwnerReply(cmd.command_id)
            elif isinstance(cmd, PingCmd):
                reply = OwnerReply(cmd.command_id)
            elif isinstance(cmd, GrantReadCmd):
                grant_id, grant, release = self.owner.grant_read_for(link, cmd.spec, cmd.timeout_ms)
                reply = OwnerReply(cmd.command_id, transfer_ids=(grant_id,), grant=grant, release_needed=release)
            elif isinstance(cmd, DoneReadCmd):
                self.owner.done_read_for(link, cmd.grant_id, cmd.consume)
                reply = OwnerReply(cmd.command_id)
            else:
                assert isinstance(cmd, UnlinkCmd)
                if self.table.links.get(link.remote_cluster) is link:  # gone before the other end hears back
                    del self.table.links[link.remote_cluster]
                self.table.peer_went(link.remote_cluster)
                reply = OwnerReply(cmd.command_id)
        except DataDistError as exc:
            reply = OwnerReply(cmd.command_id, int(exc.code), exc.message)
        await self._reply(link, reply)
        if isinstance(cmd, UnlinkCmd):
            log.info("cluster %s: cluster %s unlinked from its end", self.table.cluster_id, link.remote_cluster)
            await self.table.forget(link)

    def _answer_inline_now(self, link: RemoteLink, cmd: ReadCmd) -> bool:
        """A small read answered here and now, no task: when the link has a turn free at once, the memory is
        mapped and a connection takes the reply without blocking (else the reply goes from a thread, the call
        still counted). False, with nothing done, when there is no turn or the memory is not mapped: the task
        path (``_answer_inline``) answers it."""
        if not link.usage.try_enter_call(self.table.node.link_limits):
            return False
        counted = True
        try:
            try:
                got = self.owner.read_inline_now(link, cmd.spec)
                if got is None:
                    return False
                reply = OwnerReply(cmd.command_id, nbytes=len(got[0]), release_needed=got[1], data=got[0])
            except DataDistError as exc:
                reply = OwnerReply(cmd.command_id, int(exc.code), exc.message)
            try:
                if self._try_reply(link, reply):
                    return True
            except DataDistError as exc:
                log.info("cluster %s: cannot answer call %s of cluster %s: %s", self.table.cluster_id,
                         cmd.command_id, link.remote_cluster, exc)
                return True
            counted = False   # handed on: the task ends the call once the reply is out
            self._answering(link, self._reply_then_exit(link, reply))
            return True
        finally:
            if counted:
                link.usage.exit_call()

    async def _reply_then_exit(self, link: RemoteLink, reply: OwnerReply) -> None:
        try:
            await self._reply(link, reply)
        finally:
            link.usage.exit_call()

    async def _answer_inline(self, link: RemoteLink, cmd: ReadCmd) -> None:
        """A small read answered with its bytes, as a task (no turn free at once, or memory copied in a thread).
        It counts as one of the link's owner calls until the reply is out, so a peer that asks and stops reading
        holds at most ``link_calls_in_flight`` replies here."""
        limits = self.table.node.link_limits
        timeout = limits.clamp(cmd.timeout_ms or self.table.engine.options.sync_kv_timeout_ms)
        try:
            await link.usage.enter_call(limits, time.monotonic() + timeout / 1000)
        except DataDistError as exc:
            await self._reply(link, OwnerReply(cmd.command_id, int(exc.code), exc.message))
            return
        try:
            try:
                data, release = await self.owner.read_inline(link, cmd.spec)
                reply = OwnerReply(cmd.command_id, nbytes=len(data), release_needed=release, data=data)
            except DataDistError as exc:
                reply = OwnerReply(cmd.command_id, int(exc.code), exc.message)
            await self._reply(link, reply)
        finally:
            link.usage.exit_call()

    def _try_reply(self, link: RemoteLink, reply: OwnerReply) -> bool:
        """``reply`` on an idle connection of the link without blocking (any thread); False, nothing sent, when
        none takes it now or the link has no live channel."""
        channel = self.table.channel_of(link)
        return channel is not None and not channel.broken and channel.try_control(
            CONTROL_REPLY, ownerwire.encode_reply(reply), time.monotonic() + self._reply_seconds())

    def _reply_seconds(self) -> float:
        return max(1.0, self.table.engine.options.sync_kv_timeout_ms / 1000)

    async def _reply(self, link: RemoteLink, reply: OwnerReply) -> None:
        deadline = time.monotonic() + self._reply_seconds()
        try:
            await self._control_frame(self.table.channel_of(link), link.remote_cluster, CONTROL_REPLY,
                                      ownerwire.encode_reply(reply), deadline, link.principal)
        except DataDistError as exc:   # a link dropped (its reason logged once) may leave thousands unanswered
            log.log(logging.DEBUG if link.calls.closed else logging.INFO, "cluster %s: cannot answer call %s of "
                    "cluster %s: %s", self.table.cluster_id, reply.command_id, link.remote_cluster, exc)
