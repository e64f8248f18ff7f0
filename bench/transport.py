"""Scenario 11: the tcp transport alone against a raw socket.

Two ``TcpTransport``s in the bench process on 127.0.0.1 (no daemon, no worker, no owner call: the data plane
only) move ``bulk_mib`` of contiguous memory over 1 and over 4 connections, against one raw Python socket
moving the same bytes (``sendall`` of the whole buffer, ``recv_into`` at the receiver) in the same repetition.
Memory is numpy arrays, faulted in before the clock; the bytes are checked after the timed loop.
Information only: what the transport's framing, striping and reader threads cost next to one plain stream.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import numpy as np

from datadistd.memory.base import Segment
from datadistd.memory.copy import BufferHandle
from datadistd.transport.tcp import TcpTransport

from .stats import Row, figure, gib_per_s, paired

LOOPBACK = "127.0.0.1"
SCENARIO = "11 tcp transport alone"
MIB = 1 << 20
STREAMS = (1, 4)


def _raw_once(src: np.ndarray, dst: np.ndarray, timeout: float) -> float:
    """Seconds one raw socket takes to move ``src`` into ``dst`` over loopback (connection set up before)."""
    listener = socket.create_server((LOOPBACK, 0))
    received = [0]

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            view = memoryview(dst)
            while received[0] < len(view):
                n = conn.recv_into(view[received[0]:])
                if n == 0:
                    break
                received[0] += n

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with socket.create_connection(listener.getsockname(), timeout=timeout) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.settimeout(None)   # plain blocking sendall: one system call for the whole buffer
            t0 = time.perf_counter()
            s.sendall(memoryview(src))
            thread.join(timeout)
            elapsed = time.perf_counter() - t0
    finally:
        listener.close()
    if received[0] != src.size:
        raise RuntimeError(f"raw socket moved {received[0]} of {src.size} bytes")
    return elapsed


class _Pair:
    """Transport ``a`` linked to ``b`` over ``streams`` connections, every transfer striped over all of them."""

    def __init__(self, streams: int, timeout: float) -> None:
        token = os.urandom(32)
        self.timeout = timeout
        self.a = TcpTransport(LOOPBACK, stripe=streams)
        self.b = TcpTransport(LOOPBACK, stripe=streams)
        self.a.start()
        self.b.start()
        try:
            self.b.allow(token)
            self.out = self.a.connect(self.b.endpoint, token, streams, time.monotonic() + timeout)
            inb = self.b.channel(token)
            if inb is None:
                raise RuntimeError("the receiving transport has no channel for the token")
            self.inb = inb
        except BaseException:
            self.stop()
            raise

    def once(self, src: np.ndarray, dst: np.ndarray) -> float:
        deadline = time.monotonic() + self.timeout
        receipt = self.b.expect([Segment(BufferHandle(dst), 0, dst.size)], channel=self.inb)
        t0 = time.perf_counter()
        self.out.send(receipt.transfer_id, [Segment(BufferHandle(src), 0, src.size)], deadline)
        receipt.wait(deadline)
        return time.perf_counter() - t0

    def stop(self) -> None:
        self.a.stop()
        self.b.stop()


def transport_alone(run: Any) -> None:
    """Scenario 11's rows: the raw socket, then the transport over 1 and over 4 connections, paired."""
    cfg = run.cfg
    nbytes = cfg.bulk_mib * MIB
    timeout = cfg.timeout_s
    src = np.frombuffer(bytearray(np.random.default_rng(15).bytes(nbytes)), np.uint8)
    dst = np.ones(nbytes, np.uint8)   # faulted in: page faults are not what is measured
    pairs = {streams: _Pair(streams, timeout) for streams in STREAMS}
    try:
        raw: list[float] = []
        times: dict[int, list[float]] = {streams: [] for streams in STREAMS}
        for r in range(cfg.reps + 1):                  # repetition 0 warms both up
            t = _raw_once(src, dst, timeout)
            if r:
                raw.append(t)
            for streams, pair in pairs.items():
                t = pair.once(src, dst)
                if r:
                    times[streams].append(t)
            run.step(f"{SCENARIO}: rep {r}")
        dst[:] = 0
        for pair in pairs.values():
            pair.once(src, dst)
            if not np.array_equal(dst, src):
                raise RuntimeError(f"{SCENARIO}: the transport delivered other bytes than it was given")
            dst[:] = 0
    finally:
        for pair in pairs.values():
            pair.stop()
    raw_gibs = gib_per_s(nbytes, raw)
    raw_fig = figure(raw_gibs, "GiB/s")
    name = "raw socket, 1 connection (sendall / recv_into)"
    run.add(Row(SCENARIO, f"baseline: {name}", raw_fig, note=f"{cfg.bulk_mib} MiB contiguous over loopback"))
    series = run.series.setdefault(SCENARIO, {})
    series["raw socket"] = raw_fig
    for streams, secs in times.items():
        gibs = gib_per_s(nbytes, secs)
        fig = figure(gibs, "GiB/s")
        med, lo, hi = paired(gibs, raw_gibs)
        run.add(Row(SCENARIO, f"datadist tcp transport, {streams} connection(s), 4 MiB frames", fig, name, raw_fig,
                    ratio=med, ratio_min=lo, ratio_max=hi,
                    note="information: no daemon, no owner call; ratio = median of paired repetitions; "
                         "bytes verified"))
        series[f"{streams} connection(s)"] = fig
