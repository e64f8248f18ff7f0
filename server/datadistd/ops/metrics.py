"""Prometheus metrics of one daemon, and the ``[metrics] listen`` HTTP endpoint that exposes them.

Every daemon has its own ``CollectorRegistry`` (never the process-global one), so an embedded
daemon inside a worker, or several daemons in one test process, never collide.

Two kinds of series:

* **event series**, counted where things happen: transfers (``track_transfer``, used by the
  DataDist ``Pull``/``Push`` and the Peer ``Read``/``CommitWrite`` handlers; ``bound(...).begin()``/``end(...)``
  on the fast paths, from any thread) and RPC errors (``rpc_error``, called by the one error mapping in
  ``api/grpc/errors.py``). A transfer's counts are plain ints under one lock (``_Bound``, ``_OpSeries``),
  rendered by ``TransferCollector`` at scrape time; counting a transfer is the two calls ``begin`` and ``end``;
* **state series**, read from the ``Node`` at scrape time by ``NodeCollector``: engines, pools,
  caches, links.

Event series name a peer cluster (``peer_cluster_id``) or an engine's cluster (``cluster_id``); peers come
and go (every decoder a prompt node ever served), so a series must not outlive what it counts: each scrape
first drops (``prune``) the per-peer series of every (cluster, peer) no engine is linked with any more, and
the per-engine series of clusters with no engine left. Cardinality follows the live links, not the history.

The endpoint is a small asyncio HTTP server on the daemon's own event loop, so a scrape reads the
node's state on the same thread that changes it (no locks, no torn reads). Metric names and
labels are listed in ``docs/operations.md``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from bisect import bisect_left
from types import TracebackType
from typing import Any, Iterator, Protocol

from prometheus_client import CollectorRegistry, Counter
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from datadist.status import LLMStatusCode

from ..core.errors import DataDistError
from .config import parse_listen_address
from .snapshot import NodeView


class SnapshotSource(Protocol):
    """What the collector reads at scrape time (the ``Node``; named by what it does, so this module imports no
    node -- the node imports it)."""

    def snapshot(self) -> NodeView: ...


__all__ = ["DaemonMetrics", "NodeCollector", "MetricsServer", "TransferTracker", "track_transfer", "count_error",
           "parse_listen_address", "LATENCY_BUCKETS", "TransferCollector"]

log = logging.getLogger(__name__)
transfer_log = logging.getLogger("datadistd.transfer")

# Seconds: 0.5 ms (a few blocks over loopback) to 60 s (the longest sync_kv_timeout in practice).
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_LE = tuple(floatToGoString(b) for b in (*LATENCY_BUCKETS, float("inf")))   # the buckets' ``le`` labels

# the labels of the transfer series
_BY_DIRECTION = ("direction", "cluster_id", "peer_cluster_id")
_BY_OUTCOME = ("op", "cluster_id", "peer_cluster_id", "outcome")
_BY_OP = ("op", "cluster_id")

# op -> which way the bytes cross this node's memory.
DIRECTION = {"pull": "in", "push": "out", "serve_read": "out", "serve_write": "in"}


class DaemonMetrics:
    """The event series of one daemon, in its own registry; ``attach(node)`` adds the state series.

    The transfer series are plain ints in ``_Bound``/``_OpSeries`` objects, counted under one lock (a fast path
    counts from reader threads) and rendered by ``TransferCollector`` at scrape time: counting a transfer is
    two Python calls (``begin``/``end``), not the ~25 calls into prometheus_client's children of before."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._lock = threading.Lock()        # every count of every _Bound, and the two dicts below
        self._bound: dict[tuple[str, str, str], _Bound] = {}
        self._series: dict[tuple[str, str], _OpSeries] = {}
        self.registry.register(TransferCollector(self))
        self.rpc_errors = Counter(
            "datadist_rpc_errors", "Failed RPCs of the DataDist and Peer services, by method and LLMStatusCode name.",
            ["method", "code"], registry=self.registry)
        self._node: SnapshotSource | None = None

    def bound(self, op: str, cluster: str, peer: str) -> "_Bound":
        """The counts of ``op`` between ``cluster`` and ``peer`` (the same object every time until ``prune``
        drops it; a fast path keeps it per link)."""
        b = self._bound.get((op, cluster, peer))
        if b is None:
            with self._lock:
                b = self._bound.get((op, cluster, peer))
                if b is None:
                    series = self._series.get((op, cluster))
                    if series is None:
                        series = self._series[(op, cluster)] = _OpSeries()
                    b = self._bound[(op, cluster, peer)] = _Bound(self._lock, series, op, cluster, peer)
        return b

    def attach(self, node: SnapshotSource) -> None:
        """Add the scrape-time state series read from ``node`` (which also tells ``prune`` what is live)."""
        self._node = node
        self.registry.register(NodeCollector(node))

    def prune(self, view: NodeView) -> None:
        """Drop the event series of what ``view`` no longer holds: per (cluster, peer) where no engine of that
        cluster is linked with that peer, per cluster where no engine of it is left (see the module doc).

        On the daemon's event loop, where the links change. A transfer still finishing on a link just removed
        counts on a ``_Bound`` no longer exposed (its per-cluster part, duration and in flight, still counts
        while the cluster lives); ``bound`` then starts that peer's counts from 0."""
        clusters = {str(ev.cluster_id) for ev in view.engines}
        peers = {(str(ev.cluster_id), str(link.remote_cluster)) for ev in view.engines for link in ev.links}
        with self._lock:
            for key in [k for k in self._bound if (k[1], k[2]) not in peers]:
                del self._bound[key]
            for op_key in [k for k in self._series if k[1] not in clusters]:
                del self._series[op_key]

    def rpc_error(self, method: str, code_name: str) -> None:
        self.rpc_errors.labels(method, code_name).inc()

    def exposition(self, accept: str = "") -> tuple[bytes, str]:
        """The registry rendered in the format ``accept`` asks for (Prometheus text or OpenMetrics)."""
        encoder, content_type = choose_encoder(accept)
        if self._node is not None:
            self.prune(self._node.snapshot())
        return encoder(self.registry), content_type


