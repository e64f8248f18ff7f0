"""Errors a worker sees say what happened (issue 29, findings 6 and 7): which block list is wrong, why a link
failed, and no finalize error after the daemon released the engine itself."""

from __future__ import annotations

import pytest

from datadist.status import LLMStatusCode as S
from tests.harness import WorkerError, free_port

pytestmark = pytest.mark.integration

P, D = 1, 2
BLOCKS = 8


def test_blocks_out_of_range_at_the_owner_name_their_list(daemon_factory, worker_factory) -> None:
    """The other end's list is checked by its owner: its message names src_blocks (pull) or dst_blocks (push)."""
    dp, dd = daemon_factory.many("p", "d")
    port = free_port()
    prompt, decoder = worker_factory(dp), worker_factory(dd)
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True)
    decoder.call("init", "DECODER", D, remote_cache_accessible=True)
    prompt.call("register_blocks", "kv", 2, BLOCKS, (16, 16), model_id=0)
    decoder.call("register_blocks", "kv", 2, BLOCKS, (16, 16), model_id=0)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    with pytest.raises(WorkerError) as info:
        decoder.call("pull_blocks", P, "kv", [0, 1000], [0, 1])
    assert info.value.status_code == S.LLM_PARAM_INVALID
    assert f"src_blocks[1] = 1000 out of range [0, {BLOCKS}): the source cache has {BLOCKS} blocks" in str(info.value)
    with pytest.raises(WorkerError) as info:
        decoder.call("push_blocks", P, "kv", [0, 1], [1000, 1])
    assert info.value.status_code == S.LLM_PARAM_INVALID
    assert f"dst_blocks[0] = 1000 out of range [0, {BLOCKS}): the destination cache has {BLOCKS} blocks" \
        in str(info.value)


def test_a_pull_moves_bytes_whatever_the_data_types_as_cann_does(daemon_factory, worker_factory) -> None:
    """CANN's transfer request carries no data type (hixl common.h TransferCacheReq; send_state.cc CheckParam
    compares counts and sizes): fp16 blocks pulled into an int16 cache of the same block size arrive as bytes
    (docs/choices.md, "What CANN checks")."""
    dp, dd = daemon_factory.many("p", "d")
    port = free_port()
    prompt, decoder = worker_factory(dp), worker_factory(dd)
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True)
    decoder.call("init", "DECODER", D, remote_cache_accessible=True)
    prompt.call("register_blocks", "kv", 2, BLOCKS, (16, 16), dtype="float16", model_id=0)
    decoder.call("register_blocks", "kv", 2, BLOCKS, (16, 16), dtype="int16")
    prompt.call("fill", "kv", 3)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    decoder.call("pull_blocks", P, "kv", [1, 2], [5, 6])
    assert (decoder.call("rows", "kv", None, [5, 6]) == prompt.call("rows", "kv", None, [1, 2])).all()


def test_a_failed_link_tells_the_worker_why(daemon_factory, worker_factory) -> None:
    """link_clusters returns codes only (CANN's signature); the reason used to stay in the daemon's log."""
    dd = daemon_factory("d")
    decoder = worker_factory(dd)
    decoder.call("init", "DECODER", D)
    decoder.call("capture_logs")
    nobody = free_port()
    code, codes = decoder.call("link", P, "127.0.0.1", nobody)
    assert code == codes[0] == S.LLM_LINK_FAILED
    logged = decoder.call("logs", "link_clusters")
    assert f"link_clusters: cluster {P}: LLM_LINK_FAILED: " in logged and f"127.0.0.1:{nobody}" in logged
    assert "Connection refused" in logged or "unreachable" in logged


