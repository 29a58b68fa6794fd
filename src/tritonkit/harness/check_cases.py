"""The check engine's cases, run in this process (check.py routes a distributed spec to its
ranks, whose processes run these too).

For every shape, dtype and parameter set of a spec it compares the operator with a float64
reference computed on upcast inputs, and reports the maximum absolute error, the relative L2
error and the ratio of that error to PyTorch's own error in the same dtype. Each case draws
fresh random inputs; outputs are poisoned (every allocation inside the operator is filled
with NaN) so that an element the kernel never writes cannot pass; inputs are also checked as
non-contiguous views, with NaN and +-inf injected, empty, and through the backward pass, of
contiguous and of transposed inputs (a backward may take another path than its forward).

Beyond pure floating-point operators: inputs a spec declares mutated are copied for every run
and compared after it (an input written but not declared fails); integer and bool outputs are
compared exactly, and a spec may judge any output by Exact or SQNR (with error percentiles)
instead of an elementwise tolerance; a distributed spec runs on its ranks.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from tritonkit.harness.compare import (
    Outcome,
    _ratio,
    _upcast,
    compare,
    flatten,
)
from tritonkit.harness.spec import OpSpec, Tolerance, dtype_name
from tritonkit.ops._core import replay
from tritonkit.ops._core.device import interpreter_enabled

CASES = (
    "random",
    "slice",
    "transpose",
    "stride2",
    "mixed",
    "specials",
    "constants",  # every float input one constant (0, 1, 1e-7, 65000), at the first shape
    "grad",
    "grad-transpose",  # gradients of transposed inputs: a backward may take another path
    "replay",  # CUDA only: a call replayed from C++ gives bitwise what the Python path gives
    "empty",
)
_GRAD_CASES = {"grad": None, "grad-transpose": "transpose"}  # case -> the inputs' layout


@dataclass
class CheckResult:
    op: str
    params: str
    shape: str
    dtype: str
    case: str
    passed: bool
    max_abs: float | None = None
    rel_l2: float | None = None
    torch_rel_l2: float | None = None
    ratio: float | None = None  # rel_l2 / torch_rel_l2: 1 means as accurate as PyTorch
    sqnr_db: float | None = None  # outputs judged by SQNR: the lowest, and the worst
    err_p50: float | None = None  # percentiles of |out - ref|
    err_p99: float | None = None
    seed: int | None = None
    detail: str = ""
    skipped: str | None = None  # why this case was not run (never a pass)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


# ---- poisoned allocations -------------------------------------------------------------------


def _poison(t: torch.Tensor) -> torch.Tensor:
    if t.numel():
        if t.dtype.is_floating_point or t.dtype.is_complex:
            t.fill_(float("nan"))
        elif t.dtype == torch.bool:
            t.fill_(True)
        else:
            t.fill_(max(-7777, torch.iinfo(t.dtype).min) if t.dtype.is_signed else 77)
    return t


@contextlib.contextmanager
def poisoned_allocations() -> Iterator[None]:
    """Fill every tensor that ``torch.empty*`` returns with NaN (or a sentinel) while active.

    Operators allocate their outputs with these functions, so an output element that the
    kernel does not write stays NaN and fails the comparison.
    """
    originals = {name: getattr(torch, name) for name in ("empty", "empty_like", "empty_strided")}
    new_empty = torch.Tensor.new_empty

    def wrap(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def poisoned(*args, **kwargs):
            return _poison(fn(*args, **kwargs))

        return poisoned

    try:
        for name, fn in originals.items():
            setattr(torch, name, wrap(fn))
        torch.Tensor.new_empty = wrap(new_empty)
        with replay.suspended():  # the fills are ATen ops a recording must not see
            yield
    finally:
        for name, fn in originals.items():
            setattr(torch, name, fn)
        torch.Tensor.new_empty = new_empty


# ---- input layouts and special values ---------------------------------------------------------


def relayout(t: Any, kind: str) -> Any:
    """The same values as ``t`` in another memory layout (non-tensors pass through)."""
    if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.numel() == 0:
        return t
    shape = tuple(t.shape)
    if kind == "slice":  # rows of a wider tensor: unit stride inside a row, padded rows
        base = torch.empty((*shape[:-1], shape[-1] + 3), dtype=t.dtype, device=t.device)
        view = base[..., : shape[-1]]
    elif kind == "transpose":  # dense but permuted (the last dimension is not unit-stride)
        if t.dim() < 2:
            return relayout(t, "stride2")
        base = torch.empty((*shape[:-2], shape[-1], shape[-2]), dtype=t.dtype, device=t.device)
        view = base.transpose(-1, -2)
    elif kind == "stride2":  # every other element: no unit-stride view exists
        base = torch.empty((*shape[:-1], 2 * shape[-1]), dtype=t.dtype, device=t.device)
        view = base[..., ::2]
    else:
        raise ValueError(f"unknown layout {kind!r}")
    base.fill_(float("nan") if t.dtype.is_floating_point else 0)  # gaps must never be read
    view.copy_(t)
    return view


def _layout_inputs(inputs: Sequence[Any], kind: str) -> tuple:
    if kind == "mixed":  # first tensor transposed, the others contiguous: strides disagree
        first = next(i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor))
        return tuple(relayout(t, "transpose") if i == first else t for i, t in enumerate(inputs))
    return tuple(relayout(t, kind) for t in inputs)


def inject_specials(inputs: Sequence[Any]) -> tuple:
    """Put NaN, +inf and -inf at the start, middle and end of the first float input."""
    out = list(inputs)
    for i, t in enumerate(out):
        if isinstance(t, torch.Tensor) and t.dtype.is_floating_point and t.numel() >= 3:
            t = t.clone()
            flat = t.view(-1)
            n = flat.numel()
            flat[0], flat[n // 2], flat[n - 1] = float("nan"), float("inf"), float("-inf")
            out[i] = t
            break
    return tuple(out)


# Constant edge inputs: what a kernel's reductions and divisions meet at their limits (a zero
# variance, a denominator that rounds to nothing, squares that overflow 16-bit). 65000 only
# where the dtype holds it (float16's largest is 65504); the expected answer is PyTorch's in
# float64 on the same inputs, NaN and infinities included (compare.py matches their pattern).
CONSTANTS = (0.0, 1.0, 1e-7, 65000.0)


def inject_constant(inputs: Sequence[Any], value: float) -> tuple | None:
    """Every floating input filled with ``value`` (integer inputs kept); None where the inputs'
    dtype cannot hold it or there is no floating input."""
    out, filled = list(inputs), False
    for i, t in enumerate(out):
        if isinstance(t, torch.Tensor) and t.dtype.is_floating_point:
            if abs(value) > torch.finfo(t.dtype).max:
                return None
            out[i] = torch.full_like(t, value)
            filled = True
    return tuple(out) if filled else None


def _constant_scale(spec: OpSpec, constant: tuple, params: dict, value: float) -> float:
    """The magnitude the constant case's rtol applies to: the largest of ``|value|`` and the
    float64 reference's largest finite output. Constant inputs make outputs that cancel to
    exactly 0 (a rotation's ``x cos - y sin``, a one-class cross-entropy), where ``rtol * |ref|``
    would ask for no rounding at all of terms of size ``value`` (or ``value**2``): on the GPU a
    fused multiply-add rounds one product and not the other."""
    ref_in = with_own_state(spec, _upcast(constant))
    ref = spec.reference(*ref_in, **params)
    scale = abs(value)
    for t in flatten(outputs_of(spec, ref, ref_in)):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
            finite = t[torch.isfinite(t)]
            if finite.numel():
                scale = max(scale, float(finite.abs().max()))
    return scale


def _run_constants(spec: OpSpec, inputs: tuple, params: dict, tol: Tolerance | None) -> Outcome:
    """run_forward at each of CONSTANTS; the first failure, or the worst errors of the passes.
    Each value's bound is the spec's with ``rtol`` also applied to the case's magnitude
    (``_constant_scale``): ``|out - ref| <= atol + rtol * (|ref| + scale)``."""
    worst = Outcome(True, 0.0, 0.0)  # a pass says nothing in its detail (see report.py)
    for value in CONSTANTS:
        constant = inject_constant(inputs, value)
        if constant is None:
            continue
        case_tol = tol
        if isinstance(tol, Tolerance):
            scale = _constant_scale(spec, constant, params, value)
            case_tol = replace(tol, atol=tol.atol + tol.rtol * scale)
        o = run_forward(spec, constant, params, case_tol)
        if not o.passed:
            o.detail = f"all inputs {value:g}: {o.detail}"
            return o
        worst.max_abs = max(worst.max_abs, o.max_abs)
        worst.rel_l2 = max(worst.rel_l2, o.rel_l2)
    return worst


# ---- mutated inputs -------------------------------------------------------------------------


def own_copy(t: Any) -> Any:
    """The same values in memory of its own, with the same strides (non-tensors pass through)."""
    if not isinstance(t, torch.Tensor):
        return t
    copy = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    return copy.copy_(t.detach())


def with_own_state(spec: OpSpec, inputs: Sequence[Any]) -> tuple:
    """``inputs`` with a copy of its own of each input the operator mutates: every run starts
    from the same values and none changes what the next one sees."""
    return tuple(own_copy(t) if i in spec.mutates else t for i, t in enumerate(inputs))


def outputs_of(spec: OpSpec, returned: Any, args: Sequence[Any]) -> list[torch.Tensor]:
    """What is compared after a run: what the operator returned, then the inputs it mutated."""
    out = [] if returned is None else flatten(returned)
    return out + [args[i] for i in spec.mutates]


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    flat = torch.empty(t.numel(), dtype=t.dtype, device=t.device).copy_(t.detach().reshape(-1))
    return flat.view(torch.uint8)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(_bytes_of(a), _bytes_of(b))


# ---- the engine -----------------------------------------------------------------------------


def run_forward(
    spec: OpSpec, inputs: tuple, params: dict, tol: Tolerance | None, poison: bool = True
) -> Outcome:
    """Run the operator and the reference (float64 and same-dtype) on ``inputs`` and compare;
    mutated inputs are copied per run, and an input written but not declared fails."""
    kept = {
        i: t.clone()
        for i, t in enumerate(inputs)
        if isinstance(t, torch.Tensor) and i not in spec.mutates
    }
    ours_in = with_own_state(spec, inputs)
    with poisoned_allocations() if poison else contextlib.nullcontext():
        ours = spec.impl(*ours_in, **params)
    for i, t in kept.items():
        if not _same_bits(inputs[i], t):
            return Outcome(False, detail=f"input {i} was written; the spec's mutates omits it")
    ref_in = with_own_state(spec, _upcast(inputs))
    ref = spec.reference(*ref_in, **params)
    same_in = with_own_state(spec, inputs)
    same = spec.reference(*same_in, **params)
    return compare(
        outputs_of(spec, ours, ours_in),
        outputs_of(spec, ref, ref_in),
        outputs_of(spec, same, same_in),
        tol,
        spec.metrics,
    )


def _run_backward(spec: OpSpec, inputs: tuple, params: dict, tol: Tolerance | None, seed: int):
    idx = spec.grad_indices(inputs)

    def leaves(src: tuple) -> tuple:
        return tuple(
            t.detach().clone().requires_grad_() if i in idx else t for i, t in enumerate(src)
        )

    ours_in, ref_in, same_in = leaves(inputs), leaves(_upcast(inputs)), leaves(inputs)
    ours_out = flatten(spec.impl(*ours_in, **params))
    gen = torch.Generator(device=ours_out[0].device).manual_seed(seed ^ 0x5EED)
    grads = [
        torch.randn(o.shape, generator=gen, device=o.device, dtype=torch.float32).to(o.dtype)
        for o in ours_out
    ]
    with poisoned_allocations():
        ours_g = torch.autograd.grad(ours_out, [ours_in[i] for i in idx], grads)
    ref_out = flatten(spec.reference(*ref_in, **params))
    ref_g = torch.autograd.grad(ref_out, [ref_in[i] for i in idx], [g.double() for g in grads])
    same_out = flatten(spec.reference(*same_in, **params))
    same_g = torch.autograd.grad(same_out, [same_in[i] for i in idx], grads)
    return compare(list(ours_g), list(ref_g), list(same_g), tol, spec.metrics)


def _run_replay(spec: OpSpec, inputs: tuple, params: dict, seed: int):
    """Three calls on the same inputs: the first runs the Python path, the second is recorded,
    the third replayed from C++ with every allocation poisoned; the third's outputs (and
    gradients) must equal the first's bit for bit. A call that cannot be replayed passes with
    the reason in its detail."""
    idx = spec.grad_indices(inputs) if spec.backward else []

    def once() -> list[torch.Tensor]:
        leaves = tuple(t.detach().requires_grad_() if i in idx else t for i, t in enumerate(inputs))
        outs = flatten(spec.impl(*leaves, **params))
        got = [o.detach().clone() for o in outs]
        pairs = [(o, i) for i, o in enumerate(outs) if o.requires_grad]
        if idx and pairs:
            gen = torch.Generator(device=outs[0].device).manual_seed(seed)
            grads = [
                torch.randn(o.shape, generator=gen, device=o.device).to(o.dtype) for o, _ in pairs
            ]
            got += list(torch.autograd.grad([o for o, _ in pairs], [leaves[i] for i in idx], grads))
        return got

    replay.reset()
    replay.set_poison(True)
    try:
        first, _, third = once(), once(), once()
    finally:
        replay.set_poison(False)
    same = len(first) == len(third) and all(
        a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
        for a, b in zip(first, third)
    )
    if replay.STATS.replays:
        detail = (
            "replayed; bitwise equal" if same else "replayed output differs from the Python path"
        )
    else:
        reasons = "; ".join(replay.STATS.failures) or replay.STATS.disabled or "not recorded"
        detail = f"not replayed ({reasons})"
    return same, detail


def _run_empty(spec: OpSpec, inputs: tuple, params: dict):
    ours_in, same_in = with_own_state(spec, inputs), with_own_state(spec, inputs)
    ours = outputs_of(spec, spec.impl(*ours_in, **params), ours_in)
    same = outputs_of(spec, spec.reference(*same_in, **params), same_in)
    for o, s in zip(ours, same):
        if o.shape != s.shape or o.dtype != s.dtype:
            return False, f"got {tuple(o.shape)} {o.dtype}, PyTorch {tuple(s.shape)} {s.dtype}"
    if spec.backward:
        idx = spec.grad_indices(inputs)
        leaves = tuple(
            t.detach().clone().requires_grad_() if i in idx else t for i, t in enumerate(inputs)
        )
        outs = flatten(spec.impl(*leaves, **params))
        grads = torch.autograd.grad(
            outs, [leaves[i] for i in idx], [torch.ones_like(o) for o in outs]
        )
        for i, g in zip(idx, grads):
            if g.shape != inputs[i].shape:
                return False, f"gradient of input {i} has shape {tuple(g.shape)}"
            if g.numel() and not torch.isfinite(g).all():
                return False, f"gradient of input {i} is not finite"
    return True, ""


def _record_outcome(res: CheckResult, o: Outcome) -> None:
    res.passed, res.max_abs, res.rel_l2, res.detail = o.passed, o.max_abs, o.rel_l2, o.detail
    res.torch_rel_l2, res.ratio = o.torch_rel_l2, _ratio(o.rel_l2, o.torch_rel_l2)
    res.sqnr_db, res.err_p50, res.err_p99 = o.sqnr_db, o.err_p50, o.err_p99


def _rank_seed(seed: int) -> int:
    """A seed of its own for each rank of a distributed run (the same seed otherwise)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return (seed + 104729 * torch.distributed.get_rank()) % 2**31
    return seed


