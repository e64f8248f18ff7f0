"""``NixlTransport``: bytes by NIXL WRITE, everything else over a tcp channel (see the package doc)."""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import numpy as np

from datadist.status import LLMStatusCode, code_2_status

from ...admission import AdmissionLimits
from ...core.errors import DataDistError
from ...core.types import TransferId
from ...memory.base import Segment
from ..base import CONTROL_TRANSPORT, Channel
from ..tcp import TcpChannel, TcpTransport
from .agent import Agent, load_api, ucx_transports
from .pieces import pair_rows
from .receipt import POLL, QUIESCE, NixlReceipt
from .wire import CANCEL, CODE, DESCS, FIN, ID, MD_LEN, META, META_HEAD, NOTIF, NOTIF_ID

__all__ = ["NixlTransport", "NixlChannel", "NixlReceipt", "SCHEME"]

log = logging.getLogger("datadistd.transport.nixl")

SCHEME = "nixl+tcp"
ControlHandler = Callable[[int, bytes], None]

_MAX_WAITING = 4096      # destination lists kept for transfers not sent yet (a peer's; the oldest go first)
_MAX_BACKLOG = 256       # link control frames kept before the link manager set its handler
_CONTROL_TIMEOUT = 5.0   # bound on sending one control frame
_NAP = 0.0002            # the longest sleep between two looks for a receipt's notification
_IDLE = 0.005            # progress thread: the pause between two looks when no receipt waits


