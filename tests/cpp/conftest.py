from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cpp import make_cpp, toolchain_missing

#: CI installs the toolchain (.ci/run) and sets this: a missing toolchain fails the tests there instead of skipping
CI_ENV = "DATADIST_CI_CPP"


@pytest.fixture(scope="session")
def cpp_install() -> Path:
    """The installed C++ client (``make cpp``); skipped, saying why, where its toolchain is not installed."""
    why = toolchain_missing()
    if why:
        if os.environ.get(CI_ENV) == "1":
            pytest.fail(f"the C++ client cannot be built: {why}")
        pytest.skip(f"the C++ client's toolchain is not installed: {why}")
    return make_cpp()
