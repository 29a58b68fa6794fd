"""Softmax rows wider than a tile (``SoftmaxConfig.max_fused_cols``): two sweeps over chunks.

The forward's first sweep takes each row's maximum and sum of exp(x - max) (an online softmax,
one exponential per element), the second writes the output; the backward's first sweep takes
sum(dy * y) (log_softmax: sum(dy)), the second writes dx. The second sweep reads the row again,
last chunk first, and the grid is capped at a few programs per SM, so that the rows in flight
fit in L2 and that second read does not reach DRAM. Optional per launch: the next chunk's loads
issued before the current chunk is used (PREFETCH), L2 eviction hints on both sweeps (KEEP,
DROP; ``rows.evict_kwargs``)."""

from __future__ import annotations

import triton
import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.math import LOG2E, fast_exp
from tritonkit.ops._core.rows import col_ids, load_chunk, n_steps, reverse_start, tile_rows


@triton.jit
def rescale(m, s, chunk_max):
    """One chunk of an online softmax: (m', ref, s rescaled to ref) for the running maximum m
    and sum s; the caller adds the chunk's sum of exp(x - ref). ref is m' = max(m, chunk_max),
    or 0 while everything so far is -inf (so that exp gives 0, not NaN)."""
    m_new = tl.maximum(m, chunk_max)
    ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    return m_new, ref, s * fast_exp(m - ref)


@triton.jit
def output_shift(row_max, row_sum, LOG: tl.constexpr):
    """The one value per row that the output subtracts (softmax_output): log_softmax x - (max
    + log(sum)), softmax exp2(x log2(e) - (max log2(e) + log2(sum))), one FMA and one exp2 per
    element instead of exp(x - max) / sum, which measured faster on wide rows
    (see docs/performance.md).
    An all -inf row gives NaN, as PyTorch does (-inf + inf)."""
    if LOG:
        return row_max + tl.log(row_sum)
    return row_max * LOG2E + tl.log2(row_sum)


@triton.jit
def softmax_output(x, shift, LOG: tl.constexpr):
    """softmax (log_softmax) of fp32 x from its row's output_shift."""
    if LOG:
        return x - shift
    return tl.exp2(x * LOG2E - shift)


@triton.jit
def _row_max_sum(
    x_rows,
    n_cols,
    stride_n,
    row_mask,
    cols,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREFETCH: tl.constexpr,
    EVICT: tl.constexpr,
    CHUNK_MAX: tl.constexpr,
):
    """Row maxima and sums of exp(x - max) in one sweep over chunks; one exp per element.

    With CHUNK_MAX each chunk is reduced as it comes: its maximum m' (a reduction across the
    tile), then s = s * exp(m - m') + sum(exp(x - m')), a max, a subtraction, an exp and an add
    per element. Without it each lane keeps its own running maximum m and sum s, combined once
    at the end: a new element x either raises the maximum (s = s * exp(m - x) + 1) or not
    (s += exp(x - m)), both exp(-|x - m|); about twice the instructions per element and no
    reduction per chunk. Either way -inf contributes nothing (a row that is -inf so far keeps
    s = 0); +inf or NaN make the row NaN, as PyTorch's softmax does.
    """
    if CHUNK_MAX:
        m = tl.full([BLOCK_R], float("-inf"), tl.float32)
        s = tl.zeros([BLOCK_R], tl.float32)
    else:
        m = tl.full([BLOCK_R, BLOCK_N], float("-inf"), tl.float32)
        s = tl.zeros([BLOCK_R, BLOCK_N], tl.float32)
    if PREFETCH:
        x_next = load_chunk(x_rows, 0, cols, n_cols, stride_n, row_mask, float("-inf"), EVICT)
    for start in range(0, n_cols, BLOCK_N):
        # One load per iteration: this chunk, or with PREFETCH the next one.
        loaded = load_chunk(
            x_rows, start + PREFETCH * BLOCK_N, cols, n_cols, stride_n, row_mask, float("-inf"),
            EVICT,
        )  # fmt: skip
        if PREFETCH:
            x = x_next
            x_next = loaded
        else:
            x = loaded
        x = x.to(tl.float32)
        if CHUNK_MAX:
            m, ref, s = rescale(m, s, tl.max(x, axis=1))
            s += tl.sum(fast_exp(x - ref[:, None]), axis=1)
        else:
            d = x - m
            e = fast_exp(-tl.abs(d))
            s_new = tl.where(d > 0.0, s * e + 1.0, s + e)
            s = tl.where(x == float("-inf"), s, s_new)  # also masked lanes: -inf - -inf is NaN
            m = tl.maximum(m, x)
    if CHUNK_MAX:
        row_max = m
        row_sum = s
    else:
        row_max = tl.max(m, axis=1)
        row_sum = tl.sum(s * fast_exp(m - row_max[:, None]), axis=1)
    return row_max, row_sum


