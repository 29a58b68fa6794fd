"""One pass for a small tensor with one scale: every program finds the amax of the whole tensor
(small enough to sit in L2: each program reads it once), then casts its own block.

For one scale per tensor the general route is two passes (``kernels_twopass.py``: a zeroed float32,
an atomic amax pass, the cast pass): three launches, which cost more than the work for the
activations of a decode step (a few rows of a hidden size). Here one launch does it, with no
atomics and no zeroed buffer; every program computes the same amax (a maximum does not depend
on the order it is taken in), so every block is cast with the same scale, the scale the two
passes give."""

from __future__ import annotations

import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.quant_codes import encode, finite_abs, symmetric_scales


@kernel
def _quant_tensor_small_kernel(
    x_ptr,  # input, contiguous
    q_ptr,  # codes, contiguous
    scale_ptr,  # one float32 dequantization scale
    amax_ptr,  # one float32 amax (RETURN_AMAX)
    numel,
    QMIN: tl.constexpr,
    QMAX: tl.constexpr,
    MANT: tl.constexpr,
    EMIN: tl.constexpr,
    IS_FLOAT: tl.constexpr,
    POW2: tl.constexpr,
    RETURN_AMAX: tl.constexpr,
    EMULATE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    hi = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, numel, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < numel, other=0.0)
        hi = tl.maximum(hi, finite_abs(x.to(tl.float32)))
    amax = tl.max(hi, axis=0)
    qscale, scale = symmetric_scales(amax, QMAX, POW2)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    codes = encode(x * qscale, 0.0, QMIN, QMAX, IS_FLOAT, MANT, EMIN, EMULATE)
    tl.store(q_ptr + offs, codes.to(q_ptr.dtype.element_ty), mask=mask)
    if pid == 0:
        tl.store(scale_ptr, scale)
        if RETURN_AMAX:
            tl.store(amax_ptr, amax)
