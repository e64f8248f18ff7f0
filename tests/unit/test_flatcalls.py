"""The Python calls of one control frame, counted with a profile hook: the send and receive paths every small pull
takes on both daemons stay flat (``TcpChannel.try_control`` / ``try_control_parts`` and ``DataConn.turn`` straight
to the handler), so the flattening cannot silently come back. Deterministic: the frames cross a real loopback TCP
connection; the test thread sends and reads (``turn``) itself, no reader thread involved."""

from __future__ import annotations

import gc
import select
import socket
import sys
import time
from types import FrameType
from typing import Any

import pytest

from datadist.status import LLMStatusCode as S
from datadistd.core.errors import DataDistError
from datadistd.transport.base import CONTROL_CALL, CONTROL_REPLY
from datadistd.transport.tcp.channel import TcpChannel
from datadistd.transport.tcp.receipt import TcpReceipt
from datadistd.transport.tcp.staging import Buffers

pytestmark = pytest.mark.timeout(30)


class _NoReactor:
    """The reactor a connection leaves when it ends; here the test thread runs its turns."""

    def add(self, fd: int, turn: Any) -> None:
        pass

    def remove(self, fd: int) -> None:
        pass


class _Owner:
    """What a channel needs of its transport (``channel.ChannelOwner``)."""

    chunk_size = 1 << 20
    stripe = 1
    _stopping = False

    def __init__(self) -> None:
        self._buffers = Buffers(self.chunk_size)
        self._receipts: dict[int, TcpReceipt] = {}
        self._reactor = _NoReactor()
        self.down: list[str] = []

    def _channel_down(self, channel: TcpChannel, message: str) -> None:
        self.down.append(message)

    def _retire(self, channel: TcpChannel) -> None:
        pass


def _connected() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        a = socket.create_connection(server.getsockname(), timeout=5)
        b, _ = server.accept()
    a.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return a, b


def _calls(fn: Any, *args: Any) -> tuple[Any, list[str]]:
    """``fn(*args)`` and the Python functions it called (profile "call" events; C functions are not counted). The
    collector is off meanwhile: a collection that happens to run in the window calls callbacks and finalizers that
    are none of the path's."""
    names: list[str] = []

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            names.append(frame.f_code.co_name)

    collecting = gc.isenabled()
    gc.disable()
    sys.setprofile(hook)
    try:
        result = fn(*args)
    finally:
        sys.setprofile(None)
        if collecting:
            gc.enable()
    return result, names[:-1] if names and names[-1] == "hook" else names


@pytest.fixture
def link():  # noqa: ANN201
    a, b = _connected()
    out = TcpChannel(_Owner(), b"t" * 32, "peer", outbound=True)
    inb = TcpChannel(_Owner(), b"t" * 32, "peer", outbound=False)
    conn_out = out._attach(a, 0, "peer")
    conn_in = inb._attach(b, 0, "peer")
    assert conn_out is not None and conn_in is not None
    yield out, inb, conn_out, conn_in
    out.close()
    inb.close()
    a.close()
    b.close()


def _readable(sock: socket.socket) -> None:
    """Wait (bounded) until ``sock`` has bytes: the frame arrived whole before the turn that reads it."""
    assert select.select([sock], [], [], 5)[0]
    time.sleep(0.01)


def test_a_control_frame_is_one_python_call_to_send_and_two_to_receive(link) -> None:  # noqa: ANN001
    out, inb, conn_out, conn_in = link
    got: list[tuple[int, bytes]] = []

    def handler(kind: int, payload: bytes) -> None:
        got.append((kind, payload))

    inb.on_control(handler)
    payload = bytes(range(256)) * 4
    sent, calls = _calls(out.try_control, CONTROL_CALL, payload, time.monotonic() + 5)
    assert sent is True and calls == ["try_control"]
    _readable(conn_in.sock)
    again, calls = _calls(conn_in.turn)
    assert again is False and not conn_in.closed and calls == ["turn", "handler"]
    assert got == [(CONTROL_CALL, payload)]
    # the owner's answer: header and parts in one sendmsg, the connection's lock taken and given inline
    parts: list = [b"head", memoryview(payload)[:100]]
    sent, calls = _calls(out.try_control_parts, CONTROL_REPLY, parts, None)
    assert sent is True and calls == ["try_control_parts"]
    _readable(conn_in.sock)
    assert not conn_in.turn() and not conn_in.closed and got[-1] == (CONTROL_REPLY, b"head" + payload[:100])
    assert conn_out.frames_sent == 2 and conn_in.frames_received == 2


def test_frames_before_the_handler_wait_in_the_backlog_in_order(link) -> None:  # noqa: ANN001
    """Before the link is ready a control frame goes to the channel's bounded backlog (not straight to a handler);
    ``on_control`` hands the backlog over first, then binds the handler into the connection."""
    out, inb, _, conn_in = link
    assert conn_in.handler is None
    for k in range(3):
        assert out.try_control(CONTROL_CALL, b"early%d" % k, time.monotonic() + 5)
    _readable(conn_in.sock)
    assert not conn_in.turn() and not conn_in.closed   # drained, not ended
    got: list[bytes] = []
    inb.on_control(lambda kind, payload: got.append(payload))
    assert got == [b"early0", b"early1", b"early2"] and conn_in.handler is not None
    assert out.try_control(CONTROL_CALL, b"late", time.monotonic() + 5)
    _readable(conn_in.sock)
    assert not conn_in.turn() and not conn_in.closed and got[-1] == b"late"


def test_a_busy_connection_declines_and_a_broken_channel_raises(link) -> None:  # noqa: ANN001
    """The flat path's rare cases keep the general path's answers: the connection busy -> False, nothing sent; the
    channel down -> ``LLM_LINK_FAILED``."""
    out, _, conn_out, _ = link
    assert conn_out.lock.acquire(timeout=1)
    try:
        assert out.try_control(CONTROL_CALL, b"x", time.monotonic() + 5) is False
        assert out.try_control_parts(CONTROL_CALL, [b"x"]) is False
    finally:
        conn_out.lock.release()
    assert conn_out.frames_sent == 0
    out._break("test")
    with pytest.raises(DataDistError) as err:
        out.try_control(CONTROL_CALL, b"x", time.monotonic() + 5)
    assert err.value.code == S.LLM_LINK_FAILED


def test_a_control_frame_larger_than_what_arrived_is_read_to_its_end(link) -> None:  # noqa: ANN001
    """The flat read takes what came with the header; a payload still on its way (4 MiB through a socket that holds
    less) is read to its end under the stall deadline, as any frame, and handed over whole."""
    import threading

    out, inb, _, conn_in = link
    got: list[bytes] = []
    inb.on_control(lambda kind, payload: got.append(payload))
    payload = bytes(range(256)) * (16 << 10)
    sender = threading.Thread(target=out.send_control, args=(CONTROL_CALL, payload, time.monotonic() + 10))
    sender.start()
    _readable(conn_in.sock)
    assert not conn_in.turn() and not conn_in.closed   # drained, not ended
    sender.join(10)
    assert got == [payload] and conn_in.bytes_received == len(payload)
