"""The report's plots (matplotlib, when installed): roofline, bandwidth, speedups, accuracy."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from tritonkit.harness.cells import baselines_in, shapes_checked


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def safe_stem(name: str) -> str:
    """A baseline's name as part of a file name: letters, digits, ``_`` and ``-`` only
    (``torch.compile`` -> ``torch_compile``, ``bf16 linear`` -> ``bf16_linear``), so that no
    plot's name needs quoting in a shell or a Markdown link."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_") or "baseline"


def _short(dtype: str) -> str:
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, dtype)


def _label(r: dict[str, Any], with_shape: bool = False) -> str:
    shape = f" {r['shape']}" if with_shape else ""
    return f"{r['op']}{shape} {_short(r['dtype'])} {r['mode']}"


def _labels(recs: list[dict[str, Any]]) -> list[str]:
    """Labels that name the shape only for operators timed at several shapes."""
    shapes: dict[str, set] = defaultdict(set)
    for r in recs:
        shapes[r["op"]].add(r["shape"])
    return [_label(r, len(shapes[r["op"]]) > 1) for r in recs]


def plot_roofline(results: dict[str, Any], out_dir: Path) -> Path | None:
    """The roofline of the measured ceilings with every timed operator.

    Left: log-log roofline for operators with a FLOP count. Right: operators whose spec counts
    no FLOPs (pure data movement, or reductions not yet given a count), as % of the bandwidth
    roof, which is where they sit on it.
    """
    plt = _pyplot()
    ceilings = results.get("ceilings")
    timed = [
        r
        for r in results["bench"]
        if not r.get("note") and r["bytes"] and "median" in r["candidates"].get("tritonkit", {})
    ]
    recs = [r for r in timed if r["flops"]]
    flat = [r for r in timed if not r["flops"]]
    if plt is None or not ceilings or not timed:
        return None
    bw = ceilings["copy_GBps"] * 1e9
    fig, (ax, bx) = plt.subplots(
        1, 2, figsize=(18, max(8, 0.16 * len(flat) + 2)), gridspec_kw={"width_ratios": [3, 1]}
    )
    xs = [r["flops"] / r["bytes"] for r in recs]
    lo, hi = min([*xs, 0.1]) / 3, max([*xs, 1000.0]) * 3
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    for key in sorted({r.get("roofline_peak", "fp32") for r in recs}):
        peak = ceilings["tflops"].get(key)
        if not peak:
            continue
        ax.plot(
            grid,
            [min(peak, x * bw / 1e12) for x in grid],
            linewidth=1.5,
            label=f"roof: {key} {peak:,.0f} TFLOP/s, {bw / 1e9:,.0f} GB/s",
        )
    markers = "osD^v<>pPX*h"
    for i, (r, label) in enumerate(zip(recs, _labels(recs))):
        ours = r["candidates"]["tritonkit"]
        ax.scatter(
            [r["flops"] / r["bytes"]],
            [ours["TFLOPs"]],
            marker=markers[i % len(markers)],
            s=40,
            zorder=3,
            label=f"{label} ({ours['pct_of_roofline']:.0f}%)",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(
        f"Roofline, {results['fingerprint'].get('gpu')} (measured ceilings); "
        "tritonkit, % of roof in the legend"
    )
    ax.grid(True, which="both", linewidth=0.3)
    if recs:
        ax.legend(fontsize=5, ncol=2, loc="upper left")
    else:
        ax.axis("off")
    if flat:
        pct = [r["candidates"]["tritonkit"]["pct_of_roofline"] for r in flat]
        ys = list(range(len(flat)))
        bx.barh(ys, pct, color="tab:blue")
        bx.axvline(100, color="k", linewidth=1)
        bx.set_yticks(ys)
        bx.set_yticklabels(_labels(flat), fontsize=6)
        bx.invert_yaxis()
        bx.set_xlabel("% of the bandwidth roof")
        bx.set_title("no FLOP count: on the memory roof", fontsize=9)
    else:
        bx.axis("off")
    fig.tight_layout()
    path = out_dir / "roofline.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_speedups(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """One bar chart per baseline: tritonkit's speedup per case with its 95% interval."""
    plt = _pyplot()
    if plt is None:
        return []
    bench = [r for r in results["bench"] if not r.get("note")]
    written: list[Path] = []
    for baseline in baselines_in(bench):
        # A ratio without a finite baseline time (n/a in the tables) has no bar.
        recs = [
            r
            for r in bench
            if baseline in r.get("comparison", {})
            and all(
                isinstance(r["comparison"][baseline].get(k), (int, float))
                and math.isfinite(r["comparison"][baseline][k])
                for k in ("speedup", "ci_low", "ci_high")
            )
        ]
        if not recs:
            continue
        cmps = [r["comparison"][baseline] for r in recs]
        ys = list(range(len(recs)))
        fig, ax = plt.subplots(figsize=(8, max(3, 0.22 * len(recs) + 1)))
        colors = [
            "tab:green" if c["ci_low"] > 1 else "tab:red" if c["ci_high"] < 1 else "tab:gray"
            for c in cmps
        ]
        ax.barh(
            ys,
            [c["speedup"] for c in cmps],
            color=colors,
            xerr=[
                [c["speedup"] - c["ci_low"] for c in cmps],
                [c["ci_high"] - c["speedup"] for c in cmps],
            ],
            capsize=2,
        )
        ax.axvline(1.0, color="k", linewidth=1)
        ax.set_yticks(ys)
        ax.set_yticklabels(_labels(recs), fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel(f"speedup over {baseline} (its median time / tritonkit's)")
        ax.set_title(
            f"tritonkit vs {baseline}: green faster, red slower, gray no significant "
            "difference (95% CI)",
            fontsize=9,
        )
        fig.tight_layout()
        path = out_dir / f"speedup_vs_{safe_stem(baseline)}.png"
        n = 2
        while path in written:  # two names that differ only in punctuation
            path = out_dir / f"speedup_vs_{safe_stem(baseline)}-{n}.png"
            n += 1
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def plot_bandwidth(results: dict[str, Any], out_dir: Path) -> Path | None:
    """GB/s of tritonkit, its variants and baselines, forward, against the copy bandwidth."""
    plt = _pyplot()
    recs = [
        r
        for r in results["bench"]
        if r["mode"] == "fwd"
        and not r.get("note")
        and r["candidates"].get("tritonkit", {}).get("GBps")
    ]
    if plt is None or not recs:
        return None
    names = list(
        dict.fromkeys(n for r in recs for n, c in r["candidates"].items() if c.get("GBps"))
    )
    fig, ax = plt.subplots(figsize=(max(8, 0.5 * len(recs) * len(names) / 2), 5))
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        xs = [i + j * width for i in range(len(recs))]
        ax.bar(
            xs,
            [r["candidates"].get(name, {}).get("GBps") or 0 for r in recs],
            width=width,
            label=name,
        )
    ceiling = (results.get("ceilings") or {}).get("copy_GBps")
    if ceiling:
        ax.axhline(ceiling, color="k", linestyle="--", linewidth=1, label="measured copy BW")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(recs))])
    ax.set_xticklabels(_labels(recs), fontsize=6, rotation=60, ha="right")
    ax.set_ylabel("GB/s")
    ax.set_title(f"forward: achieved bandwidth ({results['fingerprint'].get('gpu')})")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    path = out_dir / "bandwidth_fwd.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def accuracy_rows(results: dict[str, Any]) -> list[tuple[str, float, float | None]]:
    """What accuracy.png draws, per operator and dtype checked: its label (with the shapes
    checked), tritonkit's worst relative L2 error over the checks run, and PyTorch's own worst
    in the same dtype on the same inputs (None where none was measured: too few elements)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for c in results["checks"]:
        if not c.get("skipped"):
            groups[(c["op"], c["dtype"])].append(c)

    def worst(cs: list[dict[str, Any]], key: str) -> float | None:
        xs = [c[key] for c in cs if isinstance(c.get(key), (int, float)) and math.isfinite(c[key])]
        return max(xs) if xs else None

    rows = [
        (
            f"{op} {_short(dtype)} {shapes_checked(cs)}",
            worst(cs, "rel_l2"),
            worst(cs, "torch_rel_l2"),
        )
        for (op, dtype), cs in groups.items()
    ]
    return [r for r in rows if r[1] is not None]


def plot_accuracy(results: dict[str, Any], out_dir: Path) -> Path | None:
    """Per operator and dtype, two bars (``accuracy_rows``): tritonkit's worst relative L2
    error against the float64 reference and, beside it, PyTorch's own in the same dtype (log
    scale; an exact result is drawn at the axis' floor and marked 0, an error not measured is
    marked n/a); on the CPU as on a GPU."""
    plt = _pyplot()
    rows = accuracy_rows(results)
    if plt is None or not rows:
        return None
    floor = 1e-12  # an exact result (error 0) is drawn at the floor of the log axis
    ys = list(range(len(rows)))
    height = 0.4
    fig, ax = plt.subplots(figsize=(9, max(3, 0.32 * len(rows) + 1.2)))
    for offset, index, color, label in (
        (-height / 2, 1, "tab:blue", "tritonkit"),
        (height / 2, 2, "tab:gray", "PyTorch, same dtype"),
    ):
        values = [r[index] for r in rows]
        at = [y + offset for y in ys]
        ax.barh(at, [max(v or 0.0, floor) for v in values], height=height, color=color, label=label)
        for y, v in zip(at, values):
            if v is None or v == 0:
                ax.text(floor * 1.5, y, "n/a" if v is None else "0", va="center", fontsize=5)
    ax.set_xscale("log")
    ax.set_xlim(left=floor)
    ax.set_yticks(ys)
    ax.set_yticklabels([r[0] for r in rows], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("worst relative L2 error against the float64 reference")
    where = results["fingerprint"].get("gpu") or "Triton interpreter (CPU)"
    ax.set_title(f"accuracy over every check, {where}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out_dir / "accuracy.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_sweeps(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """Per operator timed with ``bench --sweep``: its size (bytes moved, from the spec's
    formula) against % of the roofline, tritonkit's and each baseline's, a line per candidate
    and mode."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in results.get("bench", []):
        if r.get("sweep") and r.get("bytes") and not r.get("note"):
            groups[r["op"]].append(r)
    plt = _pyplot() if groups else None
    if plt is None:
        return []
    paths = []
    for op, recs in groups.items():
        fig, ax = plt.subplots(figsize=(7, 4.5))
        lines: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for r in recs:
            for name, c in r["candidates"].items():
                if c.get("pct_of_roofline") is not None:
                    label = f"{name} {_short(r['dtype'])} {r['mode']}"
                    lines[label].append((r["bytes"], c["pct_of_roofline"]))
        for label, pts in sorted(lines.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.set_xscale("log")
        ax.set_xlabel("bytes moved per call (the spec's formula)")
        ax.set_ylabel("% of roofline")
        ax.set_title(f"{op}: shape sensitivity")
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"sweep_{safe_stem(op)}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
