"""The workbench's "why" commands: ``profile``, ``soak`` and ``trend``; and bench's options for
RSD-driven repeats, energy and torch.compile's modes.

- ``tritonkit profile OP [--shape S] [--dtype D] [--mode M] [--out DIR]``: profile.py.
- ``tritonkit soak [OPS] [--calls N] [--seconds S]``: soak.py's leak and long-run checks
  (``--calls 0`` or ``--seconds 0`` leaves one out).
- ``tritonkit trend A.json B.json ... [--out DIR]``: trend.py.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path
from typing import Any

COMPILE_MODES = ("max-autotune", "reduce-overhead")


def _shape(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise argparse.ArgumentTypeError(f"not a shape: {text!r} (e.g. '(4096, 4096)')") from None


def _modes(text: str) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in modes if m not in COMPILE_MODES]
    if bad:
        raise argparse.ArgumentTypeError(
            f"unknown torch.compile mode {bad[0]!r}; expected {', '.join(COMPILE_MODES)}"
        )
    return modes


def _fraction(text: str) -> float:
    value = float(text.rstrip("%")) / (100 if text.endswith("%") else 1)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"an RSD target is a fraction in [0, 1), got {text!r}")
    return value


def add_bench_options(s: argparse.ArgumentParser) -> None:
    """bench's options from this module (``bench_options`` turns them into bench_spec's)."""
    s.add_argument(
        "--rsd",
        type=_fraction,
        default=0.05,
        help="repeat timings until their RSD is at most this (default 0.05, or '5%%'; 0: one "
        "batch of samples)",
    )
    s.add_argument(
        "--energy",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="NVML energy per call over this many seconds of calls per candidate (default 0: off)",
    )
    s.add_argument(
        "--sweep",
        action="store_true",
        help="time every shape of each operator and plot size against %% of the roofline",
    )
    s.add_argument(
        "--kernels",
        action="store_true",
        help="registers, spills and occupancy (sm_90) of each case's kernels in the report",
    )
    s.add_argument(
        "--compile-modes",
        type=_modes,
        default=(),
        help="also time torch.compile in these modes: max-autotune,reduce-overhead",
    )


def bench_options(args: argparse.Namespace) -> dict[str, Any]:
    """bench_spec's keyword arguments from ``add_bench_options``'s flags."""
    rsd = getattr(args, "rsd", 0.05)
    return {
        "sampling": {"rsd_target": rsd or None},
        "energy_s": getattr(args, "energy", 0.0),
        "compile_modes": getattr(args, "compile_modes", ()),
        "sweep": getattr(args, "sweep", False),
        "kernels": getattr(args, "kernels", False),
    }


def cost_options(args: argparse.Namespace) -> dict[str, Any]:
    """selection.mode_seconds's keyword arguments from the same flags: what the run's estimate
    adds for the repeats, energy, kernels and torch.compile's modes."""
    return {
        "rsd": bool(getattr(args, "rsd", 0.05)),
        "energy_s": getattr(args, "energy", 0.0),
        "kernels": getattr(args, "kernels", False),
        "compile_modes": getattr(args, "compile_modes", ()),
    }


def cmd_profile(args: argparse.Namespace) -> int:
    from tritonkit.harness import profile

    result = profile.profile_case(
        args.op, args.shape, args.dtype, args.mode, Path(args.out), static=not args.no_static
    )
    print(profile.render(result))
    print(f"wrote {Path(args.out) / 'profile.json'}")
    return 0


def cmd_soak(args: argparse.Namespace) -> int:
    from tritonkit.harness import soak
    from tritonkit.harness.spec import select

    failed = 0
    for spec in select(args.ops or None):
        if spec.distributed is not None:
            print(f"{spec.name}: skipped (distributed)")
            continue
        results = []
        if args.calls:
            results.append(soak.leak_check(spec, calls=args.calls, shape=args.shape))
        if args.seconds:
            results.append(soak.stability_check(spec, seconds=args.seconds, shape=args.shape))
        for r in results:
            failed += not r.passed
            mark = "ok  " if r.passed else "FAIL"
            print(f"{mark} {r.op} {r.shape} {r.dtype} {r.case} [{r.params}] {r.detail}".rstrip())
    print(f"soak: {failed} failed" if failed else "soak: all passed", file=sys.stderr)
    return 1 if failed else 0


def cmd_trend(args: argparse.Namespace) -> int:
    from tritonkit.cli_args import UsageError
    from tritonkit.harness import trend
    from tritonkit.harness.report import load_json

    missing = [p for p in args.results if not Path(p).exists()]
    if missing:
        raise UsageError(f"trend: {', '.join(missing)} does not exist")
    try:
        docs = [load_json(Path(p)) for p in args.results]
        written = trend.write(docs, [Path(p).stem for p in args.results], Path(args.out))
    except ValueError as exc:
        raise UsageError(f"trend: {exc}") from None
    print((Path(args.out) / "trend.md").read_text())
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def add_parser(sub: Any, parents: Any = ()) -> None:
    """The ``profile``, ``soak`` and ``trend`` subcommands on the CLI's subparsers."""
    s = sub.add_parser(
        "profile", help="registers, occupancy and profiler metrics per kernel", parents=parents
    )
    s.add_argument("op", help="an operator name")
    s.add_argument("--shape", type=_shape, help="default: its first bench shape (GPU)")
    s.add_argument("--dtype", help="default: the operator's main dtype")
    s.add_argument("--mode", default="fwd", choices=("fwd", "bwd", "fwd+bwd"))
    s.add_argument("--out", default="tritonkit-profile", help="where traces and JSON go")
    s.add_argument("--no-static", action="store_true", help="skip compiling for sm_90")
    s.set_defaults(func=cmd_profile)

    s = sub.add_parser("soak", help="memory-leak and long-run stability checks", parents=parents)
    s.add_argument("ops", nargs="*", help="operators or families (default: all)")
    s.add_argument("--calls", type=int, default=1000, help="leak check calls (0: none)")
    s.add_argument("--seconds", type=float, default=0.0, help="long-run seconds (0: none)")
    s.add_argument("--shape", type=_shape, help="default: the smallest-cost test shape")
    s.set_defaults(func=cmd_soak)

    s = sub.add_parser("trend", help="each case's time over many runs, plots", parents=parents)
    s.add_argument("results", nargs="+", help="results.json files, oldest first")
    s.add_argument("--out", default="tritonkit-trend", help="where trend.* go")
    s.set_defaults(func=cmd_trend)
