"""Drop-in, as PyTorch's own tests see it: the sample inputs PyTorch tests its operators with
(the OpInfo database, ``common_methods_invocations.op_db``), run through the tritonkit function
that replaces each operator, forward and backward; and ``common_optimizers.optim_db``'s
configurations of the optimizers tritonkit replaces, four steps each.

Every sample passes, or is refused by one of REFUSALS: a TypeError, ValueError or
NotImplementedError from tritonkit whose message names the function and the argument, each kind
listed with its reason in docs/reference.md ("Refused calls"). A crash (any other exception),
a result of another shape or dtype than PyTorch's, or a wrong value fails. Samples left out are
counted, with the reason (dropout draws at random; a sample outside the tritonkit function's
signature). On CUDA every sample runs in float32, bfloat16 and float16; under the interpreter
in float32 (the dtypes are the sample's own; FP8 for ``torch._scaled_mm``, on CUDA only).

Values are judged as PyTorch's OpInfo tests judge two of its own kernels against each other:
within their tolerance (the operator's TestCommon override, else assert_close's defaults) of
PyTorch's answer in the sample's dtype. Where PyTorch's answer is itself a rounding artifact,
the float64 reference decides instead: PyTorch's function on the sample upcast to float64, with
the operator's spec tolerance and PyTorch's same-dtype error as the yardstick (the check
engine, ``harness.compare``). So at a layer_norm sample's 1-element row, where x - mean(x) is
exactly 0 and with it the weight's gradient: tritonkit gives 0, as float64 does; PyTorch's
float32 kernel -3.7e-5, off by more than assert_close allows.

A ``-s`` run prints one line per operator and dtype: samples passed, refused (by kind),
awaiting (see AWAITING) and left out; the GPU run's log is that output.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import tritonkit
import tritonkit.optim
from tritonkit.harness.check import compare
from tritonkit.harness.spec import get_spec

CUDA = torch.cuda.is_available()
# The sample dtypes: under the interpreter float32 only (it computes with NumPy: a bf16 tl.dot
# is not the GPU's); on CUDA the three dtypes tritonkit computes in.
DTYPES = (torch.float32, torch.bfloat16, torch.float16) if CUDA else (torch.float32,)
SEED = 0
DOCS = Path(__file__).resolve().parents[1] / "docs" / "reference.md"


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ---- what tritonkit replaces --------------------------------------------------------------------


def _call_as_torch(sample) -> tuple[tuple, dict] | str:
    """The tritonkit function takes the torch function's arguments as they are."""
    return (sample.input, *sample.args), dict(sample.kwargs)


def _without_dropout(sample) -> tuple[tuple, dict] | str:
    if sample.kwargs.get("dropout_p", 0.0) > 0:
        return "dropout (random)"
    return _call_as_torch(sample)


def _last_two_dims(sample) -> tuple[tuple, dict] | str:
    """``torch.transpose_copy(x, d0, d1)`` is ``tritonkit.transpose(x)`` when d0, d1 are the last
    two dims; tritonkit.transpose takes no dims (PyTorch's transpose of others is a view)."""
    x, (d0, d1) = sample.input, sample.args
    n = x.dim()
    if n >= 2 and {d0 % n, d1 % n} == {n - 2, n - 1}:
        return (x,), {}
    if n < 2 and d0 != d1:  # impossible dims: torch raises too (none in op_db today)
        return (x,), {}
    return "transposes dims other than the last two"


def _scaled_mm(sample) -> tuple[tuple, dict] | str:
    """``torch._scaled_mm(a, b, scale_a, scale_b, bias=None, out_dtype=None, ...)``: tritonkit's
    out_dtype defaults to bfloat16, torch's (None) to a's dtype: passed as torch means it."""
    kwargs = dict(sample.kwargs)
    out_dtype = kwargs.pop("out_dtype", None) or sample.input.dtype
    return (sample.input, *sample.args), {"out_dtype": out_dtype, **kwargs}


