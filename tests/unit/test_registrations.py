"""The registration table the one-sided transports share: each handle registered once, deregistered once."""

from __future__ import annotations

import gc
import threading

import numpy as np

from datadistd.memory.base import Segment
from datadistd.transport.registrations import Registration, RegistrationTable
from tests.fakes import ArrayHandle


class FakeEngine:
    """What an engine was asked: registrations by handle size, deregistrations by token."""

    def __init__(self) -> None:
        self.registered: list[int] = []
        self.deregistered: list[int] = []
        self.table = RegistrationTable(self.register, self.deregister)

    def register(self, handle: ArrayHandle) -> tuple[int, int, int]:
        self.registered.append(handle.size)
        return int(handle.arr.ctypes.data), handle.size, len(self.registered)

    def deregister(self, reg: Registration) -> None:
        self.deregistered.append(reg.token)


def test_rows_register_each_handle_once_and_skip_empty_segments() -> None:
    engine = FakeEngine()
    a, b = ArrayHandle(4096), ArrayHandle(8192)
    rows, used, new = engine.table.extents([Segment(a, 0, 100), Segment(a, 200, 0), Segment(b, 4096, 10),
                                         Segment(a, 300, 5)])
    base_a, base_b = int(a.arr.ctypes.data), int(b.arr.ctypes.data)
    np.testing.assert_array_equal(rows, [[base_a, 100], [base_b + 4096, 10], [base_a + 300, 5]])
    assert engine.registered == [4096, 8192] and len(used) == 2 and len(new) == 2
    _, used, new = engine.table.extents([Segment(b, 0, 1)])
    assert engine.registered == [4096, 8192] and new == [] and [r.size for r in used] == [8192]


def test_a_handle_gone_is_deregistered_once_and_close_deregisters_the_rest_once() -> None:
    engine = FakeEngine()
    keep, gone = ArrayHandle(4096), ArrayHandle(4096)
    engine.table.extents([Segment(keep, 0, 1), Segment(gone, 0, 1)])
    del gone
    gc.collect()
    assert engine.deregistered == [2] and len(engine.table) == 1
    engine.table.close()
    engine.table.close()
    assert engine.deregistered == [2, 1] and len(engine.table) == 0
    del keep
    gc.collect()     # its finalizer runs after close: nothing more
    assert engine.deregistered == [2, 1]


def test_registering_from_many_threads_at_once_leaves_one_registration_per_handle() -> None:
    engine = FakeEngine()
    handles = [ArrayHandle(4096) for _ in range(8)]
    segments = [Segment(h, 0, 16) for h in handles]

    def use() -> None:
        for _ in range(20):
            engine.table.extents(segments)

    threads = [threading.Thread(target=use) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(engine.table) == 8
    # racing first uses may register a handle twice; the loser is deregistered, exactly once
    assert len(engine.registered) - len(engine.deregistered) == 8
    assert len(set(engine.deregistered)) == len(engine.deregistered)
