"""The per-link state of a one-sided transport and its channel: ``LinkPeer`` (the peer's agent, the destination
lists it sent, receipts, the link manager's control handler; shared by the channel objects of one token) and
``OneSidedChannel`` (what the link manager holds: bytes by the agent's WRITE, control frames on the tcp
channel). See the package doc."""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections import OrderedDict
from typing import Any, Protocol, Sequence

import numpy as np

from datadist.status import LLMStatusCode, code_2_status

from ...core.errors import DataDistError
from ...core.types import TransferId
from ...memory.base import Segment
from ..base import CONTROL_TRANSPORT, ControlHandler, EarlyFrames
from ..tcp import TcpChannel, TcpTransport
from .agent import InFlight, OneSidedAgent
from .pairing import pair_extents
from .receipt import POLL, QUIESCE, OneSidedReceipt
from .wire import CANCEL, CODE, DESCS, FIN, ID, MAX_REFUSAL, MD_LEN, META, META_HEAD, NOTIF, NOTIF_ID, REFUSED


class LinkOwner(Protocol):
    """What a link's state needs of its transport (``OneSidedTransport``; named by use, so this module does not
    import the transport module that imports it)."""

    name: str
    _tcp: TcpTransport
    _landing: dict[int, OneSidedReceipt]
    bytes_sent: int

    def _agent(self) -> OneSidedAgent: ...

    def _meta(self, peer: "LinkPeer", reply: bool) -> bytes: ...

    def _bind_agent(self, peer: "LinkPeer", name: str, metadata: bytes) -> None: ...

    def _on_extra(self, peer: "LinkPeer", payload: bytes) -> None: ...

    def _drop(self, peer: "LinkPeer", reason: str, close: bool = True) -> None: ...

    def _forget_peer(self, peer: "LinkPeer") -> None: ...

    def _ready(self, peer: "LinkPeer") -> None: ...

__all__ = ["LinkPeer", "OneSidedChannel"]

log = logging.getLogger("datadistd.transport.onesided")

_MAX_WAITING = 4096      # destination lists kept for transfers not sent yet (a peer's; the oldest go first)
_CONTROL_TIMEOUT = 5.0   # bound on sending one control frame


