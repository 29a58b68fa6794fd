"""@triton.jit helpers shared by the norm kernels: a row as stored (x, or x + residual) in
fp32, a chunk stored in its tensor's dtype, and the saved statistics of a row tile read back
for the backward."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def raw_sum(x, r, HAS_RESIDUAL: tl.constexpr):
    """x, or x + residual, in fp32, from the values as stored."""
    out = x.to(tl.float32)
    if HAS_RESIDUAL:
        out += r.to(tl.float32)
    return out


@triton.jit
def load_sum(
    x_ptrs, r_ptrs, mask, HAS_RESIDUAL: tl.constexpr, ROUND: tl.constexpr, EVICT: tl.constexpr
):  # fmt: skip
    """x, or x + residual, in fp32 (rounded to x's dtype first when ROUND); 0 where masked.
    EVICT: the L2 policy of x's load."""
    x = tl.load(x_ptrs, mask=mask, other=0.0, eviction_policy=EVICT)
    r = x
    if HAS_RESIDUAL:
        r = tl.load(r_ptrs, mask=mask, other=0.0)
    out = raw_sum(x, r, HAS_RESIDUAL)
    if HAS_RESIDUAL and ROUND:
        out = out.to(x.dtype).to(tl.float32)
    return out


@triton.jit
def store_chunk(rows, c, stride_n, values, mask, EVICT: tl.constexpr):
    """Store ``values`` (a tile of rows x chunk columns ``c``) in the rows' dtype."""
    tl.store(
        rows[:, None] + c[None, :] * stride_n,
        values.to(rows.dtype.element_ty),
        mask=mask,
        eviction_policy=EVICT,
    )


@triton.jit
def row_stats(
    x_rows, row_mask, mean_ptr, rstd_ptr, s_offs, IS_RMS: tl.constexpr, SHIFT: tl.constexpr
):
    """(shift, mean, rstd) saved by the forward for a row tile (shift and mean 0 for RMSNorm,
    shift 0 without SHIFT)."""
    rstd = tl.load(rstd_ptr + s_offs, mask=row_mask, other=0.0)
    shift = tl.zeros_like(rstd)
    mean = tl.zeros_like(rstd)
    if SHIFT:
        shift = tl.load(x_rows, mask=row_mask, other=0.0).to(tl.float32)
    if not IS_RMS:
        mean = tl.load(mean_ptr + s_offs, mask=row_mask, other=0.0)
    return shift, mean, rstd


@triton.jit
def normalized(x, mask, shift, mean, rstd, IS_RMS: tl.constexpr):
    """x normalized with the saved statistics; 0 where masked."""
    if IS_RMS:
        xhat = x * rstd[:, None]
    else:
        xhat = tl.where(mask, ((x - shift[:, None]) - mean[:, None]) * rstd[:, None], 0.0)
    return xhat