class _OpSeries:
    """The per-(op, cluster) counts: transfers begun and ended (in flight = the difference) and the duration
    histogram (``buckets[i]``: durations ``<= LATENCY_BUCKETS[i]``, the last one +Inf; not cumulative)."""

    __slots__ = ("started", "ended", "buckets", "seconds", "created")

    def __init__(self) -> None:
        self.started = 0
        self.ended = 0
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)
        self.seconds = 0.0
        self.created = time.time()


class _Bound:
    """The counts of one (op, cluster, peer) (``DaemonMetrics.bound``): plain ints, changed under the metrics'
    lock, read by ``TransferCollector`` at scrape time. A series shows once something counted on it, as
    prometheus_client's children did: in flight once begun, duration and bytes once a transfer succeeded,
    blocks once blocks moved."""

    __slots__ = ("_lock", "series", "op", "cluster", "peer", "direction", "outcomes", "nbytes", "nblocks", "created")

    def __init__(self, lock: threading.Lock, series: _OpSeries, op: str, cluster: str, peer: str) -> None:
        self._lock, self.series = lock, series
        self.op, self.cluster, self.peer, self.direction = op, cluster, peer, DIRECTION[op]
        self.outcomes: dict[str, int] = {}    # outcome -> transfers that ended so
        self.nbytes = 0
        self.nblocks = 0
        self.created = time.time()

    # ---- the fast paths' interface (a reader thread's small pull or read): no tracker object per transfer

    def begin(self) -> None:
        """A transfer started (any thread)."""
        with self._lock:
            self.series.started += 1

    def end(self, outcome: str, seconds: float = 0.0, nbytes: int = 0, blocks: int = 0) -> None:
        """A transfer ``begin`` counted ended: ``outcome`` is "success" (then ``seconds``, ``nbytes``, ``blocks``
        count) or the ``LLMStatusCode`` name (any thread). What ``TransferTracker`` does, minus the log line.
        No Python call but this one (the lock, ``dict.get`` and ``bisect_left`` are C)."""
        with self._lock:
            s = self.series
            s.ended += 1
            o = self.outcomes
            o[outcome] = o.get(outcome, 0) + 1
            if outcome == "success":
                s.buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1
                s.seconds += seconds
                self.nbytes += nbytes
                self.nblocks += blocks

    def handed_on(self) -> None:
        """A transfer ``begin`` counted goes on elsewhere (counted there): it leaves the in-flight count with no
        outcome."""
        with self._lock:
            self.series.ended += 1


