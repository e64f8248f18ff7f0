"""What one local principal (a uid) may make the daemon hold: imported bytes and mappings, engines, pools, block
numbers of transfers being assembled from continuation frames.

A ``QuotaBook`` counts, per uid, what that uid's workers hold now; ``take`` either books an amount and
returns a ``Charge`` (released exactly once, when the thing it paid for goes) or refuses with
``LLM_OUT_OF_MEMORY`` naming the config key to raise. Limits are ``[quota]`` in the config
(``config.QuotaSection``); 0 means no limit. Thread-safe: memory handles may be closed off the loop.
No grpc here.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from dataclasses import dataclass

from ..core.errors import DataDistError, StatusCode

__all__ = ["QuotaLimits", "QuotaBook", "Charge", "RESOURCES", "LinkLimits", "LinkUsage"]

#: what is counted, and the ``[quota]`` key that bounds it per uid
RESOURCES = {
    "imported_bytes": "imported_bytes_per_uid",
    "imported_mappings": "imported_mappings_per_uid",
    "engines": "engines_per_uid",
    "pools": "pools_per_uid",
    "assembly_bytes": "assembly_bytes_per_uid",
}


@dataclass(frozen=True)
class QuotaLimits:
    imported_bytes_per_uid: int = 1 << 40
    imported_mappings_per_uid: int = 8192
    engines_per_uid: int = 64
    pools_per_uid: int = 128
    assembly_bytes_per_uid: int = 64 << 20

    def limit(self, resource: str) -> int:
        return {"imported_bytes": self.imported_bytes_per_uid, "imported_mappings": self.imported_mappings_per_uid,
                "engines": self.engines_per_uid, "pools": self.pools_per_uid,
                "assembly_bytes": self.assembly_bytes_per_uid}[resource]


class Charge:
    """Amounts booked to one uid; ``release`` gives them back (idempotent)."""

    __slots__ = ("_book", "uid", "amounts")

    def __init__(self, book: "QuotaBook | None", uid: int, amounts: dict[str, int]) -> None:
        self._book = book
        self.uid = uid
        self.amounts = amounts

    def release(self) -> None:
        book, self._book = self._book, None
        if book is not None:
            book._give_back(self.uid, self.amounts)


class QuotaBook:
    def __init__(self, limits: QuotaLimits | None = None) -> None:
        self.limits = limits or QuotaLimits()
        self._used: dict[int, dict[str, int]] = {}
        self._lock = threading.Lock()

    def used(self, uid: int) -> dict[str, int]:
        with self._lock:
            return dict(self._used.get(uid, {}))

    def take(self, uid: int, **amounts: int) -> Charge:
        """Book ``amounts`` (resource → count) to ``uid``; ``LLM_OUT_OF_MEMORY`` if one would pass its limit."""
        with self._lock:
            used = self._used.setdefault(uid, {})
            for resource, amount in amounts.items():
                limit = self.limits.limit(resource)
                have = used.get(resource, 0)
                if limit and have + amount > limit:
                    if not any(used.values()):
                        del self._used[uid]
                    raise DataDistError(
                        StatusCode.LLM_OUT_OF_MEMORY,
                        f"uid {uid} holds {have} {resource.replace('_', ' ')} in this daemon; {amount} more would "
                        f"exceed its quota ([quota] {RESOURCES[resource]} = {limit})")
            for resource, amount in amounts.items():
                used[resource] = used.get(resource, 0) + amount
        return Charge(self, uid, dict(amounts))

    def _give_back(self, uid: int, amounts: dict[str, int]) -> None:
        with self._lock:
            used = self._used.get(uid)
            if used is None:
                return
            for resource, amount in amounts.items():
                used[resource] = used.get(resource, 0) - amount
            if not any(used.values()):
                del self._used[uid]


# ---- per link: what one peer (a link's other end) may make the owner hold ---------------------------

@dataclass(frozen=True)
class LinkLimits:
    """Caps of one link's owner side (``[quota] link_*``); 0 = no limit."""

    calls_in_flight: int = 16
    open_writes: int = 8192
    pinned_bytes: int = 64 << 30
    max_wait_ms: int = 600_000
    calls_queued: int = 1024

    def clamp(self, wait_ms: int) -> int:
        """A timeout or hold time a caller asked for, cut to ``max_wait_ms``."""
        return min(wait_ms, self.max_wait_ms) if self.max_wait_ms else wait_ms


