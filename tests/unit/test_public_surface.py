"""The public surface of llm_datadist is CANN's: names (spec §0.1), signatures and defaults."""

from __future__ import annotations

import inspect

import pytest

import llm_datadist as ld

SPEC_ALL = ["LLMClusterInfo", "LLMStatusCode", "LLMException", "LLMRole", "LlmConfig", "LLMConfig", "DataType",
            "Status", "CacheDesc", "CacheKey", "CacheKeyByIdAndIndex", "KvCache", "Cache", "BlocksCacheKey",
            "LLMDataDist", "Placement", "RegisterMemStatus", "LayerSynchronizer", "TransferConfig", "CacheTask",
            "TransferWithCacheKeyConfig", "Memtype", "MemInfo", "TensorDesc", "Tensor", "KvCacheManager"]


def test_all_is_exactly_the_spec_list() -> None:
    assert sorted(ld.__all__) == sorted(SPEC_ALL)
    for name in SPEC_ALL:
        assert getattr(ld, name) is not None, name
    assert ld.LLMConfig is ld.LlmConfig
    assert isinstance(ld.v2_list, list)


def test_import_side_effect_sets_auto_use_uc_memory() -> None:
    import os

    assert os.environ.get("AUTO_USE_UC_MEMORY") is not None


def params(obj) -> list[tuple[str, object]]:  # noqa: ANN001
    sig = inspect.signature(obj)
    return [(p.name, p.default if p.default is not inspect.Parameter.empty else "<required>")
            for p in sig.parameters.values() if p.name != "self"]


UINT64_MAX = 2**64 - 1

SIGNATURES = {
    ld.LLMDataDist.__init__: [("role", "<required>"), ("cluster_id", "<required>")],
    ld.LLMDataDist.init: [("options", "<required>")],
    ld.LLMDataDist.link_clusters: [("clusters", "<required>"), ("timeout", 3000)],
    ld.LLMDataDist.unlink_clusters: [("clusters", "<required>"), ("timeout", 3000), ("force", False)],
    ld.LLMDataDist.link: [("comm_name", "<required>"), ("cluster_rank_info", "<required>"),
                          ("rank_table", "<required>")],
    ld.LLMDataDist.unlink: [("comm_id", "<required>")],
    ld.LLMDataDist.query_register_mem_status: [("comm_id", "<required>")],
    ld.LLMDataDist.switch_role: [("role", "<required>"), ("switch_options", None)],
    ld.LLMDataDist.check_link_status: [("remote_cluster_id", "<required>")],
    ld.CacheDesc.__init__: [("num_tensors", "<required>"), ("shape", "<required>"), ("data_type", "<required>"),
                            ("placement", ld.Placement.DEVICE), ("batch_dim_index", 0), ("seq_len_dim_index", -1),
                            ("kv_tensor_format", None)],
    ld.CacheKeyByIdAndIndex.__init__: [("cluster_id", "<required>"), ("cache_id", "<required>"),
                                       ("batch_index", 0)],
    ld.TransferConfig.__init__: [("dst_cluster_id", "<required>"), ("dst_addrs", "<required>"),
                                 ("src_layer_range", None), ("src_batch_index", 0)],
    ld.TransferWithCacheKeyConfig.__init__: [("cache_key", "<required>"), ("src_layer_range", None),
                                             ("dst_layer_range", None), ("src_batch_index", 0)],
    ld.MemInfo.__init__: [("mem_type", "<required>"), ("addr", "<required>"), ("size", "<required>")],
    ld.CacheTask.synchronize: [("timeout_in_millis", None)],
    ld.CacheTask.get_results: [("timeout_in_millis", None)],
    ld.LayerSynchronizer.synchronize_layer: [("layer_index", "<required>"), ("timeout_in_millis", "<required>")],
}


@pytest.mark.parametrize("func", list(SIGNATURES), ids=lambda f: f.__qualname__)
def test_signature(func) -> None:  # noqa: ANN001
    assert params(func) == SIGNATURES[func]