class TransferCollector(Collector):
    """The transfer series of a ``DaemonMetrics``, rendered from its counts at scrape time (names, types, help,
    labels and buckets as ``docs/operations.md`` lists them)."""

    def __init__(self, metrics: DaemonMetrics) -> None:
        self.metrics = metrics

    def _families(self) -> tuple[CounterMetricFamily, CounterMetricFamily, CounterMetricFamily, Metric,
                                 GaugeMetricFamily]:
        return (CounterMetricFamily("datadist_transfer_bytes", "Bytes moved by completed transfers, by direction "
                                    "(in = written into this node's memory) and peer cluster.", labels=_BY_DIRECTION),
                CounterMetricFamily("datadist_transfer_blocks", "Blocks moved by completed block transfers "
                                    "(pull_blocks/push_blocks), by direction and peer cluster.", labels=_BY_DIRECTION),
                CounterMetricFamily("datadist_transfers", "Transfers finished, by operation and outcome (success or "
                                    "the LLMStatusCode name).", labels=_BY_OUTCOME),
                Metric("datadist_transfer_duration_seconds", "Duration of successful transfers, by operation "
                       "(pull/push on the requesting daemon, serve_read/serve_write on the owning daemon).",
                       "histogram"),
                GaugeMetricFamily("datadist_transfers_in_flight", "Transfers currently running, by operation.",
                                  labels=_BY_OP))

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        with m._lock:   # a copy of every count, so the families are built without the lock
            bound = [(b.op, b.cluster, b.peer, b.direction, dict(b.outcomes), b.nbytes, b.nblocks, b.created)
                     for b in m._bound.values()]
            series = [(op, cluster, s.started, s.ended, list(s.buckets), s.seconds, s.created)
                      for (op, cluster), s in m._series.items()]
        created = prometheus_metrics._use_created   # PROMETHEUS_DISABLE_CREATED_SERIES, as for the Counter
        nbytes, blocks, transfers, seconds, in_flight = self._families()
        moved: dict[tuple[str, str, str], list[Any]] = {}   # (direction, cluster, peer) -> [bytes, blocks, created, ok]
        for op, cluster, peer, direction, outcomes, nb, nblk, made in bound:
            for outcome, n in outcomes.items():
                transfers.add_metric([op, cluster, peer, outcome], n, created=made if created else None)
            ok = outcomes.get("success", 0) > 0
            row = moved.get((direction, cluster, peer))
            if row is None:
                moved[(direction, cluster, peer)] = [nb, nblk, made, ok]
            else:
                row[0] += nb
                row[1] += nblk
                row[2] = min(row[2], made)
                row[3] = row[3] or ok
        for key, (nb, nblk, made, ok) in moved.items():
            if ok:
                nbytes.add_metric(list(key), nb, created=made if created else None)
            if nblk:
                blocks.add_metric(list(key), nblk, created=made if created else None)
        name = seconds.name
        for op, cluster, started, ended, buckets, total, made in series:
            labels = {"op": op, "cluster_id": cluster}
            if started:
                in_flight.add_metric([op, cluster], started - ended)
            if not any(buckets):
                continue   # no transfer of this (op, cluster) succeeded yet: no histogram series
            count = 0
            for le, n in zip(_LE, buckets, strict=True):
                count += n
                seconds.add_sample(name + "_bucket", {**labels, "le": le}, count)
            seconds.add_sample(name + "_count", labels, count)
            seconds.add_sample(name + "_sum", labels, total)
            if created:
                seconds.add_sample(name + "_created", labels, made)
        yield from (nbytes, blocks, transfers, seconds, in_flight)


