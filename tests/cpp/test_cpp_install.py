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
