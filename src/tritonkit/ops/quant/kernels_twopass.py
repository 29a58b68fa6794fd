"""Two passes over a (n_rows, n_cols) view: an amax pass (atomics into one float32 per scale),
then a cast pass that turns each amax into its scale and casts. For scales shared across
programs: per tensor, per column (channel) of a long matrix, per group of channels, per row
of a row too long for one program.

The cast pass alone also serves scales given by the caller (a recipe's state: static,
delayed or EMA scaling): one pass that casts with the given scale and, with RECORD, returns
the amax of what it cast (delayed scaling's history) through the same atomics."""

from __future__ import annotations

import triton
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

# Which elements share a scale (MODE), and where the cast pass's scale comes from (SOURCE).
TENSOR, ROWS, COLS = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)


FROM_AMAX, GIVEN_QSCALE, GIVEN_SCALE = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)


@triton.jit
def _tile_coords(
    pid_r,
    pid_c,
    it,
    MODE: tl.constexpr,
    ITERS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Rows and columns of step ``it`` of a program: ROWS walks along its rows, else down."""
    if MODE == ROWS:
        r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
        c = (pid_c * ITERS + it) * BLOCK_C + tl.arange(0, BLOCK_C)
    else:
        r = (pid_r * ITERS + it) * BLOCK_R + tl.arange(0, BLOCK_R)
        c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    return r, c


@triton.jit
def _record(ptr, tile, r, c, r_ok, c_ok, cols_per_scale, MODE: tl.constexpr, IS_MAX: tl.constexpr):
    """Atomic max (or min) of a tile's values into the float32 slots of their scales."""
    if MODE == TENSOR:
        if IS_MAX:
            tl.atomic_max(ptr, tl.max(tl.max(tile, axis=1), axis=0))
        else:
            tl.atomic_min(ptr, tl.min(tl.min(tile, axis=1), axis=0))
    elif MODE == ROWS:
        if IS_MAX:
            tl.atomic_max(ptr + r, tl.max(tile, axis=1), mask=r_ok)
        else:
            tl.atomic_min(ptr + r, tl.min(tile, axis=1), mask=r_ok)
    else:
        if IS_MAX:
            tl.atomic_max(ptr + c // cols_per_scale, tl.max(tile, axis=0), mask=c_ok)
        else:
            tl.atomic_min(ptr + c // cols_per_scale, tl.min(tile, axis=0), mask=c_ok)


@kernel
def _amax_kernel(
    x_ptr,  # (n_rows, n_cols) input
    hi_ptr,  # float32 per scale, zeroed: amax (or the max, ASYM)
    lo_ptr,  # float32 per scale, zeroed: the min (ASYM only)
    n_rows,
    n_cols,
    stride_xr,
    stride_xc,
    cols_per_scale,  # COLS: columns sharing a scale (1 per column, G per group of channels)
    MODE: tl.constexpr,
    ASYM: tl.constexpr,
    ITERS: tl.constexpr,  # tiles per program (along its rows for ROWS, else down its columns)
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    pid_r = tl.program_id(0).to(tl.int64)
    pid_c = tl.program_id(1).to(tl.int64)
    hi = tl.zeros((BLOCK_R, BLOCK_C), tl.float32)
    lo = tl.zeros((BLOCK_R, BLOCK_C), tl.float32)
    for it in range(ITERS):
        r, c = _tile_coords(pid_r, pid_c, it, MODE, ITERS, BLOCK_R, BLOCK_C)
        mask = (r < n_rows)[:, None] & (c < n_cols)[None, :]
        x = tl.load(x_ptr + r[:, None] * stride_xr + c[None, :] * stride_xc, mask, other=0.0)
        x = x.to(tl.float32)
        if ASYM:
            hi = tl.maximum(hi, finite_or(x, 0.0))
            lo = tl.minimum(lo, finite_or(x, 0.0))
        else:
            hi = tl.maximum(hi, finite_abs(x))
    r, c = _tile_coords(pid_r, pid_c, 0, MODE, 1, BLOCK_R, BLOCK_C)
    _record(hi_ptr, hi, r, c, r < n_rows, c < n_cols, cols_per_scale, MODE, True)
    if ASYM:
        _record(lo_ptr, lo, r, c, r < n_rows, c < n_cols, cols_per_scale, MODE, False)


@kernel
def _cast_kernel(
    x_ptr,  # (n_rows, n_cols) input
    q_ptr,  # codes, own strides
    qt_ptr,  # a second copy of the codes in another layout (HAS_QT: the transpose for GEMMs)
    src_ptr,  # per scale: amax / the max (FROM_AMAX), qscale (GIVEN_QSCALE) or scale
    src_lo_ptr,  # per scale: the min (FROM_AMAX and ASYM)
    scale_ptr,  # per scale, out: float32 dequantization scale
    zp_ptr,  # per scale, out: int32 zero point (ASYM)
    amax_ptr,  # per scale, zeroed: amax of what was cast (RECORD)
    n_rows,
    n_cols,
    stride_xr,
    stride_xc,
    stride_qr,
    stride_qc,
    stride_qtr,
    stride_qtc,
    cols_per_scale,
    QMIN: tl.constexpr,
    QMAX: tl.constexpr,
    MANT: tl.constexpr,
    EMIN: tl.constexpr,
    MODE: tl.constexpr,
    SOURCE: tl.constexpr,
    IS_FLOAT: tl.constexpr,
    ASYM: tl.constexpr,
    POW2: tl.constexpr,
    RECORD: tl.constexpr,
    HAS_QT: tl.constexpr,
    PACK: tl.constexpr,
    EMULATE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    pid_r = tl.program_id(0).to(tl.int64)
    pid_c = tl.program_id(1).to(tl.int64)
    r, c = _tile_coords(pid_r, pid_c, 0, MODE, 1, BLOCK_R, BLOCK_C)
    r_ok = r < n_rows
    c_ok = c < n_cols
    mask = r_ok[:, None] & c_ok[None, :]
    # One scale per row (ROWS) or per column: a vector along that axis; TENSOR: all lanes read 0.
    if MODE == ROWS:
        s_idx = r
        s_ok = r_ok & (pid_c == 0)
    elif MODE == COLS:
        s_idx = c // cols_per_scale
        s_ok = c_ok & (pid_r == 0)
    else:
        s_idx = c * 0
        s_ok = (c == pid_c * BLOCK_C) & (pid_r == 0) & (pid_c == 0)
    src = tl.load(src_ptr + s_idx)
    if SOURCE == FROM_AMAX:
        if ASYM:
            qscale, scale, zp = asymmetric_scales(
                tl.load(src_lo_ptr + s_idx), src, QMIN, QMAX, EMULATE
            )
            tl.store(zp_ptr + s_idx, zp.to(tl.int32), mask=s_ok)
        else:
            qscale, scale = symmetric_scales(src, QMAX, POW2)
            zp = tl.zeros_like(scale)
    elif SOURCE == GIVEN_QSCALE:
        qscale = src
        scale = tl.div_rn(tl.full(src.shape, 1.0, tl.float32), src)
        zp = tl.zeros_like(scale)
    else:
        scale = src
        qscale = tl.div_rn(tl.full(src.shape, 1.0, tl.float32), src)
        zp = tl.zeros_like(scale)
    tl.store(scale_ptr + s_idx, scale, mask=s_ok)
    x = tl.load(x_ptr + r[:, None] * stride_xr + c[None, :] * stride_xc, mask, other=0.0)
    x = x.to(tl.float32)
    if MODE == ROWS:
        v = x * qscale[:, None]
        zp2 = zp[:, None]
    else:
        v = x * qscale[None, :]
        zp2 = zp[None, :]
    codes = encode(v, zp2, QMIN, QMAX, IS_FLOAT, MANT, EMIN, EMULATE)
    if PACK:  # two 4-bit codes a byte along a row (n_cols and BLOCK_C even)
        c2 = pid_c * (BLOCK_C // 2) + tl.arange(0, BLOCK_C // 2)
        m2 = r_ok[:, None] & (c2 < n_cols // 2)[None, :]
        q_offs = r[:, None] * stride_qr + c2[None, :]
        tl.store(q_ptr + q_offs, pack_int4(codes, BLOCK_R, BLOCK_C), m2)
    else:
        codes = codes.to(q_ptr.dtype.element_ty)
        tl.store(q_ptr + r[:, None] * stride_qr + c[None, :] * stride_qc, codes, mask)
    if HAS_QT:
        tl.store(qt_ptr + r[:, None] * stride_qtr + c[None, :] * stride_qtc, codes, mask)
    if RECORD:
        _record(amax_ptr, finite_abs(x), r, c, r_ok, c_ok, cols_per_scale, MODE, True)
