"""The rotary embedding kernel.

``x`` is ``(B, H, T, D)`` with any strides but a unit-stride last dim (the ``(B, T, H, D)``
projection transposed, as attention layers make it, is read in place); ``cos`` and ``sin``
are ``(B, T, D)`` tables (stride 0 over a broadcast batch). With ``x = [x1, x2]`` split at
``D / 2`` (the "rotate half" convention of GPT-NeoX and Llama)::

    out1 = x1 * cos1 - x2 * sin1        out2 = x2 * cos2 + x1 * sin2

The backward is the transposed rotation, ``dx1 = dy1 cos1 + dy2 sin2``, ``dx2 = dy2 cos2 -
dy1 sin1``: the same kernel reading sin's halves swapped (``sin_lo``/``sin_hi`` offsets) with
the opposite sign. One program rotates ``BLOCK_T`` positions of one (batch, head); values are
computed in float32 and rounded once.
"""

import triton.language as tl

from tritonkit.ops._core.launch import kernel


@kernel
def rope_kernel(
    x_ptr,  # (B, H, T, D), unit stride along D
    cos_ptr,  # (B, T, D), unit stride along D
    sin_ptr,
    out_ptr,  # (B, H, T, D), unit stride along D
    n_heads,
    n_pos,  # T
    half,  # D / 2
    stride_xb, stride_xh, stride_xt,
    stride_cb, stride_ct,  # cos and sin share strides
    stride_ob, stride_oh, stride_ot,
    sin_lo,  # where the sine of the first half is read: 0 (forward) or half (backward)
    sin_hi,  # ... of the second half: half (forward) or 0 (backward)
    sign,  # +1.0 forward, -1.0 backward
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,  # next power of 2 of half
):  # fmt: skip
    bh = tl.program_id(0)
    b = (bh // n_heads).to(tl.int64)
    h = (bh % n_heads).to(tl.int64)
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    d = tl.arange(0, BLOCK_D)
    mask = (t[:, None] < n_pos) & (d[None, :] < half)
    t64 = t.to(tl.int64)[:, None]
    x_row = x_ptr + b * stride_xb + h * stride_xh + t64 * stride_xt + d[None, :]
    c_row = b * stride_cb + t64 * stride_ct + d[None, :]
    x1 = tl.load(x_row, mask=mask).to(tl.float32)
    x2 = tl.load(x_row + half, mask=mask).to(tl.float32)
    c1 = tl.load(cos_ptr + c_row, mask=mask).to(tl.float32)
    c2 = tl.load(cos_ptr + c_row + half, mask=mask).to(tl.float32)
    s1 = sign * tl.load(sin_ptr + c_row + sin_lo, mask=mask).to(tl.float32)
    s2 = sign * tl.load(sin_ptr + c_row + sin_hi, mask=mask).to(tl.float32)
    o_row = out_ptr + b * stride_ob + h * stride_oh + t64 * stride_ot + d[None, :]
    ty = out_ptr.dtype.element_ty
    tl.store(o_row, (x1 * c1 - x2 * s1).to(ty), mask=mask)
    tl.store(o_row + half, (x2 * c2 + x1 * s2).to(ty), mask=mask)
