"""Pure client types: status, validation helpers, DataType, descriptors, keys, caches, transfer configs."""

from __future__ import annotations

import gc
import math
import pickle
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llm_datadist import (
    BlocksCacheKey,
    Cache,
    CacheDesc,
    CacheKey,
    CacheKeyByIdAndIndex,
    DataType,
    KvCache,
    LayerSynchronizer,
    LLMException,
    LLMStatusCode,
    MemInfo,
    Memtype,
    Placement,
    RegisterMemStatus,
    Status,
    TransferConfig,
    TransferWithCacheKeyConfig,
)
from llm_datadist import _validate as v
from llm_datadist.data_type import _itemsize, dtype_to_np_dtype, np_dtype_to_dtype, valid_np_dtypes
from llm_datadist.llm_types import PushType, layer_range_to_tensor_indices
from llm_datadist.status import code_2_status, handle_llm_status

S = LLMStatusCode
U64 = 2**64 - 1

ITEMSIZE = {
    DataType.DT_FLOAT: 4, DataType.DT_FLOAT16: 2, DataType.DT_INT8: 1, DataType.DT_INT32: 4, DataType.DT_UINT8: 1,
    DataType.DT_INT16: 2, DataType.DT_UINT16: 2, DataType.DT_UINT32: 4, DataType.DT_INT64: 8,
    DataType.DT_UINT64: 8, DataType.DT_DOUBLE: 8, DataType.DT_BOOL: 1, DataType.DT_BF16: 2,
}


def raises_param_invalid(match: str | None = None) -> Any:
    return pytest.raises(LLMException, match=match)


def assert_param_invalid(excinfo: pytest.ExceptionInfo) -> None:
    assert excinfo.value.status_code == S.LLM_PARAM_INVALID


# ---- status --------------------------------------------------------------------------------------


def test_status_reexports_shared_table() -> None:
    import datadist.status as shared
    import llm_datadist.status as client

    assert client.LLMStatusCode is shared.LLMStatusCode and client.code_2_status is shared.code_2_status
    assert code_2_status(12345) is S.LLM_FAILED


def test_llm_exception() -> None:
    exc = LLMException("boom")
    assert isinstance(exc, RuntimeError) and exc.status_code == S.LLM_SUCCESS and str(exc) == "boom"
    exc = LLMException("a", "b", status_code=S.LLM_TIMEOUT)
    assert exc.args == ("a", "b") and exc.status_code is S.LLM_TIMEOUT
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is LLMException and again.args == ("a", "b") and again.status_code is S.LLM_TIMEOUT


def test_status_helper() -> None:
    assert Status(0).is_ok() and Status(0).status_code is S.LLM_SUCCESS
    st_ = Status(int(S.LLM_NOT_YET_LINK))
    assert not st_.is_ok() and st_.status_code is S.LLM_NOT_YET_LINK
    assert Status(-2).status_code is S.LLM_FAILED


def test_handle_llm_status() -> None:
    handle_llm_status(0, "[pull_blocks]", "ignored")
    handle_llm_status(S.LLM_SUCCESS, "[pull_blocks]", "ignored")
    with pytest.raises(LLMException) as excinfo:
        handle_llm_status(int(S.LLM_KV_CACHE_NOT_EXIST), "[pull_blocks]", "src_cache_key = x")
    assert excinfo.value.status_code is S.LLM_KV_CACHE_NOT_EXIST
    assert str(excinfo.value) == ("[pull_blocks] failed, error code is LLMStatusCode.LLM_KV_CACHE_NOT_EXIST, "
                                  "src_cache_key = x.")
    with pytest.raises(LLMException) as excinfo:
        handle_llm_status(99, "f", "i")
    assert excinfo.value.status_code is S.LLM_FAILED


# ---- _validate -----------------------------------------------------------------------------------


