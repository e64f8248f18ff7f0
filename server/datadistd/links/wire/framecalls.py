"""``FrameCalls``: this end's owner calls (``ownercalls``) on the other end of a link, as CALL frames on its data
channel (``ownerwire``), their REPLY frames matched by id. Any number of calls may be in flight; every wait is one
timer. No grpc and no protobuf here.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Awaitable, Callable, Sequence, TypeVar

from ...core.errors import DataDistError, StatusCode
from ...core.types import CacheKeyRef, IdIndexRef, RemoteSpec
from . import ownerwire
from .ownercalls import (
    CommitWriteCmd,
    DoneReadCmd,
    GrantReadCmd,
    OpenWriteCmd,
    OwnerCall,
    OwnerReply,
    PingCmd,
    ReadCmd,
    ReleaseCmd,
    UnlinkCmd,
    WriteCmd,
    checked_ids,
)

__all__ = ["FrameCalls", "Answer", "answered"]

_T = TypeVar("_T")


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


async def answered(start: Callable[[Callable[[_T | DataDistError], None]], None]) -> _T:
    """A call started with a callback (``start(done)``: ``FrameCalls.start_read_inline``, ``start_pull``), awaited:
    what ``done`` got, or the error it got, raised."""
    ended: asyncio.Future[_T | DataDistError] = asyncio.get_running_loop().create_future()

    def done(result: _T | DataDistError) -> None:
        if not ended.done():   # the awaiting task was cancelled meanwhile
            ended.set_result(result)

    start(done)
    result = await ended
    if isinstance(result, DataDistError):
        raise result
    return result


class FrameCalls:
    """Owner calls to the other end of one link as CALL frames on its data channel (either end of the link).

    ``send(payload, deadline)`` puts one CALL frame on the channel (awaitable; the link code decides whether
    that needs a thread), ``try_send`` the same without blocking (False: nothing sent); replies arrive through
    ``on_reply`` (the link code decodes them: ``ownerwire.decode_reply``). A call is awaited (``open_write``,
    ``read``, ...) or started with a callback (``start_read_inline``: no task, no future -- the small pull's
    path)."""

    def __init__(self, remote_cluster: int, send: Callable[[bytes, float], Awaitable[None]],
                 try_send: Callable[[bytes, float], bool] | None = None) -> None:
        self.remote_cluster = remote_cluster
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
        payload = ownerwire.encode_call(make(command_id, max(1, int(timeout * 1000))))
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

    async def write(self, spec: RemoteSpec, data: bytes, timeout: float) -> None:
        """A small push in one call: ``data`` (exactly ``spec.expected_bytes``, at most ``INLINE_READ_MAX``) written
        into what ``spec`` names at the owner."""
        await self._call(lambda cid, ms: WriteCmd(cid, spec, ms, data), timeout)

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
