"""Specs of the matmul family: matmul (with its evolution of variants), linear with a fused
epilogue, the FP8 scaled GEMM and the INT8 GEMM.

Tolerances. The check engine bounds each element by ``atol + rtol * |ref|`` against a float64
reference. A dot product of length K accumulated in fp32 errs by about ``sqrt(K) * 2**-24``
times the size of its partial sums, so with raw standard-normal operands the bound would have
to grow with K. Instead the inputs are drawn so that every output has unit variance whatever
K (B, or the scales, carry a ``1/sqrt(K)``): then the accumulation error is at most a few
``sqrt(K) * 2**-24`` (7e-6 at K = 14336), rounding the output costs at most half a unit in its
last place, and one tolerance per dtype holds from the CPU test shapes to the GPU bench shapes:
``rtol`` = one unit in the last place (twice the rounding bound) and an ``atol`` well above the
accumulation error. The acceptance bounds (relative L2 <= 1e-2 for 16-bit at K = 8192, 2e-3
for TF32) are far looser; ``experiments/sweep_matmul.py`` measures them directly. The float32
bound assumes PyTorch's default (TF32 off); with TF32 on, products carry 2**-11 relative
errors and the float32 checks would need ``atol ~ 3e-3``.
"""

import functools
import math

import torch
import torch.nn.functional as F

from tritonkit.harness.spec import Baseline, OpSpec, Shapes, Tolerance, Unavailable, register
from tritonkit.ops.matmul import (
    VARIANTS,
    int8_matmul,
    linear,
    matmul,
    matmul_shape,
    matmul_variant,
    scaled_matmul,
    scaled_matmul_fwd,
)
from tritonkit.specs._common import generator, nbytes, randn, torch_baselines

FAMILY = "matmul"

# One unit in the last place of each output dtype (see the module docstring).
MATMUL_TOLERANCE = {
    torch.float32: Tolerance(atol=1e-4, rtol=1e-5),
    torch.float16: Tolerance(atol=1e-4, rtol=2.0**-10),
    torch.bfloat16: Tolerance(atol=1e-4, rtol=2.0**-7),
}
# Gradients of 16-bit GEMMs pass through a 16-bit intermediate (dC, or linear's dZ = dY *
# act'(Z), rounded as PyTorch rounds it): its rounding, 2**-11 (fp16) or 2**-8 (bf16) of each
# term, does not cancel where the gradient does, so elements near zero need an atol of a few
# such units times the typical gradient (at most ~4 at the test shapes).
MATMUL_GRAD_TOLERANCE = {
    torch.float32: Tolerance(atol=1e-4, rtol=1e-5),
    torch.float16: Tolerance(atol=1e-2, rtol=2.0**-9),
    torch.bfloat16: Tolerance(atol=8e-2, rtol=2.0**-6),
}
# FP8 and INT8 GEMMs write bfloat16: one unit in its last place. FP8 on Hopper keeps partial
# sums in the tensor cores' ~14-bit accumulator, which truncates, between promotions to fp32
# (ops/matmul/configs.py, PROMOTE_PER_BLOCK): the error of an output grows with the K elements
# summed between promotions, and is largest relative to outputs near zero. The atol covers
# the worst element error of the default tile's promotion every 2048 K elements on unit-variance
# outputs (see docs/performance.md); the acceptance criterion is the relative L2 error at most
# 1.5x PyTorch's (max_ratio; its float32 product rounded once has the error of
# torch._scaled_mm).
LOW_PRECISION_TOLERANCE = {
    torch.float8_e4m3fn: Tolerance(atol=1.2e-2, rtol=2.0**-7, max_ratio=1.5),
    torch.float8_e5m2: Tolerance(atol=1.2e-2, rtol=2.0**-7, max_ratio=1.5),
    torch.int8: Tolerance(atol=1e-4, rtol=2.0**-7),
}

# Acceptance shapes: squares, and the LLM projections (M = 8192 tokens; N, K in the hidden and
# MLP sizes of 7B-class models).
SQUARES = [(4096, 4096, 4096), (8192, 8192, 8192)]
LLM_SHAPES = [(8192, n, k) for n in (4096, 11008, 14336) for k in (4096, 11008, 14336)]


