"""The ``tritonkit`` command: list, check, bench, report, doctor, tune, regress, new, warmup.

Without a GPU, kernels run under Triton's CPU interpreter (turned on here, before any kernel is
defined): ``check`` works and ``bench`` runs the accuracy checks and says that timings need a GPU.

Every flag is validated before anything runs. A problem with what was asked for is one line on
stderr naming it and the valid choices, with exit code 2; so is an unexpected failure, whose
traceback ``--debug`` shows.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

import torch

import tritonkit.cli_warmup as cli_warmup
from tritonkit.cli_args import (  # noqa: F401  (the names commands and tests use)
    COMMANDS,
    DEFAULT_OUT,
    DTYPE_ALIASES,
    REPORT_FILES,
    UsageError,
    _check_profile,
    _clear_report,
    _confirm,
    _dtypes,
    _enable_interpreter_without_gpu,
    _fresh_out_dir,
    _nonnegative_int,
    _Parser,
    _positive_int,
    _resolve_profile,
    _seed,
    _select,
    _shape_list,
    _split,
    _threshold,
    _Version,
    _writable_file,
)
from tritonkit.cli_run import (
    _check_shapes,
    _gpu_profile,
    _plan_checks,
    _print_check_summary,
    _run_item_checks,
    cmd_bench,
    cmd_tune,
)
from tritonkit.harness import bench_comm, cli_why, quant_report

# ---- commands ---------------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    from tritonkit.harness.report import md_table
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
        md_table(
            ["operator", "family", "dtypes", "baselines", "variants", "backward", "what"], rows
        )
    )
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    interpreted = _enable_interpreter_without_gpu()
    specs = _select(_split(args.ops))
    dtypes = _dtypes(args.dtypes)
    json_path = _writable_file(args.json, "--json")
    shapes_of = _check_shapes(args.shapes)
    plan = _plan_checks(specs, dtypes, shapes_of)
    from tritonkit.harness import selection
    from tritonkit.harness.check import CASES
    from tritonkit.harness.progress import Progress, duration, plural

    items = [
        selection.Item(s, tuple(dtypes or s.dtypes), tuple(shapes_of(s)), CASES, (), (), False)
        for s in specs
    ]
    from tritonkit.harness import warm

    gpu = not interpreted
    jobs = (args.jobs or warm.default_jobs()) if gpu else 1
    warmed = jobs > 1  # on a GPU the checks' kernels compile first, in parallel
    seconds = sum(
        selection.expected_check_seconds(
            it.spec, it.check_dtypes, it.check_shapes, CASES, gpu=gpu, warmed=warmed
        )
        for it in items
    )
    if warmed:
        compile_s = selection.compile_seconds(items, 0)
        seconds += selection.GPU_WORKERS_START_S + compile_s / jobs
    if interpreted and args.shapes == "bench":
        _confirm(f"{plural(sum(plan.values()), 'check')} at the bench shapes", seconds, args.yes)
    seed = _seed(args)
    where = "Triton interpreter (CPU)" if interpreted else torch.cuda.get_device_name()
    print(
        f"checking {plural(len(specs), 'operator')} on {where}, seed {seed}: "
        f"{plural(sum(plan.values()), 'check')}, about {duration(seconds)}",
        file=sys.stderr,
    )
    if warmed:
        warm.compile_ahead(
            items, (), None, seed, jobs=jobs, quiet=not getattr(args, "debug", False)
        )
    progress = Progress(sum(plan.values()), "check", expected=seconds)
    checks = _run_item_checks(items, seed, plan, progress, gpu, warmed)
    progress.close()
    if json_path is not None:
        import json

        json_path.write_text(json.dumps(checks, indent=1, default=str))
    return _print_check_summary(checks)


def cmd_report(args: argparse.Namespace) -> int:
    from tritonkit.harness.report import load_json, merge, update_readme, write_report

    paths = [Path(p) for p in args.results]
    readme = Path(args.readme) if args.readme else None
    if readme is not None and not readme.is_file():
        raise UsageError(f"--readme: {readme} is not a file")
    try:
        documents = [load_json(p) for p in paths]
        results = merge(documents)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if readme is not None and results["kind"] != "gpu":
        raise UsageError("--readme: the README table needs GPU results; these are interpreter-only")
    # One results directory is re-rendered in place; anything else goes to a fresh directory.
    in_place = len(paths) == 1 and paths[0].is_dir() and args.out is None
    out = paths[0] if in_place else _fresh_out_dir(Path(args.out or DEFAULT_OUT), args.force)
    if args.force and not in_place:
        _clear_report(out)
    try:
        written = write_report(results, out, with_json=not in_place)
    except (KeyError, TypeError, AttributeError) as exc:
        names = ", ".join(map(str, paths))
        raise UsageError(f"results in {names} are malformed: {type(exc).__name__} {exc}") from None
    print("wrote " + ", ".join(str(p) for p in written))
    if readme is not None:
        source = args.source or ", ".join(args.results)
        changed = update_readme(readme, results, source=source)
        print(f"{readme}: {'updated' if changed else 'already up to date'}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    interpreted = _enable_interpreter_without_gpu()
    from tritonkit import _hardware
    from tritonkit.harness.device import fingerprint

    # Without a GPU a profile is only shown; it is resolved first, so a bad one prints nothing.
    shown = (
        _resolve_profile(args.profile) if args.profile and not torch.cuda.is_available() else None
    )
    fp = fingerprint()
    for key, value in fp.items():
        print(f"{key:>16}: {value}")
    if not torch.cuda.is_available():
        print(
            "\nNo CUDA GPU: kernels run under Triton's CPU interpreter"
            + (" (TRITON_INTERPRET=1)." if interpreted else ", once TRITON_INTERPRET=1 is set.")
            + " Accuracy checks work; timings need a GPU."
        )
        if shown is not None:
            _print_profile(shown)
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


def cmd_regress(args: argparse.Namespace) -> int:
    from tritonkit.harness import regress
    from tritonkit.harness.report import load_json

    # What is wrong with the command line first, all of it in one line: a file that does not
    # exist, a missing --against.
    missing = [p for p in (args.new, args.against) if p is not None and not Path(p).exists()]
    problems = [f"{p} does not exist" for p in missing]
    if args.against is None:
        problems.append("--against OLD.json is required (the results to compare with)")
    if problems:
        raise UsageError("regress: " + "; ".join(problems))
    try:
        new, old = load_json(Path(args.new)), load_json(Path(args.against))
    except ValueError as exc:
        raise UsageError(f"regress: {exc}") from None
    try:
        rows = regress.compare(new, old, args.threshold)
    except ValueError as exc:
        raise UsageError(f"regress: refusing to compare: {exc}") from None
    print(regress.render(rows, args.threshold))
    return 1 if regress.failed(rows) else 0


def cmd_new(args: argparse.Namespace) -> int:
    from tritonkit.scaffold import ScaffoldError, remove, scaffold

    _enable_interpreter_without_gpu()
    try:
        if args.remove:
            for path in remove(args.name, root=args.root):
                print(f"{'edited' if path.exists() else 'removed'} {path}")
            return 0
        written = scaffold(args.name, root=args.root)
    except ScaffoldError as exc:
        raise UsageError(str(exc)) from None
    for path in written:
        print(f"wrote {path}")
    print(
        f"\nNext: python -m pytest -q tests/test_{args.name}.py; tritonkit check {args.name}; "
        f"on a GPU, tritonkit bench {args.name}. Then make it yours: the kernel, the reference, "
        "the shapes, bytes and FLOPs, the docs (docs/DESIGN.md, 'Adding an operator')."
    )
    return 0


# ---- the parser -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="on an error, show the traceback; show library warnings",
    )
    p = _Parser(
        prog="tritonkit",
        description="Check, benchmark and report tritonkit's Triton kernels.",
        parents=[common],
    )
    p.add_argument("--version", action=_Version, help="print the version and exit")
    p.add_argument(
        "--profile",
        help="hardware profile: a JSON file, a known GPU name (any case, e.g. h200), or scale "
        "factors for this GPU such as 'bandwidth=0.7' (tuning and the roofline respond to it)",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, parents=[common])

    s = command("list", "operators, their dtypes, baselines and variants")
    s.add_argument("ops", nargs="*", help="operators or families (default: all)")
    s.set_defaults(func=cmd_list)

    s = command("check", "accuracy checks against a float64 reference")
    s.add_argument("ops", nargs="*", help="operators or families (default: all)")
    s.add_argument("--dtypes", action="append", help="e.g. bf16,fp32,int8,fp8 (default: all)")
    s.add_argument("--shapes", type=str.lower, choices=("test", "bench"), default="test")
    s.add_argument("--seed", type=_nonnegative_int, help="base seed (default: fresh, printed)")
    s.add_argument("--json", help="also write the results to this file")
    s.add_argument("--yes", action="store_true", help="run long interpreter work without asking")
    s.add_argument(
        "--jobs",
        type=_positive_int,
        help="on a GPU, processes compiling the checks' kernels first, in parallel (default: the "
        "CPU cores, at most 8; 1: none)",
    )
    s.set_defaults(func=cmd_check)

    s = command("bench", "check, time against baselines and write a report")
    s.add_argument("ops", nargs="*", help="operators or families (default: all)")
    s.add_argument(
        "--mode",
        help="fwd, bwd, fwd+bwd, a comma list, or all (default: fwd,fwd+bwd; --full: all)",
    )
    s.add_argument("--baselines", action="append", help="baseline names to time (default: all)")
    s.add_argument(
        "--dtypes", action="append", help="e.g. bf16,fp32 (default: each operator's main dtype)"
    )
    s.add_argument(
        "--shapes",
        nargs="+",
        help="test, bench, or shapes such as '(64, 64)' (default: one bench shape per operator, "
        "and for the checks the cheapest test shape that can show an error); without a GPU the "
        "checks run at these",
    )
    s.add_argument(
        "--out",
        default=DEFAULT_OUT,
        help=f"report directory (default: {DEFAULT_OUT}; one holding a report is kept and the "
        "new one goes to DIR-2, DIR-3, ...)",
    )
    s.add_argument("--force", action="store_true", help="write over the report in --out")
    s.add_argument("--seed", type=_nonnegative_int, help="base seed (default: fresh, recorded)")
    s.add_argument("--no-check", action="store_true", help="skip the accuracy checks")
    s.add_argument("--yes", action="store_true", help="run long interpreter work without asking")
    s.add_argument(
        "--small",
        action="store_true",
        help="also time each operator's small shapes, where host time sets the pace",
    )
    s.add_argument(
        "--full",
        action="store_true",
        help="every dtype, shape, mode and check case (default: each operator at its main "
        "dtype and one shape)",
    )
    s.add_argument(
        "--jobs",
        type=_positive_int,
        help="on a GPU, processes compiling the run's kernels first, in parallel (default: the "
        "CPU cores, at most 8; 1: none)",
    )
    s.add_argument(
        "--autotune",
        action="store_true",
        help="time launch configs on this GPU even where the package ships a table",
    )
    cli_why.add_bench_options(s)  # harness/cli_why.py: --rsd, --energy, --compile-modes
    s.set_defaults(func=cmd_bench)

    s = command("report", "render a report (and the README table) from results JSON")
    s.add_argument(
        "results", nargs="+", help="results.json files of `tritonkit bench`, or their directories"
    )
    s.add_argument(
        "--out",
        help="report directory (default: a single results directory is re-rendered in place; "
        f"otherwise {DEFAULT_OUT}, or a fresh DIR-2... when it holds a report)",
    )
    s.add_argument("--force", action="store_true", help="write over the report in --out")
    s.add_argument("--readme", help="also regenerate this README's results section")
    s.add_argument("--source", help="the results file the README should name as its source")
    s.set_defaults(func=cmd_report)

    s = command("doctor", "environment, hardware profile, measured ceilings")
    s.add_argument("--measure", action="store_true", help="measure (and cache) the ceilings")
    s.set_defaults(func=cmd_doctor)

    s = command("tune", "tune operators' launch configs on this GPU; print every config tried")
    s.add_argument("ops", nargs="*", help="operators or families")
    s.add_argument("--all", action="store_true", help="every operator")
    s.add_argument(
        "--shapes",
        nargs="+",
        help="test, bench, or shapes such as '(8192, 8192)' (default: bench; with --ship also "
        "the small and test shapes)",
    )
    s.add_argument("--dtypes", action="append", help="e.g. bf16 (default: bench dtypes)")
    s.add_argument("--force", action="store_true", help="time again even if cached")
    s.add_argument(
        "--ship",
        action="store_true",
        help="write the winners into the package's shipped tables for this GPU "
        "(src/tritonkit/tuned/<gpu>/<family>.json); implies --force",
    )
    s.set_defaults(func=cmd_tune)

    s = command("regress", "fail when an operator got slower or less accurate")
    s.add_argument("new", help="new results.json (or its directory)")
    s.add_argument("--against", help="old results.json (or its directory); required")
    s.add_argument(
        "--threshold", type=_threshold, default=0.10, help="allowed slowdown (default: 0.10)"
    )
    s.set_defaults(func=cmd_regress)

    s = command("new", "scaffold a new operator: family package, spec and test")
    s.add_argument("name", help="operator name, a lowercase identifier (e.g. scaled_add)")
    s.add_argument("--root", help="repository root (default: the checkout tritonkit runs from)")
    s.add_argument(
        "--remove",
        action="store_true",
        help="undo `tritonkit new NAME` (refused if its files changed since)",
    )
    s.set_defaults(func=cmd_new)
    quant_report.add_parser(sub, parents=[common])  # harness/quant_report.py
    cli_warmup.add_parser(sub, parents=[common])  # cli_warmup.py: `tritonkit warmup`
    bench_comm.add_parser(sub, parents=[common])  # harness/bench_comm.py (torchrun)
    cli_why.add_parser(sub, parents=[common])  # harness/cli_why.py: profile, soak, trend
    return p


def _quiet(debug: bool):
    """Library warnings and log records off stderr unless ``--debug`` (harness/quiet.py)."""
    from tritonkit.harness.quiet import quiet

    return quiet(debug)


def _one_line(exc: BaseException, limit: int | None = 400) -> str:
    """The message on one line; an unexpected error's cut at ``limit`` characters (a usage
    error is ours, and whole: it may list every valid choice)."""
    text = " ".join(str(exc).split())
    return text if limit is None or len(text) <= limit else text[: limit - 3] + "..."


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        with _quiet(debug):
            args = build_parser().parse_args(argv)
            if args.profile is not None:
                _check_profile(args.profile)
            return args.func(args)
    except UsageError as exc:
        if debug:
            traceback.print_exc()
        print(f"tritonkit: {_one_line(exc, None)}", file=sys.stderr)
    except SystemExit as exc:  # --help and --version
        return exc.code if isinstance(exc.code, int) else 0
    except KeyboardInterrupt:
        print("tritonkit: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if debug:
            traceback.print_exc()
        hint = "" if debug else " (rerun with --debug for the traceback)"
        print(f"tritonkit: {type(exc).__name__}: {_one_line(exc)}{hint}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
