"""Specs of the quantization family: quantize (codes and scales, bit for bit against the float64
reference of the same rounding), the quantize-dequantize round trip, the weight-only int8
linear and the float8 linear (forward and backward against an emulation of its casts).

The quantize specs' outputs are codes (int8, packed int4, float8) and float32 scales: the check
engine compares integer outputs exactly and float outputs with a zero tolerance here. Their
``torch`` baseline is the same cast in plain PyTorch (what a user writes without a kernel:
amax, scale, multiply, clamp, cast), and ``torch.compile`` compiles it.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from tritonkit.harness.spec import Baseline, OpSpec, Shapes, Tolerance, Unavailable, register
from tritonkit.ops.quant.config import get_format
from tritonkit.ops.quant.function import call_weight_only, float8_linear
from tritonkit.quant import reference as R
from tritonkit.quant.tensor import dequantize, granularity_block, quantize
from tritonkit.specs._common import generator, nbytes, randn, torch_baselines

FAMILY = "quant"
EXACT = {d: Tolerance(atol=0.0, rtol=0.0) for d in (torch.float32, torch.float16, torch.bfloat16)}
E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2

# The formats x granularities every check runs; the first is the one timed.
QUANT_PARAMS = (
    {"dtype": E4, "granularity": "row"},
    {"dtype": torch.int8, "granularity": "row"},
    {"dtype": E4, "granularity": "group", "group_size": 8},
    {"dtype": torch.int8, "granularity": "group", "group_size": 8, "symmetric": False},
    {"dtype": E4, "granularity": "tensor"},
    {"dtype": E5, "granularity": "column"},
    {"dtype": torch.int8, "granularity": "tensor", "bits": 4},
)
QUANT_BENCH_PARAMS = (
    {"dtype": E4, "granularity": "row"},
    {"dtype": torch.int8, "granularity": "row"},
    {"dtype": E4, "granularity": "group", "group_size": 128},
    {"dtype": torch.int8, "granularity": "group", "group_size": 128},
    {"dtype": E4, "granularity": "tensor"},
    {"dtype": torch.int8, "granularity": "tensor"},
)


def _inputs(shape, dtype, device, seed):
    return (randn(shape, dtype, device, generator(device, seed)) * 3,)


def _quantize_impl(x, dtype, granularity, group_size=None, symmetric=True, bits=8):
    q = quantize(x, dtype, granularity, group_size=group_size, symmetric=symmetric, bits=bits)
    return (q.data, q.scale) if q.zero_point is None else (q.data, q.scale, q.zero_point)


def _fmt_block(x, dtype, granularity, group_size, symmetric, bits):
    fmt = get_format(dtype, bits, symmetric)
    return fmt, granularity_block(tuple(x.shape), granularity, group_size)


def _quantize_ref(x, dtype, granularity, group_size=None, symmetric=True, bits=8):
    fmt, block = _fmt_block(x, dtype, granularity, group_size, symmetric, bits)
    codes, scale, zp = R.quantize(x, fmt, block)
    if fmt.packed:
        codes = R.pack_int4(codes)
    if fmt.is_float and x.dtype == torch.float64:  # the upcast call: values, not float8
        codes = codes.double()
    out = (codes.to(x.device), scale.to(x.device))
    return out if zp is None else (*out, zp.to(x.device))


def _roundtrip_impl(x, **params):
    fmt_kw = {k: v for k, v in params.items() if k != "dtype"}
    return dequantize(quantize(x, params["dtype"], **fmt_kw), torch.float32)


def _roundtrip_ref(x, dtype, granularity, group_size=None, symmetric=True, bits=8):
    fmt, block = _fmt_block(x, dtype, granularity, group_size, symmetric, bits)
    codes, scale, zp = R.quantize(x, fmt, block)
    return R.dequantize(codes, scale, zp, block, torch.float32).to(x.device)


def _torch_cast(x, dtype, granularity, group_size=None, symmetric=True, bits=8):
    """The cast in plain PyTorch (symmetric formats): amax over the block, scale, clamp, cast."""
    fmt, block = _fmt_block(x, dtype, granularity, group_size, symmetric, bits)
    xf = x.float()
    dims = [n for d, b in zip(x.shape, block) for n in (d // b, b)]
    a = xf.reshape(dims).abs()
    for axis in range(len(block) * 2 - 1, 0, -2):
        a = a.amax(axis, keepdim=True)
    qscale = fmt.qmax / a.clamp(min=1e-12)
    v = (xf.reshape(dims) * qscale).clamp(fmt.qmin, fmt.qmax)
    codes = v.to(fmt.storage) if fmt.is_float else v.round().to(torch.int8)
    return codes.reshape(x.shape), (1 / qscale).reshape([d // b for d, b in zip(x.shape, block)])


def _torchao_cast():
    """torchao's cast of the same granularity (float8 per row or tensor; int8 symmetric)."""
    try:
        from torchao.float8.config import ScalingGranularity
        from torchao.float8.float8_utils import tensor_to_scale, to_fp8_saturated
        from torchao.quantization.quant_primitives import (
            MappingType,
            choose_qparams_affine,
            quantize_affine,
        )
    except Exception as exc:
        raise Unavailable(f"torchao not importable: {type(exc).__name__}") from None

    def run(x, dtype, granularity, group_size=None, symmetric=True, bits=8):
        block = granularity_block(tuple(x.shape), granularity, group_size)
        if dtype in (E4, E5) and granularity in ("row", "tensor"):
            g = (
                ScalingGranularity.AXISWISE
                if granularity == "row"
                else ScalingGranularity.TENSORWISE
            )
            s = tensor_to_scale(x, dtype, scaling_granularity=g, axiswise_dim=-1)
            return to_fp8_saturated(x.float() * s, dtype), s
        if dtype == torch.int8 and symmetric and bits == 8:
            s, z = choose_qparams_affine(x, MappingType.SYMMETRIC, block, torch.int8)
            return quantize_affine(x, block, s, z, torch.int8), s
        raise NotImplementedError(f"no torchao equivalent timed for {dtype} {granularity}")

    return run


