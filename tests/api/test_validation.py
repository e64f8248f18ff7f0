"""Every validation rule of the spec for the APIs of issue 4, with CANN's exception type and status code.

Tier rules (spec §2): wrong type -> TypeError, integer out of range -> ValueError, semantic rule ->
LLMException(LLM_PARAM_INVALID) unless the spec names another code, not initialized -> RuntimeError.
One in-process ``LLMDataDist`` (embedded daemon) per test; no peer needed for these.
"""

from __future__ import annotations

import numpy as np
import pytest

import llm_datadist as ld
from llm_datadist import CacheDesc, DataType, LLMException, LLMRole, Placement
from llm_datadist import LLMStatusCode as S

U8 = DataType.DT_UINT8


class Never(ld.LayerSynchronizer):
    def synchronize_layer(self, layer_index, timeout_in_millis):  # noqa: ANN001, ANN201
        return False


def code_of(fn) -> S:  # noqa: ANN001
    with pytest.raises(LLMException) as info:
        fn()
    return info.value.status_code


def pinv(fn) -> None:  # noqa: ANN001
    assert code_of(fn) is S.LLM_PARAM_INVALID


# ---- transfer_cache_async (v2, spec §5.7 / §7) -----------------------------------------------------

@pytest.fixture
def rca(local_dd):
    dd = local_dd("PROMPT", rca=True)
    cm = dd.cache_manager
    blocks = cm.allocate_blocks_cache(CacheDesc(4, [8, 64], U8))
    cont = cm.allocate_cache(CacheDesc(4, [2, 64], U8))
    return dd, cm, blocks, cont


def test_transfer_cache_async_argument_rules(rca) -> None:
    dd, cm, blocks, cont = rca
    cfg = ld.TransferWithCacheKeyConfig(ld.BlocksCacheKey(9, 0), range(0, 2), range(0, 2))
    tca = cm.transfer_cache_async
    with pytest.raises(TypeError):
        tca(None, Never(), [cfg])                                   # src_cache must be a Cache
    with pytest.raises(TypeError):
        tca(blocks, Never(), [cfg], src_block_indices=(0, "1"), dst_block_indices=[0, 1])
    with pytest.raises(ValueError):
        tca(blocks, Never(), [cfg], src_block_indices=[0, -1], dst_block_indices=[0, 1])
    with pytest.raises(ValueError):
        tca(cont, Never(), [cfg], dst_block_indices=[0], dst_block_memory_size=-1)
    pinv(lambda: tca(blocks, Never(), [cfg], src_block_indices=[0]))            # blocks -> cache unsupported
    pinv(lambda: tca(blocks, Never(), [cfg], src_block_indices=[0], dst_block_indices=[0, 1]))  # lengths
    pinv(lambda: tca(cont, Never(), [cfg], dst_block_indices=[0]))              # cache -> blocks needs the size
    with pytest.raises(TypeError):
        tca(blocks, object(), [cfg], [0], [0])                                   # layer_synchronizer type
    with pytest.raises(TypeError):                                               # RCA: TransferWithCacheKeyConfig only
        tca(blocks, Never(), [ld.TransferConfig(9, [1, 2, 3, 4])], [0], [0])
    with pytest.raises(TypeError):
        tca(blocks, Never(), cfg, [0], [0])                                      # configs must be a list/tuple
    pinv(lambda: tca(cont, Never(), [cfg], dst_block_memory_size=64))           # size while dst is not blocks
    by_id = ld.TransferWithCacheKeyConfig(ld.CacheKeyByIdAndIndex(9, 1), range(0, 2), range(0, 2))
    assert tca(cont, Never(), [by_id], dst_block_memory_size=0).synchronize() is S.LLM_PARAM_INVALID  # 0 allowed
    # no dst_block_indices: CANN's cache-to-cache path, accepted (the synchronizer then refuses layer 0)
    assert tca(cont, Never(), [cfg]).synchronize() is S.LLM_PARAM_INVALID
    odd = cm.allocate_blocks_cache(CacheDesc(3, [8, 64], U8))
    pinv(lambda: tca(odd, Never(), [cfg], [0], [0]))                              # num_tensors must be even
    pinv(lambda: tca(blocks, Never(), [ld.TransferWithCacheKeyConfig(ld.CacheKeyByIdAndIndex(9, 1), range(0, 2),
                                                                       range(0, 2), 1)], [0], [0]))  # batch != 0
    pinv(lambda: tca(blocks, Never(), [ld.TransferWithCacheKeyConfig(ld.BlocksCacheKey(9), range(1, 3),
                                                                       range(0, 2))], [0], [0]))    # layer 2 of 2
    host = cm.register_blocks_cache(CacheDesc(2, [8, 64], U8, Placement.HOST),
                                    [np.zeros(512, np.uint8).ctypes.data for _ in range(2)])
    pinv(lambda: tca(host, Never(), [cfg], [0], [0]))                              # HOST source refused
    assert tca(blocks, Never(), [], [0], [0]).get_results() == []                # no configs: nothing to do