def test_check_isinstance_message_and_none() -> None:
    with pytest.raises(TypeError) as excinfo:
        v.check_isinstance("addrs", "x", [list, tuple])
    assert str(excinfo.value) == "addrs only support ['list', 'tuple'], but got <class 'str'>."
    assert v.check_isinstance("addrs", None, [list]) is None
    with pytest.raises(TypeError):
        v.check_isinstance("addrs", None, [list], allow_none=False)
    with pytest.raises(TypeError, match="inner type"):
        v.check_isinstance("addrs", [1, "2"], list, inner_class=int)
    assert v.check_isinstance("n", True, int) is True


def test_check_dict() -> None:
    assert v.check_dict("o", None, str, str) is None
    v.check_dict("o", {"a": "b"}, str, str)
    for bad in ({1: "b"}, {"a": 1}, ["a"]):
        with pytest.raises(TypeError):
            v.check_dict("o", bad, str, str)
    with pytest.raises(TypeError):
        v.check_dict("o", None, str, str, allow_none=False)
    v.check_dict("o", {1: [1, 2]}, int, list, v_inner_class=int)
    with pytest.raises(TypeError):
        v.check_dict("o", {1: [1, "2"]}, int, list, v_inner_class=int)


INT_CHECKS = [
    (v.check_uint8, 0, 2**8 - 1), (v.check_uint16, 0, 2**16 - 1), (v.check_uint32, 0, 2**32 - 1),
    (v.check_int32, -(2**31), 2**31 - 1), (v.check_uint64, 0, 2**64 - 1), (v.check_int64, -(2**63), 2**63 - 1),
]


@pytest.mark.parametrize(("check", "low", "high"), INT_CHECKS)
def test_int_checks_bounds_and_types(check, low: int, high: int) -> None:  # noqa: ANN001
    check("x", low)
    check("x", high)
    check("x", True)  # bool is an int, as in CANN
    for bad in (low - 1, high + 1):
        with pytest.raises(ValueError, match="out of range"):
            check("x", bad)
    for bad in (1.0, "1", None, np.int64(1)):
        with pytest.raises(TypeError):
            check("x", bad)


@given(st.integers(-(2**70), 2**70))
def test_int_checks_match_range(value: int) -> None:
    for check, low, high in INT_CHECKS:
        if low <= value <= high:
            check("x", value)
        else:
            with pytest.raises(ValueError):
                check("x", value)


def test_raise_if_helpers() -> None:
    v.raise_if_false(True, "no")
    v.raise_if_true(False, "no")
    with pytest.raises(LLMException) as excinfo:
        v.raise_if_false(0, "bad {0} of {1}", "x", 3)
    assert_param_invalid(excinfo)
    assert str(excinfo.value) == "bad x of 3"
    with pytest.raises(LLMException) as excinfo:
        v.raise_if_true(1, "literal {braces} kept")
    assert str(excinfo.value) == "literal {braces} kept"
    with pytest.raises(LLMException) as excinfo:
        v.raise_if_true(1, "x", status_code=S.LLM_FEATURE_NOT_ENABLED)
    assert excinfo.value.status_code is S.LLM_FEATURE_NOT_ENABLED


def test_check_positive_or_set_default() -> None:
    assert v.check_positive_or_set_default("o", None) == -1
    assert v.check_positive_or_set_default("o", 0) == 0
    with pytest.raises(ValueError):
        v.check_positive_or_set_default("o", -1)


# ---- enums ---------------------------------------------------------------------------------------


def test_data_type_values() -> None:
    assert {m.name: m.value for m in DataType} == {
        "DT_FLOAT": 0, "DT_FLOAT16": 1, "DT_INT8": 2, "DT_INT32": 3, "DT_UINT8": 4, "DT_INT16": 6,
        "DT_UINT16": 7, "DT_UINT32": 8, "DT_INT64": 9, "DT_UINT64": 10, "DT_DOUBLE": 11, "DT_BOOL": 12,
        "DT_STRING": 13, "DT_BF16": 27,
    }
    assert not isinstance(DataType.DT_FLOAT, int)  # Enum, not IntEnum
    assert DataType(27) is DataType.DT_BF16


