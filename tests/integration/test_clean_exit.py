"""Processes that used NIXL exit cleanly, on hosts with the RDMA user-space libraries too.

The NIXL wheel bundles UCX with its own libibverbs and libnl, but not ``libefa.so.1``: where rdma-core's
providers are installed (every host with an RDMA NIC; ``.ci/run`` installs them so ``make test`` runs the way
such a host does), UCX's EFA module loaded the system's libefa and with it a second libibverbs and libnl, and
every process that had made a UCX agent died with SIGSEGV in libnl's destructors after Python had finished
(docs/nixl.md, "A clean exit on RDMA hosts"). These tests move bytes, then end the processes the way
production does -- SIGTERM for daemons, a normal interpreter exit for embedded workers -- and require status 0.
Without the RDMA libraries the same tests pass and say so in their report line.
"""

from __future__ import annotations

import ctypes.util
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from tests.harness import DATA_PLANES, free_port, nixl_installed, over_planes

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not nixl_installed(), reason="NIXL is not installed (make nixl)")]

P, D = 1, 2
BLOCKS, TENSORS, BLOCK_SHAPE = 16, 4, (8, 64)     # float16: 1 KiB per block per tensor


def rdma_libraries() -> bool:
    """rdma-core's user-space libraries are on this host (the case that crashed)."""
    return ctypes.util.find_library("efa") is not None and ctypes.util.find_library("ibverbs") is not None


def _move_bytes(prompt, decoder, port: int) -> None:  # noqa: ANN001 - tests.harness.Worker
    prompt.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE, model_id=0)
    decoder.call("register_blocks", "kv", TENSORS, BLOCKS, BLOCK_SHAPE, model_id=0)
    prompt.call("fill", "kv", 7)
    assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
    decoder.call("pull_blocks", P, "kv", list(range(BLOCKS)), list(range(BLOCKS)))
    np.testing.assert_array_equal(decoder.call("rows", "kv"), prompt.call("rows", "kv"))


@over_planes("nixl-ucx-tcp")
def test_nixl_daemons_that_moved_bytes_exit_0_on_sigterm(daemon_factory, worker_factory) -> None:
    dp, dd = daemon_factory.many("p", "d")      # test daemons keep their directory (and log) after stop
    port = free_port()
    prompt, decoder = worker_factory(dp), worker_factory(dd)
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True, sync_kv_timeout=5000)
    decoder.call("init", "DECODER", D, remote_cache_accessible=True, sync_kv_timeout=5000)
    _move_bytes(prompt, decoder, port)
    for d in (dd, dp):
        status = d.stop(signal.SIGTERM, timeout=30)
        assert status == 0, f"datadistd {d.name} (RDMA libraries: {rdma_libraries()}) exited {status}:\n{d.log()}"


def test_embedded_nixl_workers_exit_0(worker_factory) -> None:
    """No daemon configured: each worker runs its daemon in its own process and exits through the
    interpreter's normal exit (the exit-time finalize, then the C runtime's library destructors)."""
    plane = DATA_PLANES["nixl-ucx-tcp"]
    port = free_port()
    prompt, decoder = worker_factory(**plane), worker_factory(**plane)
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True, sync_kv_timeout=5000)
    decoder.call("init", "DECODER", D, remote_cache_accessible=True, sync_kv_timeout=5000)
    _move_bytes(prompt, decoder, port)
    for name, w in (("decoder", decoder), ("prompt", prompt)):
        w.close(timeout=30)
        assert w.proc.exitcode == 0, f"embedded {name} worker (RDMA libraries: {rdma_libraries()}) " \
                                     f"exited {w.proc.exitcode}"


def test_ci_has_the_rdma_libraries() -> None:
    """``.ci/run`` installs rdma-core's libraries and says so (``DATADIST_CI_RDMA_LIBS=1``): in CI the tests above
    must run the case that crashed, not pass for lack of it."""
    if os.environ.get("DATADIST_CI_RDMA_LIBS") != "1":
        pytest.skip("not in .ci/run: these tests run with whatever RDMA libraries this host has")
    assert rdma_libraries(), "DATADIST_CI_RDMA_LIBS=1 but libefa/libibverbs are not found (ldconfig -p)"


def test_a_bare_nixl_agent_exits_0() -> None:
    """The smallest case of the report: a process that made one UCX agent through datadist's loader."""
    code = ("from datadistd.transport.nixl.ucx import load_api\n"
            "api = load_api()\n"
            "api.nixl_agent('x', api.nixl_agent_config(enable_prog_thread=False, backends=['UCX']))\n"
            "print('made', flush=True)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "made"), \
        f"exit {done.returncode} (RDMA libraries: {rdma_libraries()}):\n{done.stderr[-3000:]}"
