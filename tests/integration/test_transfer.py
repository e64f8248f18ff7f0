"""Link and transfer between two daemons (separate processes) on loopback, byte for byte."""

from __future__ import annotations

import time

import numpy as np
import pytest

from datadist.status import LLMStatusCode as S
from tests.harness import ACL_PLANE, ALL_PLANES, WorkerError, free_port, over_planes
from tests.reliability.common import links

#: transfers run over tcp, nixl (UCX over TCP; the byte-exact ones over shared memory too) and acl-hccl, see
#: ``over_planes``;
#: tests of errors and limits over tcp, one nixl plane and acl-hccl (the simulated Ascend runtime)
pytestmark = pytest.mark.integration

P, D = 1, 2  # prompt / decoder cluster ids
LAYERS = 3
TENSORS = 2 * LAYERS
BLOCKS = 40
BLOCK_SHAPE = (4, 32)  # float16 -> 256 bytes per block per tensor



@pytest.fixture
def pair(daemon_factory, worker_factory):
    """Prompt worker on daemon A (listening), decoder worker on daemon B, linked, paged caches registered."""
    dp, dd = daemon_factory.many("p", "d")
    port = free_port()
    prompt, decoder = worker_factory(dp), worker_factory(dd)
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True, sync_kv_timeout=3000,
                mem_pool=8 << 20)
    decoder.call("init", "DECODER", D, remote_cache_accessible=True, sync_kv_timeout=3000, mem_pool=8 << 20)
    prompt.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE, model_id=0)
    decoder.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE, model_id=0)
    prompt.call("fill", "kv", 1)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    return dp, dd, prompt, decoder, port


@over_planes(*ALL_PLANES)
def test_pull_blocks_random_tables_byte_exact(pair) -> None:
    dp, dd, prompt, decoder, port = pair
    src_all = prompt.call("rows", "kv")
    rng = np.random.default_rng(5)
    expected = np.zeros_like(src_all)
    for case in range(12):
        n = int(rng.integers(1, BLOCKS))
        src = rng.choice(BLOCKS, n, replace=False).tolist()
        dst = rng.choice(BLOCKS, n, replace=False).tolist()
        kw = {}
        if case % 3 == 1:
            start = int(rng.integers(0, LAYERS))
            stop = int(rng.integers(start + 1, LAYERS + 1))
            kw = {"src_layer_range": (start, stop), "dst_layer_range": (start, stop)}
            tensors = list(range(2 * start, 2 * stop))
        else:
            tensors = list(range(TENSORS))
        decoder.call("pull_blocks", P, "kv", src, dst, **kw)
        for t in tensors:
            expected[t, dst] = src_all[t, src]
        np.testing.assert_array_equal(decoder.call("rows", "kv"), expected, err_msg=f"case {case}")


@over_planes()
def test_link_table_and_transport_visible(pair, data_plane) -> None:
    """Both ends say which data plane the link runs on: for nixl, the backend and the UCX transports; for hccl
    the NPU."""
    dp, dd, prompt, decoder, port = pair
    if data_plane.get("DATADISTD_TRANSPORT_NAME") == "hccl":
        label, scheme = "hccl:device0", "hccl+tcp://"
    elif data_plane:
        label, scheme = f"nixl:UCX(UCX_TLS={data_plane['UCX_TLS']})", "nixl+tcp://"
    else:
        label, scheme = "tcp", "tcp://"
    (mine,) = links(dd)
    assert mine.remote_cluster_id == P and mine.state == "established" and mine.transport == label
    assert mine.initiator and mine.streams >= 1
    assert mine.data_endpoint.startswith(scheme)
    (theirs,) = links(dp)
    assert theirs.remote_cluster_id == D and not theirs.initiator and theirs.transport == label


def test_link_errors(pair, daemon_factory) -> None:
    dp, dd, prompt, decoder, port = pair
    assert decoder.call("link", P, "127.0.0.1", port) == (S.LLM_ALREADY_LINK, [S.LLM_ALREADY_LINK])
    dead_port = free_port()
    code, codes = decoder.call("link", 9, "127.0.0.1", dead_port, timeout=1000)
    assert code == codes[0] and code in (S.LLM_LINK_FAILED, S.LLM_TIMEOUT)
    code, codes = decoder.call("link", 3, "127.0.0.1", port)  # wrong cluster id at that address
    assert code == S.LLM_LINK_FAILED
    with pytest.raises(WorkerError) as info:
        decoder.call("pull_blocks", 42, "kv", [0], [0])
    assert info.value.status_code == S.LLM_NOT_YET_LINK
    assert decoder.call("unlink", 42, "127.0.0.1", port) == (S.LLM_NOT_YET_LINK, [S.LLM_NOT_YET_LINK])


