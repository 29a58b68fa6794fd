"""The norm forward of one row per program with the row width a compile-time constant: two
sweeps over chunks, the statistics (per lane or per thread, merged once at the end), then the
output, re-reading the row from L2; both sweeps unrolled by the compiler (one compilation per
width). Taken by rows without a residual of contiguous columns within
``RowForwardConfig``."""

from __future__ import annotations

import triton
import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.rows import program_row


@kernel
def norm_fwd_row_kernel(
    x_ptr,  # input, seen as (n_outer, N_COLS, n_inner) with the strides below
    w_ptr,  # weight [N_COLS], when HAS_WEIGHT
    b_ptr,  # bias [N_COLS], when HAS_BIAS
    y_ptr,  # normalized output
    mean_ptr,  # fp32 per row, as norm_fwd_tiles_kernel's (LayerNorm only)
    rstd_ptr,  # fp32 per row
    n_inner,  # rows per outer index
    eps,
    stride_xo,  # x: outer, column and inner strides
    stride_xn,
    stride_xi,
    stride_yo,  # y: as for x
    stride_yn,
    stride_yi,
    stride_so,  # per-row statistics: outer and inner strides
    stride_si,
    stride_w,
    stride_b,
    N_COLS: tl.constexpr,  # the row width, a constant, so that both sweeps unroll
    IS_RMS: tl.constexpr,
    SHIFT: tl.constexpr,  # as norm_fwd_tiles_kernel's (see config.shifts)
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    OUTER: tl.constexpr,  # more than one outer index
    WELFORD: tl.constexpr,  # LayerNorm: per-lane Welford statistics (fp32), else pivot sums
    SCALE_FIRST: tl.constexpr,  # LayerNorm: x * rstd - mean * rstd, one FMA (16-bit rows)
    STORE: tl.constexpr,  # L2 policy of the output's stores (RowForwardConfig.store)
    BLOCK_N: tl.constexpr,
    THREAD_ELEMS: tl.constexpr,  # LayerNorm, not WELFORD: >0, sums per thread (see below)
):
    """One row per program: statistics over chunks of BLOCK_N (per lane, reduced once at the
    end), then the output, re-reading the row (an L2 hit). LayerNorm shifts by the first
    element (SHIFT) as the other paths do; each lane keeps its mean and M2, by Welford's update
    (WELFORD: fp32 rows) or as sums about its own first value (16-bit rows: cheaper on rows of
    several chunks, see docs/performance.md), and a first value far
    off the lane's mean costs fp32 digits that a
    16-bit row does not hold); the lanes are merged by Chan's formula. The saved mean is
    relative to the first-element shift.

    THREAD_ELEMS: the statistics per thread instead of per lane, each thread's THREAD_ELEMS
    contiguous values of a chunk summed in its registers about the thread's first value: two
    sums a thread instead of three per lane, and a first sweep that stays a loop (see
    config.ROW_THREAD_SUMS_MIN_COLS)."""
    o, i = program_row(n_inner, OUTER)
    x_row = x_ptr + o * stride_xo + i * stride_xi
    y_row = y_ptr + o * stride_yo + i * stride_yi
    s_offs = o * stride_so + i * stride_si
    if THREAD_ELEMS > 0:
        shift, mean, rstd = _row_thread_stats(
            x_row, stride_xn, eps, N_COLS, SHIFT, BLOCK_N, THREAD_ELEMS
        )  # fmt: skip
    else:
        shift, mean, rstd = _row_lane_stats(
            x_row, stride_xn, eps, N_COLS, IS_RMS, SHIFT, WELFORD, BLOCK_N
        )  # fmt: skip
    _store_row_stats(mean_ptr, rstd_ptr, s_offs, mean, rstd, IS_RMS)
    _row_fwd_output(
        x_row, y_row, w_ptr, b_ptr, stride_xn, stride_yn, stride_w, stride_b, shift, mean, rstd,
        N_COLS, IS_RMS, HAS_WEIGHT, HAS_BIAS, SCALE_FIRST, STORE, BLOCK_N,
    )  # fmt: skip


