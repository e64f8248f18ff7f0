"""``OneSidedTransport``: bytes by an agent's one-sided WRITE, everything else over a tcp channel (the base of
``NixlTransport`` and ``HcclTransport``; see the package doc)."""

from __future__ import annotations

import abc
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

import numpy as np

from datadist.status import LLMStatusCode

from ...core.errors import DataDistError
from ...core.types import TransferId
from ...guard.admission import AdmissionLimits
from ...memory.base import Segment
from ..base import CONTROL_TRANSPORT, Channel, ControlHandler
from ..registrations import Registration
from ..tcp import TcpTransport
from .agent import InFlight, OneSidedAgent
from .link import _CONTROL_TIMEOUT, LinkPeer, OneSidedChannel
from .pairing import pair_extents
from .receipt import OneSidedReceipt
from .wire import DESCS, ID, MD_LEN, META, META_HEAD, NOTIF, NOTIF_ID

__all__ = ["OneSidedTransport"]

log = logging.getLogger("datadistd.transport.onesided")

_NAP = 0.0002            # the longest sleep between two looks for a receipt's notification
_IDLE = 0.005            # progress thread: the pause between two looks when no receipt waits


class OneSidedTransport(abc.ABC):
    """Links whose bytes move by an agent's one-sided WRITE, everything else over a tcp channel (see the package
    doc). A transport over one engine (``NixlTransport``, ``HcclTransport``) derives from this and says what it
    adds: ``name``, ``scheme``, ``label``, ``_check_engine``, ``_new_agent`` and, if its agents exchange messages
    of their own over the link, ``_on_extra``."""

    name = ""
    scheme = ""
    inline_small_reads = False   # a pull's bytes move on the fabric, whatever their size
    #: how long after a peer's READ (its notification) the progress thread polls as if a receipt waited (a peer's
    #: READ over UCX's TCP needs this side's progress; HCCL's get needs none)
    progress_window = 0.0

    def __init__(self, host: str = "127.0.0.1", port: int = 0, backend: str = "", chunk_size: int = 4 << 20,
                 connect_timeout: float = 5.0, admission: AdmissionLimits | None = None, **tcp: Any) -> None:
        self._check_engine()   # LLM_FEATURE_NOT_ENABLED naming what is missing, before anything is made
        self.backend = backend
        self._tcp = TcpTransport(host, port, chunk_size=chunk_size, connect_timeout=connect_timeout,
                                 admission=admission, **tcp)
        self._lock = threading.Lock()
        self._running_agent: OneSidedAgent | None = None
        self._peers: dict[bytes, LinkPeer] = {}
        self._names: dict[str, set[bytes]] = {}   # peer agent name -> tokens of the links that use it
        self._ids = int.from_bytes(os.urandom(4), "little") << 24
        self._deferred: ThreadPoolExecutor | None = None
        self._landing: dict[int, OneSidedReceipt] = {}   # receipts whose notification has not been seen
        self._polling = threading.Lock()
        self._stopping = threading.Event()
        self._kick = threading.Event()    # wakes the progress thread: a READ was posted, or the transport stops
        self._reading: dict[int, Any] = {}   # READs posted from the event loop, checked by the progress thread
        self._progress_thread: threading.Thread | None = None
        self.bytes_sent = 0
        self.bytes_received = 0   # by READ
        self._progress_until = 0.0

    # -- what each engine's transport says (decided when it is built: no probing) --

    @abc.abstractmethod
    def _check_engine(self) -> None:
        """Raise ``DataDistError(LLM_FEATURE_NOT_ENABLED)`` naming what is missing (before anything is made)."""

    @abc.abstractmethod
    def _new_agent(self) -> OneSidedAgent:
        """This transport's agent (one per engine), made at ``start``."""

    def _on_extra(self, peer: LinkPeer, payload: bytes) -> None:
        """A message of the peer's that is not one of the shared ones (none is, by default: the channel is dropped)."""
        raise ValueError(f"unknown message {payload[:1]!r}")

    @property
    @abc.abstractmethod
    def label(self) -> str:
        """What links report as their transport (``Transport.label``)."""

    @property
    def endpoint(self) -> str:
        return self.scheme + self._tcp.endpoint[len("tcp"):]

    @property
    def agent_name(self) -> str | None:
        return self._running_agent.name if self._running_agent is not None else None

    def _agent(self) -> OneSidedAgent:
        agent = self._running_agent
        if agent is None:
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"{self.name} transport is not running")
        return agent

    # -- life cycle --

    def start(self) -> None:
        if self._running_agent is not None:
            return
        self._running_agent = self._new_agent()
        self._deferred = ThreadPoolExecutor(1, thread_name_prefix=f"datadist-{self.name}-control")
        self._stopping.clear()
        self._progress_thread = threading.Thread(target=self._progress, name=f"datadist-{self.name}-progress",
                                                 daemon=True)
        self._progress_thread.start()
        try:
            self._tcp.start()
        except BaseException:
            self.stop()
            raise

    def _progress(self) -> None:
        """UCX makes progress only when called: look for notifications (which also accepts peers' connections
        and moves the bytes of transports that need the target, UCX's TCP) every ``_NAP`` at most while
        a receipt waits or a peer read recently (``progress_window``), every ``_IDLE`` otherwise; while READs
        posted from the event loop are in flight, it checks them between those looks (``_check_reads``)."""
        while not self._stopping.is_set():
            self._kick.clear()
            self.poll()
            if self._reading:
                self._check_reads(time.monotonic() + _NAP)
                continue
            busy = self._landing or time.monotonic() < self._progress_until
            self._kick.wait(_NAP if busy else _IDLE)

    def _check_reads(self, until: float) -> None:
        """Check the READs in flight (``_reading``) until none is left or ``until`` (a transport that posts none:
        nothing to do)."""
        return None

    def _fail_reads(self) -> None:
        """The transport stopped: end every READ in flight."""
        return None

    def stop(self) -> None:
        self._stopping.set()
        self._kick.set()
        thread, self._progress_thread = self._progress_thread, None
        if thread is not None:
            thread.join(2.0)
        self._fail_reads()
        self._tcp.stop()
        with self._lock:
            peers = list(self._peers.values())
            self._peers.clear()
        for peer in peers:
            peer.close()
        if self._deferred is not None:
            self._deferred.shutdown(wait=False, cancel_futures=True)
        agent, self._running_agent = self._running_agent, None
        if agent is not None:
            agent.close()

    def admission_stats(self) -> dict[str, int]:
        return self._tcp.admission_stats()

    # -- links --

    def allow(self, token: bytes) -> None:
        peer = LinkPeer(self, bytes(token), outbound=False)
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
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"{self.name}: on_control for a token never allowed")
        peer.set_handler(handler)

    def connect(self, endpoint: str, token: bytes, streams: int, deadline: float) -> OneSidedChannel:
        scheme, sep, rest = endpoint.partition("://")
        if scheme != self.scheme or not sep:
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED,
                                f"the peer's data plane is {scheme or endpoint!r}, this daemon's is {self.name}: both "
                                f"daemons must set the same [transport] name")
        peer = LinkPeer(self, bytes(token), outbound=True)
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
            if peer.refused is not None:
                raise peer.refused
            if peer.broken:
                raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"the peer at {endpoint} closed the channel "
                                                                   f"during the NIXL metadata exchange")
        except BaseException:
            self._drop(peer, "metadata exchange failed", close=True)
            raise
        return OneSidedChannel(self, peer)

    def channel(self, token: bytes) -> OneSidedChannel | None:
        with self._lock:
            peer = self._peers.get(bytes(token))
        if peer is None or self._tcp.channel(token) is None:
            return None
        return OneSidedChannel(self, peer)

    def _meta(self, peer: LinkPeer, reply: bool) -> bytes:
        agent = self._agent()
        serials = agent.serials()        # taken first: every one of them is in the metadata below
        metadata = agent.metadata()
        peer.shipped |= serials
        name = agent.name.encode()
        return META_HEAD.pack(META, int(reply), len(name)) + name + metadata

    def _bind_agent(self, peer: LinkPeer, name: str, metadata: bytes) -> None:
        """The peer of ``peer`` says its agent is ``name``: load its metadata, after checking the name is
        neither ours nor one a link to another engine uses."""
        agent = self._agent()
        if not name or name == agent.name or (peer.agent_name is not None and peer.agent_name != name):
            raise ValueError(f"peer agent name {name!r} refused")
        with self._lock:
            users = self._names.setdefault(name, set())
            if any(self._peers.get(t) is not None and t != peer.token for t in users):
                log.info("%s: agent %s now also serves link token %s", self.name, name, peer.token[:4].hex())
            users.add(peer.token)
        if agent.add_peer(metadata, peer.token) != name:
            raise ValueError(f"peer metadata is not of agent {name!r}")
        peer.agent_name = name

    def _drop(self, peer: LinkPeer, reason: str, close: bool = True) -> None:
        with self._lock:
            if self._peers.get(peer.token) is peer:
                del self._peers[peer.token]
        if close and peer.tcp is not None:
            peer.tcp.close()
        self._forget_peer(peer)
        log.debug("%s: link %s dropped: %s", self.name, peer.what, reason)

    def _abandon_read(self, peer: LinkPeer, exc: DataDistError) -> None:
        """A READ from ``peer`` passed its deadline: the link is dropped. One that had not ended within the agent's
        fence after it (``InFlight``) may still land in the pull's destination -- releasing the request and unloading
        the peer's agent do not stop it -- and the operator is told, naming the link (docs/nixl.md, "Failure
        behaviour")."""
        if isinstance(exc, InFlight):
            log.warning("%s: a READ from %s was abandoned in flight (%s); its bytes may still land in the pull's "
                        "destination until the fabric gives the connection up (docs/nixl.md, 'Failure behaviour')",
                        self.name, peer.what, exc.message)
        self._drop(peer, f"a READ did not complete by its deadline ({exc.message})")

    def _forget_peer(self, peer: LinkPeer) -> None:
        """Close ``peer`` and, once no send of it runs any more, unload its agent (the last link using it):
        a posted WRITE keeps its connection until it completed (see ``OneSidedChannel.send``)."""
        peer.close()
        name = peer.agent_name
        if name is None or self._running_agent is None or not peer.idle_after_close():
            return
        with self._lock:
            users = self._names.get(name, set())
            users.discard(peer.token)
            last = not users
            if last:
                self._names.pop(name, None)
        if last:
            self._running_agent.drop_peer(name)

    # -- transfers --

    def poll(self) -> None:
        """Hand the NIXL notifications that arrived to their receipts (one thread at a time; the others
        find their receipt finished by it)."""
        agent = self._running_agent
        if agent is None or not self._polling.acquire(blocking=False):
            return
        try:
            for name, message in agent.notifications():
                if not self._on_notification(name, message):
                    log.warning("%s: ignored a notification from %s that is not datadist's", self.name, name)
        finally:
            self._polling.release()

    def _on_notification(self, name: str, message: bytes) -> bool:
        """A notification of agent ``name``: a WRITE's (finishes its receipt); False if it is none of ours."""
        if len(message) != NOTIF_ID.size or not message.startswith(NOTIF):
            return False
        _, tid = NOTIF_ID.unpack(message)
        receipt = self._landing.get(tid)
        if receipt is None or receipt._peer.agent_name != name:   # late, or not that peer's to finish
            log.debug("%s: notification of transfer %d from %s matches no receipt", self.name, tid, name)
            return True
        receipt._confirmed = True
        receipt._finish(None)
        return True

    def _ready(self, peer: LinkPeer) -> None:
        """``peer`` loaded this agent's metadata and sent its own (a reader thread): nothing more by default."""
        return None

    def _landed(self, tid: int) -> None:
        self._landing.pop(tid, None)

    def _next_id(self) -> TransferId:
        with self._lock:
            self._ids += 1
            return TransferId(self._ids)

    def _describe(self, peer: LinkPeer, segments: Sequence[Segment]) -> tuple[np.ndarray, bytes, list[Registration]]:
        """The extents ``(address, length)`` of ``segments`` in this agent's registrations (registering their handles
        once), the partial metadata ``peer`` lacks to reach them, and the registrations it describes."""
        agent = self._agent()
        extents, used, _ = agent.addresses(segments)
        missing = [reg for reg in used if reg.serial not in peer.shipped]
        return extents, agent.partial_metadata(missing) if missing else b"", missing

    def _paired(self, remote: np.ndarray, segments: Sequence[Segment], code: LLMStatusCode,
                what: str) -> tuple[np.ndarray, np.ndarray]:
        """A READ's ``remote`` extents paired with those of this side's ``segments`` (``pair_extents``); ``code``
        naming ``what`` when they do not match."""
        local, _, _ = self._agent().addresses(segments)
        try:
            return pair_extents(remote, local)
        except ValueError as exc:
            raise DataDistError(code, f"{self.name}: {what} does not match the destination ({exc})") from None

    def expect(self, segments: Sequence[Segment], channel: Channel | None = None) -> OneSidedReceipt:
        peer = _peer_of(self.name, channel)
        extents, metadata, missing = self._describe(peer, segments)
        tid = self._next_id()
        receipt = OneSidedReceipt(self, peer, tid, int(extents[:, 1].sum()) if len(extents) else 0)
        peer.add_receipt(receipt)
        self._landing[tid] = receipt
        payload = ID.pack(DESCS, tid) + MD_LEN.pack(len(metadata)) + metadata + extents.tobytes()
        tcp = peer.channel()
        if not tcp.try_control_first(CONTROL_TRANSPORT, payload, time.monotonic() + _CONTROL_TIMEOUT):
            deferred = self._deferred
            if deferred is None:
                raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"{self.name} transport is not running")
            deferred.submit(self._send_later, peer, receipt, payload)
        peer.shipped.update(reg.serial for reg in missing)
        return receipt

    def _send_later(self, peer: LinkPeer, receipt: OneSidedReceipt, payload: bytes) -> None:
        try:
            peer.send(payload)
        except DataDistError as exc:
            receipt._finish(exc)


def _peer_of(name: str, channel: Channel | None) -> LinkPeer:
    if not isinstance(channel, OneSidedChannel):
        raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID, f"{name}: a transfer needs the link's channel")
    return channel._peer
