"""``FrameCalls``: this end's owner calls (``ownercalls``) on the other end of a link, as CALL frames on its data
channel (``ownerwire``), their REPLY frames matched by id. Any number of calls may be in flight; their deadlines are
entries one sweep timer reads (armed only while calls are pending). No grpc and no protobuf here.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import threading
import time
from typing import Any, Awaitable, Callable, Sequence, TypeVar

from ...core.errors import DataDistError, StatusCode
from ...core.types import CacheKeyRef, IdIndexRef, RemoteSpec
from . import ownerwire
from .ownercalls import (
    CommitWriteCmd,
    NotifyCmd,
    OpenWriteCmd,
    OwnerCall,
    OwnerReply,
    PingCmd,
    ReleaseCmd,
    UnlinkCmd,
    checked_ids,
)

__all__ = ["FrameCalls", "Answer", "answered"]

_T = TypeVar("_T")


#: what a call's answer goes to: the reply, or the error that ended the call (closed, timed out, not sent)
Answer = Callable[["OwnerReply | DataDistError"], None]
#: a fast call's answer on the event loop (``register_fast``): the reply or the error, and the call's context
FastAnswer = Callable[["OwnerReply | DataDistError", Any], None]
#: a fast call's landing on a reader thread: the whole REPLY frame and the call's context; False: not landed
Land = Callable[[bytes, Any], bool]
#: a pending call: deadline (``time.monotonic``), answer, land (None: not a fast call), context, expected bytes
_Entry = tuple[float, FastAnswer, "Land | None", Any, int]
#: a sweep fails the calls due within this of its run (a timer may fire a hair before its time)
_SLACK = 0.001


def _plain(result: OwnerReply | DataDistError, answer: Answer) -> None:
    """An awaited or callback call's answer (its context is the callback)."""
    answer(result)


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
    """A call started with a callback (``start(done)``), awaited: what ``done`` got, or the error it got, raised."""
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
    ``on_reply`` (the event loop; the link code decodes them: ``ownerwire.decode_reply``) or ``take_reply`` (a
    data reader thread, a small pull's reply: ``register_fast``). A call is awaited (``open_write``, ``read``, ...)
    or registered with a landing function (``register_fast``: no task, no future, no timer of its own).

    The calls pending are one dict, command id -> ``(deadline, answer, land, ctx, expected)``; whoever pops an
    entry (the loop's ``on_reply``, a reader thread's ``take_reply``, the sweep, ``close``) answers it, exactly
    once. Deadlines are one sweep timer, armed only while a call is pending at its earliest deadline: an idle
    link never wakes. ``register_fast`` may run off the event loop (the attach connection's reactor thread): the
    entry and the time by which a sweep is promised to run (``_sweep_at``) change together under ``_lock``, and
    such a thread asks the loop to arm the timer only when no sweep is promised by the call's deadline."""

    def __init__(self, remote_cluster: int, send: Callable[[bytes, float], Awaitable[None]],
                 try_send: Callable[[bytes, float], bool] | None = None) -> None:
        self.remote_cluster = remote_cluster
        self._send_frame = send
        self._try_send = try_send
        self._pending: dict[int, _Entry] = {}
        self._ids = itertools.count(1)
        self._sends: set[asyncio.Task[None]] = set()
        try:   # made on the loop in the daemon: a fast call registered off it arms the sweep through it
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self._lock = threading.Lock()   # ``_pending``'s inserts and ``_sweep_at`` together (``register_fast``)
        self._sweep_at = math.inf       # a sweep runs by then (its timer armed, or its arming asked of the loop)
        self._sweep: asyncio.TimerHandle | None = None   # the loop's timer, at ``_timer_at``
        self._timer_at = math.inf
        self.closed = False
        self.reason = ""

    @property
    def pending(self) -> int:
        """Calls waiting for their reply."""
        return len(self._pending)

    @property
    def sweep_armed(self) -> bool:
        """Whether the sweep timer is armed: while calls are pending (disarmed when the loop answers the last one;
        after a fast call landed on a reader thread it fires once more, finds nothing and stays unarmed)."""
        return self._sweep is not None

    def on_reply(self, reply: OwnerReply) -> None:
        """A reply, on the event loop."""
        entry = self._pending.pop(reply.command_id, None)
        if entry is not None:
            if not self._pending:
                self._disarm()
            entry[1](_checked(reply), entry[3])

    def _disarm(self) -> None:
        """Nothing pending (the event loop): no sweep (a heartbeat's answered ping leaves no timer behind) -- unless
        a fast call was registered off the loop meanwhile."""
        with self._lock:
            if self._pending:
                return
            self._sweep_at = math.inf
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None

    def take_reply(self, payload: bytes) -> bool:
        """A REPLY frame, on the data reader thread that read it: True when it was the whole, successful answer
        of a call ``register_fast`` registered and its ``land`` took the bytes (or it was answered already: the
        sweep or ``close`` popped it first); else False, nothing done: the loop handles the frame (``on_reply``),
        its checks and messages the general path's."""
        got = ownerwire.small_reply(payload)
        if got is None:
            return False
        cid, dlen = got
        peek = self._pending.get(cid)
        if peek is None or peek[2] is None or dlen != peek[4]:
            return False
        entry = self._pending.pop(cid, None)
        if entry is None:
            return True              # swept, or the calls closed: answered there
        if not peek[2](payload, entry[3]):   # it could not land here: the loop's answer does (same reply)
            loop = self._loop
            assert loop is not None
            try:
                loop.call_soon_threadsafe(entry[1], ownerwire.decode_reply(payload), entry[3])
            except RuntimeError:     # the loop is closed: the daemon is stopping
                pass
        return True

    def close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.reason = reason
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        error = DataDistError(StatusCode.LLM_LINK_FAILED, f"owner calls to cluster {self.remote_cluster} closed: "
                                                          f"{reason}")
        pending = self._pending
        for command_id in list(pending):
            entry = pending.pop(command_id, None)   # a reader thread may pop one meanwhile: it answers that one
            if entry is not None:
                entry[1](error, entry[3])

    # ---- deadlines: one sweep timer ------------------------------------------------------------------------

    def _arm(self, deadline: float) -> None:
        """The sweep runs by ``deadline`` (the event loop)."""
        with self._lock:
            if self._sweep_at <= deadline:
                return
            self._sweep_at = deadline
        self._timer()

    def _timer(self) -> None:
        """The loop's timer at the sweep promised (``_sweep_at``), if it is not armed by then already."""
        with self._lock:
            at = self._sweep_at
        if at == math.inf or (self._sweep is not None and self._timer_at <= at) or self.closed:
            return
        if self._sweep is not None:
            self._sweep.cancel()
        loop = self._loop
        assert loop is not None
        self._timer_at = at
        self._sweep = loop.call_later(max(at - time.monotonic(), 0.001), self._sweep_now)

    def _sweep_now(self) -> None:
        """Fail every call past its deadline with ``LLM_TIMEOUT``; armed again at the earliest one left (a call
        registered off the loop after the promise is dropped here asks for its own sweep: ``register_fast``)."""
        self._sweep = None
        self._timer_at = math.inf
        with self._lock:
            self._sweep_at = math.inf
        now = time.monotonic() + _SLACK
        pending = self._pending
        earliest = None
        for command_id, (deadline, *_) in list(pending.items()):
            if deadline > now:
                if earliest is None or deadline < earliest:
                    earliest = deadline
                continue
            entry = pending.pop(command_id, None)   # None: a reader thread took its reply meanwhile
            if entry is not None:
                entry[1](DataDistError(StatusCode.LLM_TIMEOUT,
                                       f"cluster {self.remote_cluster} did not answer an owner call in time"),
                         entry[3])
        if earliest is not None and not self.closed:
            self._arm(earliest)

    # ---- starting calls -------------------------------------------------------------------------------------

    def register_fast(self, deadline: float, answer: FastAnswer, land: Land | None, ctx: object, expected: int,
                      on_loop: bool = True) -> int:
        """A call this side sends itself: its command id. Its REPLY, when it is the whole, successful answer with
        ``expected`` bytes of data, goes to ``land(payload, ctx)`` on the reader thread that read it
        (``take_reply``; ``land`` returns False when the bytes cannot land there); anything else -- another reply,
        a timeout at ``deadline`` (``time.monotonic``), the calls closed -- goes to ``answer(reply or error, ctx)``
        on the loop, exactly once. ``forget`` takes it back when it was not sent.

        Off the event loop (``on_loop`` False: an attach connection's reactor thread) the sweep is asked of the loop
        (``call_soon_threadsafe``) only when none is promised by ``deadline``: at steady state, never. The answer
        may then come (the sweep, ``close``) before this returns: whoever pops the entry answers it."""
        if self.closed:
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                f"owner calls to cluster {self.remote_cluster} closed ({self.reason})")
        command_id = next(self._ids)
        with self._lock:
            self._pending[command_id] = (deadline, answer, land, ctx, expected)
            late = deadline < self._sweep_at
            if late:
                self._sweep_at = deadline
        if self.closed and self._pending.pop(command_id, None) is not None:   # closed meanwhile (off the loop)
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                f"owner calls to cluster {self.remote_cluster} closed ({self.reason})")
        if late:
            if on_loop:
                if self._loop is None:
                    self._loop = asyncio.get_running_loop()
                self._timer()
            else:
                loop = self._loop
                assert loop is not None
                try:
                    loop.call_soon_threadsafe(self._timer)
                except RuntimeError:   # the loop is closed: the daemon is stopping
                    pass
        return command_id

    def forget(self, command_id: int) -> bool:
        """A registered call that was not sent leaves (any thread); False when it was answered already."""
        return self._pending.pop(command_id, None) is not None

    def _start(self, make: Callable[[int, int], OwnerCall], timeout: float, answer: Answer) -> None:
        """Send the call ``make(command_id, timeout_ms)`` builds; its reply or error goes to ``answer``, exactly
        once, from the event loop (never before this returns). The deadline is an entry the sweep reads."""
        if self.closed:
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                f"owner calls to cluster {self.remote_cluster} closed ({self.reason})")
        if timeout <= 0:
            raise DataDistError(StatusCode.LLM_TIMEOUT, "deadline passed before the owner call")
        self._loop = asyncio.get_running_loop()
        command_id = next(self._ids)
        payload = ownerwire.encode_call(make(command_id, max(1, int(timeout * 1000))))
        deadline = time.monotonic() + max(timeout, 0.001)
        self._pending[command_id] = (deadline, _plain, None, answer, 0)
        self._arm(deadline)
        if self._try_send is not None:
            try:
                if self._try_send(payload, deadline):
                    return
            except DataDistError as exc:
                self._fail(command_id, exc)
                return
        self.send_later(command_id, payload, deadline)

    def send_later(self, command_id: int, payload: bytes, deadline: float) -> None:
        """The frame of a call registered here (``register_fast``) that no connection took at once, sent from the
        executor (the event loop); a failure to send answers the call with it."""
        task = asyncio.get_running_loop().create_task(self._send_later(command_id, payload, deadline))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    async def _send_later(self, command_id: int, payload: bytes, deadline: float) -> None:
        try:
            await self._send_frame(payload, deadline)
        except DataDistError as exc:
            self._fail(command_id, exc)

    def _fail(self, command_id: int, exc: DataDistError) -> None:
        """The call could not be sent: its answer is the error (from the loop, never inside ``_start``)."""
        entry = self._pending.pop(command_id, None)
        if entry is not None:
            asyncio.get_running_loop().call_soon(entry[1], exc, entry[3])

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
            for command_id, entry in list(self._pending.items()):
                if entry[3] is answer:
                    self._pending.pop(command_id, None)
            if not self._pending:
                self._disarm()
            raise
        if isinstance(result, DataDistError):
            raise result
        return result

    async def open_write(self, specs: Sequence[RemoteSpec], timeout: float,
                         hold_ms: int = 0) -> list[int]:
        """Open one incoming transfer per spec at the owner; their ids, in order. They wait ``hold_ms``
        (0: the call's timeout) for their bytes and commit."""
        reply = await self._call(lambda cid, ms: OpenWriteCmd(cid, tuple(specs), ms, hold_ms), timeout)
        return checked_ids(reply.transfer_ids, len(specs), f"cluster {self.remote_cluster}")

    async def commit_write(self, transfer_ids: Sequence[int], timeout: float) -> None:
        """Wait at the owner until every byte of the transfers arrived."""
        await self._call(lambda cid, ms: CommitWriteCmd(cid, tuple(transfer_ids), ms), timeout)


    async def release(self, key: CacheKeyRef | IdIndexRef, tensor_start: int, tensor_count: int,
                      timeout: float) -> None:
        await self._call(lambda cid, ms: ReleaseCmd(cid, key, tensor_start, tensor_count), timeout)

    async def unlink(self, timeout: float) -> None:
        await self._call(lambda cid, ms: UnlinkCmd(cid), timeout)

    async def ping(self, timeout: float) -> None:
        await self._call(lambda cid, ms: PingCmd(cid), timeout)

    async def notify(self, name: bytes, msg: bytes, timeout: float) -> None:
        """A HIXL notify for the other end's engine (its refusal raised with its code)."""
        await self._call(lambda cid, ms: NotifyCmd(cid, name, msg), timeout)
