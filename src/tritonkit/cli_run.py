"""The command line's long runs: ``bench`` (the representative selection or ``--full``, the
accuracy checks, the timings, the report) and ``tune`` (shipped tables with ``--ship``), with
the checks' progress and summary that ``check`` shares (``tritonkit.cli``)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import torch

from tritonkit.cli_args import (
    UsageError,
    _clear_report,
    _confirm,
    _dtypes,
    _enable_interpreter_without_gpu,
    _fresh_out_dir,
    _modes,
    _resolve_profile,
    _seed,
    _select,
    _shape_list,
    _shapes,
    _split,
)


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
    from tritonkit.harness.progress import Progress, duration, plural
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
    from tritonkit.harness import cli_why

    extra = cli_why.cost_options(args)  # the repeats, energy and kernels' share of the estimate
    bench_s = sum(selection.mode_seconds(it.spec, it.variants, warmed, **extra) for it, *_ in steps)
    bench_s = bench_s if gpu else 0.0
    warm_s = 0.0
    if warmed:
        compile_s = selection.compile_seconds(items, len(steps))
        warm_s = selection.GPU_WORKERS_START_S + compile_s / jobs
    if not gpu and shapes not in (None, "test"):
        what = "bench shapes" if shapes == "bench" else "those shapes"
        _confirm(f"{plural(sum(plan.values()), 'check')} at the {what}", check_s, args.yes)
    out_dir = _fresh_out_dir(Path(args.out), args.force)
    seed = _seed(args)
    what = "every dtype, shape and case" if args.full else "each at its main dtype and one shape"
    timed = f" and {plural(len(steps), 'timing')}" if gpu else ""
    more = "" if args.full or dtypes or shapes else "; --full runs every dtype and shape"
    print(
        f"bench: {plural(sum(plan.values()), 'check')}{timed} of {plural(len(specs), 'operator')} "
        f"({what}), about "
        f"{duration(warm_s + check_s + bench_s)}{more}",
        file=sys.stderr,
    )
    t0 = time.perf_counter()
    if warmed:
        warm.compile_ahead(
            items,
            modes,
            baselines,
            seed,
            jobs=jobs,
            checks=not args.no_check,
            quiet=not getattr(args, "debug", False),
        )
    progress = Progress(len(steps) * gpu + sum(plan.values()), "bench", expected=check_s + bench_s)
    checks = [] if args.no_check else _run_item_checks(items, seed, plan, progress, gpu, warmed)
    bench: list[dict[str, Any]] = []
    ceilings = None
    if gpu:
        from tritonkit.harness import cli_why
        from tritonkit.harness.bench import bench_spec

        profile = _gpu_profile(args)
        ceilings = _ceilings(profile)
        progress.log(
            f"ceilings ({profile.name}): copy {profile.dram_GBps:,.0f} GB/s, "
            f"bf16 matmul {profile.tflops.get('bf16', 0):,.0f} TFLOP/s"
        )
        for it in items:
            cost = selection.mode_seconds(it.spec, it.variants, warmed, **extra)
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
                **cli_why.bench_options(args),  # harness/cli_why.py
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
    from tritonkit.harness.report import fmt, md_table, ratio

    rows = []
    for r in bench:
        ours = r["candidates"].get("tritonkit", {})
        if r.get("note") or "median" not in ours:
            continue
        speed = ", ".join(f"{k} {ratio(v)}" for k, v in r["speedup"].items())
        rows.append(
            [
                r["op"],
                r["dtype"],
                r["shape"],
                r["mode"],
                fmt(ours["median"]),
                fmt(ours.get("GBps")),
                fmt(ours.get("pct_copy_bw")),
                speed,
            ]
        )
    print()
    print(md_table(["op", "dtype", "shape", "mode", "ms", "GB/s", "% copy", "speedup vs"], rows))
    from tritonkit.harness.report import evolution_rows

    for r in bench:
        if r.get("note") or not any(c["kind"] == "variant" for c in r["candidates"].values()):
            continue
        print(f"\n{r['op']} {r['shape']} {r['dtype']} {r['mode']}: versions side by side")
        print(
            md_table(
                ["version", "ms", "rate", "% of torch", "gain over previous"], evolution_rows(r)
            )
        )


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
