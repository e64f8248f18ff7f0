"""Owner calls to and from the other end: as frames on the data connection (``FrameCalls``) or on the
reverse stream, and the one place that runs a call of the other end (``_answer_reverse``)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

from ..core.errors import DataDistError, StatusCode
from ..reverse import (
    CommitWriteCmd,
    FrameCalls,
    OpenWriteCmd,
    ReadCmd,
    ReleaseCmd,
    ReverseCmd,
    ReverseHub,
    ReverseReply,
    UnlinkCmd,
)
from ..transport.base import CONTROL_CALL, CONTROL_REPLY, CallChannel
from .core import LinkCore
from .model import Link, LinkState, OutboundLink

log = logging.getLogger("datadistd.links")


class OwnerCalls(LinkCore):
    def _frame_calls(self, link: Link) -> FrameCalls:
        codec = self.node.call_codec
        assert codec is not None

        async def send(payload: bytes, deadline: float) -> None:
            await self._control_frame(link, CONTROL_CALL, payload, deadline)

        return FrameCalls(link.remote_cluster, codec, send)

    async def _control_frame(self, link: Link, kind: int, payload: bytes, deadline: float) -> None:
        """One control frame on the link's channel: from the event loop when a connection is idle (no thread
        hop), else from the executor, waiting for a connection until ``deadline``."""
        channel = self._channel_of(link)
        if not isinstance(channel, CallChannel) or channel.broken:
            raise DataDistError(StatusCode.LLM_LINK_FAILED, f"no live data connection to cluster {link.remote_cluster}")
        if not channel.try_control(kind, payload, deadline):
            await self._in_thread(channel.send_control, kind, payload, deadline)

    def _control_handler(self, link: Link) -> Callable[[int, bytes], None]:
        """What the data channel's reader threads call with a control frame: hand it to the event loop."""
        loop = asyncio.get_running_loop()

        def handler(kind: int, payload: bytes) -> None:
            try:
                loop.call_soon_threadsafe(self._on_control, link, kind, payload)
            except RuntimeError:   # the loop is closed: the daemon is stopping
                pass

        return handler

    def _on_control(self, link: Link, kind: int, payload: bytes) -> None:
        codec, frames = self.node.call_codec, link.frames
        if codec is None or frames is None or self.closed:
            return
        try:
            if kind == CONTROL_REPLY:
                frames.on_reply(codec.decode_reply(payload))
                return
            cmd = codec.decode_command(payload)
        except DataDistError as exc:
            log.warning("cluster %s: dropped a control frame of cluster %s: %s", self.cluster_id,
                        link.remote_cluster, exc.message)
            return
        if isinstance(cmd, UnlinkCmd):   # unlinking stays on the control plane (gRPC)
            return

        async def send_reply(reply: ReverseReply) -> None:
            deadline = time.monotonic() + max(1.0, self.engine.options.sync_kv_timeout_ms / 1000)
            await self._control_frame(link, CONTROL_REPLY, codec.encode_reply(reply), deadline)

        self._spawn(self._answer_reverse(link, send_reply, cmd))

    def attach_reverse(self, session: bytes) -> ReverseHub:
        """Serving side: the linking daemon opened the reverse stream of its link."""
        link = self.session_link(session)
        link.reverse.attach()
        return link.reverse

    async def _serve_reverse(self, link: OutboundLink) -> None:
        """Linking side: answer the serving side's owner calls for the life of the link."""
        stream = None
        jobs: set[asyncio.Task[None]] = set()  # keep references: the loop holds tasks only weakly
        try:
            stream = await link.peer.reverse(link.session)
            async for cmd in stream.commands():
                job = asyncio.get_running_loop().create_task(self._answer_reverse(link, stream.reply, cmd))
                jobs.add(job)
                job.add_done_callback(jobs.discard)
        except DataDistError as exc:
            if link.state == LinkState.ESTABLISHED and not self.closed:
                log.info("cluster %s: reverse path of the link to cluster %s ended: %s", self.cluster_id,
                         link.remote_cluster, exc)
        finally:
            if stream is not None:
                await stream.close()

    async def _answer_reverse(self, link: Link, send_reply: Callable[[ReverseReply], Awaitable[None]],
                              cmd: ReverseCmd) -> None:
        """Run one owner call of the other end (any number run at once) and answer it: the serving end's
        calls on the reverse stream, or either end's as data-channel frames."""
        try:
            if isinstance(cmd, OpenWriteCmd):
                tids = self.open_write_for(link, cmd.specs, cmd.timeout_ms, cmd.hold_ms)
                reply = ReverseReply(cmd.command_id, transfer_ids=tuple(tids))
            elif isinstance(cmd, CommitWriteCmd):
                await self.commit_write_for(link, cmd.transfer_ids, cmd.timeout_ms)
                reply = ReverseReply(cmd.command_id)
            elif isinstance(cmd, ReadCmd):
                nbytes, release = await self.read_for(link, cmd.transfer_id, cmd.spec, cmd.timeout_ms)
                reply = ReverseReply(cmd.command_id, nbytes=nbytes, release_needed=release)
            elif isinstance(cmd, ReleaseCmd):
                self.engine.release_pulled(cmd.key, cmd.tensor_start, cmd.tensor_count)
                reply = ReverseReply(cmd.command_id)
            else:
                assert isinstance(cmd, UnlinkCmd)
                if self.links.get(link.remote_cluster) is link:  # gone before the serving end hears back
                    del self.links[link.remote_cluster]
                reply = ReverseReply(cmd.command_id)
        except DataDistError as exc:
            reply = ReverseReply(cmd.command_id, int(exc.code), exc.message)
        try:
            await send_reply(reply)
        except DataDistError as exc:
            log.info("cluster %s: cannot answer reverse call %s of cluster %s: %s", self.cluster_id,
                     cmd.command_id, link.remote_cluster, exc)
        if isinstance(cmd, UnlinkCmd):
            log.info("cluster %s: cluster %s unlinked from its end", self.cluster_id, link.remote_cluster)
            await self._close_link(link, notify=False)
