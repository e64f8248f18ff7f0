"""CANN's own HIXL Python sample (hicann/hixl ``examples/python/hixl/hixl_d2rd_multiproc_sample.py``), unchanged:
its server on one acl daemon and its client on another, on the simulated Ascend runtime (NPU memory by ACL IPC,
bytes over HCCL). The sample imports ``torch`` for NPU tensors; ``tests/sim/torch_stand_in`` stands in for torch
with torch_npu (a simulation: only what the sample calls). The sample is read from a local mirror of hicann/hixl at
test time and kept nowhere in this repository; without the mirror the test is skipped, saying so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.daemonproc import free_port
from tests.harness import ACL_PLANE, ROOT

pytestmark = pytest.mark.integration

MIRROR = Path(os.environ.get("DATADIST_HIXL_MIRROR", "/work/.mirror/hicann+hixl/repo"))
SAMPLE = "examples/python/hixl/hixl_d2rd_multiproc_sample.py"


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    if not (MIRROR / "HEAD").exists():
        pytest.skip(f"no mirror of hicann/hixl at {MIRROR} (DATADIST_HIXL_MIRROR): CANN's samples are not kept here")
    path = tmp_path / "hixl_d2rd_multiproc_sample.py"
    path.write_bytes(subprocess.run(["git", "-C", str(MIRROR), "show", f"HEAD:{SAMPLE}"], capture_output=True,
                                    check=True).stdout)
    return path


def _port_pair() -> tuple[int, int]:
    """Two engine ports whose +1000 (the sample's address exchange) are free too."""
    for _ in range(100):
        a, b = free_port(), free_port()
        if a + 1000 < 65536 and b + 1000 < 65536 and a != b and abs(a - b) != 1000:
            return a, b
    raise AssertionError("no free port pair")


@pytest.mark.parametrize("data_plane", [ACL_PLANE], indirect=True)
def test_canns_python_sample_through_two_daemons(sample, data_plane, daemon_factory) -> None:
    ds, dc = daemon_factory.many("s", "c")
    sport, cport = _port_pair()
    env = {**os.environ, **{k: v for k, v in data_plane.items() if k.startswith("ASCEND_")},
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "sim" / "torch_stand_in"),
                                          os.environ.get("PYTHONPATH", "")])}
    engines = [f"--local-engine=127.0.0.1:{sport}", f"--remote-engine=127.0.0.1:{cport}"]
    server = subprocess.Popen([sys.executable, str(sample), "--role", "server", *engines], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env={**env, "DATADIST_DAEMON": ds.target})
    try:
        client = subprocess.run([sys.executable, str(sample), "--role", "client",
                                 f"--local-engine=127.0.0.1:{cport}", f"--remote-engine=127.0.0.1:{sport}"],
                                capture_output=True, text=True, env={**env, "DATADIST_DAEMON": dc.target}, timeout=120)
        out, _ = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert client.returncode == 0 and server.returncode == 0, out + client.stdout + client.stderr
    assert "Client TransferSync READ completed" in client.stderr and "Client Verify success" in client.stderr
    assert "Sample finished successfully" in out