class LinkUsage:
    """What the other end of one link holds at this owner now: owner calls running (and waiting for a turn),
    writes open, bytes pinned by them. Event loop only (owner calls run there).

    Owner calls over ``calls_in_flight`` wait for a turn (holding no thread) until their deadline
    (``LLM_TIMEOUT``); more than ``calls_queued`` waiting are refused at once (``LLM_LINK_BUSY``). A
    legitimate burst of pulls is served in turn; a peer that keeps calls hanging holds at most
    ``calls_in_flight`` of the daemon's executor threads. ``answering``: its calls being answered (a task each,
    whatever the call), which ``links.calls`` bounds with the frames not yet taken by the event loop."""

    __slots__ = ("calls", "writes", "pinned", "answering", "_turns")

    def __init__(self) -> None:
        self.calls = 0
        self.answering = 0
        self.writes = 0
        self.pinned = 0
        self._turns: collections.deque[asyncio.Future[None]] = collections.deque()   # waiting calls, in order

    @property
    def waiting(self) -> int:
        return len(self._turns)

    async def enter_call(self, limits: LinkLimits, deadline: float) -> None:
        cap = limits.calls_in_flight
        if not cap or self.calls < cap:
            self.calls += 1
            return
        if len(self._turns) >= limits.calls_queued:
            raise DataDistError(StatusCode.LLM_LINK_BUSY,
                                f"this link has {self.calls} owner calls running and {len(self._turns)} waiting "
                                f"([quota] link_calls_in_flight = {cap})")
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._turns.append(turn)
        try:
            await asyncio.wait_for(asyncio.shield(turn), max(deadline - time.monotonic(), 0.0))
        except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
            if turn.done():         # handed a turn just as the wait ended: give it to the next one
                self.exit_call()
            else:
                turn.cancel()
                self._turns.remove(turn)
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise DataDistError(StatusCode.LLM_TIMEOUT,
                                f"no turn before the deadline: this link has {self.calls} owner calls running "
                                f"([quota] link_calls_in_flight = {cap})") from None

    def has_turn(self, limits: LinkLimits) -> bool:
        """Whether ``try_enter_call`` would get a turn now, taking none: what a data reader thread peeks before it
        answers a small read itself (``OwnerCalls._read_here``; two reads of loop-owned counts, so at most one
        such answer per connection beyond the cap while the loop takes the last turn)."""
        cap = limits.calls_in_flight
        return not cap or (self.calls < cap and not self._turns)

    def try_enter_call(self, limits: LinkLimits) -> bool:
        """``enter_call`` when there is a turn at once (none waits, the cap not reached); else False, nothing taken."""
        if not self.has_turn(limits):
            return False
        self.calls += 1
        return True

    def exit_call(self) -> None:
        """A call ended: its turn goes to the longest-waiting call, else the count drops."""
        while self._turns:
            turn = self._turns.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self.calls -= 1

    def check_writes(self, limits: LinkLimits, count: int) -> None:
        """``LLM_LINK_BUSY`` if ``count`` more writes would exceed ``link_open_writes`` (books nothing): the cheap
        check an owner makes before it validates and pins the parts."""
        if limits.open_writes and self.writes + count > limits.open_writes:
            raise DataDistError(StatusCode.LLM_LINK_BUSY,
                                f"this link has {self.writes} writes open; {count} more would exceed "
                                f"{limits.open_writes} ([quota] link_open_writes)")

    def open_writes(self, limits: LinkLimits, count: int, nbytes: int) -> None:
        """Book ``count`` writes pinning ``nbytes`` (``LLM_LINK_BUSY`` over either cap): once the parts are
        known valid, so their byte count is one the owner checked."""
        self.check_writes(limits, count)
        if limits.pinned_bytes and self.pinned + nbytes > limits.pinned_bytes:
            raise DataDistError(StatusCode.LLM_LINK_BUSY,
                                f"this link's open writes pin {self.pinned} bytes; {nbytes} more would exceed "
                                f"{limits.pinned_bytes} ([quota] link_pinned_bytes)")
        self.writes += count
        self.pinned += nbytes

    def close_writes(self, count: int, nbytes: int) -> None:
        self.writes -= count
        self.pinned -= nbytes
