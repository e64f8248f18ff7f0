"""A worker whose daemon address leads nowhere fails at once, naming where the address came from; only a daemon
that exists but does not answer yet is waited for (issue 29, finding 5)."""

from __future__ import annotations

import socket

import pytest

import llm_datadist as ld
from llm_datadist._rpc import DaemonClient

LLMStatusCode = ld.LLMStatusCode


def init_with(monkeypatch, target: str, option: bool = False) -> ld.LLMException:  # noqa: ANN001
    cfg = ld.LLMConfig()
    cfg.device_id = 0
    options = cfg.generate_options()
    if option:
        monkeypatch.delenv("DATADIST_DAEMON", raising=False)
        options["datadist.daemon"] = target
    else:
        monkeypatch.setenv("DATADIST_DAEMON", target)
    dd = ld.LLMDataDist(ld.LLMRole.DECODER, 2)
    with pytest.raises(ld.LLMException) as info:
        dd.init(options)
    assert info.value.status_code is LLMStatusCode.LLM_FAILED
    return info.value


def test_no_socket_file_fails_at_once_naming_the_variable(monkeypatch, tmp_path) -> None:
    target = f"unix://{tmp_path}/nope.sock"
    err = init_with(monkeypatch, target)
    assert f"no datadistd at {target} (from DATADIST_DAEMON): there is no socket file {tmp_path}/nope.sock" in str(err)


def test_a_socket_nobody_listens_on_fails_at_once(monkeypatch, tmp_path) -> None:
    path = str(tmp_path / "dead.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:   # bound, never listening: a dead daemon's file
        s.bind(path)
    err = init_with(monkeypatch, f"unix://{path}", option=True)
    assert f"(from the datadist.daemon option): nothing listens on {path}" in str(err)


def test_a_daemon_that_exists_but_does_not_answer_is_waited_for(tmp_path) -> None:
    path = str(tmp_path / "busy.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:   # accepts connections, never speaks gRPC
        s.bind(path)
        s.listen(8)
        client = DaemonClient(f"unix://{path}")
        try:
            with pytest.raises(ld.LLMException) as info:
                client.wait_ready(0.5)
        finally:
            client.close()
    assert "(from DATADIST_DAEMON) is not ready within 0.5s" in str(info.value)


def test_a_plain_socket_path_is_a_daemon_address_as_for_datadistctl(daemon_factory, worker_factory) -> None:
    """``DATADIST_DAEMON=/path/to.sock`` reaches the daemon, as it does for ``datadistctl`` (issue 37, item 8)."""
    from datadistd.process.ctl import resolve_socket

    daemon = daemon_factory("plain")
    assert resolve_socket(None, env={"DATADIST_DAEMON": daemon.socket}) == daemon.socket
    worker = worker_factory(daemon, DATADIST_DAEMON=daemon.socket)
    worker.call("init", "PROMPT", 1, mem_pool=1 << 20)
    worker.call("allocate", "kv", 1, (4, 16))      # the daemon's memory, reached through that address
    worker.call("fill", "kv", 3)


def test_a_daemon_address_of_another_scheme_is_refused_naming_both_forms(monkeypatch) -> None:
    monkeypatch.setenv("DATADIST_DAEMON", "dns:///127.0.0.1:26000")
    dd = ld.LLMDataDist(ld.LLMRole.DECODER, 2)
    cfg = ld.LLMConfig()
    cfg.device_id = 0
    with pytest.raises(ld.LLMException) as info:
        dd.init(cfg.generate_options())
    assert info.value.status_code is LLMStatusCode.LLM_PARAM_INVALID
    assert "unix socket only" in str(info.value) and "/run/datadist/datadistd.sock or unix://" in str(info.value)
