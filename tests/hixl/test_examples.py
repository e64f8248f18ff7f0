"""docs/examples/hixl run as a user runs them: ``python server.py <engine>``, then ``python client.py`` with the two
arguments the server printed -- nothing else passes between them -- through two real daemons and embedded; a
failing call or a missing notify makes each exit 1 naming why; docs/hixl.md's Quick start is an excerpt of them."""

from __future__ import annotations

import re

import pytest

from tests.harness import ROOT, Daemon, free_port
from tests.integration.test_examples import EXAMPLES, Script, assert_excerpt, full_log, user_env, warnings_in

pytestmark = pytest.mark.integration

READY = "run the client with:"


def client_args(ready_line: str) -> list[str]:
    """The server's engine string and buffer address, as its ready line gives them to the user."""
    return ready_line.split(READY, 1)[1].split()


def run_pair(server_env: dict[str, str], client_env: dict[str, str]) -> tuple[str, str]:
    """The server until it is ready, then the client with what it printed; both must exit 0, every byte right."""
    server = Script("hixl/server.py", [f"127.0.0.1:{free_port()}", "--timeout", "60"], server_env)
    try:
        client = Script("hixl/client.py", client_args(server.wait_for(READY)), client_env)
        try:
            c_code, c_out = client.finish()
        finally:
            client.kill()
        s_code, s_out = server.finish()
    finally:
        server.kill()
    assert c_code == 0, c_out
    assert "transfer_sync READ of 256 extents: SUCCESS" in c_out, c_out
    assert re.search(r"read 1048576 bytes in [\d.]+ ms; 0 bytes differ", c_out), c_out
    assert "the WRITE is COMPLETED" in c_out and "send_notify done: SUCCESS" in c_out, c_out
    assert s_code == 0, s_out
    assert "notify 'done': 'wrote 1048576 bytes'" in s_out, s_out
    assert "checked the client's WRITE: 0 bytes differ" in s_out and "server: finalized" in s_out, s_out
    return s_out, c_out


def test_the_hixl_examples_through_two_daemons() -> None:
    """As docs/hixl.md runs them, one daemon per "node": no warning in either daemon's log."""
    daemons = Daemon.start_all([Daemon("hixl-s"), Daemon("hixl-c")])
    try:
        run_pair(user_env(DATADIST_DAEMON=daemons[0].target), user_env(DATADIST_DAEMON=daemons[1].target))
        for d in daemons:
            assert not warnings_in(full_log(d)), (d.name, warnings_in(full_log(d)))
    finally:
        for d in daemons:
            d.discard()


def test_the_hixl_examples_embedded() -> None:
    """No DATADIST_DAEMON: each program starts its own daemon, whose warnings would reach its output."""
    for out in run_pair(user_env(), user_env()):
        assert "WARNING" not in out and "ERROR" not in out, out


def test_a_failing_call_exits_1_naming_its_status() -> None:
    """A client whose server is not there: its connect fails (FAILED), it exits 1. A server never told "done" gives
    up after its --timeout and exits 1. (Apart, at once: neither outcome may hang on the other's timing.)"""
    client = Script("hixl/client.py", [f"127.0.0.1:{free_port()}", "0x1000"], user_env())
    server = Script("hixl/server.py", [f"127.0.0.1:{free_port()}", "--timeout", "1"], user_env())
    try:
        c_code, c_out = client.finish()
        s_code, s_out = server.finish()
    finally:
        client.kill()
        server.kill()
    assert c_code == 1 and re.search(r"client: connect 127\.0\.0\.1:\d+ failed: FAILED", c_out), c_out
    assert "client: finalized" in c_out, c_out
    assert s_code == 1 and 'no "done" notify within 1 s' in s_out and "server: finalized" in s_out, s_out


def test_the_quick_start_is_an_excerpt_of_the_examples() -> None:
    """Every code line of docs/hixl.md's python blocks is a line of the examples (server.py, then client.py), in
    their order; comment lines are the page's own."""
    assert_excerpt(ROOT / "docs" / "hixl.md", [EXAMPLES / "hixl" / "server.py", EXAMPLES / "hixl" / "client.py"])
