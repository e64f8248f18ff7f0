"""The ``Transport`` seam.

Life cycle of a link's data plane (TCP shown; others follow the same shape):

1. The *serving* daemon calls ``allow(token)`` during the Peer handshake, with a fresh random
   token it hands to the linking daemon (over the authenticated gRPC handshake).
2. The *linking* daemon calls ``connect(endpoint, token, streams, deadline)``: it opens
   ``streams`` connections, each presenting the token; the serving side then finds the same
   connections with ``channel(token)``. A channel carries bytes both ways.
3. Receiving: ``expect(segments)`` registers where an incoming transfer's byte stream goes and
   returns a ``Receipt`` with a fresh transfer id; the id travels to the sender in an owner call.
4. Sending: ``channel.send(transfer_id, segments, deadline)`` streams the concatenated bytes of
   ``segments``; it may stripe them over all of the channel's connections.
5. ``receipt.wait(deadline)`` returns once every byte arrived, or raises ``DataDistError``
   (``LLM_TIMEOUT`` at the deadline, ``LLM_LINK_FAILED`` when the channel broke, or the code
   the sender aborted with).

All deadlines are absolute ``time.monotonic()`` values. No call blocks past its deadline.

Every channel also carries small *control frames* (``CONTROL_KINDS``) beside the bytes: the owner calls
of a transfer, unlink and liveness (``datadistd.links.wire.ownercalls``), so after the handshake the channel is the
only conversation between two daemons. The serving end sets its handler by token, before the channel
exists (``Transport.on_control``); the linking end on the channel it opened (``Channel.on_control``).
When the channel breaks or closes, the handler hears it once, after every frame handed to it, as the pseudo
kind ``CONTROL_DOWN`` (payload: the reason, UTF-8): the link fails every call pending on the channel at once,
not at its next heartbeat. It is no frame kind: nothing on the wire can carry it.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

from datadist.status import LLMStatusCode

from ..core.types import TransferId
from ..memory.base import Segment

__all__ = ["Transport", "Channel", "Receipt", "ReadTables", "ControlHandler", "ControlRefused",
           "CONTROL_CALL", "CONTROL_REPLY", "CONTROL_TRANSPORT", "CONTROL_KINDS", "CONTROL_DOWN", "EarlyFrames",
           "EARLY_FRAMES_MAX"]

#: control frames: an owner call, and its answer
CONTROL_CALL, CONTROL_REPLY = 4, 5
#: control frames of a transport layered on a channel (``nixl`` runs its own messages over a tcp channel)
CONTROL_TRANSPORT = 6
CONTROL_KINDS = (CONTROL_CALL, CONTROL_REPLY, CONTROL_TRANSPORT)
#: not a frame: what a channel tells its control handler, once, when it broke or closed (payload: the reason);
#: never in ``CONTROL_KINDS``, so no peer can send it
CONTROL_DOWN = 0

#: ``handler(kind, payload)``: a control frame, called in a transport thread (keep it short)
ControlHandler = Callable[[int, bytes], None]

#: control frames a channel keeps while its handler is not set yet (``EarlyFrames``)
EARLY_FRAMES_MAX = 256


class EarlyFrames:
    """Where a channel's control frames go: to its handler, or -- before one is set -- into a bounded backlog
    that the handler gets, in arrival order, when it is set. Thread-safe (frames come from reader threads)."""

    def __init__(self, limit: int = EARLY_FRAMES_MAX) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._handler: ControlHandler | None = None
        self._frames: list[tuple[int, bytes]] = []

    def deliver(self, kind: int, payload: bytes) -> bool:
        """Hand one frame to the handler (in the calling thread), or keep it until there is one; False, the frame
        not kept, when ``limit`` frames already wait (the caller breaks the channel: a peer flooding it)."""
        with self._lock:
            handler = self._handler
            if handler is None:
                if len(self._frames) >= self.limit:
                    return False
                self._frames.append((kind, payload))
                return True
        handler(kind, payload)
        return True

    @property
    def handler(self) -> ControlHandler | None:
        """The handler set, if any."""
        return self._handler

    def set_handler(self, handler: ControlHandler) -> None:
        """From now on frames go to ``handler``; the ones kept so far are handed to it here, first."""
        with self._lock:
            self._handler = handler
            frames, self._frames = self._frames, []
        for kind, payload in frames:
            handler(kind, payload)


class ControlRefused(Exception):
    """What a control handler raises to refuse a frame of a peer that broke a rule (it floods its link): the
    transport drops the connection the frame came on, and with it the channel (the message is the reason)."""


class Receipt(Protocol):
    @property
    def transfer_id(self) -> TransferId: ...

    @property
    def expected(self) -> int:
        """Total bytes expected."""

    @property
    def received(self) -> int: ...

    @property
    def done(self) -> bool:
        """Every byte arrived already: ``wait`` would return at once (the caller may skip a thread hop)."""

    def wait(self, deadline: float) -> None:
        """Block until all bytes arrived; raise ``DataDistError`` on timeout, abort or broken channel."""

    def cancel(self) -> None:
        """Forget the transfer; late bytes for it are read and discarded."""


class SendFinish(Protocol):
    """The rest of a send finishing from the event loop (``Channel.try_send_soon``)."""

    async def wait(self) -> None:
        """Until every byte is out; raises the send's failure. Cancelled, it gives the send up first."""


