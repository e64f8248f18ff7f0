"""What ``tests.sim.mutate_rules`` and ``tests.sim.mutate_transport`` share: one source changed, the tests that
must notice run against it, the source restored."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_mutated(name: str, source: str, code: str, without: str, pytest_args: list[str],
                timeout: float) -> subprocess.CompletedProcess[str]:
    """pytest ``pytest_args`` with ``code`` in ``source`` (a path under the repository) replaced by ``without``;
    the source restored with ``git checkout`` afterwards (run on a clean tree, alone)."""
    path = ROOT / source
    text = path.read_text()
    assert code in text, f"{name}: its code is not in {source}"
    path.write_text(text.replace(code, without))
    try:
        return subprocess.run([sys.executable, "-m", "pytest", "-q", *pytest_args], cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout)
    finally:
        subprocess.run(["git", "checkout", source], cwd=ROOT, capture_output=True)
