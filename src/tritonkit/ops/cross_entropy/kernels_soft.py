"""Cross-entropy over class-probability targets (a float target of the logits' shape), in the
segments of the class-index kernels (segments.py).

For row i with logits x, target t, class weights w (1 without), smoothing e and C classes,
PyTorch's loss is ``-sum_c w[c] t'[c] log_softmax(x)[c]`` with ``t' = (1 - e) t + e / C``.
Writing u[c] = w[c] t'[c] and S = sum_c u[c]::

    loss_i = sum_c u[c] (lse - x[c]) = S (lse - m) + sum_c u[c] (m - x[c])

for any shift m. With m a segment's maximum, both terms are sums of non-negative numbers (for
non-negative weights and targets): no cancellation however far the logits sit from 0, where
``lse * S - sum_c u[c] x[c]`` would lose the loss in the rounding of lse * S.

1. ``ce_soft_stats_kernel`` reads a segment of the logits and of the target once and writes
   four floats: the segment's maximum m_k, sum exp(x - m_k), S_k = sum u and
   D_k = sum u (m_k - x).
2. ``ce_soft_rows_kernel`` merges them: with M the row's maximum,
   ``loss = S log(sum_k s_k exp(m_k - M)) + sum_k (S_k (M - m_k) + D_k)``, and keeps the
   row's lse, as M and lse - M, and S for the backward (x - M is exact where x is near M,
   where x - lse would round lse to float32 first: 2**-11 at logits near 10^4).
3. ``ce_soft_grad_kernel`` reads the logits and target again and writes
   ``dx = (softmax(x) S - u) * scale`` in the logits' dtype, and where the target needs a
   gradient (PyTorch differentiates it) ``dt = (1 - e) w (lse - x) * scale`` in the
   target's dtype; scale is grad_output (divided by N * d for the mean, as PyTorch's).

NaN and inf follow PyTorch's products: a -inf logit with u = 0 gives 0 * inf = NaN, as
``log_softmax * target`` does; with u > 0 the loss is +inf.
"""

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
)


@triton.jit
def smoothed(t, mask, w_ptr, cols, cols_in, stride_w, n_cols, smoothing, HAS_WEIGHT: tl.constexpr):
    """u = w[c] * ((1 - e) t + e / C) in float32 at columns ``cols``, 0 where masked."""
    u = t.to(tl.float32) * (1.0 - smoothing) + smoothing / n_cols
    if HAS_WEIGHT:
        u = tl.load(w_ptr + cols * stride_w, mask=cols_in, other=0.0).to(tl.float32) * u
    return tl.where(mask, u, 0.0)


@kernel
def ce_soft_stats_kernel(
    x_ptr,  # logits [n_rows, n_cols], any strides
    t_ptr,  # target probabilities [n_rows, n_cols], any strides, any float dtype
    w_ptr,  # class weights [n_cols], when HAS_WEIGHT
    part_ptr,  # fp32 out: partials [4, n_rows, n_segments]: m, sum exp(x - m), S, D
    n_rows,  # N * d (rows of every position)
    n_cols,
    n_segments,  # segments per row: cdiv(n_cols, BLOCK_N)
    n_inner,  # positions per sample d: row r is (r // n_inner, r % n_inner)
    stride_xm,  # logits: elements between samples
    stride_xs,  # logits: elements between positions
    stride_xn,  # logits: elements between classes
    stride_tm,  # target: elements between samples
    stride_ts,  # target: elements between positions
    stride_tn,  # target: elements between classes
    stride_w,  # weights: elements between classes
    stride_pk,  # partials: elements between planes (n_rows * n_segments)
    smoothing,  # label_smoothing, in [0, 1]
    HAS_WEIGHT: tl.constexpr,
    INT64: tl.constexpr,
    ALIGN: tl.constexpr,  # as ce_stats_kernel's; the target's rows start as the logits' do
    BLOCK_M: tl.constexpr,  # rows per tile (1 unless the rows are shorter than a segment)
    BLOCK_N: tl.constexpr,  # classes per segment
):
    rows, start, offs = segment(n_segments, BLOCK_M, BLOCK_N, INT64)
    row_in = rows < n_rows
    row_x = row_offset(rows, n_inner, stride_xm, stride_xs)
    row_t = row_offset(rows, n_inner, stride_tm, stride_ts)
    head, n_body = span(row_x, n_cols, ALIGN)
    first = head + start
    col_in = col_mask(offs, n_body, start, ALIGN)
    mask = row_in[:, None] & col_in
    x_seg = x_ptr + segment_offsets(row_x, first, stride_xn, ALIGN, BLOCK_N)
    t_seg = t_ptr + segment_offsets(row_t, first, stride_tn, ALIGN, BLOCK_N)
    x = tl.load(x_seg[:, None] + offs[None, :] * stride_xn, mask=mask, other=float("-inf"))
    t = tl.load(t_seg[:, None] + offs[None, :] * stride_tn, mask=mask, other=0.0)
    x = x.to(tl.float32)
    seg_max, shift, seg_sum = max_sumexp(x)
    cols = segment_cols(first, start, offs, ALIGN)
    u = smoothed(t, mask, w_ptr, cols, col_in, stride_w, n_cols, smoothing, HAS_WEIGHT)
    dev = tl.where(mask, u * (shift[:, None] - x), 0.0)
    p = part_ptr + rows * n_segments + (tl.program_id(0) % n_segments)
    tl.store(p, seg_max, mask=row_in)
    tl.store(p + stride_pk, seg_sum, mask=row_in)
    tl.store(p + 2 * stride_pk, tl.sum(u, axis=1), mask=row_in)
    tl.store(p + 3 * stride_pk, tl.sum(dev, axis=1), mask=row_in)


