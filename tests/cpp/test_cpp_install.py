"""What ``make cpp`` installs: the layout a caller finds with pkg-config or CMake, and a library that exports the
API and nothing else (no std:: template instances, nothing of gRPC or protobuf to clash with the caller's)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cpp import compile_program


def test_install_layout(cpp_install: Path) -> None:
    for rel in ("include/llm_datadist/llm_datadist.h", "include/llm_datadist/llm_error_codes.h",
                "lib/libllm_datadist.so", "lib/pkgconfig/llm_datadist.pc",
                "lib/cmake/llm_datadist/llm_datadistConfig.cmake",
                "lib/cmake/llm_datadist/llm_datadistConfigVersion.cmake",
                "lib/cmake/llm_datadist/llm_datadistTargets.cmake"):
        assert (cpp_install / rel).exists(), rel
    pc = (cpp_install / "lib/pkgconfig/llm_datadist.pc").read_text()
    assert f"prefix={cpp_install}" in pc and "-lllm_datadist" in pc


def test_library_exports_the_api_only(cpp_install: Path) -> None:
    if shutil.which("nm") is None:
        pytest.skip("no nm (binutils)")
    out = subprocess.run(["nm", "-DC", "--defined-only", str(cpp_install / "lib/libllm_datadist.so")],
                         capture_output=True, text=True, check=True).stdout
    names = [line.split(" ", 2)[2] for line in out.splitlines() if line.count(" ") >= 2]
    assert any(n.startswith("llm_datadist::LlmDataDist::PullKvBlocks(") for n in names)
    assert any(n.startswith("ge::AscendString::AscendString(") for n in names)
    others = [n for n in names if not n.startswith(("llm_datadist::", "ge::"))]
    assert not others, others
    assert not [n for n in names if "LlmDataDistImpl" in n]   # the implementation stays inside


def test_hixl_install_layout(cpp_install: Path) -> None:
    """CANN's HIXL headers where CANN installs them (hixl/hixl.h includes "hixl_types.h", which includes
    external/ge_common/api_error_codes.h), libcann_hixl.so, and how a caller finds it: pkg-config cann_hixl (which
    requires llm_datadist: ge::AscendString lives in libllm_datadist.so) and find_package(cann_hixl)."""
    for rel in ("include/hixl/hixl.h", "include/hixl/hixl_types.h", "include/external/ge_common/api_error_codes.h",
                "lib/libcann_hixl.so", "lib/pkgconfig/cann_hixl.pc", "lib/cmake/cann_hixl/cann_hixlConfig.cmake",
                "lib/cmake/cann_hixl/cann_hixlConfigVersion.cmake"):
        assert (cpp_install / rel).exists(), rel
    assert list((cpp_install / "lib/cmake/cann_hixl").glob("cann_hixlTargets*.cmake"))
    pc = (cpp_install / "lib/pkgconfig/cann_hixl.pc").read_text()
    assert f"prefix={cpp_install}" in pc and "-lcann_hixl" in pc and "Requires: llm_datadist" in pc
    env = {**os.environ, "PKG_CONFIG_PATH": str(cpp_install / "lib" / "pkgconfig")}
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "cann_hixl"], capture_output=True, text=True, env=env,
                           check=True).stdout.split()
    assert "-lcann_hixl" in flags and "-lllm_datadist" in flags and f"-I{cpp_install / 'include'}" in flags


def test_hixl_library_exports_the_api_only(cpp_install: Path) -> None:
    """libcann_hixl.so exports hixl::Hixl's members and nothing else: not its implementation, no std:: template
    instances, nothing of gRPC or protobuf (those stay in the private libdatadist_cpp.so)."""
    if shutil.which("nm") is None:
        pytest.skip("no nm (binutils)")
    out = subprocess.run(["nm", "-DC", "--defined-only", str(cpp_install / "lib/libcann_hixl.so")],
                         capture_output=True, text=True, check=True).stdout
    names = [line.split(" ", 2)[2] for line in out.splitlines() if line.count(" ") >= 2]
    for method in ("Initialize", "RegisterMem", "TransferAsync", "GetTransferStatus", "SendNotify", "GetCapability"):
        assert any(n.startswith(f"hixl::Hixl::{method}(") for n in names), method
    others = [n for n in names if not n.startswith("hixl::")]
    assert not others, others
    assert not [n for n in names if "HixlImpl" in n or "ConnectPool" in n]   # the implementation stays inside


CPP = Path(__file__).resolve().parents[2] / "client" / "cpp"
#: CANN's C++ spelling where it differs from the Python member's name
CPP_NAMES = {"LLM_WAIT_PROCESS_TIMEOUT": "LLM_WAIT_PROC_TIMEOUT", "LLM_SEQ_LENOVERLIMIT": "LLM_SEQ_LEN_OVER_LIMIT"}


def test_status_and_data_type_tables_match_the_one_table() -> None:
    """The C++ header's status constants and ge::DataType values, and the library's code table, are the values of
    datadist.status / datadist.dtypes (the one status and data-type tables): no C++ copy drifts."""
    import re

    from datadist.dtypes import DataType
    from datadist.status import LLMStatusCode

    header = (CPP / "include" / "llm_datadist" / "llm_datadist.h").read_text()
    declared = {m[0]: int(m[1], 16) for m in re.findall(r"constexpr Status (LLM_\w+) = (0x[0-9A-F]+)U;", header)}
    assert len(declared) == 18
    python = {CPP_NAMES.get(m.name, m.name): int(m) for m in LLMStatusCode}
    assert {n: python[n] for n in declared} == declared
    table = (CPP / "src" / "common.cc").read_text()
    entries = re.findall(r'\{([^,{}]+), "(LLM_\w+)"\}', table)
    known = {sum(int(x, 0) for x in e.replace("kBase", "0x5010B000").replace("U", "").split("+")): n
             for e, n in entries}
    assert known == {int(m): CPP_NAMES.get(m.name, m.name) for m in LLMStatusCode if int(m) >= 0}
    types = dict(re.findall(r"\n  (DT_\w+) = (\d+),", header))
    assert {m.name: m.value for m in DataType} == {n: int(types[n]) for n in (m.name for m in DataType)}


#: CANN's code numbers of the ge::LLM_* codes its llm_error_codes.h declares (value: 0x5010B000 + the number)
CANN_ERROR_CODES = {
    "LLM_WAIT_PROC_TIMEOUT": 1, "LLM_KV_CACHE_NOT_EXIST": 2, "LLM_REPEAT_REQUEST": 3,
    "LLM_REQUEST_ALREADY_COMPLETED": 4, "LLM_PARAM_INVALID": 5, "LLM_ENGINE_FINALIZED": 6, "LLM_NOT_YET_LINK": 7,
    "LLM_ALREADY_LINK": 8, "LLM_LINK_FAILED": 9, "LLM_UNLINK_FAILED": 10, "LLM_NOTIFY_PROMPT_UNLINK_FAILED": 11,
    "LLM_CLUSTER_NUM_EXCEED_LIMIT": 12, "LLM_PROCESSING_LINK": 13, "LLM_DEVICE_OUT_OF_MEMORY": 14,
    "LLM_PREFIX_ALREADY_EXIST": 15, "LLM_PREFIX_NOT_EXIST": 16, "LLM_SEQ_LEN_OVER_LIMIT": 17, "LLM_NO_FREE_BLOCK": 18,
    "LLM_BLOCKS_OUT_OF_MEMORY": 19, "LLM_CACHE_INCOMPATIBLE": 20, "LLM_CACHE_KEY_ALREADY_EXIST": 21,
    "LLM_COPY_CACHE_FAILED": 22, "LLM_CACHE_ID_ALREADY_EXIST": 23, "LLM_EXIST_LINK": 24,
    "LLM_FEATURE_NOT_ENABLED": 25, "LLM_TIMEOUT": 26, "LLM_LINK_BUSY": 27, "LLM_OUT_OF_MEMORY": 28}


def test_error_codes_header_has_canns_names_and_the_one_tables_values() -> None:
    """llm_error_codes.h declares every ge::LLM_* code of CANN's header, with CANN's value, and where datadist.status
    has the code, the same value."""
    import re

    from datadist.status import LLMStatusCode

    header = (CPP / "include" / "llm_datadist" / "llm_error_codes.h").read_text()
    declared = {m[0]: int(m[1], 16) for m in re.findall(r"constexpr Status (LLM_\w+) = (0x[0-9A-F]+)U;", header)}
    assert declared == {name: 0x5010B000 + n for name, n in CANN_ERROR_CODES.items()}
    python = {CPP_NAMES.get(m.name, m.name): int(m) for m in LLMStatusCode}
    assert {n: v for n, v in declared.items() if n in python} == {n: python[n] for n in declared if n in python}


#: CANN code that includes llm_error_codes.h (alone, and beside llm_datadist.h in either order) and uses ge::LLM_*
ERROR_CODES_PROGRAM = r"""
#include "llm_datadist/llm_error_codes.h"
#include "llm_datadist/llm_datadist.h"
#include "llm_datadist/llm_error_codes.h"
#include <cstdio>

