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

``FrameCalls`` is the same calls on the link's *data channel* (transports that can carry control
frames: ``transport.base.CallChannel``): a command is one CALL frame, its answer one REPLY frame,
read and answered by the data plane's reader threads -- no gRPC call on a transfer's path. Both ends
of a link use it when both speak it (peer protocol 2); ``CallCodec`` turns the records into bytes
(the rpc layer provides the protobuf one, ``ReverseCommand``/``ReverseReply``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol, Sequence, Union

from .core.errors import DataDistError, StatusCode
from .core.types import CacheKeyRef, IdIndexRef, RemoteSpec

__all__ = ["OpenWriteCmd", "CommitWriteCmd", "ReadCmd", "ReleaseCmd", "UnlinkCmd", "ReverseCmd", "ReverseReply",
           "CallHub", "ReverseHub", "FrameCalls", "CallCodec", "MAX_OPEN_PER_CALL", "checked_ids"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OpenWriteCmd:
    """Open one incoming transfer per spec (a layer-wise push opens every layer of a target at once);
    they may wait ``hold_ms`` for their bytes and commit (0: ``timeout_ms``)."""

    command_id: int
    session: bytes
    specs: tuple[RemoteSpec, ...]
    timeout_ms: int
    hold_ms: int = 0


@dataclass(frozen=True)
class CommitWriteCmd:
    """Wait until every byte of the named transfers arrived (they end together: the first failure
    cancels the rest)."""

    command_id: int
    session: bytes
    transfer_ids: tuple[int, ...]
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
    transfer_ids: tuple[int, ...] = ()   # open write: one per spec, in order
    nbytes: int = 0                 # read: bytes sent
    release_needed: bool = False    # read: confirm the receipt with a release


#: most transfers one OpenWrite may open (a layer-wise push opens a target's layers at once: a model's
#: layers, up to two pieces each); more is refused with ``LLM_PARAM_INVALID`` before anything is opened
MAX_OPEN_PER_CALL = 2048


def checked_ids(ids: Sequence[int], asked: int, who: str) -> list[int]:
    """The transfer ids an OpenWrite answered: one per spec asked for, else the other end is not this protocol's."""
    if len(ids) != asked:
        raise DataDistError(StatusCode.LLM_FAILED, f"{who} opened {len(ids)} transfers for {asked} pieces "
                                                   f"(a daemon of another version?)")
    return list(ids)


class CallCodec(Protocol):
    """Commands and replies as bytes (for ``FrameCalls``)."""

    def encode_command(self, cmd: ReverseCmd) -> bytes: ...

    def decode_command(self, data: bytes) -> ReverseCmd: ...

    def encode_reply(self, reply: ReverseReply) -> bytes: ...

    def decode_reply(self, data: bytes) -> ReverseReply: ...


class CallHub:
    """Owner calls to the other end of one link: command ids, replies matched to them, every wait bounded.
    Subclasses say how a command leaves (``_send``)."""

    what = "owner calls"

    def __init__(self, remote_cluster: int) -> None:
        self.remote_cluster = remote_cluster
        self._pending: dict[int, asyncio.Future[ReverseReply]] = {}
        self._ids = itertools.count(1)
        self._attached = asyncio.Event()
        self.closed = False
        self.reason = ""

    async def _send(self, cmd: ReverseCmd, deadline: float) -> None:
        raise NotImplementedError

    def on_reply(self, reply: ReverseReply) -> None:
        fut = self._pending.pop(reply.command_id, None)
        if fut is not None and not fut.done():
            fut.set_result(reply)

    def close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.reason = reason
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(DataDistError(StatusCode.LLM_LINK_FAILED,
                                                f"{self.what} to cluster {self.remote_cluster} closed: {reason}"))
        self._pending.clear()

    # ---- the push side (what LinkManager calls, shaped like PeerClient) --------------------------

    async def _call(self, make: Callable[[int, int], ReverseCmd], timeout: float) -> ReverseReply:
        """``make(command_id, timeout_ms)`` builds the command once its id and the time left are known."""
        if self.closed:
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                f"{self.what} to cluster {self.remote_cluster} closed ({self.reason})")
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
        cmd = make(command_id, timeout_ms)
        fut: asyncio.Future[ReverseReply] = loop.create_future()
        self._pending[command_id] = fut
        try:
            await self._send(cmd, deadline)
            reply = await asyncio.wait_for(fut, max(0.001, deadline - loop.time()))
        except asyncio.TimeoutError:
            raise DataDistError(StatusCode.LLM_TIMEOUT,
                                f"cluster {self.remote_cluster} did not answer a call ({self.what}) in time") from None
        finally:
            self._pending.pop(command_id, None)
        if reply.status != 0:
            try:
                code = StatusCode(reply.status)
            except ValueError:
                code = StatusCode.LLM_FAILED
            raise DataDistError(code, reply.message)
        return reply

    async def open_write(self, session: bytes, specs: Sequence[RemoteSpec], timeout: float,
                         hold_ms: int = 0) -> list[int]:
        reply = await self._call(lambda cid, ms: OpenWriteCmd(cid, session, tuple(specs), ms, hold_ms), timeout)
        return checked_ids(reply.transfer_ids, len(specs), f"cluster {self.remote_cluster}")

    async def commit_write(self, session: bytes, transfer_ids: Sequence[int], timeout: float) -> None:
        await self._call(lambda cid, ms: CommitWriteCmd(cid, session, tuple(transfer_ids), ms), timeout)

    async def read(self, session: bytes, transfer_id: int, spec: RemoteSpec, timeout: float) -> tuple[int, bool]:
        reply = await self._call(lambda cid, ms: ReadCmd(cid, session, transfer_id, spec, ms), timeout)
        return reply.nbytes, reply.release_needed

    async def release(self, session: bytes, key: CacheKeyRef | IdIndexRef, tensor_start: int, tensor_count: int,
                      timeout: float) -> None:
        await self._call(lambda cid, ms: ReleaseCmd(cid, session, key, tensor_start, tensor_count), timeout)

    async def unlink(self, session: bytes, timeout: float) -> None:
        await self._call(lambda cid, ms: UnlinkCmd(cid, session), timeout)


class ReverseHub(CallHub):
    """Serving side of one link's reverse path: commands queue for the linking side's ``Reverse`` stream."""

    what = "reverse path"

    def __init__(self, remote_cluster: int) -> None:
        super().__init__(remote_cluster)
        self._queue: asyncio.Queue[ReverseCmd | None] = asyncio.Queue()

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

    async def _send(self, cmd: ReverseCmd, deadline: float) -> None:
        self._queue.put_nowait(cmd)

    def close(self, reason: str) -> None:
        if not self.closed:
            self._queue.put_nowait(None)
        super().close(reason)


class FrameCalls(CallHub):
    """Owner calls as CALL/REPLY frames on the link's data channel (either end of the link).

    ``send(payload, deadline)`` puts one CALL frame on the channel (awaitable; the caller's transport
    code decides whether that needs a thread); replies arrive through ``on_reply``, commands of the
    other end through the link manager (it decodes them with the same ``codec``)."""

    what = "data-channel calls"

    def __init__(self, remote_cluster: int, codec: CallCodec,
                 send: Callable[[bytes, float], Awaitable[None]]) -> None:
        super().__init__(remote_cluster)
        self.codec = codec
        self._send_frame = send
        self._attached.set()

    async def _send(self, cmd: ReverseCmd, deadline: float) -> None:
        await self._send_frame(self.codec.encode_command(cmd), deadline)
