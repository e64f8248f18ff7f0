"""The reverse control path of a link: makes the *serving* end of a link as able as the linking one.

``link_clusters`` is one-sided to set up: the decoder links to the prompt's listener and the prompt
has no address of the decoder to call. Yet in CANN a link has two ends and either may pull and
push over it (its docs: client/server is unrelated to the prompt/decoder role; its C++ builds a
full link entity on the server too). So right after the handshake the linking daemon opens a
``Peer.Reverse`` stream to the serving daemon and keeps it open for the life of the link; over it
the serving side sends the owner calls a transfer needs (``Read`` / ``Release`` for a pull,
``OpenWrite`` / ``CommitWrite`` for a push, on the linking side's caches) and ``Unlink``; the
linking side answers each one. The bytes themselves travel over the link's data channel, in
whichever direction the transfer goes.

``ReverseHub`` (serving side) looks like the part of ``PeerClient`` a transfer uses, so the
transfer code is the same at both ends. Any number of calls may be in flight at once: commands
carry ids, replies are matched to them. No grpc here: the rpc layer moves the records.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass
from typing import Union

from .core.errors import DataDistError, StatusCode
from .core.types import CacheKeyRef, IdIndexRef, RemoteSpec

__all__ = ["OpenWriteCmd", "CommitWriteCmd", "ReadCmd", "ReleaseCmd", "UnlinkCmd", "ReverseCmd", "ReverseReply",
           "ReverseHub"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OpenWriteCmd:
    command_id: int
    session: bytes
    spec: RemoteSpec
    timeout_ms: int


@dataclass(frozen=True)
class CommitWriteCmd:
    command_id: int
    session: bytes
    transfer_id: int
    timeout_ms: int


@dataclass(frozen=True)
class ReadCmd:
    command_id: int
    session: bytes
    transfer_id: int
    spec: RemoteSpec
    timeout_ms: int


@dataclass(frozen=True)
class ReleaseCmd:
    command_id: int
    session: bytes
    key: "CacheKeyRef | IdIndexRef"
    tensor_start: int
    tensor_count: int


@dataclass(frozen=True)
class UnlinkCmd:
    command_id: int
    session: bytes


ReverseCmd = Union[OpenWriteCmd, CommitWriteCmd, ReadCmd, ReleaseCmd, UnlinkCmd]


@dataclass(frozen=True)
class ReverseReply:
    command_id: int
    status: int = 0
    message: str = ""
    transfer_id: int = 0
    nbytes: int = 0                 # read: bytes sent
    release_needed: bool = False    # read: confirm the receipt with a release


class ReverseHub:
    """Serving side of one link's reverse path: queue commands, match replies, bound every wait."""

    def __init__(self, remote_cluster: int) -> None:
        self.remote_cluster = remote_cluster
        self._queue: asyncio.Queue[ReverseCmd | None] = asyncio.Queue()
        self._pending: dict[int, asyncio.Future[ReverseReply]] = {}
        self._ids = itertools.count(1)
        self._attached = asyncio.Event()
        self.closed = False
        self.reason = ""

    # ---- the rpc side (the Reverse stream of the Peer service) ---------------------------------

    def attach(self) -> None:
        if self.closed:
            raise DataDistError(StatusCode.LLM_NOT_YET_LINK, f"the link of cluster {self.remote_cluster} is gone")
        self._attached.set()

    async def next_command(self) -> ReverseCmd | None:
        """The next command to send; ``None`` once the hub is closed."""
        if self.closed:
            return None
        return await self._queue.get()

    def on_reply(self, reply: ReverseReply) -> None:
        fut = self._pending.pop(reply.command_id, None)
        if fut is not None and not fut.done():
            fut.set_result(reply)

    def close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.reason = reason
        self._queue.put_nowait(None)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(DataDistError(StatusCode.LLM_LINK_FAILED,
                                                f"reverse path to cluster {self.remote_cluster} closed: {reason}"))
        self._pending.clear()

    # ---- the push side (what LinkManager calls, shaped like PeerClient) --------------------------

    async def _call(self, make: "type[ReverseCmd]", timeout: float, *args: object) -> ReverseReply:
        if self.closed:
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                f"reverse path to cluster {self.remote_cluster} is closed ({self.reason})")
        if timeout <= 0:
            raise DataDistError(StatusCode.LLM_TIMEOUT, "deadline passed before the reverse call")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if not self._attached.is_set():  # the linking side opens the stream right after the handshake
            try:
                await asyncio.wait_for(self._attached.wait(), timeout)
            except asyncio.TimeoutError:
                raise DataDistError(StatusCode.LLM_TIMEOUT,
                                    f"cluster {self.remote_cluster} never opened the reverse path of its link "
                                    f"(an older daemon?); this side cannot transfer over it") from None
        command_id = next(self._ids)
        timeout_ms = max(1, int((deadline - loop.time()) * 1000))
        cmd = (make(command_id, *args, timeout_ms) if make in _TIMED  # type: ignore[call-arg]
               else make(command_id, *args))  # type: ignore[call-arg]
        fut: asyncio.Future[ReverseReply] = loop.create_future()
        self._pending[command_id] = fut
        self._queue.put_nowait(cmd)
        try:
            reply = await asyncio.wait_for(fut, max(0.001, deadline - loop.time()))
        except asyncio.TimeoutError:
            raise DataDistError(StatusCode.LLM_TIMEOUT,
                                f"cluster {self.remote_cluster} did not answer a reverse call in time") from None
        finally:
            self._pending.pop(command_id, None)
        if reply.status != 0:
            try:
                code = StatusCode(reply.status)
            except ValueError:
                code = StatusCode.LLM_FAILED
            raise DataDistError(code, reply.message)
        return reply

    async def open_write(self, session: bytes, spec: RemoteSpec, timeout: float) -> int:
        reply = await self._call(OpenWriteCmd, timeout, session, spec)
        return reply.transfer_id

    async def commit_write(self, session: bytes, transfer_id: int, timeout: float) -> None:
        await self._call(CommitWriteCmd, timeout, session, transfer_id)

    async def read(self, session: bytes, transfer_id: int, spec: RemoteSpec, timeout: float) -> tuple[int, bool]:
        reply = await self._call(ReadCmd, timeout, session, transfer_id, spec)
        return reply.nbytes, reply.release_needed

    async def release(self, session: bytes, key: CacheKeyRef | IdIndexRef, tensor_start: int, tensor_count: int,
                      timeout: float) -> None:
        await self._call(ReleaseCmd, timeout, session, key, tensor_start, tensor_count)

    async def unlink(self, session: bytes, timeout: float) -> None:
        await self._call(UnlinkCmd, timeout, session)


_TIMED = (OpenWriteCmd, CommitWriteCmd, ReadCmd)  # commands that carry the caller's remaining time
