"""Per-block Python cost of the one-sided transports (scenarios 9 and 10): what each daemon computes per block
of a request, in this process, by the daemon's own functions, with CPU time.

A request of ``blocks`` shuffled blocks (``block`` bytes, 16 tensors, no two adjacent: one row per block, the
worst case) goes through what the two daemons run for it between the plan and the engine's call:

* receiver (``expect``): the plan's segment table (``SegmentTable.blocks``), its extents (``agent.addresses``:
  ``RegistrationTable.extents``), the destination extents as the bytes of the control frame;
* sender (``send``): its segment table and extents, the destination extents read back from the frame, the pairing of
  both (``pair_extents``), then the engine's descriptors -- hccl: the binding's ``OneSideOpDesc`` array
  (``datadist_ascend.hccl.descriptors``, what ``Hccl.batch`` hands to ``HcclBatchPut``); nixl: NIXL's transfer
  descriptor lists of both sides (``get_xfer_descs`` of ``(N, 3)`` arrays, as ``Agent.write``).

The engines' own calls (the put, the WRITE) are not on this clock: scenario 9 and 10's bulk rows time them. The
memory is not touched (registrations are faked: a base address per handle), so 100k blocks of 16 KiB need no
1.6 GB. Figure: CPU ns (``time.process_time``) per block, in a spawned process (NIXL stays out of the bench's).
Judged (issue 28's target, ≤ 0.1 µs = 100 ns per block): datadist's Python of both daemons summed -- receiver, sender
and, for hccl, the binding's descriptor array. NIXL's descriptor lists are its own C++ binding's work: a row of
their own, information only.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from typing import Any, Callable

import numpy as np

from .stats import Row, Target, figure

__all__ = ["per_block_rows", "TARGET_NS"]

TARGET_NS = 100          # issue 28: per block, at most 0.1 µs of Python on the hccl and nixl paths
_TENSORS = 16


class _Mem:
    """A handle stand-in: only its identity and size matter (registrations are faked)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def view(self) -> None:
        return None


