"""CacheManager (v2) calls that need no peer, in one process (embedded daemon): register/unregister,
allocate/deallocate, keys, copy_cache, copy_blocks, swap_blocks with ``Cache.create_cpu_cache``,
remap_registered_memory's checks (spec §5.5, §7)."""

from __future__ import annotations

import numpy as np
import pytest

import llm_datadist as ld
from llm_datadist import CacheDesc, DataType, LLMException, MemInfo, Memtype, Placement
from llm_datadist import LLMStatusCode as S
from llm_datadist.views import numpy_views

U8 = DataType.DT_UINT8


def test_v2_local_calls(local_dd) -> None:
    dd = local_dd("MIX", rca=False)
    cm = dd.cache_manager
    # registered memory (the worker's numpy arrays) and allocated memory share one id counter from 1
    mine = [np.arange(64, dtype=np.uint8).reshape(4, 16) + i for i in range(2)]
    reg = cm.register_blocks_cache(CacheDesc(2, [4, 16], U8), [a.ctypes.data for a in mine], ld.BlocksCacheKey(7, 0))
    assert reg.cache_id == 1 and reg.is_blocks_cache and reg.tensor_addrs == [a.ctypes.data for a in mine]
    src = cm.allocate_cache(CacheDesc(2, [2, 16], U8), [ld.CacheKey(7, 1), ld.CacheKey(7, 2)])
    dst = cm.allocate_cache(CacheDesc(2, [3, 16], U8))
    assert (src.cache_id, dst.cache_id) == (2, 3)
    for i, arr in enumerate(numpy_views(src)):
        arr[:] = np.arange(32, dtype=np.uint8).reshape(2, 16) + 100 * i
    cm.copy_cache(dst, src, 2, 1, offset=4, size=8)  # dst first
    got = numpy_views(dst)
    for i in range(2):
        np.testing.assert_array_equal(got[i][2, 4:12], np.arange(20, 28, dtype=np.uint8) + 100 * i)
        assert not got[i][2, :4].any() and not got[i][:2].any()
    with pytest.raises(LLMException) as info:
        cm.copy_cache(dst, src, 0, 0, offset=16)
    assert info.value.status_code is S.LLM_PARAM_INVALID
    # copy_blocks inside the registered cache, then swap D -> H into a CPU cache over numpy memory
    cm.copy_blocks(reg, {0: [3]})
    np.testing.assert_array_equal(mine[1][3], mine[1][0])
    host = [np.zeros((4, 16), np.uint8) for _ in range(2)]
    cpu = ld.Cache.create_cpu_cache(CacheDesc(2, [4, 16], U8, Placement.HOST), [a.ctypes.data for a in host])
    assert cpu.cache_id == -1 and cpu.is_blocks_cache
    blocks = cm.allocate_blocks_cache(CacheDesc(2, [4, 16], U8))
    numpy_views(blocks)[0][1] = 9
    cm.swap_blocks(blocks, cpu, {1: 2})
    assert (host[0][2] == 9).all() and not host[0][1].any()
    with pytest.raises(LLMException) as info:  # H -> H is not a swap
        cm.swap_blocks(cpu, cpu, {0: 1})
    assert info.value.status_code is S.LLM_PARAM_INVALID
    # keys and reference counts: deallocate frees only after the keys go
    cm.deallocate_cache(src)
    assert src.tensor_addrs == []
    cm.remove_cache_key(ld.CacheKey(7, 1))
    cm.remove_cache_key(ld.CacheKey(7, 2))
    cm.remove_cache_key(ld.CacheKey(7, 3))  # missing: no-op
    with pytest.raises(LLMException) as info:
        cm.deallocate_cache(blocks)  # blocks caches use deallocate_blocks_cache
    assert info.value.status_code is S.LLM_PARAM_INVALID
    cm.deallocate_blocks_cache(blocks)
    cm.unregister_cache(reg.cache_id)
    cm.unregister_cache(12345)  # unknown id: success
    # remap_registered_memory: reserved by CANN; its argument checks hold
    cm.remap_registered_memory(MemInfo(Memtype.MEM_TYPE_DEVICE, 4096, 64))
    with pytest.raises(LLMException):
        cm.remap_registered_memory([MemInfo(Memtype.MEM_TYPE_HOST, 4096, 64)])
    with pytest.raises(LLMException):
        cm.remap_registered_memory(MemInfo(Memtype.MEM_TYPE_DEVICE, 0, 64))
    # after link() (CANN calls set_is_call_linked), remote_accessible=True registrations are refused
    cm.set_is_call_linked()
    with pytest.raises(LLMException) as info:
        cm.register_blocks_cache(CacheDesc(2, [4, 16], U8), [a.ctypes.data for a in mine], remote_accessible=True)
    assert info.value.status_code is S.LLM_PARAM_INVALID
