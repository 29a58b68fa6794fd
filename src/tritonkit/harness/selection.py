"""What ``tritonkit bench`` runs, and how long that should take before it starts.

By default a representative selection: every operator at its main dtype (its first bench
dtype; under the interpreter the first one it can compute), at one test shape for the
accuracy checks (a random draw, a mixed layout, NaN/inf, constant edge inputs, the gradients,
empty tensors) and one bench shape for the timings. Every operator is a spec, so the fused
paths (``bias_act``, ``add_rms_norm``, ``linear``) and the low-precision ones
(``scaled_matmul``, ``int8_matmul``, ``quantize``, ``float8_linear``) are in it. The checks'
shape is one that can show an error (``check_shape``: hundreds of elements, in several rows):
a spec's first test shapes are its degenerate ones ((1, 1), one number), where a kernel is
exact by construction and PyTorch's own error cannot be measured; they stay in the test
suite. ``--full`` is every dtype, shape
and case; dtypes or shapes asked for on the command line replace the selection's.

The estimate is a cost model in seconds per case, a prior the progress display corrects by
the time the run's own cases took (``Progress`` with ``expected``). Under the interpreter a
check costs a fixed part plus a part per element it computes (per multiply-add for a GEMM):
the constants come from the per-case times of the whole check phase on a 2-core machine
(see docs/performance.md). On a GPU compilation dominates a cold run:
the first case of each (operator, parameters, dtype) compiles its kernels, and each timed mode
compiles the baselines' (``torch.compile``'s among them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tritonkit.harness.check_cases import CASES, planned_cases
from tritonkit.harness.compare import _upcast, flatten
from tritonkit.harness.spec import OpSpec
from tritonkit.ops._core.device import interpreter_enabled

# The accuracy cases of the representative selection (CASES has every one).
QUICK_CASES = ("random", "mixed", "specials", "constants", "grad", "empty")

# Interpreter: seconds per check case at the test shapes (a vector operator, a GEMM), per
# element (per multiply-add) beyond them, and the factor of a gradient case over a forward one;
# times the spec's ``check_cost``. At the test shapes a case's cost is mostly fixed (the
# reference in float64, PyTorch's own run, the comparison, the interpreter's launch of each
# program), so the element terms matter only at larger shapes (``--shapes bench``).
CPU_CASE_S = 0.06
CPU_GEMM_CASE_S = 0.25
CPU_ELEMENT_S = 2e-6
CPU_MAC_S = 5e-9
CPU_GRAD_FACTOR = 1.7
CPU_EMPTY_S = 0.02
# GPU, cold caches: the first check case of an (operator, params, dtype) compiles its forward
# and backward kernels; later cases mostly hit them. A timed mode compiles every candidate
# (torch.compile's graphs too) and times each about 30 times, interleaved.
GPU_FIRST_CASE_S = 2.5
GPU_CASE_S = 0.25
GPU_MODE_S = 6.0
GPU_VARIANT_S = 3.0
# Of a cold timed mode, the compilation (which compile-ahead workers take off the run), and
# the start of the workers (each imports torch and tritonkit).
GPU_MODE_COMPILE_S = 4.0
GPU_WORKERS_START_S = 20.0
# What bench's options add to a timed mode: the RSD-driven repeats (further batches until the
# target, at most timing.RSD_WALL_S; about this much where the target is not met at once),
# the kernels' figures (one more call and the modules' attributes), and per candidate the
# energy loop's seconds plus its two warm calls and the device's waits.
GPU_RSD_S = 2.0
GPU_KERNELS_S = 0.5
GPU_ENERGY_EXTRA_S = 0.2


@dataclass(frozen=True)
class Item:
    """One operator's share of a bench run."""

    spec: OpSpec
    check_dtypes: tuple[torch.dtype, ...]
    check_shapes: tuple[Any, ...]
    cases: tuple[str, ...]
    bench_dtypes: tuple[torch.dtype, ...]
    bench_shapes: tuple[Any, ...]
    variants: bool


def main_dtype(spec: OpSpec) -> torch.dtype:
    """The dtype an operator is mostly used at: its first bench dtype, or under the
    interpreter the first of its dtypes the interpreter computes."""
    order = [*spec.bench_dtypes, *[d for d in spec.dtypes if d not in spec.bench_dtypes]]
    order = [d for d in order if d in spec.dtypes]
    if interpreter_enabled():
        usable = [d for d in order if d not in spec.interpreter_skip]
        order = usable or order
    return order[0]


# A check shape must give the comparison this many elements in one tensor (an output, or a
# gradient): enough for several blocks of a kernel and for the ratio to PyTorch's own error
# (compare.MIN_ELEMENTS_FOR_RATIO).
MIN_CHECK_ELEMENTS = 256
# A row this long holds hundreds of elements: a reduction over it spans several steps of a
# kernel's inner loop or a wide block, as real rows do.
LONG_ROW = 100


