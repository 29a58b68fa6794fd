"""The first pass of the norm backward for rows that the dx pass cannot hold in registers
(``RegistersBackwardConfig.max_cols``): the two row sums that dx needs, mean(w * dy * xhat)
and (LayerNorm) mean(w * dy), over chunks. ``kernels_backward.py``'s kernel then takes them as given
(SUMS_GIVEN) and walks the row in column blocks."""

from __future__ import annotations

import triton
import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.rows import col_ids, tile_rows
from tritonkit.ops.norm.kernels import normalized, row_stats


@triton.jit
def _xhat(
    x, x_rows, mask, row_mask, mean_ptr, rstd_ptr, s_offs, IS_RMS: tl.constexpr,
    SHIFT: tl.constexpr,
):  # fmt: skip
    """(normalized x, rstd) from the saved statistics; 0 where masked."""
    shift, mean, rstd = row_stats(x_rows, row_mask, mean_ptr, rstd_ptr, s_offs, IS_RMS, SHIFT)
    return normalized(x, mask, shift, mean, rstd, IS_RMS), rstd


@kernel
def norm_bwd_sums_kernel(
    dy_ptr,  # upstream gradient of the normalized output
    x_ptr,  # forward input (x, or x + residual as stored)
    w_ptr,  # weight [n_cols], when HAS_WEIGHT
    mean_ptr,  # saved fp32 statistics, per row
    rstd_ptr,
    c1_ptr,  # fp32 per row: mean(w * dy * xhat)
    c2_ptr,  # fp32 per row: mean(w * dy) (LayerNorm only)
    n_cols,  # as in the forward kernel
    n_inner,
    n_iblocks,
    n_tiles,
    stride_dyo,  # dy: outer, column and inner strides
    stride_dyn,
    stride_dyi,
    stride_xo,  # x: as for dy
    stride_xn,
    stride_xi,
    stride_so,  # statistics (mean, rstd, c1, c2): outer and inner strides
    stride_si,
    stride_w,  # weight: elements between columns
    IS_RMS: tl.constexpr,
    SHIFT: tl.constexpr,  # LayerNorm rows shifted by their first element (see config.shifts)
    HAS_WEIGHT: tl.constexpr,
    STAGES: tl.constexpr,  # the compiler's software pipeline over the chunks; None: none
    OUTER: tl.constexpr,
    INT64: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # First pass of the wide-row backward: the two row sums that dx needs, over chunks.
    cols = col_ids(BLOCK_N, INT64)
    for tile in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        o, i, row_mask = tile_rows(tile, n_inner, n_iblocks, BLOCK_R, INT64, OUTER)
        dy_rows = dy_ptr + o * stride_dyo + i * stride_dyi
        x_rows = x_ptr + o * stride_xo + i * stride_xi
        s_offs = o * stride_so + i * stride_si
        acc1 = tl.zeros([BLOCK_R, BLOCK_N], tl.float32)
        acc2 = tl.zeros([BLOCK_R, BLOCK_N], tl.float32)
        for start in tl.range(0, n_cols, BLOCK_N, num_stages=STAGES):
            c = start + cols
            mask = row_mask[:, None] & (c < n_cols)[None, :]
            dy = tl.load(dy_rows[:, None] + c[None, :] * stride_dyn, mask=mask, other=0.0)
            x = tl.load(x_rows[:, None] + c[None, :] * stride_xn, mask=mask, other=0.0)
            xhat, _ = _xhat(
                x.to(tl.float32), x_rows, mask, row_mask, mean_ptr, rstd_ptr, s_offs, IS_RMS,
                SHIFT,
            )  # fmt: skip
            wdy = dy.to(tl.float32)
            if HAS_WEIGHT:
                wdy *= tl.load(w_ptr + c * stride_w, mask=c < n_cols).to(tl.float32)[None, :]
            acc1 += wdy * xhat
            if not IS_RMS:
                acc2 += wdy
        tl.store(c1_ptr + s_offs, tl.sum(acc1, axis=1) / n_cols, mask=row_mask)
        if not IS_RMS:
            tl.store(c2_ptr + s_offs, tl.sum(acc2, axis=1) / n_cols, mask=row_mask)