def _sdpa_flash_class(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                      scale=None, enable_gqa=False):  # fmt: skip
    """SDPA through PyTorch's FlashAttention or memory-efficient kernel, on CUDA in 16 bits:
    PyTorch's answer in tritonkit.attention's accuracy class. Both round as FlashAttention does
    (the probabilities and dS to the input dtype before their products, the backward's row sums
    taken from the rounded output); SDPA's default path for 3-d and broadcast calls is its math
    kernel, which keeps them in float32. The broadcast dims are expanded first (those kernels
    take equal 4-d batches). Elsewhere, or where neither kernel takes the call, SDPA as is."""
    args = (query, key, value, attn_mask, dropout_p, is_causal)
    kwargs = {"scale": scale, "enable_gqa": enable_gqa}
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if query.device.type != "cuda" or query.dtype == torch.float32 or attn_mask is not None:
        return sdpa(*args, **kwargs)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    nd = max(query.dim(), key.dim(), value.dim())

    def four_d(t):
        return t if t.dim() == 4 else t.unsqueeze(1) if nd == 3 else t.unsqueeze(0)

    q, k, v = (four_d(t) for t in (query, key, value))
    if enable_gqa:
        lead = torch.broadcast_shapes(q.shape[:1], k.shape[:1], v.shape[:1])
        q, k, v = (t.expand(*lead, *t.shape[1:]) for t in (q, k, v))
    else:
        lead = torch.broadcast_shapes(q.shape[:2], k.shape[:2], v.shape[:2])
        q, k, v = (t.expand(*lead, *t.shape[2:]) for t in (q, k, v))
    q, k, v = (t.contiguous() for t in (q, k, v))
    try:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
            out = sdpa(q, k, v, None, dropout_p, is_causal, **kwargs)
    except RuntimeError:  # no such kernel for this call
        return sdpa(*args, **kwargs)
    return out.squeeze(1) if nd == 3 else out


@dataclass(frozen=True)
class Replaced:
    """A torch operator tritonkit replaces: its OpInfo (op_db's ``name`` and
    ``variant_test_name``), the tritonkit function called in its place and the OpSpec whose
    tolerance judges the answer. ``call`` turns a sample into the tritonkit call's (args,
    kwargs), or says why the sample is left out. ``dtypes``: the sample dtypes instead of
    DTYPES (``cuda_only``: there alone). ``slow_on_cpu``: a row whose samples take the
    interpreter a minute runs in the full tier only (``slow``) there. ``torch_same``: how
    PyTorch's answer in the sample's dtype is computed, where its default kernel is not of the
    tritonkit function's accuracy class (None: the OpInfo's op); the float64 reference is
    always the OpInfo's op."""

    opinfo: str
    tritonkit: str
    spec: str
    variant: str = ""
    call: Callable[[Any], tuple[tuple, dict] | str] = _call_as_torch
    dtypes: tuple[torch.dtype, ...] | None = None
    cuda_only: bool = False
    slow_on_cpu: bool = False  # under the interpreter: the full tier only
    torch_same: Callable | None = None  # PyTorch's same-dtype answer (None: the OpInfo's op)

    @property
    def id(self) -> str:
        return self.opinfo + (f"[{self.variant}]" if self.variant else "")