def _request(blocks: int, block: int, seed: int) -> tuple[Callable[[], Any], Any]:
    """``(make_table, registrations)``: the plan's segment table of one request on one side, and a table of
    faked registrations (one base address per handle)."""
    from datadistd.core.layout import block_spans
    from datadistd.core.types import CacheDesc, DType
    from datadistd.memory.base import Segment
    from datadistd.memory.segments import SegmentTable
    from datadistd.transport.registrations import RegistrationTable

    per = max(1, blocks // _TENSORS)
    num = 2 * per                                          # half the cache's blocks, none adjacent to the next
    handle = _Mem(_TENSORS * num * block)
    tensors = [Segment(handle, t * num * block, num * block) for t in range(_TENSORS)]
    order = np.random.default_rng(seed).permutation(num // 2) * 2
    ids = tuple(int(b) for b in order[:per])
    desc = CacheDesc(_TENSORS, (num, block), DType.DT_UINT8)

    def table() -> SegmentTable:
        spans = block_spans(desc, range(_TENSORS), ids)
        return SegmentTable.blocks(tensors, spans.tensors, spans.blocks, spans.row)

    regs = RegistrationTable(lambda h: (0x10_0000_0000 * (1 + seed), h.size, seed), lambda reg: None)
    return table, regs


def _descriptors(engine: str) -> Callable[[np.ndarray, np.ndarray], Any]:
    if engine == "hccl":
        from datadist_ascend.hccl import descriptors

        return lambda src, dst: descriptors(src[:, 0], dst[:, 0], src[:, 1])
    from datadistd.transport.nixl.agent import Agent

    agent = Agent(f"bench-perblock-{time.monotonic_ns()}")._agent   # NIXL's own agent, as Agent.write uses it

    def nixl(src: np.ndarray, dst: np.ndarray) -> Any:
        zeros = np.zeros((len(src), 1), dtype=np.uint64)
        return (agent.get_xfer_descs(np.hstack([src, zeros]), "DRAM"),
                agent.get_xfer_descs(np.hstack([dst, zeros]), "DRAM"))

    return nixl


def _measure(engine: str, blocks: int, block: int, reps: int) -> tuple[int, dict[str, list[float]]]:
    """``(blocks, {part: ns per block, one per repetition})`` for the parts ``receiver``, ``sender`` (rows and
    pairing) and ``descriptors`` (the engine's), in this process."""
    from datadistd.transport.onesided.pairing import pair_extents

    recv_table, recv_regs = _request(blocks, block, 1)
    send_table, send_regs = _request(blocks, block, 2)
    descs = _descriptors(engine)
    n = len(recv_table())

    def receiver() -> bytes:
        rows, _, _ = recv_regs.extents(recv_table())
        return rows.tobytes()

    frame = receiver()
    paired: list[tuple[np.ndarray, np.ndarray]] = []

    def sender() -> None:
        rows, _, _ = send_regs.extents(send_table())
        src, dst = pair_extents(rows, np.frombuffer(frame, dtype=np.uint64).reshape(-1, 2))
        if len(src) != n:
            raise RuntimeError("blocks merged: the request is not one row per block")
        paired[:] = [(src, dst)]

    def descriptors() -> None:
        descs(*paired[0])

    got: dict[str, list[float]] = {"receiver": [], "sender": [], "descriptors": []}
    for rep in range(reps + 1):                           # repetition 0 warms up (first registrations, caches)
        for part, fn in (("receiver", receiver), ("sender", sender), ("descriptors", descriptors)):
            t0 = time.process_time()
            fn()
            if rep:
                got[part].append((time.process_time() - t0) / n * 1e9)
    return n, got


def _child(conn: Any, env: dict[str, str], *args: Any) -> None:
    os.environ.update(env)
    try:
        conn.send(("ok", _measure(*args)))
    except BaseException as exc:  # noqa: BLE001 - reported to the bench process, which raises it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    conn.close()
    os._exit(0)   # a process that loaded NIXL may crash in its exit handlers (issue 25): the figures are out


def per_block_rows(scenario: str, engine: str, blocks: int, block: int, reps: int,
                   env: dict[str, str] | None = None) -> list[Row]:
    """Rows of the per-block cost of ``engine`` (``hccl`` or ``nixl``) at ``blocks`` blocks of ``block`` bytes,
    measured in a spawned process (``env`` added to its environment; NIXL stays out of the bench process)."""
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child, env or {}, engine, blocks, block, reps), daemon=True)
    proc.start()
    try:
        if not conn.poll(300):
            raise TimeoutError("the per-block measurement did not finish in 300 s")
        status, result = conn.recv()
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    if status != "ok":
        raise RuntimeError(f"per-block measurement ({engine}): {result}")
    n, got = result
    python = ["receiver", "sender"] + (["descriptors"] if engine == "hccl" else [])
    total = [sum(parts) for parts in zip(*(got[p] for p in python), strict=True)]
    what = f"{n:,} shuffled blocks of {block // 1024} KiB"
    note = ("CPU ns per block, by the daemon's own functions in one process (the engine's call is not on this "
            "clock: the bulk rows time it)")
    rows = [Row(scenario, f"per-block Python, {engine}, both daemons ({what})", figure(total, "ns"),
                target=Target("<=", TARGET_NS, on="figure"),
                note=f"{note}: receiver + sender" + (" + the binding's descriptor array" if engine == "hccl" else "")),
            Row(scenario, f"per-block Python, {engine}, receiver ({what})", figure(got["receiver"], "ns"),
                note=f"{note}: the plan's segment table, its rows, the destination extents as frame bytes"),
            Row(scenario, f"per-block Python, {engine}, sender ({what})", figure(got["sender"], "ns"),
                note=f"{note}: the plan's segment table, its rows, the frame's rows read back, pair_extents")]
    if engine == "hccl":
        rows.append(Row(scenario, f"per-block Python, hccl, descriptors ({what})", figure(got["descriptors"], "ns"),
                        note=f"{note}: the binding's OneSideOpDesc array (what Hccl.batch hands to HcclBatchPut)"))
    else:
        rows.append(Row(scenario, f"per-block NIXL descriptor lists ({what})", figure(got["descriptors"], "ns"),
                        note=f"{note}: NIXL's get_xfer_descs of both sides' (N, 3) arrays, as Agent.write builds "
                             f"them -- NIXL's C++ binding, not datadist's Python: information only"))
    return rows
