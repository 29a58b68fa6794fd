"""Device math shared by the kernel families (``@triton.jit`` helpers): exponentials, row walks
aligned to 16 bytes, and the activations (ReLU, GELU erf and tanh, SiLU) with their derivatives."""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def fast_exp(x):
    """exp(x) in fp32 as exp2(x * log2(e)); results below 2**-126 flush to 0.

    ``tl.exp2`` lowers to ``ex2.approx.ftz.f32``, one MUFU instruction. ``tl.exp`` lowers to
    ``ex2.approx.f32`` without ftz, which ptxas wraps in a compare and two predicated multiplies
    to produce subnormal results (sm_90a SASS): five instructions instead of two, in kernels
    whose rows are bound by instruction issue (the looped softmax forward makes two
    exponentials per element).
    """
    return tl.exp2(x * LOG2E)


@triton.jit
def aligned_row(offset, n_cols, VEC: tl.constexpr):
    """(head, n_body) of a row starting ``offset`` elements past a 16-byte aligned pointer:
    ``head`` elements come before its first aligned one, and ``n_body`` (a multiple of VEC)
    aligned elements follow them."""
    head = tl.minimum((VEC - offset % VEC) % VEC, n_cols)
    n_body = (n_cols - head) // VEC * VEC
    return head, tl.multiple_of(n_body, VEC)


@triton.jit
def edge_cols(head, n_body, n_cols, VEC: tl.constexpr):
    """(columns, mask) of the row's elements outside its body, [0, head) and
    [head + n_body, n_cols): fewer than 2 * VEC, in a tile of 2 * VEC."""
    e = tl.arange(0, 2 * VEC)
    c = tl.where(e < head, e, n_body + e)
    return c, c < n_cols


# Activation codes: constexpr integers so that each activation compiles to its own kernel.
ACT_NONE = tl.constexpr(0)
ACT_RELU = tl.constexpr(1)
ACT_GELU = tl.constexpr(2)
ACT_GELU_TANH = tl.constexpr(3)
ACT_SILU = tl.constexpr(4)
ACTIVATIONS: dict[str, int] = {"none": 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4}

_SQRT1_2 = tl.constexpr(0.7071067811865476)  # 1/sqrt(2)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)  # 1/sqrt(2*pi)
_SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)  # sqrt(2/pi)
_GELU_TANH_C = tl.constexpr(0.044715)

# GELU's Phi where the output has 16 bits (gelu_q16): log2(0.5 * erfc(u / sqrt 2)) ~ sum of
# GELU_Q16_COEFFS[k] * u**k, the minimax fit on u in [0, 13] (q(13) = 2**-126.9 is below
# float32's smallest normal, which ex2.approx.ftz returns as 0), fitted in float64 with numpy:
# Lawson's reweighted least squares on 4001 points, the coefficients rounded to float32 from
# the highest down, the lower ones refitted after each rounding (tests/test_elementwise.py
# repeats the fit). Max relative error of q on [0, 13] with these float32 coefficients:
# 1.8e-5 in float64 arithmetic; evaluated in float32 as the kernel does, 2.0e-5 for u <= 6 and
# 5.0e-5 near u = 13 (cancellation between terms). c9 < 0 and the derivative has no positive
# root: q decreases on (0, inf), and Horner's rule gives -inf at u = inf, so q(inf) = 0.
GELU_Q16_COEFFS = (
    -1.0000253915786743,
    -1.1510510444641113,
    -0.4586363434791565,
    -0.054088860750198364,
    0.008723306469619274,
    -0.0010343962348997593,
    8.552986400900409e-05,
    -4.61730633105617e-06,
    1.4528676217651082e-07,
    -2.0123762656254485e-09,
)
_Q16_C0, _Q16_C1, _Q16_C2, _Q16_C3, _Q16_C4 = (tl.constexpr(c) for c in GELU_Q16_COEFFS[:5])
_Q16_C5, _Q16_C6, _Q16_C7, _Q16_C8, _Q16_C9 = (tl.constexpr(c) for c in GELU_Q16_COEFFS[5:])


# ----------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------


