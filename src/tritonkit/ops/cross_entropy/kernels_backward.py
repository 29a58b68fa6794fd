"""The cross-entropy backward: one read of the logits and one write of their gradient,
``grad_output * scale * (softmax - smoothed one-hot)``, in segments as the forward's."""

from __future__ import annotations

import triton
import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.math import edge_cols, fast_exp
from tritonkit.ops.cross_entropy.kernels_segments import (
    col_mask,
    row_offset,
    segment,
    segment_cols,
    segment_offsets,
    span,
)


@kernel
def ce_grad_kernel(
    x_ptr,  # logits [n_rows, n_cols], any strides
    t_ptr,  # int64 targets [n_rows]
    w_ptr,  # class weights [n_cols], when HAS_WEIGHT
    stats_ptr,  # fp32 [2]: the mean's denominator (ce_reduce_kernel), the class weights' sum
    lse_ptr,  # fp32 logsumexp per row [n_rows] from ce_rows_kernel
    go_ptr,  # grad_output: one value per row, or a scalar (strides 0)
    grad_ptr,  # out: gradient of the logits [n_rows, n_cols]
    n_rows,
    n_cols,
    n_segments,  # segments per row: cdiv(n_cols, BLOCK_N)
    n_inner,  # positions per sample: row r is (r // n_inner, r % n_inner)
    stride_xm,  # logits: elements between samples
    stride_xs,  # logits: elements between positions
    stride_xn,  # logits: elements between classes
    stride_tm,  # targets: elements between samples
    stride_ts,  # targets: elements between positions
    stride_w,  # weights: elements between classes
    stride_gom,  # grad_output: elements between samples (0 for a reduced loss)
    stride_gos,  # grad_output: elements between positions
    stride_gm,  # gradient: elements between samples
    stride_gs,  # gradient: elements between positions
    stride_gn,  # gradient: elements between classes (1 with ALIGN)
    ignore_index,  # rows with this target: zero gradient, logits not read
    smoothing,  # label_smoothing, in [0, 1]
    HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr,
    MEAN: tl.constexpr,  # the gradient is divided by the mean denominator
    INT64: tl.constexpr,
    ALIGN: tl.constexpr,  # as ce_stats_kernel's; the gradient's rows start as the logits' do
    BLOCK_M: tl.constexpr,  # rows per tile (1 unless the rows are shorter than a segment)
    BLOCK_N: tl.constexpr,  # classes per segment
):
    rows, start, offs = segment(n_segments, BLOCK_M, BLOCK_N, INT64)
    row_in = rows < n_rows
    t_off = row_offset(rows, n_inner, stride_tm, stride_ts)
    t = tl.load(t_ptr + t_off, mask=row_in, other=ignore_index)
    ignored = t == ignore_index
    active = row_in & (t != ignore_index)
    valid = (t >= 0) & (t < n_cols)
    lse = tl.load(lse_ptr + rows, mask=active, other=0.0)
    w_t = tl.full([BLOCK_M], 1.0, tl.float32)
    if HAS_WEIGHT:
        w_t = tl.load(w_ptr + tl.where(valid, t, 0) * stride_w, mask=active, other=0.0)
        w_t = w_t.to(tl.float32)
    # d loss / dx[c] = p[c] * ((1 - e) w[t] + e/C sum(w)) - (1 - e) w[t] [c == t] - e/C w[c],
    # times grad_output and the reduction's scale.
    go_off = row_offset(rows, n_inner, stride_gom, stride_gos)
    scale = tl.load(go_ptr + go_off, mask=active, other=0.0).to(tl.float32)
    if MEAN:
        scale = scale / tl.load(stats_ptr)  # inf when every target is ignored: no row uses it
    coef_t = (1.0 - smoothing) * w_t * scale
    coef_p = coef_t
    coef_c = smoothing / n_cols * scale
    if HAS_SMOOTHING:
        w_sum = n_cols * 1.0
        if HAS_WEIGHT:
            w_sum = tl.load(stats_ptr + 1)
        coef_p += coef_c * w_sum
    coefs = (lse, coef_p, coef_t, coef_c, valid, ignored)
    row_off = row_offset(rows, n_inner, stride_xm, stride_xs)
    head, n_body = span(row_off, n_cols, ALIGN)
    first = head + start
    col_in = col_mask(offs, n_body, start, ALIGN)
    # The target's offset in this segment, -1 elsewhere: compared per element in the offsets'
    # type (int32 unless INT64) rather than as int64 class indices.
    t_off = tl.where((t >= first) & (t < first + BLOCK_N), t - first, -1).to(offs.dtype)
    if ALIGN:  # segment 0 also takes the row's edge, the classes outside its aligned body,
        # loaded first: after the body's store, that second round trip to DRAM in a quarter of
        # the programs is exposed; issued before the body's load it costs least (see
        # docs/performance.md)
        ec, em = edge_cols(head[:, None], n_body[:, None], n_cols, ALIGN)
        em = em & (start == 0)
        xe = tl.load(x_ptr + row_off[:, None] + ec, mask=em & active[:, None], other=0.0)
    x_seg = x_ptr + segment_offsets(row_off, first, stride_xn, ALIGN, BLOCK_N)
    x = tl.load(
        x_seg[:, None] + offs[None, :] * stride_xn, mask=active[:, None] & col_in, other=0.0
    )
    cols = segment_cols(first, start, offs, ALIGN)
    is_t = offs[None, :] == t_off[:, None]
    g = _grad(x, is_t, coefs, w_ptr, cols, col_in, stride_w, HAS_WEIGHT, HAS_SMOOTHING)
    g_row = row_offset(rows, n_inner, stride_gm, stride_gs)
    g_seg = grad_ptr + segment_offsets(g_row, first, stride_gn, ALIGN, BLOCK_N)
    store_rows = row_in[:, None]  # ignored rows too: written, so the buffer is all defined
    g_type = grad_ptr.dtype.element_ty
    g_ptrs = g_seg[:, None] + offs[None, :] * stride_gn
    tl.store(g_ptrs, g.to(g_type), mask=store_rows & col_in)
    if ALIGN:
        ge = _grad(xe, ec == t[:, None], coefs, w_ptr, ec, em, stride_w, HAS_WEIGHT, HAS_SMOOTHING)
        tl.store(grad_ptr + g_row[:, None] + ec, ge.to(g_type), mask=em & store_rows)


@triton.jit
def _grad(x, is_t, coefs, w_ptr, cols, cols_in, stride_w, HAS_WEIGHT: tl.constexpr,
          HAS_SMOOTHING: tl.constexpr):  # fmt: skip
    """The gradient at logits ``x`` ([rows, n]; is_t: where the column is the row's target)."""
    lse, coef_p, coef_t, coef_c, valid, ignored = coefs
    g = fast_exp(x.to(tl.float32) - lse[:, None]) * coef_p[:, None]
    g -= tl.where(is_t, coef_t[:, None], 0.0)
    if HAS_SMOOTHING:
        if HAS_WEIGHT:
            w = tl.load(w_ptr + cols * stride_w, mask=cols_in, other=0.0)
            g -= w.to(tl.float32) * coef_c[:, None]
        else:
            g -= coef_c[:, None]
    g = tl.where(valid[:, None], g, float("nan"))
    return tl.where(ignored[:, None], 0.0, g)
