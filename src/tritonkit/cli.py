"""The ``tritonkit`` command: list, check, bench, report, doctor, tune, regress, new.

Without a GPU, kernels run under Triton's CPU interpreter (turned on here, before any kernel is
defined): ``check`` works and ``bench`` runs the accuracy checks and says that timings need a GPU.

Every flag is validated before anything runs. A problem with what was asked for is one line on
stderr naming it and the valid choices, with exit code 2; so is an unexpected failure, whose
traceback ``--debug`` shows.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import traceback
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from tritonkit.harness import quant_report

DEFAULT_OUT = "tritonkit-report"
COMMANDS = ("list", "check", "bench", "report", "doctor", "tune", "regress", "new", "quant-report")
# Names a user may type for dtypes, beside the names the specs list (float32, float8_e4m3fn...).
DTYPE_ALIASES = {
    "fp32": ("float32",),
    "float": ("float32",),
    "fp16": ("float16",),
    "half": ("float16",),
    "bf16": ("bfloat16",),
    "fp8": ("float8_e4m3fn", "float8_e5m2"),
    "e4m3": ("float8_e4m3fn",),
    "fp8_e4m3": ("float8_e4m3fn",),
    "e5m2": ("float8_e5m2",),
    "fp8_e5m2": ("float8_e5m2",),
}
# Files a report directory holds; `--force` removes these (and only these) before writing.
REPORT_FILES = ("results.json", "report.md", "*.png")


class UsageError(Exception):
    """Something asked for that cannot be done: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse prints usage and exits; we want one line
        raise UsageError(f"{message} (see `{self.prog} --help`)")


class _Version(argparse.Action):
    """``--version``: tritonkit's version and the torch and triton it runs on."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        import triton

        from tritonkit import __version__

        print(f"tritonkit {__version__} (torch {torch.__version__}, triton {triton.__version__})")
        parser.exit()


# ---- validation -------------------------------------------------------------------------------


def _enable_interpreter_without_gpu() -> bool:
    """Turn on the interpreter on a machine with no GPU; returns whether kernels are interpreted."""
    if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:
        os.environ["TRITON_INTERPRET"] = "1"
    from tritonkit.ops._core.device import interpreter_enabled

    return interpreter_enabled()


def _split(values: Sequence[str] | None) -> list[str] | None:
    if not values:
        return None
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def _select(names: list[str] | None):
    from tritonkit.harness.spec import UnknownOp, select

    try:
        return select(names)
    except UnknownOp as exc:
        raise UsageError(str(exc)) from None


def _dtype_table() -> dict[str, torch.dtype]:
    """Every dtype some spec takes, by the name `tritonkit list` shows."""
    from tritonkit.harness.spec import all_specs, dtype_name

    return {dtype_name(d): d for s in all_specs() for d in s.dtypes}


def _dtypes(values: Sequence[str] | None, flag: str = "--dtypes") -> list[torch.dtype] | None:
    """The dtypes named (spec names or aliases, any case), without repeats."""
    names = _split(values)
    if not names:
        return None
    table = _dtype_table()
    chosen: list[torch.dtype] = []
    for name in names:
        key = name.lower()
        found = [table[n] for n in DTYPE_ALIASES.get(key, (key,)) if n in table]
        if not found:
            valid = ", ".join([*table, *DTYPE_ALIASES])
            raise UsageError(f"{flag}: unknown dtype {name!r}; valid: {valid}")
        chosen += [d for d in found if d not in chosen]
    return chosen


def _modes(text: str) -> tuple[str, ...]:
    from tritonkit.harness.spec import MODES

    if text.strip().lower() == "all":
        return MODES
    modes = tuple(dict.fromkeys(m.strip().lower() for m in text.split(",") if m.strip()))
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise UsageError(
            f"--mode: unknown mode {', '.join(map(repr, bad)) or repr(text)}; "
            f"valid: {', '.join(MODES)}, a comma list of them, or all"
        )
    return modes


def _parse_shape(text: str, flag: str = "--shapes"):
    import ast

    try:
        shape = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        shape = None
    if not isinstance(shape, (tuple, int)):
        raise UsageError(
            f"{flag} takes test, bench, or Python tuples like '(4096, 4096)', got {text!r}"
        )
    return shape


def _shapes(values: Sequence[str] | None) -> str | list[Any] | None:
    """``test``, ``bench``, or explicit shapes (one or more tuples); None if not given."""
    if not values:
        return None
    if len(values) == 1 and values[0].strip().lower() in ("test", "bench"):
        return values[0].strip().lower()
    return [_parse_shape(v) for v in values]


def _shape_list(spec, shapes: str | list[Any], small: bool = False) -> list[Any]:
    """The shapes of a selection; ``small`` adds the spec's small (host-bound) shapes to its
    bench shapes."""
    if shapes == "test":
        return list(spec.shapes.test)
    if shapes == "bench":
        return [*spec.shapes.bench, *(spec.shapes.small if small else ())]
    return list(shapes)


def _seed(args: argparse.Namespace) -> int:
    from tritonkit.harness.check import fresh_seed

    return args.seed if args.seed is not None else fresh_seed()


def _nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2**63), got {value}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number such as 0.10, got {text!r}") from None
    if not 0 <= value < 10 or math.isnan(value):
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 10) such as 0.10, got {text}")
    return value


def _writable_file(path: str | None, flag: str) -> Path | None:
    """A file we will write at the end: checked now, so a long run does not fail at its end."""
    if path is None:
        return None
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag}: {p} is a directory; give a file name")
    if not p.parent.is_dir():
        raise UsageError(f"{flag}: the directory {p.parent} does not exist")
    return p


def _fresh_out_dir(path: Path, force: bool) -> Path:
    """Where a new report goes: ``path``, or ``path-2``, ``path-3``... when ``path`` already
    holds one (never written over unless ``force``)."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out: {path} is a file, not a directory")
    if force or not path.exists() or not any(path.iterdir()):
        return path
    n = 2
    while (candidate := path.with_name(f"{path.name}-{n}")).exists():
        n += 1
    print(
        f"tritonkit: {path}/ holds an earlier report; writing to {candidate}/ "
        "(--force writes over it)",
        file=sys.stderr,
    )
    return candidate