def test_cluster_num_exceed_limit(pair) -> None:
    dp, dd, prompt, decoder, port = pair
    code, codes = decoder.call("link_many", list(range(100, 117)), port)
    assert code == S.LLM_CLUSTER_NUM_EXCEED_LIMIT and codes == [S.LLM_CLUSTER_NUM_EXCEED_LIMIT] * 17


@over_planes("tcp", "nixl-ucx-tcp", ACL_PLANE)
def test_pull_errors_have_spec_codes(pair) -> None:
    dp, dd, prompt, decoder, port = pair
    with pytest.raises(WorkerError) as info:  # no blocks cache bound to model_id 5 on the prompt
        decoder.call("pull_blocks", P, "kv", [0], [0], model_id=5)
    assert info.value.status_code == S.LLM_KV_CACHE_NOT_EXIST
    with pytest.raises(WorkerError) as info:  # out-of-range source block: refused before any byte moves
        decoder.call("pull_blocks", P, "kv", [BLOCKS], [0])
    assert info.value.status_code == S.LLM_PARAM_INVALID
    with pytest.raises(WorkerError) as info:  # own cluster id
        decoder.call("pull_blocks", D, "kv", [0], [0])
    assert info.value.status_code == S.LLM_PARAM_INVALID
    assert not decoder.call("rows", "kv").any()


@over_planes(*ALL_PLANES)
def test_push_blocks(pair) -> None:
    dp, dd, prompt, decoder, port = pair
    decoder.call("fill", "kv", 2)
    mine = decoder.call("rows", "kv")
    before = prompt.call("rows", "kv")
    decoder.call("push_blocks", P, "kv", [3, 4, 9], [20, 0, 1])
    after = prompt.call("rows", "kv")
    expected = before.copy()
    expected[:, [20, 0, 1]] = mine[:, [3, 4, 9]]
    np.testing.assert_array_equal(after, expected)


@over_planes()
def test_pull_cache_consumes_allocated_key(daemon_factory, worker_factory) -> None:
    dp, dd = daemon_factory.many("p", "d")
    port = free_port()
    prompt, decoder = worker_factory(dp), worker_factory(dd)
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", mem_pool=8 << 20)
    decoder.call("init", "DECODER", D, mem_pool=8 << 20)  # not remote-cache-accessible: CacheKey pulls allowed
    assert prompt.call("allocate", "c", 2, (4, 64), dtype="uint8", keys=[(10, 0), (11, 0), (12, 0)]) == 1
    prompt.call("fill", "c", 4)
    decoder.call("allocate", "c", 2, (4, 64), dtype="uint8")
    src = prompt.call("rows", "c")
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    decoder.call("pull_cache", P, "c", ("key", 10, 0), batch_index=2)
    np.testing.assert_array_equal(decoder.call("rows", "c")[:, 2], src[:, 0])
    with pytest.raises(WorkerError) as info:  # the key was consumed by the successful pull
        decoder.call("pull_cache", P, "c", ("key", 10, 0))
    assert info.value.status_code == S.LLM_KV_CACHE_NOT_EXIST
    # by id and index: the slot of key (11, 0); that consumes key 11 too
    decoder.call("pull_cache", P, "c", ("id", 1, 1), batch_index=1)
    np.testing.assert_array_equal(decoder.call("rows", "c")[:, 1], src[:, 1])
    with pytest.raises(WorkerError) as info:
        decoder.call("pull_cache", P, "c", ("key", 11, 0))
    assert info.value.status_code == S.LLM_KV_CACHE_NOT_EXIST
    # layer-wise pull of key 12: consumed only once every tensor was pulled
    decoder.call("pull_cache", P, "c", ("key", 12, 0), src_layer_range=(0, 1), dst_layer_range=(0, 1),
                 tensor_num_per_layer=1)
    decoder.call("pull_cache", P, "c", ("key", 12, 0), src_layer_range=(1, 2), dst_layer_range=(1, 2),
                 tensor_num_per_layer=1)
    with pytest.raises(WorkerError) as info:
        decoder.call("pull_cache", P, "c", ("key", 12, 0))
    assert info.value.status_code == S.LLM_KV_CACHE_NOT_EXIST
    # the prompt deallocates: with no keys left the memory is gone, and so is the cache id
    prompt.call("deallocate", "c")
    with pytest.raises(WorkerError) as info:
        decoder.call("pull_cache", P, "c", ("id", 1, 0))
    assert info.value.status_code == S.LLM_KV_CACHE_NOT_EXIST
    with pytest.raises(WorkerError) as info:  # a pull larger than the remote slot is refused before bytes move
        decoder.call("pull_cache", P, "c", ("id", 1, 0), size=65)
    assert info.value.status_code == S.LLM_PARAM_INVALID


