"""The norm forward of rows held in registers: each program takes a tile of BLOCK_R rows whose
whole width fits one BLOCK_N tile (``NormTiles.max_fused_cols``). Options per launch:
the next tile's loads issued before the current tile is reduced (PREFETCH, several tiles per
program), the output pass re-reading the row from L1/L2 instead of holding it across the
reductions (REREAD), the compiler's software pipeline over a program's tiles (STAGES)."""

from __future__ import annotations

import triton
import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.rows import col_ids, n_steps, tile_rows
from tritonkit.ops.norm.kernels import load_sum, store_chunk


@triton.jit
def _fwd_tile_load(
    tile, n_tiles, n_inner, n_iblocks, x_ptr, r_ptr, cols, col_mask,
    stride_xo, stride_xn, stride_xi, stride_ro, stride_rn, stride_ri,
    SHIFT: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK_R: tl.constexpr, INT64: tl.constexpr,
    OUTER: tl.constexpr, EVICT: tl.constexpr,
):  # fmt: skip
    """(x or x + residual in fp32, LayerNorm's shift) of row tile ``tile``; the shift is each
    row's first element as stored (the backward shifts by the same value). Nothing is read past
    the last tile. EVICT: the L2 policy of x's load."""
    o, i, row_mask = tile_rows(tile, n_inner, n_iblocks, BLOCK_R, INT64, OUTER)
    row_mask = row_mask & (tile < n_tiles)
    x_rows = x_ptr + o * stride_xo + i * stride_xi
    r_rows = r_ptr + o * stride_ro + i * stride_ri
    x = load_sum(
        x_rows[:, None] + cols[None, :] * stride_xn,
        r_rows[:, None] + cols[None, :] * stride_rn,
        row_mask[:, None] & col_mask[None, :],
        HAS_RESIDUAL,
        False,
        EVICT,
    )
    shift = tl.zeros([BLOCK_R], tl.float32)
    if SHIFT:
        shift = load_sum(x_rows, r_rows, row_mask, HAS_RESIDUAL, True, "")
    return x, shift


