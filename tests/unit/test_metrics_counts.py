"""The transfer series as plain ints (``ops/metrics.py``: ``_Bound``, ``TransferCollector``): what a scrape shows
is what prometheus_client's own children showed for the same transfers, totals stay exact when reader threads
count at once, counting one transfer is two Python calls, and ``prune`` still drops the series of what is gone."""

from __future__ import annotations

import re
import sys
import threading
from types import FrameType
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from datadistd.ops.metrics import DIRECTION, LATENCY_BUCKETS, DaemonMetrics, track_transfer
from datadistd.ops.snapshot import EngineView, LinkView, NodeView

#: (op, cluster, peer, outcome, seconds, bytes, blocks): one transfer each, begun and ended in this order
EVENTS = [("pull", "2", "1", "success", 0.0007, 4096, 1), ("pull", "2", "1", "success", 0.0005, 100, 0),
          ("pull", "2", "1", "LLM_TIMEOUT", 0.0, 0, 0), ("push", "2", "1", "success", 3.0, 10, 2),
          ("serve_read", "2", "3", "success", 100.0, 7, 0), ("serve_write", "4", "1", "success", 0.01, 5, 1),
          ("serve_write", "2", "1", "success", 60.0, 9, 3), ("pull", "5", "6", "cancelled", 0.0, 0, 0)]


def _reference(events: list[tuple[Any, ...]], running: list[tuple[str, str]], handed: list[tuple[str, str]]
               ) -> bytes:
    """What the daemon exposed before (prometheus_client's Counter/Histogram/Gauge children, as ``_Bound`` drove
    them until session 40) for ``events``, the transfers still ``running`` and those ``handed`` on, per (op,
    cluster)."""
    r = CollectorRegistry()
    nbytes = Counter("datadist_transfer_bytes", "Bytes moved by completed transfers, by direction (in = written into "
                     "this node's memory) and peer cluster.", ["direction", "cluster_id", "peer_cluster_id"],
                     registry=r)
    blocks = Counter("datadist_transfer_blocks", "Blocks moved by completed block transfers (pull_blocks/push_blocks),"
                     " by direction and peer cluster.", ["direction", "cluster_id", "peer_cluster_id"], registry=r)
    transfers = Counter("datadist_transfers", "Transfers finished, by operation and outcome (success or the "
                        "LLMStatusCode name).", ["op", "cluster_id", "peer_cluster_id", "outcome"], registry=r)
    seconds = Histogram("datadist_transfer_duration_seconds", "Duration of successful transfers, by operation "
                        "(pull/push on the requesting daemon, serve_read/serve_write on the owning daemon).",
                        ["op", "cluster_id"], buckets=LATENCY_BUCKETS, registry=r)
    in_flight = Gauge("datadist_transfers_in_flight", "Transfers currently running, by operation.",
                      ["op", "cluster_id"], registry=r)
    for op, cluster, peer, outcome, secs, nb, nblk in events:
        in_flight.labels(op, cluster).inc()
        in_flight.labels(op, cluster).dec()
        transfers.labels(op, cluster, peer, outcome).inc()
        if outcome == "success":
            seconds.labels(op, cluster).observe(secs)
            nbytes.labels(DIRECTION[op], cluster, peer).inc(nb)
            if nblk:
                blocks.labels(DIRECTION[op], cluster, peer).inc(nblk)
    for op, cluster in running:
        in_flight.labels(op, cluster).inc()
    for op, cluster in handed:
        in_flight.labels(op, cluster).inc()
        in_flight.labels(op, cluster).dec()
    return generate_latest(r)


def _transfer_families(m: DaemonMetrics) -> bytes:
    body, _ = m.exposition()
    return b"".join(line + b"\n" for line in body.splitlines() if b"datadist_rpc_errors" not in line)