class LinkPeer:
    """The state of one link (one token) on this side: the peer's agent, destination lists received,
    receipts, and the link manager's control handler. Shared by the channel object(s) of the token."""

    def __init__(self, transport: LinkOwner, token: bytes, outbound: bool) -> None:
        self.transport = transport
        self.token = token
        self.outbound = outbound
        self.tcp: TcpChannel | None = None
        self.agent_name: str | None = None
        self.ready = threading.Event()
        self.refused: DataDistError | None = None   # why the peer refused this side's META (``REFUSED``)
        self.shipped: set[int] = set()             # registration serials this peer has metadata of
        self.closed = False
        self._cond = threading.Condition()
        self._waiting: OrderedDict[int, np.ndarray] = OrderedDict()   # tid -> destination extents
        self._cancelled: OrderedDict[int, None] = OrderedDict()
        self._sending: set[int] = set()
        self._forgotten = False
        self._receipts: dict[int, OneSidedReceipt] = {}
        self._early = EarlyFrames()   # link control frames: to the link manager, or kept until it set its handler
        #: the caches the peer published to this link (``tables.PublishedTables``): handle -> ``RemoteEntry``
        self.table: dict[int, Any] = {}
        self.table_version = 0
        self.withdrawn: OrderedDict[int, None] = OrderedDict()   # handles the peer withdrew (never reused)
        self.table_lock = threading.Lock()

    @property
    def what(self) -> str:
        return f"{'to' if self.outbound else 'from'} {self.tcp.peer if self.tcp is not None else '?'}"

    @property
    def broken(self) -> bool:
        return self.closed or (self.tcp is not None and self.tcp.broken)

    def channel(self) -> TcpChannel:
        tcp = self.tcp
        if tcp is None:
            tcp = self.transport._tcp.channel(self.token)
            if tcp is None:
                raise DataDistError(LLMStatusCode.LLM_LINK_FAILED,
                                    f"{self.transport.name}: the data channel is not connected")
            self.tcp = tcp
        return tcp

    # -- sending our messages --

    def send(self, payload: bytes, deadline: float | None = None) -> None:
        self.channel().send_control_first(CONTROL_TRANSPORT, payload, deadline or time.monotonic() + _CONTROL_TIMEOUT)

    def fin(self, tid: int, code: int) -> None:
        try:
            self.send(ID.pack(FIN, tid) + CODE.pack(int(code)))
        except DataDistError as exc:
            log.warning("%s: could not tell the peer %s that transfer %d ended: %s", self.transport.name, self.what,
                        tid, exc)

    # -- frames from the peer (a tcp reader thread) --

    def on_frame(self, kind: int, payload: bytes) -> None:
        if kind != CONTROL_TRANSPORT:
            if not self._early.deliver(kind, payload):
                raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, "too many control frames before the link was "
                                                                   "ready")
            return
        try:
            self._on_message(payload)
        except (struct.error, ValueError, DataDistError) as exc:
            log.warning("%s: bad message from %s (%s); closing the channel", self.transport.name, self.what, exc)
            if payload[:1] == META and not self.ready.is_set():   # the linking side learns why, not just a timeout
                try:
                    why = exc.message if isinstance(exc, DataDistError) else str(exc)
                    self.send(REFUSED + why.encode()[:MAX_REFUSAL])
                except DataDistError:
                    pass
            self.transport._drop(self, f"bad {self.transport.name} message: {exc}")

    def set_handler(self, handler: ControlHandler) -> None:
        self._early.set_handler(handler)

    def _on_message(self, payload: bytes) -> None:
        letter = payload[:1]
        if letter == META:
            _, reply, size = META_HEAD.unpack_from(payload)
            name = payload[META_HEAD.size:META_HEAD.size + size].decode()
            self.transport._bind_agent(self, name, payload[META_HEAD.size + size:])
            if reply:
                self.send(self.transport._meta(self, reply=False))
            self.ready.set()
            self.transport._ready(self)
        elif letter == REFUSED and not self.ready.is_set():
            why = payload[1:1 + MAX_REFUSAL].decode(errors="replace")
            self.refused = DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"the peer refused the link: {why}")
            self.ready.set()   # wakes ``connect``, which raises it
        elif letter == DESCS:
            _, tid = ID.unpack_from(payload)
            (size,) = MD_LEN.unpack_from(payload, ID.size)
            at = ID.size + MD_LEN.size
            if size:
                if self.transport._agent().add_peer(payload[at:at + size], self.token) != self.agent_name:
                    raise ValueError("partial metadata of another agent")
            extents = np.frombuffer(payload, dtype=np.uint64, offset=at + size).reshape(-1, 2)
            with self._cond:
                if tid in self._cancelled:
                    return
                self._waiting[tid] = extents
                while len(self._waiting) > _MAX_WAITING:
                    old, _ = self._waiting.popitem(last=False)
                    log.warning("%s: %s sent more than %d destination lists that were never used; dropped "
                                "transfer %d's", self.transport.name, self.what, _MAX_WAITING, old)
                self._cond.notify_all()
        elif letter == FIN:
            _, tid = ID.unpack_from(payload)
            (code,) = CODE.unpack_from(payload, ID.size)
            receipt = self.transport._landing.get(tid)
            if receipt is not None and receipt._peer is self:
                status = code_2_status(code)
                if status == LLMStatusCode.LLM_SUCCESS:
                    status = LLMStatusCode.LLM_FAILED
                receipt._confirmed = True
                receipt._finish(DataDistError(status, f"transfer {tid} failed at the sender ({status.name})"))
        elif letter == CANCEL:
            _, tid = ID.unpack_from(payload)
            with self._cond:
                self._waiting.pop(tid, None)
                self._cancelled[tid] = None
                while len(self._cancelled) > _MAX_WAITING:
                    self._cancelled.popitem(last=False)
                busy = tid in self._sending
                self._cond.notify_all()
            if not busy:   # nothing of it was or will be written: say so now (a running send says so itself)
                self.fin(tid, LLMStatusCode.LLM_FAILED)
        else:
            self.transport._on_extra(self, payload)

    # -- the sending side of a transfer --

    def destination(self, tid: int, deadline: float) -> np.ndarray:
        """The extents the receiver of ``tid`` registered, once its DESCS message is here."""
        with self._cond:
            while True:
                extents = self._waiting.pop(tid, None)
                if extents is not None:
                    self._sending.add(tid)
                    return extents
                reason = self.stop_reason(tid)
                if reason is not None:
                    raise reason
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DataDistError(LLMStatusCode.LLM_TIMEOUT,
                                        f"transfer {tid}: the receiver's destination never came")
                self._cond.wait(min(remaining, POLL))

    def stop_reason(self, tid: int) -> DataDistError | None:
        """Why the send of ``tid`` must not start: a broken channel, or the receiver cancelled it."""
        if self.broken:
            return DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"data channel {self.what} broke")
        if tid in self._cancelled:
            return DataDistError(LLMStatusCode.LLM_FAILED, f"transfer {tid} was cancelled by the receiver")
        return None

    def reading(self, tid: int) -> None:
        """A READ of this peer's memory starts (``sent`` ends it): ``LLM_LINK_FAILED`` if the link is closed or
        its channel broke."""
        with self._cond:
            if self.broken:
                raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"data channel {self.what} is closed")
            self._sending.add(tid)

    def sent(self, tid: int) -> None:
        with self._cond:
            self._sending.discard(tid)
            last = self.closed and not self._sending
        if last:   # the link went while this send ran: its agent can go now
            self.transport._forget_peer(self)

    def idle_after_close(self) -> bool:
        """Closed with no send running, answered True once only (so the agent is unloaded once)."""
        with self._cond:
            if self._sending or self._forgotten:
                return False
            self._forgotten = True
            return True

    # -- the receiving side --

    def add_receipt(self, receipt: OneSidedReceipt) -> None:
        with self._cond:
            if self.closed:
                raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"data channel {self.what} is closed")
            self._receipts[receipt.transfer_id] = receipt

    def forget(self, tid: int) -> bool:
        with self._cond:
            return self._receipts.pop(tid, None) is not None

    def quiesce(self, receipt: OneSidedReceipt) -> None:
        """Ask the sender to stop ``receipt``'s transfer and wait (bounded) until nothing more of it can land:
        its FIN (nothing was posted) or the notification of the WRITE it had posted. The fabric's connection is
        probed meanwhile and the wait lasts the agent's fence at least: a dead connection is aborted by this side's
        kernel by then (``OneSidedAgent.probe``), so bytes the sender had queued never land after it."""
        tid = int(receipt.transfer_id)
        if not self.broken:
            try:
                self.send(ID.pack(CANCEL, tid), time.monotonic() + QUIESCE)
            except DataDistError as exc:
                log.warning("%s: could not cancel transfer %d at %s: %s", self.transport.name, tid, self.what, exc)
        wait = QUIESCE
        try:
            agent = self.transport._agent()
        except DataDistError:   # the transport stopped: its agent, and every connection of it, are gone
            agent = None
        if agent is not None and self.agent_name is not None:
            agent.probe(self.agent_name)
            wait = max(QUIESCE, agent.fence)
        if receipt._settle(time.monotonic() + wait) and receipt._confirmed:
            return
        log.warning("%s: the sender of transfer %d (%s) did not confirm it stopped; dropping the channel "
                    "and its agent's connection", self.transport.name, tid, self.what)
        self.transport._drop(self, f"transfer {tid} could not be cancelled")

    def close(self) -> None:
        """No more transfers on this link. Receipts still waiting settle in their waits (``_settle``): the
        peer's posted WRITEs may still complete and notify."""
        with self._cond:
            self.closed = True
            self._waiting.clear()
            self._cond.notify_all()


