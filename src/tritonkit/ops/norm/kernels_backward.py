"""The norm backward: dx per row, and the weight and bias gradients as fp32 partial sums, one
row of them per program (a column block and a group of row tiles), summed in a fixed order by
a second pass (``ops/_core/reduce.py``), so that they are deterministic. Row tiles reach a
program through the compiler's software pipeline (STAGES: cp.async into shared memory) or a
hand prefetch into registers (PREFETCH)."""

from __future__ import annotations

import triton
import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.rows import col_ids, tile_rows
from tritonkit.ops.norm.kernels import normalized, row_stats


@triton.jit
def _add_pairs(a1, b1, a2, b2):
    return a1 + a2, b1 + b2


@triton.jit
def _bwd_tile_load(
    tile, n_tiles, n_inner, n_iblocks, dy_ptr, x_ptr, dres_ptr, mean_ptr, rstd_ptr, cols,
    col_mask, stride_dyo, stride_dyn, stride_dyi, stride_xo, stride_xn, stride_xi, stride_ro,
    stride_rn, stride_ri, stride_so, stride_si,
    IS_RMS: tl.constexpr, SHIFT: tl.constexpr, HAS_DRES: tl.constexpr, BLOCK_R: tl.constexpr,
    INT64: tl.constexpr, OUTER: tl.constexpr,
):  # fmt: skip
    """(dy, x, dres, shift, mean, rstd) of row tile ``tile``, tiles as stored (dres 0 without
    HAS_DRES); nothing is read past the last tile."""
    o, i, row_mask = tile_rows(tile, n_inner, n_iblocks, BLOCK_R, INT64, OUTER)
    row_mask = row_mask & (tile < n_tiles)
    mask = row_mask[:, None] & col_mask[None, :]
    x_rows = x_ptr + o * stride_xo + i * stride_xi
    dy = tl.load(
        dy_ptr + (o * stride_dyo + i * stride_dyi)[:, None] + cols[None, :] * stride_dyn,
        mask=mask,
        other=0.0,
    )
    x = tl.load(x_rows[:, None] + cols[None, :] * stride_xn, mask=mask, other=0.0)
    dres = tl.zeros_like(dy)
    if HAS_DRES:
        dres = tl.load(
            dres_ptr + (o * stride_ro + i * stride_ri)[:, None] + cols[None, :] * stride_rn,
            mask=mask,
            other=0.0,
        )
    shift, mean, rstd = row_stats(
        x_rows, row_mask, mean_ptr, rstd_ptr, o * stride_so + i * stride_si, IS_RMS, SHIFT
    )
    return dy, x, dres, shift, mean, rstd


@triton.jit
def _bwd_dx(
    wdy, xhat, dres, rstd, c1_ptr, c2_ptr, s_offs, row_mask, n_cols,
    IS_RMS: tl.constexpr, HAS_DRES: tl.constexpr, SUMS_GIVEN: tl.constexpr,
):  # fmt: skip
    """dx of a row tile from w * dy and xhat (fp32): the row sums mean(w * dy * xhat) and, for
    LayerNorm, mean(w * dy), computed here or read back (SUMS_GIVEN), then dres added."""
    if SUMS_GIVEN:
        c1 = tl.load(c1_ptr + s_offs, mask=row_mask, other=0.0)
        if not IS_RMS:
            c2 = tl.load(c2_ptr + s_offs, mask=row_mask, other=0.0)
    elif IS_RMS:
        c1 = tl.sum(wdy * xhat, axis=1) / n_cols
    else:  # both row sums in one reduction: one exchange between warps, not two
        c1, c2 = tl.reduce((wdy * xhat, wdy), axis=1, combine_fn=_add_pairs)
        c1 /= n_cols
        c2 /= n_cols
    dx = wdy - xhat * c1[:, None]
    if not IS_RMS:
        dx -= c2[:, None]
    dx *= rstd[:, None]
    if HAS_DRES:
        dx += dres.to(tl.float32)
    return dx


@triton.jit
def _bwd_partials(
    acc_w, acc_b, dy, xhat,
    REDUCE_TILES: tl.constexpr, WEIGHT_GRAD: tl.constexpr, BIAS_GRAD: tl.constexpr,
):  # fmt: skip
    """The weight and bias partial sums with a row tile's dy * xhat and dy added: summed over
    the tile's rows first with REDUCE_TILES, else elementwise into a tile of sums."""
    if REDUCE_TILES:
        if WEIGHT_GRAD:
            acc_w += tl.sum(dy * xhat, axis=0)
        if BIAS_GRAD:
            acc_b += tl.sum(dy, axis=0)
    else:
        if WEIGHT_GRAD:
            acc_w += dy * xhat
        if BIAS_GRAD:
            acc_b += dy
    return acc_w, acc_b