def _scaled_randn(shape, scale, dtype, device, gen):
    return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale).to(dtype)


def _k_of(shape) -> int:
    return shape[2] if not isinstance(shape[0], tuple) else shape[0][-1]


# ---- matmul -------------------------------------------------------------------------------------


def _matmul_operand_shapes(shape):
    """(a_shape, b_shape): shapes are (M, N, K) for 2-D, or (a_shape, b_shape) pairs."""
    if isinstance(shape[0], tuple):
        return shape
    m, n, k = shape
    return (m, k), (k, n)


def _matmul_inputs(shape, dtype, device, seed):
    a_shape, b_shape = _matmul_operand_shapes(shape)
    gen = generator(device, seed)
    k = a_shape[-1]
    a = randn(a_shape, dtype, device, gen)
    b = _scaled_randn(b_shape, 1.0 / math.sqrt(max(k, 1)), dtype, device, gen)
    return a, b


def _matmul_flops(inputs, mode, **params):
    a, b = inputs
    out = math.prod(matmul_shape("flops", a.shape, b.shape))
    fwd = 2 * out * a.shape[-1]
    return {"fwd": fwd, "bwd": 2 * fwd, "fwd+bwd": 3 * fwd}[mode]


def _matmul_bytes(inputs, mode, **params):
    a, b = inputs
    out = math.prod(matmul_shape("bytes", a.shape, b.shape)) * a.element_size()
    # fwd: read A and B once, write C. bwd: read dC, A and B; write dA and dB.
    fwd = nbytes(a, b) + out
    bwd = out + 2 * nbytes(a, b)
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[mode]


# The CUDA-core v0 is timed up to 4096^3 (tens of milliseconds a call there); beyond, a bench
# sample would take seconds and teach nothing new.
_NAIVE_MAX_FLOPS = 2 * 4096**3


def _variant(name):
    run = functools.partial(matmul_variant, variant=name)

    def call(a, b):
        if name == "naive" and _matmul_flops((a, b), "fwd") > _NAIVE_MAX_FLOPS:
            raise Unavailable("the CUDA-core v0 is timed only up to 4096^3")
        return run(a, b)

    call.__name__ = f"matmul_{name}"
    return call


register(
    OpSpec(
        name="matmul",
        family=FAMILY,
        impl=matmul,
        reference=torch.matmul,
        make_inputs=_matmul_inputs,
        shapes=Shapes(
            test=[
                (1, 1, 1),
                (17, 33, 65),
                ((2, 1, 5, 7), (3, 7, 4)),
                ((3, 6, 9), (9, 5)),
                ((7,), (7, 5)),
                (6, 45, 300),  # decode: at most 16 rows (ops/matmul/decode.py)
            ],
            bench=SQUARES + LLM_SHAPES,
            empty=[((0, 5), (5, 3)), ((3, 0), (0, 4)), ((2, 0, 4), (4, 3))],
            small=[(256, 256, 256)],
        ),
        bytes=_matmul_bytes,
        flops=_matmul_flops,
        bench_dtypes=(torch.bfloat16, torch.float16),
        tolerance=MATMUL_TOLERANCE,
        grad_tolerance=MATMUL_GRAD_TOLERANCE,
        baselines=torch_baselines(torch.matmul),
        variants={name: _variant(name) for name in VARIANTS},
        compute="tensor",
        description="torch.matmul (2-D, batched, broadcast); naive -> persistent TMA variants",
    )
)


# ---- linear -------------------------------------------------------------------------------------


def _linear_inputs(shape, dtype, device, seed):
    """Shapes are (M, N, K[, "residual"]); M may be a tuple of leading dimensions."""
    lead, n, k = shape[:3]
    lead = lead if isinstance(lead, tuple) else (lead,)
    gen = generator(device, seed)
    x = randn((*lead, k), dtype, device, gen)
    w = _scaled_randn((n, k), 1.0 / math.sqrt(max(k, 1)), dtype, device, gen)
    bias = _scaled_randn((n,), 0.5, dtype, device, gen)
    if len(shape) > 3 and shape[3] == "residual":
        return x, w, bias, randn((*lead, n), dtype, device, gen)
    return x, w, bias


