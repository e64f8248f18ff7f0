"""Prometheus metrics: a scrape after real transfers between two daemons shows what moved."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from datadist.v1 import datadist_pb2, datadist_pb2_grpc
from datadistd.config import load_config
from datadistd.metrics import DaemonMetrics, parse_listen_address

from .conftest import BLOCK_BYTES, PULLED, PUSHED, TENSORS, D, P, scrape

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
    from datadistd.app import DaemonApp

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
    from datadistd.metrics import track_transfer

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
