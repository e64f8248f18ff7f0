"""In-memory fakes of the daemon's seams, shared by the tests (injected, never patched in)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from datadistd.engine.extents import ExtentOrder


def worker_session(node: Any) -> Any:
    """This process as a worker attached to ``node`` (what the attach socket opens for a real one, with the
    credentials the kernel would report): the owner ``Node.init_engine`` books an engine to."""
    from datadistd.node.sessions import PeerCred

    return node.sessions.open(PeerCred(os.getpid(), os.getuid(), os.getgid()))


class _Ended:
    """A transfer's end (``links.transfer.Ends``) handed to ``done``: ``(bytes, transport)`` or the
    ``DataDistError``, from the event loop whichever thread ended it."""

    def __init__(self, done: Any) -> None:
        import asyncio

        self.loop = asyncio.get_running_loop()
        self.done = done

    def ended(self, token: Any, status: int, nbytes: int, transport: str, message: str) -> None:
        from datadistd.core.errors import DataDistError, StatusCode

        result = (nbytes, transport) if status == 0 else DataDistError(StatusCode(status), message)
        self.loop.call_soon_threadsafe(self.done, result)


def start_pull(links: Any, order: Any, done: Any) -> None:
    """A pull of ``order`` on the one transfer path (``LinkManager.transfer``); its end goes to ``done``:
    ``(bytes, transport)`` or the ``DataDistError``, from the event loop."""
    links.transfer(False, order.remote.cluster_id, order.local_cache_id, order.timeout_ms or 0, _Ended(done), None,
                   order=order)


async def _transferred(links: Any, order: Any, push: bool) -> tuple[int, str]:
    from datadistd.links.wire.framecalls import answered

    if isinstance(order, ExtentOrder):   # HIXL's extents: the same entry, with their own fields
        return await answered(lambda done: links.transfer(order.write, order.remote_cluster, -1, order.timeout_ms or 0,
                                                          _Ended(done), None, order=order))
    return await answered(lambda done: links.transfer(push, order.remote.cluster_id, order.local_cache_id,
                                                      order.timeout_ms or 0, _Ended(done), None, order=order))


async def pulled(links: Any, order: Any) -> tuple[int, str]:
    """A pull of ``order`` on the one transfer path awaited: ``(bytes, transport)``, or the ``DataDistError`` it
    ended with, raised."""
    return await _transferred(links, order, False)


async def pushed(links: Any, order: Any) -> tuple[int, str]:
    """A push of ``order`` on the one transfer path awaited, as ``pulled``."""
    return await _transferred(links, order, True)


async def read_inline(calls: Any, spec: Any, timeout: float) -> tuple[bytes, bool]:
    """A small read answered with its bytes (an inline READ owner call) awaited: the bytes and whether to release
    the key, or the ``DataDistError`` it ended with, raised."""
    from datadistd.links.wire.ownercalls import ReadCmd

    reply = await calls._call(lambda cid, ms: ReadCmd(cid, 0, spec, ms, inline=True), timeout)
    return reply.data, reply.release_needed


async def read_call(calls: Any, transfer_id: int, spec: Any, timeout: float) -> tuple[int, bool]:
    """A READ owner call whose bytes come as transfer ``transfer_id``, awaited: its byte count and whether to
    release the key (the frame round trip of ``FrameCalls``, without a transfer path around it)."""
    from datadistd.links.wire.ownercalls import ReadCmd

    reply = await calls._call(lambda cid, ms: ReadCmd(cid, transfer_id, spec, ms), timeout)
    return reply.nbytes, reply.release_needed


class ArrayHandle:
    """Mapped memory: ``view()`` is a writable byte view of a numpy array."""

    def __init__(self, size: int, seed: int | None = None) -> None:
        if seed is None:
            self.arr = np.zeros(size, np.uint8)
        else:
            self.arr = np.frombuffer(bytearray(np.random.default_rng(seed).bytes(size)), np.uint8)

    @property
    def size(self) -> int:
        return self.arr.size

    def view(self) -> memoryview | None:
        return memoryview(self.arr)

    def read_into(self, offset: int, dst: memoryview) -> None:
        out = np.frombuffer(dst, np.uint8)
        out[:] = self.arr[offset:offset + out.size]

    def write_from(self, offset: int, src: memoryview | bytes) -> None:
        data = np.frombuffer(src, np.uint8)
        self.arr[offset:offset + data.size] = data

    def close(self) -> None:
        pass