def test_transfer_configs_validate_themselves() -> None:
    with pytest.raises(TypeError):
        ld.TransferWithCacheKeyConfig(ld.BlocksCacheKey(1), None, range(0, 1))   # both ranges required
    with pytest.raises(TypeError):
        ld.TransferWithCacheKeyConfig(ld.CacheKey(1, 1), range(0, 1), range(0, 1))
    pinv(lambda: ld.TransferWithCacheKeyConfig(ld.BlocksCacheKey(1), range(0, 2), range(0, 1)))  # lengths differ
    pinv(lambda: ld.TransferWithCacheKeyConfig(ld.BlocksCacheKey(1), range(0, 1), range(0, 1), 1))
    pinv(lambda: ld.TransferWithCacheKeyConfig(ld.BlocksCacheKey(1), range(0, 4, 2), range(0, 4, 2)))  # step 1
    pinv(lambda: ld.TransferConfig(1, [1, 2, 3], range(0, 2)))                   # 2 addresses per layer
    pinv(lambda: ld.TransferConfig(1, [1, 2], range(1, 1)))                      # start < stop
    with pytest.raises(ValueError):
        ld.TransferConfig(-1, [1, 2])
    with pytest.raises(TypeError):
        ld.TransferConfig(1, [1, "2"])


def test_transfer_cache_async_daemon_rules(rca) -> None:
    dd, cm, blocks, cont = rca
    tca = cm.transfer_cache_async
    own = ld.TransferWithCacheKeyConfig(ld.BlocksCacheKey(dd.cluster_id), range(0, 1), range(0, 1))
    pinv(lambda: tca(blocks, Never(), [own], [0], [0]))                            # to its own cluster id
    pinv(lambda: tca(blocks, Never(), [ld.TransferWithCacheKeyConfig(ld.BlocksCacheKey(9), range(0, 1), range(0, 1))],
                     [8], [0]))                                                    # source block out of range
    pinv(lambda: tca(cont, Never(), [ld.TransferWithCacheKeyConfig(ld.BlocksCacheKey(9), range(0, 1), range(0, 1))],
                     None, [0, 1], 64))                                            # 2 x 64 bytes > the 64-byte slot

    class Yes(ld.LayerSynchronizer):
        def synchronize_layer(self, layer_index, timeout_in_millis):  # noqa: ANN001, ANN201
            return True

    task = tca(blocks, Yes(), [ld.TransferWithCacheKeyConfig(ld.BlocksCacheKey(9), range(0, 2), range(0, 2))],
               [0], [0])
    assert task.get_results() == [S.LLM_NOT_YET_LINK]                              # no link to cluster 9
    assert task.synchronize() is S.LLM_NOT_YET_LINK


def test_cache_task_timeouts_give_the_default_code(local_dd) -> None:
    import threading

    dd = local_dd("PROMPT", rca=True)
    gate = threading.Event()

    class Wait(ld.LayerSynchronizer):
        def synchronize_layer(self, layer_index, timeout_in_millis):  # noqa: ANN001, ANN201
            assert timeout_in_millis is None  # CANN: "not supported yet", always None
            gate.wait(30)
            return False

    blocks = dd.cache_manager.allocate_blocks_cache(CacheDesc(2, [4, 16], U8))
    task = dd.cache_manager.transfer_cache_async(
        blocks, Wait(), [ld.TransferWithCacheKeyConfig(ld.BlocksCacheKey(9), range(0, 1), range(0, 1))], [0], [0])
    assert task.synchronize(10) is S.LLM_TIMEOUT
    assert task.get_results(10) == [S.LLM_TIMEOUT]
    gate.set()
    assert task.get_results() == [S.LLM_PARAM_INVALID]


