"""A pull whose bytes come as a transfer on the link's data channel (tcp, more than an inline read), by callback:
no task and no future per pull (``TransferPulls._start_read``). ``Requester`` runs them (a mixin: they use its
table, its hold and end, its release and its failure rule)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from ..core.errors import DataDistError, StatusCode
from ..core.layout import explain_size_mismatch
from ..core.registry import CacheEntry
from ..core.types import RemoteSpec
from ..memory.base import Segment
from ..transport.base import Channel, Receipt
from .model import AnyLink, Link, LocalLink, RemoteLink
from .table import LinkTable
from .wire.framecalls import FrameCalls
from .wire.ownercalls import OwnerReply

__all__ = ["Pull", "PullDone", "TransferPulls", "explained"]

log = logging.getLogger("datadistd.links")


#: where a started pull's end goes: its bytes and transport, or why it failed
PullDone = Callable[["tuple[int, str] | DataDistError"], None]


@dataclass(frozen=True)
class Pull:
    """A pull checked and planned: the destination cache, what the owner is asked for, the link, the deadline."""

    entry: CacheEntry
    spec: RemoteSpec
    nbytes: int
    link: AnyLink
    deadline: float
    timeout_ms: int
    dst: Sequence[Segment]


class TransferPulls:
    table: LinkTable

    def _hold(self, p: Pull) -> None:
        raise NotImplementedError

    def _end(self, p: Pull, ok: bool) -> None:
        raise NotImplementedError

    def _calls(self, link: RemoteLink, timeout_ms: int) -> tuple[FrameCalls, Channel]:
        raise NotImplementedError

    def _transfer_failure(self, link: Link, exc: DataDistError, timeout_ms: int) -> DataDistError:
        raise NotImplementedError

    async def _release_then(self, p: Pull, link: RemoteLink, calls: FrameCalls, done: PullDone) -> None:
        raise NotImplementedError

    def _start_read(self, p: Pull, done: PullDone) -> None:
        """A pull whose bytes come as a transfer (``_by_transfer``), with no task and no future: the receipt
        registered, the READ sent (``FrameCalls.start_read``), and the owner's REPLY -- behind the bytes on the same
        connection -- ends it on the event loop (``_read_answered``). ``done`` is called exactly once, never before
        this returns; the status codes are the task's (``explained``, ``_transfer_failure``)."""
        link = p.link
        assert not isinstance(link, LocalLink)
        self._hold(p)
        receipt: Receipt | None = None
        try:
            calls, channel = self._calls(link, p.timeout_ms)
            receipt = self.table.transport.expect(p.dst, channel=channel)
            calls.start_read(receipt.transfer_id, p.spec, p.deadline - time.monotonic(),
                             functools.partial(self._read_answered, p, receipt, calls, done))
        except DataDistError as exc:
            if receipt is not None:   # not sent (the calls closed, the deadline passed)
                self._read_failed(p, receipt, exc, done, later=True)
                return
            self._end(p, False)       # refused before a receipt (no channel, bad segments): the code as is
            self._later(done, explained(exc, p.entry, p.spec.tensor_count))
        except Exception as exc:  # noqa: BLE001 - a bug of ours: the worker still gets an answer, the log the trace
            self._read_bug(p, receipt, exc, done, later=True)

    def _later(self, done: PullDone, result: tuple[int, str] | DataDistError) -> None:
        """``done(result)`` from the event loop's next turn (``start_pull`` answers only refusals before it returns)."""
        asyncio.get_running_loop().call_soon(done, result)

    def _read_answered(self, p: Pull, receipt: Receipt, calls: FrameCalls, done: PullDone,
                       result: OwnerReply | DataDistError) -> None:
        """The owner's answer to a pull's READ (the event loop): the bytes are in (the REPLY came behind them), the
        pull ends here; else the receipt is waited for in a thread (striped over several connections, the rest may
        still be arriving: ``_read_wait``); a failure ends it with the task's codes."""
        try:
            if isinstance(result, DataDistError):
                raise result
            if not receipt.done:
                self.table.spawn(self._read_wait(p, receipt, calls, result.release_needed, done))
                return
            receipt.wait(p.deadline)   # done: returns at once
        except DataDistError as exc:
            self._read_failed(p, receipt, exc, done)
            return
        except Exception as exc:  # noqa: BLE001 - a bug of ours: the worker still gets an answer, the log the trace
            self._read_bug(p, receipt, exc, done)
            return
        self._read_done(p, calls, result.release_needed, done)

    async def _read_wait(self, p: Pull, receipt: Receipt, calls: FrameCalls, release: bool,
                         done: PullDone) -> None:
        try:
            await self.table.in_thread(receipt.wait, p.deadline)
        except DataDistError as exc:
            self._read_failed(p, receipt, exc, done)
            return
        except Exception as exc:  # noqa: BLE001 - a bug of ours: answered, logged
            self._read_bug(p, receipt, exc, done)
            return
        except BaseException:
            receipt.cancel()
            self._end(p, False)
            raise
        self._read_done(p, calls, release, done)

    def _read_done(self, p: Pull, calls: FrameCalls, release: bool, done: PullDone) -> None:
        if release:   # a pulled key the owner consumes once told (``_release``)
            assert not isinstance(p.link, LocalLink)
            self.table.spawn(self._release_then(p, p.link, calls, done))
            return
        self._end(p, True)
        done((p.nbytes, p.link.transport))

    def _read_failed(self, p: Pull, receipt: Receipt, exc: DataDistError, done: PullDone,
                     later: bool = False) -> None:
        receipt.cancel()
        self._end(p, False)
        failure = explained(self._transfer_failure(p.link, exc, p.timeout_ms), p.entry, p.spec.tensor_count)
        if later:
            self._later(done, failure)
        else:
            done(failure)

    def _read_bug(self, p: Pull, receipt: Receipt | None, exc: Exception, done: PullDone,
                  later: bool = False) -> None:
        log.error("cluster %s: a pull from cluster %s failed", self.table.cluster_id, p.link.remote_cluster,
                  exc_info=exc)
        if receipt is not None:
            receipt.cancel()
        self._end(p, False)
        failure = DataDistError(StatusCode.LLM_FAILED, f"the pull failed: {exc!r}")
        if later:
            self._later(done, failure)
        else:
            done(failure)


def explained(exc: DataDistError, entry: CacheEntry, tensor_count: int) -> DataDistError:
    """``exc``, or, when it is the owner's refusal of this side's byte count, the whole story: both caches' tensors
    and layouts, what differs and the option that fixes it (``core.layout.explain_size_mismatch``)."""
    if exc.code != StatusCode.LLM_PARAM_INVALID:
        return exc
    told = explain_size_mismatch(exc.message, entry.desc, entry.is_blocks, entry.cache_id,
                                 tensor_count or entry.desc.num_tensors, tensor_count != 0)
    return exc if told is None else DataDistError(StatusCode.LLM_PARAM_INVALID, told)
