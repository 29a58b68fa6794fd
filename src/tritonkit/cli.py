"""The ``tritonkit`` command: list, check, bench, report, doctor, tune, regress, new.

Without a GPU, kernels run under Triton's CPU interpreter (turned on here, before any kernel is
defined): ``check`` works and ``bench`` runs the accuracy checks and says that timings need a GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import torch

DEFAULT_OUT = "tritonkit-report"


def _enable_interpreter_without_gpu() -> bool:
    """Turn on the interpreter on a machine with no GPU; returns whether kernels are interpreted."""
    if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:
        os.environ["TRITON_INTERPRET"] = "1"
    from tritonkit.ops._core.device import interpreter_enabled

    return interpreter_enabled()


def _split(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [v for item in values for v in item.split(",") if v]


def _select(names: list[str] | None):
    from tritonkit.harness.spec import UnknownOp, select

    try:
        return select(names)
    except UnknownOp as exc:
        print(f"tritonkit: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _dtypes(names: list[str] | None):
    from tritonkit.harness.spec import parse_dtype

    if not names:
        return None
    try:
        return [parse_dtype(n) for n in names]
    except ValueError as exc:
        print(f"tritonkit: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


# ---- commands ---------------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    from tritonkit.harness.report import _table
    from tritonkit.harness.spec import dtype_name

    rows = []
    for s in _select(_split(args.ops)):
        rows.append(
            [
                s.name,
                s.family,
                ", ".join(dtype_name(d) for d in s.dtypes),
                ", ".join(s.baselines) or "—",
                ", ".join(s.variants) or "—",
                "yes" if s.backward else "no",
                s.description,
            ]
        )
    print(
        _table(["operator", "family", "dtypes", "baselines", "variants", "backward", "what"], rows)
    )
    return 0


def _run_checks(specs, dtypes, seed, shapes: str = "test") -> list[dict[str, Any]]:
    from tritonkit.harness.check import check_spec
    from tritonkit.harness.progress import Progress

    progress = Progress(len(specs), "check")
    results = []
    for spec in specs:
        chosen = spec.shapes.bench if shapes == "bench" else None
        out = check_spec(spec, dtypes=dtypes, seed=seed, shapes=chosen)
        results += [r.as_dict() for r in out]
        ran = [r for r in out if not r.skipped]
        failed = sum(not r.passed for r in ran)
        skipped = f", {len(out) - len(ran)} skipped" if len(ran) < len(out) else ""
        progress.step(f"{spec.name}: {len(ran) - failed}/{len(ran)} passed{skipped}")
    progress.close()
    return results


def _print_check_summary(checks: list[dict[str, Any]]) -> int:
    from tritonkit.harness.report import render_checks

    print(render_checks(checks))
    failed = [c for c in checks if not c["passed"] and not c.get("skipped")]
    skipped = [c for c in checks if c.get("skipped")]
    for c in failed[:20]:
        case = f"{c['op']} [{c['params']}] {c['shape']} {c['dtype']} {c['case']}"
        print(f"\nFAILED {case} seed={c['seed']}")
        print("  " + c["detail"].replace("\n", "\n  "))
    run = len(checks) - len(skipped)
    print(f"\n{run - len(failed)}/{run} checks passed", end="")
    if skipped:
        reasons = sorted({f"{c['op']} {c['dtype']}: {c['skipped']}" for c in skipped})
        print(f"; not run under the interpreter: {'; '.join(reasons)}", end="")
    print()
    return 1 if failed else 0


def cmd_check(args: argparse.Namespace) -> int:
    from tritonkit.harness.check import fresh_seed

    interpreted = _enable_interpreter_without_gpu()
    specs = _select(_split(args.ops))
    seed = args.seed if args.seed is not None else fresh_seed()
    where = "Triton interpreter (CPU)" if interpreted else torch.cuda.get_device_name()
    print(f"checking {len(specs)} operators on {where}, seed {seed}", file=sys.stderr)
    checks = _run_checks(specs, _dtypes(_split(args.dtypes)), seed, args.shapes)
    if args.json:
        import json

        Path(args.json).write_text(json.dumps(checks, indent=1, default=str))
    return _print_check_summary(checks)


def cmd_bench(args: argparse.Namespace) -> int:
    from tritonkit.harness.check import fresh_seed
    from tritonkit.harness.device import fingerprint
    from tritonkit.harness.report import make_results, write_report

    interpreted = _enable_interpreter_without_gpu()
    specs = _select(_split(args.ops))
    dtypes = _dtypes(_split(args.dtypes))
    seed = args.seed if args.seed is not None else fresh_seed()
    out_dir = Path(args.out)
    gpu = torch.cuda.is_available() and not interpreted
    checks = [] if args.no_check else _run_checks(specs, dtypes, seed)
    bench: list[dict[str, Any]] = []
    ceilings = None
    if gpu:
        from tritonkit.harness.bench import bench_spec, default_modes
        from tritonkit.harness.progress import Progress

        try:
            modes = default_modes(args.mode)
        except ValueError as exc:
            print(f"tritonkit: {exc}", file=sys.stderr)
            return 2
        profile = _gpu_profile(args)
        ceilings = _ceilings(profile)
        print(
            f"ceilings ({profile.name}): copy {profile.dram_GBps:,.0f} GB/s, "
            f"bf16 matmul {profile.tflops.get('bf16', 0):,.0f} TFLOP/s",
            file=sys.stderr,
        )
        total = sum(
            (len(args.shapes) if args.shapes else len(s.shapes.bench))
            * len([d for d in (dtypes or s.bench_dtypes) if d in s.dtypes])
            * len(modes)
            for s in specs
        )
        progress = Progress(total, "bench")
        for spec in specs:
            bench += bench_spec(
                spec,
                profile=profile,
                modes=modes,
                dtypes=dtypes,
                baselines=_split(args.baselines),
                shapes=[_parse_shape(s) for s in args.shapes] if args.shapes else None,
                seed=seed,
                on_step=progress.step,
            )
        progress.close()
    results = make_results(
        kind="gpu" if gpu else "interpreter",
        fingerprint=fingerprint(),
        ceilings=ceilings,
        checks=checks,
        bench=bench,
        seed=seed,
        ops=[s.name for s in specs],
    )
    written = write_report(results, out_dir)
    status = _print_check_summary(checks) if checks else 0
    if gpu:
        _print_bench_summary(bench)
    else:
        print(
            "\nNo GPU here: the kernels ran under Triton's CPU interpreter and only accuracy was "
            "checked. Timings need a CUDA GPU; run the same command on one."
        )
    print("\nwrote " + ", ".join(str(p) for p in written))
    return status


def _gpu_profile(args: argparse.Namespace):
    """Measured ceilings (cached per GPU), as a profile, with --profile applied; made active."""
    from tritonkit import _hardware
    from tritonkit.harness import hardware

    measured = hardware.measured_ceilings(remeasure=getattr(args, "measure", False))
    try:
        profile = hardware.resolve_profile(args.profile, measured)
    except ValueError as exc:
        print(f"tritonkit: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    _hardware.set_active(profile)
    return profile


def _ceilings(profile) -> dict[str, Any]:
    return {
        "profile": profile.to_dict(),
        "copy_GBps": profile.dram_GBps,
        "tflops": dict(profile.tflops),
        "source": profile.source,
    }


def _print_bench_summary(bench: list[dict[str, Any]]) -> None:
    from tritonkit.harness.report import _fmt, _table

    rows = []
    for r in bench:
        ours = r["candidates"].get("tritonkit", {})
        if r.get("note") or "median" not in ours:
            continue
        speed = ", ".join(f"{k} {v:.2f}x" for k, v in r["speedup"].items())
        rows.append(
            [
                r["op"],
                r["dtype"],
                r["shape"],
                r["mode"],
                _fmt(ours["median"]),
                _fmt(ours.get("GBps")),
                _fmt(ours.get("pct_copy_bw")),
                speed,
            ]
        )
    print()
    print(_table(["op", "dtype", "shape", "mode", "ms", "GB/s", "% copy", "speedup vs"], rows))
    from tritonkit.harness.report import evolution_rows

    for r in bench:
        if r.get("note") or not any(c["kind"] == "variant" for c in r["candidates"].values()):
            continue
        print(f"\n{r['op']} {r['shape']} {r['dtype']} {r['mode']}: versions side by side")
        print(
            _table(["version", "ms", "rate", "% of torch", "gain over previous"], evolution_rows(r))
        )


def cmd_report(args: argparse.Namespace) -> int:
    from tritonkit.harness.report import load_json, merge, update_readme, write_report

    try:
        results = merge([load_json(Path(p)) for p in args.results])
    except ValueError as exc:
        print(f"tritonkit: {exc}", file=sys.stderr)
        return 2
    # One input is already the results file; several are merged into a new one.
    written = write_report(results, Path(args.out), with_json=len(args.results) > 1)
    print("wrote " + ", ".join(str(p) for p in written))
    if args.readme:
        if results["kind"] != "gpu":
            print("tritonkit: the README table needs GPU results", file=sys.stderr)
            return 2
        source = args.source or ", ".join(args.results)
        changed = update_readme(Path(args.readme), results, source=source)
        print(f"{args.readme}: {'updated' if changed else 'already up to date'}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    interpreted = _enable_interpreter_without_gpu()
    from tritonkit import _hardware
    from tritonkit.harness.device import fingerprint

    fp = fingerprint()
    for key, value in fp.items():
        print(f"{key:>16}: {value}")
    if not torch.cuda.is_available():
        print(
            "\nNo CUDA GPU: kernels run under Triton's CPU interpreter"
            + (" (TRITON_INTERPRET=1)." if interpreted else ", once TRITON_INTERPRET=1 is set.")
            + " Accuracy checks work; timings need a GPU."
        )
        if args.profile:
            from tritonkit.harness import hardware

            try:
                profile = hardware.resolve_profile(args.profile)
            except ValueError as exc:
                print(f"tritonkit: {exc}", file=sys.stderr)
                return 2
            _print_profile(profile)
        return 0
    datasheet = _hardware.active()
    if not args.measure and not args.profile:
        _print_profile(datasheet)
        print("\n(datasheet figures; `tritonkit doctor --measure` measures this GPU's ceilings)")
        return 0
    profile = _gpu_profile(args)
    _print_profile(profile, datasheet)
    return 0


def _print_profile(profile, datasheet=None) -> None:
    if profile is None:
        print("\nno profile for this device")
        return
    print(f"\nprofile: {profile.name} ({profile.source})")
    print(
        f"  {profile.compute_units} compute units, {profile.smem_per_block_kb:g} KB shared "
        f"memory per block, warp {profile.warp_size}"
    )

    def vs(measured: float, key: str | None) -> str:
        if datasheet is None:
            return ""
        ref = datasheet.dram_GBps if key is None else datasheet.tflops.get(key)
        return f"  ({100 * measured / ref:.0f}% of datasheet {ref:,.0f})" if ref else ""

    print(f"  bandwidth: {profile.dram_GBps:,.0f} GB/s{vs(profile.dram_GBps, None)}")
    for key, value in profile.tflops.items():
        print(f"  {key:>5}: {value:,.0f} TFLOP/s{vs(value, key)}")


def cmd_tune(args: argparse.Namespace) -> int:
    _enable_interpreter_without_gpu()
    from tritonkit import _tuning
    from tritonkit.harness.spec import parse_dtype

    if not torch.cuda.is_available():
        print("tritonkit: tuning needs a CUDA GPU", file=sys.stderr)
        return 2
    specs = _select([args.op])
    _gpu_profile(args)
    if args.force:
        os.environ[_tuning.FORCE_ENV] = "1"
    for spec in specs:
        shapes = [_parse_shape(s) for s in args.shapes] if args.shapes else spec.shapes.bench
        dtypes = [parse_dtype(d) for d in _split(args.dtypes)] if args.dtypes else spec.bench_dtypes
        for shape in shapes:
            for dtype in dtypes:
                inputs = spec.make_inputs(shape, dtype, torch.device("cuda"), 0)
                before = (_tuning.STATS.hits, len(_tuning.STATS.log))
                spec.impl(*inputs, **spec.params[0])
                torch.cuda.synchronize()
                new = _tuning.STATS.log[before[1] :]
                hits = _tuning.STATS.hits - before[0]
                print(f"{spec.name} {shape} {dtype}: {len(new)} tuned, {hits} from the cache")
                for t in new:
                    print(
                        f"  {t.kernel} {dict(t.key)}: {len(t.tried)} configs in {t.seconds:.1f} s"
                    )
                    for cfg, ms in sorted(t.tried, key=lambda p: (p[1] is None, p[1] or 0)):
                        mark = "  <- best" if cfg == t.best else ""
                        time = f"{ms:.4f} ms" if ms is not None else "failed"
                        print(f"    {time:>12}  {cfg}{mark}")
    print(f"cache: {_tuning.cache_path()}")
    return 0


def _parse_shape(text: str):
    import ast

    try:
        shape = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise SystemExit(  # noqa: B904 - the parse error adds nothing to this message
            f"tritonkit: --shapes takes Python tuples like '(4096, 4096)', got {text!r}"
        )
    return shape


def cmd_regress(args: argparse.Namespace) -> int:
    from tritonkit.harness import regress
    from tritonkit.harness.report import load_json

    try:
        new, old = load_json(Path(args.new)), load_json(Path(args.against))
        rows = regress.compare(new, old, args.threshold)
    except ValueError as exc:
        print(f"tritonkit regress: refusing to compare: {exc}", file=sys.stderr)
        return 2
    print(regress.render(rows, args.threshold))
    return 1 if regress.failed(rows) else 0


def cmd_new(args: argparse.Namespace) -> int:
    from tritonkit.scaffold import ScaffoldError, scaffold

    _enable_interpreter_without_gpu()
    try:
        written = scaffold(args.name, root=args.root)
    except ScaffoldError as exc:
        print(f"tritonkit: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    print(
        f"\nNext: python -m pytest -q tests/test_{args.name}.py; tritonkit check {args.name}; "
        f"on a GPU, tritonkit bench {args.name}. Then make it yours: the kernel, the reference, "
        "the shapes, bytes and FLOPs, the docs (docs/DESIGN.md, 'Adding an operator')."
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tritonkit",
        description="Check, benchmark and report tritonkit's Triton kernels.",
    )
    p.add_argument(
        "--profile",
        help="hardware profile: a JSON file, a known GPU name, or scale factors for this GPU "
        "such as 'bandwidth=0.7' (tuning and the roofline respond to it)",
    )
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("list", help="operators, their dtypes, baselines and variants")
    s.add_argument("ops", nargs="*", help="operators or families (default: all)")
    s.set_defaults(func=cmd_list)

    s = sub.add_parser("check", help="accuracy checks against a float64 reference")
    s.add_argument("ops", nargs="*", help="operators or families (default: all)")
    s.add_argument("--dtypes", action="append", help="e.g. bf16,fp32 (default: all supported)")
    s.add_argument("--shapes", choices=("test", "bench"), default="test")
    s.add_argument("--seed", type=int, help="base seed (default: fresh, printed)")
    s.add_argument("--json", help="also write the results to this file")
    s.set_defaults(func=cmd_check)

    s = sub.add_parser("bench", help="check, time against baselines and write a report")
    s.add_argument("ops", nargs="*", help="operators or families (default: all)")
    s.add_argument("--mode", default="fwd,bwd", help="fwd, bwd, fwd+bwd, a comma list, or all")
    s.add_argument("--baselines", action="append", help="baseline names to time (default: all)")
    s.add_argument("--dtypes", action="append", help="e.g. bf16,fp32 (default: each spec's)")
    s.add_argument(
        "--shapes", nargs="+", help="shapes instead of the bench shapes, e.g. '(64, 64)'"
    )
    s.add_argument("--out", default=DEFAULT_OUT, help=f"report directory (default: {DEFAULT_OUT})")
    s.add_argument("--seed", type=int, help="base seed (default: fresh, recorded)")
    s.add_argument("--no-check", action="store_true", help="skip the accuracy checks")
    s.set_defaults(func=cmd_bench)

    s = sub.add_parser("report", help="render a report (and the README table) from results JSON")
    s.add_argument("results", nargs="+", help="results.json files of `tritonkit bench` (merged)")
    s.add_argument("--out", default=DEFAULT_OUT)
    s.add_argument("--readme", help="also regenerate this README's results section")
    s.add_argument("--source", help="the results file the README should name as its source")
    s.set_defaults(func=cmd_report)

    s = sub.add_parser("doctor", help="environment, hardware profile, measured ceilings")
    s.add_argument("--measure", action="store_true", help="measure (and cache) the ceilings")
    s.set_defaults(func=cmd_doctor)

    s = sub.add_parser("tune", help="pre-tune an operator's kernels; print every config tried")
    s.add_argument("op", help="operator name")
    s.add_argument("--shapes", nargs="+", help="shapes, e.g. '(8192, 8192)' (default: bench)")
    s.add_argument("--dtypes", action="append", help="e.g. bf16 (default: bench dtypes)")
    s.add_argument("--force", action="store_true", help="time again even if cached")
    s.set_defaults(func=cmd_tune)

    s = sub.add_parser("regress", help="fail when an operator got slower or less accurate")
    s.add_argument("new", help="new results.json")
    s.add_argument("--against", required=True, help="old results.json")
    s.add_argument("--threshold", type=float, default=0.10, help="allowed slowdown (0.10)")
    s.set_defaults(func=cmd_regress)

    s = sub.add_parser("new", help="scaffold a new operator: family package, spec and test")
    s.add_argument("name", help="operator name, a lowercase identifier (e.g. scaled_add)")
    s.add_argument("--root", help="repository root (default: the checkout tritonkit runs from)")
    s.set_defaults(func=cmd_new)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
