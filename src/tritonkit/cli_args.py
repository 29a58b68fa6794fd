"""The command line's arguments: the constants, the one-line usage error, and the validation
of every flag (operators, dtypes, modes, shapes, profiles, files), checked before anything runs
(``tritonkit.cli``)."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

DEFAULT_OUT = "tritonkit-report"
COMMANDS = (
    "list", "check", "bench", "report", "doctor", "tune", "regress", "new", "quant-report",
    "warmup", "profile", "soak", "trend",
)  # fmt: skip
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
    message = f"{what} would take roughly {duration(seconds)} under Triton's CPU interpreter"
    if not sys.stdin.isatty():
        raise UsageError(f"{message}; pass --yes to run them")
    answer = input(f"tritonkit: {message}. Run them? [y/N] ")
    if answer.strip().lower() not in ("y", "yes"):
        raise UsageError("not run (pass --yes to run without asking)")