def test_link_and_unlink_log_every_cluster_that_failed_and_why(daemon_factory, worker_factory) -> None:
    """More than 16 clusters in one call: refused whole (CANN's LLM_CLUSTER_NUM_EXCEED_LIMIT), and each cluster's
    reason names the limit; unlink_clusters logs its failures as link_clusters does (issue 37, item 6)."""
    dd = daemon_factory("d")
    decoder = worker_factory(dd)
    decoder.call("init", "DECODER", D)
    decoder.call("capture_logs")
    port = free_port()
    many = list(range(100, 117))
    for op, call in (("link_many", "link_clusters"), ("unlink_many", "unlink_clusters")):
        code, codes = decoder.call(op, many, port)
        assert code == S.LLM_CLUSTER_NUM_EXCEED_LIMIT and codes == [S.LLM_CLUSTER_NUM_EXCEED_LIMIT] * 17
        logged = decoder.call("logs", f"{call}: cluster 116")
        for cid in many:
            assert (f"{call}: cluster {cid}: LLM_CLUSTER_NUM_EXCEED_LIMIT: 17 clusters in one call, more than the "
                    "limit of 16") in logged, logged
    assert decoder.call("unlink_many", [7, 8], port) == (S.LLM_NOT_YET_LINK, [S.LLM_NOT_YET_LINK] * 2)
    logged = decoder.call("logs", "unlink_clusters: cluster 8")
    for cid in (7, 8):
        assert f"unlink_clusters: cluster {cid}: LLM_NOT_YET_LINK: no link to cluster {cid}" in logged, logged


@pytest.mark.parametrize("restart", [True, False], ids=["restarted", "stopped"])
def test_no_finalize_error_after_the_daemon_released_the_engine(restart: bool, daemon_factory,
                                                                worker_factory) -> None:
    """After a daemon stop the worker was told its engine is released; finalize then has nothing to report."""
    d = daemon_factory("d")
    worker = worker_factory(d)
    worker.call("init", "DECODER", D)
    worker.call("capture_logs")
    assert d.stop() == 0
    worker.call("logs", "is gone")
    if restart:
        d.start()
    worker.call("finalize")
    logged = worker.call("logs", "finalize")
    assert "already released by datadistd" in logged, logged
    assert "failed" not in logged, logged


def test_a_host_cache_not_remote_accessible_names_the_fix(daemon_factory, worker_factory) -> None:
    """Issue 44, trip 10: a HOST cache registered without remote_accessible (its default is False) was refused to a
    pull and a push with no hint of the fix; the refusal names it: remote_accessible=True, before linking."""
    dp, dd = daemon_factory.many("p", "d")
    port = free_port()
    prompt, decoder = worker_factory(dp), worker_factory(dd)
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True)
    decoder.call("init", "DECODER", D, remote_cache_accessible=True)
    prompt.call("register_blocks", "kv", 2, BLOCKS, (16, 16), model_id=0, placement="HOST")
    decoder.call("register_blocks", "kv", 2, BLOCKS, (16, 16), model_id=0)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    for op in ("pull_blocks", "push_blocks"):
        with pytest.raises(WorkerError) as info:
            decoder.call(op, P, "kv", [0, 1], [0, 1])
        assert info.value.status_code == S.LLM_KV_CACHE_NOT_EXIST, info.value
        assert "is not remotely accessible" in str(info.value) and "remote_accessible=True" in str(info.value), \
            info.value


def test_a_killed_daemon_is_gone_and_link_calls_still_return_codes(daemon_factory, worker_factory) -> None:
    """Issue 44, trips 9 and 10: after a SIGKILL the worker was told its daemon "is stopping", and unlink_clusters
    raised where CANN returns codes (so do both link calls: LLM_UNLINK_FAILED / LLM_LINK_FAILED per cluster)."""
    d = daemon_factory("d")
    worker = worker_factory(d)
    worker.call("init", "DECODER", D)
    worker.call("capture_logs")
    d.kill()
    logged = worker.call("logs", "is gone")
    assert "is gone (it stopped or died)" in logged and "is stopping" not in logged, logged
    assert worker.call("unlink", P, "127.0.0.1", free_port(), 1000) == (S.LLM_UNLINK_FAILED, [S.LLM_UNLINK_FAILED])
    assert worker.call("link", P, "127.0.0.1", free_port(), 1000) == (S.LLM_LINK_FAILED, [S.LLM_LINK_FAILED])
    assert "unlink_clusters: 1 clusters: LLM_UNLINK_FAILED" in worker.call("logs", "unlink_clusters: 1 clusters")


