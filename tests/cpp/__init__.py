"""The C++ client (client/cpp, docs/cpp.md) built and run against real daemons: ``make cpp`` builds and installs
it; programs are compiled against the INSTALLED tree the way a user compiles (pkg-config, find_package)."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["ROOT", "INSTALL", "ASAN_INSTALL", "SANITIZE", "toolchain_missing", "make_cpp", "start_make_cpp",
           "stop_make_cpp", "compile_program", "cmake_project"]

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "build" / "cpp" / "install"
#: ``make cpp-asan``: the library under AddressSanitizer and UndefinedBehaviorSanitizer; programs linking it are
#: compiled with ``SANITIZE`` too
ASAN_INSTALL = ROOT / "build" / "cpp-asan" / "install"
SANITIZE = ("-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer")
#: the install tree of each make target the tests build
INSTALLS = {"cpp": INSTALL, "cpp-asan": ASAN_INSTALL}
#: held by whoever runs ``make cpp`` from the tests: a second build (another test process, or the fixture while the
#: background build of ``start_make_cpp`` runs) waits for the first and then finds nothing left to do (one lock per
#: target: ``make cpp-asan`` beside it)
LOCK = ROOT / "build" / "cpp" / "make.lock"
#: the background build's output
BACKGROUND_LOG = ROOT / "build" / "cpp" / "background.log"
TOOLS = ("cmake", "g++", "pkg-config", "protoc", "grpc_cpp_plugin", "make")
PACKAGES = "cmake g++ pkg-config libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev"


def toolchain_missing() -> str:
    """Why the C++ client cannot be built here ("" when it can)."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"missing {' '.join(missing)} (apt-get install {PACKAGES})"
    if subprocess.run(["pkg-config", "--exists", "grpc++", "protobuf"]).returncode != 0:
        return f"pkg-config finds no grpc++/protobuf (apt-get install {PACKAGES})"
    return ""


def make_cpp(timeout: float = 1200.0, target: str = "cpp") -> Path:
    """``make <target>`` (``cpp`` or ``cpp-asan``, incremental) under its lock, the wait for the lock and the build
    ``timeout`` seconds in all: the install tree. RuntimeError with make's output when it fails, TimeoutError past
    the deadline."""
    deadline = time.monotonic() + timeout
    path = LOCK if target == "cpp" else INSTALLS[target].parent / "make.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:
        while True:   # polls every 0.2 s until the lock is free or the deadline
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"make {target}: another build held {path} for {timeout:.0f} s") from None
                time.sleep(0.2)
        try:
            r = subprocess.run(["make", "-s", "-C", str(ROOT), target], capture_output=True, text=True,
                               timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"make {target} did not finish within {timeout:.0f} s") from None
    if r.returncode != 0:
        raise RuntimeError(f"make {target} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
    return INSTALLS[target]


def start_make_cpp(targets: tuple[str, ...] = ("cpp",)) -> subprocess.Popen[bytes]:
    """``make_cpp`` of each of ``targets`` in turn in a background process (niced: the tests that run meanwhile come
    first), output in ``BACKGROUND_LOG``; ``make_cpp`` joins it (the target's lock) and reports a failure with make's
    own output."""
    BACKGROUND_LOG.parent.mkdir(parents=True, exist_ok=True)
    with open(BACKGROUND_LOG, "wb") as log:
        return subprocess.Popen([sys.executable, "-c", "import os, sys; os.nice(10); from tests.cpp import make_cpp; "
                                 "[make_cpp(target=t) for t in sys.argv[1:]]", *targets], cwd=ROOT,
                                stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def stop_make_cpp(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """End a background build (its whole process group: make and the compilers) if it still runs; reap it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            continue


def _env(install: Path = INSTALL) -> dict[str, str]:
    return {**os.environ, "PKG_CONFIG_PATH": str(install / "lib" / "pkgconfig")}


def run_build(cmd: list[str], what: str, timeout: float = 300) -> None:
    """A compiler or build step of a test, niced as the background ``make cpp`` is (``start_make_cpp``): the daemons
    the other test processes time meanwhile come first. RuntimeError with its output when it fails."""
    r = subprocess.run(["nice", "-n", "10", *cmd], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{r.stdout[-3000:]}\n{r.stderr[-4000:]}")


def compile_program(source: Path, out: Path, *flags: str, install: Path = INSTALL,
                    package: str = "llm_datadist") -> Path:
    """``g++ source $(pkg-config --cflags --libs <package>)`` with ``flags`` (e.g. the old libstdc++ ABI), against
    the library in ``install`` (``ASAN_INSTALL``: add ``SANITIZE`` to ``flags``)."""
    pc = subprocess.run(["pkg-config", "--cflags", "--libs", package], capture_output=True, text=True,
                        env=_env(install), check=True).stdout.split()
    run_build(["g++", "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", str(source), "-o", str(out), *pc, *flags],
          f"compiling {source.name}")
    return out


def cmake_project(source_dir: Path, build_dir: Path) -> Path:
    """Configure and build a CMake project that does ``find_package(llm_datadist)``: its build directory."""
    for cmd in (["cmake", "-S", str(source_dir), "-B", str(build_dir), f"-DCMAKE_PREFIX_PATH={INSTALL}"],
                ["cmake", "--build", str(build_dir), "-j", "2"]):
        run_build(cmd, " ".join(cmd))
    return build_dir
