"""The cross-entropy forward over class-index targets: per-segment partials of each row
(``ce_stats_kernel``), merged per row into its logsumexp and loss (``ce_rows_kernel``), and the
reduction's sum or mean (``ce_reduce_kernel``, which also takes the mean's denominator, for
class-probability targets too); ``ce_weight_sum_kernel`` gives the class weights' sum where
label smoothing with class weights needs it.

A row is one (sample, position) of the logits (N, C) or (N, C, d): row r is
``(r // n_inner, r % n_inner)`` (``segments.row_offset``), each tensor with its own two row
strides."""

from __future__ import annotations

import triton
import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.math import aligned_row, edge_cols, fast_exp
from tritonkit.ops.cross_entropy.kernels_segments import (
    col_mask,
    max_sumexp,
    partials_max,
    row_ids,
    row_offset,
    segment,
    segment_cols,
    segment_offsets,
    span,
    weighted,
)


@kernel
def ce_weight_sum_kernel(
    w_ptr,  # class weights [n_cols]
    stats_ptr,  # fp32 [2]: out: the sum of all class weights, second
    n_cols,  # classes
    stride_w,  # weights: elements between classes
    BLOCK: tl.constexpr,
):
    # Label smoothing with class weights needs their sum in the row kernel. One program, a fixed
    # summation order: deterministic.
    offs = tl.arange(0, BLOCK)
    acc_w = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        c = start + offs
        acc_w += tl.load(w_ptr + c * stride_w, mask=c < n_cols, other=0.0).to(tl.float32)
    tl.store(stats_ptr + 1, tl.sum(acc_w, axis=0))


