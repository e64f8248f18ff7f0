"""Shared fixtures of the operations tests: one linked pair of real daemons, real workers and tools.

The pair is built once per package (two daemons with metrics on, a prompt worker listening, a
decoder worker linked to it, one pull and one push done) and only read afterwards, so the grpcurl,
metrics and datadistctl tests share it and stay fast.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness import Daemon, Worker, free_port, metrics_address

P, D = 1, 2                  # prompt / decoder cluster ids
TENSORS, BLOCKS, BLOCK_SHAPE = 4, 16, (4, 32)   # float16: 256 bytes per block per tensor
BLOCK_BYTES = 4 * 32 * 2
PULLED = ([0, 1, 2], [3, 4, 5])   # src blocks on P -> dst blocks on D
PUSHED = ([6, 7], [8, 9])         # src blocks on D -> dst blocks on P


def tool(name: str) -> str | None:
    """A console script of this venv (sys.prefix/bin), else one on PATH."""
    candidate = Path(sys.prefix) / "bin" / name
    if candidate.exists() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which(name)


def run(cmd: list[str], timeout: float = 30.0, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    for proxy in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "grpc_proxy", "all_proxy", "ALL_PROXY"):
        full_env.pop(proxy, None)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)


@dataclass
class Pair:
    prompt_daemon: Daemon
    decoder_daemon: Daemon
    prompt: Worker
    decoder: Worker
    listen_port: int
    prompt_metrics: str
    decoder_metrics: str


@pytest.fixture(scope="package")
def pair():
    daemons: list[Daemon] = []
    workers: list[Worker] = []
    try:
        dp = Daemon("ops-p", args=["--metrics", "127.0.0.1:0"]).start()
        daemons.append(dp)
        dd = Daemon("ops-d", args=["--metrics", "127.0.0.1:0"]).start()
        daemons.append(dd)
        prompt = Worker({"DATADIST_DAEMON": dp.target})
        workers.append(prompt)
        decoder = Worker({"DATADIST_DAEMON": dd.target})
        workers.append(decoder)
        port = free_port()
        prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True,
                    sync_kv_timeout=5000, mem_pool=4 << 20)
        decoder.call("init", "DECODER", D, remote_cache_accessible=True, sync_kv_timeout=5000, mem_pool=4 << 20)
        prompt.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE, model_id=0)
        decoder.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE, model_id=0)
        prompt.call("fill", "kv", 1)
        decoder.call("fill", "kv", 2)
        assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
        decoder.call("pull_blocks", P, "kv", *PULLED)
        decoder.call("push_blocks", P, "kv", *PUSHED)
        yield Pair(dp, dd, prompt, decoder, port, metrics_address(dp), metrics_address(dd))
    finally:
        for w in workers:
            w.close()
        for d in daemons:
            d.discard()
