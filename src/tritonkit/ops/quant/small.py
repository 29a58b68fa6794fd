"""One pass for a small tensor with one scale: every program finds the amax of the whole tensor
(small enough to sit in L2: each program reads it once), then casts its own block.

For one scale per tensor the general route is two passes (``twopass.py``: a zeroed float32,
an atomic amax pass, the cast pass): three launches, which cost more than the work for the
activations of a decode step (a few rows of a hidden size). Here one launch does it, with no
atomics and no zeroed buffer; every program computes the same amax (a maximum does not depend
on the order it is taken in), so every block is cast with the same scale, the scale the two
passes give.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton.language as tl

from tritonkit.ops._core.launch import Bound, kernel
from tritonkit.ops._core.layout import cdiv
from tritonkit.ops._core.plan import PLANS
from tritonkit.ops.quant._jit import encode, finite_abs, symmetric_scales
from tritonkit.ops.quant.formats import QFormat


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


# The largest tensor the one-pass kernel takes (every program reads all of it: the reads grow as
# numel**2 / block); 16 rows of a 16384-wide hidden state fit.
MAX_NUMEL = 1 << 18


@dataclass(frozen=True)
class SmallTensorConfig:
    """When a per-tensor scale takes the one-pass kernel (up to ``MAX_NUMEL`` elements), and its
    launch."""

    block: int = 4096
    num_warps: int = 8

    def takes(self, x: torch.Tensor, fmt: QFormat) -> bool:
        """Whether ``x`` quantized to ``fmt`` with one scale takes this kernel: contiguous,
        small, a symmetric unpacked format."""
        return 0 < x.numel() <= MAX_NUMEL and x.is_contiguous() and fmt.symmetric and not fmt.packed


SMALL_TENSOR = SmallTensorConfig()


def quantize_tensor_small(
    x: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    amax: torch.Tensor | None,
    fmt: QFormat,
    pow2: bool,
    emulate: bool,
    config: SmallTensorConfig = SMALL_TENSOR,
) -> None:
    """Cast contiguous ``x`` into contiguous codes ``q`` with one scale (written to ``scale``,
    and its amax to ``amax`` when given)."""
    numel = x.numel()
    key = (numel, x.dtype, q.dtype, x.device, amax is None, fmt, pow2, emulate, config)

    def bind() -> Bound:
        return _quant_tensor_small_kernel.bind(
            (cdiv(numel, config.block),), x, q, scale, amax, numel,
            QMIN=fmt.qmin, QMAX=fmt.qmax, MANT=fmt.mantissa, EMIN=fmt.emin,
            IS_FLOAT=fmt.is_float, POW2=pow2, RETURN_AMAX=amax is not None, EMULATE=emulate,
            BLOCK=config.block, num_warps=config.num_warps,
        )  # fmt: skip

    launch = PLANS.get(("quant.small_tensor", key), None, bind)  # no setting of the Env changes it
    if amax is None:
        launch(x, q, scale)
    else:
        launch(x, q, scale, amax)