class _Peer:
    """The state of one link (one token) on this side: the peer's agent, destination lists received,
    receipts, and the link manager's control handler. Shared by the channel object(s) of the token."""

    def __init__(self, transport: "NixlTransport", token: bytes, outbound: bool) -> None:
        self.transport = transport
        self.token = token
        self.outbound = outbound
        self.tcp: TcpChannel | None = None
        self.agent_name: str | None = None
        self.ready = threading.Event()
        self.shipped: set[int] = set()             # registration serials this peer has metadata of
        self.closed = False
        self._cond = threading.Condition()
        self._waiting: OrderedDict[int, np.ndarray] = OrderedDict()   # tid -> destination rows
        self._cancelled: OrderedDict[int, None] = OrderedDict()
        self._sending: set[int] = set()
        self._forgotten = False
        self._receipts: dict[int, NixlReceipt] = {}
        self._handler: ControlHandler | None = None
        self._backlog: list[tuple[int, bytes]] = []

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
                raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, "nixl: the data channel is not connected")
            self.tcp = tcp
        return tcp

    # -- sending our messages --

    def send(self, payload: bytes, deadline: float | None = None) -> None:
        self.channel().send_control(CONTROL_TRANSPORT, payload, deadline or time.monotonic() + _CONTROL_TIMEOUT)

    def fin(self, tid: int, code: int) -> None:
        try:
            self.send(ID.pack(FIN, tid) + CODE.pack(int(code)))
        except DataDistError as exc:
            log.warning("nixl: could not tell the peer %s that transfer %d ended: %s", self.what, tid, exc)

    # -- frames from the peer (a tcp reader thread) --

    def on_frame(self, kind: int, payload: bytes) -> None:
        if kind != CONTROL_TRANSPORT:
            with self._cond:
                handler = self._handler
                if handler is None:
                    if len(self._backlog) >= _MAX_BACKLOG:
                        raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, "too many control frames before the "
                                                                           "link was ready")
                    self._backlog.append((kind, payload))
                    return
            handler(kind, payload)
            return
        try:
            self._on_message(payload)
        except (struct.error, ValueError, DataDistError) as exc:
            log.warning("nixl: bad message from %s (%s); closing the channel", self.what, exc)
            self.transport._drop(self, f"bad nixl message: {exc}")

    def set_handler(self, handler: ControlHandler) -> None:
        with self._cond:
            self._handler = handler
            backlog, self._backlog = self._backlog, []
        for kind, payload in backlog:
            handler(kind, payload)

    def _on_message(self, payload: bytes) -> None:
        letter = payload[:1]
        if letter == META:
            _, reply, size = META_HEAD.unpack_from(payload)
            name = payload[META_HEAD.size:META_HEAD.size + size].decode()
            self.transport._bind_agent(self, name, payload[META_HEAD.size + size:])
            if reply:
                self.send(self.transport._meta(self, reply=False))
            self.ready.set()
        elif letter == DESCS:
            _, tid = ID.unpack_from(payload)
            (size,) = MD_LEN.unpack_from(payload, ID.size)
            at = ID.size + MD_LEN.size
            if size:
                if self.transport._agent().add_peer(payload[at:at + size]) != self.agent_name:
                    raise ValueError("partial metadata of another agent")
            rows = np.frombuffer(payload, dtype=np.uint64, offset=at + size).reshape(-1, 2)
            with self._cond:
                if tid in self._cancelled:
                    return
                self._waiting[tid] = rows
                while len(self._waiting) > _MAX_WAITING:
                    old, _ = self._waiting.popitem(last=False)
                    log.warning("nixl: %s sent more than %d destination lists that were never used; dropped "
                                "transfer %d's", self.what, _MAX_WAITING, old)
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
        """The rows the receiver of ``tid`` registered, once its DESCS message is here."""
        with self._cond:
            while True:
                rows = self._waiting.pop(tid, None)
                if rows is not None:
                    self._sending.add(tid)
                    return rows
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

    def add_receipt(self, receipt: NixlReceipt) -> None:
        with self._cond:
            if self.closed:
                raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"data channel {self.what} is closed")
            self._receipts[receipt.transfer_id] = receipt

    def forget(self, tid: int) -> bool:
        with self._cond:
            return self._receipts.pop(tid, None) is not None

    def quiesce(self, receipt: NixlReceipt) -> None:
        """Ask the sender to stop ``receipt``'s transfer and wait (bounded) until nothing more of it can land:
        its FIN (nothing was posted) or the notification of the WRITE it had posted."""
        tid = int(receipt.transfer_id)
        if not self.broken:
            try:
                self.send(ID.pack(CANCEL, tid), time.monotonic() + QUIESCE)
            except DataDistError as exc:
                log.warning("nixl: could not cancel transfer %d at %s: %s", tid, self.what, exc)
        if receipt._settle(time.monotonic() + QUIESCE) and receipt._confirmed:
            return
        log.warning("nixl: the sender of transfer %d (%s) did not confirm it stopped; dropping the channel "
                    "and its NIXL connection", tid, self.what)
        self.transport._drop(self, f"transfer {tid} could not be cancelled")

    def close(self) -> None:
        """No more transfers on this link. Receipts still waiting settle in their waits (``_settle``): the
        peer's posted WRITEs may still complete and notify."""
        with self._cond:
            self.closed = True
            self._waiting.clear()
            self._cond.notify_all()


