"""``TcpReceipt``: where the bytes of one incoming transfer go, and how a wait for them ends."""

from __future__ import annotations

import bisect
import logging
import threading
import time
from typing import Callable

import numpy as np

from datadist.status import LLMStatusCode

from ...core.errors import DataDistError
from ...core.types import TransferId
from ...memory.access import has_raw
from ...memory.segments import SegmentTable, byte_view
from ..base import Channel
from .wire import (
    _DONE,
    _FAILED,
    _PENDING,
    _QUIESCE,
)

log = logging.getLogger("datadistd.transport.tcp")


class TcpReceipt:
    """Where the bytes of one incoming transfer go, and how far they got."""

    def __init__(self, forget: Callable[[int], None], transfer_id: TransferId, table: SegmentTable,
                 channel: Channel | None) -> None:
        self._forget = forget          # the transport's: drop this receipt from its table once over
        self._tid = transfer_id
        self._table = table.nonempty()
        # one writable byte view per destination handle (None: no mapping, bytes go through staging);
        # dropped once the receipt is over and no reader is in
        self._views: list[memoryview | None] = [byte_view(h, writable=True) for h in self._table.handles]
        self._mapped = np.array([v is not None for v in self._views], bool)
        self._raw = [has_raw(h) for h in self._table.handles]
        self._expected = self._table.nbytes
        self._received = 0
        self._lo: list[int] = []       # claimed stream ranges [lo, hi), sorted, disjoint, merged
        self._hi: list[int] = []
        self._channels: set[Channel] = {channel} if channel is not None else set()
        self._bound = channel          # given: only frames of this channel may fill the receipt
        self._cond = threading.Condition(threading.Lock())
        self._active = 0               # readers writing into the destination right now
        self._state = _DONE if self._expected == 0 else _PENDING
        self._error: DataDistError | None = None

    @property
    def transfer_id(self) -> TransferId:
        return self._tid

    @property
    def expected(self) -> int:
        return self._expected

    @property
    def received(self) -> int:
        return self._received

    @property
    def done(self) -> bool:
        return self._state == _DONE

    def wait(self, deadline: float) -> None:
        with self._cond:
            while self._state == _PENDING:  # ends at completion, failure or the deadline
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            if self._state == _DONE:
                return
            if self._state == _PENDING:
                self._set_failed(LLMStatusCode.LLM_TIMEOUT,
                                 f"transfer {self._tid}: {self._received} of {self._expected} bytes arrived "
                                 f"before the deadline")
            self._quiesce()
            assert self._error is not None
            error = self._error
        raise DataDistError(error.code, error.message)

    def cancel(self) -> None:
        with self._cond:
            if self._state == _PENDING:
                self._set_failed(LLMStatusCode.LLM_FAILED, f"transfer {self._tid} was cancelled")
            self._quiesce()

    # -- used by readers and the transport --

    def _set_failed(self, code: LLMStatusCode, message: str) -> None:
        """Under ``_cond``."""
        self._state = _FAILED
        self._error = DataDistError(code, message)
        self._cond.notify_all()
        self._forget(self._tid)
        if self._active == 0:
            self._drop_views()

    def _drop_views(self) -> None:
        """Under ``_cond``, once over and no reader is in: let go of the destination's memory views."""
        views, self._views = self._views, []
        for view in views:
            if view is not None:
                try:
                    view.release()
                except BufferError:
                    pass

    def _quiesce(self) -> None:
        """Under ``_cond``: let readers leave the destination memory before the caller reuses it."""
        limit = time.monotonic() + _QUIESCE
        while self._active > 0:  # readers hold _active for at most one recv (<= _POLL) or one copy
            remaining = limit - time.monotonic()
            if remaining <= 0:
                log.warning("transfer %s: a reader is still writing into the destination after %.1fs",
                            self._tid, _QUIESCE)
                return
            self._cond.wait(remaining)

    def _fail(self, code: LLMStatusCode, message: str, channel: Channel | None = None) -> bool:
        with self._cond:
            if self._state != _PENDING or (channel is not None and channel not in self._channels):
                return False
            self._set_failed(code, message)
            return True

    def _claim(self, offset: int, length: int, channel: Channel) -> str | None:
        """Reserve ``[offset, offset+length)``; ``None`` if fine, ``""`` if the receipt is gone, else why not."""
        end = offset + length
        with self._cond:
            if self._state != _PENDING or (self._bound is not None and channel is not self._bound):
                return ""  # gone, or another link's frame naming this transfer id: discarded like unknown ids
            if length <= 0 or end > self._expected:
                return (f"transfer {self._tid}: frame [{offset}, {end}) is outside the expected "
                        f"{self._expected} bytes")
            i = bisect.bisect_right(self._lo, offset)
            if (i > 0 and self._hi[i - 1] > offset) or (i < len(self._lo) and self._lo[i] < end):
                return f"transfer {self._tid}: frame [{offset}, {end}) overlaps bytes already received"
            if i > 0 and self._hi[i - 1] == offset:
                self._hi[i - 1] = end
                if i < len(self._lo) and self._lo[i] == end:
                    self._hi[i - 1] = self._hi[i]
                    del self._lo[i], self._hi[i]
            elif i < len(self._lo) and self._lo[i] == end:
                self._lo[i] = offset
            else:
                self._lo.insert(i, offset)
                self._hi.insert(i, end)
            self._channels.add(channel)
            return None

    def _begin_io(self) -> bool:
        with self._cond:
            if self._state != _PENDING:
                return False
            self._active += 1
            return True

    def _end_io(self) -> None:
        with self._cond:
            self._active -= 1
            if self._active == 0 and self._state != _PENDING:
                self._drop_views()
                self._cond.notify_all()

    def _landed(self, n: int) -> None:
        with self._cond:
            if self._state != _PENDING:
                return
            self._received += n
            if self._received == self._expected:
                self._state = _DONE
                self._cond.notify_all()
                self._forget(self._tid)
                if self._active == 0:
                    self._drop_views()