def _clear_report(path: Path) -> None:
    """--force: remove the files an earlier report wrote there, so none is left stale."""
    if path.is_dir():
        for pattern in REPORT_FILES:
            for f in path.glob(pattern):
                f.unlink()


def _profile_spec(text: str | None) -> str | None:
    """--profile with a known GPU's name in any case ('h200', 'nvidia a100 80gb') resolved."""
    if text is None or "=" in text or text.endswith(".json") or Path(text).exists():
        return text
    from tritonkit import _hardware

    for name in _hardware.KNOWN:
        if name.lower() == text.strip().lower():
            return name
    known = _hardware.match(text)
    return known.name if known is not None else text


def _resolve_profile(text: str | None, measured: dict[str, Any] | None = None):
    from tritonkit import _hardware
    from tritonkit.harness import hardware

    try:
        return hardware.resolve_profile(_profile_spec(text), measured)
    except ValueError as exc:
        known = ", ".join(_hardware.KNOWN)
        raise UsageError(f"{exc} (known GPUs: {known})") from None


def _check_profile(text: str) -> None:
    """--profile is checked before any command runs (``list`` too): a known GPU name, a JSON
    profile that loads, or scale factors; anything else is refused, naming the known GPUs."""
    from tritonkit import _hardware
    from tritonkit.harness import hardware

    spec = _profile_spec(text)
    if spec in _hardware.KNOWN:
        return
    try:
        if spec.endswith(".json") or Path(spec).exists():
            _hardware.load(spec)
        else:
            hardware.scale_factors(spec)
    except (ValueError, OSError, KeyError, TypeError) as exc:
        known = ", ".join(_hardware.KNOWN)
        raise UsageError(f"{exc} (known GPUs: {known})") from None


