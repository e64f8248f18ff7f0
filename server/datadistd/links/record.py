"""The record of one worker's pull or push (``Transfer``) and who hears of its end (``Ends``): made by
``links.transfer.Transfers.transfer``, moved by a ``links.paths`` path, ended by ``Transfers.finish``."""

from __future__ import annotations

import time
from typing import Any, Protocol, Sequence

from ..core.registry import CacheEntry
from ..core.types import RemoteSpec
from ..engine import pullview
from ..memory.base import Segment
from .model import AnyLink

__all__ = ["Transfer", "Ends"]


class Ends(Protocol):
    """Who hears of a transfer's end: the attach server (a datagram to the worker) or ``api.transfers`` (the gRPC
    call, an attach frame's general order). Called exactly once, from any thread."""

    def ended(self, token: Any, status: int, nbytes: int, transport: str, message: str) -> None:
        """Status 0 and its bytes, or an ``LLMStatusCode`` and why."""


class Transfer:
    """One pull or push, resolved (the module doc). ``rows`` and ``local`` (block numbers) are the quick shape's
    local side, ``dst`` (segments) the planned shape's; ``remote`` is the quick shape's remote block numbers as
    the attach frame carries them (u64 little-endian), ``spec`` the planned shape's owner request. A HIXL
    transfer (``engine.extents``) is a planned one whose ``dst`` spans the local registrations in ``held``."""

    __slots__ = ("push", "link", "cache_id", "entry", "rows", "local", "generation", "model_id", "remote", "spec",
                 "dst", "nbytes", "blocks", "deadline", "timeout_ms", "started", "to", "token", "bound", "pinned",
                 "held", "pin_id", "landing")

    def __init__(self, push: bool, link: AnyLink, cache_id: int, entry: CacheEntry, nbytes: int, blocks: int,
                 timeout_ms: int, to: Ends, token: Any) -> None:
        self.push = push
        self.link = link
        self.cache_id = cache_id
        self.entry = entry
        self.rows: pullview.Dest | None = None
        self.local: tuple[int, ...] = ()
        self.generation = -1
        self.model_id = 0
        self.remote = b""
        self.spec: RemoteSpec | None = None
        self.dst: Sequence[Segment] = ()
        self.nbytes = nbytes
        self.blocks = blocks
        self.started = time.monotonic()
        self.timeout_ms = timeout_ms
        self.deadline = self.started + timeout_ms / 1000
        self.to = to
        self.token = token
        self.bound: Any = None
        self.pinned = False
        self.held: tuple[CacheEntry, ...] = ()   # the local caches an order pins (empty: ``entry``)
        self.pin_id = 0                          # what ``Engine.unpin`` takes at its end (``Engine.pin_many``)
        #: a small read of HIXL's extents in the quick shape: ``(local addresses, lengths, pieces)``, each piece
        #: ``(view, offset, length)`` of the local rows by the published view (``engine.pullview.regions``): no pin
        self.landing: tuple[tuple[int, ...], tuple[int, ...], pullview.Pieces] | None = None

    @property
    def what(self) -> str:
        return "push" if self.push else "pull"

    @property
    def tensor_count(self) -> int:
        return self.spec.tensor_count if self.spec is not None else 0
