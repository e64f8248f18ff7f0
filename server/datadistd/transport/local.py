"""The ``local`` transport: two engines of the same daemon, so a transfer is a plain memory copy.

There is no wire and no channel: ``copy(dst, src, deadline)`` moves the bytes with
``memory.copy.copy_segments`` (slice assignment between mapped views, no socket). The rest of the
``Transport`` protocol exists so the daemon can hold a ``LocalTransport`` where it holds any other;
the calls that only make sense with a wire raise ``LLM_FEATURE_NOT_ENABLED``.
"""

from __future__ import annotations

import threading
import time
from typing import Sequence

from datadist.status import LLMStatusCode

from ..core.errors import DataDistError
from ..memory.base import Segment
from ..memory.copy import copy_segments
from .base import Channel, Receipt

__all__ = ["LocalTransport"]

_NO_WIRE = ("the local transport has no data connections: engines in the same daemon copy memory directly "
            "(use LocalTransport.copy)")


class LocalTransport:
    """Same-daemon transfers by memory copy; counts what it copied so tests can see no socket was used."""

    name = "local"

    def __init__(self, **_settings: object) -> None:
        # accepts (and ignores) the settings the daemon passes every transport: host, port, chunk_size, ...
        self._lock = threading.Lock()
        self._bytes_copied = 0
        self._copies = 0
        self._started = False

    def __repr__(self) -> str:
        return "LocalTransport()"

    @property
    def endpoint(self) -> str:
        return "local://"

    def start(self) -> None:
        self._started = True

    def stop(self) -> None:
        self._started = False

    def allow(self, token: bytes) -> None:
        """Nothing connects to a local transport; tokens are accepted and ignored."""

    def revoke(self, token: bytes) -> None:
        """Nothing to close."""

    def connect(self, endpoint: str, token: bytes, streams: int, deadline: float) -> Channel:
        raise DataDistError(LLMStatusCode.LLM_FEATURE_NOT_ENABLED, _NO_WIRE)

    def channel(self, token: bytes) -> Channel | None:
        return None

    def expect(self, segments: Sequence[Segment], channel: Channel | None = None) -> Receipt:
        raise DataDistError(LLMStatusCode.LLM_FEATURE_NOT_ENABLED, _NO_WIRE)

    def copy(self, dst: Sequence[Segment], src: Sequence[Segment], deadline: float) -> int:
        """Copy the concatenated ``src`` into the concatenated ``dst``; returns the bytes copied.

        ``LLM_TIMEOUT`` if the deadline has already passed (a copy, once started, is not interrupted);
        ``LLM_PARAM_INVALID`` from ``copy_segments`` for bad ranges or unequal totals, before any byte moves.
        """
        if time.monotonic() >= deadline:
            raise DataDistError(LLMStatusCode.LLM_TIMEOUT, "deadline passed before the local copy started")
        n = copy_segments(dst, src)
        with self._lock:
            self._bytes_copied += n
            self._copies += 1
        return n

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"bytes_copied": self._bytes_copied, "copies": self._copies, "bytes_sent": 0,
                    "bytes_received": 0, "frames": 0, "connections": 0}