# One row per torch operator a tritonkit function replaces (test_every_public_function_is_covered
# asks for each public function).
REPLACED = (
    Replaced("add", "add", "add"),
    Replaced("softmax", "softmax", "softmax"),
    Replaced("softmax", "softmax", "softmax", variant="with_dtype"),
    Replaced("log_softmax", "log_softmax", "log_softmax"),
    Replaced("log_softmax", "log_softmax", "log_softmax", variant="with_dtype"),
    Replaced("nn.functional.cross_entropy", "cross_entropy", "cross_entropy"),
    Replaced(
        "nn.functional.scaled_dot_product_attention",
        "attention",
        "attention",
        call=_without_dropout,
        slow_on_cpu=True,
        torch_same=_sdpa_flash_class,
    ),
    Replaced("nn.functional.layer_norm", "layer_norm", "layer_norm"),
    Replaced("nn.functional.rms_norm", "rms_norm", "rms_norm"),
    Replaced("nn.functional.gelu", "gelu", "gelu"),
    Replaced("nn.functional.silu", "silu", "silu"),
    Replaced("nn.functional.relu", "relu", "relu"),
    Replaced("nn.functional.conv2d", "conv2d", "conv2d", slow_on_cpu=True),
    Replaced("nn.functional.linear", "linear", "linear"),
    Replaced("matmul", "matmul", "matmul"),
    Replaced("mm", "matmul", "matmul"),
    Replaced("bmm", "matmul", "matmul"),
    Replaced("clone", "copy", "copy"),
    Replaced("t_copy", "transpose", "transpose"),
    Replaced("transpose_copy", "transpose", "transpose", call=_last_two_dims),
    Replaced(
        "torch._scaled_mm",
        "scaled_matmul",
        "scaled_matmul",
        call=_scaled_mm,
        dtypes=(torch.float8_e4m3fn,),
        cuda_only=True,
    ),
)

# Public functions with no torch operator (or none with an OpInfo) to hold them to.
NO_OPINFO = {
    "add_layer_norm": "the residual add and the norm fused: no single torch operator",
    "add_rms_norm": "the residual add and the norm fused: no single torch operator",
    "attention_varlen": "flash-attn's flash_attn_varlen_func: no torch operator",
    "bias_act": "act(x + bias) fused: no single torch operator",
    "swiglu": "silu(gate) * up fused: no single torch operator",
    "geglu": "gelu(gate) * up fused: no single torch operator",
    "rope": "rotary embedding: no torch operator",
    "int8_matmul": "torch._int_mm has no OpInfo",
}


# ---- refusals ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    """A kind of call tritonkit refuses where PyTorch computes: the error's type and a pattern
    its message matches (the function and the argument named). ``kind`` is its name in
    docs/reference.md's "Refused calls" table, which gives the reason."""

    kind: str
    error: type[Exception]
    message: str

    def matches(self, exc: Exception) -> bool:
        return isinstance(exc, self.error) and re.search(self.message, str(exc)) is not None


REFUSALS = (
    Refusal("add: alpha", ValueError, r"^tritonkit\.add: alpha must be 1\b"),
    Refusal(
        "softmax: dtype=float64",
        TypeError,
        r"^tritonkit\.(log_)?softmax: dtype must be float32, float16 or bfloat16 or None, "
        r"got float64",
    ),
    Refusal(
        "attention: attn_mask requiring grad",
        ValueError,  # UnsupportedAttention, which sdpa_patch(fallback=True) hands to torch
        r"^tritonkit\.attention: attn_mask must not require grad",
    ),
    Refusal("norms: negative eps", ValueError, r"^tritonkit\.(layer|rms)_norm: eps must be >= 0"),
    Refusal(
        "transpose: fewer than 2 dims",
        ValueError,
        r"^tritonkit\.transpose: x must have at least 2 dimensions",
    ),
    Refusal(
        "scaled_matmul: float8 output",
        TypeError,
        r"^tritonkit\.scaled_matmul: out_dtype must be one of .*, got float8",
    ),
    Refusal(
        "optim: capturable",
        ValueError,
        r"^tritonkit\.optim\.Adam(W)?: capturable=True needs nonfinite='skip' or 'propagate'",
    ),
)


@dataclass(frozen=True)
class Awaiting:
    """Samples refused today that work in progress makes pass: ``applies`` picks them, the
    error is the refusal they meet now."""

    opinfo: str
    what: str
    applies: Callable[[Any], bool]
    error: type[Exception]
    message: str


# Samples refused today that work in progress will make pass. Empty: soft-target and
# K-dimensional cross_entropy have landed and their samples pass. While a row is here, a sample
# it picks that passes fails the test (saying to remove the row), so a flip is not forgotten.
AWAITING: tuple[Awaiting, ...] = ()


