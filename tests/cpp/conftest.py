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


#: the first test of a session builds the library (make cpp: about a minute on two idle cores, several on a busy
#: machine) inside its setup; the programs each test runs have their own deadlines (subprocess timeouts)
BUILD_TIMEOUT_S = 1200


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    for item in items:
        if Path(str(item.fspath)).resolve().parent == here:
            item.add_marker(pytest.mark.timeout(BUILD_TIMEOUT_S))
