"""In-memory fakes of the daemon's seams, shared by the tests (injected, never patched in)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np


def worker_session(node: Any) -> Any:
    """This process as a worker attached to ``node`` (what the attach socket opens for a real one, with the
    credentials the kernel would report): the owner ``Node.init_engine`` books an engine to."""
    from datadistd.node.sessions import PeerCred

    return node.sessions.open(PeerCred(os.getpid(), os.getuid(), os.getgid()))


async def pulled(links: Any, order: Any) -> tuple[int, str]:
    """``links.start_pull(order, done)`` (the one way a pull starts) awaited: ``(bytes, transport)``, or the
    ``DataDistError`` it ended with, raised."""
    from datadistd.links.wire.framecalls import answered

    return await answered(lambda done: links.start_pull(order, done))


async def read_inline(calls: Any, spec: Any, timeout: float) -> tuple[bytes, bool]:
    """``calls.start_read_inline`` (the one entry of a small read) awaited: the bytes and whether to release the
    key, or the ``DataDistError`` it ended with, raised."""
    from datadistd.links.wire.framecalls import answered

    reply = await answered(lambda done: calls.start_read_inline(spec, timeout, done))
    return reply.data, reply.release_needed


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