def test_non_rca_takes_transfer_config_only(local_dd) -> None:
    dd = local_dd("PROMPT", rca=False)
    blocks = dd.cache_manager.allocate_blocks_cache(CacheDesc(2, [4, 16], U8))
    with pytest.raises(TypeError):
        dd.cache_manager.transfer_cache_async(
            blocks, Never(), [ld.TransferWithCacheKeyConfig(ld.BlocksCacheKey(9), range(0, 1), range(0, 1))], [0], [0])
    task = dd.cache_manager.transfer_cache_async(blocks, Never(), [ld.TransferConfig(9, [4096, 8192])], [0], [0], 16)
    assert task.get_results() == [S.LLM_PARAM_INVALID]  # synchronize_layer(0) -> False


# ---- v2 pull_blocks / pull_cache (spec §5) ---------------------------------------------------------

@pytest.mark.parametrize("rca_on", [False, True], ids=["plain", "rca"])
def test_v2_pull_argument_rules(local_dd, rca_on) -> None:
    """Each rule with its exception type and code, and what passes: the checks test the usual arguments inline
    and call the full check only to word a refusal, so odd but valid arguments (bools as ints, subclasses) pass
    as before and odd invalid ones (a float -1) are still refused."""
    dd = local_dd("DECODER", rca=rca_on)
    cm = dd.cache_manager
    blocks = cm.allocate_blocks_cache(CacheDesc(2, [4, 16], U8))
    cont = cm.allocate_cache(CacheDesc(2, [2, 16], U8))
    peer = ld.BlocksCacheKey(8)
    by_id = ld.CacheKeyByIdAndIndex(8, 3, 0)
    for bad_key in (None, "key", 8):
        with pytest.raises(TypeError):
            cm.pull_blocks(bad_key, blocks, [0], [0])
        with pytest.raises(TypeError):
            cm.pull_cache(bad_key, cont)
    for bad_cache in (None, blocks.cache_desc):
        with pytest.raises(TypeError):
            cm.pull_blocks(peer, bad_cache, [0], [0])
        with pytest.raises(TypeError):
            cm.pull_cache(by_id, bad_cache)
    for bad_list, error in (("0", TypeError), ({0}, TypeError), ([0.0], TypeError), ([-1], ValueError),
                            ([2**64], ValueError)):
        with pytest.raises(error):
            cm.pull_blocks(peer, blocks, bad_list, [0])
        with pytest.raises(error):
            cm.pull_blocks(peer, blocks, [0], bad_list)
    pinv(lambda: cm.pull_blocks(peer, cont, [0], [0]))                      # a contiguous destination
    pinv(lambda: cm.pull_blocks(peer, blocks, [0], []))                     # no destination blocks
    pinv(lambda: cm.pull_blocks(peer, blocks, None, [0]))                   # a BlocksCacheKey needs source blocks
    pinv(lambda: cm.pull_blocks(peer, blocks, [0, 1], [0]))                 # lengths differ
    pinv(lambda: cm.pull_blocks(by_id, blocks, [0], [0]))                   # a slot into blocks: no source blocks
    pinv(lambda: cm.pull_blocks(ld.BlocksCacheKey(7), blocks, [0], [0]))     # its own cluster id
    pinv(lambda: cm.pull_blocks(peer, blocks, [0], [0], tensor_num_per_layer=2, bogus=1))
    if not rca_on:
        pinv(lambda: cm.pull_blocks(ld.CacheKey(8, 2**64 - 1), blocks, [], [0]))   # neither req nor prefix id
        pinv(lambda: cm.pull_cache(ld.CacheKey(8, 1, prefix_id=3), cont))          # both
    else:
        with pytest.raises(TypeError):
            cm.pull_cache(ld.CacheKey(8, 1), cont)                          # rca: by id and index only
    for bad_index, error in ((-1, ValueError), (2**32, ValueError), (1.0, TypeError), ("0", TypeError)):
        with pytest.raises(error):
            cm.pull_cache(by_id, cont, bad_index)
    for bad_size, error in ((-1.0, TypeError), (2**63, ValueError), ("-1", TypeError)):
        with pytest.raises(error):
            cm.pull_cache(by_id, cont, 0, bad_size)
    pinv(lambda: cm.pull_cache(by_id, cont, 0, 0))
    pinv(lambda: cm.pull_cache(by_id, cont, 0, -2))
    pinv(lambda: cm.pull_cache(by_id, blocks))                              # a blocks cache
    pinv(lambda: cm.pull_cache(ld.CacheKeyByIdAndIndex(7, 3, 0), cont))     # its own cluster id

    class MyCache(ld.Cache):
        pass

    mine = MyCache(blocks.cache_id, blocks.cache_desc, list(blocks.tensor_addrs), is_blocks_cache=True)
    # what passes every check reaches the daemon: no link to cluster 8 (bools count as ints, as in CANN)
    for call in (lambda: cm.pull_blocks(peer, blocks, [0, True], (1, 2)),
                 lambda: cm.pull_blocks(peer, mine, (False,), [3]),
                 lambda: cm.pull_blocks(peer, blocks, [0], [0], src_layer_range=range(0, 1),
                                        dst_layer_range=range(0, 1)),
                 lambda: cm.pull_cache(by_id, cont, True, 16),
                 lambda: cm.pull_cache(by_id, cont, 1, -1)):
        assert code_of(call) is S.LLM_NOT_YET_LINK