def compared_shapes(spec: OpSpec, shape: Any, dtype: torch.dtype) -> list[tuple[int, ...]]:
    """The shapes of the tensors a check at ``shape`` compares with the float64 reference: the
    reference's outputs, the inputs the operator mutates, and with a backward the gradients
    (their inputs' shapes). Found by running the reference on the CPU (milliseconds at test
    shapes); empty where it cannot run there."""
    from tritonkit.ops._core.plan import cached

    return cached("selection.compared", (spec.name, repr(shape), str(dtype)),
                  lambda: _compared(spec, shape, dtype))  # fmt: skip


def _compared(spec: OpSpec, shape: Any, dtype: torch.dtype) -> list[tuple[int, ...]]:
    try:
        inputs = spec.make_inputs(shape, dtype, torch.device("cpu"), 0)
        if spec.distributed is not None:  # the reference runs on the ranks: a collective's
            return [tuple(t.shape) for t in flatten(inputs)]  # outputs are its inputs' shapes
        out = spec.reference(*_upcast(inputs), **dict(spec.params[0]))
        shapes = [tuple(t.shape) for t in (flatten(out) if out is not None else [])]
        shapes += [tuple(inputs[i].shape) for i in spec.mutates]
        if spec.backward:
            shapes += [tuple(inputs[i].shape) for i in spec.grad_indices(inputs)]
    except Exception:  # a shape the CPU cannot build or run is not chosen
        shapes = []
    return shapes


