"""What bounds a timed case: memory, compute, latency, occupancy or launch/host.

The roofline (roofline.py) says which ceiling a case would meet first; it does not say why a
case far below both sits where it does. The rule, in order (docs/DESIGN.md, "The workbench"):

1. launch/host: the host takes longer to issue a call than the GPU to run it (back-to-back
   host time per call above the GPU median): the launch path sets the pace.
2. memory or compute: the case reaches ``NEAR_ROOF`` (60%) of its roofline floor; the term
   that bounds the floor (bytes / bandwidth or FLOPs / peak) names it.
3. latency, short: a GPU time under ``SHORT_US``: a few waves of programs at most,
   the launch-to-finish latency and the last wave's tail dominate.
4. occupancy: the warps resident per SM (achieved occupancy where a profiler measured it,
   else the theoretical occupancy from the compiled kernel) under ``LOW_OCCUPANCY`` (25%):
   too few warps to hide memory latency.
5. latency: neither ceiling reached with warps resident: stalls on memory or dependency
   latency (too few bytes in flight per SM, serial loops).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

NEAR_ROOF = 60.0  # % of the roofline floor from which the roof's term is the answer
SHORT_US = 10.0
LOW_OCCUPANCY = 0.25

CLASSES = ("memory", "compute", "latency", "occupancy", "launch/host")


def classify(
    *,
    pct_of_roofline: float | None,
    roof_term: str | None,
    gpu_us: float | None,
    host_us: float | None = None,
    occupancy: float | None = None,
) -> tuple[str, str]:
    """(class, the rule's reason in a few words) for one case.

    Args:
        pct_of_roofline: the case's % of its roofline floor (None: not placed).
        roof_term: the term that bounds the floor, "memory" or "compute".
        gpu_us: the GPU time per call (median), microseconds.
        host_us: the host time per call of back-to-back calls, microseconds.
        occupancy: resident warps over the SM's maximum, 0-1 (achieved, else theoretical).
    """
    if host_us is not None and gpu_us is not None and host_us > gpu_us:
        return "launch/host", f"host {host_us:.3g} us per call > GPU {gpu_us:.3g} us"
    if pct_of_roofline is not None and roof_term and pct_of_roofline >= NEAR_ROOF:
        return roof_term, f"{pct_of_roofline:.0f}% of the {roof_term} roof"
    if gpu_us is not None and gpu_us < SHORT_US:
        return "latency", f"{gpu_us:.3g} us per call: a few waves at most"
    if occupancy is not None and occupancy < LOW_OCCUPANCY:
        return "occupancy", f"occupancy {100 * occupancy:.0f}% < {100 * LOW_OCCUPANCY:.0f}%"
    pct = f"{pct_of_roofline:.0f}%" if pct_of_roofline is not None else "no roofline"
    return "latency", f"{pct} of the roof with warps resident: stalls"


def classify_entry(entry: Mapping[str, Any], occupancy: float | None = None) -> tuple[str, str]:
    """``classify`` on a bench record's candidate entry (median in ms, host_us, bottleneck)."""
    median = entry.get("median")
    return classify(
        pct_of_roofline=entry.get("pct_of_roofline"),
        roof_term=entry.get("bottleneck"),
        gpu_us=median * 1e3 if median is not None else None,
        host_us=entry.get("host_us"),
        occupancy=occupancy,
    )