def _confirm(what: str, seconds: float, yes: bool) -> None:
    """Ask before a run the interpreter makes long; a script passes --yes."""
    from tritonkit.harness.progress import duration

    if yes:
        return
    message = f"{what} take roughly {duration(seconds)} under Triton's CPU interpreter"
    if not sys.stdin.isatty():
        raise UsageError(f"{message}; pass --yes to run them")
    answer = input(f"tritonkit: {message}. Run them? [y/N] ")
    if answer.strip().lower() not in ("y", "yes"):
        raise UsageError("not run (pass --yes to run without asking)")


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


def _check_shapes(shapes: str | list[Any]):
    """The shapes a check runs at, per spec."""
    return lambda spec: _shape_list(spec, shapes)


def _plan_checks(specs, dtypes, shapes_of) -> dict[str, int]:
    """Cases per operator; a selection with none is an error that says what was asked."""
    from tritonkit.harness.check import planned_cases
    from tritonkit.harness.spec import dtype_name

    plan = {s.name: planned_cases(s, dtypes=dtypes, shapes=shapes_of(s)) for s in specs}
    if not sum(plan.values()):
        takes = "; ".join(f"{s.name}: {', '.join(dtype_name(d) for d in s.dtypes)}" for s in specs)
        asked = ", ".join(dtype_name(d) for d in dtypes or ())
        raise UsageError(f"nothing to run: no selected operator takes {asked} ({takes})")
    return plan


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
    interpreted = _enable_interpreter_without_gpu()
    specs = _select(_split(args.ops))
    dtypes = _dtypes(args.dtypes)
    json_path = _writable_file(args.json, "--json")
    shapes_of = _check_shapes(args.shapes)
    plan = _plan_checks(specs, dtypes, shapes_of)
    from tritonkit.harness import selection
    from tritonkit.harness.check import CASES
    from tritonkit.harness.progress import Progress, duration

    items = [
        selection.Item(s, tuple(dtypes or s.dtypes), tuple(shapes_of(s)), CASES, (), (), False)
        for s in specs
    ]
    gpu = not interpreted
    seconds = sum(
        selection.expected_check_seconds(it.spec, it.check_dtypes, it.check_shapes, CASES, gpu=gpu)
        for it in items
    )
    if interpreted and args.shapes == "bench":
        _confirm(f"{sum(plan.values())} checks at the bench shapes", seconds, args.yes)
    seed = _seed(args)
    where = "Triton interpreter (CPU)" if interpreted else torch.cuda.get_device_name()
    print(
        f"checking {len(specs)} operators on {where}, seed {seed}: {sum(plan.values())} "
        f"checks, about {duration(seconds)}",
        file=sys.stderr,
    )
    progress = Progress(sum(plan.values()), "check", expected=seconds)
    checks = _run_item_checks(items, seed, plan, progress, gpu)
    progress.close()
    if json_path is not None:
        import json

        json_path.write_text(json.dumps(checks, indent=1, default=str))
    return _print_check_summary(checks)


def _check_baselines(specs, names: list[str] | None) -> list[str] | None:
    if names is None:
        return None
    known = list(dict.fromkeys(b for s in specs for b in s.baselines))
    bad = [n for n in names if n not in known]
    if bad:
        raise UsageError(
            f"--baselines: unknown baseline {', '.join(map(repr, bad))} for the selected "
            f"operators; valid: {', '.join(known)}"
        )
    return names


def _run_item_checks(
    items, seed, plan, progress, gpu: bool, warmed: bool = False
) -> list[dict[str, Any]]:
    """The accuracy checks of a bench run, each case's expected cost fed to the progress."""
    from tritonkit.harness import selection
    from tritonkit.harness.check import check_spec

    results: list[dict[str, Any]] = []
    seen: set[tuple[str, str, str]] = set()
    for it in items:
        if not plan.get(it.spec.name):
            continue

        def on_case(res, spec=it.spec) -> None:
            first = (spec.name, res.params, res.dtype) not in seen
            seen.add((spec.name, res.params, res.dtype))
            shape = selection.shape_of(res.shape)
            cost = (
                0.0
                if res.skipped
                else selection.case_seconds(
                    spec, shape, res.case, gpu=gpu, first=first, warmed=warmed
                )
            )
            progress.step(f"{res.op} {res.dtype} {res.shape} {res.case}", cost)

        out = check_spec(
            it.spec,
            dtypes=it.check_dtypes,
            shapes=it.check_shapes,
            cases=it.cases,
            seed=seed,
            on_case=on_case,
        )
        results += [r.as_dict() for r in out]
        ran = [r for r in out if not r.skipped]
        failed = sum(not r.passed for r in ran)
        skipped = f", {len(out) - len(ran)} skipped" if len(ran) < len(out) else ""
        progress.log(f"{it.spec.name}: {len(ran) - failed}/{len(ran)} passed{skipped}")
    return results


