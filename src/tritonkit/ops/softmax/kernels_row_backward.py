"""The softmax backward of one row per program with the width a compile-time constant: two
sweeps over chunks (the row sum, then dx, re-reading dy and y from L2), both unrolled by the
compiler. Taken by 16-bit rows of contiguous columns within ``RowBackwardConfig``."""

from __future__ import annotations

import triton
import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.math import fast_exp
from tritonkit.ops._core.rows import program_row


@kernel
def softmax_bwd_row_kernel(
    dy_ptr,  # upstream gradient, seen as (n_outer, N_COLS, n_inner), columns contiguous
    y_ptr,  # forward output (softmax, or log_softmax when LOG)
    dx_ptr,  # gradient of the input
    n_inner,  # rows per outer index
    stride_dyo,  # dy: outer and inner strides
    stride_dyi,
    stride_yo,  # y: as for dy
    stride_yi,
    stride_dxo,  # dx: as for dy
    stride_dxi,
    N_COLS: tl.constexpr,  # the row width, a constant, so that both sweeps unroll
    LOG: tl.constexpr,
    OUTER: tl.constexpr,  # more than one outer index
    BLOCK_N: tl.constexpr,
):
    """One row per program: sum(dy * y) (log_softmax: sum(dy)) over chunks of BLOCK_N, then dx,
    re-reading dy and y (L2 hits)."""
    o, i = program_row(n_inner, OUTER)
    dy_row = dy_ptr + o * stride_dyo + i * stride_dyi
    y_row = y_ptr + o * stride_yo + i * stride_yi
    dx_row = dx_ptr + o * stride_dxo + i * stride_dxi
    total = bwd_row_total(dy_row, y_row, N_COLS, LOG, BLOCK_N)
    bwd_row_dx(dy_row, y_row, dx_row, N_COLS, total, LOG, BLOCK_N)


@triton.jit
def bwd_row_total(dy_row, y_row, n_cols, LOG: tl.constexpr, BLOCK_N: tl.constexpr):
    """sum(dy * y) (log_softmax: sum(dy)) over the columns [0, n_cols) of one row, in chunks,
    its loads kept in L2 for the second sweep (bwd_row_dx)."""
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        c = start + cols
        mask = c < n_cols
        dy = tl.load(dy_row + c, mask=mask, other=0.0, eviction_policy="evict_last")
        if LOG:
            acc += dy.to(tl.float32)
        else:
            y = tl.load(y_row + c, mask=mask, other=0.0, eviction_policy="evict_last")
            acc += dy.to(tl.float32) * y.to(tl.float32)
    return tl.sum(acc, axis=0)


@triton.jit
def bwd_row_dx(dy_row, y_row, dx_row, n_cols, total, LOG: tl.constexpr, BLOCK_N: tl.constexpr):
    """dx over the columns [0, n_cols) of one row, in chunks, from its row sum ``total``."""
    cols = tl.arange(0, BLOCK_N)
    for start in range(0, n_cols, BLOCK_N):
        c = start + cols
        mask = c < n_cols
        dy = tl.load(dy_row + c, mask=mask, other=0.0, eviction_policy="evict_first")
        y = tl.load(y_row + c, mask=mask, other=0.0, eviction_policy="evict_first")
        dy = dy.to(tl.float32)
        y = y.to(tl.float32)
        if LOG:
            dx = dy - fast_exp(y) * total
        else:
            dx = y * (dy - total)
        tl.store(dx_row + c, dx.to(dx_row.dtype.element_ty), mask=mask)