static_assert(ge::LLM_PARAM_INVALID == llm_datadist::LLM_PARAM_INVALID, "one value");
static_assert(ge::LLM_TIMEOUT == 0x5010B01AU, "CANN's value");

static const char *Name(ge::Status ret) {
  switch (ret) {
    case ge::SUCCESS: return "SUCCESS";
    case ge::LLM_PARAM_INVALID: return "LLM_PARAM_INVALID";
    case ge::LLM_NOT_YET_LINK: return "LLM_NOT_YET_LINK";
    case ge::LLM_KV_CACHE_NOT_EXIST: return "LLM_KV_CACHE_NOT_EXIST";
    case ge::LLM_CACHE_ID_ALREADY_EXIST: return "LLM_CACHE_ID_ALREADY_EXIST";
    default: return "other";
  }
}

int main() {
  llm_datadist::LlmDataDist datadist(1U, llm_datadist::LlmRole::kDecoder);
  // no Initialize: CANN refuses a call before it, and so does the library
  ge::Status ret = datadist.DeallocateCache(1);
  std::printf("%s %s %s\n", Name(ge::LLM_PARAM_INVALID), Name(ge::LLM_KV_CACHE_NOT_EXIST),
              ret == ge::SUCCESS ? "ok" : "refused");
  return 0;
}
"""


def test_a_program_using_canns_error_codes_header_builds_and_runs(cpp_install: Path, tmp_path: Path) -> None:
    """Issue 44, trip 8: code that includes CANN's public llm_datadist/llm_error_codes.h did not compile (it was not
    installed)."""
    source = tmp_path / "error_codes.cc"
    source.write_text(ERROR_CODES_PROGRAM)
    program = compile_program(source, tmp_path / "error_codes")
    done = subprocess.run([str(program)], capture_output=True, text=True, timeout=60)   # pkg-config's rpath
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("LLM_PARAM_INVALID LLM_KV_CACHE_NOT_EXIST "), done.stdout