# ---- v1 KvCacheManager (spec §8) ------------------------------------------------------------------

def test_v1_manager_rules_prompt(local_dd) -> None:
    dd = local_dd("PROMPT", v1=True)
    kv = dd.kv_cache_manager
    assert isinstance(kv, ld.KvCacheManager) and kv.is_initialized()
    pinv(lambda: dd.cache_manager)                                                # not in cache-manager mode
    pinv(lambda: kv.allocate_cache(CacheDesc(2, [2, 8], U8, Placement.HOST)))      # DEVICE only
    pinv(lambda: kv.allocate_cache(CacheDesc(0, [2, 8], U8)))                      # num_tensors > 0
    with pytest.raises(TypeError):
        kv.allocate_cache(CacheDesc(2, [2, 8], U8), [ld.BlocksCacheKey(7)])
    pinv(lambda: kv.allocate_cache(CacheDesc(2, [2, 8], U8), [ld.CacheKey(7, i) for i in range(3)]))  # > batch
    cache = kv.allocate_cache(CacheDesc(2, [2, 8], U8), [ld.CacheKey(7, 1)])
    pinv(lambda: kv.allocate_cache(CacheDesc(2, [2, 8], U8), [ld.CacheKey(7, 1)]))  # key already bound
    pinv(lambda: kv.pull_cache(ld.CacheKey(8, 1), cache))                          # only DECODER pulls
    pinv(lambda: kv.pull_blocks(ld.BlocksCacheKey(8), cache, [0], [0]))
    pinv(lambda: kv.get_cache_tensors(cache, 2))                                   # tensor_index in range
    with pytest.raises(ValueError):
        kv.get_cache_tensors(cache, 2**31)
    pinv(lambda: kv.copy_cache(cache, cache, size=0))
    with pytest.raises(ValueError):
        kv.copy_cache(cache, cache, offset=-1)
    cpu = ld.KvCache.create_cpu_cache(CacheDesc(2, [2, 8], U8, Placement.HOST), [4096, 8192])
    pinv(lambda: kv.copy_cache(cache, cpu))                                        # device caches only
    pinv(lambda: kv.deallocate_cache(cpu))
    pinv(lambda: kv.swap_blocks(cache, cache, {0: 1}))                              # D2D is not a swap
    pinv(lambda: kv.swap_blocks(cache, ld.KvCache.create_cpu_cache(CacheDesc(2, [4, 8], U8, Placement.HOST),
                                                                    [4096, 8192]), {0: 1}))  # block sizes differ
    pinv(lambda: kv.swap_blocks(cache, cpu, {2: 0}))                               # block index out of range
    with pytest.raises(TypeError):
        kv.transfer_cache_async(cache, Never(), [ld.TransferWithCacheKeyConfig(ld.BlocksCacheKey(8), range(0, 1),
                                                                                range(0, 1))])
    pinv(lambda: kv.transfer_cache_async(cache, Never(), [ld.TransferConfig(8, [4096, 8192])], None, [0], 8))
    import threading

    gate = threading.Event()

    class Held(ld.LayerSynchronizer):
        def synchronize_layer(self, layer_index, timeout_in_millis):  # noqa: ANN001, ANN201
            gate.wait(30)
            return False

    task = kv.transfer_cache_async(cache, Held(), [ld.TransferConfig(8, [4096, 8192])])
    assert task.synchronize(0) is S.LLM_WAIT_PROCESS_TIMEOUT                      # v1's default error code
    gate.set()
    assert task.get_results() == [S.LLM_PARAM_INVALID]
    assert code_of(lambda: dd.check_link_status(8)) is S.LLM_NOT_YET_LINK
    with pytest.raises(ValueError):
        dd.check_link_status(-1)
    kv.remove_cache_key(ld.CacheKey(7, 1))
    kv.remove_cache_key(ld.CacheKey(7, 99))                                         # missing key: no-op
    kv.deallocate_cache(cache)
    assert cache.per_device_tensor_addrs == []


