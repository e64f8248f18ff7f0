"""The HIXL examples in C++ (docs/examples/hixl/cpp: a server and a client over hixl::Hixl), built with CMake's
find_package(cann_hixl) against the installed library and run as docs/hixl.md runs them: the server until it prints
its ready line, then the client with the two arguments that line ends in (nothing else passes between them; stdin is
closed), through two daemons. The C++ and Python programs are each other's peers too: both print and read the same
line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.cpp import ROOT, cmake_project
from tests.cpp.test_cpp_examples import Program
from tests.harness import free_port
from tests.integration.test_examples import full_log, warnings_in

pytestmark = pytest.mark.integration

HIXL = ROOT / "docs" / "examples" / "hixl"
READY = "run the client with:"


@pytest.fixture(scope="module")
def examples(cpp_install: Path, tmp_path_factory) -> Path:
    return cmake_project(HIXL / "cpp", tmp_path_factory.mktemp("hixl-examples"))


def command(examples: Path, language: str, name: str) -> list[str]:
    return [str(examples / name)] if language == "cpp" else [sys.executable, str(HIXL / f"{name}.py")]


def output(program: Program, timeout: float = 60.0) -> tuple[int, str]:
    """The exit status and every line, once the program printed its last line ("finalized")."""
    program.wait_for("finalized", timeout)
    return program.finish(), "\n".join(program.lines)


@pytest.mark.parametrize("server_language, client_language", [("cpp", "cpp"), ("py", "cpp"), ("cpp", "py")])
def test_the_hixl_examples_through_two_daemons(examples, daemon_factory, server_language, client_language) -> None:
    ds, dc = daemon_factory.many("s", "c")
    server = Program([*command(examples, server_language, "server"), f"127.0.0.1:{free_port()}"],
                     {"DATADIST_DAEMON": ds.target})
    client = None
    try:
        args = server.wait_for(READY).split(READY, 1)[1].split()
        client = Program([*command(examples, client_language, "client"), *args], {"DATADIST_DAEMON": dc.target})
        c_code, c_out = output(client)
        s_code, s_out = output(server)
    finally:
        for p in (server, client):
            if p is not None and p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait()
    assert c_code == 0 and "READ of 256 extents: SUCCESS" in c_out and "0 bytes differ" in c_out, c_out
    assert "the WRITE is COMPLETED" in c_out and "done: SUCCESS" in c_out, c_out
    assert s_code == 0 and "notify 'done': 'wrote 1048576 bytes'" in s_out, s_out
    assert "checked the client's WRITE: 0 bytes differ" in s_out, s_out
    for d in (ds, dc):
        assert not warnings_in(full_log(d)), (d.name, warnings_in(full_log(d)))


def test_a_failing_call_exits_1_naming_its_status(examples, daemon_factory) -> None:
    """A client whose server is not there: its Connect fails (FAILED), it exits 1. A server never told "done" gives
    up after its timeout (1 s) and exits 1. (Apart, at once: neither outcome may hang on the other's timing.)"""
    ds, dc = daemon_factory.many("s", "c")
    port = free_port()
    client = Program([str(examples / "client"), f"127.0.0.1:{port}", "0x1000"], {"DATADIST_DAEMON": dc.target})
    server = Program([str(examples / "server"), f"127.0.0.1:{free_port()}", "1"], {"DATADIST_DAEMON": ds.target})
    try:
        assert client.wait_for("client: Connect") == f"client: Connect 127.0.0.1:{port} failed: FAILED"
        assert client.finish() == 1
        server.wait_for('no "done" notify within 1 s')
        assert server.finish() == 1
    finally:
        for p in (client, server):
            if p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait()


def test_the_commands_of_docs_hixl_md_are_the_ones_tested() -> None:
    doc = (ROOT / "docs" / "hixl.md").read_text()
    build = "build/cpp/hixl-examples"
    for line in (f"cmake -S docs/examples/hixl/cpp -B {build} -DCMAKE_PREFIX_PATH=$PWD/build/cpp/install",
                 f"cmake --build {build}"):
        assert line in doc and line in (HIXL / "cpp" / "CMakeLists.txt").read_text(), line
