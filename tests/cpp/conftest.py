from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.cpp import make_cpp, start_make_cpp, stop_make_cpp, toolchain_missing

#: CI installs the toolchain (.ci/run) and sets this: a missing toolchain fails the tests there instead of skipping
CI_ENV = "DATADIST_CI_CPP"
HERE = Path(__file__).resolve().parent

#: ``make cpp`` started in the background when the session's tests are collected (when any of them needs the
#: library and the toolchain is there), so the build (about a minute on two idle cores) overlaps the tests that run
#: before the first C++ test instead of running inside that test's setup; ``cpp_install`` joins it
_background: list[subprocess.Popen[bytes]] = []


def _needs_library(item: pytest.Item, fixture: str = "cpp_install") -> bool:
    return Path(str(item.fspath)).resolve().parent == HERE and fixture in getattr(item, "fixturenames", ())


def pytest_collection_finish(session: pytest.Session) -> None:
    targets = tuple(target for target, fixture in (("cpp", "cpp_install"), ("cpp-asan", "cpp_asan_install"))
                    if any(_needs_library(i, fixture) for i in session.items))
    if session.config.option.collectonly or not targets:
        return
    if not toolchain_missing():
        _background.append(start_make_cpp(targets))


def pytest_sessionfinish(session: pytest.Session) -> None:
    for proc in _background:   # the C++ tests were deselected, failed early or the run was interrupted
        stop_make_cpp(proc)


@pytest.fixture(scope="session")
def cpp_install() -> Path:
    """The installed C++ client (``make cpp``, joining the background build); skipped, saying why, where its
    toolchain is not installed (failed instead where CI installs it)."""
    why = toolchain_missing()
    if why:
        if os.environ.get(CI_ENV) == "1":
            pytest.fail(f"the C++ client cannot be built: {why}")
        pytest.skip(f"the C++ client's toolchain is not installed: {why}")
    return make_cpp(timeout=BUILD_TIMEOUT_S - 60)


@pytest.fixture(scope="session")
def cpp_asan_install() -> Path:
    """The C++ client built under AddressSanitizer and UndefinedBehaviorSanitizer (``make cpp-asan``, joining the
    background build); skipped or failed as ``cpp_install``."""
    why = toolchain_missing()
    if why:
        if os.environ.get(CI_ENV) == "1":
            pytest.fail(f"the C++ client cannot be built: {why}")
        pytest.skip(f"the C++ client's toolchain is not installed: {why}")
    return make_cpp(timeout=BUILD_TIMEOUT_S - 60, target="cpp-asan")


#: the first test that needs the library waits for the build (make cpp: about a minute on two idle cores, several
#: on a busy machine) inside its setup; the programs each test runs have their own deadlines (subprocess timeouts)
BUILD_TIMEOUT_S = 1200


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).resolve().parent == HERE:
            item.add_marker(pytest.mark.timeout(BUILD_TIMEOUT_S))
