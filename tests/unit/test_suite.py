"""The suite's own settings (tests/conftest.py)."""

from __future__ import annotations

from hypothesis import settings


def test_hypothesis_has_no_deadline_per_example() -> None:
    """No timing thresholds: a property test without settings of its own gets no per-example deadline."""
    assert settings.default.deadline is None
