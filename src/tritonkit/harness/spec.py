"""The OpSpec contract and the registry of operators.

An OpSpec describes one operator once: what PyTorch computes (the reference), how to make
inputs, at which shapes to test and time it, how many bytes and FLOPs it must at least move
and do, how close it must be, and what to time it against. The check, bench and report
engines work from the registry alone; they call only the public functions the spec names.

This module is a leaf: specs import it, and nothing here imports the kernels.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MODES = ("fwd", "bwd", "fwd+bwd")


@dataclass(frozen=True)
class Tolerance:
    """Elementwise bound against the float64 reference: ``|out - ref| <= atol + rtol * |ref|``;
    and, with ``max_ratio``, a relative L2 error at most that multiple of PyTorch's own (where
    the output has enough elements for the ratio to mean something).

    ``torch_factor``: an output that misses the elementwise bound still passes when its largest
    error is at most this multiple of the largest error of PyTorch's own computation in the same
    dtype. It is for outputs whose error follows the draw's conditioning (a gradient taken at an
    intermediate rounded to the dtype), where a fixed bound cannot hold for every draw but
    "no worse than PyTorch on the same inputs" can; special values are never excused."""

    atol: float
    rtol: float
    max_ratio: float | None = None
    torch_factor: float | None = None


@dataclass(frozen=True)
class Exact:
    """Every element equal to the float64 reference's rounded to the output's dtype (integers
    compared as integers; NaN matches NaN). The default for integer and bool outputs."""


@dataclass(frozen=True)
class SQNR:
    """Signal-to-quantization-noise ratio against the float64 reference, for outputs that are
    rounded on purpose (FP8, INT8, their dequantized values):
    ``10 * log10(sum(ref**2) / sum((out - ref)**2)) >= min_db`` over the finite elements (NaN and
    +-inf must sit where the reference's are). ``p99`` and ``max_abs``, when given, also bound
    the 99th percentile and the largest ``|out - ref|``. ``min_db`` may be a mapping by the
    output's dtype (``{torch.float8_e4m3fn: 28.0, torch.float8_e5m2: 22.0}``)."""

    min_db: float | Mapping[torch.dtype, float]
    p99: float | None = None
    max_abs: float | None = None

    def min_db_for(self, dtype: torch.dtype) -> float:
        if isinstance(self.min_db, Mapping):
            if dtype not in self.min_db:
                raise KeyError(f"SQNR: no min_db for {dtype}; give one in the spec")
            return self.min_db[dtype]
        return self.min_db


# How one output is judged: an elementwise Tolerance (the default for floating outputs, taken
# from the spec's table by the case's dtype), Exact, or SQNR.
Metric = Tolerance | Exact | SQNR


@dataclass(frozen=True)
class Distributed:
    """How to run an operator on several ranks: the engines spawn ``world_size`` processes, join
    them in a ``torch.distributed`` process group (``backends`` by device type: gloo on the CPU,
    nccl on GPUs, one GPU per rank) and run the same cases on every rank. ``make_inputs`` gets a
    seed of its own on each rank; the reference runs on every rank too, so it may use
    torch.distributed's own collectives (on float64 tensors: the exact answer). A case passes
    when it passes on every rank. The spec must be built in an importable module (the spawned
    processes import it to find the spec again)."""

    world_size: int = 2
    backends: Mapping[str, str] = field(default_factory=lambda: {"cpu": "gloo", "cuda": "nccl"})
    timeout_s: float = 120.0  # a rank that waits longer in a collective fails the run


# Computed in float32 and rounded once, an output is within half a unit in the last place of
# its dtype. bfloat16 gets two units (2**-6), set when Triton's CPU interpreter truncated float32
# to bfloat16 (up to one unit alone); ops/_core/interpreter.py now rounds as the GPU does.
DEFAULT_TOLERANCES: Mapping[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(atol=1e-6, rtol=1e-5),
    torch.float16: Tolerance(atol=1e-5, rtol=1e-3),
    torch.bfloat16: Tolerance(atol=1e-5, rtol=2.0**-6),
}


@dataclass(frozen=True)
class Shapes:
    """Shapes an operator is checked and timed at; what a shape means is up to make_inputs."""

    test: Sequence[Any]  # small, odd, non-power-of-2: fast under the CPU interpreter
    bench: Sequence[Any]  # fills the GPU
    empty: Sequence[Any] = ()  # shapes with a zero-sized dimension
    # Where a call's host time sets the pace (e.g. (64, 3000) rows, 256^3 GEMMs): timed with
    # ``tritonkit bench --small`` beside the bench shapes.
    small: Sequence[Any] = ()
    # The one shape ``tritonkit bench`` checks at by default, where the choice of
    # ``selection.check_shape`` (the cheapest test shape that can show an error, by a cost
    # model) is slow for this operator; None: that choice.
    check: Any = None


class Unavailable(Exception):
    """A baseline that cannot run here (no GPU, no nvcc, package missing); the message says why."""


@dataclass(frozen=True)
class Baseline:
    """Something a user could call instead; ``build()`` returns a callable with impl's signature."""

    name: str
    build: Callable[[], Callable[..., Any]]
    backward: bool = True  # whether it has a backward pass to time
    description: str = ""


@dataclass(frozen=True)
class OpSpec:
    """One operator, described once. See docs/DESIGN.md for the meaning of each field."""

    name: str
    family: str
    impl: Callable[..., Any]
    reference: Callable[..., Any]
    make_inputs: Callable[[Any, torch.dtype, torch.device, int], tuple]
    shapes: Shapes
    bytes: Callable[..., int]  # (inputs, mode, **params) -> fewest bytes moved
    flops: Callable[..., int] = lambda inputs, mode, **params: 0
    dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES
    bench_dtypes: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float32)
    params: tuple[Mapping[str, Any], ...] = ({},)  # keyword arguments: all checked, first timed
    tolerance: Mapping[torch.dtype, Tolerance] = field(default_factory=lambda: DEFAULT_TOLERANCES)
    grad_tolerance: Mapping[torch.dtype, Tolerance] | None = None  # None: same as tolerance
    backward: bool = True
    grad_inputs: tuple[int, ...] | None = None  # inputs that get gradients; None: every float one
    baselines: Mapping[str, Baseline] = field(default_factory=dict)
    variants: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    special_values: bool = True  # inject NaN and +-inf and expect PyTorch's pattern back
    compute: str = "vector"  # roofline ceiling: "vector" (fp32 ALUs) or "tensor" (per dtype)
    # dtypes the CPU interpreter computes wrongly (a Triton bug, not ours): not checked there,
    # reported as skipped with this reason, and checked on the GPU.
    interpreter_skip: Mapping[torch.dtype, str] = field(default_factory=dict)
    # How much one check case costs under the interpreter beside others of its kind (a kernel
    # that loops, as Newton-Schulz's five iterations of three GEMMs): for the run's estimate.
    check_cost: float = 1.0
    bench_note: Callable[[Any, str], str | None] = lambda shape, mode: None  # reason to skip
    description: str = ""
    # Inputs the operator writes in place (optimizer state, an accumulator), by index. Every
    # checked or timed run starts from its own copy of them, made from the same values, and
    # they are compared after the run as outputs (after what impl returns). No backward.
    mutates: tuple[int, ...] = ()
    # How each compared output is judged, by its index among the outputs (what impl returns,
    # flattened, then the mutated inputs in ``mutates`` order); others take the defaults:
    # floating outputs the tolerance table, integer and bool outputs Exact.
    metrics: Mapping[int, Metric] = field(default_factory=dict)
    distributed: Distributed | None = None  # run on several ranks; None: one process
    # The module the spec was built in: spawned ranks import it to find the spec again.
    origin: str = field(default="", init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.mutates and self.backward:
            raise ValueError(f"{self.name}: an operator that mutates its inputs has no backward")
        if self.distributed is not None and self.distributed.world_size < 1:
            raise ValueError(f"{self.name}: world_size must be >= 1")
        # The module that built the spec: the caller of the dataclass's __init__ (which calls
        # this), or of dataclasses.replace.
        frame = sys._getframe(2)
        while frame.f_back is not None and frame.f_globals.get("__name__") == "dataclasses":
            frame = frame.f_back
        object.__setattr__(self, "origin", frame.f_globals.get("__name__", ""))

    def tolerance_for(self, dtype: torch.dtype, grad: bool = False) -> Tolerance:
        tol = self.tolerance_or_none(dtype, grad)
        if tol is None:
            raise KeyError(f"{self.name}: no tolerance for {dtype}; give one in the spec")
        return tol

    def tolerance_or_none(self, dtype: torch.dtype, grad: bool = False) -> Tolerance | None:
        """The tolerance for a case in ``dtype``, or None where neither the spec nor the
        defaults give one (an integer operator whose outputs are all Exact needs none)."""
        table = self.grad_tolerance if grad and self.grad_tolerance is not None else self.tolerance
        return table.get(dtype, DEFAULT_TOLERANCES.get(dtype))

    def grad_indices(self, inputs: Sequence[Any]) -> list[int]:
        if self.grad_inputs is not None:
            return list(self.grad_inputs)
        return [
            i
            for i, t in enumerate(inputs)
            if isinstance(t, torch.Tensor) and t.dtype.is_floating_point
        ]


class UnknownOp(KeyError):
    """Raised for an operator name that is not registered; the message lists the known ones."""

    def __str__(self) -> str:
        return str(self.args[0])


_REGISTRY: dict[str, OpSpec] = {}


def register(spec: OpSpec) -> OpSpec:
    if spec.name in _REGISTRY:
        raise ValueError(f"operator {spec.name!r} is registered twice")
    _REGISTRY[spec.name] = spec
    return spec


def load_specs() -> None:
    """Import every spec module (idempotent); importing one registers its operators."""
    importlib.import_module("tritonkit.specs")


def all_specs() -> list[OpSpec]:
    load_specs()
    return list(_REGISTRY.values())


def get_spec(name: str) -> OpSpec:
    load_specs()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownOp(_unknown(name)) from None


def _unknown(name: str) -> str:
    """Says what exists: every operator and family (a user reads the name they meant there),
    the closest ones first when some are close."""
    import difflib

    families = sorted({s.family for s in _REGISTRY.values()})
    close = difflib.get_close_matches(name, [*_REGISTRY, *families], n=3)
    hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
    return (
        f"unknown operator {name!r}{hint}; known operators: {', '.join(sorted(_REGISTRY))}; "
        f"families: {', '.join(families)} (`tritonkit list` describes them)"
    )


def select(names: Sequence[str] | None) -> list[OpSpec]:
    """Specs by name, in the order given, or all of them; a family name selects its operators.

    An operator's own name wins over a family of the same name (``matmul`` is both).
    """
    specs = all_specs()
    if not names:
        return specs
    families = {s.family for s in specs}
    chosen: list[OpSpec] = []
    for name in names:
        if name in _REGISTRY or name not in families:
            picked = [get_spec(name)]
        else:
            picked = [s for s in specs if s.family == name]
        chosen.extend(s for s in picked if s not in chosen)
    return chosen


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


_DTYPE_ALIASES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
    "float8_e5m2": torch.float8_e5m2,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}


def parse_dtype(name: str) -> torch.dtype:
    try:
        return _DTYPE_ALIASES[name.strip().lower()]
    except KeyError:
        raise ValueError(
            f"unknown dtype {name!r}; expected one of {', '.join(sorted(_DTYPE_ALIASES))}"
        ) from None