@kernel
def ce_soft_rows_kernel(
    x_ptr,  # logits [n_rows, n_cols]: only the edges outside the aligned body, with ALIGN
    t_ptr,  # target probabilities [n_rows, n_cols]: as the logits
    w_ptr,  # class weights [n_cols], when HAS_WEIGHT
    stats_ptr,  # unused: the class-index row kernel's argument, so that both launch alike
    part_ptr,  # fp32 partials [4, n_rows, n_segments] from ce_soft_stats_kernel
    loss_ptr,  # per-row losses: fp32 (summed later) or the loss dtype (reduction "none")
    rstats_ptr,  # fp32 out [3, n_rows], when HAS_GRAD: per row M, lse - M, S = sum_c u[c]
    n_rows,
    n_cols,
    n_segments,
    n_inner,  # positions per sample: row r is (r // n_inner, r % n_inner)
    stride_xm,  # logits: elements between samples
    stride_xs,  # logits: elements between positions
    stride_tm,  # target: elements between samples
    stride_ts,  # target: elements between positions
    stride_w,  # weights: elements between classes
    stride_pk,  # partials: elements between planes
    smoothing,  # label_smoothing, in [0, 1]
    HAS_WEIGHT: tl.constexpr,
    HAS_GRAD: tl.constexpr,
    INT64: tl.constexpr,
    ALIGN: tl.constexpr,  # as ce_soft_stats_kernel's: the rows' edges are merged here
    BLOCK_R: tl.constexpr,  # rows per program
    BLOCK_S: tl.constexpr,  # partials per row per step
):
    rows = row_ids(tl.program_id(0), BLOCK_R, INT64)
    row_in = rows < n_rows
    segs = tl.arange(0, BLOCK_S)
    p_rows = part_ptr + rows * n_segments
    row_max = partials_max(p_rows, n_segments, row_in, BLOCK_R, BLOCK_S)
    if ALIGN:  # the classes outside each row's aligned body (unit class strides)
        row_x = row_offset(rows, n_inner, stride_xm, stride_xs)
        row_t = row_offset(rows, n_inner, stride_tm, stride_ts)
        head, n_body = aligned_row(row_x, n_cols, ALIGN)
        ec, em = edge_cols(head[:, None], n_body[:, None], n_cols, ALIGN)
        em = em & row_in[:, None]
        xe = tl.load(x_ptr + row_x[:, None] + ec, mask=em, other=float("-inf")).to(tl.float32)
        te = tl.load(t_ptr + row_t[:, None] + ec, mask=em, other=0.0)
        row_max = tl.maximum(row_max, tl.max(xe, axis=1))
    shift = tl.where(row_max == float("-inf"), 0.0, row_max)
    s_acc = tl.zeros([BLOCK_R, BLOCK_S], tl.float32)
    u_acc = tl.zeros([BLOCK_R, BLOCK_S], tl.float32)
    d_acc = tl.zeros([BLOCK_R, BLOCK_S], tl.float32)
    for j in range(0, n_segments, BLOCK_S):
        mask = row_in[:, None] & (j + segs < n_segments)[None, :]
        p = p_rows[:, None] + (j + segs)[None, :]
        m = tl.load(p, mask=mask, other=float("-inf"))
        s_acc += tl.load(p + stride_pk, mask=mask, other=0.0) * fast_exp(m - shift[:, None])
        u_k = tl.load(p + 2 * stride_pk, mask=mask, other=0.0)
        u_acc += u_k
        # The segment's terms moved from its shift to the row's: S_k (M - m_k) + D_k, the
        # segment's shift being 0 where it was all -inf (max_sumexp), as in the stats kernel.
        m_k = tl.where(m == float("-inf"), 0.0, m)
        d_k = u_k * (shift[:, None] - m_k) + tl.load(p + 3 * stride_pk, mask=mask, other=0.0)
        d_acc += tl.where(mask, d_k, 0.0)
    row_sum = tl.sum(s_acc, axis=1)
    s_u = tl.sum(u_acc, axis=1)
    dev = tl.sum(d_acc, axis=1)
    if ALIGN:
        row_sum += tl.sum(fast_exp(xe - shift[:, None]), axis=1)
        ue = smoothed(te, em, w_ptr, ec, em, stride_w, n_cols, smoothing, HAS_WEIGHT)
        s_u += tl.sum(ue, axis=1)
        dev += tl.sum(tl.where(em, ue * (shift[:, None] - xe), 0.0), axis=1)
    log_sum = tl.log(tl.where(row_in, row_sum, 1.0))  # all -inf: -inf, and the loss NaN
    loss = log_sum * s_u + dev
    tl.store(loss_ptr + rows, loss.to(loss_ptr.dtype.element_ty), mask=row_in)
    if HAS_GRAD:
        tl.store(rstats_ptr + rows, shift, mask=row_in)
        tl.store(rstats_ptr + n_rows + rows, log_sum, mask=row_in)
        tl.store(rstats_ptr + 2 * n_rows + rows, s_u, mask=row_in)