def test_cache_manager_signatures() -> None:
    from llm_datadist.cache_manager import CacheManager

    expected = {
        "allocate_cache": [("cache_desc", "<required>"), ("cache_keys", ())],
        "allocate_blocks_cache": [("cache_desc", "<required>"), ("blocks_cache_key", None)],
        "register_cache": [("cache_desc", "<required>"), ("addrs", "<required>"), ("cache_keys", ()),
                           ("remote_accessible", None)],
        "register_blocks_cache": [("cache_desc", "<required>"), ("addrs", "<required>"),
                                  ("blocks_cache_key", None), ("remote_accessible", None)],
        "unregister_cache": [("cache_id", "<required>")],
        "deallocate_cache": [("cache", "<required>")],
        "deallocate_blocks_cache": [("cache", "<required>")],
        "remove_cache_key": [("cache_key", "<required>")],
        "copy_cache": [("dst", "<required>"), ("src", "<required>"), ("dst_batch_index", 0), ("src_batch_index", 0),
                       ("offset", 0), ("size", -1), ("req_id", None)],
        "copy_blocks": [("cache", "<required>"), ("copy_block_info", "<required>")],
        "swap_blocks": [("src_cache", "<required>"), ("dst_cache", "<required>"), ("src_to_dst", "<required>")],
        "pull_cache": [("cache_key", "<required>"), ("cache", "<required>"), ("batch_index", 0), ("size", -1),
                       ("kwargs", "<required>")],
        "pull_blocks": [("src_cache_key", "<required>"), ("dst_cache", "<required>"), ("src_blocks", ()),
                        ("dst_blocks", ()), ("kwargs", "<required>")],
        "push_cache": [("dst_cache_key", "<required>"), ("src_cache", "<required>"), ("src_batch_index", 0),
                       ("src_layer_range", None), ("dst_layer_range", None), ("size", -1),
                       ("tensor_num_per_layer", 2)],
        "push_blocks": [("dst_cache_key", "<required>"), ("src_cache", "<required>"), ("src_blocks", ()),
                        ("dst_blocks", ()), ("src_layer_range", None), ("dst_layer_range", None),
                        ("tensor_num_per_layer", 2)],
        "transfer_cache_async": [("src_cache", "<required>"), ("layer_synchronizer", "<required>"),
                                 ("transfer_configs", "<required>"), ("src_block_indices", None),
                                 ("dst_block_indices", None), ("dst_block_memory_size", None)],
        "remap_registered_memory": [("mem_infos", "<required>")],
    }
    for name, want in expected.items():
        assert params(getattr(CacheManager, name)) == want, name


def test_enum_values() -> None:
    assert [int(r) for r in (ld.LLMRole.PROMPT, ld.LLMRole.DECODER, ld.LLMRole.MIX)] == [1, 2, 3]
    assert (int(ld.Placement.HOST), int(ld.Placement.DEVICE)) == (0, 1)
    assert ld.DataType.DT_BF16.value == 27 and ld.DataType.DT_FLOAT16.value == 1
    assert ld.RegisterMemStatus.OK.value == 0 and ld.Memtype.MEM_TYPE_HOST.value == 1
    assert int(ld.LLMStatusCode.LLM_PARAM_INVALID) == 0x5010B005
    assert int(ld.LLMStatusCode.LLM_FAILED) == 0xFFFFFFFF
    assert hasattr(ld.LLMStatusCode, "LLM_SEQ_LENOVERLIMIT")
    assert issubclass(ld.LLMException, RuntimeError)
    assert ld.LLMException("x", status_code=ld.LLMStatusCode.LLM_TIMEOUT).status_code is ld.LLMStatusCode.LLM_TIMEOUT


def test_client_does_not_import_daemon_internals() -> None:
    import subprocess
    import sys

    code = ("import sys, llm_datadist, llm_datadist.cache_manager, llm_datadist.views; "
            "print(sorted(m for m in sys.modules if m.startswith('datadistd')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_py_typed_ships() -> None:
    from pathlib import Path

    assert (Path(ld.__file__).parent / "py.typed").exists()
