"""`tritonkit warmup`: compile ahead of a run, launching nothing (``tritonkit._warmup``).

Its own module so that the workbench (``harness/``) never imports the warmup, which calls it.
"""

from __future__ import annotations


def add_parser(sub, parents) -> None:
    """The ``warmup`` command's arguments (cli.py calls this)."""
    from tritonkit.cli_args import _positive_int

    s = sub.add_parser(
        "warmup",
        help="compile, in parallel, the kernels operators or a function will launch, so that "
        "a run's first calls load them",
        parents=parents,
    )
    s.add_argument("ops", nargs="*", help="operators or families (bench shapes and dtypes)")
    s.add_argument("--all", action="store_true", help="every operator")
    s.add_argument("--shapes", nargs="+", help="bench (default), test, or shapes like '(64, 96)'")
    s.add_argument("--dtypes", action="append", help="e.g. bf16 (default: the bench dtypes)")
    s.add_argument("--mode", default="fwd,bwd", help="fwd, bwd, fwd+bwd (default: fwd,bwd)")
    s.add_argument(
        "--call",
        help="MODULE:FUNCTION, a function of no arguments making the calls to warm (a training "
        "step); with PYTHONPATH, a module of your own",
    )
    s.add_argument("--jobs", type=_positive_int, help="compiling threads (default: the CPU cores)")
    s.add_argument("--records", help="also write the kernel specializations to this JSON file")
    s.set_defaults(func=cmd_warmup)


def cmd_warmup(args) -> int:
    import importlib
    import json

    import torch

    from tritonkit import _warmup
    from tritonkit.cli_args import (
        UsageError,
        _dtypes,
        _enable_interpreter_without_gpu,
        _modes,
        _select,
        _shape_list,
        _shapes,
        _writable_file,
    )

    _enable_interpreter_without_gpu()
    if not args.ops and not args.all and args.call is None:
        raise UsageError("warmup: name operators, pass --all, or --call MODULE:FUNCTION")
    records = _writable_file(args.records, "--records")
    modes = _modes(args.mode)
    specs = _select(None if args.all else args.ops) if (args.ops or args.all) else []
    shapes, dtypes = _shapes(args.shapes), _dtypes(args.dtypes)
    call = None
    if args.call is not None:
        module, _, name = args.call.partition(":")
        try:
            call = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError) as exc:
            raise UsageError(f"--call: cannot load {args.call!r} ({exc})") from None
    if not torch.cuda.is_available():
        raise UsageError("warmup compiles for a CUDA GPU; none is visible here")
    ops = [
        (spec.name, shape, dtype)
        for spec in specs
        if spec.distributed is None
        for shape in (_shape_list(spec, shapes) if shapes is not None else spec.shapes.bench)
        for dtype in (dtypes or spec.bench_dtypes)
        if dtype in spec.dtypes
    ]
    report = _warmup.WarmupReport()
    if call is not None:
        report = _warmup.warmup(call, jobs=args.jobs)
    if ops:
        more = _warmup.warmup(ops=ops, modes=modes, jobs=args.jobs)
        report.records += more.records
        report.compiled += more.compiled
        report.already += more.already
        report.failed += more.failed
        report.errors += more.errors
        report.record_s += more.record_s
        report.compile_s += more.compile_s
        report.jobs = more.jobs
    print(report)
    if records is not None:
        records.write_text(json.dumps(report.records, indent=1))
    return 0 if not report.failed else 1
