"""Math and row-walk helpers shared by the kernel families (``@triton.jit`` functions)."""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def fast_exp(x):
    """exp(x) in fp32 as exp2(x * log2(e)); results below 2**-126 flush to 0.

    ``tl.exp2`` lowers to ``ex2.approx.ftz.f32``, one MUFU instruction. ``tl.exp`` lowers to
    ``ex2.approx.f32`` without ftz, which ptxas wraps in a compare and two predicated multiplies
    to produce subnormal results (sm_90a SASS): five instructions instead of two, in kernels
    whose rows are bound by instruction issue (the looped softmax forward makes two
    exponentials per element).
    """
    return tl.exp2(x * LOG2E)


@triton.jit
def aligned_row(offset, n_cols, VEC: tl.constexpr):
    """(head, n_body) of a row starting ``offset`` elements past a 16-byte aligned pointer:
    ``head`` elements come before its first aligned one, and ``n_body`` (a multiple of VEC)
    aligned elements follow them."""
    head = tl.minimum((VEC - offset % VEC) % VEC, n_cols)
    n_body = (n_cols - head) // VEC * VEC
    return head, tl.multiple_of(n_body, VEC)


@triton.jit
def edge_cols(head, n_body, n_cols, VEC: tl.constexpr):
    """(columns, mask) of the row's elements outside its body, [0, head) and
    [head + n_body, n_cols): fewer than 2 * VEC, in a tile of 2 * VEC."""
    e = tl.arange(0, 2 * VEC)
    c = tl.where(e < head, e, n_body + e)
    return c, c < n_cols