# ---- running a sample ----------------------------------------------------------------------------


def _map(x: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_map(v, fn) for v in x)
    if isinstance(x, dict):
        return {k: _map(v, fn) for k, v in x.items()}
    return x


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    return []


def _fresh(args: Any, float64: bool = False) -> Any:
    """New leaves for one run (the same storage: detach() keeps every layout, clone() would make
    an expanded input contiguous); with ``float64`` floating tensors upcast."""

    def leaf(t: torch.Tensor) -> torch.Tensor:
        u = t.detach()
        if float64 and u.is_floating_point():
            u = u.double()
        return u.requires_grad_(t.requires_grad)

    return _map(args, leaf)


def _forward(fn, args, kwargs, process) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(the outputs, the leaves that require grad) of one run on fresh leaves."""
    args, kwargs = _fresh(args), _fresh(kwargs)
    outs = _tensors(process(fn(*args, **kwargs)))
    return outs, [t for t in _tensors((args, kwargs)) if t.requires_grad]


def _backward(outs, leaves, grads_out) -> list[torch.Tensor]:
    """The leaves' gradients for output gradients ``grads_out``; zeros for a leaf the outputs do
    not depend on (autograd's None)."""
    pairs = [(o, g) for o, g in zip(outs, grads_out) if o.requires_grad]
    if not pairs or not leaves:
        return []
    grads = torch.autograd.grad(
        [o for o, _ in pairs], leaves, [g for _, g in pairs], allow_unused=True
    )
    return [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, grads)]


def _describe(sample) -> str:
    def one(x: Any) -> str:
        if isinstance(x, torch.Tensor):
            return f"{_name(x.dtype)}{list(x.shape)}"
        if isinstance(x, (list, tuple)):
            return "(" + ", ".join(one(v) for v in x) + ")"
        return repr(x)

    parts = [one(v) for v in (sample.input, *sample.args)]
    parts += [f"{k}={one(v)}" for k, v in sample.kwargs.items()]
    return f"({', '.join(parts)})"


def _refusal(row: Replaced, sample, exc: Exception) -> str:
    """The outcome of a refused call: which AWAITING row or REFUSALS kind it is; else the test
    fails (a refusal nobody documented)."""
    for a in AWAITING:
        if (
            a.opinfo == row.opinfo
            and a.applies(sample)
            and isinstance(exc, a.error)
            and re.search(a.message, str(exc))
        ):
            return f"awaiting: {a.what}"
    for r in REFUSALS:
        if r.matches(exc):
            return f"refused: {r.kind}"
    raise AssertionError(f"refused with an error REFUSALS does not list: {exc!r}") from exc


