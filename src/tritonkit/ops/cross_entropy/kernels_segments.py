"""The segment helpers of the cross-entropy kernels: each row is cut into segments of up to BLOCK_N
classes, and every (row tile, segment) pair is one program (``kernels_forward.py``'s statistics,
``kernels_backward.py``'s gradient). With ALIGN (elements per 128 bytes, or 0) the segments cut each
row's aligned body instead of the row from its start (see config.py, ``align``)."""

from __future__ import annotations

import triton
import triton.language as tl

from tritonkit.ops._core.math import aligned_row, fast_exp


@triton.jit
def row_ids(tile, BLOCK_M: tl.constexpr, INT64: tl.constexpr):
    if INT64:  # offsets past 2**31 elements: 64-bit index arithmetic, only when needed
        tile = tl.cast(tile, tl.int64)
    return tile * BLOCK_M + tl.arange(0, BLOCK_M)


@triton.jit
def row_offset(rows, n_inner, stride_outer, stride_inner):
    """Element offsets of rows ``rows`` of a tensor whose rows run over two dims: row r is
    (r // n_inner, r % n_inner) of (N, d1 * ... * dk), as in K-dimensional inputs
    (N, C, d1, ..., dk). n_inner == 1 (2-d input, or rows evenly strided: config.py,
    row_strides) is specialized to a constant by Triton and this folds to rows * stride_outer."""
    return (rows // n_inner) * stride_outer + (rows % n_inner) * stride_inner


@triton.jit
def segment(n_segments, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INT64: tl.constexpr):
    """(rows, first class, class offsets) of this program's (row tile, segment)."""
    pid = tl.program_id(0)
    rows = row_ids(pid // n_segments, BLOCK_M, INT64)
    start = (pid % n_segments) * BLOCK_N
    offs = tl.arange(0, BLOCK_N)
    if INT64:
        start = tl.cast(start, tl.int64)
        offs = offs.to(tl.int64)  # offs * stride_xn may pass 2**31 for a strided class dim
    return rows, start, offs


@triton.jit
def span(row_off, n_cols, ALIGN: tl.constexpr):
    """(head, n_body) per row: with ALIGN, the classes before the row's first element on a
    128-byte line and the length of the aligned body after them (a multiple of ALIGN);
    segments then cut the body (see config.py, align, for the edge outside it). Else (0, n_cols):
    segments cut the row from its start."""
    if ALIGN:
        return aligned_row(row_off, n_cols, ALIGN)
    else:
        return 0, n_cols


@triton.jit
def col_mask(offs, n_body, start, ALIGN: tl.constexpr):
    """[rows, classes] mask of the segment's classes: per row with ALIGN (each row's body has
    its own length), else one row of it shared by the tile's rows."""
    if ALIGN:
        return offs[None, :] < (n_body - start)[:, None]
    else:
        return (offs < n_body - start)[None, :]


@triton.jit
def segment_offsets(row_off, first, stride_n, ALIGN: tl.constexpr, BLOCK_N: tl.constexpr):
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


@triton.jit
def weighted(x, mask, w_ptr, cols, col_mask, stride_w, HAS_WEIGHT: tl.constexpr):
    """w[c] * x at columns ``cols`` (x itself without class weights), 0 where masked."""
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols * stride_w, mask=col_mask, other=0.0)
        return tl.where(mask, w.to(tl.float32) * x, 0.0)
    else:
        return tl.where(mask, x, 0.0)


@triton.jit
def segment_cols(first, start, offs, ALIGN: tl.constexpr):
    """A segment's classes, for per-class data (the class weights): per row with ALIGN, else
    one row of them shared by the tile's rows (the shapes of _col_mask's mask)."""
    if ALIGN:
        return first[:, None] + offs[None, :]
    else:
        return (start + offs)[None, :]


@triton.jit
def max_sumexp(x):
    """(maximum, shift, sum of exp(x - shift)) over axis 1 of float32 ``x`` [rows, n]: the
    shift is the maximum, or 0 where that is -inf (all -inf or masked: the sum is 0, not NaN).
    +inf or NaN make the sum NaN, so the row's loss is NaN, as PyTorch's log_softmax gives."""
    x_max = tl.max(x, axis=1)
    shift = tl.where(x_max == float("-inf"), 0.0, x_max)
    return x_max, shift, tl.sum(fast_exp(x - shift[:, None]), axis=1)


@triton.jit
def partials_max(p_rows, n_segments, active, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr):
    """The maximum of each row's segment maxima (the partials' first plane, ``p_rows`` each
    row's first); -inf for inactive rows."""
    segs = tl.arange(0, BLOCK_S)
    # Elementwise accumulators reduced once after the loop: a reduction inside the loop
    # (row_max = max(row_max, tl.max(m))) crashes triton 3.6's TritonGPUOptimizeThreadLocality
    # pass when n_segments is specialized as a multiple of 16.
    m_acc = tl.full([BLOCK_R, BLOCK_S], float("-inf"), tl.float32)
    for j in range(0, n_segments, BLOCK_S):
        mask = active[:, None] & (j + segs < n_segments)[None, :]
        m = tl.load(p_rows[:, None] + (j + segs)[None, :], mask=mask, other=float("-inf"))
        m_acc = tl.maximum(m_acc, m)
    return tl.max(m_acc, axis=1)