def _describe(params: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in params.items())


def planned_cases(
    spec: OpSpec,
    *,
    dtypes: Sequence[torch.dtype] | None = None,
    shapes: Sequence[Any] | None = None,
    cases: Sequence[str] = CASES,
) -> int:
    """How many results ``check_spec`` will return with these arguments (for progress, and
    to tell a selection that runs nothing): the cases it leaves out, it leaves out here too."""
    replays = torch.cuda.is_available() and not spec.mutates and spec.distributed is None
    per_shape = sum(
        case not in ("empty", "constants")
        and not (case in _GRAD_CASES and not spec.backward)
        and not (case == "specials" and not spec.special_values)
        and not (case == "replay" and not replays)
        for case in cases
    )
    n_shapes = len(shapes if shapes is not None else spec.shapes.test)
    n_empty = len(spec.shapes.empty) if "empty" in cases else 0
    n_empty += int("constants" in cases and n_shapes > 0)  # at the first shape only
    total = 0
    for dtype in dtypes or spec.dtypes:
        if dtype not in spec.dtypes:
            continue
        if interpreter_enabled() and dtype in spec.interpreter_skip:
            total += 1
        else:
            total += per_shape * n_shapes + n_empty
    return total * len(spec.params)


def check_local(
    spec: OpSpec,
    *,
    dtypes: Sequence[torch.dtype] | None = None,
    shapes: Sequence[Any] | None = None,
    device: torch.device | str | None = None,
    seed: int | None = None,
    cases: Sequence[str] = CASES,
    on_case: Callable[[CheckResult], None] | None = None,
) -> list[CheckResult]:
    """Run every check of one operator in this process; returns one result per (params, shape,
    dtype, case). ``check.check_spec`` calls it, or each rank of a distributed spec does."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    base_seed = fresh_seed() if seed is None else seed
    results: list[CheckResult] = []
    counter = 0

    def record(res: CheckResult) -> None:
        results.append(res)
        if on_case:
            on_case(res)

    for params in spec.params:
        for dtype in dtypes or spec.dtypes:
            if dtype not in spec.dtypes:
                continue
            if interpreter_enabled() and dtype in spec.interpreter_skip:
                reason = spec.interpreter_skip[dtype]
                record(
                    CheckResult(
                        spec.name,
                        _describe(params),
                        "all",
                        dtype_name(dtype),
                        "all",
                        False,
                        detail=f"skipped: {reason}",
                        skipped=reason,
                    )
                )
                continue
            run_shapes = list(shapes if shapes is not None else spec.shapes.test)
            for shape in run_shapes:
                for case in cases:
                    if case == "empty":
                        continue
                    # One shape carries the constants (every value is a case of its own
                    # inside): the first, the smallest of a spec's test shapes.
                    if case == "constants" and shape != run_shapes[0]:
                        continue
                    if case in _GRAD_CASES and not spec.backward:
                        continue
                    if case == "specials" and not spec.special_values:
                        continue
                    if case == "replay" and (
                        device.type != "cuda" or spec.mutates or spec.distributed is not None
                    ):
                        continue  # replay runs CUDA calls; a mutating op's calls differ
                    counter += 1
                    case_seed = (base_seed + 7919 * counter) % 2**31
                    res = CheckResult(
                        spec.name,
                        _describe(params),
                        str(shape),
                        dtype_name(dtype),
                        case,
                        False,
                        seed=case_seed,
                    )
                    try:
                        inputs = spec.make_inputs(shape, dtype, device, _rank_seed(case_seed))
                        if case in ("slice", "transpose", "stride2", "mixed"):
                            inputs = _layout_inputs(inputs, case)
                        if _GRAD_CASES.get(case):
                            inputs = _layout_inputs(inputs, _GRAD_CASES[case])
                        if case == "specials":
                            inputs = inject_specials(inputs)
                        if case == "constants":
                            tol = spec.tolerance_or_none(dtype)
                            _record_outcome(res, _run_constants(spec, inputs, params, tol))
                            record(res)
                            continue
                        if case == "replay":
                            res.passed, res.detail = _run_replay(spec, inputs, params, case_seed)
                            record(res)
                            continue
                        grad = case in _GRAD_CASES
                        tol = spec.tolerance_or_none(dtype, grad=grad)
                        if grad:
                            outcome = _run_backward(spec, inputs, params, tol, case_seed)
                        else:
                            outcome = run_forward(spec, inputs, params, tol)
                        _record_outcome(res, outcome)
                    except Exception as exc:  # a crash is a failed check, reported with its cause
                        res.detail = f"{type(exc).__name__}: {exc}".strip()
                        res.detail += "\n" + traceback.format_exc(limit=4)
                    record(res)
            if "empty" in cases:
                for shape in spec.shapes.empty:
                    res = CheckResult(
                        spec.name, _describe(params), str(shape), dtype_name(dtype), "empty", False
                    )
                    try:
                        inputs = spec.make_inputs(shape, dtype, device, _rank_seed(base_seed))
                        res.passed, res.detail = _run_empty(spec, inputs, params)
                    except Exception as exc:
                        res.detail = f"{type(exc).__name__}: {exc}"
                    record(res)
    return results
