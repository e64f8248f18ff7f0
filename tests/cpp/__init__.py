"""The C++ client (client/cpp, docs/cpp.md) built and run against real daemons: ``make cpp`` builds and installs
it; programs are compiled against the INSTALLED tree the way a user compiles (pkg-config, find_package)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

__all__ = ["ROOT", "INSTALL", "toolchain_missing", "make_cpp", "compile_program", "cmake_project"]

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "build" / "cpp" / "install"
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


def make_cpp() -> Path:
    """``make cpp`` (incremental): the install tree."""
    r = subprocess.run(["make", "-s", "-C", str(ROOT), "cpp"], capture_output=True, text=True, timeout=1200)
    if r.returncode != 0:
        raise RuntimeError(f"make cpp failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
    return INSTALL


def _env() -> dict[str, str]:
    return {**os.environ, "PKG_CONFIG_PATH": str(INSTALL / "lib" / "pkgconfig")}


def compile_program(source: Path, out: Path, *flags: str) -> Path:
    """``g++ source $(pkg-config --cflags --libs llm_datadist)`` with ``flags`` (e.g. the old libstdc++ ABI)."""
    pc = subprocess.run(["pkg-config", "--cflags", "--libs", "llm_datadist"], capture_output=True, text=True,
                        env=_env(), check=True).stdout.split()
    r = subprocess.run(["g++", "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", str(source), "-o", str(out), *pc,
                        *flags], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"compiling {source.name} failed:\n{r.stderr[-4000:]}")
    return out


def cmake_project(source_dir: Path, build_dir: Path) -> Path:
    """Configure and build a CMake project that does ``find_package(llm_datadist)``: its build directory."""
    for cmd in (["cmake", "-S", str(source_dir), "-B", str(build_dir), f"-DCMAKE_PREFIX_PATH={INSTALL}"],
                ["cmake", "--build", str(build_dir), "-j", "2"]):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return build_dir