_EAGER_ACT = {
    None: lambda z: z,
    "relu": torch.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
    "silu": F.silu,
}


def _linear_impl(x, weight, bias, residual=None, activation=None):
    return linear(x, weight, bias, activation, residual)


def _linear_ref(x, weight, bias, residual=None, activation=None):
    y = _EAGER_ACT[activation](F.linear(x, weight, bias))
    return y if residual is None else y + residual


def _linear_flops(inputs, mode, **params):
    x, w = inputs[:2]
    fwd = 2 * (x.numel() // x.shape[-1]) * w.shape[0] * w.shape[1]
    return {"fwd": fwd, "bwd": 2 * fwd, "fwd+bwd": 3 * fwd}[mode]


def _linear_bytes(inputs, mode, activation=None):
    x, w, bias = inputs[:3]
    out = (x.numel() // x.shape[-1]) * w.shape[0] * x.element_size()
    residual = nbytes(inputs[3]) if len(inputs) > 3 else 0
    # fwd: read x, W, bias (and the residual), write y. With an activation, training also
    # writes the pre-activation for the backward pass, which reads it with dY, x and W and
    # writes dX, dW and dbias (the residual's gradient is dY itself).
    fwd = nbytes(x, w, bias) + residual + out
    saved = out if activation is not None else 0
    bwd = out + saved + 2 * nbytes(x, w) + nbytes(bias)
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + saved + bwd}[mode]


register(
    OpSpec(
        name="linear",
        family=FAMILY,
        impl=_linear_impl,
        reference=_linear_ref,
        make_inputs=_linear_inputs,
        shapes=Shapes(
            test=[(1, 1, 1), (17, 33, 65), ((2, 3), 10, 12, "residual"), (5, 45, 300)],
            bench=[(8192, 4096, 4096)],
            empty=[(0, 5, 4), (3, 4, 0), ((2, 3), 0, 5)],
            small=[(256, 256, 256)],
        ),
        params=(
            {"activation": "gelu_tanh"},
            {"activation": None},
            {"activation": "relu"},
            {"activation": "gelu"},
            {"activation": "silu"},
        ),
        bytes=_linear_bytes,
        flops=_linear_flops,
        bench_dtypes=(torch.bfloat16,),
        tolerance=MATMUL_TOLERANCE,
        grad_tolerance=MATMUL_GRAD_TOLERANCE,
        baselines=torch_baselines(_linear_ref),
        compute="tensor",
        description="act(x @ W^T + b) + residual, bias/activation/residual in the GEMM epilogue",
    )
)


# ---- FP8 scaled GEMM ----------------------------------------------------------------------------


def _scaled_inputs(shape, dtype, device, seed):
    """Shapes are (M, N, K, scales, bias[, "b row-major"]): scales "tensor" (one each) or "row"
    (per row of a, per column of b); b column-major, as torch._scaled_mm wants it, unless the
    flag asks for the row-major b of a plain ``a @ b``."""
    m, n, k, scales, with_bias = shape[:5]
    gen = generator(device, seed)
    a = randn((m, k), dtype, device, gen)
    if "b row-major" in shape[5:]:
        b = randn((k, n), dtype, device, gen)
    else:
        b = randn((n, k), dtype, device, gen).t()
    norm = 1.0 / math.sqrt(max(k, 1))  # unit-variance outputs (see the module docstring)
    if scales == "row":
        u = torch.rand((m, 1), generator=gen, device=device) + 0.5
        scale_a = u * norm
        scale_b = torch.rand((1, n), generator=gen, device=device) + 0.5
    else:
        scale_a = torch.tensor(0.5 * norm, device=device)
        scale_b = torch.tensor(2.0, device=device)
    inputs = (a, b, scale_a, scale_b)
    if with_bias:
        inputs += (randn((n,), torch.bfloat16, device, gen),)
    return inputs


def _scaled_impl(a, b, scale_a, scale_b, bias=None, out_dtype=torch.bfloat16):
    return scaled_matmul(a, b, scale_a, scale_b, out_dtype=out_dtype, bias=bias)


def _scaled_ref(a, b, scale_a, scale_b, bias=None, out_dtype=torch.bfloat16):
    """float64 on the check engine's upcast inputs; else fp32 products rounded once."""
    compute = torch.float64 if a.dtype == torch.float64 else torch.float32
    out = (a.to(compute) @ b.to(compute)) * scale_a.to(compute) * scale_b.to(compute)
    if bias is not None:
        out = out + bias.to(compute)
    return out if compute == torch.float64 else out.to(out_dtype)


def _torch_scaled_mm(a, b, scale_a, scale_b, bias=None, out_dtype=torch.bfloat16):
    if b.stride(0) != 1:
        # torch._scaled_mm accepts only a column-major b: a caller holding a row-major one must
        # copy it first, and that copy is part of what this baseline costs (as the K-major
        # copy is part of ours).
        b = b.t().contiguous().t()
    return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, bias=bias, out_dtype=out_dtype)