def test_v1_manager_rules_decoder(local_dd) -> None:
    dd = local_dd("DECODER", v1=True, mem_pool=1 << 20)
    kv = dd.kv_cache_manager
    pinv(lambda: kv.allocate_cache(CacheDesc(2, [2, 8], U8), [ld.CacheKey(7, 1)]))   # keys are PROMPT's
    pinv(lambda: kv.allocate_blocks_cache(CacheDesc(2, [2, 8], U8), ld.BlocksCacheKey(7)))
    pinv(lambda: kv.remove_cache_key(ld.CacheKey(7, 1)))
    cache = kv.allocate_cache(CacheDesc(2, [2, 8], U8))
    blocks = kv.allocate_blocks_cache(CacheDesc(2, [4, 8], U8))
    pinv(lambda: kv.transfer_cache_async(cache, Never(), [ld.TransferConfig(8, [4096, 8192])]))  # PROMPT only
    with pytest.raises(TypeError):
        kv.pull_cache(ld.BlocksCacheKey(8), cache)
    pinv(lambda: kv.pull_cache(ld.CacheKey(8, 2**64 - 1), cache))                   # neither req nor prefix id
    pinv(lambda: kv.pull_cache(ld.CacheKey(8, 1, prefix_id=3), cache))              # both
    pinv(lambda: kv.pull_cache(ld.CacheKey(8, 1), cache, size=0))
    with pytest.raises(ValueError):
        kv.pull_cache(ld.CacheKey(8, 1), cache, src_cache_offset=-1)
    pinv(lambda: kv.pull_cache(ld.CacheKey(7, 1), cache))                           # its own cluster id
    assert code_of(lambda: kv.pull_cache(ld.CacheKey(8, 1), cache)) is S.LLM_NOT_YET_LINK
    with pytest.raises(TypeError):
        kv.pull_blocks(ld.CacheKey(8, 1), blocks, [0], [0])                         # v1: BlocksCacheKey only
    with pytest.raises(TypeError):
        kv.pull_blocks(ld.BlocksCacheKey(8), blocks, (0,), [0])                      # lists, as CANN checks
    pinv(lambda: kv.pull_blocks(ld.BlocksCacheKey(8), blocks, [], [0]))
    pinv(lambda: kv.pull_blocks(ld.BlocksCacheKey(8), blocks, [0, 1], [0]))
    assert code_of(lambda: kv.allocate_cache(CacheDesc(1, [1 << 21], U8))) is S.LLM_DEVICE_OUT_OF_MEMORY
    kv.deallocate_cache(cache)
    kv.deallocate_cache(blocks)


def test_v1_init_options(local_dd) -> None:
    with pytest.raises(LLMException) as info:  # a v1 PROMPT must listen (llm.ClusterInfo needs listen_ip_info)
        local_dd("PROMPT", v1=True, listen=False)
    assert info.value.status_code is S.LLM_PARAM_INVALID
    with pytest.raises(LLMException) as info:
        local_dd("DECODER", v1=True, extra={"ge.flowGraphMemMaxSize": "1,2"})
    assert info.value.status_code is S.LLM_PARAM_INVALID
    dd = local_dd("PROMPT", v1=True, mem_pool=4 << 20,
                  extra={"llm.BufPoolCfg": '{"buf_cfg":[{"total_size":2097152,"blk_size":256,"max_buf_size":8192}]}'})
    import json

    info_json = json.loads(dd._options["llm.ClusterInfo"])
    assert info_json["cluster_id"] == 7 and info_json["logic_device_id"] == ["0:0:0:0"]
    assert info_json["listen_ip_info"][0]["ip"] == 0x0100007F  # 127.0.0.1, little-endian as CANN
    from datadist.v1 import datadist_pb2

    status = dd._call("GetStatus", datadist_pb2.StatusRequest(engine_id=dd._engine_id), "test")
    pools = status.engines[0].pools
    assert [p.placement for p in pools] == [int(Placement.DEVICE)]
    assert pools[0].capacity == int((4 << 20) * 0.95)  # ge.flowGraphMemMaxSize x llm.MemoryUtilization