class NixlChannel:
    """One link's data channel: the tcp channel it runs on, and NIXL WRITEs for the bytes."""

    def __init__(self, transport: "NixlTransport", peer: _Peer) -> None:
        self._transport = transport
        self._peer = peer

    def __repr__(self) -> str:
        return f"NixlChannel({self._peer.what}, agent={self._peer.agent_name})"

    @property
    def token(self) -> bytes:
        return self._peer.token

    @property
    def streams(self) -> int:
        return self._peer.channel().streams

    @property
    def broken(self) -> bool:
        return self._peer.broken

    @property
    def peer_agent(self) -> str | None:
        return self._peer.agent_name

    def send(self, transfer_id: TransferId, segments: Sequence[Segment], deadline: float) -> None:
        peer, tid = self._peer, int(transfer_id)
        agent = self._transport._agent()
        try:
            rows, _, _ = agent.addresses(segments)
            if not peer.ready.wait(max(0.0, deadline - time.monotonic())) or peer.agent_name is None:
                raise DataDistError(LLMStatusCode.LLM_TIMEOUT, f"the peer {peer.what} never sent its NIXL metadata")
            dst = peer.destination(tid, deadline)
        except DataDistError as exc:
            peer.fin(tid, exc.code)
            raise
        try:
            try:
                src, dst = pair_rows(rows, dst)
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
            if peer.broken and exc.code != LLMStatusCode.LLM_TIMEOUT:   # the link went: say so, not why NIXL failed
                failure = DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"transfer {tid}: data channel {peer.what} "
                                                                       f"closed ({exc.message})")
            peer.fin(tid, failure.code)
            raise failure from None
        finally:
            peer.sent(tid)

    def try_send(self, transfer_id: TransferId, segments: Sequence[Segment], deadline: float) -> bool:
        return False   # a WRITE waits for its completion: always from a thread (declining is allowed)

    def abort(self, transfer_id: TransferId, code: LLMStatusCode) -> None:
        if self._peer.channel().broken:
            return
        self._peer.fin(int(transfer_id), code if code != LLMStatusCode.LLM_SUCCESS else LLMStatusCode.LLM_FAILED)

    def close(self) -> None:
        self._transport._drop(self._peer, "closed locally", close=True)

    # -- control frames of the link manager (transport.base.Channel) --

    def on_control(self, handler: ControlHandler) -> None:
        self._peer.set_handler(handler)

    def try_control(self, kind: int, payload: bytes, deadline: float) -> bool:
        return self._peer.channel().try_control(kind, payload, deadline)

    def send_control(self, kind: int, payload: bytes, deadline: float) -> None:
        self._peer.channel().send_control(kind, payload, deadline)


