"""The norm forward of rows wider than a tile (``NormTiles.max_fused_cols``): two
sweeps over chunks of BLOCK_N, the statistics, then the output, last chunk first so that the
chunks the first sweep read last are still in L2; the grid is capped at a few programs per SM
so that the rows in flight fit in L2.

Statistics (LOOP_STATS): RMSNorm sums squares per lane (1) or per chunk (0). LayerNorm (1)
shifts every value by the first chunk's mean and sums the deviations and their squares per
lane: that mean is within sqrt(n / BLOCK_N) standard deviations of the row's, so E[d^2] -
E[d]^2 loses at most a few bits; (0) merges the chunks by Chan's formula, their means taken
relative to the first chunk's. Options per launch: the next chunk's loads issued before the
current chunk is reduced (LOOP_PREFETCH), L2 hints on both sweeps (KEEP, DROP), and for fp32
rows with a residual the first sweep storing h = x + residual for the second to read back
(SUM_FIRST)."""

from __future__ import annotations

import triton
import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.rows import col_ids, load_chunk, n_steps, reverse_start, tile_rows
from tritonkit.ops.norm.kernels import load_sum, raw_sum, store_chunk


@triton.jit
def chunk_raw(
    x_rows, r_rows, start, cols, n_cols, stride_xn, stride_rn, row_mask,
    HAS_RESIDUAL: tl.constexpr, EVICT: tl.constexpr,
):  # fmt: skip
    """Columns [start, start + BLOCK_N) of a tile of rows of x (and the residual) as stored,
    0 where masked (a start at or past n_cols loads nothing), with the L2 policy EVICT ("" for
    none). Converted by ``_raw_sum`` where used, so that a prefetched chunk's loads do not stall
    the warp before it is needed."""
    x = load_chunk(x_rows, start, cols, n_cols, stride_xn, row_mask, 0.0, EVICT)
    r = x
    if HAS_RESIDUAL:
        r = load_chunk(r_rows, start, cols, n_cols, stride_rn, row_mask, 0.0, EVICT)
    return x, r


@triton.jit
def chunk_step(
    x_rows, r_rows, load_start, cols, n_cols, stride_xn, stride_rn, row_mask, xr_next, rr_next,
    HAS_RESIDUAL: tl.constexpr, EVICT: tl.constexpr, PREFETCH: tl.constexpr,
):  # fmt: skip
    """One step of a sweep over chunks: loads the chunk at ``load_start`` and returns the chunk
    to work on (x and residual as stored) and the pending one. With PREFETCH the chunk to work
    on is the one loaded a step earlier (``xr_next``, ``rr_next``) and the new load is pending,
    so that two chunks are in flight; without, it is the new load."""
    x, r = chunk_raw(
        x_rows, r_rows, load_start, cols, n_cols, stride_xn, stride_rn, row_mask, HAS_RESIDUAL,
        EVICT,
    )  # fmt: skip
    if PREFETCH:
        x, r, xr_next, rr_next = xr_next, rr_next, x, r
    return x, r, xr_next, rr_next


