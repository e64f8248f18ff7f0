"""Owner calls between the two ends of a link, as frames on its data channel.

After the Peer handshake the link's authenticated data channel is the only conversation between two
daemons (peer protocol 5). Either end may pull and push over a link (CANN's links have two ends; client
and server say nothing about prompt and decoder), so either end makes *owner calls* on the other: ``read``
/ ``release`` for a pull, ``open_write`` / ``commit_write`` for a push, ``unlink``, and ``ping`` (the
linking end's heartbeat and ``check_link_status``). A call is one CALL frame, its answer one REPLY frame,
read by the data plane's reader threads and handed to the event loop; the bytes of a transfer travel on
the same channel. Any number of calls may be in flight: commands carry ids, replies are matched to them,
every wait is bounded.

Wire format: a read and every REPLY are ``ownerwire``'s fixed-layout frames, the other calls
``datadist.v1.OwnerCall`` messages (``peer.proto``); ``CallCodec`` turns the records here into those bytes (the
rpc layer provides it: ``rpc.convert.ProtobufCallCodec``). No grpc here.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol, Sequence, Union

from ...core.errors import DataDistError, StatusCode
from ...core.types import CacheKeyRef, IdIndexRef, RemoteSpec

__all__ = ["OpenWriteCmd", "CommitWriteCmd", "ReadCmd", "ReleaseCmd", "UnlinkCmd", "PingCmd", "OwnerCall",
           "OwnerReply", "RefusedCall", "FrameCalls", "CallCodec", "MAX_OPEN_PER_CALL", "INLINE_READ_MAX",
           "checked_ids", "GrantReadCmd", "DoneReadCmd"]



@dataclass(frozen=True)
class OpenWriteCmd:
    """Open one incoming transfer per spec (a layer-wise push opens every layer of a target at once);
    they may wait ``hold_ms`` for their bytes and commit (0: ``timeout_ms``)."""

    command_id: int
    specs: tuple[RemoteSpec, ...]
    timeout_ms: int
    hold_ms: int = 0


@dataclass(frozen=True)
class CommitWriteCmd:
    """Wait until every byte of the named transfers arrived (they end together: the first failure
    cancels the rest)."""

    command_id: int
    transfer_ids: tuple[int, ...]
    timeout_ms: int


@dataclass(frozen=True)
class ReadCmd:
    """Send what ``spec`` names: as transfer ``transfer_id`` on the data channel, or (``inline``: a small read,
    at most ``INLINE_READ_MAX`` bytes) in the reply itself."""

    command_id: int
    transfer_id: int
    spec: RemoteSpec
    timeout_ms: int
    inline: bool = False


@dataclass(frozen=True)
class GrantReadCmd:
    """A pull over a transport that reads (``transport.base.ReadGrants``): validate and pin what ``spec`` names,
    answer the grant (``OwnerReply.grant``, its id in ``transfer_ids``); held until ``DoneReadCmd`` or
    ``timeout_ms``."""

    command_id: int
    spec: RemoteSpec
    timeout_ms: int


@dataclass(frozen=True)
class DoneReadCmd:
    """The puller ended the read of grant ``grant_id``: unpin; ``consume``: it read every byte, so a key a
    pull consumes is consumed (what ``ReleaseCmd`` does after a ``ReadCmd``)."""

    command_id: int
    grant_id: int
    consume: bool


@dataclass(frozen=True)
class ReleaseCmd:
    command_id: int
    key: "CacheKeyRef | IdIndexRef"
    tensor_start: int
    tensor_count: int


@dataclass(frozen=True)
class UnlinkCmd:
    command_id: int


@dataclass(frozen=True)
class PingCmd:
    """Liveness: answered at once (the answer proves the other end and the channel are alive)."""

    command_id: int


OwnerCall = Union[OpenWriteCmd, CommitWriteCmd, ReadCmd, ReleaseCmd, UnlinkCmd, PingCmd, GrantReadCmd, DoneReadCmd]


@dataclass(frozen=True)
class OwnerReply:
    command_id: int
    status: int = 0
    message: str = ""
    transfer_ids: tuple[int, ...] = ()   # open write: one per spec, in order
    nbytes: int = 0                 # read: bytes sent
    release_needed: bool = False    # read: confirm the receipt with a release
    data: bytes = b""               # inline read: the bytes themselves
    grant: bytes = b""              # grant read: what the transport's read needs (its id in transfer_ids)


#: the largest read answered with its bytes in the reply (``ReadCmd.inline``): a small pull then needs no transfer
#: on the data channel, no receipt at the requester and no pin at the owner past the copy into the reply
INLINE_READ_MAX = 64 << 10

#: most transfers one OpenWrite may open (a layer-wise push opens a target's layers at once: a model's
#: layers, up to two pieces each); more is refused with ``LLM_PARAM_INVALID`` before anything is opened
MAX_OPEN_PER_CALL = 2048


def checked_ids(ids: Sequence[int], asked: int, who: str) -> list[int]:
    """The transfer ids an OpenWrite answered: one per spec asked for, else the other end is not this protocol's."""
    if len(ids) != asked:
        raise DataDistError(StatusCode.LLM_FAILED, f"{who} opened {len(ids)} transfers for {asked} pieces "
                                                   f"(a daemon of another version?)")
    return list(ids)