def cmd_bench(args: argparse.Namespace) -> int:
    import time

    interpreted = _enable_interpreter_without_gpu()  # before any kernel is defined
    from tritonkit.harness import selection
    from tritonkit.harness.check import planned_cases
    from tritonkit.harness.device import fingerprint
    from tritonkit.harness.progress import Progress, duration
    from tritonkit.harness.report import make_results, write_report

    gpu = torch.cuda.is_available() and not interpreted
    specs = _select(_split(args.ops))
    dtypes = _dtypes(args.dtypes)
    # The default run times forward and forward+backward (the backward alone is their
    # difference); --full and --mode all add it.
    modes = _modes(args.mode) if args.mode else _modes("all" if args.full else "fwd,fwd+bwd")
    baselines = _check_baselines(specs, _split(args.baselines))
    shapes = _shapes(args.shapes)
    if args.profile is not None:
        _resolve_profile(args.profile)  # checked now; applied to measured ceilings on a GPU
    if not gpu and args.no_check:
        raise UsageError(
            "nothing to run: without a GPU, bench runs only the accuracy checks, and --no-check "
            "leaves none"
        )
    if args.autotune:
        from tritonkit import _tuning

        os.environ[_tuning.AUTOTUNE_ENV] = "1"
    items = selection.choose(
        specs,
        full=args.full,
        dtypes=dtypes,
        shapes=shapes,
        named=bool(args.ops),
        small=args.small,
        gpu=gpu,
    )
    plan = {}
    if not args.no_check:
        plan = {
            it.spec.name: planned_cases(
                it.spec, dtypes=it.check_dtypes, shapes=it.check_shapes, cases=it.cases
            )
            if it.check_dtypes
            else 0
            for it in items
        }
        if not sum(plan.values()):
            _plan_checks(specs, dtypes, lambda spec: [])  # raises, saying what was asked
    steps = [
        (it, shape, dtype, mode)
        for it in items
        for shape in it.bench_shapes
        for dtype in it.bench_dtypes
        for mode in modes
    ]
    if gpu and not steps:
        raise UsageError("nothing to time: no selected operator takes the dtypes asked for")
    from tritonkit.harness import warm

    # On a GPU the kernels compile first, in parallel (--jobs 1: not): the run then loads them.
    jobs = (args.jobs or warm.default_jobs()) if gpu else 1
    warmed = jobs > 1
    check_s = sum(
        selection.expected_check_seconds(
            it.spec, it.check_dtypes, it.check_shapes, it.cases, gpu=gpu, warmed=warmed
        )
        for it in items
        if plan.get(it.spec.name)
    )
    bench_s = sum(selection.mode_seconds(it.spec, it.variants, warmed) for it, *_ in steps)
    bench_s = bench_s if gpu else 0.0
    warm_s = 0.0
    if warmed:
        compile_s = selection.compile_seconds(items, len(steps))
        warm_s = selection.GPU_WORKERS_START_S + compile_s / jobs
    if not gpu and shapes not in (None, "test"):
        what = "bench shapes" if shapes == "bench" else "those shapes"
        _confirm(f"{sum(plan.values())} checks at the {what}", check_s, args.yes)
    out_dir = _fresh_out_dir(Path(args.out), args.force)
    seed = _seed(args)
    what = "every dtype, shape and case" if args.full else "each at its main dtype and one shape"
    timed = f" and {len(steps)} timings" if gpu else ""
    more = "" if args.full or dtypes or shapes else "; --full runs every dtype and shape"
    print(
        f"bench: {sum(plan.values())} checks{timed} of {len(specs)} operators ({what}), about "
        f"{duration(warm_s + check_s + bench_s)}{more}",
        file=sys.stderr,
    )
    t0 = time.perf_counter()
    if warmed:
        warm.compile_ahead(items, modes, baselines, seed, jobs=jobs, checks=not args.no_check)
    progress = Progress(len(steps) * gpu + sum(plan.values()), "bench", expected=check_s + bench_s)
    checks = [] if args.no_check else _run_item_checks(items, seed, plan, progress, gpu, warmed)
    bench: list[dict[str, Any]] = []
    ceilings = None
    if gpu:
        from tritonkit.harness.bench import bench_spec

        profile = _gpu_profile(args)
        ceilings = _ceilings(profile)
        progress.log(
            f"ceilings ({profile.name}): copy {profile.dram_GBps:,.0f} GB/s, "
            f"bf16 matmul {profile.tflops.get('bf16', 0):,.0f} TFLOP/s"
        )
        for it in items:
            cost = selection.mode_seconds(it.spec, it.variants, warmed)
            bench += bench_spec(
                it.spec,
                profile=profile,
                modes=modes,
                dtypes=it.bench_dtypes,
                baselines=baselines,
                shapes=list(it.bench_shapes),
                seed=seed,
                on_step=lambda desc, cost=cost: progress.running(desc, cost),
                variants=it.variants,
            )
    progress.close()
    print(
        f"bench: took {duration(time.perf_counter() - t0)} (estimated "
        f"{duration(warm_s + check_s + bench_s)} at the start)",
        file=sys.stderr,
    )
    results = make_results(
        kind="gpu" if gpu else "interpreter",
        fingerprint=fingerprint(),
        ceilings=ceilings,
        checks=checks,
        bench=bench,
        seed=seed,
        ops=[s.name for s in specs],
    )
    if args.force:
        _clear_report(out_dir)
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
    profile = _resolve_profile(args.profile, measured)
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
    from tritonkit.harness.report import _fmt, _ratio, _table

    rows = []
    for r in bench:
        ours = r["candidates"].get("tritonkit", {})
        if r.get("note") or "median" not in ours:
            continue
        speed = ", ".join(f"{k} {_ratio(v)}" for k, v in r["speedup"].items())
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


