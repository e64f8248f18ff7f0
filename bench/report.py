"""Write a run's results: ``latest.json`` (everything), ``latest.md`` (the table) and PNG plots."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from .npu import SIMULATED
from .stats import Figure, Row

__all__ = ["write_json", "write_markdown", "write_plots", "markdown_table"]


def _jsonable(x: Any) -> Any:
    if isinstance(x, Figure):
        return {"median": x.median, "min": x.min, "max": x.max, "n": x.n, "unit": x.unit}
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def write_json(path: Path, meta: dict[str, Any], rows: list[Row], series: dict[str, Any]) -> None:
    data = {"meta": meta, "rows": [r.as_dict() for r in rows], "series": _jsonable(series)}
    path.write_text(json.dumps(data, indent=1, default=str))


def _met(row: Row) -> str:
    if row.met is None:
        return ""
    return "yes" if row.met else "**no**"


def _x(ratio: float) -> str:
    """A ratio with two decimals, three below 0.1 (0.014x and 0.018x are not both "0.01x")."""
    return f"{ratio:.2f}" if abs(ratio) >= 0.1 else f"{ratio:.3f}"


def markdown_table(rows: list[Row]) -> str:
    out = ["| scenario | case | figure (median [min–max]) | baseline | baseline figure | ratio | target | met? |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fig = r.figure.text() if r.figure is not None else (r.note or "—")
        base = r.baseline.text() if r.baseline is not None else ""
        ratio = f"{_x(r.ratio)}×" if r.ratio is not None else ""
        if r.ratio_min is not None and r.ratio_max is not None and r.ratio_min != r.ratio_max:
            ratio += f" [{_x(r.ratio_min)}–{_x(r.ratio_max)}]"
        out.append(f"| {r.scenario} | {r.case} | {fig} | {r.baseline_name} | {base} | {ratio} | {r.target_text} | "
                   f"{_met(r)} |")
    return "\n".join(out)


def write_markdown(path: Path, meta: dict[str, Any], rows: list[Row]) -> None:
    lines = [f"# datadist benchmark — {meta.get('started', '')}", "",
             f"Machine: {meta.get('machine', '')}. Config: `{meta.get('argv', '')}`. "
             f"Pinning: {meta.get('pinned', 'unpinned')}. "
             f"Every figure is the median of the repetitions with [min–max]; every ratio divides by a baseline "
             f"measured in the same run. Wall time {meta.get('seconds', 0):.0f} s.", "",
             markdown_table(rows), ""]
    if any(SIMULATED in r.scenario for r in rows):
        lines[4:4] = [f"**Rows of scenario 10 ran on the {SIMULATED}**: its device memory is shared memory and its "
                      f"HCCL wire a memcpy between processes; their ratios tell datadist's cost per request next to "
                      f"the engine's own calls, nothing of HCCS or RoCE.", ""]
    notes = [f"- **{r.scenario} / {r.case}**: {r.note}" for r in rows if r.note and r.figure is not None]
    if notes:
        lines += ["## Notes", "", *notes, ""]
    path.write_text("\n".join(lines))


# ---- plots -------------------------------------------------------------------------------------

def _err(figs: list[Figure | None]) -> tuple[list[float], list[list[float]]]:
    med = [f.median if f else 0.0 for f in figs]
    err = [[f.median - f.min if f else 0.0 for f in figs], [f.max - f.median if f else 0.0 for f in figs]]
    return med, err


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def _bars(ax: Any, groups: list[int], series: dict[str, dict[int, Figure]], ylabel: str, title: str) -> None:
    names = list(series)
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        figs = [series[name].get(g) for g in groups]
        med, err = _err(figs)
        xs = [k + (i - (len(names) - 1) / 2) * width for k in range(len(groups))]
        ax.bar(xs, med, width, yerr=err, capsize=2, label=name)
    ax.set_xticks(range(len(groups)), [_size(g) for g in groups])
    ax.set_xlabel("block size")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)


def write_plots(out: Path, rows: list[Row], series: dict[str, Any]) -> list[Path]:
    """One PNG per scenario with data, plus ``summary.png`` (every ratio against its target).

    Needs matplotlib (the ``bench`` extra, which ``make bench`` installs); without it no plots."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no plots written", file=sys.stderr)
        return []

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []

    def save(fig: Any, name: str) -> None:
        path = out / name
        fig.tight_layout()
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(path)

    for key, fname, title in (("1 tcp bulk", "bulk_tcp.png", "1. bulk over tcp (loopback), 256 MiB requests"),
                              ("2 same-host", "same_host.png", "2. same-host path (local transport)")):
        s = series.get(key)
        if not s:
            continue
        iperf = s.pop("iperf3", None) if isinstance(s.get("iperf3"), Figure) else None
        groups = sorted({g for v in s.values() if isinstance(v, dict) for g in v})
        fig, ax = plt.subplots(figsize=(9, 4.5))
        _bars(ax, groups, {k: v for k, v in s.items() if isinstance(v, dict)}, "GiB/s", title)
        if iperf is not None:
            ax.axhline(iperf.median, color="grey", ls="--", lw=1, label="iperf3 (C)")
            ax.legend(fontsize=7)
            s["iperf3"] = iperf
        save(fig, fname)

    for key, s in series.items():   # 10: datadist over hccl and bare HCCL; a simulated run says so in the title
        if not key.startswith("10 ") or not s:
            continue
        groups = sorted({g for v in s.values() if isinstance(v, dict) for g in v})
        fig, ax = plt.subplots(figsize=(9, 4.8))
        title = "10. bulk over hccl vs bare HCCL (ratios: latest.md)"
        if SIMULATED in key:
            title += f"\n{SIMULATED}"
        _bars(ax, groups, {k: v for k, v in s.items() if isinstance(v, dict)}, "GiB/s", title)
        if SIMULATED in key:
            ax.text(0.5, 0.5, "SIMULATED", transform=ax.transAxes, ha="center", va="center", fontsize=48,
                    color="red", alpha=0.12, rotation=20)
        save(fig, "hccl.png")

    lat = series.get("3 latency")
    if lat:
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, values in (("pull_blocks, 1 block", lat["pull"]), ("bare gRPC GetStatus", lat["grpc"])):
            v = sorted(values)
            ax.plot(v, [(i + 1) / len(v) for i in range(len(v))], label=name)
        ax.set_xscale("log")
        ax.set_xlabel("latency (µs)")
        ax.set_ylabel("fraction of calls")
        ax.set_title("3. small-transfer latency (CDF)")
        ax.grid(alpha=0.3)
        ax.legend()
        save(fig, "latency.png")

    sc = series.get("4 block-list scaling")
    if sc:
        ns = sorted(sc)
        fig, ax = plt.subplots(figsize=(7, 4))
        for name in ("overhead", "shuffled", "contiguous"):
            med, err = _err([sc[n][name] for n in ns])
            ax.errorbar(ns, med, yerr=err, marker="o", capsize=3, label=f"{name} (µs/block)")
        ax.axhline(2.0, color="red", ls=":", lw=1, label="target: overhead <= 2 µs")
        ax.set_xscale("log")
        ax.set_xlabel("blocks per call")
        ax.set_ylabel("µs per block")
        ax.set_title("4. block-list scaling")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        save(fig, "scaling.png")

    cc = series.get("5 concurrency")
    if cc:
        levels = sorted(cc["levels"])
        fig, ax = plt.subplots(figsize=(7, 4))
        med, err = _err([cc["levels"][c]["gibs"] for c in levels])
        ax.errorbar(levels, med, yerr=err, marker="o", capsize=3, label="aggregate GiB/s")
        ax.axhline(cc["raw"].median, color="grey", ls="--", lw=1, label="raw TCP stream")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent pulls")
        ax.set_ylabel("GiB/s")
        ax2 = ax.twinx()
        ax2.plot(levels, [cc["levels"][c]["p99"].median for c in levels], "r^--", label="p99 latency (ms)")
        ax2.set_ylabel("p99 latency (ms)")
        ax.set_title("5. concurrency")
        lines = ax.get_legend_handles_labels()
        lines2 = ax2.get_legend_handles_labels()
        ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8)
        ax.grid(alpha=0.3)
        save(fig, "concurrency.png")

    lw = series.get("6 layer-wise overlap")
    if lw:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        names = ["compute only", "transfer only (no compute)", "compute + transfer_cache_async"]
        vals = [lw["compute_ms"], lw["transfer"].median, lw["total"].median]
        ax.barh(names, vals, color=["tab:grey", "tab:blue", "tab:green"])
        for ready in lw["ready"]:
            ax.plot([ready, ready], [1.6, 2.4], color="k", lw=0.8)
        ax.set_xlabel("ms (ticks: layers reported ready)")
        ax.set_title(f"6. layer-wise overlap, {lw['layers']} layers")
        save(fig, "layerwise.png")

    ls = series.get("7 link setup")
    if ls:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        names = ["fresh gRPC channel + call", "link_clusters", "link + first byte"]
        figs = [ls["baseline"], ls["link"], ls["first"]]
        med, err = _err(figs)
        ax.barh(names, med, xerr=err, capsize=3)
        ax.set_xlabel("ms")
        ax.set_title("7. link setup")
        save(fig, "link.png")

    judged = [r for r in rows if r.target is not None]
    if judged:
        labels, values, colors = [], [], []
        for r in judged:
            value = r.ratio if r.target.on == "ratio" else (r.figure.median if r.figure else None)
            if value is None or value <= 0:
                continue
            case = r.case if len(r.case) <= 60 else r.case[:57] + "..."
            labels.append(f"{r.scenario.split()[0]}. {case}  ({r.target_text})")
            # headroom: >= 1 means the target is met, whichever way the target points
            values.append(value / r.target.value if r.target.op == ">=" else r.target.value / value)
            colors.append("tab:green" if r.met else "tab:red")
        fig, ax = plt.subplots(figsize=(12, 0.32 * len(labels) + 1.4))
        ax.barh(labels, [min(v, 2.0) for v in values], color=colors)
        for i, v in enumerate(values):
            ax.text(min(v, 2.0) + 0.02, i, f"{v:.2f}", va="center", fontsize=7)
        ax.set_xlim(0, 2.3)
        ax.axvline(1.0, color="k", lw=1)
        ax.invert_yaxis()
        ax.tick_params(axis="y", labelsize=7)
        ax.set_xlabel("headroom to the target (1 = exactly on target; right of the line = met)")
        ax.set_title("targets: green met, red missed (every ratio against a baseline of the same run)")
        save(fig, "summary.png")
    return written