@triton.jit
def gelu_parts(z):
    """(Phi(z), exp(-z*z/2)) in fp32: the standard normal CDF and the Gaussian's kernel.

    Phi from Abramowitz & Stegun 7.1.26 applied to erfc(|z|/sqrt(2)): |error| <= 7.5e-8, about
    one float32 unit in the last place of values near 1 (libdevice's erf is as close, with
    twice the instructions, and GELU is bound by them on bf16). Computing 0.5*erfc directly
    avoids the cancellation of 1 + erf(z) for z << 0. NaN propagates; +-inf give 1 and 0.
    """
    a = tl.abs(z) * _SQRT1_2
    t = 1.0 / (1.0 + 0.3275911 * a)
    # The A&S coefficients halved, so that p * e is 0.5 * erfc(a).
    p = 0.5307027145 * t - 0.7265760135
    p = (p * t + 0.7107068705) * t - 0.142248368
    p = (p * t + 0.127414796) * t
    e = tl.exp2(a * a * -1.4426950408889634)  # exp(-a^2) == exp(-z^2 / 2)
    half_erfc = p * e
    return tl.where(z < 0.0, half_erfc, 1.0 - half_erfc), e


@triton.jit
def gelu_q16(u):
    """0.5 * erfc(u / sqrt(2)) for u >= 0 to 1.8e-5 relative, for Phi rounded to 16 bits.

    One exp2 of a degree-9 polynomial (GELU_Q16_COEFFS): 9 FMAs and one MUFU, where
    gelu_parts needs a division and an exp2 around 8 multiply-adds. bf16 GELU was bound by
    instruction issue; the forward kernel's SASS for sm_90 (ptxas, 16 elements per thread) has
    20 instructions per element with this Phi, 29.5 with gelu_parts, about as many as SiLU's
    (19.5), which runs at copy bandwidth (see docs/performance.md). u = inf gives 0, NaN stays
    NaN.
    """
    p = _Q16_C9 * u + _Q16_C8
    p = p * u + _Q16_C7
    p = p * u + _Q16_C6
    p = p * u + _Q16_C5
    p = p * u + _Q16_C4
    p = p * u + _Q16_C3
    p = p * u + _Q16_C2
    p = p * u + _Q16_C1
    p = p * u + _Q16_C0
    return tl.exp2(p)


@triton.jit
def act(z, ACT: tl.constexpr, PHI16: tl.constexpr = False):
    """act(z) in fp32. NaN propagates and +-inf give what the float64 formula gives.

    PHI16: GELU's Phi from gelu_q16, accurate enough for an output rounded to 16 bits (the
    matmul epilogue calls this without it: gelu_parts).
    """
    if ACT == ACT_RELU:
        # where(z < 0) rather than maximum(): max(NaN, 0) is 0 on the GPU, PyTorch gives NaN.
        out = tl.where(z < 0.0, 0.0, z)
    elif ACT == ACT_GELU:
        if PHI16:
            q = gelu_q16(tl.abs(z))
            cdf = tl.where(z < 0.0, q, 1.0 - q)
        else:
            cdf, _ = gelu_parts(z)
        out = z * cdf
    elif ACT == ACT_GELU_TANH:
        # 0.5 * z * (1 + tanh(u)) == z * sigmoid(2u): no cancellation in 1 + tanh(u) for u << 0.
        u = _SQRT_2_OVER_PI * (z + _GELU_TANH_C * z * z * z)
        out = z / (1.0 + fast_exp(-2.0 * u))
    elif ACT == ACT_SILU:
        out = z / (1.0 + fast_exp(-z))
    else:
        out = z
    return out


@triton.jit
def act_grad(z, ACT: tl.constexpr):
    """d act(z) / dz in fp32, as PyTorch's backward formulas (relu is handled by the caller)."""
    if ACT == ACT_GELU:
        cdf, e = gelu_parts(z)
        out = cdf + z * _INV_SQRT_2PI * e
    elif ACT == ACT_GELU_TANH:
        u = _SQRT_2_OVER_PI * (z + _GELU_TANH_C * z * z * z)
        s = 1.0 / (1.0 + fast_exp(-2.0 * u))  # (1 + tanh u) / 2
        du = _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_TANH_C * z * z)
        out = s + 2.0 * z * s * (1.0 - s) * du
    elif ACT == ACT_SILU:
        s = 1.0 / (1.0 + fast_exp(-z))
        out = s * (1.0 + z * (1.0 - s))
    else:
        out = tl.full(z.shape, 1.0, tl.float32)
    return out