@triton.jit
def _row_lane_stats(
    x_row, stride_xn, eps, N_COLS: tl.constexpr, IS_RMS: tl.constexpr, SHIFT: tl.constexpr,
    WELFORD: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """(shift, mean relative to the shift, rstd) of a row by norm_fwd_row_kernel's first
    sweep, per lane (shift and mean 0 for RMSNorm)."""
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N_COLS
    x = tl.load(x_row + cols * stride_xn, mask=mask, other=0.0, eviction_policy="evict_last")
    x = x.to(tl.float32)
    shift = 0.0
    frame = 0.0
    if IS_RMS:
        acc = x * x
    else:
        if SHIFT:
            shift = tl.load(x_row).to(tl.float32)
        # WELFORD: each lane's running mean (frame) and M2 (acc2), merged across lanes at the
        # end: no reduction before the end, and no cancellation whatever the values' order.
        # Else frame is the lane's pivot, acc and acc2 its sums about it.
        frame = tl.where(mask, x - shift, 0.0)
        acc2 = tl.zeros([BLOCK_N], tl.float32)
        if not WELFORD:
            acc = tl.zeros([BLOCK_N], tl.float32)
    for start in range(BLOCK_N, N_COLS, BLOCK_N):
        c = start + cols
        mask = c < N_COLS
        x = tl.load(x_row + c * stride_xn, mask=mask, other=0.0, eviction_policy="evict_last")
        x = x.to(tl.float32)
        if IS_RMS:
            acc += x * x
        elif WELFORD:
            xs = x - shift
            d = tl.where(mask, xs - frame, 0.0)
            frame += d * (1.0 / (start // BLOCK_N + 1))  # the lane's values so far
            acc2 += d * tl.where(mask, xs - frame, 0.0)
        else:
            d = tl.where(mask, (x - shift) - frame, 0.0)
            acc += d
            acc2 += d * d
    if IS_RMS:
        rstd = tl.math.rsqrt(tl.sum(acc, axis=0) / N_COLS + eps)
        mean = 0.0
    else:
        # Chan's merge of the lanes: n_j values each (0 past the row), their mean and M2.
        n_j = ((N_COLS - cols + BLOCK_N - 1) // BLOCK_N).to(tl.float32)
        if WELFORD:
            lane_mean = frame
            lane_m2 = acc2
        else:
            lane_mean, lane_m2 = _pivot_moments(frame, acc, acc2, n_j)
        mean, rstd = _merge_moments(lane_mean, lane_m2, n_j, eps, N_COLS)
    return shift, mean, rstd


@triton.jit
def _pivot_moments(pivot, acc, acc2, n):
    """(mean, M2) of parts of n values each (0: none) from their sums of d and d^2, d = value -
    pivot."""
    per = tl.maximum(n, 1.0)
    return pivot + acc / per, acc2 - acc * (acc / per)


@triton.jit
def _merge_moments(part_mean, part_m2, n, eps, N_COLS: tl.constexpr):
    """(mean, rstd) of a row of N_COLS values from its parts' counts, means and M2 (Chan's
    formula)."""
    mean = tl.sum(part_mean * n, axis=0) / N_COLS
    dev = part_mean - mean
    m2 = tl.sum(part_m2 + n * dev * dev, axis=0)
    # a part's M2 may round below 0; a NaN stays NaN (tl.maximum would drop it)
    rstd = tl.math.rsqrt(tl.where(m2 < 0.0, 0.0, m2) / N_COLS + eps)
    return mean, rstd


@triton.jit
def _store_row_stats(mean_ptr, rstd_ptr, s_offs, mean, rstd, IS_RMS: tl.constexpr):
    if not IS_RMS:
        tl.store(mean_ptr + s_offs, mean)
    tl.store(rstd_ptr + s_offs, rstd)


@triton.jit
def _row_thread_stats(
    x_row, stride_xn, eps, N_COLS: tl.constexpr, SHIFT: tl.constexpr, BLOCK_N: tl.constexpr,
    V: tl.constexpr,
):  # fmt: skip
    """(shift, mean relative to the shift, rstd) of a LayerNorm row by norm_fwd_row_kernel's first
    sweep with THREAD_ELEMS = V: chunks of BLOCK_N seen as (BLOCK_N // V, V) tiles, one thread
    per tile row, each thread's sums about its own first value; Chan's merge of the threads."""
    T: tl.constexpr = BLOCK_N // V
    offs = tl.arange(0, T)[:, None] * V + tl.arange(0, V)[None, :]
    shift = 0.0
    if SHIFT:
        shift = tl.load(x_row).to(tl.float32)
    mask = offs < N_COLS
    x = tl.load(x_row + offs * stride_xn, mask=mask, other=0.0, eviction_policy="evict_last")
    xs = tl.where(mask, x.to(tl.float32) - shift, 0.0)
    pivot = tl.sum(tl.where(offs % V == 0, xs, 0.0), axis=1)  # the thread's first value
    d = tl.where(mask, xs - pivot[:, None], 0.0)
    acc = tl.sum(d, axis=1)
    acc2 = tl.sum(d * d, axis=1)
    for start in range(BLOCK_N, N_COLS, BLOCK_N):
        c = start + offs
        mask = c < N_COLS
        x = tl.load(x_row + c * stride_xn, mask=mask, other=0.0, eviction_policy="evict_last")
        d = tl.where(mask, (x.to(tl.float32) - shift) - pivot[:, None], 0.0)
        acc += tl.sum(d, axis=1)
        acc2 += tl.sum(d * d, axis=1)
    # The thread's count: V per full chunk, and its part of the last partial one.
    tail: tl.constexpr = N_COLS % BLOCK_N
    first = tl.arange(0, T) * V
    n_t = (N_COLS // BLOCK_N) * V + tl.minimum(tl.maximum(tail - first, 0), V)
    n_t = n_t.to(tl.float32)
    t_mean, t_m2 = _pivot_moments(pivot, acc, acc2, n_t)
    mean, rstd = _merge_moments(t_mean, t_m2, n_t, eps, N_COLS)
    return shift, mean, rstd


@triton.jit
def _row_fwd_output(
    x_row, y_row, w_ptr, b_ptr, stride_xn, stride_yn, stride_w, stride_b, shift, mean, rstd,
    N_COLS: tl.constexpr, IS_RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr, SCALE_FIRST: tl.constexpr, STORE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    """norm_fwd_row_kernel's second sweep: the row again (an L2 hit), normalized, stored."""
    cols = tl.arange(0, BLOCK_N)
    for start in range(0, N_COLS, BLOCK_N):
        c = start + cols
        mask = c < N_COLS
        x = tl.load(x_row + c * stride_xn, mask=mask, other=0.0, eviction_policy="evict_first")
        x = x.to(tl.float32)
        if IS_RMS:
            y = x * rstd
        elif SCALE_FIRST:
            y = x * rstd - mean * rstd
        else:
            y = ((x - shift) - mean) * rstd
        if HAS_WEIGHT:
            w = tl.load(w_ptr + c * stride_w, mask=mask, eviction_policy="evict_last")
            y *= w.to(tl.float32)
        if HAS_BIAS:
            b = tl.load(b_ptr + c * stride_b, mask=mask, eviction_policy="evict_last")
            y += b.to(tl.float32)
        tl.store(y_row + c * stride_yn, y.to(y_row.dtype.element_ty), mask=mask,
                 eviction_policy=STORE)  # fmt: skip