def _layout_variants(out_dtype_of):
    """The two ways to read a b that is not K-major, forced (tritonkit's default picks by size).

    "in place": through its strides; wgmma cannot read 8-bit operands that are not K-major, so
    that is the pointer loop. "K-major copy": transposed into K-major scratch first, then TMA.
    With a K-major b both are the default path.
    """

    def make(name, kmajor):
        def call(a, b, scale_a=None, scale_b=None, bias=None, out_dtype=None):
            out = out_dtype or out_dtype_of(scale_a)
            return scaled_matmul_fwd(a, b, scale_a, scale_b, bias, out, kmajor=kmajor)

        call.__name__ = name
        return call

    return {"in place": make("in_place", False), "K-major copy": make("kmajor_copy", True)}


def _gemm_flops(inputs, mode, **params):
    a, b = inputs[:2]
    return 2 * a.shape[0] * b.shape[1] * a.shape[1] if mode == "fwd" else 0


def _low_precision_bytes(inputs, mode, **params):
    # Read the operands, scales and bias once; write the output: bfloat16, or int32 for the
    # exact INT8 product (two inputs, no scales).
    a, b = inputs[:2]
    out_elem = 4 if (a.dtype == torch.int8 and len(inputs) == 2) else 2
    out = a.shape[0] * b.shape[1] * out_elem
    return nbytes(*inputs) + out if mode == "fwd" else 0


def _needs_sm89(fn, what):
    def build():
        if not torch.cuda.is_available():
            raise Unavailable("needs a CUDA GPU")
        if torch.cuda.get_device_capability() < (8, 9):
            raise Unavailable(f"{what} needs compute capability 8.9 or newer")
        return fn

    return build


register(
    OpSpec(
        name="scaled_matmul",
        family=FAMILY,
        impl=_scaled_impl,
        reference=_scaled_ref,
        make_inputs=_scaled_inputs,
        shapes=Shapes(
            test=[
                (1, 1, 1, "tensor", False),
                (17, 33, 65, "row", True),
                (40, 24, 130, "tensor", True),
                (40, 32, 96, "row", False, "b row-major"),
                (9, 40, 200, "row", True),  # decode
            ],
            # b column-major (torch._scaled_mm's only layout), and row-major as in a plain
            # a @ b: then both sides' times include a copy of b (see _torch_scaled_mm).
            bench=[
                (8192, 8192, 8192, "tensor", False),
                (8192, 8192, 8192, "tensor", False, "b row-major"),
            ],
            small=[(256, 256, 256, "tensor", False)],
            empty=[(0, 5, 7, "row", False), (3, 4, 0, "tensor", True)],
        ),
        dtypes=(torch.float8_e4m3fn, torch.float8_e5m2),
        bench_dtypes=(torch.float8_e4m3fn,),
        bytes=_low_precision_bytes,
        flops=_gemm_flops,
        tolerance=LOW_PRECISION_TOLERANCE,
        backward=False,
        # e4m3fn has no infinity (casting one saturates to 448): PyTorch's special-value
        # pattern cannot be injected into fp8 inputs.
        special_values=False,
        baselines={
            "torch": Baseline(
                "torch",
                _needs_sm89(_torch_scaled_mm, "torch._scaled_mm"),
                backward=False,
                description="torch._scaled_mm (cuBLASLt FP8; a row-major b copied first)",
            ),
            "torch.compile": torch_baselines(_torch_scaled_mm)["torch.compile"],
        },
        variants=_layout_variants(lambda scale_a: torch.bfloat16),
        compute="tensor",
        description="FP8 GEMM, torch._scaled_mm semantics: (a @ b) * scale_a * scale_b + bias",
    )
)


