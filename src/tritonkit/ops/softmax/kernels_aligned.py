"""Softmax rows that do not start on a 16-byte boundary, or whose width is not a whole number of
16-byte vectors (a 50257-class vocabulary, a row stride of 32001): the other kernels can prove
no alignment, so every element would be its own load and store. Here each row is cut into a
body of whole vectors starting at its first 16-byte aligned element, walked in chunks, and an
edge of fewer than two vectors' worth of elements before and after it, loaded element by
element. One row per program; every tensor of the call must have its rows start at the same
offset within 16 bytes (same strides modulo the vector, 16-byte aligned base pointers) and
contiguous columns (``config.misaligned_rows``)."""

from __future__ import annotations

import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.math import aligned_row, edge_cols, fast_exp
from tritonkit.ops._core.rows import program_row
from tritonkit.ops.softmax.kernels_looped import output_shift, rescale, softmax_output
from tritonkit.ops.softmax.kernels_row_backward import bwd_row_dx, bwd_row_total


@kernel
def softmax_fwd_aligned_kernel(
    x_ptr,  # input, seen as (n_outer, n_cols, n_inner), columns contiguous
    y_ptr,  # output, whose rows start at the same offsets within 16 bytes as x's
    n_cols,
    n_inner,
    stride_xo,
    stride_xi,
    stride_yo,
    stride_yi,
    LOG: tl.constexpr,
    OUTER: tl.constexpr,
    VEC: tl.constexpr,  # elements per 16 bytes
    BLOCK_N: tl.constexpr,
):
    """One row per program, two sweeps as in softmax_fwd_looped_kernel (CHUNK_MAX), over
    the row's aligned body in chunks and its edge (see the module docstring)."""
    o, i = program_row(n_inner, OUTER)
    x_off = o * stride_xo + i * stride_xi
    y_off = o * stride_yo + i * stride_yi
    head, n_body = aligned_row(x_off, n_cols, VEC)
    x_body = x_ptr + tl.multiple_of(x_off + head, VEC)
    y_body = y_ptr + tl.multiple_of(y_off + head, VEC)
    ec, em = edge_cols(head, n_body, n_cols, VEC)
    xe = tl.load(x_ptr + x_off + ec, mask=em, other=float("-inf")).to(tl.float32)
    m = tl.max(xe, axis=0)
    ref = tl.where(m == float("-inf"), 0.0, m)  # as in rescale
    s = tl.sum(fast_exp(xe - ref), axis=0)
    cols = tl.arange(0, BLOCK_N)
    for start in range(0, n_body, BLOCK_N):
        c = start + cols
        x = tl.load(x_body + c, mask=c < n_body, other=float("-inf"), eviction_policy="evict_last")
        x = x.to(tl.float32)
        m, ref, s = rescale(m, s, tl.max(x, axis=0))
        s += tl.sum(fast_exp(x - ref), axis=0)
    shift = output_shift(m, s, LOG)
    ye = softmax_output(xe, shift, LOG)
    tl.store(y_ptr + y_off + ec, ye.to(y_ptr.dtype.element_ty), mask=em)
    n_chunks = tl.cdiv(n_body, BLOCK_N)
    for k in range(0, n_chunks):  # last chunk first: the chunks read last are still in L2
        c = (n_chunks - 1 - k) * BLOCK_N + cols
        mask = c < n_body
        x = tl.load(x_body + c, mask=mask, other=0.0, eviction_policy="evict_first")
        y = softmax_output(x.to(tl.float32), shift, LOG)
        tl.store(y_body + c, y.to(y_ptr.dtype.element_ty), mask=mask, eviction_policy="evict_first")


@kernel
def softmax_bwd_aligned_kernel(
    dy_ptr,  # as in softmax_bwd_row_kernel; every tensor's rows start at the same offsets
    y_ptr,  # within 16 bytes
    dx_ptr,
    n_cols,
    n_inner,
    stride_dyo,
    stride_dyi,
    stride_yo,
    stride_yi,
    stride_dxo,
    stride_dxi,
    LOG: tl.constexpr,
    OUTER: tl.constexpr,
    VEC: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One row per program: sum(dy * y) (log_softmax: sum(dy)), then dx, over the row's aligned
    body in chunks and its edge (see the module docstring)."""
    o, i = program_row(n_inner, OUTER)
    dy_off = o * stride_dyo + i * stride_dyi
    y_off = o * stride_yo + i * stride_yi
    dx_off = o * stride_dxo + i * stride_dxi
    head, n_body = aligned_row(dy_off, n_cols, VEC)
    dy_body = dy_ptr + tl.multiple_of(dy_off + head, VEC)
    y_body = y_ptr + tl.multiple_of(y_off + head, VEC)
    dx_body = dx_ptr + tl.multiple_of(dx_off + head, VEC)
    ec, em = edge_cols(head, n_body, n_cols, VEC)
    dye = tl.load(dy_ptr + dy_off + ec, mask=em, other=0.0).to(tl.float32)
    ye = tl.load(y_ptr + y_off + ec, mask=em, other=0.0).to(tl.float32)
    total = bwd_row_total(dy_body, y_body, n_body, LOG, BLOCK_N)
    if LOG:
        total += tl.sum(dye, axis=0)
        dxe = dye - fast_exp(ye) * total
    else:
        total += tl.sum(dye * ye, axis=0)
        dxe = ye * (dye - total)
    tl.store(dx_ptr + dx_off + ec, dxe.to(dx_ptr.dtype.element_ty), mask=em)
    bwd_row_dx(dy_body, y_body, dx_body, n_body, total, LOG, BLOCK_N)