@kernel
def norm_fwd_tiles_kernel(
    x_ptr,  # input, seen as (n_outer, n_cols, n_inner) with the strides below
    r_ptr,  # residual, when HAS_RESIDUAL
    w_ptr,  # weight [n_cols], when HAS_WEIGHT
    b_ptr,  # bias [n_cols], when HAS_BIAS
    y_ptr,  # normalized output
    h_ptr,  # x + residual, when HAS_RESIDUAL
    mean_ptr,  # fp32 per row: mean of the row minus its first element (LayerNorm only)
    rstd_ptr,  # fp32 per row: 1 / sqrt(var + eps), or 1 / sqrt(mean(x^2) + eps)
    n_cols,  # normalized elements per row
    n_inner,  # rows per outer index
    n_iblocks,  # row tiles per outer index
    n_tiles,  # row tiles in all
    eps,  # added to the variance (mean square) under the square root
    stride_xo,  # x: outer, column and inner strides
    stride_xn,
    stride_xi,
    stride_ro,  # residual: as for x
    stride_rn,
    stride_ri,
    stride_yo,  # y: as for x
    stride_yn,
    stride_yi,
    stride_ho,  # h: as for x
    stride_hn,
    stride_hi,
    stride_so,  # per-row statistics: outer and inner strides
    stride_si,
    stride_w,  # weight: elements between columns
    stride_b,  # bias: elements between columns
    IS_RMS: tl.constexpr,
    SHIFT: tl.constexpr,  # LayerNorm rows shifted by their first element (see config.shifts)
    HAS_RESIDUAL: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PREFETCH: tl.constexpr,  # load the next tile before computing this one
    REREAD: tl.constexpr,  # no residual: the output pass re-reads the row
    STAGES: tl.constexpr,  # the compiler's software pipeline over the program's row tiles
    # (cp.async into shared memory); None: not pipelined
    EVEN_N: tl.constexpr,  # n_cols == BLOCK_N
    OUTER: tl.constexpr,  # more than one outer index
    ONE_TILE: tl.constexpr,  # one tile per program
    INT64: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    cols = col_ids(BLOCK_N, INT64)
    # The affine parameters are loaded once per program.
    col_mask = cols < n_cols
    # With REREAD the weight and bias stay in L2 while the rows stream through it.
    AFFINE: tl.constexpr = "evict_last" if REREAD else ""
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols * stride_w, mask=col_mask, eviction_policy=AFFINE)
        w = w.to(tl.float32)
    if HAS_BIAS:
        b = tl.load(b_ptr + cols * stride_b, mask=col_mask, eviction_policy=AFFINE)
        b = b.to(tl.float32)
    n_programs = tl.num_programs(0)
    if PREFETCH:
        x_next, shift_next = _fwd_tile_load(
            tl.program_id(0), n_tiles, n_inner, n_iblocks, x_ptr, r_ptr, cols, col_mask,
            stride_xo, stride_xn, stride_xi, stride_ro, stride_rn, stride_ri,
            SHIFT, HAS_RESIDUAL, BLOCK_R, INT64, OUTER, "evict_last" if REREAD else "",
        )  # fmt: skip
    # A grid-stride walk; a constant trip count of 1 with ONE_TILE (see softmax's kernels).
    for step in tl.range(0, n_steps(n_tiles, ONE_TILE), num_stages=STAGES):
        tile = tl.program_id(0) + step * n_programs
        o, i, row_mask = tile_rows(tile, n_inner, n_iblocks, BLOCK_R, INT64, OUTER)
        x_rows = x_ptr + o * stride_xo + i * stride_xi
        y_rows = y_ptr + o * stride_yo + i * stride_yi
        h_rows = h_ptr + o * stride_ho + i * stride_hi
        s_offs = o * stride_so + i * stride_si
        mask = row_mask[:, None] & col_mask[None, :]
        # With PREFETCH the next tile's loads are issued before this tile's reductions, so
        # that a program keeps bytes in flight while it computes.
        loaded = _fwd_tile_load(
            tile + PREFETCH * n_programs, n_tiles, n_inner, n_iblocks, x_ptr, r_ptr, cols,
            col_mask, stride_xo, stride_xn, stride_xi, stride_ro, stride_rn, stride_ri,
            SHIFT, HAS_RESIDUAL, BLOCK_R, INT64, OUTER, "evict_last" if REREAD else "",
        )  # fmt: skip
        if PREFETCH:
            x, shift = x_next, shift_next
            x_next, shift_next = loaded
        else:
            x, shift = loaded
        if HAS_RESIDUAL:
            store_chunk(h_rows, cols, stride_hn, x, mask, "")
        if IS_RMS:
            rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
        else:
            if EVEN_N:  # no padding columns: masked rows are not stored, no selects
                xs = x - shift[:, None]
                mean = tl.sum(xs, axis=1) / n_cols
                d = xs - mean[:, None]
            else:
                xs = tl.where(mask, x - shift[:, None], 0.0)
                mean = tl.sum(xs, axis=1) / n_cols
                d = tl.where(mask, xs - mean[:, None], 0.0)
            rstd = tl.math.rsqrt(tl.sum(d * d, axis=1) / n_cols + eps)
        if REREAD:  # the row again, from L1 or L2, instead of holding it across the sums
            x = load_sum(
                x_rows[:, None] + cols[None, :] * stride_xn, x_rows, mask, False, False,
                "evict_first",
            )  # fmt: skip
            if not IS_RMS:
                d = (x - shift[:, None]) - mean[:, None]
        if IS_RMS:
            y = x * rstd[:, None]
        else:
            y = d * rstd[:, None]
        if HAS_WEIGHT:
            y *= w[None, :]
        if HAS_BIAS:
            y += b[None, :]
        store_chunk(y_rows, cols, stride_yn, y, mask, "")
        if not IS_RMS:
            tl.store(mean_ptr + s_offs, mean, mask=row_mask)
        tl.store(rstd_ptr + s_offs, rstd, mask=row_mask)
