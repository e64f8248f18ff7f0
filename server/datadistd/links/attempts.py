"""How many link attempts a node makes at once to one peer address (``AddressSlots``, node-wide)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import AsyncIterator

from ..core.errors import DataDistError, StatusCode

__all__ = ["AddressSlots", "LINK_ATTEMPTS_PER_ADDRESS"]

#: link attempts a node makes at once to one peer address (``AddressSlots``): half the unauthenticated connections
#: a listener lets a stranger's address hold (``[peer] max_preauth_per_source``, 8), so a node's start-up burst
#: (16 engines linking the same prompt engine) is never cut down by it; each attempt holds one connection at a
#: time on the Peer listener, then one on the data plane
LINK_ATTEMPTS_PER_ADDRESS = 4


class AddressSlots:
    """At most ``per_address`` link attempts of this node at once to one peer address (node-wide: all its engines'
    links leave from one address, and a listener lets an address that has not proved the secret lately hold only
    a few unauthenticated connections, ``admission.AdmissionLimits.per_source``, closing its oldest past that).
    An address's entry goes when its last attempt does."""

    def __init__(self, per_address: int) -> None:
        self.per_address = per_address
        self._slots: dict[str, tuple[asyncio.Semaphore, list[int]]] = {}   # address -> (slots, [attempts])

    @contextlib.asynccontextmanager
    async def hold(self, address: str, deadline: float) -> AsyncIterator[None]:
        slots, users = self._slots.setdefault(address, (asyncio.Semaphore(self.per_address), [0]))
        users[0] += 1
        try:
            try:
                await asyncio.wait_for(slots.acquire(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                raise DataDistError(StatusCode.LLM_TIMEOUT, f"link timeout while this node's other link attempts "
                                    f"to {address} went first") from None
            try:
                yield
            finally:
                slots.release()
        finally:
            users[0] -= 1
            if not users[0]:
                del self._slots[address]

    def __len__(self) -> int:
        return len(self._slots)