# ---- INT8 GEMM ----------------------------------------------------------------------------------

_INT8_STD = 74.0  # standard deviation of int8 values drawn uniformly from [-128, 127]


def _int8_inputs(shape, dtype, device, seed):
    """Shapes are (M, N, K, *flags): "dequant" for bf16 out with scales, "b row-major" for a
    row-major B as in a plain ``a @ B`` (torch._int_mm's slow layout; tritonkit's time then
    includes its K-major copy of B); B is column-major, the fast layout, otherwise."""
    m, n, k = shape[:3]
    flags = shape[3:]
    gen = generator(device, seed)
    a = torch.randint(-128, 128, (m, k), generator=gen, device=device, dtype=torch.int8)
    if "b row-major" in flags:
        b = torch.randint(-128, 128, (k, n), generator=gen, device=device, dtype=torch.int8)
    else:
        b = torch.randint(-128, 128, (n, k), generator=gen, device=device, dtype=torch.int8).t()
    if "dequant" not in flags:
        return a, b
    norm = 1.0 / (_INT8_STD**2 * math.sqrt(max(k, 1)))
    scale_a = (torch.rand((m, 1), generator=gen, device=device) + 0.5) * norm
    scale_b = torch.rand((1, n), generator=gen, device=device) + 0.5
    return a, b, scale_a, scale_b


def _int8_impl(a, b, scale_a=None, scale_b=None):
    if scale_a is None:
        return int8_matmul(a, b)
    return int8_matmul(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)


def _int8_ref(a, b, scale_a=None, scale_b=None):
    # Products of int8 values summed over K stay below 2**53: exact in float64.
    acc = a.double() @ b.double()
    if scale_a is None:
        return acc.to(torch.int32)
    if scale_a.dtype == torch.float64:
        return acc * scale_a * scale_b
    return (acc.float() * scale_a * scale_b).to(torch.bfloat16)


def _torch_int_mm(a, b, scale_a=None, scale_b=None):
    out = torch._int_mm(a, b)
    if scale_a is None:
        return out
    return (out.float() * scale_a * scale_b).to(torch.bfloat16)


register(
    OpSpec(
        name="int8_matmul",
        family=FAMILY,
        impl=_int8_impl,
        reference=_int8_ref,
        make_inputs=_int8_inputs,
        shapes=Shapes(
            test=[
                (1, 1, 1),
                (17, 33, 65),
                (17, 33, 65, "dequant"),
                (17, 33, 65, "b row-major"),
                (7, 40, 200, "dequant"),  # decode
            ],
            # Both layouts of B: torch._int_mm is fast only with B column-major; the acceptance
            # anchor is B row-major, where tritonkit copies B K-major first (variants: both
            # routes forced).
            bench=[(8192, 8192, 8192), (8192, 8192, 8192, "b row-major")],
            empty=[(0, 5, 7), (3, 4, 0, "dequant")],
            small=[(256, 256, 256)],
        ),
        dtypes=(torch.int8,),
        bench_dtypes=(torch.int8,),
        bytes=_low_precision_bytes,
        flops=_gemm_flops,
        tolerance=LOW_PRECISION_TOLERANCE,
        backward=False,
        special_values=False,  # integers have no NaN or infinity
        baselines={
            "torch": Baseline(
                "torch",
                lambda: _torch_int_mm,
                backward=False,
                description="torch._int_mm (cuBLASLt INT8)",
            ),
            "torch.compile": torch_baselines(_torch_int_mm)["torch.compile"],
        },
        compute="tensor",
        variants=_layout_variants(
            lambda scale_a: torch.int32 if scale_a is None else torch.bfloat16
        ),
        description="INT8 GEMM (W8A8): exact int32 as torch._int_mm, or scales fused to bf16",
    )
)