def run_sample(row: Replaced, sample, dtype: torch.dtype) -> str:
    """What one sample gives: "passed", "refused: <kind>", "awaiting: <what>" or "left out:
    <reason>"; a crash or a wrong answer raises AssertionError saying which."""
    call = row.call(sample)
    if isinstance(call, str):
        return f"left out: {call}"
    args, kwargs = call
    torch_op, process = row_op(row).op, sample.output_process_fn_grad
    torch_args = (sample.input, *sample.args)
    try:
        ours, ours_leaves = _forward(getattr(tritonkit, row.tritonkit), args, kwargs, process)
    except (TypeError, ValueError, NotImplementedError) as exc:
        return _refusal(row, sample, exc)
    except Exception as exc:
        raise AssertionError(f"crashed: {exc!r}") from exc
    awaiting = [a.what for a in AWAITING if a.opinfo == row.opinfo and a.applies(sample)]
    if awaiting:
        raise AssertionError(f"passes now: remove {awaiting} from AWAITING")
    try:
        same, same_leaves = _forward(row.torch_same or torch_op, torch_args, sample.kwargs, process)
    except Exception as exc:
        raise AssertionError(f"returned a result where PyTorch raises {exc!r}") from exc
    shapes = [(tuple(t.shape), t.dtype) for t in ours_leaves]
    assert shapes == [(tuple(t.shape), t.dtype) for t in same_leaves], "the call's tensors moved"
    gen = torch.Generator(device=sample.input.device).manual_seed(SEED)
    grads_out = [
        torch.randn(o.shape, generator=gen, device=o.device).to(o.dtype)
        if o.is_floating_point()
        else None
        for o in same
    ]
    if len(ours) != len(same):
        raise AssertionError(f"{len(ours)} outputs, PyTorch gives {len(same)}")
    for i, (o, s) in enumerate(zip(ours, same)):
        if o.shape != s.shape or o.dtype != s.dtype:
            raise AssertionError(
                f"output {i} is {_name(o.dtype)}{list(o.shape)}, PyTorch's "
                f"{_name(s.dtype)}{list(s.shape)}"
            )
    try:
        ours_grads = _backward(ours, ours_leaves, grads_out)
    except Exception as exc:
        raise AssertionError(f"backward crashed: {exc!r}") from exc
    same_grads = _backward(same, same_leaves, grads_out)
    ref, ref_grads = _reference(torch_op, torch_args, sample, grads_out, same, same_grads)
    spec = get_spec(row.spec)
    if row.torch_same is not None:
        # The stand-in for PyTorch's answer must compute the same function, since it excuses
        # errors up to its own: its output within a few 16-bit units (relative L2) of the
        # float64 reference (another function is off by O(1)).
        for t, r in zip(same, ref):
            err = _rel(t, r)
            assert err <= 2.0**-5, f"torch_same is off the float64 reference by {err:.3g}"
    tolerance = _torch_tolerance(row_op(row), dtype, sample.input.device)
    for what, got, exact, theirs, is_grad in (
        ("output", ours, ref, same, False),
        ("gradients", ours_grads, ref_grads, same_grads, True),
    ):
        if not got:
            continue
        # PyTorch's own bar first: its answer, within the tolerance its OpInfo tests hold two of
        # its own kernels to (TestCommon's, e.g. CUDA against CPU).
        try:
            for o, t in zip(got, theirs):
                torch.testing.assert_close(o, t, equal_nan=True, **tolerance)
            continue
        except AssertionError as exc:
            against_torch = [line for line in str(exc).splitlines() if line.strip()]
        # Where PyTorch's answer is itself a rounding artifact (a 1-element layer_norm row's
        # weight gradient: exactly 0, PyTorch's float32 kernel -3.7e-5), the float64 reference
        # decides, with the operator's spec tolerance (PyTorch's own error its yardstick).
        outcome = compare(got, exact, theirs, spec.tolerance_or_none(dtype, grad=is_grad))
        if not outcome.passed:
            raise AssertionError(
                f"{what} differ from PyTorch's ({'; '.join(against_torch[:4])}) and from the "
                f"float64 reference ({outcome.detail})"
            )
    return "passed"


def _torch_tolerance(op, dtype: torch.dtype, device: torch.device) -> dict[str, float]:
    """The atol and rtol PyTorch's OpInfo tests compare two of its kernels with in ``dtype``:
    the operator's TestCommon override for all its tests (or test_compare_cpu) on this device
    type; else none given, assert_close's defaults (float32: 1e-5 + 1.3e-6 |x|)."""
    from torch.testing._internal.common_device_type import toleranceOverride

    for info in op.decorators:
        if (
            getattr(info, "cls_name", None) == "TestCommon"
            and getattr(info, "test_name", None) in (None, "test_compare_cpu")
            and getattr(info, "device_type", None) in (None, device.type)
        ):
            for d in info.decorators:
                if isinstance(d, toleranceOverride) and dtype in d.d:
                    return {"atol": d.d[dtype].atol, "rtol": d.d[dtype].rtol}
    return {}