def test_numpy_mapping() -> None:
    assert dtype_to_np_dtype(DataType.DT_BF16) is np.float16
    assert dtype_to_np_dtype[DataType.DT_BOOL] is np.bool_
    assert dtype_to_np_dtype.get(DataType.DT_STRING) is None
    with pytest.raises(LLMException) as excinfo:
        dtype_to_np_dtype(DataType.DT_STRING)
    assert_param_invalid(excinfo)
    with pytest.raises(TypeError):
        dtype_to_np_dtype(1)  # type: ignore[arg-type]
    for dt, size in ITEMSIZE.items():
        assert np.dtype(dtype_to_np_dtype(dt)).itemsize == size == _itemsize(dt)
        if dt is not DataType.DT_BF16:
            assert np_dtype_to_dtype(dtype_to_np_dtype(dt)) is dt
    assert np_dtype_to_dtype(np.float16) is DataType.DT_FLOAT16
    assert np_dtype_to_dtype[np.dtype("float32")] is DataType.DT_FLOAT
    assert np_dtype_to_dtype(np.zeros(1, dtype=np.int64).dtype) is DataType.DT_INT64
    for bad in (np.complex64, "no-such-type"):
        with pytest.raises(LLMException):
            np_dtype_to_dtype(bad)
    assert len(valid_np_dtypes) == 12 and np.float16 in valid_np_dtypes


def test_itemsize_string_and_type() -> None:
    with pytest.raises(LLMException) as excinfo:
        _itemsize(DataType.DT_STRING)
    assert_param_invalid(excinfo)
    with pytest.raises(TypeError):
        _itemsize(0)  # type: ignore[arg-type]


def test_small_enums() -> None:
    assert (Placement.HOST, Placement.DEVICE) == (0, 1) and isinstance(Placement.DEVICE, int)
    assert str(Placement.DEVICE) == "Placement.DEVICE"
    assert [(m.name, m.value) for m in RegisterMemStatus] == [("OK", 0), ("PREPARING", 1), ("FAILED", 2)]
    assert RegisterMemStatus(1) is RegisterMemStatus.PREPARING
    assert RegisterMemStatus(7) is RegisterMemStatus.FAILED
    assert RegisterMemStatus.from_int(-1) is RegisterMemStatus.FAILED
    with pytest.raises(ValueError):
        RegisterMemStatus("OK")
    assert [(m.name, m.value) for m in Memtype] == [("MEM_TYPE_DEVICE", 0), ("MEM_TYPE_HOST", 1)]
    assert [m.value for m in PushType] == [0, 1, 2]


def test_mem_info() -> None:
    info = MemInfo(Memtype.MEM_TYPE_DEVICE, 0x1000, 64)
    assert (info.mem_type, info.addr, info.size) == (Memtype.MEM_TYPE_DEVICE, 0x1000, 64)
    for args in ((0, 1, 1), (None, 1, 1), (Memtype.MEM_TYPE_HOST, "1", 1), (Memtype.MEM_TYPE_HOST, 1, 1.0)):
        with pytest.raises(TypeError):
            MemInfo(*args)


# ---- CacheDesc -----------------------------------------------------------------------------------


def test_cache_desc_defaults_and_properties() -> None:
    shape = [4, 16, 8]
    desc = CacheDesc(80, shape, DataType.DT_FLOAT16)
    assert desc.num_tensors == 80 and desc.shape is shape and desc.data_type is DataType.DT_FLOAT16
    assert desc.placement is Placement.DEVICE and desc.batch_dim == 0 and desc.batch_size == 4
    assert desc.seq_len_dim_index == -1 and desc.kv_tensor_format is None and desc._is_blocks is False
    assert desc.size == 4 * 16 * 8 * 2
    desc.update_dim(0, 2)
    assert shape == [2, 16, 8] and desc.batch_size == 2 and desc.size == 2 * 16 * 8 * 2
    full = CacheDesc(2, (3, 10), DataType.DT_FLOAT, Placement.HOST, 1, 0, "ND")
    assert full.shape == [3, 10] and full.batch_size == 10 and full.seq_len_dim_index == 0
    assert full.kv_tensor_format == "ND" and full.placement is Placement.HOST
    full.update_dim(1, 5)
    assert full.shape == [3, 5]
    assert "num_tensors=2" in repr(full)