class RefusedCall(DataDistError):
    """A CALL frame that decoded far enough to name its ``command_id`` but asks for something invalid: the
    other end gets a REPLY with ``code`` (a frame that does not decode at all is dropped, unanswered)."""

    def __init__(self, command_id: int, code: StatusCode, message: str) -> None:
        super().__init__(code, message)
        self.command_id = command_id


class CallCodec(Protocol):
    """Commands and replies as bytes (for ``FrameCalls``)."""

    def encode_command(self, cmd: OwnerCall) -> bytes: ...

    def decode_command(self, data: bytes) -> OwnerCall:
        """The call; ``RefusedCall`` when it names an id but not a valid call, ``DataDistError`` when not even that."""

    def encode_reply(self, reply: OwnerReply) -> bytes: ...

    def decode_reply(self, data: bytes) -> OwnerReply: ...


#: what a call's answer goes to: the reply, or the error that ended the call (closed, timed out, not sent)
Answer = Callable[["OwnerReply | DataDistError"], None]


def _checked(reply: OwnerReply) -> OwnerReply | DataDistError:
    """A reply, or the error it carries."""
    if reply.status == 0:
        return reply
    try:
        code = StatusCode(reply.status)
    except ValueError:
        code = StatusCode.LLM_FAILED
    return DataDistError(code, reply.message)