def _reference(torch_op, torch_args, sample, grads_out, same, same_grads):
    """PyTorch's outputs and gradients on the sample upcast to float64 (the same output
    gradients, upcast); where the operator has no float64 kernel (FP8 operands), its same-dtype
    answer stands in."""
    try:
        outs, leaves = _forward(
            torch_op, _fresh(torch_args, True), _fresh(sample.kwargs, True),
            sample.output_process_fn_grad,
        )  # fmt: skip
    except (RuntimeError, NotImplementedError, TypeError):
        return [t.double() for t in same], [t.double() for t in same_grads]
    grads64 = [g if g is None else g.double() for g in grads_out]
    return outs, _backward(outs, leaves, grads64)


# ---- the OpInfo database, loaded once and only when a test of this module runs ---------------


_DB: dict[str, Any] = {}


def row_op(row: Replaced):
    """The OpInfo of ``row`` (importing op_db takes seconds: once, when the first test runs)."""
    if "ops" not in _DB:
        from torch.testing._internal.common_methods_invocations import op_db

        _DB["ops"] = {(op.name, op.variant_test_name): op for op in op_db}
    return _DB["ops"][(row.opinfo, row.variant)]


def _samples(row: Replaced, device: torch.device, dtype: torch.dtype) -> list:
    op = row_op(row)
    torch.manual_seed(SEED)
    random.seed(SEED)  # torch._scaled_mm's samples draw their scales with random.random
    grad = op.supports_autograd and dtype.is_floating_point and dtype.itemsize > 1
    return list(op.sample_inputs(device, dtype, requires_grad=grad))


def _cases():
    for row in REPLACED:
        if row.cuda_only and not CUDA:
            continue
        marks = [pytest.mark.slow] if row.slow_on_cpu and not CUDA else []
        for dtype in row.dtypes or DTYPES:
            yield pytest.param(row, dtype, id=f"{row.id}-{_name(dtype)}", marks=marks)


@pytest.mark.parametrize("row, dtype", list(_cases()))
def test_opinfo_samples(row: Replaced, dtype: torch.dtype, device):
    samples = _samples(row, device, dtype)
    assert samples, f"{row.id}: OpInfo gives no samples"
    outcomes: Counter = Counter()
    failures = []
    for i, sample in enumerate(samples):
        try:
            outcomes[run_sample(row, sample, dtype)] += 1
        except AssertionError as exc:
            failures.append(f"  sample {i} {_describe(sample)}: {exc}")
    counts = ", ".join(f"{n} {what}" for what, n in sorted(outcomes.items()))
    where = f"{_name(dtype)} on {_device_name(device)}"
    print(f"\n{row.id} -> tritonkit.{row.tritonkit}, {where}: {counts}")
    report = "\n".join(failures)
    assert not failures, f"{row.id} {_name(dtype)}: {len(failures)} of {len(samples)}:\n{report}"


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (interpreter)"


def test_every_public_function_is_covered():
    """Each public function has a row in REPLACED or a reason in NO_OPINFO; each row names a
    public function, an OpInfo name (checked when its test runs) and a spec."""
    functions = {n for n in tritonkit.__all__ if n not in tritonkit._SUBMODULES}
    covered = {row.tritonkit for row in REPLACED}
    missing = functions - covered - set(NO_OPINFO)
    assert not missing, f"add a row to REPLACED (or a reason to NO_OPINFO) for: {missing}"
    assert covered <= functions and set(NO_OPINFO) <= functions
    assert not covered & set(NO_OPINFO)
    for row in REPLACED:
        get_spec(row.spec)


def test_every_refusal_is_documented():
    """docs/reference.md's "Refused calls" section lists each kind, with its reason."""
    text = DOCS.read_text()
    start = text.index("### Refused calls")
    section = text[start : text.index("\n## ", start)]
    undocumented = [r.kind for r in REFUSALS if f"| {r.kind} |" not in section]
    assert not undocumented, f"docs/reference.md, Refused calls: no row for {undocumented}"
    for a in AWAITING:
        assert f"| {a.opinfo.removeprefix('nn.functional.')}: {a.what} |" in section, a.what