class OneSidedChannel:
    """One link's data channel: the tcp channel it runs on, and NIXL WRITEs for the bytes."""

    def __init__(self, transport: LinkOwner, peer: LinkPeer) -> None:
        self._transport = transport
        self._peer = peer

    def __repr__(self) -> str:
        return f"OneSidedChannel({self._peer.what}, agent={self._peer.agent_name})"

    @property
    def token(self) -> bytes:
        return self._peer.token

    @property
    def streams(self) -> int:
        return self._peer.channel().streams

    @property
    def broken(self) -> bool:
        return self._peer.broken

    def send(self, transfer_id: TransferId, segments: Sequence[Segment], deadline: float) -> None:
        peer, tid = self._peer, int(transfer_id)
        agent = self._transport._agent()
        try:
            extents, _, _ = agent.addresses(segments)
            if not peer.ready.wait(max(0.0, deadline - time.monotonic())) or peer.agent_name is None:
                raise DataDistError(LLMStatusCode.LLM_TIMEOUT, f"the peer {peer.what} never sent its NIXL metadata")
            dst = peer.destination(tid, deadline)
        except DataDistError as exc:
            peer.fin(tid, exc.code)
            raise
        try:
            try:
                src, dst = pair_extents(extents, dst)
            except ValueError as exc:
                raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID, f"transfer {tid}: {exc}") from None
            if len(src):
                # once posted, a WRITE runs to completion (or its deadline) even if the channel breaks or the
                # receiver cancels: released early, bytes UCX already queued could still land in memory the
                # receiver has handed back; complete, it ends with the notification the receiver waits for
                agent.write(src, dst, peer.agent_name, NOTIF_ID.pack(NOTIF, tid), deadline, lambda: None)
            else:
                agent.notify(peer.agent_name, NOTIF_ID.pack(NOTIF, tid))
            self._transport.bytes_sent += int(src[:, 1].sum()) if len(src) else 0
        except DataDistError as exc:
            failure = exc
            if isinstance(exc, InFlight):   # it had not ended in the fence (``Agent._settle``): it may land yet
                log.warning("%s: a WRITE to %s was abandoned in flight (%s); its bytes may still land in the peer's "
                            "memory (docs/nixl.md, 'Failure behaviour')", self._transport.name, peer.what, exc.message)
            if peer.broken and exc.code != LLMStatusCode.LLM_TIMEOUT:   # the link went: say so, not why NIXL failed
                failure = DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"transfer {tid}: data channel {peer.what} "
                                                                       f"closed ({exc.message})")
            peer.fin(tid, failure.code)
            raise failure from None
        finally:
            peer.sent(tid)

    def try_send(self, transfer_id: TransferId, segments: Sequence[Segment], deadline: float) -> bool:
        return False   # a WRITE waits for its completion: always from a thread (declining is allowed)

    def try_send_soon(self, transfer_id: TransferId, segments: Sequence[Segment], deadline: float) -> bool:
        return False   # as ``try_send``

    def abort(self, transfer_id: TransferId, code: LLMStatusCode) -> None:
        if self._peer.channel().broken:
            return
        self._peer.fin(int(transfer_id), code if code != LLMStatusCode.LLM_SUCCESS else LLMStatusCode.LLM_FAILED)

    def close(self) -> None:
        self._transport._drop(self._peer, "closed locally", close=True)

    # -- control frames of the link manager (transport.base.Channel) --

    def on_control(self, handler: ControlHandler) -> None:
        self._peer.set_handler(handler)

    # every control frame of a one-sided link goes on its first connection: an owner call's reply never overtakes
    # the table changes sent before it (``tables``), nor a transport message the call relies on
    def try_control(self, kind: int, payload: bytes, deadline: float) -> bool:
        return self._peer.channel().try_control_first(kind, payload, deadline)

    def send_control(self, kind: int, payload: bytes, deadline: float) -> None:
        self._peer.channel().send_control_first(kind, payload, deadline)
