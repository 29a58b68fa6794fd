"""The regression gate: did a change make any operator slower or less accurate?

``tritonkit regress NEW.json --against OLD.json --threshold 0.10`` matches the timed cases of
two results files (operator, parameters, shape, dtype, mode) and fails when tritonkit's median
time grew by more than the threshold, or its error against float64 grew (or a check that passed
now fails). It compares the cases both runs timed and lists the others (a user's run of the main
job against the committed results of a fuller one); it refuses to compare runs from different
GPUs, or runs that share no timed case, and says why. trend.py follows many runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tritonkit.harness.cells import fmt, md_table

# Relative-L2 errors this small are rounding noise; growth below it is not a regression.
ACCURACY_FLOOR = 1e-7


class Incomparable(ValueError):
    """Two results files that must not be compared (different GPU, different cases)."""


@dataclass
class Row:
    case: str
    old_ms: float | None
    new_ms: float | None
    ratio: float | None  # new / old time
    old_err: float | None
    new_err: float | None
    # "ok", "slower", "less accurate", "failed check", "faster"; "only in new" and "only in
    # old" for a case one run did not time (listed, never a regression)
    status: str


def _key(r: dict[str, Any]) -> str:
    """A timed case as the table names it (and matches it): operator, [parameters], shape,
    dtype, mode."""
    params = ", ".join(
        f"{k}={json.dumps(v, sort_keys=True)}" for k, v in sorted((r.get("params") or {}).items())
    )
    params = f" [{params}]" if params else ""
    return f"{r['op']}{params} {r['shape']} {r['dtype']} {r['mode']}"


def _timed(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        _key(r): r
        for r in results.get("bench", [])
        if not r.get("note") and "median" in r["candidates"].get("tritonkit", {})
    }


def compare(new: dict[str, Any], old: dict[str, Any], threshold: float = 0.10) -> list[Row]:
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    new_gpu, old_gpu = new["fingerprint"].get("gpu"), old["fingerprint"].get("gpu")
    if new_gpu != old_gpu:
        raise Incomparable(
            f"results are from different GPUs: {new_gpu!r} (new) vs {old_gpu!r} (old)"
        )
    if new.get("kind") != "gpu" or old.get("kind") != "gpu":
        raise Incomparable("both results files must hold GPU timings (kind 'gpu')")
    a, b = _timed(new), _timed(old)
    only_new, only_old = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    if not set(a) & set(b):
        detail = "; ".join(
            [f"only in new: {', '.join(only_new[:5])}"] * bool(only_new)
            + [f"only in old: {', '.join(only_old[:5])}"] * bool(only_old)
        )
        raise Incomparable(
            f"the two runs timed different cases (shapes or operators) and share none: {detail}"
        )
    rows = []
    for key in a:
        if key not in b:
            continue
        nr, orr = a[key], b[key]
        new_ms = nr["candidates"]["tritonkit"]["median"]
        old_ms = orr["candidates"]["tritonkit"]["median"]
        ratio = new_ms / old_ms if old_ms > 0 else None  # a zero time has no ratio
        new_c, old_c = nr.get("correct", {}), orr.get("correct", {})
        new_err, old_err = new_c.get("rel_l2"), old_c.get("rel_l2")
        status = "ok"
        if old_c.get("passed") and not new_c.get("passed"):
            status = "failed check"
        elif (
            isinstance(new_err, (int, float))
            and isinstance(old_err, (int, float))
            and new_err > old_err * (1 + threshold) + ACCURACY_FLOOR
        ):
            status = "less accurate"
        elif ratio is not None and ratio > 1 + threshold:
            status = "slower"
        elif ratio is not None and ratio < 1 - threshold:
            status = "faster"
        rows.append(Row(key, old_ms, new_ms, ratio, old_err, new_err, status))
    for key in only_new:
        rows.append(Row(key, None, a[key]["candidates"]["tritonkit"]["median"], None, None, None,
                        "only in new"))  # fmt: skip
    for key in only_old:
        rows.append(Row(key, b[key]["candidates"]["tritonkit"]["median"], None, None, None, None,
                        "only in old"))  # fmt: skip
    return rows


def failed(rows: list[Row]) -> bool:
    return any(r.status in ("slower", "less accurate", "failed check") for r in rows)


def render(rows: list[Row], threshold: float) -> str:
    body = [
        [
            r.case,
            fmt(r.old_ms),
            fmt(r.new_ms),
            f"{r.ratio:.3f}" if r.ratio is not None else "n/a",
            fmt(r.old_err),
            fmt(r.new_err),
            r.status.upper()
            if r.status in ("slower", "less accurate", "failed check")
            else r.status,
        ]
        for r in rows
    ]
    table = md_table(
        ["case", "old ms", "new ms", "new / old", "old rel. L2", "new rel. L2", "status"], body
    )
    bad = sum(r.status in ("slower", "less accurate", "failed check") for r in rows)
    shared = sum(not r.status.startswith("only in") for r in rows)
    verdict = (
        f"{bad} regression(s) beyond {threshold:.0%}"
        if bad
        else f"no regression beyond {threshold:.0%}"
    )
    if shared < len(rows):
        verdict = (
            f"{shared} case(s) compared, {len(rows) - shared} timed by one run only (listed); "
            + verdict
        )
    return table + "\n\n" + verdict
