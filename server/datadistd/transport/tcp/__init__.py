"""The TCP data plane: plain sockets, threads, scatter/gather, no staging copy for mapped memory.

Wire format (little endian, ``struct``):

* **Hello** (connecting side, once per socket): ``<4sBBHH`` = magic ``DDHL``, protocol version,
  token length (1..64), stream index, stream count; then the token bytes. The accepting side
  compares the token with every ``allow()``-ed token (``hmac.compare_digest``) and answers one
  ``ACK`` byte, or closes the socket without a word (bad token, garbage, or no hello within
  ``connect_timeout``).
* **Frames** (both directions, after the ack): ``<4sBxxxQQQ`` = magic ``DDFR``, kind,
  transfer id, stream offset, length; then the payload.

  - ``DATA``: ``length`` payload bytes that belong at byte ``offset`` of the concatenated
    stream of transfer ``transfer_id`` (the receiver's ``expect`` segments);
  - ``ABORT``: the sender gave up on ``transfer_id``; ``length`` carries the status code;
  - ``PING``: no payload; read and ignored (nothing sends it: liveness is a ``ping`` owner call);
  - ``CALL`` / ``REPLY``: ``length`` (at most ``MAX_CONTROL``) bytes of a control message for the
    link manager (an owner call of ``framecalls.FrameCalls`` and its reply, ``ownerwire`` frames);
    ``transfer id`` and ``offset`` are 0. The reader hands the payload to the channel's control
    handler (``on_control``) in its own thread; frames that arrive before a handler is set wait for it
    (at most ``transport.base.EARLY_FRAMES_MAX``). After the handshake these are the only conversation
    between two daemons (``peering.PROTOCOL_VERSION``). When the channel breaks or closes, the handler hears it
    once, after the frames before (``base.CONTROL_DOWN``: no frame kind).
  - ``TRANSPORT``: like ``CALL``, but for a transport layered on this channel (``nixl`` sends its
    metadata, destination descriptors and completions this way).

  A malformed header closes that connection and marks its channel broken.

Segments travel as a ``memory.segments.SegmentTable`` (numpy arrays: handle, offset, length);
a plain segment list is converted once. Nothing is built per segment up front: each frame's segments
are cut from the table when the frame is sent or received.

Threads: one accept thread per transport (it also closes hellos past their deadline); every connection of the
process, and every newcomer's hello, is read by a small shared pool of reader threads (``reactor``; bounded by the
CPU count, not by the connections), each with its own epoll. A data connection belongs to one of them for its life,
registered edge-triggered: the thread reads it dry each time the kernel reports it -- a frame once begun to its end,
then whatever frames already wait -- with no re-arm per frame and no hand-off of the socket to another thread, so its
control frames reach the handler in order, on that thread. Hellos (and the attach connections of ``api.attach``)
are one-shot in the first thread's epoll, which reads no data connection when the pool has more than one thread. An
idle connection wakes nobody; ``shutdown()`` makes it readable (EOF) at a close. Inside a frame each receive wakes
every ``_POLL`` to notice a cancelled receipt; a peer that sends nothing of a frame it began for ``_STALL`` seconds
loses the connection (until then the other connections of its thread wait). A reader asks one receive call for a
control frame's payload and the next header, and reads a header with up to ``_READ_AHEAD`` bytes behind control
frames in a row (so a small frame costs one call, and a short read says the socket is drained: no probe that fails
with EAGAIN, and the next bytes make the next edge); what it read ahead is served first (``DataConn.turn``). Readers
scatter DATA payloads straight into the destination memory (but for what was read ahead) with ``recvmsg_into`` (at
most ``_RECV_MAX`` bytes and ``_IOV_MAX`` views per call) or, for handles without a mapping, receive into a per-
thread staging buffer and write it out in one batch per handle (``write_raw``: cross-memory attach, ``IOV_MAX``
segments per system call; else ``write_from``).
Senders split the stream into frames of
``chunk_size`` bytes (or ``_FRAME_SEGMENTS`` segments, whichever ends first), stripe frame *k* over
socket *(base + k) % w* (``w`` = the stripe width, one worker thread per stripe, the caller being
one of them; ``base`` rotates per transfer, so concurrent transfers use every connection) and
write each frame with one ``socket.sendmsg([header, view, view, ...])`` under that socket's lock
(first come, first served), so concurrent transfers interleave at frame granularity. Segments of
handles without a view are read into the worker's staging buffer first (``read_raw`` batches),
outside the lock. ``TcpChannel.try_send`` sends a small transfer as one frame from the calling
thread (the event loop) when a connection is idle, or declines without a side effect.

Memory safety: a reader touches a receipt's destination only between ``_begin_io`` and
``_end_io``; once a receipt failed or was cancelled, ``wait``/``cancel`` return only after every
reader left it, so the caller may reuse the memory at once.

Modules, bottom to top (each imports only modules before it, for the type checker too): ``wire`` (constants, header
structs, small helpers), ``reactor`` (``Reactor``: the reader threads, an epoll each), ``lock`` (``FairLock``),
``staging`` (``Buffers``, ``SendPlan``, ``write_out``: bytes of handles without a mapping), ``receipt``
(``TcpReceipt``), ``conn`` (``DataConn``: a socket, its send lock and its reader -- the reactor turn, frames checked
and handed on, the bytes it read ahead; ``ConnOwner``, what it needs of its channel), ``loopsend`` (``LoopFinish``),
``channel`` (``TcpChannel``: sending, striping, control frames; ``ChannelOwner``, what it needs of its transport),
``listener`` (``TcpListener``: accept, admission, hello), ``transport`` (``TcpTransport``: tokens, the tables of
channels and receipts, connect).
"""

from __future__ import annotations

from .channel import TcpChannel
from .receipt import TcpReceipt
from .transport import TcpTransport
from .wire import (
    _INLINE_MAX,
    ACK,
    FRAME_MAGIC,
    HEADER,
    HELLO,
    HELLO_MAGIC,
    KIND_ABORT,
    KIND_CALL,
    KIND_CONTROL,
    KIND_DATA,
    KIND_PING,
    KIND_REPLY,
    KIND_TRANSPORT,
    MAX_CONTROL,
    MAX_FRAME,
    MAX_STREAMS,
    MAX_TOKEN,
    PROTOCOL_VERSION,
)

__all__ = ["TcpTransport", "TcpChannel", "TcpReceipt", "PROTOCOL_VERSION", "HEADER", "HELLO", "HELLO_MAGIC", "ACK",
           "FRAME_MAGIC", "KIND_DATA", "KIND_ABORT", "KIND_PING", "KIND_CALL", "KIND_REPLY", "KIND_TRANSPORT",
           "KIND_CONTROL", "MAX_FRAME", "MAX_CONTROL", "MAX_TOKEN", "MAX_STREAMS", "_INLINE_MAX"]