@given(shape=st.lists(st.integers(0, 1 << 12), min_size=1, max_size=6),
       dtype=st.sampled_from(sorted(ITEMSIZE, key=lambda d: d.value)))
def test_cache_desc_size_arithmetic(shape: list, dtype: DataType) -> None:
    desc = CacheDesc(1, shape, dtype)
    assert desc.size == math.prod(shape) * ITEMSIZE[dtype]
    if shape[0] > 0:
        assert desc.size // shape[0] * shape[0] == desc.size  # per-block / per-batch stride is exact


def test_cache_desc_size_errors() -> None:
    with pytest.raises(LLMException) as excinfo:
        _ = CacheDesc(1, [2, -1], DataType.DT_FLOAT).size
    assert_param_invalid(excinfo)
    with pytest.raises(LLMException) as excinfo:
        _ = CacheDesc(1, [2], DataType.DT_STRING).size
    assert_param_invalid(excinfo)


@pytest.mark.parametrize("kwargs", [
    {"num_tensors": "1"}, {"shape": 4}, {"shape": [4, "2"]}, {"shape": None}, {"data_type": 1},
    {"placement": 1}, {"placement": None}, {"batch_dim_index": "0"}, {"seq_len_dim_index": 1.0},
    {"kv_tensor_format": 1},
])
def test_cache_desc_type_errors(kwargs: dict) -> None:
    args = {"num_tensors": 1, "shape": [2, 4], "data_type": DataType.DT_FLOAT, **kwargs}
    with pytest.raises(TypeError):
        CacheDesc(**args)


@pytest.mark.parametrize("kwargs", [
    {"num_tensors": -1}, {"num_tensors": 2**32}, {"shape": [2, 2**63]}, {"shape": [-(2**63) - 1]},
    {"seq_len_dim_index": 2**31},
])
def test_cache_desc_value_errors(kwargs: dict) -> None:
    args = {"num_tensors": 1, "shape": [2, 4], "data_type": DataType.DT_FLOAT, **kwargs}
    with pytest.raises(ValueError):
        CacheDesc(**args)


@pytest.mark.parametrize("kwargs", [
    {"batch_dim_index": 2}, {"batch_dim_index": -1}, {"seq_len_dim_index": 2}, {"seq_len_dim_index": -2},
    {"shape": []},
])
def test_cache_desc_param_invalid(kwargs: dict) -> None:
    args = {"num_tensors": 1, "shape": [2, 4], "data_type": DataType.DT_FLOAT, **kwargs}
    with pytest.raises(LLMException) as excinfo:
        CacheDesc(**args)
    assert_param_invalid(excinfo)


def test_cache_desc_num_tensors_zero_allowed() -> None:
    assert CacheDesc(0, [1], DataType.DT_INT8).num_tensors == 0


# ---- keys ----------------------------------------------------------------------------------------


def test_cache_key_positional_and_keyword() -> None:
    key = CacheKey(1, 2)
    assert (key.cluster_id, key.prompt_cluster_id, key.req_id, key.model_id, key.prefix_id) == (1, 1, 2, 0, U64)
    key = CacheKey(1, 2, 3, 4)
    assert (key.cluster_id, key.req_id, key.model_id, key.prefix_id) == (1, 2, 3, 4)
    key = CacheKey(prompt_cluster_id=5, req_id=6, model_id=7)
    assert (key.cluster_id, key.prompt_cluster_id, key.req_id, key.model_id) == (5, 5, 6, 7)
    key = CacheKey(cluster_id=5, req_id=6, prefix_id=9)
    assert key.prefix_id == 9
    assert CacheKey(1, req_id=2) == CacheKey(cluster_id=1, req_id=2) == CacheKey(prompt_cluster_id=1, req_id=2)
    assert len({CacheKey(1, 2), CacheKey(1, 2), CacheKey(1, 3)}) == 2
    assert CacheKey(1, U64).req_id == U64  # placeholder key for an unused batch slot
    assert "req_id=2" in repr(CacheKey(1, 2))