def cmd_tune(args: argparse.Namespace) -> int:
    _enable_interpreter_without_gpu()
    from tritonkit import _tuning
    from tritonkit.harness.bench import _mode_callable
    from tritonkit.harness.progress import Progress

    if not args.ops and not args.all:
        raise UsageError("tune: name the operators to tune, or pass --all")
    specs = _select(None if args.all else args.ops)
    shapes = _shapes(args.shapes)
    dtypes = _dtypes(args.dtypes)
    if args.profile is not None:
        _resolve_profile(args.profile)
    if not torch.cuda.is_available():
        raise UsageError("tune needs a CUDA GPU (it times kernels); none is visible here")
    _gpu_profile(args)
    # Tuned here, whatever a shipped table says; --force and --ship time every key afresh.
    os.environ[_tuning.AUTOTUNE_ENV] = "1"
    if args.force or args.ship:
        os.environ[_tuning.FORCE_ENV] = "1"

    def shapes_of(spec):
        if shapes is not None:
            return _shape_list(spec, shapes)
        # --ship: every shape class the specs name (bench, small, test).
        extra = (*spec.shapes.small, *spec.shapes.test) if args.ship else ()
        return list(dict.fromkeys([*spec.shapes.bench, *extra]))

    cases = [
        (spec, shape, dtype)
        for spec in specs
        if spec.distributed is None
        for shape in shapes_of(spec)
        for dtype in (dtypes or spec.bench_dtypes)
        if dtype in spec.dtypes
    ]
    if not cases:
        raise UsageError(f"nothing to tune: {', '.join(s.name for s in specs)} take none of the "
                         "dtypes asked for")  # fmt: skip
    progress = Progress(len(cases), "tune")
    by_family: dict[str, list] = {}
    for spec, shape, dtype in cases:
        progress.running(f"{spec.name} {shape} {dtype}")
        before = (_tuning.STATS.hits, len(_tuning.STATS.log))
        try:
            inputs = spec.make_inputs(shape, dtype, torch.device("cuda"), 0)
            mode = "fwd+bwd" if spec.backward else "fwd"
            grad_idx = spec.grad_indices(inputs)
            _mode_callable(spec.impl, inputs, dict(spec.params[0]), mode, grad_idx, 0)()
            torch.cuda.synchronize()
        except Exception as exc:  # one case that cannot run (memory) leaves the others
            progress.log(f"{spec.name} {shape} {dtype}: not tuned ({type(exc).__name__}: {exc})")
            continue
        finally:
            torch.cuda.empty_cache()
        new = _tuning.STATS.log[before[1] :]
        by_family.setdefault(spec.family, []).extend(new)
        hits = _tuning.STATS.hits - before[0]
        lines = [f"{spec.name} {shape} {dtype}: {len(new)} tuned, {hits} from the cache"]
        for t in new:
            lines.append(f"  {t.kernel} {dict(t.key)}: {len(t.tried)} configs in {t.seconds:.1f} s")
            for cfg, ms in sorted(t.tried, key=lambda p: (p[1] is None, p[1] or 0)):
                mark = "  <- best" if cfg == t.best else ""
                time = f"{ms:.4f} ms" if ms is not None else "failed"
                lines.append(f"    {time:>12}  {cfg}{mark}")
        progress.log(lines[0])
        print("\n".join(lines))
    progress.close()
    print(f"cache: {_tuning.cache_path()}")
    if args.ship:
        for family, tunings in by_family.items():
            if tunings:
                path = _tuning.write_shipped(family, tunings)
                print(f"shipped table: {path} ({len(tunings)} entries)")
    return 0


