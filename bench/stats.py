"""Figures (median with min and max of repetitions), ratios to a baseline, targets, and table rows."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

__all__ = ["Figure", "Target", "Row", "figure", "percentile", "gib_per_s", "paired", "ratio"]


@dataclass(frozen=True)
class Figure:
    """The median of ``n`` repetitions, with their min and max, in ``unit``."""

    median: float
    min: float
    max: float
    n: int
    unit: str

    def text(self, digits: int = 2) -> str:
        if self.n <= 1 or self.min == self.max:
            return f"{self.median:.{digits}f} {self.unit}"
        return f"{self.median:.{digits}f} {self.unit} [{self.min:.{digits}f}–{self.max:.{digits}f}]"


def figure(values: Sequence[float], unit: str) -> Figure:
    if not values:
        raise ValueError("no repetitions")
    return Figure(float(statistics.median(values)), float(min(values)), float(max(values)), len(values), unit)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), linear between the closest ranks."""
    s = sorted(values)
    if not s:
        raise ValueError("no values")
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def gib_per_s(nbytes: int, seconds: Sequence[float]) -> list[float]:
    return [nbytes / s / 2**30 for s in seconds]


@dataclass(frozen=True)
class Target:
    """``ratio`` (or, with ``on="figure"``, the figure itself) must be ``op`` ``value``."""

    op: str        # ">=" or "<="
    value: float
    on: str = "ratio"

    def text(self) -> str:
        unit = "×" if self.on == "ratio" else ""
        return f"{self.op} {self.value:g}{unit}" if self.on == "ratio" else f"{self.op} {self.value:g}"

    def met(self, x: float) -> bool:
        return x >= self.value if self.op == ">=" else x <= self.value


@dataclass
class Row:
    """One line of the results table."""

    scenario: str
    case: str
    figure: Figure | None
    baseline_name: str = ""
    baseline: Figure | None = None
    ratio: float | None = None
    ratio_min: float | None = None       # paired ratios: min and max over the repetitions
    ratio_max: float | None = None
    target: Target | None = None
    target_text: str = ""
    met: bool | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def judge(self) -> "Row":
        if self.target is not None:
            self.target_text = self.target.text() + ("" if self.target.on == "ratio" else f" {self.figure.unit}"
                                                      if self.figure else "")
            x = self.ratio if self.target.on == "ratio" else (self.figure.median if self.figure else None)
            self.met = None if x is None else self.target.met(x)
        return self

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["target"] = None if self.target is None else asdict(self.target)
        return d


def paired(values: Sequence[float], base: Sequence[float]) -> tuple[float, float, float]:
    """Median, min and max of ``values[i] / base[i]`` (repetition i of both measured back to back)."""
    r = [v / b for v, b in zip(values, base, strict=True) if b]
    return float(statistics.median(r)), min(r), max(r)


def ratio(a: Figure | None, b: Figure | None) -> float | None:
    if a is None or b is None or b.median == 0:
        return None
    return a.median / b.median