def test_a_scrape_shows_what_prometheus_clients_children_showed() -> None:
    """The same exposition text, sample for sample (but the ``_created`` clock readings), as the prometheus_client
    children the transfers drove before: names, types, help, labels, buckets, which series show."""
    m = DaemonMetrics()
    for op, cluster, peer, outcome, secs, nb, nblk in EVENTS:
        b = m.bound(op, cluster, peer)
        b.begin()
        b.end(outcome, secs, nb, nblk)
    m.bound("pull", "2", "1").begin()                 # still running
    m.bound("serve_read", "7", "1")                   # bound, never used: no series
    with track_transfer(m, "push", 5, 6) as handed:   # handed on: in flight 0, no outcome
        handed.hand_on()
    clock = re.compile(rb"^(\S+_created(\{.*\})?) \S+$", re.M)
    ours = clock.sub(rb"\1", _transfer_families(m))
    assert ours == clock.sub(rb"\1", _reference(EVENTS, running=[("pull", "2")], handed=[("push", "5")]))
    assert b"_created" in ours


def test_totals_are_exact_when_threads_count_at_once() -> None:
    """8 threads x 3,000 transfers through ``begin``/``end`` on shared bounds (two ops, two peers), scraped while
    they run and after: every total exact (durations are powers of two, so even the sums are)."""
    m = DaemonMetrics()
    threads, per = 8, 3000
    durations = (2.0 ** -12, 2.0 ** -7, 0.5, 4.0, 128.0)   # buckets 0.0005, 0.01, 0.5, 5.0, +Inf
    bounds = [m.bound(op, "2", peer) for op in ("pull", "serve_read") for peer in ("1", "3")]
    go = threading.Barrier(threads + 1)

    def work(t: int) -> None:
        go.wait()
        for i in range(per):
            b = bounds[(t + i) % len(bounds)]
            b.begin()
            if i % 5 == 4:
                b.end("LLM_TIMEOUT")
            else:
                b.end("success", durations[i % 5], 4096, 2)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    go.wait()
    while any(th.is_alive() for th in pool):
        for family in text_string_to_metric_families(m.exposition()[0].decode()):   # scrapes during the counting
            for s in family.samples:
                if s.name == "datadist_transfers_in_flight":
                    assert 0 <= s.value <= threads
    for th in pool:
        th.join()
    get = m.registry.get_sample_value
    ok_each = threads * per * 4 // 5 // len(bounds)
    for op in ("pull", "serve_read"):
        direction = DIRECTION[op]
        for peer in ("1", "3"):
            assert get("datadist_transfers_total", {"op": op, "cluster_id": "2", "peer_cluster_id": peer,
                                                    "outcome": "success"}) == ok_each
            assert get("datadist_transfers_total", {"op": op, "cluster_id": "2", "peer_cluster_id": peer,
                                                    "outcome": "LLM_TIMEOUT"}) == threads * per // 5 // len(bounds)
            assert get("datadist_transfer_bytes_total", {"direction": direction, "cluster_id": "2",
                                                         "peer_cluster_id": peer}) == ok_each * 4096
            assert get("datadist_transfer_blocks_total", {"direction": direction, "cluster_id": "2",
                                                          "peer_cluster_id": peer}) == ok_each * 2
        assert get("datadist_transfers_in_flight", {"op": op, "cluster_id": "2"}) == 0
        count = get("datadist_transfer_duration_seconds_count", {"op": op, "cluster_id": "2"})
        assert count == 2 * ok_each
        each = count / 4   # every one of the four durations equally often
        assert get("datadist_transfer_duration_seconds_sum", {"op": op, "cluster_id": "2"}) == \
            each * sum(durations[:4])
        for le, n in (("0.0005", 1), ("0.01", 2), ("0.5", 3), ("5.0", 4), ("60.0", 4), ("+Inf", 4)):
            assert get("datadist_transfer_duration_seconds_bucket", {"op": op, "cluster_id": "2", "le": le}) == \
                n * each, le