class FrameCalls:
    """Owner calls to the other end of one link as CALL frames on its data channel (either end of the link).

    ``send(payload, deadline)`` puts one CALL frame on the channel (awaitable; the link code decides whether
    that needs a thread), ``try_send`` the same without blocking (False: nothing sent); replies arrive through
    ``on_reply`` (the link code decodes them with ``codec``). A call is awaited (``open_write``, ``read``, ...)
    or started with a callback (``start_read_inline``: no task, no future -- the small pull's path)."""

    def __init__(self, remote_cluster: int, codec: CallCodec,
                 send: Callable[[bytes, float], Awaitable[None]],
                 try_send: Callable[[bytes, float], bool] | None = None) -> None:
        self.remote_cluster = remote_cluster
        self.codec = codec
        self._send_frame = send
        self._try_send = try_send
        self._pending: dict[int, tuple[Answer, asyncio.TimerHandle | None]] = {}
        self._ids = itertools.count(1)
        self._sends: set[asyncio.Task[None]] = set()
        self.closed = False
        self.reason = ""

    def on_reply(self, reply: OwnerReply) -> None:
        waiter = self._pending.pop(reply.command_id, None)
        if waiter is not None:
            if waiter[1] is not None:
                waiter[1].cancel()
            waiter[0](_checked(reply))

    def close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.reason = reason
        pending, self._pending = self._pending, {}
        for answer, timer in pending.values():
            if timer is not None:
                timer.cancel()
            answer(DataDistError(StatusCode.LLM_LINK_FAILED, f"owner calls to cluster {self.remote_cluster} closed: "
                                                             f"{reason}"))

    def _expire(self, command_id: int) -> None:
        waiter = self._pending.pop(command_id, None)
        if waiter is not None:
            waiter[0](DataDistError(StatusCode.LLM_TIMEOUT,
                                    f"cluster {self.remote_cluster} did not answer an owner call in time"))

    def _start(self, make: Callable[[int, int], OwnerCall], timeout: float, answer: Answer) -> None:
        """Send the call ``make(command_id, timeout_ms)`` builds; its reply or error goes to ``answer``, exactly
        once, from the event loop (never before this returns). The deadline is one timer."""
        if self.closed:
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                f"owner calls to cluster {self.remote_cluster} closed ({self.reason})")
        if timeout <= 0:
            raise DataDistError(StatusCode.LLM_TIMEOUT, "deadline passed before the owner call")
        loop = asyncio.get_running_loop()
        command_id = next(self._ids)
        payload = self.codec.encode_command(make(command_id, max(1, int(timeout * 1000))))
        deadline = time.monotonic() + timeout
        timer = loop.call_at(loop.time() + max(timeout, 0.001), self._expire, command_id)
        self._pending[command_id] = (answer, timer)
        if self._try_send is not None:
            try:
                if self._try_send(payload, deadline):
                    return
            except DataDistError as exc:
                self._fail(command_id, exc)
                return
        task = loop.create_task(self._send_later(command_id, payload, deadline))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    async def _send_later(self, command_id: int, payload: bytes, deadline: float) -> None:
        try:
            await self._send_frame(payload, deadline)
        except DataDistError as exc:
            self._fail(command_id, exc)

    def _fail(self, command_id: int, exc: DataDistError) -> None:
        """The call could not be sent: its answer is the error (from the loop, never inside ``_start``)."""
        waiter = self._pending.pop(command_id, None)
        if waiter is not None:
            if waiter[1] is not None:
                waiter[1].cancel()
            asyncio.get_running_loop().call_soon(waiter[0], exc)

    async def _call(self, make: Callable[[int, int], OwnerCall], timeout: float) -> OwnerReply:
        """``make(command_id, timeout_ms)`` builds the command once its id and the time left are known."""
        fut: asyncio.Future[OwnerReply | DataDistError] = asyncio.get_running_loop().create_future()

        def answer(result: OwnerReply | DataDistError) -> None:
            if not fut.done():
                fut.set_result(result)

        self._start(make, timeout, answer)
        try:
            result = await fut
        except asyncio.CancelledError:
            for command_id, (waiting, timer) in list(self._pending.items()):
                if waiting is answer:
                    del self._pending[command_id]
                    if timer is not None:
                        timer.cancel()
            raise
        if isinstance(result, DataDistError):
            raise result
        return result

    def _inline(self, result: OwnerReply | DataDistError, spec: RemoteSpec) -> OwnerReply | DataDistError:
        """An inline read's answer, its data checked to be what the read asked for."""
        if isinstance(result, OwnerReply) and len(result.data) != spec.expected_bytes:
            return DataDistError(StatusCode.LLM_FAILED, f"cluster {self.remote_cluster} answered a read of "
                                                        f"{spec.expected_bytes} bytes with {len(result.data)}")
        return result

    def start_read_inline(self, spec: RemoteSpec, timeout: float, answer: Answer) -> None:
        """A small read answered with its bytes, by callback (the one entry of a small read): ``answer`` gets the
        reply (its ``data`` checked to be ``spec.expected_bytes`` long) or the error."""
        self._start(lambda cid, ms: ReadCmd(cid, 0, spec, ms, inline=True), timeout,
                    lambda result: answer(self._inline(result, spec)))

    async def open_write(self, specs: Sequence[RemoteSpec], timeout: float,
                         hold_ms: int = 0) -> list[int]:
        """Open one incoming transfer per spec at the owner; their ids, in order. They wait ``hold_ms``
        (0: the call's timeout) for their bytes and commit."""
        reply = await self._call(lambda cid, ms: OpenWriteCmd(cid, tuple(specs), ms, hold_ms), timeout)
        return checked_ids(reply.transfer_ids, len(specs), f"cluster {self.remote_cluster}")

    async def commit_write(self, transfer_ids: Sequence[int], timeout: float) -> None:
        """Wait at the owner until every byte of the transfers arrived."""
        await self._call(lambda cid, ms: CommitWriteCmd(cid, tuple(transfer_ids), ms), timeout)

    async def read(self, transfer_id: int, spec: RemoteSpec, timeout: float) -> tuple[int, bool]:
        reply = await self._call(lambda cid, ms: ReadCmd(cid, transfer_id, spec, ms), timeout)
        return reply.nbytes, reply.release_needed

    async def grant_read(self, spec: RemoteSpec, timeout: float) -> tuple[int, bytes, bool]:
        """The owner's grant to read what ``spec`` names: its id, the transport's bytes, and whether ending it
        consumes a key (the puller then waits for that answer; else it need not)."""
        reply = await self._call(lambda cid, ms: GrantReadCmd(cid, spec, ms), timeout)
        (grant_id,) = checked_ids(reply.transfer_ids, 1, f"cluster {self.remote_cluster}")
        return grant_id, reply.grant, reply.release_needed

    async def done_read(self, grant_id: int, consume: bool, timeout: float) -> None:
        await self._call(lambda cid, ms: DoneReadCmd(cid, grant_id, consume), timeout)

    async def release(self, key: CacheKeyRef | IdIndexRef, tensor_start: int, tensor_count: int,
                      timeout: float) -> None:
        await self._call(lambda cid, ms: ReleaseCmd(cid, key, tensor_start, tensor_count), timeout)

    async def unlink(self, timeout: float) -> None:
        await self._call(lambda cid, ms: UnlinkCmd(cid), timeout)

    async def ping(self, timeout: float) -> None:
        await self._call(lambda cid, ms: PingCmd(cid), timeout)