@over_planes()
def test_push_cache(pair) -> None:
    dp, dd, prompt, decoder, port = pair
    prompt.call("allocate", "c", 2, (3, 32), dtype="uint8")
    decoder.call("allocate", "c", 2, (3, 32), dtype="uint8")
    decoder.call("fill", "c", 6)
    cache_id = 2  # 1 = the registered kv cache
    decoder.call("push_cache", P, "c", cache_id, batch_index=2, src_batch_index=1)
    np.testing.assert_array_equal(prompt.call("rows", "c")[:, 2], decoder.call("rows", "c")[:, 1])
    assert not prompt.call("rows", "c")[:, :2].any()


@over_planes("tcp", "nixl-ucx-tcp", ACL_PLANE)
def test_peer_killed_mid_link_fails_as_lost_then_relink_works(daemon_factory, worker_factory) -> None:
    dp, dd = daemon_factory.many("p", "d")
    port = free_port()
    prompt, decoder = worker_factory(dp), worker_factory(dd)
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}")
    decoder.call("init", "DECODER", D, sync_kv_timeout=2000)
    prompt.call("register_blocks", "kv", 2, 8, (16, 16), model_id=0)
    decoder.call("register_blocks", "kv", 2, 8, (16, 16))
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    dp.kill()
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as info:
        decoder.call("pull_blocks", P, "kv", [0], [0])
    # the connection is gone, no deadline passed: CANN's code for a failed communication, not LLM_TIMEOUT
    assert info.value.status_code == S.LLM_FAILED, str(info.value)
    assert "link_clusters again" in str(info.value)
    assert time.monotonic() - t0 < 2.0 + 1.5
    # the peer comes back: a fresh daemon and worker on the same address; relink and pull
    dp2 = daemon_factory("p2")
    prompt.kill()
    prompt2 = worker_factory(dp2)
    prompt2.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}")
    prompt2.call("register_blocks", "kv", 2, 8, (16, 16), model_id=0)
    prompt2.call("fill", "kv", 3)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    decoder.call("pull_blocks", P, "kv", [5], [1])
    np.testing.assert_array_equal(decoder.call("rows", "kv")[:, 1], prompt2.call("rows", "kv")[:, 5])


def test_local_path_same_daemon(daemon_factory, worker_factory) -> None:
    d = daemon_factory()
    port = free_port()
    prompt, decoder = worker_factory(d), worker_factory(d)
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}")
    decoder.call("init", "DECODER", D)
    prompt.call("register_blocks", "kv", 2, 8, (16, 16), model_id=0)
    decoder.call("register_blocks", "kv", 2, 8, (16, 16))
    prompt.call("fill", "kv", 8)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    decoder.call("pull_blocks", P, "kv", [1, 2, 3], [7, 6, 5])
    np.testing.assert_array_equal(decoder.call("rows", "kv")[:, [7, 6, 5]], prompt.call("rows", "kv")[:, [1, 2, 3]])
    initiator = [link for link in links(d) if link.initiator]
    assert initiator[0].transport == "local" and initiator[0].streams == 0
    assert initiator[0].bytes_in == 3 * 2 * 16 * 16 * 2


def test_grpc_and_attach_transfer_paths_agree(daemon_factory, worker_factory) -> None:
    """Pulls and pushes go on the attach connection by default; DATADIST_LOCAL_TRANSFERS=grpc sends them as the
    DataDist Pull/Push RPCs. Both paths move the same bytes and report the same errors."""
    dp, dd = daemon_factory.many("p", "d")
    port = free_port()
    prompt = worker_factory(dp)
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True, sync_kv_timeout=3000)
    prompt.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE, model_id=0)
    prompt.call("fill", "kv", 3)
    src_all = prompt.call("rows", "kv")
    for i, mode in enumerate(("grpc", "attach")):
        decoder = worker_factory(dd, DATADIST_LOCAL_TRANSFERS=mode)
        decoder.call("init", "DECODER", D + i, remote_cache_accessible=True, sync_kv_timeout=3000)
        decoder.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE, model_id=0)
        assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
        decoder.call("pull_blocks", P, "kv", [5, 1, 30], [0, 7, 8])
        np.testing.assert_array_equal(decoder.call("rows", "kv", None, [0, 7, 8]), src_all[:, [5, 1, 30]])
        decoder.call("fill", "kv", 9 + i)
        decoder.call("push_blocks", P, "kv", [2], [20 + i])   # local block 2 -> the prompt's block 20 + i
        np.testing.assert_array_equal(prompt.call("rows", "kv", None, [20 + i]), decoder.call("rows", "kv", None, [2]))
        with pytest.raises(WorkerError) as info:
            decoder.call("pull_blocks", P, "kv", [BLOCKS], [0])
        assert info.value.status_code == S.LLM_PARAM_INVALID, mode
        decoder.call("unlink", P, "127.0.0.1", port)
        decoder.call("finalize")