@kernel
def ce_soft_grad_kernel(
    x_ptr,  # logits [n_rows, n_cols], any strides
    t_ptr,  # target probabilities [n_rows, n_cols], any strides
    w_ptr,  # class weights [n_cols], when HAS_WEIGHT
    rstats_ptr,  # fp32 [3, n_rows]: M, lse - M, S per row (ce_soft_rows_kernel)
    go_ptr,  # grad_output: one value per row, or a scalar (strides 0)
    grad_ptr,  # out: gradient of the logits [n_rows, n_cols], when LOGITS_GRAD
    tgrad_ptr,  # out: gradient of the target [n_rows, n_cols], when TARGET_GRAD
    n_rows,
    n_cols,
    n_segments,  # segments per row: cdiv(n_cols, BLOCK_N)
    n_inner,  # positions per sample: row r is (r // n_inner, r % n_inner)
    stride_xm,  # logits: elements between samples
    stride_xs,  # logits: elements between positions
    stride_xn,  # logits: elements between classes
    stride_tm,  # target: elements between samples
    stride_ts,  # target: elements between positions
    stride_tn,  # target: elements between classes
    stride_w,  # weights: elements between classes
    stride_gom,  # grad_output: elements between samples (0 for a reduced loss)
    stride_gos,  # grad_output: elements between positions
    stride_gm,  # logits' gradient: elements between samples
    stride_gs,  # logits' gradient: elements between positions
    stride_gn,  # logits' gradient: elements between classes
    stride_dm,  # target's gradient: elements between samples
    stride_ds,  # target's gradient: elements between positions
    stride_dn,  # target's gradient: elements between classes
    smoothing,  # label_smoothing, in [0, 1]
    HAS_WEIGHT: tl.constexpr,
    MEAN: tl.constexpr,  # the gradient is divided by the rows, N * d
    LOGITS_GRAD: tl.constexpr,
    TARGET_GRAD: tl.constexpr,
    INT64: tl.constexpr,
    ALIGN: tl.constexpr,  # as the stats kernel's; the gradients' rows start as the logits' do
    BLOCK_M: tl.constexpr,  # rows per tile
    BLOCK_N: tl.constexpr,  # classes per segment
):
    rows, start, offs = segment(n_segments, BLOCK_M, BLOCK_N, INT64)
    row_in = rows < n_rows
    shift = tl.load(rstats_ptr + rows, mask=row_in, other=0.0)
    log_sum = tl.load(rstats_ptr + n_rows + rows, mask=row_in, other=0.0)
    s_u = tl.load(rstats_ptr + 2 * n_rows + rows, mask=row_in, other=0.0)
    go_off = row_offset(rows, n_inner, stride_gom, stride_gos)
    scale = tl.load(go_ptr + go_off, mask=row_in, other=0.0).to(tl.float32)
    if MEAN:
        scale = scale / n_rows
    row_x = row_offset(rows, n_inner, stride_xm, stride_xs)
    row_t = row_offset(rows, n_inner, stride_tm, stride_ts)
    row_g = row_offset(rows, n_inner, stride_gm, stride_gs)
    row_d = row_offset(rows, n_inner, stride_dm, stride_ds)
    head, n_body = span(row_x, n_cols, ALIGN)
    first = head + start
    col_in = col_mask(offs, n_body, start, ALIGN)
    mask = row_in[:, None] & col_in
    row = (shift, log_sum, s_u, scale, smoothing, n_cols)
    if ALIGN:  # segment 0 also takes the row's edge, loaded first (as ce_grad_kernel's)
        ec, em = edge_cols(head[:, None], n_body[:, None], n_cols, ALIGN)
        em = em & (start == 0) & row_in[:, None]
        xe = tl.load(x_ptr + row_x[:, None] + ec, mask=em, other=0.0)
        te = tl.load(t_ptr + row_t[:, None] + ec, mask=em, other=0.0)
    x_seg = x_ptr + segment_offsets(row_x, first, stride_xn, ALIGN, BLOCK_N)
    t_seg = t_ptr + segment_offsets(row_t, first, stride_tn, ALIGN, BLOCK_N)
    x = tl.load(x_seg[:, None] + offs[None, :] * stride_xn, mask=mask, other=0.0)
    t = tl.load(t_seg[:, None] + offs[None, :] * stride_tn, mask=mask, other=0.0)
    cols = segment_cols(first, start, offs, ALIGN)
    if LOGITS_GRAD:
        g_seg = grad_ptr + segment_offsets(row_g, first, stride_gn, ALIGN, BLOCK_N)
        g = _logits_grad(x, t, mask, w_ptr, cols, col_in, stride_w, row, HAS_WEIGHT)
        tl.store(g_seg[:, None] + offs[None, :] * stride_gn, g.to(grad_ptr.dtype.element_ty),
                 mask=mask)  # fmt: skip
    if TARGET_GRAD:
        d_seg = tgrad_ptr + segment_offsets(row_d, first, stride_dn, ALIGN, BLOCK_N)
        d = _target_grad(x, w_ptr, cols, col_in, stride_w, row, HAS_WEIGHT)
        tl.store(d_seg[:, None] + offs[None, :] * stride_dn, d.to(tgrad_ptr.dtype.element_ty),
                 mask=mask)  # fmt: skip
    if ALIGN:
        if LOGITS_GRAD:
            ge = _logits_grad(xe, te, em, w_ptr, ec, em, stride_w, row, HAS_WEIGHT)
            tl.store(grad_ptr + row_g[:, None] + ec, ge.to(grad_ptr.dtype.element_ty), mask=em)
        if TARGET_GRAD:
            de = _target_grad(xe, w_ptr, ec, em, stride_w, row, HAS_WEIGHT)
            tl.store(tgrad_ptr + row_d[:, None] + ec, de.to(tgrad_ptr.dtype.element_ty), mask=em)


@triton.jit
def _logits_grad(x, t, mask, w_ptr, cols, cols_in, stride_w, row, HAS_WEIGHT: tl.constexpr):
    """(softmax(x) S - u) * scale at logits ``x`` and target ``t`` ([rows, n])."""
    shift, log_sum, s_u, scale, smoothing, n_cols = row
    u = smoothed(t, mask, w_ptr, cols, cols_in, stride_w, n_cols, smoothing, HAS_WEIGHT)
    p = fast_exp((x.to(tl.float32) - shift[:, None]) - log_sum[:, None])
    return (p * s_u[:, None] - u) * scale[:, None]


@triton.jit
def _target_grad(x, w_ptr, cols, cols_in, stride_w, row, HAS_WEIGHT: tl.constexpr):
    """(1 - e) w (lse - x) * scale: the gradient of the loss for the unsmoothed target."""
    shift, log_sum, _, scale, smoothing, _ = row
    d = (log_sum[:, None] - (x.to(tl.float32) - shift[:, None])) * ((1.0 - smoothing) * scale)[
        :, None
    ]
    if HAS_WEIGHT:
        d = tl.load(w_ptr + cols * stride_w, mask=cols_in, other=0.0).to(tl.float32) * d
    return d