def _torch_roundtrip(x, dtype, granularity, group_size=None, symmetric=True, bits=8):
    codes, scale = _torch_cast(x, dtype, granularity, group_size, symmetric, bits)
    _, block = _fmt_block(x, dtype, granularity, group_size, symmetric, bits)
    dims = [n for d, b in zip(x.shape, block) for n in (d // b, b)]
    s = scale.reshape([n if i % 2 == 0 else 1 for i, n in enumerate(dims)])
    return (codes.float().reshape(dims) * s).reshape(x.shape)


def _quantize_bytes(inputs, mode, dtype, granularity, group_size=None, symmetric=True, bits=8):
    """Read x (twice where a scale needs an amax pass first: per tensor, per column), write the
    codes and the scales."""
    x = inputs[0]
    fmt, block = _fmt_block(x, dtype, granularity, group_size, symmetric, bits)
    n = x.numel()
    scales = n // max(1, functools.reduce(lambda a, b: a * b, block, 1))
    reads = 2 if granularity in ("tensor", "column") else 1
    codes = n // 2 if fmt.packed else n
    return reads * nbytes(x) + codes + scales * (4 if symmetric else 8)


register(
    OpSpec(
        name="quantize",
        check_cost=4.5,  # an amax pass, a cast pass and the scales per case (the estimate)
        family=FAMILY,
        impl=_quantize_impl,
        reference=_quantize_ref,
        make_inputs=_inputs,
        shapes=Shapes(test=[(37, 96), (3, 5, 40)], bench=[(16384, 8192)], empty=[(0, 16)]),
        bytes=_quantize_bytes,
        params=QUANT_PARAMS,
        tolerance=EXACT,
        backward=False,
        bench_dtypes=(torch.bfloat16,),
        baselines={
            **torch_baselines(_torch_cast),
            "torchao": Baseline(
                "torchao",
                _torchao_cast,
                backward=False,
                description="torchao's float8 / int8 casts (tensor_to_scale, quantize_affine)",
            ),
        },
        description="amax, scale and saturating cast fused: int8, int4, float8 at any granularity",
    )
)

register(
    OpSpec(
        name="quantize_dequantize",
        check_cost=4.5,  # an amax pass, a cast pass and the scales per case (the estimate)
        family=FAMILY,
        impl=_roundtrip_impl,
        reference=_roundtrip_ref,
        make_inputs=_inputs,
        shapes=Shapes(test=[(37, 96), (3, 5, 40)], bench=[(16384, 8192)], empty=[(0, 16)]),
        bytes=lambda inputs, mode, **p: _quantize_bytes(inputs, mode, **p) + inputs[0].numel() * 5,
        baselines=torch_baselines(_torch_roundtrip),
        params=QUANT_PARAMS,
        tolerance=EXACT,
        backward=False,
        bench_dtypes=(torch.bfloat16,),
        description="dequantize(quantize(x)) in float32: the reference of the same rounding",
    )
)


# ---- weight-only int8 linear -------------------------------------------------------------------


def _wo_inputs(shape, dtype, device, seed):
    m, n, k = shape
    g = generator(device, seed)
    x = randn((m, k), dtype, device, g)
    w = torch.randint(-127, 128, (n, k), generator=g, device=device, dtype=torch.int8)
    scale = (torch.rand(n, generator=g, device=device) + 0.5) / (127 * k**0.5)
    bias = randn((n,), dtype, device, g)
    return x, w, scale, bias


def _wo_ref(x, w, scale, bias):
    return (x @ (w.to(x.dtype) * scale.to(x.dtype)[:, None]).t() + bias).to(x.dtype)


def _wo_bf16_baseline():
    cache: dict[int, torch.Tensor] = {}

    def run(x, w, scale, bias):  # the bf16 nn.Linear a user would keep instead
        key = id(w)
        if key not in cache:
            cache[key] = (w.to(torch.float32) * scale[:, None]).to(x.dtype)
        return torch.nn.functional.linear(x, cache[key], bias)

    return run


register(
    OpSpec(
        name="int8_weight_only_linear",
        family=FAMILY,
        impl=lambda x, w, scale, bias: call_weight_only(x, w, scale, bias),
        reference=_wo_ref,
        make_inputs=_wo_inputs,
        shapes=Shapes(
            test=[(1, 40, 96), (5, 33, 200), (70, 24, 64)],
            bench=[(1, 8192, 8192), (4, 8192, 8192), (16, 8192, 8192)],
        ),
        bytes=lambda inputs, mode, **p: nbytes(*inputs) + inputs[0].shape[0] * inputs[1].shape[0]
        * inputs[0].element_size(),
        flops=lambda inputs, mode, **p: 2 * inputs[0].shape[0] * inputs[1].numel(),
        dtypes=(torch.float32, torch.float16, torch.bfloat16),
        bench_dtypes=(torch.bfloat16,),
        tolerance={
            torch.float32: Tolerance(atol=1e-5, rtol=1e-5),
            torch.float16: Tolerance(atol=1e-3, rtol=1e-3, torch_factor=2.0),
            torch.bfloat16: Tolerance(atol=8e-3, rtol=8e-3, torch_factor=2.0),
        },
        backward=False,
        special_values=False,
        compute="tensor",
        baselines={**torch_baselines(_wo_ref),
                   "bf16 linear": Baseline("bf16 linear", _wo_bf16_baseline,
                                           description="F.linear with the dequantized weight")},
        description="weight-only int8 linear (decode): W read as int8, widened in registers",
    )
)  # fmt: skip


# ---- float8 linear (training) ------------------------------------------------------------------


def _deq64(t, dtype, block, pow2):
    fmt = get_format(dtype)
    codes, scale, zp = R.quantize(t, fmt, block, pow2)
    return R.dequantize(codes, scale, zp, block, torch.float64).to(t.device)


class _EmulatedFloat8Linear(torch.autograd.Function):
    """Float8Linear's casts emulated exactly, its GEMMs in float64 (the spec's reference)."""

    @staticmethod
    def forward(ctx, x, w, b, scaling):
        m, k = x.shape
        n = w.shape[0]
        ctx.save_for_backward(x, w)
        ctx.scaling = scaling
        if scaling == "tensorwise":
            xh, wh = _deq64(x, E4, (m, k), False), _deq64(w, E4, (n, k), False)
        else:
            xh, wh = _deq64(x, E4, (1, k), True), _deq64(w, E4, (1, k), True)
        return (xh @ wh.t() + b.double()).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        m, k = x.shape
        n = w.shape[0]
        if ctx.scaling == "tensorwise":
            gh = _deq64(dy, E5, (m, n), False)
            dx, dw = gh @ _deq64(w, E4, (n, k), False), gh.t() @ _deq64(x, E4, (m, k), False)
        else:
            dx = _deq64(dy, E4, (1, n), True) @ _deq64(w, E4, (n, 1), True)
            dw = _deq64(dy, E4, (m, 1), True).t() @ _deq64(x, E4, (m, 1), True)
        return dx.to(x.dtype), dw.to(w.dtype), dy.double().sum(0).to(dy.dtype), None


def _f8_inputs(shape, dtype, device, seed):
    m, n, k = shape
    g = generator(device, seed)
    return (randn((m, k), dtype, device, g), randn((n, k), dtype, device, g) * k**-0.5,
            randn((n,), dtype, device, g))  # fmt: skip


def _f8_ref(x, w, b, scaling="tensorwise"):
    return _EmulatedFloat8Linear.apply(x, w, b, scaling)


register(
    OpSpec(
        name="float8_linear",
        check_cost=3.0,  # three GEMMs and their quantization per case (the run's estimate)
        family=FAMILY,
        impl=lambda x, w, b, scaling="tensorwise": float8_linear(x, w, b, scaling),
        reference=_f8_ref,
        make_inputs=_f8_inputs,
        shapes=Shapes(test=[(37, 40, 48), (16, 24, 80)], bench=[(16384, 14336, 4096)]),
        bytes=lambda inputs, mode, **p: nbytes(*inputs) * (1 if mode == "fwd" else 3),
        flops=lambda inputs, mode, **p: 2 * inputs[0].shape[0] * inputs[1].numel()
        * {"fwd": 1, "bwd": 2, "fwd+bwd": 3}[mode],
        params=({"scaling": "tensorwise"}, {"scaling": "rowwise"}),
        dtypes=(torch.float32, torch.float16, torch.bfloat16),
        bench_dtypes=(torch.bfloat16,),
        tolerance={
            torch.float32: Tolerance(atol=1e-5, rtol=1e-4),
            torch.float16: Tolerance(atol=2e-3, rtol=2e-3),
            torch.bfloat16: Tolerance(atol=1.6e-2, rtol=1.6e-2),
        },
        grad_inputs=(0, 1, 2),
        special_values=False,
        compute="tensor",
        baselines=torch_baselines(lambda x, w, b, scaling="tensorwise": F.linear(x, w, b)),
        description="FP8 training linear (torchao recipes): FP8 GEMMs forward and backward",
    )
)  # fmt: skip