def cmd_regress(args: argparse.Namespace) -> int:
    from tritonkit.harness import regress
    from tritonkit.harness.report import load_json

    try:
        new, old = load_json(Path(args.new)), load_json(Path(args.against))
        rows = regress.compare(new, old, args.threshold)
    except ValueError as exc:
        raise UsageError(f"regress: refusing to compare: {exc}") from None
    print(regress.render(rows, args.threshold))
    return 1 if regress.failed(rows) else 0


def cmd_new(args: argparse.Namespace) -> int:
    from tritonkit.scaffold import ScaffoldError, scaffold

    _enable_interpreter_without_gpu()
    try:
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
        "its first test shape for the checks); without a GPU the checks run at these",
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
    s.add_argument("--against", required=True, help="old results.json (or its directory)")
    s.add_argument(
        "--threshold", type=_threshold, default=0.10, help="allowed slowdown (default: 0.10)"
    )
    s.set_defaults(func=cmd_regress)

    s = command("new", "scaffold a new operator: family package, spec and test")
    s.add_argument("name", help="operator name, a lowercase identifier (e.g. scaled_add)")
    s.add_argument("--root", help="repository root (default: the checkout tritonkit runs from)")
    s.set_defaults(func=cmd_new)
    quant_report.add_parser(sub, parents=[common])  # harness/quant_report.py
    return p


@contextlib.contextmanager
def _quiet(debug: bool) -> Iterator[None]:
    """Keep numpy's and torch's warnings out of the output (--debug shows them).

    The interpreter computes with NumPy, which warns about the NaN and inf the special-value
    checks put in on purpose; torch and triton warn about their own deprecations. tritonkit's
    own warnings (e.g. a corrupt tuning cache) stay, as one line each.
    """
    with warnings.catch_warnings():
        if not debug:
            warnings.simplefilter("ignore", RuntimeWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            warnings.filterwarnings("ignore", module=r"(torch|triton|numpy)(\.|$)")

            def show(message, category, filename, lineno, file=None, line=None) -> None:
                print(f"tritonkit: warning: {message}", file=sys.stderr)

            warnings.showwarning = show
        yield


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 400 else text[:397] + "..."


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
        print(f"tritonkit: {_one_line(exc)}", file=sys.stderr)
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
