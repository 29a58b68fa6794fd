"""Reports: the results JSON (with its environment fingerprint), Markdown tables, plots, README.

Every table is rendered from a results document, so a figure in a report or in the README can
always be traced to the JSON it came from (``benchmarks/results/<gpu>.json``).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from tritonkit.harness import plots as plots_
from tritonkit.harness.cells import (  # noqa: F401  (the names callers import from here)
    BASELINE_ORDER,
    EXTRA_COLUMNS,
    baselines_in,
    fmt,
    md_table,
    params_cell,
    rate_cell,
    ratio,
    shapes_checked,
)
from tritonkit.harness.readme_tables import (  # noqa: F401
    README_BEGIN,
    README_END,
    README_HOST_BEGIN,
    README_HOST_END,
    README_SUMMARY_BEGIN,
    README_SUMMARY_END,
    readme_section,
    render_host_table,
    render_readme_table,
    render_summary_table,
    update_readme,
)

SCHEMA = 1


def make_results(
    *,
    kind: str,
    fingerprint: dict[str, Any],
    ceilings: dict[str, Any] | None,
    checks: list[dict[str, Any]],
    bench: list[dict[str, Any]],
    seed: int,
    ops: list[str],
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "kind": kind,  # "gpu" (timed) or "interpreter" (accuracy only)
        "fingerprint": fingerprint,
        "ceilings": ceilings,
        "seed": seed,
        "ops": ops,
        "checks": checks,
        "bench": bench,
    }


def write_json(results: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, default=str) + "\n")


def _case_key(record: dict[str, Any]) -> tuple:
    return (
        record["op"],
        json.dumps(record.get("params") or {}, sort_keys=True),
        str(record["shape"]),
        record["dtype"],
        record["mode"],
    )


def merge(documents: list[dict[str, Any]]) -> dict[str, Any]:
    """One results document from several runs on the same GPU (e.g. one per family, or an
    operator re-timed after a change): a later document's bench record replaces an earlier
    one of the same case (operator, parameters, shape, dtype, mode) in its place, and its
    checks replace the earlier checks of the operators it checked. ``merged_from`` lists every
    run that contributed, a merged document's own list included."""
    if not documents:
        raise ValueError("no results to merge")
    first = documents[0]
    for doc in documents[1:]:
        if doc["fingerprint"].get("gpu") != first["fingerprint"].get("gpu"):
            raise ValueError(
                f"cannot merge results from different GPUs: {first['fingerprint'].get('gpu')!r} "
                f"and {doc['fingerprint'].get('gpu')!r}"
            )
        if doc["kind"] != first["kind"]:
            raise ValueError("cannot merge GPU results with interpreter-only results")
    merged = dict(first)
    # The latest run's ceilings head the report; each run's own are kept in merged_from (every
    # record's % of roofline was computed against its own run's ceilings).
    merged["ceilings"] = documents[-1]["ceilings"]
    bench: dict[tuple, dict[str, Any]] = {}
    checks: list[dict[str, Any]] = []
    ops: list[str] = []
    history: list[dict[str, Any]] = []
    for doc in documents:
        for record in doc["bench"]:
            bench[_case_key(record)] = record  # a replacement keeps the case's place
        checked = {c["op"] for c in doc["checks"]}
        checks = [c for c in checks if c["op"] not in checked] + list(doc["checks"])
        ops = [op for op in ops if op not in doc["ops"]] + list(dict.fromkeys(doc["ops"]))
        history += doc.get("merged_from") or [
            {
                "date": doc["fingerprint"]["date"],
                "git_commit": doc["fingerprint"]["git_commit"],
                "ops": doc["ops"],
                "ceilings": doc["ceilings"],
            }
        ]
    merged.update(bench=list(bench.values()), checks=checks, ops=ops, merged_from=history)
    return merged


