"""CANN's link rules that callers rely on (issue "behave like CANN for the real callers", items 4-8).

Each rule cites the CANN source it follows (see docs/choices.md, "Links"). Daemons and worker
processes on loopback; in `both_listen` either engine may link to the other.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from datadist.status import LLMStatusCode as S
from tests.harness import free_port
from tests.reliability.common import links

pytestmark = pytest.mark.integration

P, D = 1, 2


@pytest.fixture
def both_listen(daemon_factory, worker_factory):
    dp, dd = daemon_factory.many("p", "d")
    pport, dport = free_port(), free_port()
    prompt, decoder = worker_factory(dp), worker_factory(dd)
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{pport}", remote_cache_accessible=True)
    decoder.call("init", "DECODER", D, listen=f"127.0.0.1:{dport}", remote_cache_accessible=True)
    return prompt, decoder, pport, dport


def test_one_link_per_cluster_pair_whichever_side_set_it_up(both_listen) -> None:
    """LinkMsgHandler::ExchangeInfoProcess: an entity for the peer cluster exists -> LLM_ALREADY_LINK."""
    prompt, decoder, pport, dport = both_listen
    assert decoder.call("link", P, "127.0.0.1", pport) == (0, [0])
    assert decoder.call("link", P, "127.0.0.1", pport) == (S.LLM_ALREADY_LINK, [S.LLM_ALREADY_LINK])
    # the listening side linking back to the cluster that linked to it: the same link, already there
    assert prompt.call("link", D, "127.0.0.1", dport) == (S.LLM_ALREADY_LINK, [S.LLM_ALREADY_LINK])
    assert decoder.call("unlink", P, "127.0.0.1", pport) == (0, [0])
    # unlinked on both ends: now the prompt may set the link up in the other direction
    assert prompt.call("link", D, "127.0.0.1", dport) == (0, [0])
    assert decoder.call("link", P, "127.0.0.1", pport) == (S.LLM_ALREADY_LINK, [S.LLM_ALREADY_LINK])


def test_force_unlink_of_a_cluster_not_linked_succeeds(both_listen) -> None:
    """CommEntityManager::DestroyEntity of an unknown cluster logs a warning and returns SUCCESS."""
    prompt, decoder, pport, _ = both_listen
    assert decoder.call("unlink", P, "127.0.0.1", pport, force=True) == (0, [0])
    assert decoder.call("unlink", 77, "127.0.0.1", pport, force=True) == (0, [0])
    assert decoder.call("link", P, "127.0.0.1", pport) == (0, [0])
    assert decoder.call("unlink", P, "127.0.0.1", pport, force=True) == (0, [0])
    assert decoder.call("unlink", P, "127.0.0.1", pport, force=True) == (0, [0])  # omni_npu's reconnect path
    # without force an unknown cluster is still an error here (docs/choices.md)
    assert decoder.call("unlink", P, "127.0.0.1", pport) == (S.LLM_NOT_YET_LINK, [S.LLM_NOT_YET_LINK])
    # the prompt was not told (force): its end stays until the decoder links again, which replaces it
    assert decoder.call("link", P, "127.0.0.1", pport) == (0, [0])


def test_engines_of_one_daemon_may_share_a_cluster_id(daemon_factory, worker_factory) -> None:
    """omni-infer's older manager: every prefill TP rank has the same cluster id, one node daemon for them all.

    CANN requires ids to be unique only among parties that link to each other; a peer reaches the
    right engine by its listen address (and checks the cluster id there).
    """
    dp, dd = daemon_factory.many("p", "d")
    ports = [free_port(), free_port()]
    prefill = [worker_factory(dp), worker_factory(dp)]
    decode = [worker_factory(dd), worker_factory(dd)]
    for rank in range(2):
        prefill[rank].call("init", "PROMPT", 1000, listen=f"127.0.0.1:{ports[rank]}", remote_cache_accessible=True)
        decode[rank].call("init", "DECODER", 2000, remote_cache_accessible=True)
        prefill[rank].call("register_blocks", "kv", 2, 8, (4, 16), dtype="uint8", model_id=0)
        decode[rank].call("register_blocks", "kv", 2, 8, (4, 16), dtype="uint8")
        prefill[rank].call("fill", "kv", 10 + rank)
    for rank in range(2):
        assert decode[rank].call("link", 1000, "127.0.0.1", ports[rank]) == (0, [0])
        decode[rank].call("pull_blocks", 1000, "kv", [1, 2, 5], [0, 3, 7])
    for rank in range(2):
        np.testing.assert_array_equal(decode[rank].call("rows", "kv", None, [0, 3, 7]),
                                      prefill[rank].call("rows", "kv", None, [1, 2, 5]))
    assert not np.array_equal(prefill[0].call("rows", "kv"), prefill[1].call("rows", "kv"))
    for rank in range(2):
        assert decode[rank].call("unlink", 1000, "127.0.0.1", ports[rank]) == (0, [0])
        prefill[rank].call("finalize")


_EXITING_DECODER = """
import sys
import llm_datadist as ld

