"""Device helpers every quantize kernel is built from: the quant family's (ops/quant/config.py
describes the rounding they implement) and the compressed collectives' (ops/collectives)."""

import triton
import triton.language as tl
from triton.language.extra import libdevice

_RNE_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2**23: x + M - M rounds |x| < 2**22, ties to even
# Smallest amax a scale is computed from; ops/quant/config.py's EPS (its float64 reference)
# repeats it, and tests/test_dist.py checks that the two agree.
EPS = 1e-12
_EPS = tl.constexpr(EPS)


@triton.jit
def rne(v, EMULATE: tl.constexpr):
    """Round to the nearest integer, ties to even. The interpreter has no libdevice.rint; the
    float32 magic-number sum gives the same result for |v| < 2**22 (codes are clamped first)."""
    if EMULATE:
        return (v + _RNE_MAGIC) - _RNE_MAGIC
    else:
        return libdevice.rint(v)


@triton.jit
def finite_abs(x):
    """|x|, with +-inf and NaN counted as 0 (they never set a scale)."""
    a = tl.abs(x)
    return tl.where(a < float("inf"), a, 0.0)


@triton.jit
def finite_or(x, fill):
    return tl.where(tl.abs(x) < float("inf"), x, fill)


@triton.jit
def symmetric_scales(amax, QMAX: tl.constexpr, POW2: tl.constexpr):
    """(qscale, scale) from amax: qscale = QMAX / max(amax, EPS), floored to a power of two with
    POW2 (then scale = 1 / qscale is exact); scale = 1 / qscale."""
    qscale = tl.div_rn(tl.full(amax.shape, QMAX, tl.float32), tl.maximum(amax, _EPS))
    if POW2:
        qscale = (qscale.to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True)
    return qscale, tl.div_rn(tl.full(amax.shape, 1.0, tl.float32), qscale)


@triton.jit
def asymmetric_scales(lo, hi, QMIN: tl.constexpr, QMAX: tl.constexpr, EMULATE: tl.constexpr):
    """(qscale, scale, zero_point) from a group's min and max (0 included in the range)."""
    span = tl.maximum(tl.maximum(hi, 0.0) - tl.minimum(lo, 0.0), _EPS)
    scale = tl.div_rn(span, tl.full(span.shape, QMAX - QMIN, tl.float32))
    qscale = tl.div_rn(tl.full(span.shape, 1.0, tl.float32), scale)
    zp = QMIN - rne(tl.minimum(lo, 0.0) * qscale, EMULATE)
    return qscale, scale, tl.minimum(tl.maximum(zp, QMIN), QMAX)


@triton.jit
def _fp8_grid(v, MANT: tl.constexpr, EMIN: tl.constexpr):
    """v rounded to the float8 grid (nearest, ties to even), as float32; |v| <= the format's max.

    The interpreter's float8 casts round half up and flush subnormals (run
    tests/test_quant.py::test_interpreter_fp8_cast_is_emulated); this rounding leaves it only
    exactly representable values, which it converts right."""
    bits = v.to(tl.int32, bitcast=True)
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, EMIN) - MANT  # exponent of a unit in the last place
    ulp = ((e + 127) << 23).to(tl.float32, bitcast=True)
    inv_ulp = ((127 - e) << 23).to(tl.float32, bitcast=True)
    r = rne(tl.abs(v) * inv_ulp, True) * ulp
    # NaN: the float32 value whose exponent and significand bits the interpreter turns into the
    # format's NaN code (0x7F: 480 in E4M3, 114688 in E5M2), as the hardware cast gives NaN.
    r = tl.where(v == v, r, 480.0 if MANT == 3 else 114688.0)
    # v's sign put back as a bit: Triton's -r is 0 - r, which loses the sign of zero.
    return (r.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)


@triton.jit
def encode(
    v,
    zp,
    QMIN: tl.constexpr,
    QMAX: tl.constexpr,
    IS_FLOAT: tl.constexpr,
    MANT: tl.constexpr,
    EMIN: tl.constexpr,
    EMULATE: tl.constexpr,
):
    """Codes of ``v = x * qscale``: float8 values (saturating, NaN kept) or int32 codes."""
    if IS_FLOAT:
        c = tl.clamp(v, QMIN, QMAX, propagate_nan=tl.PropagateNan.ALL)
        if EMULATE:
            c = _fp8_grid(c, MANT, EMIN)
        return c
    else:
        c = rne(tl.clamp(v, -4194304.0, 4194304.0, propagate_nan=tl.PropagateNan.ALL), EMULATE)
        c = tl.minimum(tl.maximum(c + zp, QMIN), QMAX)
        return tl.where(v == v, c, 0.0).to(tl.int32)


@triton.jit
def pack_int4(codes, ROWS: tl.constexpr, COLS: tl.constexpr):
    """(ROWS, COLS) int32 codes in [-8, 7] -> (ROWS, COLS // 2) bytes, low nibble first."""
    lo, hi = tl.split(tl.reshape(codes, (ROWS, COLS // 2, 2)))
    return ((lo & 0xF) | ((hi & 0xF) << 4)).to(tl.uint8)
