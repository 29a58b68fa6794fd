"""One pass: quantize groups of K elements along a dimension that is not the last (per column
of a short matrix, or groups of K rows), amax, scale and cast in the same program."""

from __future__ import annotations

import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.quant_codes import (
    asymmetric_scales,
    encode,
    finite_abs,
    finite_or,
    symmetric_scales,
)


@kernel
def _quant_strided_kernel(
    x_ptr,  # (n_outer, D, n_inner) input
    q_ptr,  # codes, same logical shape, own strides
    scale_ptr,  # (n_outer, D // K, n_inner) float32 dequantization scales, contiguous
    zp_ptr,  # same shape: int32 zero points (asymmetric only)
    amax_ptr,  # same shape: float32 amax (RETURN_AMAX only)
    n_inner,
    groups_per_outer,  # D // K
    stride_xo,
    stride_xd,
    stride_xi,
    stride_qo,
    stride_qd,
    stride_qi,
    QMIN: tl.constexpr,
    QMAX: tl.constexpr,
    MANT: tl.constexpr,
    EMIN: tl.constexpr,
    K: tl.constexpr,  # group size along D
    K_P2: tl.constexpr,
    BLOCK_I: tl.constexpr,  # inner positions per program
    IS_FLOAT: tl.constexpr,
    ASYM: tl.constexpr,
    POW2: tl.constexpr,
    RETURN_AMAX: tl.constexpr,
    EMULATE: tl.constexpr,
):
    pid_g = tl.program_id(0).to(tl.int64)  # one (outer index, group along D)
    o = pid_g // groups_per_outer
    d = (pid_g - o * groups_per_outer) * K + tl.arange(0, K_P2)
    i = tl.program_id(1).to(tl.int64) * BLOCK_I + tl.arange(0, BLOCK_I)
    i_ok = i < n_inner
    mask = (tl.arange(0, K_P2) < K)[:, None] & i_ok[None, :]
    offs = o * stride_xo + d[:, None] * stride_xd + i[None, :] * stride_xi
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    s_offs = pid_g * n_inner + i
    if ASYM:
        lo = tl.min(finite_or(x, 0.0), axis=0)
        hi = tl.max(finite_or(x, 0.0), axis=0)
        qscale, scale, zp = asymmetric_scales(lo, hi, QMIN, QMAX, EMULATE)
        tl.store(zp_ptr + s_offs, zp.to(tl.int32), mask=i_ok)
        amax = tl.maximum(-lo, hi)
    else:
        amax = tl.max(finite_abs(x), axis=0)
        qscale, scale = symmetric_scales(amax, QMAX, POW2)
        zp = tl.zeros_like(scale)
    codes = encode(x * qscale[None, :], zp[None, :], QMIN, QMAX, IS_FLOAT, MANT, EMIN, EMULATE)
    q_offs = o * stride_qo + d[:, None] * stride_qd + i[None, :] * stride_qi
    tl.store(q_ptr + q_offs, codes.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + s_offs, scale, mask=i_ok)
    if RETURN_AMAX:
        tl.store(amax_ptr + s_offs, amax, mask=i_ok)