@pytest.mark.parametrize("bad", ["data_ports", "secret_file"])
def test_embedded_init_refuses_bad_config_with_llm_exception(bad: str, monkeypatch, tmp_path) -> None:
    """Issue 44, trip 9: an embedded init with a bad DATADISTD_* variable raised the daemon's ConfigError (a
    ValueError), one with a secret file others may read its UnsafeSecret: both are LLM_PARAM_INVALID, naming it."""
    import llm_datadist as ld

    if bad == "data_ports":
        monkeypatch.setenv("DATADISTD_TRANSPORT_DATA_PORTS", "26100-high")
        named = "transport.data_ports"
    else:
        secret = tmp_path / "peer.secret"
        secret.write_text("a-secret\n")
        secret.chmod(0o644)
        monkeypatch.setenv("DATADISTD_PEER_SECRET_FILE", str(secret))
        named = str(secret)
    cfg = ld.LLMConfig()
    cfg.device_id = 0
    dd = ld.LLMDataDist(ld.LLMRole.DECODER, D)
    with pytest.raises(ld.LLMException) as info:
        dd.init(cfg.generate_options())
    assert info.value.status_code == S.LLM_PARAM_INVALID
    assert "embedded datadistd did not start" in str(info.value) and named in str(info.value), info.value
    dd.finalize()


# ---- mismatches name tensors, layers, block shapes and the option that fixes them (issue 37, item 7) ----------

LAYOUT = "block shape [16, 16] of DT_FLOAT16, 512 bytes per tensor and block"


@pytest.fixture
def mismatched(daemon_factory, worker_factory):
    """A linked prompt (cluster P) and decoder (cluster D); each test registers the caches it pairs."""
    dp, dd = daemon_factory.many("p", "d")
    port = free_port()
    prompt, decoder = worker_factory(dp), worker_factory(dd)
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True)
    decoder.call("init", "DECODER", D, remote_cache_accessible=True)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    return prompt, decoder


def _refused(call) -> str:  # noqa: ANN001
    with pytest.raises(WorkerError) as info:
        call()
    assert info.value.status_code == S.LLM_PARAM_INVALID, info.value
    return str(info.value)


def test_a_tensor_count_mismatch_names_both_counts_and_the_layer_ranges_that_fix_it(mismatched) -> None:
    """8 tensors (4 layers of K and V) at the prompt, 4 at the decoder: not only byte counts."""
    prompt, decoder = mismatched
    pid = prompt.call("register_blocks", "kv", 8, BLOCKS, (16, 16), model_id=0)
    did = decoder.call("register_blocks", "kv", 4, BLOCKS, (16, 16))
    prompt.call("fill", "kv", 5)
    said = _refused(lambda: decoder.call("pull_blocks", P, "kv", [0, 1], [2, 3]))
    assert f"tensor counts differ: the source cache {pid} of cluster {P} has 8 tensors ({LAYOUT}), the " \
           f"destination cache {did} has 4 tensors ({LAYOUT}); move the layers both have -- " \
           "src_layer_range=range(0, 2) and dst_layer_range=range(0, 2)" in said, said
    assert "or register both caches with the same number of tensors (CacheDesc num_tensors)" in said, said
    decoder.call("pull_blocks", P, "kv", [0, 1], [2, 3], src_layer_range=(0, 2), dst_layer_range=(0, 2))  # the fix
    assert (decoder.call("rows", "kv", None, [2, 3]) == prompt.call("rows", "kv", [0, 1, 2, 3], [0, 1])).all()
    said = _refused(lambda: decoder.call("push_blocks", P, "kv", [0], [1]))   # the other way: the owner is dst
    assert f"tensor counts differ: the destination cache {pid} of cluster {P} has 8 tensors ({LAYOUT}), the " \
           f"source cache {did} has 4 tensors" in said, said


def test_a_tensor_count_mismatch_is_named_alike_between_two_engines_of_one_daemon(daemon_factory,
                                                                                  worker_factory) -> None:
    """The same refusal over a same-daemon link (a copy, ``LocalPath``): the owner engine's refusal is explained as
    over a remote link, both ways."""
    d = daemon_factory("one")
    port = free_port()
    prompt, decoder = worker_factory(d), worker_factory(d)
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True)
    decoder.call("init", "DECODER", D, remote_cache_accessible=True)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    pid = prompt.call("register_blocks", "kv", 8, BLOCKS, (16, 16), model_id=0)
    did = decoder.call("register_blocks", "kv", 4, BLOCKS, (16, 16))
    said = _refused(lambda: decoder.call("pull_blocks", P, "kv", [0, 1], [2, 3]))
    assert f"tensor counts differ: the source cache {pid} of cluster {P} has 8 tensors ({LAYOUT}), the " \
           f"destination cache {did} has 4 tensors ({LAYOUT})" in said, said
    said = _refused(lambda: decoder.call("push_blocks", P, "kv", [0], [1]))
    assert f"tensor counts differ: the destination cache {pid} of cluster {P} has 8 tensors" in said, said