@triton.jit
def stats_sweep(
    x_rows, r_rows, h_rows, shift, cols, n_cols, stride_xn, stride_rn, stride_hn, row_mask,
    IS_RMS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, LOOP_PREFETCH: tl.constexpr,
    LOOP_STATS: tl.constexpr, KEEP: tl.constexpr, SUM_FIRST: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """The first sweep over a tile of rows: their statistics (see the module's docstring),
    and with SUM_FIRST h stored. Returns (mean, m2, ssq, acc, xr_next, rr_next): LayerNorm's
    mean of the shifted values and sum of squared deviations; RMSNorm's sum of squares, in ssq
    (LOOP_STATS 0) or still per lane in acc (1: the caller reduces it); the pending chunk of
    ``chunk_step``."""
    acc = tl.zeros([BLOCK_R, BLOCK_N], tl.float32)  # per lane: sum of squares / deviations
    acc2 = tl.zeros([BLOCK_R, BLOCK_N], tl.float32)  # per lane: squared deviations
    ssq = tl.zeros([BLOCK_R], tl.float32)  # RMSNorm per chunk: sum of squares so far
    mean = tl.zeros([BLOCK_R], tl.float32)
    m2 = tl.zeros([BLOCK_R], tl.float32)
    frame = tl.zeros([BLOCK_R], tl.float32)  # Chan's merge: the first chunk's mean
    first = 0
    # With LOOP_PREFETCH each chunk's loads are issued before the previous chunk is
    # reduced, in both sweeps: two chunks in flight per program instead of one (without
    # it, the pending chunk starts past the row: nothing is loaded).
    xr_next, rr_next = chunk_raw(
        x_rows, r_rows, (1 - LOOP_PREFETCH) * n_cols, cols, n_cols, stride_xn, stride_rn,
        row_mask, HAS_RESIDUAL, KEEP,
    )  # fmt: skip
    if not IS_RMS and LOOP_STATS == 1:
        # LayerNorm per lane: the first chunk's mean c (one reduction) shifts every
        # value, so that the sums of d = x - shift - c and d^2 need no reduction until
        # the end, and var = E[d^2] - E[d]^2 cancels little: the first chunk's mean is
        # within sqrt(n / BLOCK_N) standard deviations of the row's (its squared distance
        # times BLOCK_N is part of the row's sum of squared deviations).
        xr, rr, xr_next, rr_next = chunk_step(
            x_rows, r_rows, LOOP_PREFETCH * BLOCK_N, cols, n_cols, stride_xn, stride_rn,
            row_mask, xr_next, rr_next, HAS_RESIDUAL, KEEP, LOOP_PREFETCH,
        )  # fmt: skip
        mask = row_mask[:, None] & (cols < n_cols)[None, :]
        x = raw_sum(xr, rr, HAS_RESIDUAL)
        if SUM_FIRST:
            store_chunk(h_rows, cols, stride_hn, x, mask, KEEP)
        xs = tl.where(mask, x - shift[:, None], 0.0)
        mean = tl.sum(xs, axis=1) / tl.minimum(n_cols, BLOCK_N)
        acc = tl.where(mask, xs - mean[:, None], 0.0)
        acc2 = acc * acc
        first = BLOCK_N
    for start in range(first, n_cols, BLOCK_N):
        c = start + cols
        mask = row_mask[:, None] & (c < n_cols)[None, :]
        # One load per iteration: this chunk, or with LOOP_PREFETCH the next one.
        xr, rr, xr_next, rr_next = chunk_step(
            x_rows, r_rows, start + LOOP_PREFETCH * BLOCK_N, cols, n_cols, stride_xn,
            stride_rn, row_mask, xr_next, rr_next, HAS_RESIDUAL, KEEP, LOOP_PREFETCH,
        )  # fmt: skip
        x = raw_sum(xr, rr, HAS_RESIDUAL)
        if SUM_FIRST:
            store_chunk(h_rows, c, stride_hn, x, mask, KEEP)
        if IS_RMS:
            if LOOP_STATS == 1:
                acc += x * x
            else:
                ssq += tl.sum(x * x, axis=1)
        elif LOOP_STATS == 1:
            d = tl.where(mask, (x - shift[:, None]) - mean[:, None], 0.0)
            acc += d
            acc2 += d * d
        else:
            # Chan's merge of (count, mean, M2) of the rows so far with this chunk's,
            # each chunk's own by two passes over registers. The means are taken
            # relative to the first chunk's: a running mean far from 0 (a row whose
            # first element, the shift, is an outlier) would round at every merge.
            n_a = start * 1.0
            n_b = tl.minimum(n_cols - start, BLOCK_N) * 1.0
            xs = tl.where(mask, (x - shift[:, None]) - frame[:, None], 0.0)
            mean_b = tl.sum(xs, axis=1) / n_b
            d = tl.where(mask, xs - mean_b[:, None], 0.0)
            delta = mean_b - mean
            mean += delta * (n_b / (n_a + n_b))
            m2 += tl.sum(d * d, axis=1) + delta * delta * (n_a * n_b / (n_a + n_b))
            if start == 0:
                frame = mean
                mean = tl.zeros_like(mean)
    if not IS_RMS and LOOP_STATS == 1:
        d_mean = tl.sum(acc, axis=1) / n_cols
        m2 = tl.sum(acc2, axis=1) - d_mean * d_mean * n_cols
        mean += d_mean
    elif not IS_RMS:
        mean += frame
    return mean, m2, ssq, acc, xr_next, rr_next


@triton.jit
def output_sweep(
    src_rows, r_rows, h_rows, y_rows, w_ptr, b_ptr, shift, mean, rstd, xr_next, rr_next,
    n_chunks, cols, n_cols, src_stride, stride_rn, stride_hn, stride_yn, stride_w, stride_b,
    row_mask, src_res: tl.constexpr, IS_RMS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, LOOP_PREFETCH: tl.constexpr,
    SUM_FIRST: tl.constexpr, DROP: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """The second sweep over a tile of rows, last chunk first: y from the statistics (shift,
    mean, rstd) stored, and h without SUM_FIRST; the rows read from ``src_rows`` (x, or h),
    ``xr_next`` and ``rr_next`` the chunk already loaded (see ``chunk_step``)."""
    for k in range(0, n_chunks):
        start = reverse_start(k, n_chunks, BLOCK_N)
        c = start + cols
        mask = row_mask[:, None] & (c < n_cols)[None, :]
        xr, rr, xr_next, rr_next = chunk_step(
            src_rows, r_rows, reverse_start(k + LOOP_PREFETCH, n_chunks, BLOCK_N), cols,
            n_cols, src_stride, stride_rn, row_mask, xr_next, rr_next, src_res, DROP,
            LOOP_PREFETCH,
        )  # fmt: skip
        x = raw_sum(xr, rr, src_res)
        if HAS_RESIDUAL and not SUM_FIRST:
            store_chunk(h_rows, c, stride_hn, x, mask, "")
        if IS_RMS:
            y = x * rstd[:, None]
        else:
            y = ((x - shift[:, None]) - mean[:, None]) * rstd[:, None]
        if HAS_WEIGHT:
            y *= tl.load(w_ptr + c * stride_w, mask=c < n_cols).to(tl.float32)[None, :]
        if HAS_BIAS:
            y += tl.load(b_ptr + c * stride_b, mask=c < n_cols).to(tl.float32)[None, :]
        store_chunk(y_rows, c, stride_yn, y, mask, DROP)


@kernel
def norm_fwd_looped_kernel(
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
    LOOP_PREFETCH: tl.constexpr,  # load the next chunk before reducing this one
    LOOP_STATS: tl.constexpr,  # statistics: 0 per chunk (LayerNorm: Chan's merge), 1 per lane
    # (RMSNorm: sum of squares; LayerNorm: sums shifted by the first chunk's mean)
    KEEP: tl.constexpr,  # L2 policy of the first sweep's loads ("" or "evict_last")
    SUM_FIRST: tl.constexpr,  # with a residual: the first sweep stores h = x + residual and
    # the second reads h back (half the bytes of x and residual); fp32 only, where h holds the
    # sum exactly
    DROP: tl.constexpr,  # L2 policy of the second sweep ("" or "evict_first")
    OUTER: tl.constexpr,  # more than one outer index
    ONE_TILE: tl.constexpr,  # one tile per program
    INT64: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    cols = col_ids(BLOCK_N, INT64)
    n_programs = tl.num_programs(0)
    # A grid-stride walk; a constant trip count of 1 with ONE_TILE (see softmax's kernels).
    for step in tl.range(0, n_steps(n_tiles, ONE_TILE), num_stages=None):
        tile = tl.program_id(0) + step * n_programs
        o, i, row_mask = tile_rows(tile, n_inner, n_iblocks, BLOCK_R, INT64, OUTER)
        x_rows = x_ptr + o * stride_xo + i * stride_xi
        r_rows = r_ptr + o * stride_ro + i * stride_ri
        y_rows = y_ptr + o * stride_yo + i * stride_yi
        h_rows = h_ptr + o * stride_ho + i * stride_hi
        s_offs = o * stride_so + i * stride_si
        shift = tl.zeros([BLOCK_R], tl.float32)
        if SHIFT:
            # Each row's first element, as stored: the backward shifts by the same value.
            shift = load_sum(x_rows, r_rows, row_mask, HAS_RESIDUAL, True, "")
        mean, m2, ssq, acc, xr_next, rr_next = stats_sweep(
            x_rows, r_rows, h_rows, shift, cols, n_cols, stride_xn, stride_rn, stride_hn,
            row_mask, IS_RMS, HAS_RESIDUAL, LOOP_PREFETCH, LOOP_STATS, KEEP, SUM_FIRST, BLOCK_R,
            BLOCK_N,
        )  # fmt: skip
        n_chunks = tl.cdiv(n_cols, BLOCK_N)
        # The second sweep's source: x (and the residual), or h stored by the first sweep.
        src_rows, src_stride, src_res = x_rows, stride_xn, HAS_RESIDUAL
        if SUM_FIRST:
            src_rows, src_stride, src_res = h_rows, stride_hn, False
            tl.debug_barrier()  # h written by other threads of the program is visible
        # Last chunk first: the chunks read last by the first sweep are still in L2. Its
        # load is issued before the statistics are reduced, which it does not need.
        if LOOP_PREFETCH:
            xr_next, rr_next = chunk_raw(
                src_rows, r_rows, reverse_start(0, n_chunks, BLOCK_N), cols, n_cols,
                src_stride, stride_rn, row_mask, src_res, DROP,
            )  # fmt: skip
        if IS_RMS:
            if LOOP_STATS == 1:
                ssq = tl.sum(acc, axis=1)
            rstd = tl.math.rsqrt(ssq / n_cols + eps)
        else:
            # E[d^2] - E[d]^2 may round below 0; a NaN stays NaN (tl.maximum would drop it)
            rstd = tl.math.rsqrt(tl.where(m2 < 0.0, 0.0, m2) / n_cols + eps)
        output_sweep(
            src_rows, r_rows, h_rows, y_rows, w_ptr, b_ptr, shift, mean, rstd, xr_next, rr_next,
            n_chunks, cols, n_cols, src_stride, stride_rn, stride_hn, stride_yn, stride_w,
            stride_b, row_mask, src_res, IS_RMS, HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS, LOOP_PREFETCH,
            SUM_FIRST, DROP, BLOCK_N,
        )  # fmt: skip
        if not IS_RMS:
            tl.store(mean_ptr + s_offs, mean, mask=row_mask)
        tl.store(rstd_ptr + s_offs, rstd, mask=row_mask)