class Channel(Protocol):
    @property
    def token(self) -> bytes: ...

    @property
    def streams(self) -> int:
        """Number of live connections."""

    @property
    def broken(self) -> bool: ...

    def send(self, transfer_id: TransferId, segments: Sequence[Segment], deadline: float) -> None:
        """Send the concatenation of ``segments`` as transfer ``transfer_id``; raise on deadline/breakage."""

    def try_send(self, transfer_id: TransferId, segments: Sequence[Segment], deadline: float) -> bool:
        """Send a small transfer from the calling thread (the event loop) without blocking, or decline with
        ``False`` and no side effect (then the caller uses ``send`` from a thread). Declining is always allowed."""

    def try_send_soon(self, transfer_id: TransferId, segments: Sequence[Segment],
                      deadline: float) -> "bool | SendFinish":
        """``try_send`` for a larger transfer, from the event loop: True (sent), False (declined, no side effect:
        ``send`` it from a thread), or -- the connection took only part -- what finishes it from the event loop:
        await its ``wait()`` before the source may go (it raises the send's failure)."""

    def abort(self, transfer_id: TransferId, code: LLMStatusCode) -> None:
        """Tell the receiver that ``transfer_id`` failed with ``code`` (best effort)."""

    def on_control(self, handler: ControlHandler) -> None:
        """``handler(kind, payload)`` for every control frame, called in a transport thread (keep it short), and
        once ``CONTROL_DOWN`` when the channel broke or closed (at once if it already has)."""

    def try_control(self, kind: int, payload: bytes, deadline: float) -> bool:
        """Send one control frame without blocking; False (nothing sent) when that is not possible now."""

    def send_control(self, kind: int, payload: bytes, deadline: float) -> None:
        """Send one control frame, blocking until ``deadline`` at most."""

    def close(self) -> None: ...


class Transport(Protocol):
    name: str
    #: small pulls (at most ``ownercalls.INLINE_READ_MAX`` bytes) come back in the owner's reply, not as a transfer
    #: on this transport: true where the bytes would cross the same socket anyway (tcp), false where a fabric moves
    #: them (nixl, hccl)
    inline_small_reads: bool

    @property
    def label(self) -> str:
        """What links report as their transport (``ListLinks``, metrics): the name, and for transports
        over an engine with backends, which one (``nixl:UCX(UCX_TLS=tcp)``)."""

    @property
    def endpoint(self) -> str:
        """Address peers connect to, e.g. ``tcp://127.0.0.1:40123``."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def allow(self, token: bytes) -> None: ...

    def revoke(self, token: bytes) -> None:
        """Stop accepting ``token`` and close the channel made with it."""

    def connect(self, endpoint: str, token: bytes, streams: int, deadline: float) -> Channel: ...

    def channel(self, token: bytes) -> Channel | None:
        """The inbound channel made with ``token``, once at least one connection presented it."""

    def on_control(self, token: bytes, handler: ControlHandler) -> None:
        """The control frames of the inbound channel made with ``token``: the handler is set at the handshake,
        before the channel exists."""

    def expect(self, segments: Sequence[Segment], channel: Channel | None = None) -> Receipt:
        """Where the bytes of a new incoming transfer go; ``channel``: the one they will come on (its
        breaking fails the receipt at once)."""


@runtime_checkable
class SendsParts(Protocol):
    """A channel that sends a control frame straight from views of memory (tcp: ``TcpChannel``): an owner's small
    read answered by its reader thread (``links/calls.py``, ``engine/readview.py``)."""

    def try_control_parts(self, kind: int, parts: list, unlock: Callable[[], None] | None = None) -> bool:
        """``parts`` as one control frame without blocking, no copy; False, nothing sent, when that is not possible
        now. ``parts`` is emptied and ``unlock`` called exactly once, as soon as the parts are no longer read."""


@runtime_checkable
class ReadTables(Protocol):
    """A transport whose pulls read tables the owner published to the link (``nixl``: a prepared READ; ``hccl``:
    ``HcclBatchGet``) -- every one-sided transport; ``tcp`` pulls by the owner's send. The owner
    publishes each cache its engine made remotely accessible once -- a handle, its rows, ``info`` (the link code's
    description of the cache, opaque here) -- updates it, and withdraws it before its memory can be reused; the
    puller resolves a key by the table and reads rows of the handle, no owner call (``transport.onesided.tables``).
    Declared by the transport's class (the link code asks once)."""

    def publish(self, tensors: Sequence[Segment], row_size: int, rows: int, info: bytes) -> int:
        """Owner side: publish a cache to every link, now and to links made later; its handle."""

    def update(self, handle: int, info: bytes) -> None:
        """Owner side: ``handle``'s cache is described anew (its keys changed)."""

    def withdraw(self, handle: int) -> None:
        """Owner side: no link reads ``handle`` once this returns (the memory may then be reused)."""

    def table_of(self, channel: Channel, known: int) -> tuple[int, dict[int, bytes] | None]:
        """Puller side: the version of the table published on ``channel``'s link and, unless it is ``known``, its
        entries' info by handle."""

    def read_rows(self, channel: Channel, handle: int, spans: Any, segments: Sequence[Segment],
                  deadline: float) -> None:
        """Puller side: read ``spans`` (``(tensor, offset, length)`` rows of a numpy array) of ``handle`` into
        ``segments``; returns once all bytes are in."""

    def start_rows(self, channel: Channel, handle: int, spans: Any, segments: Sequence[Segment], deadline: float,
                   loop: Any) -> Any:
        """Puller side, on the event loop: ``read_rows`` posted without a worker thread, a future of ``loop`` that
        ends with it; None when it needs a worker thread (``read_rows``)."""