@triton.jit
def _mean_denominator(
    t_ptr, w_ptr, n_rows, n_cols, n_inner, stride_tm, stride_ts, stride_w, ignore_index,
    HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """The mean's denominator: the sum of w[t] over non-ignored rows (their count without class
    weights, exact for any number of rows), in a fixed order."""
    offs = tl.arange(0, BLOCK)
    if HAS_WEIGHT:
        acc = tl.zeros([BLOCK], tl.float32)
    else:
        count = tl.zeros([BLOCK], tl.int32)
    for start in range(0, n_rows, BLOCK):
        r = start + offs
        t_off = row_offset(r, n_inner, stride_tm, stride_ts)
        t = tl.load(t_ptr + t_off, mask=r < n_rows, other=ignore_index)
        keep = (r < n_rows) & (t != ignore_index)
        if HAS_WEIGHT:
            in_range = keep & (t >= 0) & (t < n_cols)
            wt = tl.load(w_ptr + tl.where(in_range, t, 0) * stride_w, mask=in_range, other=0.0)
            acc += wt.to(tl.float32)
        else:
            count += keep.to(tl.int32)
    if HAS_WEIGHT:
        den = tl.sum(acc, axis=0)
    else:
        den = tl.sum(count, axis=0).to(tl.float32)
    return den


@kernel
def ce_stats_kernel(
    x_ptr,  # logits [n_rows, n_cols], any strides
    t_ptr,  # int64 targets [n_rows]
    w_ptr,  # class weights [n_cols], when HAS_WEIGHT and HAS_SMOOTHING
    part_ptr,  # fp32 out: partials [K, n_rows, n_segments]: max, sum exp(x - max), sum w x
    n_rows,  # N * d (rows of every position)
    n_cols,
    n_segments,  # segments per row: cdiv(n_cols, BLOCK_N)
    n_inner,  # positions per sample d: row r is (r // n_inner, r % n_inner)
    stride_xm,  # logits: elements between samples
    stride_xs,  # logits: elements between positions
    stride_xn,  # logits: elements between classes
    stride_tm,  # targets: elements between samples
    stride_ts,  # targets: elements between positions
    stride_w,  # weights: elements between classes
    stride_pk,  # partials: elements between planes (n_rows * n_segments)
    ignore_index,  # rows with this target: logits not read
    HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr,  # K = 3: the sum_c w[c] * x[c] term is needed
    INT64: tl.constexpr,
    ALIGN: tl.constexpr,  # elements per 128 bytes: segments cut each row's aligned body; or 0
    BLOCK_M: tl.constexpr,  # rows per tile (1 unless the rows are shorter than a segment)
    BLOCK_N: tl.constexpr,  # classes per segment
):
    rows, start, offs = segment(n_segments, BLOCK_M, BLOCK_N, INT64)
    row_in = rows < n_rows
    t_off = row_offset(rows, n_inner, stride_tm, stride_ts)
    t = tl.load(t_ptr + t_off, mask=row_in, other=ignore_index)
    active = row_in & (t != ignore_index)  # ignored rows: their logits are never read
    row_off = row_offset(rows, n_inner, stride_xm, stride_xs)
    head, n_body = span(row_off, n_cols, ALIGN)
    first = head + start
    col_in = col_mask(offs, n_body, start, ALIGN)
    mask = active[:, None] & col_in
    x_seg = x_ptr + segment_offsets(row_off, first, stride_xn, ALIGN, BLOCK_N)
    x = tl.load(x_seg[:, None] + offs[None, :] * stride_xn, mask=mask, other=float("-inf"))
    x = x.to(tl.float32)
    seg_max, _, seg_sum = max_sumexp(x)
    p = part_ptr + rows * n_segments + (tl.program_id(0) % n_segments)
    tl.store(p, seg_max, mask=row_in)
    tl.store(p + stride_pk, seg_sum, mask=row_in)
    if HAS_SMOOTHING:
        cols = segment_cols(first, start, offs, ALIGN)
        wx = tl.sum(weighted(x, mask, w_ptr, cols, col_in, stride_w, HAS_WEIGHT), axis=1)
        tl.store(p + 2 * stride_pk, wx, mask=row_in)


@kernel
def ce_rows_kernel(
    x_ptr,  # logits [n_rows, n_cols], any strides: only x[i, t_i] is read
    t_ptr,  # int64 targets [n_rows]
    w_ptr,  # class weights [n_cols], when HAS_WEIGHT
    stats_ptr,  # fp32 [2]: the sum of class weights second (ce_weight_sum_kernel)
    part_ptr,  # fp32 partials [K, n_rows, n_segments] from ce_stats_kernel
    loss_ptr,  # per-row losses: fp32 (summed later) or the output dtype (reduction "none")
    lse_ptr,  # fp32 out: logsumexp per row [n_rows] (0 on ignored rows), when HAS_GRAD
    n_rows,
    n_cols,
    n_segments,
    n_inner,  # positions per sample: row r is (r // n_inner, r % n_inner)
    stride_xm,  # logits: elements between samples
    stride_xs,  # logits: elements between positions
    stride_xn,  # logits: elements between classes
    stride_tm,  # targets: elements between samples
    stride_ts,  # targets: elements between positions
    stride_w,  # weights: elements between classes
    stride_pk,  # partials: elements between planes
    stride_l,  # losses: elements between rows
    ignore_index,  # rows with this target: zero loss
    smoothing,  # label_smoothing, in [0, 1]
    HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr,  # smoothing > 0: the partials have the sum_c w[c] x[c] plane
    HAS_GRAD: tl.constexpr,
    INT64: tl.constexpr,
    ALIGN: tl.constexpr,  # as ce_stats_kernel's: the rows' edges are merged here
    BLOCK_R: tl.constexpr,  # rows per program
    BLOCK_S: tl.constexpr,  # partials per row per step
):
    rows = row_ids(tl.program_id(0), BLOCK_R, INT64)
    row_in = rows < n_rows
    t_off = row_offset(rows, n_inner, stride_tm, stride_ts)
    t = tl.load(t_ptr + t_off, mask=row_in, other=ignore_index)
    ignored = t == ignore_index
    active = row_in & (t != ignore_index)
    valid = (t >= 0) & (t < n_cols)
    # A target outside [0, n_cols) stops the kernel as PyTorch's device-side assert does, where
    # the launch compiles asserts in (debug=True: config.py, CHECK_TARGETS);
    # else its row's loss and gradient are NaN.
    tl.device_assert(valid | ignored, "cross_entropy: target out of range [0, n_classes)")
    t_safe = tl.where(valid, t, 0)
    # logsumexp of the row from the segments' (max, sum): max of the maxima first, then the
    # sums rescaled to it. Padding partials are (-inf, 0) and add nothing.
    segs = tl.arange(0, BLOCK_S)
    p_rows = part_ptr + rows * n_segments
    row_max = partials_max(p_rows, n_segments, active, BLOCK_R, BLOCK_S)
    row_off = row_offset(rows, n_inner, stride_xm, stride_xs)
    if ALIGN:  # the classes outside each row's aligned body, which no segment read
        head, n_body = aligned_row(row_off, n_cols, ALIGN)
        ec, em = edge_cols(head[:, None], n_body[:, None], n_cols, ALIGN)
        em = em & active[:, None]
        xe = tl.load(x_ptr + row_off[:, None] + ec, mask=em, other=float("-inf")).to(tl.float32)
        row_max = tl.maximum(row_max, tl.max(xe, axis=1))  # a NaN here makes the sum NaN
    shift = tl.where(row_max == float("-inf"), 0.0, row_max)  # all -inf: lse -inf, loss NaN
    s_acc = tl.zeros([BLOCK_R, BLOCK_S], tl.float32)
    wx_acc = tl.zeros([BLOCK_R, BLOCK_S], tl.float32)
    for j in range(0, n_segments, BLOCK_S):
        mask = active[:, None] & (j + segs < n_segments)[None, :]
        p = p_rows[:, None] + (j + segs)[None, :]
        m = tl.load(p, mask=mask, other=float("-inf"))
        s_acc += tl.load(p + stride_pk, mask=mask, other=0.0) * fast_exp(m - shift[:, None])
        if HAS_SMOOTHING:
            wx_acc += tl.load(p + 2 * stride_pk, mask=mask, other=0.0)
    row_sum = tl.sum(s_acc, axis=1)
    wx = tl.sum(wx_acc, axis=1)
    if ALIGN:
        row_sum += tl.sum(fast_exp(xe - shift[:, None]), axis=1)
        if HAS_SMOOTHING:
            wx += tl.sum(weighted(xe, em, w_ptr, ec, em, stride_w, HAS_WEIGHT), axis=1)
    lse = shift + tl.log(tl.where(active, row_sum, 1.0))  # ignored rows: 0, no log(0)
    x_t = tl.load(x_ptr + row_off + t_safe * stride_xn, mask=active, other=0.0)
    w_t = tl.full([BLOCK_R], 1.0, tl.float32)
    if HAS_WEIGHT:
        w_t = tl.load(w_ptr + t_safe * stride_w, mask=active, other=0.0).to(tl.float32)
    loss = (1.0 - smoothing) * w_t * (lse - x_t.to(tl.float32))
    if HAS_SMOOTHING:  # skipped at 0: its -inf logits would make 0 * inf = NaN
        w_sum = n_cols * 1.0
        if HAS_WEIGHT:
            w_sum = tl.load(stats_ptr + 1)
        loss += smoothing / n_cols * (lse * w_sum - wx)
    loss = tl.where(ignored, 0.0, tl.where(valid, loss, float("nan")))
    tl.store(loss_ptr + rows * stride_l, loss.to(loss_ptr.dtype.element_ty), mask=row_in)
    if HAS_GRAD:
        tl.store(lse_ptr + rows, lse, mask=row_in)


@kernel
def ce_reduce_kernel(
    loss_ptr,  # fp32 per-row losses [n_rows], contiguous
    t_ptr,  # int64 targets [n_rows], when MEAN and not SOFT
    w_ptr,  # class weights [n_cols], when MEAN and HAS_WEIGHT and not SOFT
    stats_ptr,  # fp32 [2]: out with MEAN: the mean's denominator, first (the backward's too)
    out_ptr,  # the reduced loss, a scalar in the loss dtype
    n_rows,  # losses to sum
    n_cols,  # classes
    n_inner,  # positions per sample: row r is (r // n_inner, r % n_inner)
    stride_tm,  # targets: elements between samples
    stride_ts,  # targets: elements between positions
    stride_w,  # weights: elements between classes
    ignore_index,
    MEAN: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    SOFT: tl.constexpr,  # class-probability targets: the mean divides by the rows, N * d
    BLOCK: tl.constexpr,
):
    # One program, fixed summation orders: deterministic. The mean's denominator is taken here
    # rather than in a launch of its own (one launch fewer per call).
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_rows, BLOCK):
        acc += tl.load(loss_ptr + start + offs, mask=start + offs < n_rows, other=0.0)
    total = tl.sum(acc, axis=0)
    if MEAN:
        if SOFT:  # as PyTorch: input.numel() / C, whatever the weights
            den = n_rows * 1.0
        else:
            den = _mean_denominator(
                t_ptr, w_ptr, n_rows, n_cols, n_inner, stride_tm, stride_ts, stride_w,
                ignore_index, HAS_WEIGHT, BLOCK,
            )  # fmt: skip
        tl.store(stats_ptr, den)
        total = total / den  # 0 / 0 = NaN when every target is ignored
    tl.store(out_ptr, total.to(out_ptr.dtype.element_ty))
