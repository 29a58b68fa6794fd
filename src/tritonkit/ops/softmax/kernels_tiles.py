"""Softmax rows held in registers: each program takes a tile of BLOCK_R rows whose whole width
fits one BLOCK_N tile (``SoftmaxConfig.max_fused_cols``), reads it once and writes it once."""

from __future__ import annotations

import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.math import fast_exp
from tritonkit.ops._core.rows import col_ids, n_steps, tile_rows


@kernel
def softmax_fwd_tiles_kernel(
    x_ptr,  # input, seen as (n_outer, n_cols, n_inner) with the strides below
    y_ptr,  # output, same view
    n_cols,  # length of the reduced dimension
    n_inner,  # rows per outer index
    n_iblocks,  # row tiles per outer index: cdiv(n_inner, BLOCK_R)
    n_tiles,  # row tiles in all: n_outer * n_iblocks
    stride_xo,  # x: elements between outer indices
    stride_xn,  # x: elements between columns (along the reduced dim)
    stride_xi,  # x: elements between inner rows
    stride_yo,  # y: as for x
    stride_yn,
    stride_yi,
    LOG: tl.constexpr,  # log_softmax instead of softmax
    OUTER: tl.constexpr,  # more than one outer index
    ONE_TILE: tl.constexpr,  # one tile per program
    INT64: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    cols = col_ids(BLOCK_N, INT64)
    # A grid-stride walk over tiles; with ONE_TILE a constant trip count of 1, which the compiler
    # removes (a loop around one tile's body measured slower: docs/performance.md, softmax).
    for step in range(0, n_steps(n_tiles, ONE_TILE)):
        tile = tl.program_id(0) + step * tl.num_programs(0)
        o, i, row_mask = tile_rows(tile, n_inner, n_iblocks, BLOCK_R, INT64, OUTER)
        x_rows = x_ptr + o * stride_xo + i * stride_xi
        y_rows = y_ptr + o * stride_yo + i * stride_yi
        mask = row_mask[:, None] & (cols < n_cols)[None, :]
        x = tl.load(x_rows[:, None] + cols[None, :] * stride_xn, mask=mask, other=float("-inf"))
        x = x.to(tl.float32)
        z = x - tl.max(x, axis=1)[:, None]
        e = fast_exp(z)
        row_sum = tl.sum(e, axis=1)
        if LOG:
            y = z - tl.log(row_sum)[:, None]
        else:
            y = e * (1.0 / row_sum)[:, None]
        tl.store(
            y_rows[:, None] + cols[None, :] * stride_yn, y.to(y_ptr.dtype.element_ty), mask=mask
        )


@kernel
def softmax_bwd_tiles_kernel(
    dy_ptr,  # upstream gradient, seen as (n_outer, n_cols, n_inner)
    y_ptr,  # forward output (softmax, or log_softmax when LOG)
    dx_ptr,  # gradient of the input
    n_cols,  # as in the forward kernel
    n_inner,
    n_iblocks,
    n_tiles,
    stride_dyo,  # dy: outer, column and inner strides
    stride_dyn,
    stride_dyi,
    stride_yo,  # y: as for dy
    stride_yn,
    stride_yi,
    stride_dxo,  # dx: as for dy
    stride_dxn,
    stride_dxi,
    LOG: tl.constexpr,
    OUTER: tl.constexpr,
    ONE_TILE: tl.constexpr,
    INT64: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # softmax: dx = y * (dy - sum(dy * y)); log_softmax: dx = dy - exp(y) * sum(dy).
    cols = col_ids(BLOCK_N, INT64)
    # A grid-stride walk over tiles, as in the forward.
    for step in range(0, n_steps(n_tiles, ONE_TILE)):
        tile = tl.program_id(0) + step * tl.num_programs(0)
        o, i, row_mask = tile_rows(tile, n_inner, n_iblocks, BLOCK_R, INT64, OUTER)
        dy_rows = dy_ptr + o * stride_dyo + i * stride_dyi
        y_rows = y_ptr + o * stride_yo + i * stride_yi
        dx_rows = dx_ptr + o * stride_dxo + i * stride_dxi
        mask = row_mask[:, None] & (cols < n_cols)[None, :]
        dy = tl.load(dy_rows[:, None] + cols[None, :] * stride_dyn, mask=mask, other=0.0)
        y = tl.load(y_rows[:, None] + cols[None, :] * stride_yn, mask=mask, other=0.0)
        dy = dy.to(tl.float32)
        y = y.to(tl.float32)
        if LOG:
            dx = dy - fast_exp(y) * tl.sum(dy, axis=1)[:, None]
        else:
            dx = y * (dy - tl.sum(dy * y, axis=1)[:, None])
        tl.store(
            dx_rows[:, None] + cols[None, :] * stride_dxn,
            dx.to(dx_ptr.dtype.element_ty),
            mask=mask,
        )
