"""Trend over many runs: each timed case's median (and RSD) run after run, a plot per operator.

``tritonkit trend A.json B.json C.json ... --out DIR`` takes results files in the order given
(oldest first), with regress.py's fingerprint check (one GPU, GPU timings), and writes
``trend.json`` (per case, per run: label, commit, date, median ms, RSD), ``trend.md`` (a table:
a row per case, a column per run, each time relative to the case's first run) and
``trend_<op>.png`` (each case of the operator a line of median time over the runs). Cases a
run did not time are gaps, not errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tritonkit.harness.cells import fmt, md_table
from tritonkit.harness.plots import _pyplot, safe_stem
from tritonkit.harness.regress import Incomparable, _timed


def build(documents: list[dict[str, Any]], labels: list[str]) -> dict[str, Any]:
    """The trend of ``documents`` (results, oldest first) named by ``labels``."""
    if len(documents) < 2:
        raise ValueError("a trend needs at least two results files")
    gpus = {d["fingerprint"].get("gpu") for d in documents}
    if len(gpus) > 1:
        raise Incomparable(f"results are from different GPUs: {sorted(map(str, gpus))}")
    if any(d.get("kind") != "gpu" for d in documents):
        raise Incomparable("every results file must hold GPU timings (kind 'gpu')")
    runs = [
        {
            "label": label,
            "commit": d["fingerprint"].get("git_commit"),
            "date": d["fingerprint"].get("date"),
        }
        for d, label in zip(documents, labels)
    ]
    cases: dict[str, dict[str, Any]] = {}
    for i, d in enumerate(documents):
        for key, r in _timed(d).items():
            c = cases.setdefault(key, {"op": r["op"], "points": [None] * len(documents)})
            ours = r["candidates"]["tritonkit"]
            c["points"][i] = {"ms": ours["median"], "rsd": ours.get("rsd")}
    return {"gpu": gpus.pop(), "runs": runs, "cases": cases}


def render(trend: dict[str, Any]) -> str:
    """A row per case: the first run's ms, then each run's time over the first's."""
    header = ["case", f"{trend['runs'][0]['label']} ms"]
    header += [r["label"] for r in trend["runs"][1:]]
    rows = []
    for key, c in trend["cases"].items():
        pts = c["points"]
        first = next((p["ms"] for p in pts if p), None)
        row = [key, fmt(pts[0]["ms"]) if pts[0] else "—"]
        for p in pts[1:]:
            row.append(f"{p['ms'] / first:.3f}" if p and first else "—")
        rows.append(row)
    return (
        f"Trend on {trend['gpu']}: each run's median time over the case's first timed run "
        "(below 1: faster).\n\n" + md_table(header, rows)
    )


def plot(trend: dict[str, Any], out_dir: Path) -> list[Path]:
    """One PNG per operator: each case's median time over the runs."""
    plt = _pyplot()
    if plt is None:
        return []
    labels = [r["label"] for r in trend["runs"]]
    by_op: dict[str, list[tuple[str, list]]] = {}
    for key, c in trend["cases"].items():
        by_op.setdefault(c["op"], []).append((key, c["points"]))
    paths = []
    for op, cases in by_op.items():
        fig, ax = plt.subplots(figsize=(7, 4))
        for key, pts in cases:
            xs = [i for i, p in enumerate(pts) if p]
            ax.plot(xs, [pts[i]["ms"] for i in xs], marker="o", label=key.removeprefix(op + " "))
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("median ms")
        ax.set_title(f"{op}: time over runs ({trend['gpu']})")
        ax.legend(fontsize=6)
        fig.tight_layout()
        path = out_dir / f"trend_{safe_stem(op)}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def write(documents: list[dict[str, Any]], labels: list[str], out_dir: Path) -> list[Path]:
    """trend.json, trend.md and the plots under ``out_dir``."""
    import json

    out_dir.mkdir(parents=True, exist_ok=True)
    t = build(documents, labels)
    (out_dir / "trend.json").write_text(json.dumps(t, indent=1))
    (out_dir / "trend.md").write_text(render(t) + "\n")
    return [out_dir / "trend.json", out_dir / "trend.md", *plot(t, out_dir)]