class TransferTracker:
    """Context manager around one transfer: in-flight gauge, latency, counters and one log line.

    ``done(nbytes, blocks)`` marks success; leaving the block without it (an exception) counts the
    outcome by status code. Works with ``metrics=None`` (metrics off): it then only logs.
    """

    __slots__ = ("metrics", "op", "cluster", "peer", "cache", "nbytes", "blocks", "started", "ok", "bound", "handed")

    def __init__(self, metrics: DaemonMetrics | None, op: str, cluster: int, peer: int, cache: int | None = None
                 ) -> None:
        self.metrics = metrics
        self.op = op
        self.cluster = str(cluster)
        self.peer = str(peer)
        self.cache = cache
        self.nbytes = 0
        self.blocks = 0
        self.started = 0.0
        self.ok = False
        self.handed = False
        self.bound = metrics.bound(op, self.cluster, self.peer) if metrics is not None else None

    def __enter__(self) -> "TransferTracker":
        self.started = time.monotonic()
        if self.bound is not None:
            self.bound.begin()
        return self

    def done(self, nbytes: int, blocks: int = 0) -> None:
        self.nbytes, self.blocks, self.ok = nbytes, blocks, True

    def hand_on(self) -> None:
        """The transfer goes on elsewhere (a tracker of its own counts it): leaving counts no outcome."""
        self.handed = True

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        elapsed = time.monotonic() - self.started
        if self.handed and exc is None:
            if self.bound is not None:
                self.bound.handed_on()
            return
        if self.ok and exc is None:
            outcome = "success"
        elif isinstance(exc, DataDistError):
            outcome = exc.code.name
        elif isinstance(exc, asyncio.CancelledError):
            outcome = "cancelled"
        else:
            outcome = "LLM_FAILED"
        if self.bound is not None:
            self.bound.end(outcome, elapsed, self.nbytes, self.blocks)
        cache = "-" if self.cache is None else self.cache
        if outcome == "success":
            if transfer_log.isEnabledFor(logging.DEBUG):
                transfer_log.debug("cluster %s %s peer cluster %s: cache %s, %d blocks, %d bytes in %.1f ms",
                                   self.cluster, self.op, self.peer, cache, self.blocks, self.nbytes, elapsed * 1e3)
        else:
            transfer_log.warning("cluster %s %s peer cluster %s failed: cache %s, %.1f ms: %s", self.cluster, self.op,
                                 self.peer, cache, elapsed * 1e3, exc if exc is not None else outcome)


def count_error(metrics: DaemonMetrics | None, method: str, code: LLMStatusCode) -> None:
    """Errors by status code for the metrics (``datadist_rpc_errors_total``), when there are metrics."""
    if metrics is not None:
        try:
            metrics.rpc_error(method, code.name)
        except Exception:  # metrics must never change a call's outcome
            log.exception("counting an error of %s failed", method)


def track_transfer(metrics: DaemonMetrics | None, op: str, cluster: int, peer: int,
                   cache: int | None = None) -> TransferTracker:
    """``with track_transfer(m, "pull", 2, 1, cache=5) as t: ...; t.done(nbytes, blocks)``."""
    if op not in DIRECTION:
        raise ValueError(f"unknown transfer op {op!r}; known: {', '.join(DIRECTION)}")
    return TransferTracker(metrics, op, cluster, peer, cache)


class NodeCollector(Collector):
    """State series read from the node at scrape time (on the daemon's event loop)."""

    def __init__(self, node: SnapshotSource) -> None:
        self.node = node

    def describe(self) -> list[Metric]:
        return []  # the series depend on the engines present; collect() is authoritative

    def collect(self) -> Iterator[Metric]:
        view = self.node.snapshot()
        info = GaugeMetricFamily("datadist_build_info", "Daemon version, memory backend and transport (value 1).",
                                 labels=["version", "backend", "transport"])
        info.add_metric([view.version, view.backend, view.transport], 1)
        yield info
        yield GaugeMetricFamily("datadist_uptime_seconds", "Seconds since the daemon started.",
                                value=view.uptime_seconds)
        yield GaugeMetricFamily("datadist_engines", "Engines (initialized LLMDataDist instances) on this daemon.",
                                value=len(view.engines))
        role = GaugeMetricFamily("datadist_engine_info", "One series per engine (value 1).",
                                 labels=["cluster_id", "engine_id", "role", "listen_address"])
        caches = GaugeMetricFamily("datadist_caches", "Caches (allocated or registered) per engine.",
                                   labels=["cluster_id"])
        capacity = GaugeMetricFamily("datadist_pool_capacity_bytes", "Pool capacity per engine and placement.",
                                     labels=["cluster_id", "placement"])
        used = GaugeMetricFamily("datadist_pool_used_bytes", "Pool bytes in use per engine and placement.",
                                 labels=["cluster_id", "placement"])
        link_up = GaugeMetricFamily("datadist_link_up", "Links per peer cluster: 1 established, 0 broken.",
                                    labels=["cluster_id", "peer_cluster_id", "transport", "initiator"])
        link_in_flight = GaugeMetricFamily("datadist_link_transfers_in_flight",
                                           "Transfers running on a link this engine initiated.",
                                           labels=["cluster_id", "peer_cluster_id"])
        conns = GaugeMetricFamily("datadist_listener_connections",
                                  "Connections a peer-reachable listener holds, by state (preauth: not yet proved "
                                  "the secret).", labels=["cluster_id", "listener", "state"])
        closed = CounterMetricFamily("datadist_listener_connections_closed",
                                     "Connections a peer-reachable listener closed before they authenticated: "
                                     "evicted (to make room), expired (pre-auth deadline), refused (hard cap).",
                                     labels=["cluster_id", "listener", "reason"])
        for ev in view.engines:
            cid = str(ev.cluster_id)
            role.add_metric([cid, str(ev.engine_id), ev.role_name, ev.listen_address], 1)
            caches.add_metric([cid], ev.caches)
            for pool in ev.pools:
                capacity.add_metric([cid, pool.placement_name], pool.capacity)
                used.add_metric([cid, pool.placement_name], pool.used)
            for link in ev.links:
                link_up.add_metric([cid, str(link.remote_cluster), link.transport, str(link.initiator).lower()],
                                   1 if link.state == "established" else 0)
                link_in_flight.add_metric([cid, str(link.remote_cluster)], link.inflight)
            books: dict[tuple[str, str], int] = {}   # an engine may listen on several peer addresses: summed
            for lst in ev.listeners:
                for key, n in (("preauth", lst.preauth), ("authenticated", lst.authenticated),
                               ("evicted", lst.evicted), ("expired", lst.expired), ("refused", lst.refused)):
                    books[(lst.kind, key)] = books.get((lst.kind, key), 0) + n
            for (kind, key), n in books.items():
                if key in ("preauth", "authenticated"):
                    conns.add_metric([cid, kind, key], n)
                else:
                    closed.add_metric([cid, kind, key], n)
        yield from (role, caches, capacity, used, link_up, link_in_flight, conns, closed)