def _shape_rank(spec: OpSpec, shape: Any, dtype: torch.dtype) -> tuple | None:
    """How well a check at ``shape`` can show an error, lower better: None below
    MIN_CHECK_ELEMENTS; else, of its compared tensors that reach it, the best of (one row only,
    rows a power of two long, rows shorter than LONG_ROW)."""
    ranks = []
    for dims in compared_shapes(spec, shape, dtype):
        n = math.prod(dims)
        if n < MIN_CHECK_ELEMENTS:
            continue
        row = dims[-1] if dims else 1
        ranks.append((n // max(row, 1) < 2, row & (row - 1) == 0, row < LONG_ROW))
    return min(ranks) if ranks else None


def check_shape(spec: OpSpec, dtype: torch.dtype) -> Any:
    """The shape the representative selection checks ``spec`` at: the cheapest of its test
    shapes that gives the comparison at least MIN_CHECK_ELEMENTS elements in one tensor,
    preferring several rows, rows not a power of two long and rows of LONG_ROW elements or more
    (in that order). A spec with no such test shape is checked at the one that compares the
    most elements; a distributed one at its first (its reference runs on its ranks). A spec's
    ``Shapes.check`` overrides the choice."""
    if spec.shapes.check is not None:
        return spec.shapes.check
    tests = list(spec.shapes.test)
    if spec.distributed is not None or len(tests) < 2:
        return tests[0]

    def cost(shape: Any) -> float:
        return case_seconds(spec, shape, "random", gpu=False, first=False)

    ranked = [(_shape_rank(spec, s, dtype), cost(s), i) for i, s in enumerate(tests)]
    good = [r for r in ranked if r[0] is not None]
    if good:
        return tests[min(good)[2]]

    def largest(i: int) -> int:
        return max((math.prod(d) for d in compared_shapes(spec, tests[i], dtype)), default=0)

    return tests[max(range(len(tests)), key=lambda i: (largest(i), -ranked[i][1], -i))]


def choose(
    specs: Sequence[OpSpec],
    *,
    full: bool,
    dtypes: Sequence[torch.dtype] | None = None,
    shapes: str | list[Any] | None = None,
    named: bool = False,
    small: bool = False,
    gpu: bool = False,
) -> list[Item]:
    """The run: ``full`` or the representative selection; ``dtypes`` and ``shapes`` (``test``,
    ``bench`` or a list, as ``--shapes`` takes them) replace the selection's; ``named``
    (operators asked for by name) keeps their variants (the kernel's versions side by side),
    which the default run leaves out."""
    items = []
    for spec in specs:
        if dtypes:
            check_dtypes = bench_dtypes = tuple(d for d in dtypes if d in spec.dtypes)
        elif full:
            check_dtypes, bench_dtypes = tuple(spec.dtypes), tuple(spec.bench_dtypes)
        else:
            check_dtypes = bench_dtypes = (main_dtype(spec),)
        every_bench = (*spec.shapes.bench, *(spec.shapes.small if small else ()))
        if shapes is None and not full:
            first = check_dtypes[0] if check_dtypes else main_dtype(spec)
            check_shapes = (check_shape(spec, first),)
            bench_shapes = (*spec.shapes.bench[:1], *(spec.shapes.small[:1] if small else ()))
        elif shapes is None or shapes == "bench":
            # Without a GPU the checks are the run, at the shapes asked for; with one, the
            # checks run at the test shapes and the timings at the bench shapes.
            check_shapes = tuple(spec.shapes.test) if gpu or shapes is None else every_bench
            bench_shapes = every_bench
        elif shapes == "test":
            check_shapes = bench_shapes = tuple(spec.shapes.test)
        else:
            check_shapes = tuple(spec.shapes.test) if gpu else tuple(shapes)
            bench_shapes = tuple(shapes)
        items.append(
            Item(
                spec=spec,
                check_dtypes=check_dtypes,
                check_shapes=check_shapes,
                cases=CASES if full else QUICK_CASES,
                bench_dtypes=bench_dtypes,
                bench_shapes=bench_shapes,
                variants=full or named,
            )
        )
    return items


def work(shape: Any, gemm: bool) -> int:
    """Elements of a shape (summed over the operands' shapes when it lists several), or for a
    GEMM the product of its sizes (M * N * K, batch dimensions included)."""
    if isinstance(shape, int) and not isinstance(shape, bool):
        return shape
    if not isinstance(shape, (tuple, list)):
        return 1
    if not gemm and any(isinstance(s, (tuple, list)) for s in shape):
        return sum(work(s, gemm) for s in shape)
    return math.prod(work(s, gemm) for s in shape)


def case_seconds(
    spec: OpSpec, shape: Any, case: str, *, gpu: bool, first: bool, warmed: bool = False
) -> float:
    """The prior cost of one check case (``warmed``: its kernels compiled ahead)."""
    if gpu:
        return GPU_FIRST_CASE_S if first and not warmed else GPU_CASE_S
    if case == "empty":
        return CPU_EMPTY_S
    gemm = spec.compute == "tensor"
    per_unit = CPU_MAC_S if gemm else CPU_ELEMENT_S
    cost = (CPU_GEMM_CASE_S if gemm else CPU_CASE_S) + per_unit * work(shape, gemm)
    if case.startswith("grad"):
        cost *= CPU_GRAD_FACTOR
    return cost * spec.check_cost


def mode_seconds(
    spec: OpSpec,
    named_variants: bool,
    warmed: bool = False,
    *,
    rsd: bool = False,
    energy_s: float = 0.0,
    kernels: bool = False,
    compile_modes: Sequence[str] = (),
) -> float:
    """The prior cost of one timed (shape, dtype, mode) on a GPU.

    Args:
        spec: the operator.
        named_variants: its versions are timed too (the operator was asked for by name).
        warmed: its kernels compiled ahead.
        rsd: timings repeat until an RSD target (bench's ``--rsd``, on by default).
        energy_s: seconds of NVML energy loop per candidate (``--energy``; 0: none).
        kernels: the kernels' figures are read (``--kernels``).
        compile_modes: torch.compile modes timed as further baselines.
    """
    base = GPU_MODE_S - (GPU_MODE_COMPILE_S if warmed else 0.0)
    variants = len(spec.variants) if named_variants else 0
    cost = base + GPU_VARIANT_S * variants + GPU_MODE_S * len(compile_modes)
    candidates = 1 + variants + len(spec.baselines) + len(compile_modes)
    cost += GPU_RSD_S if rsd else 0.0
    cost += candidates * (energy_s + GPU_ENERGY_EXTRA_S) if energy_s > 0 else 0.0
    return cost + (GPU_KERNELS_S if kernels else 0.0)


def expected_check_seconds(
    spec: OpSpec,
    dtypes: Sequence[torch.dtype] | None,
    shapes: Sequence[Any],
    cases: Sequence[str],
    *,
    gpu: bool,
    warmed: bool = False,
) -> float:
    """The prior cost of ``check_spec`` with these arguments (the cases ``planned_cases``
    counts, each at its ``case_seconds``)."""
    total = 0.0
    for dtype in dtypes or spec.dtypes:
        if dtype not in spec.dtypes:
            continue
        if interpreter_enabled() and dtype in spec.interpreter_skip:
            continue
        for shape in shapes:
            n = planned_cases(spec, dtypes=[dtype], shapes=[shape], cases=cases)
            n -= len(spec.shapes.empty) * len(spec.params) if "empty" in cases else 0
            if n <= 0:
                continue
            per_case = n // len(spec.params)
            grads = sum(c.startswith("grad") for c in cases if spec.backward)
            fwd = per_case - grads
            for _ in spec.params:
                total += fwd * case_seconds(spec, shape, "random", gpu=gpu, first=False)
                total += grads * case_seconds(spec, shape, "grad", gpu=gpu, first=False)
        if gpu and not warmed:  # the first case of each (params, dtype) compiles
            total += len(spec.params) * (GPU_FIRST_CASE_S - GPU_CASE_S)
        if "empty" in cases:
            n_empty = len(spec.shapes.empty) * len(spec.params)
            total += n_empty * (GPU_CASE_S if gpu else CPU_EMPTY_S)
    return total


def shape_of(text: str) -> Any:
    """A shape back from its string in a check result (``"(5, 17)"``); None if unreadable."""
    import ast

    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None


def compile_seconds(items: Sequence[Item], n_steps: int) -> float:
    """Of a cold GPU run's expected time, the compilation: the first check case of each
    (operator, params, dtype) beyond a warm one, and each timed mode's share."""
    firsts = sum(len(it.spec.params) * len(it.check_dtypes) for it in items)
    return firsts * (GPU_FIRST_CASE_S - GPU_CASE_S) + n_steps * GPU_MODE_COMPILE_S
