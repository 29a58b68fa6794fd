"""One pass: quantize groups of G consecutive elements along the last dimension (per row when
G is the row's length), amax, scale and cast in the same program."""

from __future__ import annotations

import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.quant_codes import (
    asymmetric_scales,
    encode,
    finite_abs,
    finite_or,
    pack_int4,
    symmetric_scales,
)


@kernel
def _quant_groups_kernel(
    x_ptr,  # (n_rows, n_cols) input, unit stride along a row
    q_ptr,  # codes, same layout (n_cols // 2 bytes a row when PACK)
    scale_ptr,  # (n_rows, n_cols // G) float32 dequantization scales, contiguous
    zp_ptr,  # same shape: int32 zero points (asymmetric only)
    amax_ptr,  # same shape: float32 amax of each group (RETURN_AMAX only)
    n_groups,  # n_rows * n_cols // G
    groups_per_row,
    stride_xr,
    stride_qr,
    QMIN: tl.constexpr,
    QMAX: tl.constexpr,
    MANT: tl.constexpr,
    EMIN: tl.constexpr,
    G: tl.constexpr,  # group size
    G_P2: tl.constexpr,  # next power of two >= G
    BLOCK_G: tl.constexpr,  # groups per program
    IS_FLOAT: tl.constexpr,
    ASYM: tl.constexpr,
    POW2: tl.constexpr,
    PACK: tl.constexpr,  # 4-bit codes, two per byte
    RETURN_AMAX: tl.constexpr,
    EMULATE: tl.constexpr,  # interpreter: rounding done in float32 (see ops/_core/quant_codes.py)
):
    g = tl.program_id(0).to(tl.int64) * BLOCK_G + tl.arange(0, BLOCK_G)
    row = g // groups_per_row
    col0 = (g - row * groups_per_row) * G
    j = tl.arange(0, G_P2)
    g_ok = g < n_groups
    mask = g_ok[:, None] & (j < G)[None, :]
    x = tl.load(x_ptr + (row * stride_xr + col0)[:, None] + j[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    if ASYM:
        lo = tl.min(finite_or(x, 0.0), axis=1)
        hi = tl.max(finite_or(x, 0.0), axis=1)
        qscale, scale, zp = asymmetric_scales(lo, hi, QMIN, QMAX, EMULATE)
        tl.store(zp_ptr + g, zp.to(tl.int32), mask=g_ok)
        amax = tl.maximum(-lo, hi)
    else:
        amax = tl.max(finite_abs(x), axis=1)
        qscale, scale = symmetric_scales(amax, QMAX, POW2)
        zp = tl.zeros_like(scale)
    codes = encode(x * qscale[:, None], zp[:, None], QMIN, QMAX, IS_FLOAT, MANT, EMIN, EMULATE)
    q_row = q_ptr + row * stride_qr
    if PACK:
        jj = tl.arange(0, G_P2 // 2)
        m2 = g_ok[:, None] & (jj < G // 2)[None, :]
        tl.store((q_row + col0 // 2)[:, None] + jj[None, :], pack_int4(codes, BLOCK_G, G_P2), m2)
    else:
        tl.store((q_row + col0)[:, None] + j[None, :], codes.to(q_ptr.dtype.element_ty), mask)
    tl.store(scale_ptr + g, scale, mask=g_ok)
    if RETURN_AMAX:
        tl.store(amax_ptr + g, amax, mask=g_ok)