class MetricsServer:
    """``GET /metrics`` (and ``/``) over HTTP/1.x on the daemon's event loop.

    Bounded for whoever can reach it (no authentication): at most ``MAX_CONNECTIONS`` at once (more are
    reset on accept), one deadline of ``REQUEST_SECONDS`` for the whole exchange (request, headers,
    answer), a request of at most ``MAX_HEADER_LINES`` lines of ``LINE_LIMIT`` bytes; anything else is
    closed without a word in the log."""

    MAX_CONNECTIONS = 16
    REQUEST_SECONDS = 5.0
    LINE_LIMIT = 8 << 10
    MAX_HEADER_LINES = 64

    def __init__(self, metrics: DaemonMetrics, host: str, port: int) -> None:
        self.metrics = metrics
        self.host = host
        self.port = port
        self._server: asyncio.AbstractServer | None = None
        self._open = 0

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port, reuse_address=True,
                                                  limit=self.LINE_LIMIT)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("metrics on http://%s/metrics", self.address)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= self.MAX_CONNECTIONS:
            writer.transport.abort()
            return
        self._open += 1
        answered = False
        try:
            await asyncio.wait_for(self._exchange(reader, writer), self.REQUEST_SECONDS)
            answered = True
        except (asyncio.TimeoutError, ConnectionError, UnicodeDecodeError, ValueError):
            pass   # slow, gone, or not HTTP (ValueError: a line over LINE_LIMIT): closed, nothing logged
        except Exception:  # a scrape must never take the daemon down
            log.exception("metrics request failed")
        finally:
            self._open -= 1
            if answered:
                writer.close()             # the whole answer is in the kernel's buffer: nothing left to wait for
            else:
                writer.transport.abort()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readline()
        headers: dict[str, str] = {}
        for _ in range(self.MAX_HEADER_LINES):
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        else:
            raise ValueError("too many header lines")
        parts = request.decode("latin-1").split()
        method, path = (parts[0], parts[1]) if len(parts) >= 2 else ("", "")
        if method not in ("GET", "HEAD"):
            status, body, ctype = "405 Method Not Allowed", b"only GET\n", "text/plain"
        elif path.split("?", 1)[0] in ("/metrics", "/"):
            body, ctype = self.metrics.exposition(headers.get("accept", ""))
            status = "200 OK"
        else:
            status, body, ctype = "404 Not Found", b"see /metrics\n", "text/plain"
        head = (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n\r\n").encode()
        writer.transport.set_write_buffer_limits(0)   # drain returns once every byte is with the kernel
        writer.write(head if method == "HEAD" else head + body)
        await writer.drain()