@kernel
def softmax_fwd_looped_kernel(
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
    PREFETCH: tl.constexpr,  # load the next chunk before using the current one
    KEEP: tl.constexpr,  # L2 policy of the first sweep's loads ("" or "evict_last")
    DROP: tl.constexpr,  # L2 policy of the second sweep ("" or "evict_first")
    CHUNK_MAX: tl.constexpr,  # the first sweep reduces each chunk (see _row_max_sum)
    OUTER: tl.constexpr,  # more than one outer index
    ONE_TILE: tl.constexpr,  # one tile per program
    INT64: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    cols = col_ids(BLOCK_N, INT64)
    # A grid-stride walk over tiles (see softmax_fwd_tiles_kernel).
    for step in range(0, n_steps(n_tiles, ONE_TILE)):
        tile = tl.program_id(0) + step * tl.num_programs(0)
        o, i, row_mask = tile_rows(tile, n_inner, n_iblocks, BLOCK_R, INT64, OUTER)
        x_rows = x_ptr + o * stride_xo + i * stride_xi
        y_rows = y_ptr + o * stride_yo + i * stride_yi
        row_max, row_sum = _row_max_sum(
            x_rows, n_cols, stride_xn, row_mask, cols, BLOCK_R, BLOCK_N, PREFETCH, KEEP,
            CHUNK_MAX,
        )  # fmt: skip
        shift = output_shift(row_max, row_sum, LOG)
        n_chunks = tl.cdiv(n_cols, BLOCK_N)
        # Last chunk first: the chunks read last by the first sweep are still in L2.
        if PREFETCH:
            x_next = load_chunk(x_rows, reverse_start(0, n_chunks, BLOCK_N), cols, n_cols,
                            stride_xn, row_mask, 0.0, DROP)  # fmt: skip
        for k in range(0, n_chunks):
            start = reverse_start(k, n_chunks, BLOCK_N)
            loaded = load_chunk(x_rows, reverse_start(k + PREFETCH, n_chunks, BLOCK_N), cols,
                            n_cols, stride_xn, row_mask, 0.0, DROP)  # fmt: skip
            if PREFETCH:
                x = x_next
                x_next = loaded
            else:
                x = loaded
            c = start + cols
            mask = row_mask[:, None] & (c < n_cols)[None, :]
            y = softmax_output(x.to(tl.float32), shift[:, None], LOG)
            tl.store(
                y_rows[:, None] + c[None, :] * stride_yn,
                y.to(y_ptr.dtype.element_ty),
                mask=mask,
                eviction_policy=DROP,
            )


@kernel
def softmax_bwd_looped_kernel(
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
    PREFETCH: tl.constexpr,
    KEEP: tl.constexpr,  # as in the forward kernel
    DROP: tl.constexpr,
    OUTER: tl.constexpr,
    ONE_TILE: tl.constexpr,
    INT64: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # softmax: dx = y * (dy - sum(dy * y)); log_softmax: dx = dy - exp(y) * sum(dy).
    cols = col_ids(BLOCK_N, INT64)
    for step in range(0, n_steps(n_tiles, ONE_TILE)):
        tile = tl.program_id(0) + step * tl.num_programs(0)
        o, i, row_mask = tile_rows(tile, n_inner, n_iblocks, BLOCK_R, INT64, OUTER)
        dy_rows = dy_ptr + o * stride_dyo + i * stride_dyi
        y_rows = y_ptr + o * stride_yo + i * stride_yi
        dx_rows = dx_ptr + o * stride_dxo + i * stride_dxi
        # softmax needs sum(dy * y), log_softmax only sum(dy): y is not read in this sweep.
        acc = tl.zeros([BLOCK_R, BLOCK_N], tl.float32)
        if PREFETCH:
            dy_next = load_chunk(dy_rows, 0, cols, n_cols, stride_dyn, row_mask, 0.0, KEEP)
            if not LOG:
                y_next = load_chunk(y_rows, 0, cols, n_cols, stride_yn, row_mask, 0.0, KEEP)
        for start in range(0, n_cols, BLOCK_N):
            at = start + PREFETCH * BLOCK_N
            dy_loaded = load_chunk(dy_rows, at, cols, n_cols, stride_dyn, row_mask, 0.0, KEEP)
            if not LOG:
                y_loaded = load_chunk(y_rows, at, cols, n_cols, stride_yn, row_mask, 0.0, KEEP)
            if PREFETCH:
                dy = dy_next
                dy_next = dy_loaded
                if not LOG:
                    y = y_next
                    y_next = y_loaded
            else:
                dy = dy_loaded
                if not LOG:
                    y = y_loaded
            if LOG:
                acc += dy.to(tl.float32)
            else:
                acc += dy.to(tl.float32) * y.to(tl.float32)
        total = tl.sum(acc, axis=1)
        n_chunks = tl.cdiv(n_cols, BLOCK_N)
        # In reverse, as in the forward.
        if PREFETCH:
            first = reverse_start(0, n_chunks, BLOCK_N)
            dy_next = load_chunk(dy_rows, first, cols, n_cols, stride_dyn, row_mask, 0.0, DROP)
            y_next = load_chunk(y_rows, first, cols, n_cols, stride_yn, row_mask, 0.0, DROP)
        for k in range(0, n_chunks):
            start = reverse_start(k, n_chunks, BLOCK_N)
            at = reverse_start(k + PREFETCH, n_chunks, BLOCK_N)
            dy_loaded = load_chunk(dy_rows, at, cols, n_cols, stride_dyn, row_mask, 0.0, DROP)
            y_loaded = load_chunk(y_rows, at, cols, n_cols, stride_yn, row_mask, 0.0, DROP)
            if PREFETCH:
                dy, y = dy_next, y_next
                dy_next, y_next = dy_loaded, y_loaded
            else:
                dy, y = dy_loaded, y_loaded
            c = start + cols
            mask = row_mask[:, None] & (c < n_cols)[None, :]
            dy = dy.to(tl.float32)
            y = y.to(tl.float32)
            if LOG:
                dx = dy - fast_exp(y) * total[:, None]
            else:
                dx = y * (dy - total[:, None])
            tl.store(
                dx_rows[:, None] + c[None, :] * stride_dxn,
                dx.to(dx_ptr.dtype.element_ty),
                mask=mask,
                eviction_policy=DROP,
            )