def test_cache_key_errors() -> None:
    cases = [
        ((), {"req_id": 1}, "Param prompt_cluster_id or cluster_id is required"),
        ((1,), {}, "Param req_id is required"),
        ((), {"cluster_id": 1}, "Param req_id is required"),
        ((1, 2), {"foo": 3}, "Unsupported param:foo"),
        ((1, 2, 3, 4, 5), {}, "Param num is over limit"),
        ((1, 2, 3), {"prefix_id": 1, "model_id": 2}, "Param num is over limit"),
        ((1, 2), {"req_id": 3}, "Param req_id is given twice"),
    ]
    for args, kwargs, msg in cases:
        with pytest.raises(LLMException) as excinfo:
            CacheKey(*args, **kwargs)
        assert str(excinfo.value) == msg
        assert_param_invalid(excinfo)
    for kwargs in ({"cluster_id": -1, "req_id": 1}, {"cluster_id": 1, "req_id": -1},
                   {"cluster_id": 1, "req_id": 1, "model_id": -1}, {"cluster_id": 1, "req_id": 1, "prefix_id": 2**64}):
        with pytest.raises(ValueError):
            CacheKey(**kwargs)
    with pytest.raises(TypeError):
        CacheKey("1", 2)
    with pytest.raises(TypeError):
        CacheKey(1, 2.0)


def test_cache_key_by_id_and_index() -> None:
    key = CacheKeyByIdAndIndex(3, 1)
    assert (key.cluster_id, key.cache_id, key.batch_index) == (3, 1, 0)
    key = CacheKeyByIdAndIndex(cluster_id=3, cache_id=-1, batch_index=2**32 - 1)
    assert key.cache_id == -1 and key.batch_index == 2**32 - 1
    assert CacheKeyByIdAndIndex(3, 1, 0) == CacheKeyByIdAndIndex(3, 1) != CacheKeyByIdAndIndex(3, 2)
    for args in ((-1, 1), (1, 2**63), (1, 1, -1), (1, 1, 2**32)):
        with pytest.raises(ValueError):
            CacheKeyByIdAndIndex(*args)
    with pytest.raises(TypeError):
        CacheKeyByIdAndIndex(1, "1")


def test_blocks_cache_key() -> None:
    key = BlocksCacheKey(7)
    assert (key.cluster_id, key.prompt_cluster_id, key.model_id) == (7, 7, 0)
    assert BlocksCacheKey(7, 1).model_id == 1
    key = BlocksCacheKey(prompt_cluster_id=7, model_id=2)
    assert key.cluster_id == 7 and repr(key) == "BlocksCacheKey(prompt_cluster_id=7, model_id=2)"
    assert repr(BlocksCacheKey(cluster_id=7)) == "BlocksCacheKey(cluster_id=7, model_id=0)"
    assert BlocksCacheKey(7, 1) == BlocksCacheKey(cluster_id=7, model_id=1)
    with pytest.raises(TypeError) as excinfo:
        BlocksCacheKey("7")
    assert str(excinfo.value) == "The first param cluster_id only support ['int'], but got <class 'str'>."
    with pytest.raises(TypeError, match=r"^The second param model_id only support \['int'\]"):
        BlocksCacheKey(7, 1.0)
    with pytest.raises(ValueError):
        BlocksCacheKey(-1)
    for args, kwargs, msg in [((), {"model_id": 1}, "Param prompt_cluster_id or cluster_id is required"),
                              ((1, 2, 3), {}, "Param num is over limit"),
                              ((1,), {"req_id": 3}, "Unsupported param:req_id")]:
        with pytest.raises(LLMException) as excinfo:
            BlocksCacheKey(*args, **kwargs)
        assert str(excinfo.value) == msg
        assert_param_invalid(excinfo)