class NixlTransport:
    """Links whose bytes move by NIXL (``[transport] name = "nixl"``): see the package doc."""

    name = "nixl"

    def __init__(self, host: str = "127.0.0.1", port: int = 0, backend: str = "UCX", chunk_size: int = 4 << 20,
                 connect_timeout: float = 5.0, admission: AdmissionLimits | None = None, **tcp: Any) -> None:
        self._check_engine()   # LLM_FEATURE_NOT_ENABLED naming what is missing, before anything is made
        self.backend = backend
        self._tcp = TcpTransport(host, port, chunk_size=chunk_size, connect_timeout=connect_timeout,
                                 admission=admission, **tcp)
        self._lock = threading.Lock()
        self._nixl: Agent | None = None
        self._peers: dict[bytes, _Peer] = {}
        self._names: dict[str, set[bytes]] = {}   # peer agent name -> tokens of the links that use it
        self._ids = int.from_bytes(os.urandom(4), "little") << 24
        self._deferred: ThreadPoolExecutor | None = None
        self._landing: dict[int, NixlReceipt] = {}   # receipts whose notification has not been seen
        self._polling = threading.Lock()
        self._stopping = threading.Event()
        self._progress_thread: threading.Thread | None = None
        self.bytes_sent = 0

    scheme = SCHEME

    # -- what a transport over another one-sided engine (hccl) replaces --

    def _check_engine(self) -> None:
        load_api()

    def _new_agent(self) -> Any:
        return Agent(f"datadistd-{os.getpid()}-{os.urandom(4).hex()}", self.backend)

    def _on_extra(self, peer: _Peer, payload: bytes) -> None:
        """A message of the peer's that is not one of NIXL's (none is: the channel is dropped)."""
        raise ValueError(f"unknown message {payload[:1]!r}")

    @property
    def label(self) -> str:
        return f"nixl:{self.backend}(UCX_TLS={ucx_transports()})" if self.backend == "UCX" else f"nixl:{self.backend}"

    @property
    def endpoint(self) -> str:
        return self.scheme + self._tcp.endpoint[len("tcp"):]

    @property
    def agent_name(self) -> str | None:
        return self._nixl.name if self._nixl is not None else None

    def _agent(self) -> Agent:
        agent = self._nixl
        if agent is None:
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, "nixl transport is not running")
        return agent

    # -- life cycle --

    def start(self) -> None:
        if self._nixl is not None:
            return
        self._nixl = self._new_agent()
        self._deferred = ThreadPoolExecutor(1, thread_name_prefix="datadist-nixl-control")
        self._stopping.clear()
        self._progress_thread = threading.Thread(target=self._progress, name="datadist-nixl-progress", daemon=True)
        self._progress_thread.start()
        try:
            self._tcp.start()
        except BaseException:
            self.stop()
            raise

    def _progress(self) -> None:
        """UCX makes progress only when called: look for notifications (which also accepts peers' connections
        and receives the bytes of transports that need the target, UCX's TCP) every ``_NAP`` at most while
        a receipt waits, every ``_IDLE`` otherwise."""
        while not self._stopping.is_set():
            self.poll()
            self._stopping.wait(_NAP if self._landing else _IDLE)

    def stop(self) -> None:
        self._stopping.set()
        thread, self._progress_thread = self._progress_thread, None
        if thread is not None:
            thread.join(2.0)
        self._tcp.stop()
        with self._lock:
            peers = list(self._peers.values())
            self._peers.clear()
        for peer in peers:
            peer.close()
        if self._deferred is not None:
            self._deferred.shutdown(wait=False, cancel_futures=True)
        agent, self._nixl = self._nixl, None
        if agent is not None:
            agent.close()

    def admission_stats(self) -> dict[str, int]:
        return self._tcp.admission_stats()

    # -- links --

    def allow(self, token: bytes) -> None:
        peer = _Peer(self, bytes(token), outbound=False)
        with self._lock:
            old = self._peers.pop(peer.token, None)
            self._peers[peer.token] = peer
        if old is not None:
            self._forget_peer(old)
        self._tcp.allow(token)
        self._tcp.on_control(token, peer.on_frame)

    def revoke(self, token: bytes) -> None:
        with self._lock:
            peer = self._peers.get(bytes(token))
        if peer is not None:
            self._drop(peer, "revoked")
        self._tcp.revoke(token)

    def on_control(self, token: bytes, handler: ControlHandler) -> None:
        with self._lock:
            peer = self._peers.get(bytes(token))
        if peer is None:
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, "nixl: on_control for a token never allowed")
        peer.set_handler(handler)

    def connect(self, endpoint: str, token: bytes, streams: int, deadline: float) -> NixlChannel:
        scheme, sep, rest = endpoint.partition("://")
        if scheme != self.scheme or not sep:
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED,
                                f"the peer's data plane is {scheme or endpoint!r}, this daemon's is {self.name}: both "
                                f"daemons must set the same [transport] name")
        peer = _Peer(self, bytes(token), outbound=True)
        tcp = self._tcp.connect(f"tcp://{rest}", token, streams, deadline)
        peer.tcp = tcp
        with self._lock:
            self._peers[peer.token] = peer
        tcp.on_control(peer.on_frame)
        try:
            peer.send(self._meta(peer, reply=True), deadline)
            if not peer.ready.wait(max(0.0, deadline - time.monotonic())):
                raise DataDistError(LLMStatusCode.LLM_TIMEOUT, f"the peer at {endpoint} did not answer with its "
                                                               f"NIXL metadata in time")
            if peer.broken:
                raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"the peer at {endpoint} closed the channel "
                                                                   f"during the NIXL metadata exchange")
        except BaseException:
            self._drop(peer, "metadata exchange failed", close=True)
            raise
        return NixlChannel(self, peer)

    def channel(self, token: bytes) -> NixlChannel | None:
        with self._lock:
            peer = self._peers.get(bytes(token))
        if peer is None or self._tcp.channel(token) is None:
            return None
        return NixlChannel(self, peer)

    def _meta(self, peer: _Peer, reply: bool) -> bytes:
        agent = self._agent()
        serials = agent.serials()        # taken first: every one of them is in the metadata below
        metadata = agent.metadata()
        peer.shipped |= serials
        name = agent.name.encode()
        return META_HEAD.pack(META, int(reply), len(name)) + name + metadata

    def _bind_agent(self, peer: _Peer, name: str, metadata: bytes) -> None:
        """The peer of ``peer`` says its agent is ``name``: load its metadata, after checking the name is
        neither ours nor one a link to another engine uses."""
        agent = self._agent()
        if not name or name == agent.name or (peer.agent_name is not None and peer.agent_name != name):
            raise ValueError(f"peer agent name {name!r} refused")
        with self._lock:
            users = self._names.setdefault(name, set())
            if any(self._peers.get(t) is not None and t != peer.token for t in users):
                log.info("nixl: agent %s now also serves link token %s", name, peer.token[:4].hex())
            users.add(peer.token)
        if agent.add_peer(metadata) != name:
            raise ValueError(f"peer metadata is not of agent {name!r}")
        peer.agent_name = name

    def _drop(self, peer: _Peer, reason: str, close: bool = True) -> None:
        with self._lock:
            if self._peers.get(peer.token) is peer:
                del self._peers[peer.token]
        if close and peer.tcp is not None:
            peer.tcp.close()
        self._forget_peer(peer)
        log.debug("nixl: link %s dropped: %s", peer.what, reason)

    def _forget_peer(self, peer: _Peer) -> None:
        """Close ``peer`` and, once no send of it runs any more, unload its agent (the last link using it):
        a posted WRITE keeps its connection until it completed (see ``NixlChannel.send``)."""
        peer.close()
        name = peer.agent_name
        if name is None or self._nixl is None or not peer.idle_after_close():
            return
        with self._lock:
            users = self._names.get(name, set())
            users.discard(peer.token)
            last = not users
            if last:
                self._names.pop(name, None)
        if last:
            self._nixl.drop_peer(name)

    # -- transfers --

    def poll(self) -> None:
        """Hand the NIXL notifications that arrived to their receipts (one thread at a time; the others
        find their receipt finished by it)."""
        agent = self._nixl
        if agent is None or not self._polling.acquire(blocking=False):
            return
        try:
            for name, message in agent.notifications():
                if len(message) != NOTIF_ID.size or not message.startswith(NOTIF):
                    log.warning("nixl: ignored a notification from %s that is not datadist's", name)
                    continue
                _, tid = NOTIF_ID.unpack(message)
                receipt = self._landing.get(tid)
                if receipt is None or receipt._peer.agent_name != name:   # late, or not that peer's to finish
                    log.debug("nixl: notification of transfer %d from %s matches no receipt", tid, name)
                    continue
                receipt._confirmed = True
                receipt._finish(None)
        finally:
            self._polling.release()

    def _landed(self, tid: int) -> None:
        self._landing.pop(tid, None)

    def expect(self, segments: Sequence[Segment], channel: Channel | None = None) -> NixlReceipt:
        if not isinstance(channel, NixlChannel):
            raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID, "nixl: expect() needs the link's channel")
        peer = channel._peer
        agent = self._agent()
        rows, used, _ = agent.addresses(segments)
        missing = [reg for reg in used if reg.serial not in peer.shipped]
        metadata = agent.partial_metadata(missing) if missing else b""
        with self._lock:
            self._ids += 1
            tid = TransferId(self._ids)
        receipt = NixlReceipt(self, peer, tid, int(rows[:, 1].sum()) if len(rows) else 0)
        peer.add_receipt(receipt)
        self._landing[tid] = receipt
        payload = ID.pack(DESCS, tid) + MD_LEN.pack(len(metadata)) + metadata + rows.tobytes()
        tcp = peer.channel()
        if not tcp.try_control(CONTROL_TRANSPORT, payload, time.monotonic() + _CONTROL_TIMEOUT):
            deferred = self._deferred
            if deferred is None:
                raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, "nixl transport is not running")
            deferred.submit(self._send_later, peer, receipt, payload)
        peer.shipped.update(reg.serial for reg in missing)
        return receipt

    def _send_later(self, peer: _Peer, receipt: NixlReceipt, payload: bytes) -> None:
        try:
            peer.send(payload)
        except DataDistError as exc:
            receipt._finish(exc)