def load_json(path: Path) -> dict[str, Any]:
    """A results document from a results.json file or a directory holding one; a missing,
    unreadable or malformed one raises ValueError naming the file and what is wrong."""
    path = Path(path)
    if path.is_dir():
        if not (path / "results.json").is_file():
            raise ValueError(f"directory {path} holds no results.json (written by tritonkit bench)")
        path = path / "results.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"results file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"results file {path} cannot be read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"results file {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        if not isinstance(data, dict):
            found = f"it holds a JSON {type(data).__name__}"
        elif "schema" in data:
            found = f"its schema is {data['schema']!r}"
        else:  # another script's output (benchmarks/, experiments/): say what it holds
            keys = ", ".join(list(data)[:6]) + (", ..." if len(data) > 6 else "")
            found = f"it has no schema (its keys: {keys})"
        raise ValueError(
            f"results file {path} is not a tritonkit results document (what `tritonkit bench` "
            f"writes, schema {SCHEMA}): {found}"
        )
    validate(data, path)
    return data


_NUMBER = (int, float)
_DOCUMENT = {"kind": str, "fingerprint": dict, "checks": list, "bench": list, "ops": list}
_FINGERPRINT = {"torch": str, "triton": str, "python": str, "git_commit": str, "date": str}
_CHECK = {"op": str, "params": str, "shape": str, "dtype": str, "case": str, "passed": bool}
_BENCH = {
    "op": str,
    "family": str,
    "params": dict,
    "shape": str,
    "dtype": str,
    "mode": str,
    "candidates": dict,
    "speedup": dict,
    "bytes": _NUMBER,
    "flops": _NUMBER,
}
_UNTIMED = {k: v for k, v in _BENCH.items() if k not in ("bytes", "flops")}
_CEILINGS = {"copy_GBps": _NUMBER, "tflops": dict, "profile": dict, "source": str}


def _require(obj: Any, fields: dict[str, Any], where: str, path: Path) -> None:
    if not isinstance(obj, dict):
        raise ValueError(f"results file {path} is malformed: {where} is not an object")
    for key, types in fields.items():
        if key not in obj:
            raise ValueError(f"results file {path} is malformed: {where} has no {key!r}")
        if not isinstance(obj[key], types) or (types is _NUMBER and isinstance(obj[key], bool)):
            raise ValueError(
                f"results file {path} is malformed: {where}.{key} is "
                f"{type(obj[key]).__name__} {obj[key]!r:.40}"
            )


def validate(data: dict[str, Any], path: Path) -> None:
    """Every field the report, merge and regress read, so that none fails half-way."""
    _require(data, _DOCUMENT, "the document", path)
    if data["kind"] not in ("gpu", "interpreter"):
        raise ValueError(
            f"results file {path} is malformed: kind is {data['kind']!r}, not 'gpu' or "
            "'interpreter'"
        )
    _require(data["fingerprint"], _FINGERPRINT, "fingerprint", path)
    for i, check in enumerate(data["checks"]):
        _require(check, _CHECK, f"checks[{i}]", path)
    for i, record in enumerate(data["bench"]):
        # A case not timed because its check failed (bench_cases._untimed) has no bytes or
        # FLOPs figure, and no candidates.
        fields = _UNTIMED if record.get("untimed") else _BENCH
        _require(record, fields, f"bench[{i}]", path)
        for name, candidate in record["candidates"].items():
            _require(candidate, {"kind": str}, f"bench[{i}].candidates[{name!r}]", path)
    if data["kind"] == "gpu" and data["bench"]:
        _require(data.get("ceilings"), _CEILINGS, "ceilings", path)


# ---- formatting -----------------------------------------------------------------------------


def environment_lines(results: dict[str, Any]) -> list[str]:
    fp = results["fingerprint"]
    lines = []
    if fp.get("gpu"):
        lines.append(
            f"- GPU: {fp['gpu']} (sm_{fp.get('gpu_capability', '?').replace('.', '')}, "
            f"{fp.get('gpu_sms')} SMs, {fp.get('gpu_memory_GiB')} GiB), driver {fp.get('driver')}, "
            f"CUDA {fp.get('cuda')}"
        )
    else:
        lines.append("- GPU: none (Triton interpreter on the CPU; no timings)")
    lines.append(
        f"- torch {fp['torch']}, triton {fp['triton']}, Python {fp['python']}, "
        f"commit `{fp['git_commit']}`, {fp['date']}"
    )
    c = results.get("ceilings")
    if c:
        rates = ", ".join(f"{k} {v:,.0f}" for k, v in c["tflops"].items())
        lines.append(
            f"- Ceilings ({c['profile']['name']}; {c['source']}): copy {c['copy_GBps']:,.0f} "
            f"GB/s (1 GiB device copy, read + write); matmul TFLOP/s: {rates}"
        )
    return lines


CHECK_LEGEND = (
    "Each check runs the operator on fresh random inputs (and on re-laid-out inputs, NaN and "
    "infinities, empty tensors, gradients: the `case`) and compares every output with a float64 "
    "reference computed on the same inputs upcast. Columns: `shapes`, the shapes checked (what "
    "each means is the operator's spec's; the empty tensors' are left out); `checks passed`, "
    "the checks that met "
    "the spec's bound out of those run; `worst rel. L2 error`, the largest ||out - ref|| / ||ref|| "
    "over the operator's checks in that dtype; `worst ratio to PyTorch's error`, the largest "
    "ratio of that error to PyTorch's own in the same dtype against the same reference (below "
    "1: closer than PyTorch; 1 where both are exact; n/a where only PyTorch's is exact or too "
    "few elements were compared)."
)
EXCUSED_RULE = (
    "Passed on PyTorch's own error. The rule: an output passes when every element is within "
    "the spec's `atol + rtol * |ref|`; where a spec allows it (`Tolerance.torch_factor`, for "
    "outputs whose error follows the inputs' conditioning), an output that misses that bound "
    "still passes when its largest error is no more than the stated multiple of PyTorch's own "
    "largest error on the same inputs. These checks passed that way:"
)


def _check_case(c: dict[str, Any]) -> str:
    """One check named: operator, [parameters], shape, dtype, case."""
    params = f" [{c['params']}]" if c.get("params") else ""
    return f"{c['op']}{params} {c['shape']} {c['dtype']} {c['case']}"


def render_checks(checks: list[dict[str, Any]]) -> str:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for c in checks:
        groups[(c["op"], c["dtype"])].append(c)
    rows = []
    for (op, dtype), cs in groups.items():
        rels = [c["rel_l2"] for c in cs if isinstance(c.get("rel_l2"), float)]
        # A ratio to PyTorch's error is undefined where PyTorch's own error is 0 (or absent).
        ratios = [
            c["ratio"]
            for c in cs
            if isinstance(c.get("ratio"), (int, float)) and math.isfinite(c["ratio"])
        ]
        passed = sum(c["passed"] for c in cs)
        skipped = [c["skipped"] for c in cs if c.get("skipped")]
        run = len(cs) - len(skipped)
        rows.append(
            [
                op,
                dtype,
                shapes_checked(cs),
                f"skipped: {skipped[0]}" if skipped and not run else f"{passed}/{run}",
                fmt(max(rels) if rels else None),
                fmt(max(ratios)) if ratios else "n/a",
            ]
        )
    out = (
        CHECK_LEGEND
        + "\n\n"
        + md_table(
            [
                "operator",
                "dtype",
                "shapes",
                "checks passed",
                "worst rel. L2 error",
                "worst ratio to PyTorch's error",
            ],
            rows,
        )
    )
    excused = [c for c in checks if c["passed"] and c.get("detail")]
    if excused:
        out += "\n\n" + EXCUSED_RULE + "\n\n"
        out += "\n".join(f"- {_check_case(c)}: {c['detail']}" for c in excused)
    failed = [c for c in checks if not c["passed"] and not c.get("skipped")]
    if failed:
        out += "\n\nFailed checks:\n\n" + "\n".join(
            f"- {_check_case(c)}: {c['detail'].splitlines()[0] if c['detail'] else ''}"
            for c in failed
        )
    return out


def _wall(record: dict[str, Any], baseline: str) -> str:
    """The wall-time speedup of back-to-back calls, where the run measured it."""
    value = record.get("wall_speedup", {}).get(baseline)
    return f"; wall {ratio(value)}" if value is not None else ""


def _speedup_cell(record: dict[str, Any], baseline: str) -> str:
    if baseline in record["speedup"]:
        cmp = record.get("comparison", {}).get(baseline)
        wall = _wall(record, baseline)
        if not cmp or not all(
            isinstance(cmp.get(k), (int, float)) and math.isfinite(cmp[k])
            for k in ("speedup", "ci_low", "ci_high")
        ):
            return ratio(record["speedup"][baseline]) + wall
        mark = {"faster": "", "slower": "", "no significant difference": " (≈)"}[cmp["verdict"]]
        flag = " ⚠" if cmp.get("flag") else ""
        ci = f"[{cmp['ci_low']:.2f}, {cmp['ci_high']:.2f}]"
        return f"{cmp['speedup']:.2f}x {ci}{mark}{flag}{wall}"
    why = record["candidates"].get(baseline, {}).get("skipped")
    return f"— ({why})" if why else "—"


def _loop_cell(c: dict[str, Any]) -> str:
    """Wall and host time per call of back-to-back calls; ⏱ where the host sets the pace."""
    if c.get("wall_us") is None:
        return "—"
    mark = " ⏱" if c.get("host_bound") else ""
    return f"{fmt(c['wall_us'])} / {fmt(c['host_us'])}{mark}"


def evolution_rows(record: dict[str, Any]) -> list[list[str]]:
    """Variants in order, then tritonkit's default path: time, rate, % of cuBLAS/torch, gain."""
    cands = record["candidates"]
    order = [n for n, c in cands.items() if c["kind"] == "variant"] + ["tritonkit"]
    ref = cands.get("torch", {})
    rows, previous = [], None
    for name in order:
        c = cands.get(name, {})
        if "median" not in c:
            continue
        pct = 100.0 * ref["median"] / c["median"] if "median" in ref and c["median"] else None
        gain = ratio(previous / c["median"]) if previous and c["median"] else "—"
        label = name if name != "tritonkit" else "tritonkit (default)"
        rows.append([label, fmt(c["median"]), rate_cell(c), fmt(pct), gain])
        previous = c["median"]
    return rows


def render_bench(bench: list[dict[str, Any]]) -> str:
    if not bench:
        return "No timings: this run had no GPU."
    parts = []
    for family in dict.fromkeys(r["family"] for r in bench):
        recs = [r for r in bench if r["family"] == family]
        base = baselines_in(recs)
        header = ["operator", "params", "shape", "dtype", "mode", "ms", "rate", "% roofline"]
        header += ["wall / host us"]
        extras = [
            (title, cell)
            for title, cell, present in EXTRA_COLUMNS
            if any(present(r, r["candidates"].get("tritonkit", {})) for r in recs)
        ]
        header += [title for title, _ in extras]
        header += [f"vs {b} [95% CI]; wall" for b in base]
        header += ["peak MiB (ours / torch)", "correct (rel. L2)"]
        rows, notes = [], []
        for r in recs:
            ours = r["candidates"].get("tritonkit", {})
            if r.get("note"):
                notes.append(f"{r['op']} {r['shape']} {r['dtype']} {r['mode']}: {r['note']}")
                continue
            roof = ours.get("pct_of_roofline")
            row = [
                r["op"],
                params_cell(r["params"]),
                r["shape"],
                r["dtype"],
                r["mode"],
                fmt(ours.get("median")),
                rate_cell(ours),
                f"{roof:.0f}% ({ours.get('bound') or ours.get('bottleneck')})"
                if roof is not None
                else "—",
                _loop_cell(ours),
            ]
            row += [cell(r, ours) for _, cell in extras]
            row += [_speedup_cell(r, b) for b in base]
            torch_mem = r["candidates"].get("torch", {}).get("peak_mem_bytes")
            ours_mem = ours.get("peak_mem_bytes")
            row.append(
                f"{fmt(ours_mem / 2**20 if ours_mem is not None else None)} / "
                f"{fmt(torch_mem / 2**20 if torch_mem is not None else None)}"
            )
            corr = r.get("correct", {})
            row.append(("ok " if corr.get("passed") else "FAIL ") + fmt(corr.get("rel_l2")))
            rows.append(row)
            flags = [
                f"{r['op']} {r['shape']} {r['dtype']} {r['mode']} vs {b}: {c['flag']}"
                for b, c in r.get("comparison", {}).items()
                if c.get("flag")
            ]
            notes += flags
            if ours.get("rsd_met") is False:
                notes.append(
                    f"{r['op']} {r['shape']} {r['dtype']} {r['mode']}: RSD "
                    f"{100 * ours['rsd']:.1f}% missed the target after {ours.get('batches')} "
                    "batches of samples (the time cap): compare its medians with care"
                )
        parts.append(f"### {family}\n\n" + md_table(header, rows))
        for r in recs:
            if r.get("note") or not any(c["kind"] == "variant" for c in r["candidates"].values()):
                continue
            title = f"#### {r['op']} {r['shape']} {r['dtype']} {r['mode']}: versions side by side"
            table = md_table(
                ["version", "ms", "rate", "% of torch", "gain over previous"], evolution_rows(r)
            )
            parts.append(title + "\n\n" + table)
        if notes:
            parts.append("Notes:\n\n" + "\n".join(f"- {n}" for n in notes))
    return "\n\n".join(parts)


def _extra_legend(bench: list[dict[str, Any]]) -> str:
    """What the columns a run has beyond the older documents' mean (empty where it has none)."""
    ours = [r["candidates"].get("tritonkit", {}) for r in bench]
    text = ""
    if any(c.get("rsd") is not None for c in ours):
        text += (
            " `RSD`: standard deviation over mean of the samples inside the fences; samples "
            "are added batch after batch until it is at most the target (5% unless set) or a "
            "time cap, ⚑ where the cap came first."
        )
    if any(c.get("joules_per_call") is not None for c in ours):
        text += (
            " `energy`: NVML over back-to-back calls: the board's watts, microjoules per call "
            "and GB/s (or GFLOP/s) per watt (bytes or FLOPs per joule)."
        )
    if any(r.get("kernels") for r in bench):
        text += (
            " `kernels`: per kernel launched, registers, spills (local memory per thread, "
            "shown where not 0) and theoretical occupancy on sm_90, with a profiler's "
            "achieved occupancy, L2 hit rate and DRAM GB/s where measured; the class in "
            "`% roofline` follows harness/bottleneck.py's rule."
        )
    return text


def render_markdown(results: dict[str, Any], plots: list[Path] | None = None) -> str:
    lines = ["# tritonkit report", "", *environment_lines(results), ""]
    images = [f"![{p.stem}]({p.name})" for p in plots or []]
    if results["kind"] != "gpu":
        # Interpreter runs hold no timings, so the GPU sections (rates, roofline, speedups)
        # are left out rather than shown empty.
        lines += [
            "**No GPU on this machine: the kernels ran under Triton's CPU interpreter, so this "
            "report holds accuracy checks only. Interpreter timings measure nothing of the GPU "
            "(NumPy runs each kernel program by program), so none were taken. Timings need a "
            "GPU: run the same command on a machine with a CUDA GPU.**",
            "",
            *images,
            *[""] * bool(images),
            "## Accuracy",
            "",
            render_checks(results["checks"]) if results["checks"] else "No checks in this run.",
            "",
        ]
        return "\n".join(lines)
    lines += [
        "How to read it: `rate` is the fewest bytes (or FLOPs) the operator must move (or do), "
        "from each spec's formula, over the median time; `% roofline` is the hardware floor "
        "max(FLOPs / peak, bytes / bandwidth) over the measured time, with the term that "
        "bounds it; `vs X` is X's median time over tritonkit's (above 1: tritonkit is faster), "
        "both timed in the same run, interleaved, L2 flushed before every sample, outliers "
        "beyond 1.5 IQR dropped, with a 95% bootstrap interval; (≈) marks no significant "
        "difference, ⚠ a speedup above 10x to review; n/a, a ratio without a baseline."
        + _extra_legend(results["bench"]),
        "",
    ]
    if images:
        lines += [*images, ""]
    lines += [
        "## Accuracy",
        "",
        render_checks(results["checks"]) if results["checks"] else "No checks in this run.",
        "",
        "## Performance",
        "",
        render_bench(results["bench"]),
        "",
    ]
    return "\n".join(lines)


def write_report(results: dict[str, Any], out_dir: Path, with_json: bool = True) -> list[Path]:
    """report.md and plots under ``out_dir``, and results.json unless ``with_json`` is False."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if with_json:
        write_json(results, out_dir / "results.json")
    # Through the module: a caller (a test that leaves the plots out) may replace its functions.
    drawn = [plots_.plot_roofline(results, out_dir), plots_.plot_bandwidth(results, out_dir)]
    plots = [p for p in drawn if p] + plots_.plot_speedups(results, out_dir)
    plots += [p for p in (plots_.plot_accuracy(results, out_dir),) if p]
    plots += plots_.plot_sweeps(results, out_dir)  # only runs of `bench --sweep` have any
    (out_dir / "report.md").write_text(render_markdown(results, plots))
    return [out_dir / "results.json"] * with_json + [out_dir / "report.md", *plots]