def test_mode_rules(local_dd) -> None:
    dd = ld.LLMDataDist(LLMRole.DECODER, 3)
    with pytest.raises(RuntimeError):
        dd.kv_cache_manager  # noqa: B018
    with pytest.raises(RuntimeError):
        dd.check_link_status(1)
    dd = local_dd("DECODER")
    pinv(lambda: dd.kv_cache_manager)
    pinv(lambda: dd.check_link_status(1))
    pinv(lambda: dd.add_model(ld.ModelConfig().generate_options()))


def test_model_api_argument_rules(local_dd) -> None:
    from llm_datadist import CapacityState, LLMReq, ModelConfig, ModelRunner

    with pytest.raises(ValueError):
        LLMReq(req_id=-1)
    req = LLMReq(1, 5, 2, 3, 4)
    assert (req.req_id, req.prompt_length, req.prompt_cluster_id, req.decoder_cluster_id, req.prefix_id) == (
        1, 5, 2, 3, 4)
    with pytest.raises(TypeError):
        req.prefix_id = "x"
    config = ModelConfig()
    with pytest.raises(TypeError):
        config.kv_shapes = "1,2"
    with pytest.raises(TypeError):
        config.kv_dtypes = [1]
    config.kv_shapes = ["2,8", "2,8"]
    config.kv_dtypes = [U8, U8]
    config.kv_seq_len_dim_index = 1
    assert config.generate_options() == {"llm.RefInputShapes": "2,8;2,8", "llm.RefInputDtypes": "4;4",
                                         "llm.RefInputSeqLenDimIndex": "1"}
    state = CapacityState(True, 3, 4)
    assert (state.is_available, state.free_tokens_num, state.total_tokens_num) == (True, 3, 4)
    dd = local_dd("PROMPT", v1=True)
    with pytest.raises(TypeError):
        dd.add_model(config.generate_options(), object())
    pinv(lambda: dd.add_model({"llm.RefInputDtypes": "4"}))                        # kv_shapes required
    pinv(lambda: dd.add_model({"llm.RefInputShapes": "2,8;4,8", "llm.RefInputDtypes": "4;4"}))  # one shape
    pinv(lambda: dd.add_model({"llm.RefInputShapes": "2,-1", "llm.RefInputDtypes": "4"}))       # static only
    model = dd.add_model(config.generate_options())                                # default ModelRunner
    assert code_of(lambda: model.predict(LLMReq(1), [ld.Tensor(np.zeros(1))])) is S.LLM_FEATURE_NOT_ENABLED
    with pytest.raises(TypeError):
        model.predict(LLMReq(1), ["not a tensor"])
    pinv(lambda: model.predict([LLMReq(i) for i in range(3)], []))                # more requests than the batch
    pinv(lambda: model.pull_kv(LLMReq(1)))                                        # DECODER only
    pinv(lambda: model.preload_prompt_prefix(LLMReq(1), []))                       # prefix_id required
    assert code_of(lambda: model.release_prompt_prefix(LLMReq(prefix_id=9))) is S.LLM_PREFIX_NOT_EXIST
    assert code_of(lambda: model.predict(LLMReq(1, prefix_id=9), [])) is S.LLM_PREFIX_NOT_EXIST
    with pytest.raises(TypeError):
        dd.complete_request(1)
    with pytest.raises(ValueError):
        dd.check_capacity(-1)
    assert isinstance(ModelRunner(), ModelRunner)


