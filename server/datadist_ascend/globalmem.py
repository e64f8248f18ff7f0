"""``GlobalMem``: the NPU memory of this process registered with HCCL (``HcclRegisterGlobalMem``), one
registration per range the memory backend announces -- a whole DEVICE pool, or a worker's imported cache --
never per cache carved from a pool.

CANN's rules this follows (docs/ascend.md):

* HCCL makes memory reachable by a peer only if it was bound to the communicator before ``HcclCommPrepare``
  (the memory descriptors are exchanged there). A pool is registered once, when it is made (or when the hccl
  transport of its device starts), so every cache allocated from it later already lies in a range a new
  communicator binds.
* The registry is per device, chosen by the calling thread's current device (hcomm ``global_mem_manager.cc``):
  every call sets the range's device first (``Acl.set_device``), whatever thread it runs on.
* Deregistering the last registration of a device de-initialises its NIC under live communicators: a range is
  deregistered only when its memory goes (``retire``) AND no communicator binds it any more (``unbound``).
* Overlapping registrations are refused by HCCL (``CheckOverlapAndInsert``): ranges are whole allocations. The
  same range announced twice (two imports of one worker tensor that the runtime maps at one address) is one
  registration with two users: it goes when the last user retires it.
* Memory is freed (``aclrtFree``, ``aclrtIpcMemClose``) only once HCCL let go of it: ``retire`` takes what frees it
  and runs it after the deregistration -- never under a registration a communicator still binds (an unlink that
  outlives its wait for Prepare leaves the memory held, not freed under HCCL).
* HCCL binds at most ``MAX_RANGE`` (64 GiB) per range, and says so only at ``HcclCommPrepare``: a larger range is
  refused when it is announced, naming the limit, instead of failing every link.

Nothing touches HCCL until the hccl transport of a device calls ``activate``: the ``acl`` backend with the
``tcp`` transport never loads ``libhccl``.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Callable

from datadist.status import LLMStatusCode

from .acl import acl
from .errors import AscendError

__all__ = ["GlobalMem", "Range", "global_mem", "MAX_RANGE"]

log = logging.getLogger("datadist_ascend.globalmem")

#: the largest range HCCL binds to a communicator (refused at HcclCommPrepare beyond it: hcomm's one-sided service)
MAX_RANGE = 64 << 30


@dataclass
class Range:
    """``size`` bytes at ``base`` on ``device``; ``handle`` HCCL's registration (0: not registered yet)."""

    device: int
    base: int
    size: int
    handle: int = 0
    binds: set[int] = field(default_factory=set)   # communicators it is bound to
    retired: bool = False                           # its memory is going: deregister once unbound
    users: int = 1                                  # announcements not retired yet (one allocation, imports of it)
    gone: list[Callable[[], None]] = field(default_factory=list)   # what frees the memory, once deregistered


class GlobalMem:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._ranges: dict[tuple[int, int], Range] = {}
        self._active: set[int] = set()

    def announce(self, device: int, base: int, size: int) -> None:
        """Memory HCCL may move (a DEVICE pool, an imported worker cache): registered now if the hccl transport of
        ``device`` runs, else when it starts. Raises ``AscendError`` when HCCL refuses it, or would at Prepare."""
        with self._lock:
            if self._active:
                _check_size(size)
            rng = self._ranges.get((device, base))
            if rng is None:
                rng = self._ranges[(device, base)] = Range(device, base, size)
            elif not rng.retired and rng.size == size:
                rng.users += 1   # the same memory again (an import the runtime mapped where one already is)
            elif not rng.retired:
                raise AscendError("HcclRegisterGlobalMem", 1, LLMStatusCode.LLM_PARAM_INVALID,
                                  f"{size} bytes at {base:#x} overlap the {rng.size} bytes registered there")
            elif rng.retired:
                # new memory where memory still bound to a link was: HCCL knows memory by address, and the old
                # registration (the old pages) stands until every link binding it is gone
                raise AscendError("HcclRegisterGlobalMem", 1, LLMStatusCode.LLM_PARAM_INVALID,
                                  f"{size} bytes at {base:#x} take the place of memory still bound to a link (HCCL "
                                  "keeps its registration until the link goes): unlink, then register")
            if device in self._active and not rng.handle:
                self._register(rng)

    def retire(self, device: int, base: int, gone: Callable[[], None] | None = None) -> None:
        """One user of the memory at ``base`` lets it go; once the last has, it is deregistered -- now if no
        communicator binds it, else at the last unbind -- and then ``gone`` (what frees it) runs, with every other
        user's. Memory never announced is freed at once."""
        with self._lock:
            rng = self._ranges.get((device, base))
            if rng is not None:
                if gone is not None:
                    rng.gone.append(gone)
                rng.users -= 1
                if rng.users > 0:
                    return
                rng.retired = True
                done = self._settle(rng)
        if rng is None:
            done = [gone] if gone is not None else []
        for free in done:
            free()

    def activate(self, device: int) -> None:
        """The hccl transport of ``device`` runs: register every range announced there."""
        with self._lock:
            self._active.add(device)   # from now on, ranges over MAX_RANGE are refused when announced
            for rng in list(self._ranges.values()):
                if rng.device == device and not rng.handle and not rng.retired:
                    self._register(rng)

    def ranges(self, device: int) -> list[Range]:
        """The registered ranges of ``device`` (what a new communicator binds), by address."""
        with self._lock:
            return sorted((r for r in self._ranges.values() if r.device == device and r.handle and not r.retired),
                          key=lambda r: r.base)

    def bound(self, rng: Range, comm: int) -> None:
        with self._lock:
            rng.binds.add(comm)

    def unbound(self, rng: Range, comm: int) -> None:
        with self._lock:
            rng.binds.discard(comm)
            done = self._settle(rng)
        for free in done:
            free()

    def _register(self, rng: Range) -> None:
        from .hccl import MEM_DEVICE, hccl

        _check_size(rng.size)
        acl().set_device(rng.device)   # HCCL's registry is the calling thread's device's
        rng.handle = hccl().register(MEM_DEVICE, rng.base, rng.size)

    def _settle(self, rng: Range) -> list[Callable[[], None]]:
        """Under the lock: deregister a retired range no communicator binds; what frees its memory then."""
        if not rng.retired or rng.binds or self._ranges.get((rng.device, rng.base)) is not rng:
            return []
        del self._ranges[(rng.device, rng.base)]
        if rng.handle:
            from .hccl import hccl

            try:
                acl().set_device(rng.device)
                hccl().deregister(rng.handle)
            except AscendError as exc:
                log.warning("deregistering %d bytes of NPU memory on device %d: %s", rng.size, rng.device, exc)
        gone, rng.gone = rng.gone, []
        return gone


def _check_size(size: int) -> None:
    if size > MAX_RANGE:
        raise AscendError("HcclCommPrepare", 1, LLMStatusCode.LLM_PARAM_INVALID,
                          f"{size} bytes in one range: HCCL binds at most {MAX_RANGE} bytes (64 GiB) per range and "
                          "would refuse every link at HcclCommPrepare; use DEVICE pools (and NPU tensors) of at "
                          "most 64 GiB")


_global: list[GlobalMem] = []
_global_lock = threading.Lock()


def global_mem() -> GlobalMem:
    """The process's registry (one: HCCL's own is per process and device)."""
    with _global_lock:
        if not _global:
            _global.append(GlobalMem())
        return _global[0]
