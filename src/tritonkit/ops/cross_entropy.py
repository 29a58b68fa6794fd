"""Cross-entropy over class-index targets, with class weights, label smoothing and ignore_index.

``F.cross_entropy`` in eager mode materializes log_softmax (N x C), then for the backward a
zero-filled N x C gradient of nll_loss and the log_softmax gradient: three N x C tensors and
six passes over them. Here each row is cut into segments of up to ``SEG`` classes, and every
(row tile, segment) pair is an independent program, so the passes stream like an elementwise
kernel with many bytes in flight (a loop over a whole row per program kept too few, and a
second sweep that hoped to find the row in L2 found DRAM instead):

1. ``_ce_stats_kernel`` reads the logits once and writes per-segment partials in float32:
   the segment's maximum, the sum of exp(x - maximum) and, with label smoothing,
   sum_c w[c] * x[c]. That is 2 (3 with smoothing) floats per segment, 8 (12) bytes per SEG
   logits: 0.05% (0.07%) of the bytes of bf16 logits at SEG = 8192.
2. ``_ce_rows_kernel`` merges a row's partials into its logsumexp and writes the row's loss
   (and the logsumexp when a gradient is needed): N rows, no N x C traffic but x[i, t_i].
3. The backward: ``_ce_grad_kernel`` reads the logits again and writes the gradient
   ``grad_output * scale * (softmax - smoothed one-hot)`` in the logits' dtype.

Rows that do not start on a 16-byte boundary (an odd vocabulary) are cut into segments from
their first 128-byte line instead, so that every segment is read in 16-byte vectors; the few
classes around that aligned body are read by the row kernel and by the gradient's first
segment (see ALIGN).

So the forward reads the logits once, and the backward reads them once and writes their
gradient: no N x C float32 tensor anywhere, and no N x C tensor at all is kept between the
passes (only the N logsumexps). Computing the gradient inside the forward pass instead (the
earlier design here, and Liger's) saves nothing when grad_output is 1 (the same reads and
write, in the other pass) and costs a second read and write of the whole gradient whenever
it is not (a loss scale, reduction "none", a weighted sum of losses): 10.5 GB instead of
6.3 GB for bf16 logits (8192, 128256). The user's logits are never written, and a second
backward through the same graph (``retain_graph=True``) gives the same gradient again.

Loss, as ``F.cross_entropy`` defines it, for row i with target t, class weights w (1 without),
smoothing e and C classes::

    loss_i = (1 - e) * w[t] * (lse_i - x[i, t]) + e / C * sum_c w[c] * (lse_i - x[i, c])

ignored rows give 0; ``mean`` divides the sum by ``sum_i w[t_i]`` over non-ignored rows (NaN
when every target is ignored, as in PyTorch). Targets outside ``[0, C)`` (other than
ignore_index) give a NaN loss and gradient row; PyTorch raises a device-side assert there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonkit._autocast import FP32, autocast_dtype, policy
from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.layout import cdiv, next_power_of_2
from tritonkit.ops._core.math import aligned_row, edge_cols, fast_exp
from tritonkit.ops._core.registry import Op, apply, eager_direct
from tritonkit.ops._core.rows import pow2_floor
from tritonkit.ops._core.validate import (
    check_choice,
    check_operand,
    check_same_device,
    check_tensor,
)

# ----------------------------------------------------------------------------------------------
# Configs: every block size of the family is chosen here (benchmarks/sweep_ce.py sweeps them).
# ----------------------------------------------------------------------------------------------

# Classes per segment of the stats and gradient kernels (rounded down to a power of 2), and
# their warps for a full segment. Rows shorter than SEG share a tile of SEG elements, with
# warps in proportion. H200 sweep (benchmarks/sweep_ce.py, logits (8192, 128256) bf16):
# 16384 x 8 warps (64 elements per thread) took 0.558 ms forward (3.58x eager) and 1.758 ms
# forward + backward (2.64x eager); 16 warps 1.833 ms, 4 warps 2.981 ms, 32768 x 8 2.782 ms
# (that sweep timed the earlier design, the gradient written by the forward pass).
SEG = 16384
SEG_WARPS = 8
# The row kernel merges a tile of (rows, segments) partials of about this many elements.
ROWS_TILE = 1024
# The single-program reductions over rows (mean denominator, loss sum).
REDUCE_BLOCK = 1024

# Rows of one program per segment (BLOCK_M == 1) whose start or width Triton cannot prove
# 16-byte aligned (an odd vocabulary such as GPT-2's 50,257 classes: each row starts at another
# offset within 16 bytes) would be read one element per load. With ALIGN, segments cut each
# row's body from its first element on a 128-byte line (whole 16-byte vectors, each segment
# starting a line as an aligned width's do), and the fewer than 2 * 128 bytes outside the body
# are read one by one: by the row kernel for the forward's logsumexp (in the segment kernel
# they cost registers, 92 instead of 80: two programs per SM instead of three, and a forward
# slower than the scalar loads', run 123), by segment 0 for the gradient (see align_for).
# H200 (run 124), bf16 (8192, 50257), ms, aligned / plain segments / the width 50304: forward
# 0.2712 / 0.3179 / 0.2714, gradient pass 0.4954 / 0.6866 / 0.4168 (torch.compile 0.7074).
ALIGN = True
ALIGN_EDGE_TILE = 2048  # elements of the row kernel's edge tile, rows x 2 * ALIGN

_INT32_LIMIT = 2**31
REDUCTIONS = ("mean", "sum", "none")


def ce_config(n_rows: int, n_cols: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, n_segments, num_warps) of the stats and gradient kernels."""
    seg = pow2_floor(SEG)
    block_n = min(next_power_of_2(n_cols), seg)
    block_m = pow2_floor(max(1, min(next_power_of_2(n_rows), seg // block_n)))
    warps = pow2_floor(max(1, SEG_WARPS * block_m * block_n // seg))
    return block_m, block_n, cdiv(n_cols, block_n), warps


def align_for(block_m: int, *tensors: torch.Tensor) -> int:
    """Elements per 128 bytes when the segments walk aligned row bodies (ALIGN): one row per
    program, contiguous classes, 16-byte aligned base pointers (the body's vectors), every
    tensor's rows starting at the same offset within 128 bytes (one head for all), and rows or
    a width that Triton's specialization (integers divisible by 16) would not prove aligned;
    0 otherwise."""
    size = tensors[0].element_size()
    vec = 128 // size
    if not ALIGN or block_m != 1 or any(t.stride(1) != 1 or t.data_ptr() % 16 for t in tensors):
        return 0
    n_rows, n_cols = tensors[0].shape
    residues = {t.stride(0) % vec if n_rows > 1 else 0 for t in tensors}
    if len(residues) != 1:
        return 0
    if n_cols % 16 == 0 and all(t.stride(0) % 16 == 0 or n_rows == 1 for t in tensors):
        return 0  # the plain segments' loads are vectors already
    return vec


def rows_config(n_rows: int, n_segments: int) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_S) of the row kernel: rows per program, partials per row per step."""
    block_s = min(next_power_of_2(n_segments), pow2_floor(ROWS_TILE))
    block_r = pow2_floor(max(1, min(next_power_of_2(n_rows), ROWS_TILE // block_s)))
    return block_r, block_s


# ----------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------


@kernel
def _ce_prep_kernel(
    t_ptr,  # int64 targets [n_rows]
    w_ptr,  # class weights [n_cols], when HAS_WEIGHT
    stats_ptr,  # fp32 [2]: out: mean denominator, sum of all class weights
    n_rows,  # targets
    n_cols,  # classes
    stride_t,  # targets: elements between rows
    stride_w,  # weights: elements between classes
    ignore_index,
    HAS_WEIGHT: tl.constexpr,
    NEED_DENOM: tl.constexpr,  # reduction "mean": sum of w[t] over non-ignored rows (or count)
    NEED_WEIGHT_SUM: tl.constexpr,  # label smoothing with class weights
    BLOCK: tl.constexpr,
):
    # One program, fixed summation order: deterministic, and only N + C elements are read.
    offs = tl.arange(0, BLOCK)
    if NEED_DENOM:
        if HAS_WEIGHT:
            acc = tl.zeros([BLOCK], tl.float32)
        else:
            count = tl.zeros([BLOCK], tl.int32)  # exact for any number of rows
        for start in range(0, n_rows, BLOCK):
            r = start + offs
            t = tl.load(t_ptr + r * stride_t, mask=r < n_rows, other=ignore_index)
            keep = (r < n_rows) & (t != ignore_index)
            if HAS_WEIGHT:
                in_range = keep & (t >= 0) & (t < n_cols)
                wt = tl.load(w_ptr + tl.where(in_range, t, 0) * stride_w, mask=in_range, other=0.0)
                acc += wt.to(tl.float32)
            else:
                count += keep.to(tl.int32)
        if HAS_WEIGHT:
            tl.store(stats_ptr, tl.sum(acc, axis=0))
        else:
            tl.store(stats_ptr, tl.sum(count, axis=0).to(tl.float32))
    if NEED_WEIGHT_SUM:
        acc_w = tl.zeros([BLOCK], tl.float32)
        for start in range(0, n_cols, BLOCK):
            c = start + offs
            acc_w += tl.load(w_ptr + c * stride_w, mask=c < n_cols, other=0.0).to(tl.float32)
        tl.store(stats_ptr + 1, tl.sum(acc_w, axis=0))


@triton.jit
def _row_ids(tile, BLOCK_M: tl.constexpr, INT64: tl.constexpr):
    if INT64:  # offsets past 2**31 elements: 64-bit index arithmetic, only when needed
        tile = tl.cast(tile, tl.int64)
    return tile * BLOCK_M + tl.arange(0, BLOCK_M)


@triton.jit
def _segment(n_segments, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INT64: tl.constexpr):
    """(rows, first class, class offsets) of this program's (row tile, segment)."""
    pid = tl.program_id(0)
    rows = _row_ids(pid // n_segments, BLOCK_M, INT64)
    start = (pid % n_segments) * BLOCK_N
    offs = tl.arange(0, BLOCK_N)
    if INT64:
        start = tl.cast(start, tl.int64)
        offs = offs.to(tl.int64)  # offs * stride_xn may pass 2**31 for a strided class dim
    return rows, start, offs


@triton.jit
def _span(row_off, n_cols, ALIGN: tl.constexpr):
    """(head, n_body) per row: with ALIGN, the classes before the row's first element on a
    128-byte line and the length of the aligned body after them (a multiple of ALIGN);
    segments then cut the body (see ALIGN for the edge outside it). Else (0, n_cols):
    segments cut the row from its start."""
    if ALIGN:
        return aligned_row(row_off, n_cols, ALIGN)
    else:
        return 0, n_cols


@triton.jit
def _col_mask(offs, n_body, start, ALIGN: tl.constexpr):
    """[rows, classes] mask of the segment's classes: per row with ALIGN (each row's body has
    its own length), else one row of it shared by the tile's rows."""
    if ALIGN:
        return offs[None, :] < (n_body - start)[:, None]
    else:
        return (offs < n_body - start)[None, :]


@triton.jit
def _segment_offsets(row_off, first, stride_n, ALIGN: tl.constexpr, BLOCK_N: tl.constexpr):
    """Element offsets of each row's segment start (first: its first class)."""
    off = row_off + first * stride_n
    # With ALIGN a whole number of lines, or of segments where those are shorter (segments
    # start at multiples of BLOCK_N in the body): vectors of 16 bytes either way.
    if ALIGN:
        if ALIGN <= BLOCK_N:
            off = tl.multiple_of(off, ALIGN)
        else:
            off = tl.multiple_of(off, BLOCK_N)
    return off


@kernel
def _ce_stats_kernel(
    x_ptr,  # logits [n_rows, n_cols], any strides
    t_ptr,  # int64 targets [n_rows]
    w_ptr,  # class weights [n_cols], when HAS_WEIGHT and HAS_SMOOTHING
    part_ptr,  # fp32 out: partials [K, n_rows, n_segments]: max, sum exp(x - max), sum w x
    n_rows,
    n_cols,
    n_segments,  # segments per row: cdiv(n_cols, BLOCK_N)
    stride_xm,  # logits: elements between rows
    stride_xn,  # logits: elements between classes
    stride_t,  # targets: elements between rows
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
    rows, start, offs = _segment(n_segments, BLOCK_M, BLOCK_N, INT64)
    row_in = rows < n_rows
    t = tl.load(t_ptr + rows * stride_t, mask=row_in, other=ignore_index)
    active = row_in & (t != ignore_index)  # ignored rows: their logits are never read
    row_off = rows * stride_xm
    head, n_body = _span(row_off, n_cols, ALIGN)
    first = head + start
    col_in = _col_mask(offs, n_body, start, ALIGN)
    mask = active[:, None] & col_in
    x_seg = x_ptr + _segment_offsets(row_off, first, stride_xn, ALIGN, BLOCK_N)
    x = tl.load(x_seg[:, None] + offs[None, :] * stride_xn, mask=mask, other=float("-inf"))
    x = x.to(tl.float32)
    seg_max = tl.max(x, axis=1)
    # A segment all -inf (or masked) has no maximum to shift by: its sum is 0, not NaN.
    # +inf or NaN make the sum NaN, so the row's loss is NaN, as PyTorch's log_softmax gives.
    shift = tl.where(seg_max == float("-inf"), 0.0, seg_max)
    seg_sum = tl.sum(fast_exp(x - shift[:, None]), axis=1)
    p = part_ptr + rows * n_segments + (tl.program_id(0) % n_segments)
    tl.store(p, seg_max, mask=row_in)
    tl.store(p + stride_pk, seg_sum, mask=row_in)
    if HAS_SMOOTHING:
        cols = _segment_cols(first, start, offs, ALIGN)
        wx = tl.sum(_weighted(x, mask, w_ptr, cols, col_in, stride_w, HAS_WEIGHT), axis=1)
        tl.store(p + 2 * stride_pk, wx, mask=row_in)


@triton.jit
def _weighted(x, mask, w_ptr, cols, col_mask, stride_w, HAS_WEIGHT: tl.constexpr):
    """w[c] * x at columns ``cols`` (x itself without class weights), 0 where masked."""
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols * stride_w, mask=col_mask, other=0.0)
        return tl.where(mask, w.to(tl.float32) * x, 0.0)
    else:
        return tl.where(mask, x, 0.0)


@triton.jit
def _segment_cols(first, start, offs, ALIGN: tl.constexpr):
    """A segment's classes, for per-class data (the class weights): per row with ALIGN, else
    one row of them shared by the tile's rows (the shapes of _col_mask's mask)."""
    if ALIGN:
        return first[:, None] + offs[None, :]
    else:
        return (start + offs)[None, :]


@kernel
def _ce_rows_kernel(
    x_ptr,  # logits [n_rows, n_cols], any strides: only x[i, t_i] is read
    t_ptr,  # int64 targets [n_rows]
    w_ptr,  # class weights [n_cols], when HAS_WEIGHT
    stats_ptr,  # fp32 [2] from _ce_prep_kernel: mean denominator, sum of class weights
    part_ptr,  # fp32 partials [K, n_rows, n_segments] from _ce_stats_kernel
    loss_ptr,  # per-row losses: fp32 (summed later) or the output dtype (reduction "none")
    lse_ptr,  # fp32 out: logsumexp per row [n_rows] (0 on ignored rows), when HAS_GRAD
    n_rows,
    n_cols,
    n_segments,
    stride_xm,  # logits: elements between rows
    stride_xn,  # logits: elements between classes
    stride_t,  # targets: elements between rows
    stride_w,  # weights: elements between classes
    stride_pk,  # partials: elements between planes
    stride_l,  # losses: elements between rows
    ignore_index,  # rows with this target: zero loss
    smoothing,  # label_smoothing, in [0, 1]
    HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr,  # smoothing > 0: the partials have the sum_c w[c] x[c] plane
    HAS_GRAD: tl.constexpr,
    INT64: tl.constexpr,
    ALIGN: tl.constexpr,  # as _ce_stats_kernel's: the rows' edges are merged here
    BLOCK_R: tl.constexpr,  # rows per program
    BLOCK_S: tl.constexpr,  # partials per row per step
):
    rows = _row_ids(tl.program_id(0), BLOCK_R, INT64)
    row_in = rows < n_rows
    t = tl.load(t_ptr + rows * stride_t, mask=row_in, other=ignore_index)
    ignored = t == ignore_index
    active = row_in & (t != ignore_index)
    valid = (t >= 0) & (t < n_cols)
    t_safe = tl.where(valid, t, 0)
    # logsumexp of the row from the segments' (max, sum): max of the maxima first, then the
    # sums rescaled to it. Padding partials are (-inf, 0) and add nothing.
    segs = tl.arange(0, BLOCK_S)
    p_rows = part_ptr + rows * n_segments
    # Elementwise accumulators reduced once after each loop: a reduction inside the loop
    # (row_max = max(row_max, tl.max(m))) crashes triton 3.6's TritonGPUOptimizeThreadLocality
    # pass when n_segments is specialized as a multiple of 16.
    m_acc = tl.full([BLOCK_R, BLOCK_S], float("-inf"), tl.float32)
    for j in range(0, n_segments, BLOCK_S):
        mask = active[:, None] & (j + segs < n_segments)[None, :]
        m = tl.load(p_rows[:, None] + (j + segs)[None, :], mask=mask, other=float("-inf"))
        m_acc = tl.maximum(m_acc, m)
    row_max = tl.max(m_acc, axis=1)
    if ALIGN:  # the classes outside each row's aligned body, which no segment read
        row_off = rows * stride_xm
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
            wx += tl.sum(_weighted(xe, em, w_ptr, ec, em, stride_w, HAS_WEIGHT), axis=1)
    lse = shift + tl.log(tl.where(active, row_sum, 1.0))  # ignored rows: 0, no log(0)
    x_t = tl.load(x_ptr + rows * stride_xm + t_safe * stride_xn, mask=active, other=0.0)
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
def _ce_grad_kernel(
    x_ptr,  # logits [n_rows, n_cols], any strides
    t_ptr,  # int64 targets [n_rows]
    w_ptr,  # class weights [n_cols], when HAS_WEIGHT
    stats_ptr,  # fp32 [2] from _ce_prep_kernel: mean denominator, sum of class weights
    lse_ptr,  # fp32 logsumexp per row [n_rows] from _ce_rows_kernel
    go_ptr,  # grad_output: one value per row, or a scalar (stride_go = 0)
    grad_ptr,  # out: gradient of the logits [n_rows, n_cols], unit class stride
    n_rows,
    n_cols,
    n_segments,  # segments per row: cdiv(n_cols, BLOCK_N)
    stride_xm,  # logits: elements between rows
    stride_xn,  # logits: elements between classes
    stride_t,  # targets: elements between rows
    stride_w,  # weights: elements between classes
    stride_go,  # grad_output: elements between rows (0 for a reduced loss)
    stride_gm,  # gradient: elements between rows
    ignore_index,  # rows with this target: zero gradient, logits not read
    smoothing,  # label_smoothing, in [0, 1]
    HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr,
    MEAN: tl.constexpr,  # the gradient is divided by the mean denominator
    INT64: tl.constexpr,
    ALIGN: tl.constexpr,  # as _ce_stats_kernel's; the gradient's rows start as the logits' do
    BLOCK_M: tl.constexpr,  # rows per tile (1 unless the rows are shorter than a segment)
    BLOCK_N: tl.constexpr,  # classes per segment
):
    rows, start, offs = _segment(n_segments, BLOCK_M, BLOCK_N, INT64)
    row_in = rows < n_rows
    t = tl.load(t_ptr + rows * stride_t, mask=row_in, other=ignore_index)
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
    scale = tl.load(go_ptr + rows * stride_go, mask=active, other=0.0).to(tl.float32)
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
    row_off = rows * stride_xm
    head, n_body = _span(row_off, n_cols, ALIGN)
    first = head + start
    col_in = _col_mask(offs, n_body, start, ALIGN)
    # The target's offset in this segment, -1 elsewhere: compared per element in the offsets'
    # type (int32 unless INT64) rather than as int64 class indices.
    t_off = tl.where((t >= first) & (t < first + BLOCK_N), t - first, -1).to(offs.dtype)
    if ALIGN:  # segment 0 also takes the row's edge, the classes outside its aligned body,
        # loaded first: after the body's store, that second round trip to DRAM in a quarter of
        # the programs cost 16% (H200, bf16 (8192, 50257): 0.4944 ms, 0.4256 without the edge,
        # run 125); issued before the body's load 0.4467, after it 0.4534 (run 126)
        ec, em = edge_cols(head[:, None], n_body[:, None], n_cols, ALIGN)
        em = em & (start == 0)
        xe = tl.load(x_ptr + row_off[:, None] + ec, mask=em & active[:, None], other=0.0)
    x_seg = x_ptr + _segment_offsets(row_off, first, stride_xn, ALIGN, BLOCK_N)
    x = tl.load(
        x_seg[:, None] + offs[None, :] * stride_xn, mask=active[:, None] & col_in, other=0.0
    )
    cols = _segment_cols(first, start, offs, ALIGN)
    is_t = offs[None, :] == t_off[:, None]
    g = _grad(x, is_t, coefs, w_ptr, cols, col_in, stride_w, HAS_WEIGHT, HAS_SMOOTHING)
    g_seg = grad_ptr + _segment_offsets(rows * stride_gm, first, 1, ALIGN, BLOCK_N)
    store_rows = row_in[:, None]  # ignored rows too: written, so the buffer is all defined
    g_type = grad_ptr.dtype.element_ty
    tl.store(g_seg[:, None] + offs[None, :], g.to(g_type), mask=store_rows & col_in)
    if ALIGN:
        ge = _grad(xe, ec == t[:, None], coefs, w_ptr, ec, em, stride_w, HAS_WEIGHT, HAS_SMOOTHING)
        tl.store(grad_ptr + (rows * stride_gm)[:, None] + ec, ge.to(g_type), mask=em & store_rows)


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


@kernel
def _ce_reduce_kernel(
    loss_ptr,  # fp32 per-row losses [n_rows], contiguous
    stats_ptr,  # fp32 [2]: the mean denominator first
    out_ptr,  # the reduced loss, a scalar in the loss dtype (the logits' or float32)
    n_rows,  # losses to sum
    MEAN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # One program, fixed summation order: deterministic.
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_rows, BLOCK):
        acc += tl.load(loss_ptr + start + offs, mask=start + offs < n_rows, other=0.0)
    total = tl.sum(acc, axis=0)
    if MEAN:
        total = total / tl.load(stats_ptr)  # 0 / 0 = NaN when every target is ignored
    tl.store(out_ptr, total.to(out_ptr.dtype.element_ty))


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------


def _outputs(logits, reduction, need_grad, float32_loss):
    """(loss (in the logits' dtype, or float32), per-row logsumexp (empty unless a gradient will
    be needed), fp32 [2] for the mean denominator and the weight sum)."""
    n_rows = logits.shape[0]
    shape = (n_rows,) if reduction == "none" else ()
    dtype = torch.float32 if float32_loss else logits.dtype
    loss = torch.empty(shape, dtype=dtype, device=logits.device)
    f32 = {"dtype": torch.float32, "device": logits.device}
    lse = torch.empty(n_rows if need_grad else 0, **f32)
    stats = torch.empty(2, **f32)
    return loss, lse, stats


def _needs_int64(logits: torch.Tensor, block_m: int, *extents: int) -> bool:
    """Whether element offsets of the logits (or of a tensor of ``extents`` elements) can pass
    2**31; row indices of a partial tile are formed before masking, so count a tile past the
    end."""
    n_rows, n_cols = logits.shape
    span = (n_rows - 1) * logits.stride(0) + (n_cols - 1) * logits.stride(1)
    return max(span, (n_rows + block_m) * n_cols, *extents) >= _INT32_LIMIT


def _stats_for(logits, target, weight, ignore_index, reduction, label_smoothing, stats) -> None:
    """Fill ``stats`` (fp32 [2]): the mean's denominator, the sum of the class weights, as the
    reduction and smoothing need them."""
    has_weight = weight is not None
    mean = reduction == "mean"
    need_weight_sum = has_weight and label_smoothing > 0.0
    if not (mean or need_weight_sum):
        return
    _ce_prep_kernel[(1,)](
        target,
        weight if has_weight else stats,
        stats,
        logits.shape[0],
        logits.shape[1],
        target.stride(0),
        weight.stride(0) if has_weight else 0,
        ignore_index,
        HAS_WEIGHT=has_weight,
        NEED_DENOM=mean,
        NEED_WEIGHT_SUM=need_weight_sum,
        BLOCK=REDUCE_BLOCK,
        num_warps=4,
    )


def cross_entropy_fwd(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    need_grad: bool,
    float32_loss: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, logsumexp per row, stats) for ``logits`` (N, C), any strides; the loss in the
    logits' dtype, or float32 with ``float32_loss`` (autocast's result, the logits uncast).

    The last two (fp32, N and 2 elements) are what ``cross_entropy_bwd`` needs besides the
    inputs; without ``need_grad`` the logsumexps are neither allocated nor written.
    """
    loss, lse, stats = _outputs(logits, reduction, need_grad, float32_loss)
    n_rows, n_cols = logits.shape
    if n_rows == 0:
        if reduction != "none":
            loss.fill_(float("nan") if reduction == "mean" else 0.0)
        return loss, lse, stats
    dev = logits.device
    has_weight = weight is not None
    smoothing = float(label_smoothing)
    has_smoothing = smoothing > 0.0
    mean = reduction == "mean"
    _stats_for(logits, target, weight, ignore_index, reduction, smoothing, stats)
    block_m, block_n, n_segments, warps = ce_config(n_rows, n_cols)
    block_r, block_s = rows_config(n_rows, n_segments)
    align = align_for(block_m, logits)
    if align:  # the row kernel also reads each row's edge, a tile of 2 * align per row
        block_r = min(block_r, pow2_floor(max(1, ALIGN_EDGE_TILE // (2 * align))))
    parts = torch.empty(
        (3 if has_smoothing else 2, n_rows, n_segments), dtype=torch.float32, device=dev
    )
    rows_out = loss if reduction == "none" else torch.empty(n_rows, dtype=torch.float32, device=dev)
    int64 = _needs_int64(logits, block_m + block_r, parts.numel())
    w_arg = weight if has_weight else logits
    w_stride = weight.stride(0) if has_weight else 0
    x_strides = (logits.stride(0), logits.stride(1), target.stride(0), w_stride)
    _ce_stats_kernel[(cdiv(n_rows, block_m) * n_segments,)](
        logits,
        target,
        w_arg,
        parts,
        n_rows,
        n_cols,
        n_segments,
        *x_strides,
        parts.stride(0),
        ignore_index,
        HAS_WEIGHT=has_weight,
        HAS_SMOOTHING=has_smoothing,
        INT64=int64,
        ALIGN=align,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=warps,
    )
    _ce_rows_kernel[(cdiv(n_rows, block_r),)](
        logits,
        target,
        w_arg,
        stats,
        parts,
        rows_out,
        lse if need_grad else stats,
        n_rows,
        n_cols,
        n_segments,
        *x_strides,
        parts.stride(0),
        rows_out.stride(0),
        ignore_index,
        smoothing,
        HAS_WEIGHT=has_weight,
        HAS_SMOOTHING=has_smoothing,
        HAS_GRAD=need_grad,
        INT64=int64,
        ALIGN=align,
        BLOCK_R=block_r,
        BLOCK_S=block_s,
        num_warps=4,
    )
    if reduction != "none":
        _ce_reduce_kernel[(1,)](
            rows_out, stats, loss, n_rows, MEAN=mean, BLOCK=REDUCE_BLOCK, num_warps=4
        )
    return loss, lse, stats


def cross_entropy_bwd(
    grad_output: torch.Tensor,
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    lse: torch.Tensor,
    stats: torch.Tensor,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
) -> torch.Tensor:
    """Gradient of the loss w.r.t. ``logits`` (contiguous, the logits' dtype): one read of the
    logits, one write. ``grad_output`` is a scalar, or (N,) for reduction "none"; ``lse`` and
    ``stats`` come from ``cross_entropy_fwd``."""
    grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    n_rows, n_cols = logits.shape
    if n_rows == 0:
        return grad
    has_weight = weight is not None
    block_m, block_n, n_segments, warps = ce_config(n_rows, n_cols)
    _ce_grad_kernel[(cdiv(n_rows, block_m) * n_segments,)](
        logits,
        target,
        weight if has_weight else logits,
        stats,
        lse,
        grad_output,
        grad,
        n_rows,
        n_cols,
        n_segments,
        logits.stride(0),
        logits.stride(1),
        target.stride(0),
        weight.stride(0) if has_weight else 0,
        grad_output.stride(0) if grad_output.dim() == 1 else 0,
        grad.stride(0),
        ignore_index,
        float(label_smoothing),
        HAS_WEIGHT=has_weight,
        HAS_SMOOTHING=label_smoothing > 0.0,
        MEAN=reduction == "mean",
        INT64=_needs_int64(logits, block_m),
        ALIGN=align_for(block_m, logits, grad),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=warps,
    )
    return grad


# ----------------------------------------------------------------------------------------------
# torch.library registration
# ----------------------------------------------------------------------------------------------


# The launchers themselves are the ops (their annotations give the schemas).
_cross_entropy_op = Op("tritonkit::cross_entropy", cross_entropy_fwd)


@_cross_entropy_op.register_fake
def _(logits, target, weight, ignore_index, reduction, label_smoothing, need_grad, float32_loss):
    return _outputs(logits, reduction, need_grad, float32_loss)


_cross_entropy_backward_op = Op("tritonkit::cross_entropy_backward", cross_entropy_bwd)


@_cross_entropy_backward_op.register_fake
def _(grad_output, logits, target, weight, lse, stats, ignore_index, reduction, label_smoothing):
    return torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)


# Eager calls on real tensors skip the ops' dispatch (see eager_direct).
call_cross_entropy = eager_direct(_cross_entropy_op)
call_cross_entropy_backward = eager_direct(_cross_entropy_backward_op)


# ----------------------------------------------------------------------------------------------
# Autograd
# ----------------------------------------------------------------------------------------------


class CrossEntropyFunction(torch.autograd.Function):
    """Cross-entropy; the forward keeps the rows' logsumexps for the backward."""

    @staticmethod
    def forward(
        ctx, logits, target, weight, ignore_index, reduction, label_smoothing, need_grad, f32
    ):
        loss, lse, stats = call_cross_entropy(
            logits, target, weight, ignore_index, reduction, label_smoothing, need_grad, f32
        )
        if need_grad:
            ctx.save_for_backward(logits, target, weight, lse, stats)
        ctx.args = (ignore_index, reduction, label_smoothing)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        logits, target, weight, lse, stats = ctx.saved_tensors
        grad = call_cross_entropy_backward(
            grad_output, logits, target, weight, lse, stats, *ctx.args
        )
        return grad, None, None, None, None, None, None, None


# ----------------------------------------------------------------------------------------------
# Public function
# ----------------------------------------------------------------------------------------------


@policy(cuda=FP32, cpu=FP32)
def cross_entropy(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """``torch.nn.functional.cross_entropy`` for class-index targets, with autograd.

    The forward reads the logits once and keeps only the rows' logsumexps; the backward reads
    them once more and writes the gradient in the logits' dtype (never an N x C float32 copy).
    The logits are never modified.

    Args:
        input: logits of shape (N, C) or (C,), float32, float16 or bfloat16, on a CUDA device,
            any strides.
        target: int64 class indices of shape (N,) (or () for 1-d input), in ``[0, C)`` or equal
            to ``ignore_index``; other values give a NaN loss.
        weight: optional class weights of shape (C,), on input's device, in input's dtype or
            float32; no gradient flows to it (it is not differentiable in PyTorch either).
        ignore_index: targets equal to it contribute no loss and no gradient, and are left out
            of the mean's denominator.
        reduction: ``"mean"`` (divided by the summed weights of non-ignored targets; NaN when
            all are ignored), ``"sum"`` or ``"none"``.
        label_smoothing: in [0, 1]; mixes the one-hot target with the uniform distribution.

    Under ``torch.autocast`` the loss is float32, as ``F.cross_entropy``'s is there (PyTorch
    casts the logits to float32 first; here they are read as they are, the arithmetic being
    float32 anyway, and their gradient keeps their dtype, as it does under autocast).
    """
    op = "tritonkit.cross_entropy"
    float32_loss = autocast_dtype("cross_entropy", input) == torch.float32
    check_tensor(op, "input", input)
    check_tensor(op, "target", target, dtypes=(torch.int64,))
    check_same_device(op, input=input, target=target)
    if input.dim() not in (1, 2):
        raise ValueError(
            f"{op}: input must be (N, C) logits or (C,), got shape {tuple(input.shape)} "
            "(spatial dims are not supported)"
        )
    expected = tuple(input.shape[:1]) if input.dim() == 2 else ()
    if tuple(target.shape) != expected:
        raise ValueError(
            f"{op}: target must have shape {expected} for input of shape {tuple(input.shape)}, "
            f"got {tuple(target.shape)}"
        )
    n_cols = input.shape[-1]
    if n_cols == 0:
        raise ValueError(
            f"{op}: input must have at least one class, got shape {tuple(input.shape)}"
        )
    if weight is not None:
        check_operand(op, "weight", weight, "input", input, (n_cols,), "(C,)", or_float32=True)
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"{op}: ignore_index must be an int, got {type(ignore_index).__name__}")
    check_choice(op, "reduction", reduction, REDUCTIONS)
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)):
        raise TypeError(
            f"{op}: label_smoothing must be a float, got {type(label_smoothing).__name__}"
        )
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing}")
    need_grad = input.requires_grad and torch.is_grad_enabled()
    args = (weight, ignore_index, reduction, float(label_smoothing), need_grad, float32_loss)
    if input.dim() == 1:
        loss = apply(CrossEntropyFunction, input.unsqueeze(0), target.unsqueeze(0), *args)
        return loss.squeeze(0) if reduction == "none" else loss
    return apply(CrossEntropyFunction, input, target, *args)


# The family's public functions: tritonkit.__all__ and tritonkit.functional derive from these.
__all__ = ["cross_entropy"]