def test_init_option_rules(local_dd) -> None:
    """Spec §3.2: what ``init`` adds to and requires of the options, before any engine exists."""
    def init_code(options: dict) -> S:
        dd = ld.LLMDataDist(LLMRole.PROMPT, 5)
        with pytest.raises(LLMException) as info:
            dd.init(options)
        return info.value.status_code

    base = {"ge.exec.deviceId": "0"}
    assert init_code({**base, "llm.LocalCommRes": "", "llm.EnableCacheManager": "0"}) is S.LLM_PARAM_INVALID
    assert init_code({**base, "llm.TransferBackend": "hixl", "llm.listenIpInfo": "127.0.0.1:1"}) is S.LLM_PARAM_INVALID
    assert init_code({**base, "llm.EnableCacheManager": "1", "llm.TransferBackend": "hixl"}) is S.LLM_PARAM_INVALID
    assert init_code({**base, "llm.EnableCacheManager": "1", "llm.TransferBackend": "hixl",
                      "llm.EnableRemoteCacheAccessible": "0", "llm.listenIpInfo": "127.0.0.1:1"}) is S.LLM_PARAM_INVALID
    assert init_code({**base, "llm.EnableCacheManager": "1", "llm.listenIpInfo": "127.0.0.1"}) is S.LLM_PARAM_INVALID
    assert init_code({**base, "llm.ClusterInfo": "{}", "ge.flowGraphMemMaxSize": "1,2"}) is S.LLM_PARAM_INVALID
    with pytest.raises(TypeError):
        ld.LLMDataDist(LLMRole.PROMPT, 5).init({"ge.exec.deviceId": 0})
    # llm.LocalCommRes (even "") selects cache-manager mode with remote cache access
    dd = local_dd("PROMPT", v1=True, listen=False, extra={"llm.LocalCommRes": "", "llm.listenIpInfo": "127.0.0.1:0"})
    assert dd._options["llm.EnableCacheManager"] == "1" and dd._options["llm.EnableRemoteCacheAccessible"] == "1"
    assert (dd._options["llm.ListenIp"], dd._options["llm.ListenPort"]) == ("127.0.0.1", "0")
    assert dd.cache_manager is not None


def test_unset_remote_cluster_id_is_a_type_error(local_dd) -> None:
    """CANN's link_clusters / unlink_clusters run check_uint64 on remote_cluster_id: None -> TypeError."""
    dd = local_dd("DECODER", cluster_id=3)
    info = ld.LLMClusterInfo()
    info.append_local_ip_info("127.0.0.1", 0)
    info.append_remote_ip_info("127.0.0.1", 1)
    with pytest.raises(TypeError, match="remote_cluster_id"):
        dd.link_clusters([info], 1000)
    with pytest.raises(TypeError, match="remote_cluster_id"):
        dd.unlink_clusters([info], 1000, force=True)


def test_an_unknown_init_option_is_ignored_as_cann_does_but_named_in_a_warning(local_dd, caplog) -> None:
    """CANN's engines look up the option keys they read and ignore the rest (hixl llm_datadist_v2.cc); datadist
    does the same, and a key nobody reads (a typo) is named once in the worker's log."""
    with caplog.at_level("WARNING", logger="llm_datadist.llm_datadist"):
        dd = local_dd("DECODER", extra={"llm.SomethingMadeUp": "1", "ge.someGeOption": "1"})
    assert dd.cache_manager is not None   # init went through
    warned = [r.getMessage() for r in caplog.records if "does not read" in r.getMessage()]
    assert warned == ["init options datadist does not read are ignored (as CANN ignores them): llm.SomethingMadeUp; "
                      "a typo?"]


def test_a_copy_between_caches_of_different_tensor_counts_names_both(local_dd) -> None:
    """issue 37, item 7: not "dst 4, src 2" but both caches, their layouts and what to register."""
    dd = local_dd("PROMPT")
    src = dd.cache_manager.allocate_cache(CacheDesc(2, [2, 8], U8))
    dst = dd.cache_manager.allocate_cache(CacheDesc(4, [2, 8], U8))
    with pytest.raises(ld.LLMException) as info:
        dd.cache_manager.copy_cache(dst, src)
    assert info.value.status_code is S.LLM_PARAM_INVALID
    said = str(info.value)
    assert f"copy_cache: tensor counts differ: the source cache {src.cache_id} has 2 tensors (batch slot shape [8] " \
           f"of DT_UINT8, 8 bytes per tensor and batch slot), the destination cache {dst.cache_id} has 4 tensors" \
           in said and "copy between caches of the same CacheDesc num_tensors" in said, said
