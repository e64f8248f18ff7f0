"""Prometheus metrics: a scrape after real transfers between two daemons shows what moved."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from datadist.v1 import common_pb2, datadist_pb2, datadist_pb2_grpc
from datadistd.ops.config import load_config
from datadistd.ops.metrics import DaemonMetrics, parse_listen_address
from tests.harness import Daemon, free_port, metrics_address, scrape
from tests.reliability.common import blocks_key, stub

from .conftest import BLOCK_BYTES, PULLED, PUSHED, TENSORS, D, P

pytestmark = pytest.mark.integration

PULL_BYTES = len(PULLED[0]) * TENSORS * BLOCK_BYTES
PUSH_BYTES = len(PUSHED[0]) * TENSORS * BLOCK_BYTES


def samples(address: str) -> dict[tuple[str, frozenset], float]:
    out = {}
    for family in text_string_to_metric_families(scrape(address)):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(data: dict, name: str, **labels: str) -> float | None:
    return data.get((name, frozenset(labels.items())))


def test_decoder_scrape_shows_bytes_and_blocks_moved_by_direction_and_peer(pair) -> None:
    m = samples(pair.decoder_metrics)
    c, p = str(D), str(P)
    assert value(m, "datadist_transfer_bytes_total", direction="in", cluster_id=c, peer_cluster_id=p) == PULL_BYTES
    assert value(m, "datadist_transfer_bytes_total", direction="out", cluster_id=c, peer_cluster_id=p) == PUSH_BYTES
    assert value(m, "datadist_transfer_blocks_total", direction="in", cluster_id=c, peer_cluster_id=p) == 3
    assert value(m, "datadist_transfer_blocks_total", direction="out", cluster_id=c, peer_cluster_id=p) == 2
    for op in ("pull", "push"):
        assert value(m, "datadist_transfers_total", op=op, cluster_id=c, peer_cluster_id=p, outcome="success") == 1
        assert value(m, "datadist_transfer_duration_seconds_count", op=op, cluster_id=c) == 1
        assert value(m, "datadist_transfer_duration_seconds_bucket", op=op, cluster_id=c, le="+Inf") == 1
        assert value(m, "datadist_transfers_in_flight", op=op, cluster_id=c) == 0
    assert value(m, "datadist_link_up", cluster_id=c, peer_cluster_id=p, transport="tcp", initiator="true") == 1
    assert value(m, "datadist_pool_capacity_bytes", cluster_id=c, placement="DEVICE") == 4 << 20
    assert value(m, "datadist_pool_used_bytes", cluster_id=c, placement="DEVICE") is not None
    assert value(m, "datadist_engines") == 1
    assert value(m, "datadist_caches", cluster_id=c) == 1


def test_prompt_scrape_shows_the_serving_side(pair) -> None:
    m = samples(pair.prompt_metrics)
    c, p = str(P), str(D)
    assert value(m, "datadist_transfer_bytes_total", direction="out", cluster_id=c, peer_cluster_id=p) == PULL_BYTES
    assert value(m, "datadist_transfer_bytes_total", direction="in", cluster_id=c, peer_cluster_id=p) == PUSH_BYTES
    assert value(m, "datadist_transfers_total", op="serve_read", cluster_id=c, peer_cluster_id=p,
                 outcome="success") == 1
    assert value(m, "datadist_transfers_total", op="serve_write", cluster_id=c, peer_cluster_id=p,
                 outcome="success") == 1
    assert value(m, "datadist_link_up", cluster_id=c, peer_cluster_id=p, transport="tcp", initiator="false") == 1
    (info,) = [k for k in m if k[0] == "datadist_build_info"]
    assert dict(info[1])["backend"] == "host" and dict(info[1])["transport"] == "tcp"


def test_errors_are_counted_by_status_code(pair) -> None:
    labels = {"method": "GetStatus", "code": "LLM_ENGINE_FINALIZED"}
    before = value(samples(pair.decoder_metrics), "datadist_rpc_errors_total", **labels) or 0
    with grpc.insecure_channel(pair.decoder_daemon.target) as ch:
        with pytest.raises(grpc.RpcError) as info:
            datadist_pb2_grpc.DataDistStub(ch).GetStatus(datadist_pb2.StatusRequest(engine_id=4242), timeout=5)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert value(samples(pair.decoder_metrics), "datadist_rpc_errors_total", **labels) == before + 1


def test_endpoint_paths_and_openmetrics(pair) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with pytest.raises(urllib.error.HTTPError) as info:
        opener.open(f"http://{pair.decoder_metrics}/nope", timeout=5)
    assert info.value.code == 404
    req = urllib.request.Request(f"http://{pair.decoder_metrics}/metrics",
                                 headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    with opener.open(req, timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        assert resp.read().decode().rstrip().endswith("# EOF")


def test_listen_address_forms() -> None:
    assert parse_listen_address("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_listen_address(":9464") == ("127.0.0.1", 9464)
    assert parse_listen_address("9464") == ("127.0.0.1", 9464)
    assert parse_listen_address("[::1]:9464") == ("::1", 9464)
    with pytest.raises(ValueError):
        parse_listen_address("localhost:http")


def test_each_daemon_has_its_own_registry() -> None:
    a, b = DaemonMetrics(), DaemonMetrics()  # same metric names: would raise in one shared registry
    a.rpc_error("Pull", "LLM_TIMEOUT")
    assert a.registry.get_sample_value("datadist_rpc_errors_total", {"method": "Pull", "code": "LLM_TIMEOUT"}) == 1
    assert b.registry.get_sample_value("datadist_rpc_errors_total", {"method": "Pull", "code": "LLM_TIMEOUT"}) is None


def test_metrics_are_off_by_default(tmp_path) -> None:
    from datadistd.process.app import DaemonApp

    async def scenario() -> None:
        cfg = load_config(env={}, overrides={"daemon.socket": str(tmp_path / "d.sock"),
                                             "memory.shm_dir": str(tmp_path)})
        assert cfg.metrics.listen == ""
        app = DaemonApp(cfg)
        await app.start()
        try:
            assert app.metrics_server is None
        finally:
            await app.stop(grace=0)

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_bad_listen_address_is_a_config_error(tmp_path) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "datadistd", "--socket", str(tmp_path / "d.sock"),
                           "--metrics", "localhost:http"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert done.stderr == "datadistd: metrics.listen: expected host:port, got 'localhost:http'\n"
    assert not (tmp_path / "d.sock").exists()


def test_a_failed_transfer_counts_its_status_code_and_no_bytes() -> None:
    from datadistd.core.errors import DataDistError, StatusCode
    from datadistd.ops.metrics import track_transfer

    m = DaemonMetrics()
    with pytest.raises(DataDistError):
        with track_transfer(m, "pull", 2, 1, cache=7) as tracked:
            assert m.registry.get_sample_value("datadist_transfers_in_flight", {"op": "pull", "cluster_id": "2"}) == 1
            raise DataDistError(StatusCode.LLM_TIMEOUT, "peer went away")
        tracked.done(1, 1)  # never reached
    get = m.registry.get_sample_value
    assert get("datadist_transfers_in_flight", {"op": "pull", "cluster_id": "2"}) == 0
    assert get("datadist_transfers_total", {"op": "pull", "cluster_id": "2", "peer_cluster_id": "1",
                                            "outcome": "LLM_TIMEOUT"}) == 1
    assert get("datadist_transfer_bytes_total", {"direction": "in", "cluster_id": "2", "peer_cluster_id": "1"}) is None
    assert get("datadist_transfer_duration_seconds_count", {"op": "pull", "cluster_id": "2"}) is None


#: cycles, each with a peer of its own: a series kept per peer shows from the second on (1,000 cycles took 36 s of
#: the suite and asserted the same)
CYCLES = 100


def _series(address: str) -> list[dict[str, str]]:
    """The labels of every sample a scrape shows."""
    return [s.labels for f in text_string_to_metric_families(scrape(address)) for s in f.samples]


def test_per_peer_series_go_with_their_last_link() -> None:
    """Issue 37, item 9: ``CYCLES`` link/pull/unlink cycles, each with a peer of its own (a decoder engine of a new
    cluster id linking the one prompt engine): both scrapes end where they began, with no series of a peer or
    an engine that is gone. Before, every peer ever seen kept its transfer series (cardinality grew by ~20
    samples a cycle)."""
    pools = {"llm.EnableCacheManager": "1", "llm.EnableRemoteCacheAccessible": "1", "llm.SyncKvCacheWaitTime": "5000",
             "llm.MemPoolConfig": '{"memory_size": 1048576, "page_shift": 16}'}
    desc = common_pb2.CacheDesc(num_tensors=2, shape=[4, 64], data_type=1, placement=common_pb2.PLACEMENT_DEVICE)
    dp, dd = Daemon.start_all([Daemon("m-p", args=["--metrics", "127.0.0.1:0"]),
                               Daemon("m-d", args=["--metrics", "127.0.0.1:0"])])
    try:
        port = free_port()
        with stub(dp) as s:
            prompt = s.Init(datadist_pb2.InitRequest(cluster_id=P, role=common_pb2.ROLE_PROMPT, options={
                **pools, "llm.Role": "Prompt", "llm.listenIpInfo": f"127.0.0.1:{port}"}), timeout=30).engine_id
            s.AllocateCache(datadist_pb2.AllocateCacheRequest(engine_id=prompt, desc=desc, is_blocks=True,
                                                              blocks_key=common_pb2.BlocksCacheKey(cluster_id=P)),
                            timeout=10)
        where = {"prompt": metrics_address(dp), "decoder": metrics_address(dd)}
        cluster = [datadist_pb2.ClusterLink(remote_cluster_id=P, remote_ip_info=[
            datadist_pb2.IpPort(ip="127.0.0.1", port=port)])]

        finalizing: list[grpc.Future] = []   # a finalize waits ~0.2 s for the data plane's accept poll: overlapped

        def cycle(s: datadist_pb2_grpc.DataDistStub, cid: int, look: bool = False) -> None:
            engine = s.Init(datadist_pb2.InitRequest(cluster_id=cid, role=common_pb2.ROLE_DECODER,
                                                     options={**pools, "llm.Role": "Decoder"}), timeout=30).engine_id
            cache = s.AllocateCache(datadist_pb2.AllocateCacheRequest(engine_id=engine, desc=desc, is_blocks=True),
                                    timeout=10).cache_id
            assert s.LinkClusters(datadist_pb2.LinkClustersRequest(engine_id=engine, clusters=cluster,
                                                                   timeout_ms=5000), timeout=15).status == 0
            s.Pull(datadist_pb2.TransferRequest(engine_id=engine, kind=datadist_pb2.TRANSFER_BLOCKS,
                                                remote=blocks_key(P), local_cache_id=cache, remote_blocks=[1],
                                                local_blocks=[2]), timeout=10)
            if look:   # while linked, both ends show the peer's series
                assert {"op": "serve_read", "cluster_id": str(P), "peer_cluster_id": str(cid),
                        "outcome": "success"} in _series(where["prompt"])
                assert {"op": "pull", "cluster_id": str(cid), "peer_cluster_id": str(P),
                        "outcome": "success"} in _series(where["decoder"])
            assert s.UnlinkClusters(datadist_pb2.UnlinkClustersRequest(engine_id=engine, clusters=cluster,
                                                                       timeout_ms=5000), timeout=15).status == 0
            finalizing.append(s.Finalize.future(datadist_pb2.EngineRef(engine_id=engine), timeout=60))

        with stub(dd) as s:
            cycle(s, 1000, look=True)
            finalizing.pop().result()
            before = {side: len(_series(address)) for side, address in where.items()}
            for cid in range(1001, 1000 + CYCLES):
                cycle(s, cid)
            for f in finalizing:
                f.result()
        after = {side: _series(address) for side, address in where.items()}
        print({side: (before[side], len(labels)) for side, labels in after.items()}, "samples after 1 / all cycles")
        gone = {str(cid) for cid in range(1000, 1000 + CYCLES)}
        for side, labels in after.items():
            assert not [x for x in labels if gone & {x.get("peer_cluster_id"), x.get("cluster_id")}], side
            assert len(labels) <= before[side], (side, len(labels), before[side])
    finally:
        for d in (dp, dd):
            d.discard()
