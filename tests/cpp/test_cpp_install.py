"""What ``make cpp`` installs: the layout a caller finds with pkg-config or CMake, and a library that exports the
API and nothing else (no std:: template instances, nothing of gRPC or protobuf to clash with the caller's)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def test_install_layout(cpp_install: Path) -> None:
    for rel in ("include/llm_datadist/llm_datadist.h", "lib/libllm_datadist.so", "lib/pkgconfig/llm_datadist.pc",
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
