"""``make test-ascend``'s first-hour checks (tests/hw/first_hour.py) run against the SIMULATED runtime, so they stay
runnable: every check says ``as expected`` here, by construction (the simulation enforces the rules the checks
isolate); on an NPU host their lines are what to read first."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.harness import ROOT
from tests.sim import build, sim_env


def test_every_first_hour_check_runs_and_sees_what_cann_says(tmp_path) -> None:
    root = build()
    if root is None:
        pytest.skip("no C compiler: the simulated Ascend runtime cannot be built")
    proc = subprocess.run([sys.executable, "-m", "tests.hw.first_hour"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, **sim_env(root, str(tmp_path)), "ASCEND_SIM_INIT_MS": "300"})
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(lines) == 9, proc.stdout + proc.stderr
    assert all(line.endswith(" as expected") for line in lines if not line.startswith("parallel_link_creation")), \
        proc.stdout
    assert lines[-1].startswith("parallel_link_creation: saw [both ok: False]") and lines[-1].endswith(" recorded")
