"""Workers of one user on one host link with nothing configured, whichever of them runs behind a daemon and which
embeds one (issue 37, item 2): both read the user's own peer secret. Where two sides still hold different secrets,
the failure says which each uses (kind, path, fingerprint -- never the secret) and how to give both the same."""

from __future__ import annotations

import os
import re
import shutil
import tempfile

import numpy as np
import pytest

from datadist.status import LLMStatusCode as S
from datadistd.ops.config import PeerSection
from datadistd.ops.peersecret import peer_secret
from tests.harness import free_port

pytestmark = pytest.mark.integration

P, D = 1, 2
TENSORS, BLOCKS, BLOCK_SHAPE = 2, 8, (4, 16)


@pytest.fixture
def runtime_dirs():
    """Two private ``XDG_RUNTIME_DIR``s: where a user's per-user secret lives (two of them play two secrets)."""
    dirs = [tempfile.mkdtemp(prefix="datadist-xdg-") for _ in range(2)]
    yield dirs
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def _no_secret(**extra: str) -> dict[str, str]:
    """An environment that configures no secret (whatever the test run's has)."""
    return {"DATADISTD_PEER_SECRET": "", "DATADISTD_PEER_SECRET_FILE": "", **extra}


def _prompt(daemon_factory, worker_factory, runtime: str):  # noqa: ANN001, ANN202
    daemon = daemon_factory("one-user-p", env=_no_secret(XDG_RUNTIME_DIR=runtime))
    port = free_port()
    prompt = worker_factory(daemon)
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True)
    prompt.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE, model_id=0)
    prompt.call("fill", "kv", 11)
    return daemon, prompt, port


def _embedded_decoder(worker_factory, runtime: str):  # noqa: ANN001, ANN202
    decoder = worker_factory(**_no_secret(XDG_RUNTIME_DIR=runtime))   # no DATADIST_DAEMON: embedded
    decoder.call("capture_logs")
    decoder.call("init", "DECODER", D, remote_cache_accessible=True)
    decoder.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE)
    return decoder


def test_a_worker_behind_a_daemon_and_an_embedded_one_link_and_pull_with_nothing_configured(
        daemon_factory, worker_factory, runtime_dirs) -> None:
    daemon, prompt, port = _prompt(daemon_factory, worker_factory, runtime_dirs[0])
    decoder = _embedded_decoder(worker_factory, runtime_dirs[0])
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    decoder.call("pull_blocks", P, "kv", [0, 1, 2], [5, 6, 7])
    np.testing.assert_array_equal(decoder.call("rows", "kv", None, [5, 6, 7]),
                                  prompt.call("rows", "kv", None, [0, 1, 2]))
    log = open(daemon.log_path).read()
    secret = os.path.join(runtime_dirs[0], "datadist", "peer.secret")
    assert f"peers authenticate with the per-user secret {secret} (fingerprint " in log
    assert "loopback addresses only" not in log and " WARNING " not in log, log[-3000:]


def test_when_the_secrets_differ_each_side_says_which_it_uses_and_how_to_agree(daemon_factory, worker_factory,
                                                                              runtime_dirs) -> None:
    daemon, prompt, port = _prompt(daemon_factory, worker_factory, runtime_dirs[0])
    decoder = _embedded_decoder(worker_factory, runtime_dirs[1])    # another per-user secret
    assert decoder.call("link", P, "127.0.0.1", port) == (S.LLM_LINK_FAILED, [S.LLM_LINK_FAILED])
    said = decoder.call("logs", "link_clusters")
    theirs, ours = (peer_secret(PeerSection(), env={"XDG_RUNTIME_DIR": d}) for d in runtime_dirs)
    assert theirs.fingerprint != ours.fingerprint and re.fullmatch(r"[0-9a-f]{8}", ours.fingerprint)
    assert f"the serving daemon uses {theirs.describe()}" in said, said
    assert f"this worker's daemon uses {ours.describe()}" in said, said
    assert "give both sides the same secret" in said and "DATADISTD_PEER_SECRET_FILE" in said, said
    log = open(daemon.log_path).read()
    assert f"bad credential; this daemon uses {theirs.describe()}" in log, log[-3000:]
    for text in (said, log):   # never a secret itself
        assert theirs.value.decode() not in text and ours.value.decode() not in text
