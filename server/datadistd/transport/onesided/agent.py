"""``OneSidedAgent``: what a one-sided transport needs of its engine's agent (NIXL's ``nixl.agent.Agent``,
``hccl.agent.HcclAgent``): memory registrations described to peers, peers loaded by their metadata, WRITEs
that carry a notification, READs, and the notifications that arrived."""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

import numpy as np

from ...core.errors import DataDistError
from ...memory.base import Segment
from ..registrations import Registration

__all__ = ["InFlight", "OneSidedAgent", "TableAgent", "PostingAgent"]


class InFlight(DataDistError):
    """``LLM_TIMEOUT`` of a transfer that had not ended by its deadline plus its agent's ``fence``: its bytes may
    still land (the fabric may deliver what it carries); see ``OneSidedTransport._abandon_read``."""


class OneSidedAgent(Protocol):
    name: str
    #: seconds past a transfer's deadline within which it ends if it is ever going to land: a transfer that passed
    #: its deadline is waited for that long, and only one still running then may land later (``InFlight``); 0 when
    #: the fabric bounds nothing (the transfer is given up at its deadline)
    fence: float

    def metadata(self) -> bytes:
        """Everything a peer needs to load this agent (every registration so far)."""

    def partial_metadata(self, regs: Sequence[Registration]) -> bytes:
        """What a peer that has the rest needs to reach ``regs`` too."""

    def serials(self) -> set[int]:
        """The registrations ``metadata`` describes."""

    def add_peer(self, metadata: bytes, link: bytes) -> str:
        """Load a peer's metadata, which came on the link ``link`` (its token; an agent that keeps state per link --
        HCCL's communicators -- names it by the link); the peer's agent name."""

    def drop_peer(self, name: str) -> None: ...

    def addresses(self, segments: Sequence[Segment]) -> tuple[np.ndarray, list[Registration], list[Registration]]:
        """Extents ``(address, length)`` of ``segments`` (registering their handles once), the registrations used,
        and those made by this call."""

    def write(self, local: np.ndarray, remote: np.ndarray, peer: str, notif: bytes, deadline: float,
              stop: Callable[[], DataDistError | None]) -> None:
        """One WRITE of ``local`` extents into the peer's ``remote`` extents, then ``notif`` to the peer."""

    def read(self, local: np.ndarray, remote: np.ndarray, peer: str, deadline: float) -> None:
        """One READ of the peer's ``remote`` extents into ``local`` extents (one for one, of equal length),
        returning once every byte is in local memory; ``LLM_TIMEOUT`` at ``deadline``."""

    def notify(self, peer: str, message: bytes) -> None: ...

    def probe(self, peer: str) -> None:
        """A transfer with ``peer`` passed its deadline, or its receiver gave up on it: make the connection it runs
        on end it if that connection is dead (NIXL: ``wire.PROBE``); nothing when the agent has no such connection."""

    def notifications(self) -> list[tuple[str, bytes]]:
        """``(peer name, message)`` of the notifications that arrived since the last call."""

    def close(self) -> None: ...


class TableAgent(OneSidedAgent, Protocol):
    """What reading published tables (``tables.PublishedTables``) needs more of the agent (NIXL's, HCCL's)."""

    def ranges(self, tensors: Sequence[Segment]) -> np.ndarray | None:
        """``(address, length)`` of each of a cache's ``tensors`` as this agent addresses them (NIXL: mapped in this
        process; HCCL: on the engine's NPU), or None when one is not memory it moves."""

    def publish(self, ranges: np.ndarray) -> tuple[Any, bytes]:
        """Register exactly ``ranges`` (one cache's tensors) on their own: the registration and its partial
        metadata."""

    def unpublish(self, token: Any) -> None:
        """Deregister what ``publish`` registered."""

    def prepare_rows(self, peer: str, rows: np.ndarray) -> Any:
        """``peer``'s rows ``(address, length)`` prepared once for READs by index."""

    def release_rows(self, prepared: Any) -> None: ...

    def read_rows(self, local: np.ndarray, prepared: Any, indices: Sequence[int] | np.ndarray, peer: str, notif: bytes,
                  deadline: float, reg: Registration | None = None) -> None:
        """One READ of rows ``indices`` of ``prepared`` into ``local`` extents, then ``notif`` to the peer; ``reg``:
        the registration every local extent lies in, when one does (its rows may be prepared once)."""


class PostingAgent(TableAgent, Protocol):
    """An agent that posts a READ of rows without waiting for it (NIXL's): ``PublishedTables.start_rows`` posts it
    from the event loop and the progress thread ends it (a transport whose class sets ``posts_reads``)."""

    def post_rows(self, local: np.ndarray, prepared: Any, indices: Sequence[int] | np.ndarray, peer: str,
                  notif: bytes, reg: Registration | None = None) -> tuple[int, Any, bool]:
        """``read_rows`` posted, not waited for: ``(request, made, done)`` for ``rows_done`` and ``end_rows``."""

    def rows_done(self, request: int, peer: str) -> bool:
        """Whether a posted READ is done (raises when it failed); never blocks."""

    def end_rows(self, request: int | None, made: Any, peer: str) -> None:
        """Release a posted READ (and ``made``, the destination list prepared for it alone)."""