def _python_calls(fn: Any) -> list[str]:
    """Names of the Python functions ``fn()`` calls (profile "call" events; C functions give "c_call")."""
    called: list[str] = []

    def hook(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            called.append(frame.f_code.co_name)

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return called[1:]   # [0] is fn itself


def test_counting_a_transfer_is_two_python_calls() -> None:
    """Issue 36: counters as plain ints. One ``begin`` + ``end`` is the two methods and nothing under them
    (it was ~25 calls into prometheus_client)."""
    m = DaemonMetrics()
    b = m.bound("pull", "2", "1")

    def success() -> None:
        b.begin()
        b.end("success", 0.0007, 4096, 1)

    def failure() -> None:
        b.begin()
        b.end("LLM_TIMEOUT")

    for _ in range(2):   # first (a new outcome, a new series) and warm
        assert _python_calls(success) == ["begin", "end"]
        assert _python_calls(failure) == ["begin", "end"]
    assert m.registry.get_sample_value("datadist_transfers_total", {"op": "pull", "cluster_id": "2",
                                                                    "peer_cluster_id": "1", "outcome": "success"}) == 2


def _view(links: dict[int, tuple[int, ...]]) -> NodeView:
    """A node whose engines (cluster id -> linked peer clusters) are ``links``."""
    engines = tuple(EngineView(engine_id=i, cluster_id=cluster, role=0, role_name="PROMPT", listen_address="",
                               pid=0, uid=0, caches=0, pools=(), listeners=(),
                               links=tuple(LinkView(peer, "established", "tcp", True, "", "", 1, 0, 0, 0)
                                           for peer in peers))
                    for i, (cluster, peers) in enumerate(links.items()))
    return NodeView(version="t", backend="host", transport="tcp", peer_security="plaintext", uptime_seconds=0.0,
                    engines=engines)


def test_prune_drops_the_series_of_gone_peers_and_clusters() -> None:
    m = DaemonMetrics()
    for op, cluster, peer in (("pull", "2", "1"), ("pull", "2", "3"), ("serve_read", "4", "1")):
        b = m.bound(op, cluster, peer)
        b.begin()
        b.end("success", 0.001, 100, 1)
    stale = m.bound("pull", "2", "3")
    stale.begin()                          # a transfer still running on the link about to go
    m.prune(_view({2: (1,)}))              # peer 3 unlinked; cluster 4's engine finalized
    labels = [s.labels for f in text_string_to_metric_families(_transfer_families(m).decode()) for s in f.samples]
    assert not [x for x in labels if x.get("peer_cluster_id") == "3" or x.get("cluster_id") == "4"], labels
    get = m.registry.get_sample_value
    assert get("datadist_transfers_total", {"op": "pull", "cluster_id": "2", "peer_cluster_id": "1",
                                            "outcome": "success"}) == 1
    # the per-cluster series keep what the gone peer counted (a histogram never goes down while its cluster lives)
    assert get("datadist_transfer_duration_seconds_count", {"op": "pull", "cluster_id": "2"}) == 2
    assert get("datadist_transfers_in_flight", {"op": "pull", "cluster_id": "2"}) == 1
    stale.end("success", 0.001, 100, 1)    # ends after the prune: no per-peer series comes back
    assert get("datadist_transfers_in_flight", {"op": "pull", "cluster_id": "2"}) == 0
    assert get("datadist_transfer_bytes_total", {"direction": "in", "cluster_id": "2", "peer_cluster_id": "3"}) is None
    fresh = m.bound("pull", "2", "3")      # the peer links again: its counts start from 0
    assert fresh is not stale
    fresh.begin()
    fresh.end("success", 0.001, 5, 1)
    assert get("datadist_transfer_bytes_total", {"direction": "in", "cluster_id": "2", "peer_cluster_id": "3"}) == 5
    m.prune(_view({}))                     # every engine gone: no transfer series at all
    assert not [f for f in text_string_to_metric_families(_transfer_families(m).decode()) if f.samples]