def test_a_block_size_mismatch_names_the_block_shapes_and_the_option(mismatched) -> None:
    prompt, decoder = mismatched
    pid = prompt.call("register_blocks", "kv", 2, BLOCKS, (16, 16), model_id=0)
    did = decoder.call("register_blocks", "kv", 2, BLOCKS, (16, 32))
    said = _refused(lambda: decoder.call("pull_blocks", P, "kv", [0, 1], [2, 3]))
    assert f"block sizes differ: the source cache {pid} of cluster {P} has 2 tensors ({LAYOUT}), the destination " \
           f"cache {did} has 2 tensors (block shape [16, 32] of DT_FLOAT16, 1024 bytes per tensor and block); " \
           "register both caches with the same number of tensors and block shape (CacheDesc num_tensors, shape[1:] " \
           "and data_type)" in said, said


def test_one_layer_range_against_a_whole_cache_names_both_lengths(mismatched) -> None:
    """(Two ranges of different lengths are refused by the client already, naming both.)"""
    prompt, decoder = mismatched
    prompt.call("register_blocks", "kv", 8, BLOCKS, (16, 16), model_id=0)
    decoder.call("register_blocks", "kv", 8, BLOCKS, (16, 16))
    said = _refused(lambda: decoder.call("pull_blocks", P, "kv", [0], [0], src_layer_range=(0, 2)))
    assert "layer ranges differ in length: src_layer_range=range(0, 2) covers 2 layers = 4 tensors at " \
           "tensor_num_per_layer=2, no dst_layer_range: all 8 tensors of the local cache (4 layers); give " \
           "src_layer_range and dst_layer_range the same length" in said, said


def test_a_swap_between_mismatched_caches_names_both_layouts(daemon_factory, worker_factory) -> None:
    worker = worker_factory(daemon_factory("d"))
    worker.call("init", "DECODER", D, mem_pool=1 << 20, host_mem_pool=1 << 20)
    dev = worker.call("allocate", "dev", 2, (BLOCKS, 16, 16), blocks=True)
    host = worker.call("allocate", "host", 4, (BLOCKS, 16, 16), blocks=True, placement="HOST")
    said = _refused(lambda: worker.call("swap_blocks", "dev", "host", {0: 1}))
    assert f"swap_blocks: tensor counts differ: the source cache {dev} has 2 tensors (block shape [16, 16] of " \
           f"DT_FLOAT16, 512 bytes per tensor and block), the destination cache {host} has 4 tensors" in said, said
    assert "swap between caches of the same CacheDesc num_tensors and block size" in said, said


def test_embedded_init_under_a_service_with_a_state_directory_uses_the_users_secret(monkeypatch, tmp_path) -> None:
    """A worker run by a systemd unit of its own with ``StateDirectory=`` (mode 0755 by default) inherits
    ``$STATE_DIRECTORY``: its embedded daemon took it for a datadist node's state directory, refused to start (the
    directory is not 0700) or wrote a peer secret into the service's directory, where the user's other workers
    would not find it. It uses this user's own secret, as every embedded daemon does."""
    import llm_datadist as ld

    service_state = tmp_path / "vllm-state"
    service_state.mkdir(mode=0o755)
    service_state.chmod(0o755)
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("STATE_DIRECTORY", str(service_state))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    cfg = ld.LLMConfig()
    cfg.device_id = 0
    dd = ld.LLMDataDist(ld.LLMRole.DECODER, D)
    try:
        dd.init(cfg.generate_options())
    finally:
        dd.finalize()
    assert list(service_state.iterdir()) == []
    assert (runtime / "datadist" / "peer.secret").is_file()