# ---- caches --------------------------------------------------------------------------------------


def test_cache() -> None:
    desc = CacheDesc(2, [4, 8], DataType.DT_FLOAT16)
    cache = Cache(1, desc, [0x1000, 0x2000])
    assert cache.cache_id == 1 and cache.cache_desc is desc and cache.tensor_addrs == [0x1000, 0x2000]
    assert cache.is_blocks_cache is False
    cache.tensor_addrs = []
    assert cache.tensor_addrs == []
    cache = Cache(2, desc, [1, 2], None, is_registered=True, is_blocks_cache=True)
    assert cache.is_blocks_cache and cache._is_registered
    with pytest.raises(TypeError):
        Cache("1", desc, [])
    with pytest.raises(ValueError):
        Cache(2**63, desc, [])
    assert "cache_id = 2" in repr(cache)


def test_cache_create_cpu_cache() -> None:
    desc = CacheDesc(2, [4, 8], DataType.DT_FLOAT16, Placement.HOST)
    cache = Cache.create_cpu_cache(desc, [0x10, 0x20])
    assert cache.cache_id == -1 and cache.is_blocks_cache and cache.tensor_addrs == [0x10, 0x20]
    with raises_param_invalid("HOST") as excinfo:
        Cache.create_cpu_cache(CacheDesc(2, [4, 8], DataType.DT_FLOAT16), [1, 2])
    assert_param_invalid(excinfo)
    with raises_param_invalid("not equal") as excinfo:
        Cache.create_cpu_cache(desc, [1])
    assert_param_invalid(excinfo)
    with pytest.raises(TypeError):
        Cache.create_cpu_cache(desc, [1, "2"])
    with pytest.raises(TypeError):
        Cache.create_cpu_cache(None, [1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Cache.create_cpu_cache(desc, [1, -2])


class _Manager:
    def __init__(self, initialized: bool = True, fail: bool = False) -> None:
        self.initialized, self.fail, self.freed = initialized, fail, []

    def is_initialized(self) -> bool:
        return self.initialized

    def deallocate_cache(self, cache: KvCache) -> None:
        self.freed.append(cache.cache_id)
        cache._valid = False
        if self.fail:
            raise LLMException("gone", status_code=S.LLM_FAILED)


def test_kv_cache_properties_and_auto_free() -> None:
    desc = CacheDesc(2, [4, 8], DataType.DT_FLOAT16)
    mgr = _Manager()
    cache = KvCache(5, desc, [[1, 2]], mgr)
    assert cache.cache_id == 5 and cache.cache_desc is desc and cache.per_device_tensor_addrs == [[1, 2]]
    assert not hasattr(cache, "tensor_addrs")
    del cache
    gc.collect()
    assert mgr.freed == [5]

    idle = _Manager(initialized=False)
    cache = KvCache(6, desc, [[1, 2]], idle)
    del cache
    gc.collect()
    assert idle.freed == []

    failing = _Manager(fail=True)
    cache = KvCache(7, desc, [[1, 2]], failing)
    del cache  # the exception from deallocate_cache is swallowed
    gc.collect()
    assert failing.freed == [7]

    freed_already = _Manager()
    cache = KvCache(8, desc, [[1, 2]], freed_already)
    cache._valid = False
    del cache
    gc.collect()
    assert freed_already.freed == []

    with pytest.raises(TypeError):
        KvCache("x", desc, [[1]], mgr)  # a half-built object must not break its finalizer
    gc.collect()


def test_kv_cache_create_cpu_cache() -> None:
    desc = CacheDesc(2, [4, 8], DataType.DT_FLOAT16, Placement.HOST)
    cache = KvCache.create_cpu_cache(desc, [1, 2])
    assert cache.cache_id == -1 and cache.per_device_tensor_addrs == [[1, 2]]
    cache = KvCache.create_cpu_cache(desc, [[1, 2], [3, 4]])
    assert cache.per_device_tensor_addrs == [[1, 2], [3, 4]]
    for addrs in ([], [1], [[1, 2], [3]], [[1, 2], 3], [1, [2, 3]]):
        with pytest.raises(LLMException) as excinfo:
            KvCache.create_cpu_cache(desc, addrs)
        assert_param_invalid(excinfo)
    with pytest.raises(LLMException):
        KvCache.create_cpu_cache(CacheDesc(2, [4, 8], DataType.DT_FLOAT16), [1, 2])
    for addrs in ((1, 2), [1, "2"], [[1, "2"]]):
        with pytest.raises(TypeError):
            KvCache.create_cpu_cache(desc, addrs)


# ---- layer ranges and transfer configs -----------------------------------------------------------


def test_layer_range_to_tensor_indices() -> None:
    assert layer_range_to_tensor_indices(None) == []
    assert layer_range_to_tensor_indices(range(1, 3)) == [2, 3, 4, 5]
    assert layer_range_to_tensor_indices(range(0, 2), 3) == [0, 1, 2, 3, 4, 5]
    for bad in (range(0, 4, 2), range(2, 2), range(3, 1), range(-1, 2)):
        with pytest.raises(LLMException) as excinfo:
            layer_range_to_tensor_indices(bad)
        assert_param_invalid(excinfo)
    with pytest.raises(LLMException):
        layer_range_to_tensor_indices(range(0, 1), 0)
    with pytest.raises(TypeError):
        layer_range_to_tensor_indices((0, 1))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        layer_range_to_tensor_indices(range(0, 1), -1)


@given(start=st.integers(0, 500), length=st.integers(1, 500), per=st.integers(1, 8))
def test_layer_range_to_tensor_indices_property(start: int, length: int, per: int) -> None:
    indices = layer_range_to_tensor_indices(range(start, start + length), per)
    assert len(indices) == length * per and len(set(indices)) == len(indices)
    assert indices == sorted(indices) and indices[0] == start * per and indices[-1] == (start + length) * per - 1
    for layer in range(start, start + length):  # layer L <-> tensors [L*N, L*N+N)
        assert all(layer * per + k in indices for k in range(per))


class _Sync(LayerSynchronizer):
    def synchronize_layer(self, layer_index: int, timeout_in_millis: int | None) -> bool:
        return layer_index >= 0


def test_layer_synchronizer_is_abstract() -> None:
    with pytest.raises(TypeError):
        LayerSynchronizer()  # type: ignore[abstract]
    assert _Sync().synchronize_layer(0, None)


def test_transfer_config() -> None:
    cfg = TransferConfig(3, [1, 2, 3, 4], range(0, 2))
    assert cfg.dst_cluster_id == 3 and cfg.dst_addrs == [1, 2, 3, 4] and cfg.src_layer_range == range(0, 2)
    assert cfg.src_batch_index == 0 and cfg.dst_layer_range is None
    cfg = TransferConfig(3, (1, 2, 3))  # no range: the length is checked against the cache later
    cfg.src_layer_range = range(1, 2)
    cfg.dst_addrs = [5, 6]
    cfg.dst_cluster_id = 9
    cfg.src_batch_index = 4
    assert (cfg.dst_cluster_id, cfg.dst_addrs, cfg.src_layer_range, cfg.src_batch_index) == (9, [5, 6], range(1, 2), 4)
    with raises_param_invalid("expect 4 dst_addrs") as excinfo:
        TransferConfig(3, [1, 2], range(0, 2))
    assert_param_invalid(excinfo)
    for bad in (range(0, 2, 2), range(1, 1), range(-1, 1)):
        with pytest.raises(LLMException):
            TransferConfig(3, [1, 2], bad)
        with pytest.raises(LLMException):
            cfg.src_layer_range = bad
    for args in (("3", [1, 2]), (3, None), (3, [1, "2"]), (3, 5), (3, [1, 2], (0, 1)), (3, [1, 2], None, "0")):
        with pytest.raises(TypeError):
            TransferConfig(*args)
    for args in ((-1, [1, 2]), (3, [-1, 2]), (3, [1, 2], None, -1), (3, [1, 2], None, 2**32)):
        with pytest.raises(ValueError):
            TransferConfig(*args)
    with pytest.raises(ValueError):
        cfg.dst_cluster_id = -1
    with pytest.raises(TypeError):
        cfg.dst_addrs = None  # type: ignore[assignment]
    with pytest.raises(ValueError):
        cfg.src_batch_index = -1
    cfg.src_layer_range = None
    assert cfg.src_layer_range is None


def test_transfer_with_cache_key_config() -> None:
    blocks_key = BlocksCacheKey(2, 0)
    cfg = TransferWithCacheKeyConfig(blocks_key, range(0, 2), range(3, 5))
    assert cfg.cache_key is blocks_key and cfg.dst_cluster_id == 2 and cfg.src_batch_index == 0
    assert (cfg.src_layer_range, cfg.dst_layer_range) == (range(0, 2), range(3, 5))
    id_key = CacheKeyByIdAndIndex(4, 1, 0)
    cfg2 = TransferWithCacheKeyConfig(id_key, range(0, 1), range(0, 1), src_batch_index=3)
    assert cfg2.dst_cluster_id == 4 and cfg2.src_batch_index == 3
    with pytest.raises(TypeError):
        TransferWithCacheKeyConfig(blocks_key)  # both ranges are required
    with pytest.raises(TypeError):
        TransferWithCacheKeyConfig(blocks_key, range(0, 1))
    with pytest.raises(TypeError):
        TransferWithCacheKeyConfig(CacheKey(1, 2), range(0, 1), range(0, 1))  # type: ignore[arg-type]
    with raises_param_invalid("size") as excinfo:
        TransferWithCacheKeyConfig(blocks_key, range(0, 2), range(0, 3))
    assert_param_invalid(excinfo)
    with raises_param_invalid("BlocksCacheKey") as excinfo:
        TransferWithCacheKeyConfig(blocks_key, range(0, 1), range(0, 1), src_batch_index=1)
    assert_param_invalid(excinfo)
    with pytest.raises(LLMException):
        TransferWithCacheKeyConfig(blocks_key, range(0, 2, 2), range(0, 1))
    with pytest.raises(ValueError):
        TransferWithCacheKeyConfig(id_key, range(0, 1), range(0, 1), src_batch_index=-1)
    # setters
    with pytest.raises(LLMException):
        cfg.src_batch_index = 1
    with pytest.raises(LLMException):
        cfg2.cache_key = blocks_key  # src_batch_index 3 is not allowed with a BlocksCacheKey
    cfg2.src_batch_index = 0
    cfg2.cache_key = blocks_key
    assert cfg2.dst_cluster_id == 2
    with pytest.raises(TypeError):
        cfg.src_layer_range = None  # type: ignore[assignment]
    with pytest.raises(TypeError):
        cfg.cache_key = None  # type: ignore[assignment]
    cfg.dst_layer_range = range(1, 3)
    assert cfg.dst_layer_range == range(1, 3)


def test_llm_datadist_is_the_engine_view_its_managers_are_typed_against() -> None:
    """``_engine.EngineView`` declares what managers and models use of ``LLMDataDist``; it must have it all."""
    import inspect

    import llm_datadist as ld
    from llm_datadist._engine import EngineView

    dd = ld.LLMDataDist(ld.LLMRole.PROMPT, 1)
    declared = set(EngineView.__annotations__) | {
        name for name, _ in inspect.getmembers(EngineView)
        if not name.startswith("__") and name not in ("_abc_impl", "_is_protocol", "_is_runtime_protocol")}
    missing = [name for name in sorted(declared) if not hasattr(type(dd), name) and name not in vars(dd)]
    assert declared >= {"_engine_id", "_call", "_check_init", "cluster_id"} and not missing, missing