# ---- optimizers: optim_db's configurations ------------------------------------------------------

# optim_db's optimizer class name -> tritonkit.optim's class.
OPTIMIZERS = ("Adam", "AdamW")
STEPS = 4
# Parameters of an MLP layer and more: a matrix, a vector, a 3-d tensor, one element (about
# 700 elements: enough for a stable relative error of the 16-bit runs).
SHAPES = ((33, 17), (17,), (3, 5, 7), (1,))


def _optim_info(name: str):
    from torch.testing._internal.common_optimizers import optim_db

    return next(info for info in optim_db if info.optim_cls.__name__ == name)


def _steps(cls, kwargs: dict, params: list[torch.Tensor], grads: list[list[torch.Tensor]]):
    """The parameters after each of the steps, ``cls`` stepping copies of ``params`` with
    ``grads`` (one list per step)."""
    ps = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt = cls(ps, **kwargs)
    history = []
    for step in grads:
        for p, g in zip(ps, step):
            p.grad = g.clone()
        opt.step()
        history.append([p.detach().clone() for p in ps])
    return history


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_optim_db_configurations(name: str, dtype: torch.dtype, device):
    """Each of optim_db's configurations of ``name``, four steps on the same gradients as
    torch.optim's: float32 parameters within 1e-6 (relative L2) of torch's after every step
    (the same operations in the same order, test_optim's bound); 16-bit ones no further from
    torch's float64 run than 1.25x torch's own (torch rounds after every operation, tritonkit
    once; test_optim's bound)."""
    info = _optim_info(name)
    ours_cls, torch_cls = getattr(tritonkit.optim, name), info.optim_cls
    gen = torch.Generator(device=device).manual_seed(SEED)
    params = [torch.randn(s, generator=gen, device=device).to(dtype) for s in SHAPES]
    grads = [
        [torch.randn(s, generator=gen, device=device).to(dtype) for s in SHAPES]
        for _ in range(STEPS)
    ]
    outcomes: Counter = Counter()
    failures = []
    for config in info.optim_inputs_func(device=device, dtype=dtype):
        where = f"{config.desc} {config.kwargs}"
        try:
            ours = _steps(ours_cls, config.kwargs, params, grads)
        except (TypeError, ValueError, NotImplementedError) as exc:
            kinds = [r.kind for r in REFUSALS if r.matches(exc)]
            if kinds:
                outcomes[f"refused: {kinds[0]}"] += 1
            else:
                failures.append(f"  {where}: refused with an error REFUSALS does not list: {exc!r}")
            continue
        except Exception as exc:
            failures.append(f"  {where}: crashed: {exc!r}")
            continue
        theirs = _steps(torch_cls, config.kwargs, params, grads)
        exact = _steps(
            torch_cls,
            config.kwargs,
            [p.double() for p in params],
            [[g.double() for g in step] for step in grads],
        )
        wrong = []
        for step, (o, t, e) in enumerate(zip(ours, theirs, exact)):
            a, b, c = (torch.cat([x.flatten() for x in ps]) for ps in (o, t, e))
            if dtype == torch.float32:
                ok, err = _rel(a, b) <= 1e-6, f"{_rel(a, b):.3g} from torch's"
            else:
                ok = _rel(a, c) <= 1.25 * _rel(b, c)
                err = f"{_rel(a, c):.3g} from float64's, torch's {_rel(b, c):.3g}"
            if not (ok and torch.isfinite(a).all()):
                wrong.append(f"  {where}: step {step + 1}: parameters {err} (relative L2)")
        failures += wrong
        outcomes["passed"] += not wrong
    counts = ", ".join(f"{n} {what}" for what, n in sorted(outcomes.items()))
    print(f"\noptim_db {name} -> tritonkit.optim.{name}, {_name(dtype)}: {counts}")
    report = "\n".join(failures)
    assert not failures, f"{name} {_name(dtype)}:\n{report}"