@kernel
def norm_bwd_kernel(
    dy_ptr,  # upstream gradient of the normalized output
    x_ptr,  # forward input (x, or x + residual as stored)
    dres_ptr,  # upstream gradient of x + residual, when HAS_DRES
    w_ptr,  # weight [n_cols], when HAS_WEIGHT
    mean_ptr,  # saved fp32 statistics, per row
    rstd_ptr,
    c1_ptr,  # fp32 row sums from norm_bwd_sums_kernel, when SUMS_GIVEN
    c2_ptr,
    dx_ptr,  # gradient of x (and of the residual)
    dw_part_ptr,  # fp32 [row groups, n_cols]: partial sums of dy * xhat, when WEIGHT_GRAD
    db_part_ptr,  # fp32 [row groups, n_cols]: partial sums of dy, when BIAS_GRAD
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
    stride_ro,  # dres: as for dy
    stride_rn,
    stride_ri,
    stride_dxo,  # dx: as for dy
    stride_dxn,
    stride_dxi,
    stride_so,  # statistics: outer and inner strides
    stride_si,
    stride_w,  # weight: elements between columns
    IS_RMS: tl.constexpr,
    SHIFT: tl.constexpr,  # LayerNorm rows shifted by their first element (see config.shifts)
    HAS_WEIGHT: tl.constexpr,
    HAS_DRES: tl.constexpr,
    WEIGHT_GRAD: tl.constexpr,
    BIAS_GRAD: tl.constexpr,
    SUMS_GIVEN: tl.constexpr,  # wide rows: one column block here, row sums from the first pass
    PREFETCH: tl.constexpr,  # load the next tile before computing this one
    REDUCE_TILES: tl.constexpr,  # partial sums summed over each tile's rows as it goes
    STAGES: tl.constexpr,  # the compiler's software pipeline over row tiles (cp.async into
    # shared memory, STAGES - 1 tiles in flight); None: not pipelined
    OUTER: tl.constexpr,
    INT64: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Programs are (column block, row group); each walks the row tiles of its group, so the
    # weight and bias partial sums stay in registers and one row of each reaches memory.
    pid_n = tl.program_id(0)
    pid_g = tl.program_id(1)
    cols = col_ids(BLOCK_N, INT64)
    if INT64:
        pid_n = tl.cast(pid_n, tl.int64)
    cols += pid_n * BLOCK_N
    col_mask = cols < n_cols
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols * stride_w, mask=col_mask, other=0.0).to(tl.float32)
    # Partial sums: a tile of them, reduced across the tile's rows once after the loop, or with
    # REDUCE_TILES one row, each tile's rows summed into it.
    if REDUCE_TILES:
        acc_w = tl.zeros([BLOCK_N], tl.float32)
        acc_b = tl.zeros([BLOCK_N], tl.float32)
    else:
        acc_w = tl.zeros([BLOCK_R, BLOCK_N], tl.float32)
        acc_b = tl.zeros([BLOCK_R, BLOCK_N], tl.float32)
    n_groups = tl.num_programs(1)
    if PREFETCH:
        dy_n, x_n, dres_n, shift_n, mean_n, rstd_n = _bwd_tile_load(
            pid_g, n_tiles, n_inner, n_iblocks, dy_ptr, x_ptr, dres_ptr, mean_ptr, rstd_ptr,
            cols, col_mask, stride_dyo, stride_dyn, stride_dyi, stride_xo, stride_xn, stride_xi,
            stride_ro, stride_rn, stride_ri, stride_so, stride_si, IS_RMS, SHIFT, HAS_DRES,
            BLOCK_R, INT64, OUTER,
        )  # fmt: skip
    for tile in tl.range(pid_g, n_tiles, n_groups, num_stages=STAGES):
        o, i, row_mask = tile_rows(tile, n_inner, n_iblocks, BLOCK_R, INT64, OUTER)
        s_offs = o * stride_so + i * stride_si
        mask = row_mask[:, None] & col_mask[None, :]
        # With PREFETCH the next tile's loads (rows and saved statistics) are issued before
        # this tile's reduction, so that a program keeps bytes in flight while it computes: one
        # or two programs fit on an SM (the kernel takes that many registers).
        loaded = _bwd_tile_load(
            tile + PREFETCH * n_groups, n_tiles, n_inner, n_iblocks, dy_ptr, x_ptr, dres_ptr,
            mean_ptr, rstd_ptr, cols, col_mask, stride_dyo, stride_dyn, stride_dyi, stride_xo,
            stride_xn, stride_xi, stride_ro, stride_rn, stride_ri, stride_so, stride_si, IS_RMS,
            SHIFT, HAS_DRES, BLOCK_R, INT64, OUTER,
        )  # fmt: skip
        if PREFETCH:
            dy, x, dres, shift, mean, rstd = dy_n, x_n, dres_n, shift_n, mean_n, rstd_n
            dy_n, x_n, dres_n, shift_n, mean_n, rstd_n = loaded
        else:
            dy, x, dres, shift, mean, rstd = loaded
        dy = dy.to(tl.float32)
        xhat = normalized(x.to(tl.float32), mask, shift, mean, rstd, IS_RMS)
        wdy = dy
        if HAS_WEIGHT:
            wdy = dy * w[None, :]
        dx = _bwd_dx(
            wdy, xhat, dres, rstd, c1_ptr, c2_ptr, s_offs, row_mask, n_cols, IS_RMS, HAS_DRES,
            SUMS_GIVEN,
        )  # fmt: skip
        tl.store(
            dx_ptr + (o * stride_dxo + i * stride_dxi)[:, None] + cols[None, :] * stride_dxn,
            dx.to(dx_ptr.dtype.element_ty),
            mask=mask,
        )
        acc_w, acc_b = _bwd_partials(
            acc_w, acc_b, dy, xhat, REDUCE_TILES, WEIGHT_GRAD, BIAS_GRAD
        )  # fmt: skip
    if not REDUCE_TILES:
        acc_w = tl.sum(acc_w, axis=0)
        acc_b = tl.sum(acc_b, axis=0)
    if WEIGHT_GRAD:
        tl.store(dw_part_ptr + pid_g * n_cols + cols, acc_w, mask=col_mask)
    if BIAS_GRAD:
        tl.store(db_part_ptr + pid_g * n_cols + cols, acc_b, mask=col_mask)
