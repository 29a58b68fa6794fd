"""Table cells the report, its plots, the README's tables and the regression gate share:
numbers, ratios and rates formatted, Markdown tables, the baselines and shapes of a run."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

BASELINE_ORDER = ("torch", "torch.compile", "liger", "cuda")


def fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "—"
    if isinstance(x, str):
        return x
    if isinstance(x, float):
        if not math.isfinite(x):
            return str(x)
        if x == 0:
            return "0"
        if abs(x) >= 100:
            return f"{x:,.0f}"
        return f"{x:.{digits}g}"
    return str(x)


def ratio(x: Any, digits: int = 2) -> str:
    """A ratio (speedup, error ratio) as ``1.23x``; with no finite baseline, ``n/a``."""
    if not isinstance(x, (int, float)) or not math.isfinite(x):
        return "n/a"
    return f"{x:.{digits}f}x"


def params_cell(p: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in p.items()) or "—"


def md_table(header: list[str], rows: Iterable[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def baselines_in(records: list[dict[str, Any]]) -> list[str]:
    names = {n for r in records for n, c in r["candidates"].items() if c["kind"] == "baseline"}
    return sorted(names, key=lambda n: (BASELINE_ORDER.index(n) if n in BASELINE_ORDER else 99, n))


def shapes_checked(checks: list[dict[str, Any]]) -> str:
    """The shapes of these checks that computed something (not the empty tensors' cases, not a
    skipped dtype's), in the order run, joined by ``; ``; ``—`` when there are none."""
    shapes = dict.fromkeys(
        c["shape"] for c in checks if c.get("case") != "empty" and not c.get("skipped")
    )
    return "; ".join(shapes) or "—"


def rate_cell(c: dict[str, Any]) -> str:
    """The rate that matters: TFLOP/s where compute bounds the operator, else GB/s."""
    if c.get("TFLOPs") and (c.get("bottleneck") == "compute" or not c.get("GBps")):
        return f"{fmt(c['TFLOPs'])} TFLOP/s"
    if c.get("GBps"):
        return f"{fmt(c['GBps'])} GB/s"
    return "—"


def rsd_cell(c: dict[str, Any]) -> str:
    """The RSD of a timing (samples inside Tukey's fences), ⚑ where it missed the target."""
    if c.get("rsd") is None:
        return "—"
    return f"{100 * c['rsd']:.1f}%" + (" ⚑" if c.get("rsd_met") is False else "")


def energy_cell(c: dict[str, Any]) -> str:
    """Watts over back-to-back calls, microjoules per call, and GFLOP/s (or GB/s) per watt."""
    if c.get("joules_per_call") is None:
        return "—"
    eff = (
        f"{fmt(c['GFLOPs_per_W'])} GFLOP/s/W"
        if c.get("GFLOPs_per_W") and c.get("bottleneck") == "compute"
        else f"{fmt(c.get('GBps_per_W'))} GB/s/W"
    )
    return f"{c['watts']:.0f} W; {fmt(c['joules_per_call'] * 1e6)} uJ; {eff}"


def kernel_cell(r: dict[str, Any]) -> str:
    """The case's kernels: registers, spills (ptxas's stores/loads for a compile without a
    GPU, the driver's local memory on one), theoretical occupancy on sm_90; with a profiler's
    figures, achieved occupancy, L2 hit rate and DRAM GB/s (kernel_stats.py, profile.py)."""
    ks = r.get("kernels")
    if not ks:
        return "—"
    parts = []
    for k in ks:
        name = str(k.get("name", "?"))[:24]
        if k.get("error"):
            parts.append(f"{name}: {str(k['error'])[:60]}")
            continue
        text = f"{name}: {k.get('registers', '?')} reg"
        if k.get("spill_stores") or k.get("spill_loads"):
            text += f", spills {k.get('spill_stores', 0)}/{k.get('spill_loads', 0)} B"
        if k.get("local_bytes"):  # on a GPU: the driver's local memory per thread (spills)
            text += f", local {k['local_bytes']} B"
        if k.get("occupancy") is not None:
            text += f", occ {100 * k['occupancy']:.0f}%"
        if k.get("achieved_occupancy") is not None:
            text += f" (achieved {100 * k['achieved_occupancy']:.0f}%)"
        if k.get("l2_hit_rate") is not None:
            text += f", L2 hit {100 * k['l2_hit_rate']:.0f}%"
        if k.get("dram_GBps") is not None:
            text += f", DRAM {fmt(k['dram_GBps'])} GB/s"
        parts.append(text)
    return "; ".join(parts)


# Columns shown only where some record of the run has them (older documents render as before).
EXTRA_COLUMNS = (
    ("RSD", lambda r, c: rsd_cell(c), lambda r, c: c.get("rsd") is not None),
    ("energy", lambda r, c: energy_cell(c), lambda r, c: c.get("joules_per_call") is not None),
    ("kernels (sm_90)", lambda r, c: kernel_cell(r), lambda r, c: bool(r.get("kernels"))),
)