cfg = ld.LLMConfig()
cfg.device_id = 0
cfg.enable_cache_manager = True
dd = ld.LLMDataDist(ld.LLMRole.DECODER, 2)
dd.init(cfg.generate_options())
info = ld.LLMClusterInfo()
info.remote_cluster_id = 1
info.append_local_ip_info("127.0.0.1", 0)
info.append_remote_ip_info("127.0.0.1", int(sys.argv[1]))
code, _ = dd.link_clusters([info], 5000)
print("linked", int(code), flush=True)
# no finalize: the exit-time hook must unlink and tell the prompt
"""


def test_exit_time_finalize_of_an_embedded_engine_tells_the_peer(daemon_factory, worker_factory, tmp_path) -> None:
    """CANN finalizes at exit (``atexit.register(_shutdown_handler)``): the link goes on both ends, quietly."""
    dp = daemon_factory("p")
    port = free_port()
    prompt = worker_factory(dp)
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True)
    script = tmp_path / "decoder.py"
    script.write_text(_EXITING_DECODER)
    done = subprocess.run([sys.executable, str(script), str(port)], capture_output=True, text=True, timeout=60,
                          # embedded, no secret configured: the same per-user secret as the test daemon's
                          env={k: v for k, v in os.environ.items() if k != "DATADIST_DAEMON"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["linked", "0"]
    assert "Traceback" not in done.stderr and "LLM_FAILED" not in done.stderr, done.stderr
    # the prompt heard of the unlink: it has no link left to cluster 2 (its own unlink of it then succeeds once:
    # docs/choices.md, "An unlink after the other end went")
    assert links(dp) == []
    assert prompt.call("unlink", D, "127.0.0.1", 1) == (0, [0])
    assert prompt.call("unlink", D, "127.0.0.1", 1) == (S.LLM_NOT_YET_LINK, [S.LLM_NOT_YET_LINK])


def test_a_worker_restarted_at_once_gets_its_listen_address_back(daemon_factory, worker_factory) -> None:
    """A prompt worker dies and its replacement inits on the same listen address at once, while the daemon is
    still finalizing the old engine (telling its peers; a stopped peer makes that take its whole notify
    deadline): Init waits for the old engine to let the address go instead of "address already in use"."""
    import signal

    from tests.reliability.common import status, wait_until

    dp, dd = daemon_factory.many("p", "d")
    port = free_port()
    old, decoder, new = worker_factory(dp), worker_factory(dd), worker_factory(dp)
    old.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True)
    decoder.call("init", "DECODER", D, remote_cache_accessible=True)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    dd.proc.send_signal(signal.SIGSTOP)          # the old engine's peer will not answer its unlink notice
    try:
        old.kill()
        assert wait_until(lambda: not status(dp).engines, 10), status(dp)   # finalize has begun
        # the worker's call has its own deadline (60 s); the daemon waits at most RETIRING_WAIT_SECONDS (10 s)
        assert new.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True) == P
    finally:
        dd.proc.send_signal(signal.SIGCONT)


def test_a_worker_killed_during_its_finalize_gets_its_listen_address_back(daemon_factory, worker_factory) -> None:
    """The worker finalizes and is killed before the daemon finished (a supervisor's kill after its grace): the
    daemon's finalize must not die with the worker's call (it used to, holding the listen address for good), and
    the replacement's Init at once waits for it to let the address go (issue 37, item 10)."""
    import signal

    from tests.reliability.common import links, status, wait_until

    dp, dd = daemon_factory.many("p", "d")
    port = free_port()
    old, decoder, new = worker_factory(dp), worker_factory(dd), worker_factory(dp)
    old.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True)
    decoder.call("init", "DECODER", D, remote_cache_accessible=True)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    dd.proc.send_signal(signal.SIGSTOP)          # the old engine's peer will not answer its unlink notice
    try:
        old.send("finalize")
        assert wait_until(lambda: not status(dp).engines, 10), status(dp)   # the daemon's finalize has begun
        old.kill()                                                            # ... and its caller is gone
        assert new.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True) == P
    finally:
        dd.proc.send_signal(signal.SIGCONT)
    assert [e.listen_address for e in status(dp).engines] == [f"127.0.0.1:{port}"]
    # the old engine's finalize ran to its end: its peer was told, its memory returned
    assert wait_until(lambda: "(cluster 1) removed: finalize" in dp.log(), 15), dp.log()
    assert wait_until(lambda: not links(dd), 15), links(dd)
