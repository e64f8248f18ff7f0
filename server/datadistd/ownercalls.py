"""Owner calls between the two ends of a link, as frames on its data channel.

After the Peer handshake the link's authenticated data channel is the only conversation between two
daemons (peer protocol 3). Either end may pull and push over a link (CANN's links have two ends; client
and server say nothing about prompt and decoder), so either end makes *owner calls* on the other: ``read``
/ ``release`` for a pull, ``open_write`` / ``commit_write`` for a push, ``unlink``, and ``ping`` (the
linking end's heartbeat and ``check_link_status``). A call is one CALL frame, its answer one REPLY frame,
read by the data plane's reader threads and handed to the event loop; the bytes of a transfer travel on
the same channel. Any number of calls may be in flight: commands carry ids, replies are matched to them,
every wait is bounded.

Wire format: a CALL payload is a ``datadist.v1.OwnerCall``, a REPLY payload a ``datadist.v1.OwnerReply``
(``peer.proto``); ``CallCodec`` turns the records here into those bytes (the rpc layer provides the
protobuf one). No grpc here.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol, Sequence, Union

from .core.errors import DataDistError, StatusCode
from .core.types import CacheKeyRef, IdIndexRef, RemoteSpec

__all__ = ["OpenWriteCmd", "CommitWriteCmd", "ReadCmd", "ReleaseCmd", "UnlinkCmd", "PingCmd", "OwnerCall",
           "OwnerReply", "RefusedCall", "FrameCalls", "CallCodec", "MAX_OPEN_PER_CALL", "checked_ids", "GrantReadCmd",
           "DoneReadCmd"]



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
class GrantReadCmd:
    """A pull over a transport that reads (``transport.base.ReadGrants``): validate and pin what ``spec`` names,
    answer the grant (``OwnerReply.grant``, its id in ``transfer_ids``); held until ``DoneReadCmd`` or
    ``timeout_ms``."""

    command_id: int
    session: bytes
    spec: RemoteSpec
    timeout_ms: int


@dataclass(frozen=True)
class DoneReadCmd:
    """The puller ended the read of grant ``grant_id``: unpin; ``consume``: it read every byte, so a key a
    pull consumes is consumed (what ``ReleaseCmd`` does after a ``ReadCmd``)."""

    command_id: int
    session: bytes
    grant_id: int
    consume: bool


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


@dataclass(frozen=True)
class PingCmd:
    """Liveness: answered at once (the answer proves the other end and the channel are alive)."""

    command_id: int
    session: bytes


OwnerCall = Union[OpenWriteCmd, CommitWriteCmd, ReadCmd, ReleaseCmd, UnlinkCmd, PingCmd, GrantReadCmd, DoneReadCmd]


@dataclass(frozen=True)
class OwnerReply:
    command_id: int
    status: int = 0
    message: str = ""
    transfer_ids: tuple[int, ...] = ()   # open write: one per spec, in order
    nbytes: int = 0                 # read: bytes sent
    release_needed: bool = False    # read: confirm the receipt with a release
    grant: bytes = b""              # grant read: what the transport's read needs (its id in transfer_ids)


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


def _expire(fut: asyncio.Future[OwnerReply]) -> None:
    """An owner call's deadline passed: its reply's future ends with ``TimeoutError``."""
    if not fut.done():
        fut.set_exception(asyncio.TimeoutError())


class FrameCalls:
    """Owner calls to the other end of one link as CALL frames on its data channel (either end of the link).

    ``send(payload, deadline)`` puts one CALL frame on the channel (awaitable; the link code decides whether
    that needs a thread); replies arrive through ``on_reply`` (the link code decodes them with ``codec``)."""

    def __init__(self, remote_cluster: int, codec: CallCodec,
                 send: Callable[[bytes, float], Awaitable[None]]) -> None:
        self.remote_cluster = remote_cluster
        self.codec = codec
        self._send_frame = send
        self._pending: dict[int, asyncio.Future[OwnerReply]] = {}
        self._ids = itertools.count(1)
        self.closed = False
        self.reason = ""

    def on_reply(self, reply: OwnerReply) -> None:
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
                                                f"owner calls to cluster {self.remote_cluster} closed: {reason}"))
        self._pending.clear()

    async def _call(self, make: Callable[[int, int], OwnerCall], timeout: float) -> OwnerReply:
        """``make(command_id, timeout_ms)`` builds the command once its id and the time left are known."""
        if self.closed:
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                f"owner calls to cluster {self.remote_cluster} closed ({self.reason})")
        if timeout <= 0:
            raise DataDistError(StatusCode.LLM_TIMEOUT, "deadline passed before the owner call")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        command_id = next(self._ids)
        timeout_ms = max(1, int(timeout * 1000))
        cmd = make(command_id, timeout_ms)
        fut: asyncio.Future[OwnerReply] = loop.create_future()
        self._pending[command_id] = fut
        timer: asyncio.TimerHandle | None = None
        try:
            await self._send_frame(self.codec.encode_command(cmd), time.monotonic() + timeout)
            # the deadline as one timer on the reply's future: what wait_for did, without its second future
            timer = loop.call_at(max(deadline, loop.time() + 0.001), _expire, fut)
            reply = await fut
        except asyncio.TimeoutError:
            raise DataDistError(StatusCode.LLM_TIMEOUT,
                                f"cluster {self.remote_cluster} did not answer an owner call in time") from None
        finally:
            if timer is not None:
                timer.cancel()
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
        """Open one incoming transfer per spec at the owner; their ids, in order. They wait ``hold_ms``
        (0: the call's timeout) for their bytes and commit."""
        reply = await self._call(lambda cid, ms: OpenWriteCmd(cid, session, tuple(specs), ms, hold_ms), timeout)
        return checked_ids(reply.transfer_ids, len(specs), f"cluster {self.remote_cluster}")

    async def commit_write(self, session: bytes, transfer_ids: Sequence[int], timeout: float) -> None:
        """Wait at the owner until every byte of the transfers arrived."""
        await self._call(lambda cid, ms: CommitWriteCmd(cid, session, tuple(transfer_ids), ms), timeout)

    async def read(self, session: bytes, transfer_id: int, spec: RemoteSpec, timeout: float) -> tuple[int, bool]:
        reply = await self._call(lambda cid, ms: ReadCmd(cid, session, transfer_id, spec, ms), timeout)
        return reply.nbytes, reply.release_needed

    async def grant_read(self, session: bytes, spec: RemoteSpec, timeout: float) -> tuple[int, bytes, bool]:
        """The owner's grant to read what ``spec`` names: its id, the transport's bytes, and whether ending it
        consumes a key (the puller then waits for that answer; else it need not)."""
        reply = await self._call(lambda cid, ms: GrantReadCmd(cid, session, spec, ms), timeout)
        (grant_id,) = checked_ids(reply.transfer_ids, 1, f"cluster {self.remote_cluster}")
        return grant_id, reply.grant, reply.release_needed

    async def done_read(self, session: bytes, grant_id: int, consume: bool, timeout: float) -> None:
        await self._call(lambda cid, ms: DoneReadCmd(cid, session, grant_id, consume), timeout)

    async def release(self, session: bytes, key: CacheKeyRef | IdIndexRef, tensor_start: int, tensor_count: int,
                      timeout: float) -> None:
        await self._call(lambda cid, ms: ReleaseCmd(cid, session, key, tensor_start, tensor_count), timeout)

    async def unlink(self, session: bytes, timeout: float) -> None:
        await self._call(lambda cid, ms: UnlinkCmd(cid, session), timeout)

    async def ping(self, session: bytes, timeout: float) -> None:
        await self._call(lambda cid, ms: PingCmd(cid, session), timeout)
