"""``OneSidedReceipt``: a transfer the peer WRITEs into this daemon's memory, and how it ends."""

from __future__ import annotations

import threading
import time
from typing import Protocol

from datadist.status import LLMStatusCode

from ...core.errors import DataDistError
from ...core.types import TransferId


class _Landing(Protocol):
    """What a receipt needs of its transport (``OneSidedTransport``): look for notifications, and forget it."""

    def poll(self) -> None: ...

    def _landed(self, tid: int) -> None: ...


class _Link(Protocol):
    """What a receipt needs of its link (``link.LinkPeer``)."""

    @property
    def broken(self) -> bool: ...

    @property
    def what(self) -> str: ...

    @property
    def agent_name(self) -> str | None: ...

    def forget(self, tid: int) -> bool: ...

    def quiesce(self, receipt: "OneSidedReceipt") -> None: ...

__all__ = ["OneSidedReceipt", "QUIESCE", "POLL"]

QUIESCE = 2.0           # how long cancel() waits for the sender to confirm it writes no more
POLL = 0.1              # waits look at the channel this often


class OneSidedReceipt:
    """A transfer the peer WRITEs into this daemon's memory: done when NIXL delivers the WRITE's
    notification (which comes after its bytes); failed by the sender's FIN, a broken channel or the deadline."""

    def __init__(self, transport: _Landing, peer: _Link, transfer_id: TransferId,
                 expected: int) -> None:
        self._transport = transport
        self._peer = peer
        self._id = transfer_id
        self._expected = expected
        self._event = threading.Event()
        self._error: DataDistError | None = None
        self._confirmed = False    # the sender said how it ended: notification, or FIN (nothing posted)

    @property
    def transfer_id(self) -> TransferId:
        return self._id

    @property
    def expected(self) -> int:
        return self._expected

    @property
    def received(self) -> int:
        return self._expected if self.done else 0

    @property
    def done(self) -> bool:
        if not self._event.is_set():
            self._transport.poll()
        return self._event.is_set() and self._error is None

    def _finish(self, error: DataDistError | None) -> None:
        if not self._event.is_set():
            self._error = error
            self._event.set()

    def _settle(self, deadline: float) -> bool:
        """Wait until the notification came or the receipt failed (True), or ``deadline`` (False). The
        transport's progress thread hands notifications over; this looks once itself (a transfer that is
        already done needs no wait) and then only sleeps: one polling thread per daemon, not one per waiter.

        A broken channel does not fail the receipt at once: the sender may have posted its WRITE, which
        completes (its notification comes over NIXL, not over the channel) or its bytes may still be on
        the way; so it waits ``QUIESCE`` more for the notification before failing with ``LLM_LINK_FAILED``
        -- the memory is handed back only when nothing more is likely to land."""
        self._transport.poll()
        broken_at: float | None = None
        while not self._event.is_set():
            now = time.monotonic()
            if broken_at is None and self._peer.broken:
                broken_at = now
            if broken_at is not None and now >= broken_at + QUIESCE:
                self._finish(DataDistError(LLMStatusCode.LLM_LINK_FAILED,
                                           f"transfer {self._id}: data channel {self._peer.what} broke"))
                break
            if now >= deadline:
                return False
            self._event.wait(min(POLL, deadline - now))
        return True

    def wait(self, deadline: float) -> None:
        if not self._settle(deadline):
            raise DataDistError(LLMStatusCode.LLM_TIMEOUT,
                                f"transfer {self._id}: {self._expected} bytes not written by the deadline")
        if self._error is not None:
            raise self._error
        self._transport._landed(self._id)

    def cancel(self) -> None:
        """Forget the transfer, once the sender confirmed nothing more of it will land: its FIN (it posted
        nothing), or the notification of the WRITE it had posted (the bytes are in). Without either within
        ``QUIESCE`` the link's data channel and the peer's NIXL agent are dropped."""
        if self._peer.forget(self._id) and not self._event.is_set():
            self._peer.quiesce(self)
        self._transport._landed(self._id)
