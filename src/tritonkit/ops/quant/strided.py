"""One pass: quantize groups of K elements along a dimension that is not the last (per column
of a short matrix, or groups of K rows), amax, scale and cast in the same program."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.layout import cdiv, next_power_of_2
from tritonkit.ops.quant._jit import (
    asymmetric_scales,
    encode,
    finite_abs,
    finite_or,
    symmetric_scales,
)
from tritonkit.ops.quant.formats import QFormat

# A group of K rows times at least 16 columns fits one program up to this many elements.
MAX_TILE = 8192
MIN_BLOCK_I = 16


@kernel
def _quant_strided_kernel(
    x_ptr,  # (n_outer, D, n_inner) input
    q_ptr,  # codes, same logical shape, own strides
    scale_ptr,  # (n_outer, D // K, n_inner) float32 dequantization scales, contiguous
    zp_ptr,  # same shape: int32 zero points (asymmetric only)
    amax_ptr,  # same shape: float32 amax (RETURN_AMAX only)
    n_inner,
    groups_per_outer,  # D // K
    stride_xo,
    stride_xd,
    stride_xi,
    stride_qo,
    stride_qd,
    stride_qi,
    QMIN: tl.constexpr,
    QMAX: tl.constexpr,
    MANT: tl.constexpr,
    EMIN: tl.constexpr,
    K: tl.constexpr,  # group size along D
    K_P2: tl.constexpr,
    BLOCK_I: tl.constexpr,  # inner positions per program
    IS_FLOAT: tl.constexpr,
    ASYM: tl.constexpr,
    POW2: tl.constexpr,
    RETURN_AMAX: tl.constexpr,
    EMULATE: tl.constexpr,
):
    pid_g = tl.program_id(0).to(tl.int64)  # one (outer index, group along D)
    o = pid_g // groups_per_outer
    d = (pid_g - o * groups_per_outer) * K + tl.arange(0, K_P2)
    i = tl.program_id(1).to(tl.int64) * BLOCK_I + tl.arange(0, BLOCK_I)
    i_ok = i < n_inner
    mask = (tl.arange(0, K_P2) < K)[:, None] & i_ok[None, :]
    offs = o * stride_xo + d[:, None] * stride_xd + i[None, :] * stride_xi
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    s_offs = pid_g * n_inner + i
    if ASYM:
        lo = tl.min(finite_or(x, 0.0), axis=0)
        hi = tl.max(finite_or(x, 0.0), axis=0)
        qscale, scale, zp = asymmetric_scales(lo, hi, QMIN, QMAX, EMULATE)
        tl.store(zp_ptr + s_offs, zp.to(tl.int32), mask=i_ok)
        amax = tl.maximum(-lo, hi)
    else:
        amax = tl.max(finite_abs(x), axis=0)
        qscale, scale = symmetric_scales(amax, QMAX, POW2)
        zp = tl.zeros_like(scale)
    codes = encode(x * qscale[None, :], zp[None, :], QMIN, QMAX, IS_FLOAT, MANT, EMIN, EMULATE)
    q_offs = o * stride_qo + d[:, None] * stride_qd + i[None, :] * stride_qi
    tl.store(q_ptr + q_offs, codes.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + s_offs, scale, mask=i_ok)
    if RETURN_AMAX:
        tl.store(amax_ptr + s_offs, amax, mask=i_ok)


@dataclass(frozen=True)
class StridedConfig:
    """Launch config of the one-pass strided kernel."""

    block_elems: int = 4096
    num_warps: int = 4


def fits_one_pass(k: int) -> bool:
    return next_power_of_2(k) * MIN_BLOCK_I <= MAX_TILE


def quantize_strided(
    x3: torch.Tensor,
    q3: torch.Tensor,
    scale: torch.Tensor,
    zp: torch.Tensor | None,
    amax: torch.Tensor | None,
    k: int,
    fmt: QFormat,
    pow2: bool,
    emulate: bool,
    config: StridedConfig | None = None,
) -> None:
    """Launch over ``x3`` (n_outer, D, n_inner), groups of ``k`` along D; ``q3`` likewise."""
    n_outer, dim, n_inner = x3.shape
    if x3.numel() == 0:
        return
    cfg = config or StridedConfig()
    k_p2 = next_power_of_2(k)
    block_i = max(MIN_BLOCK_I, min(next_power_of_2(n_inner), cfg.block_elems // k_p2))
    grid = (n_outer * (dim // k), cdiv(n_inner, block_i))
    _quant_strided_kernel[grid](
        x3, q3, scale, zp, amax, n_inner, dim // k, *x3.stride(), *q3.stride(),
        QMIN=fmt.qmin, QMAX=fmt.qmax, MANT=fmt.mantissa, EMIN=fmt.emin,
        K=k, K_P2=k_p2, BLOCK_I=block_i,
        IS_FLOAT=fmt.is_float, ASYM=not fmt.symmetric, POW2=pow2,
        RETURN_AMAX=amax is not None, EMULATE=emulate, num_warps=cfg.num_warps,
    )  # fmt: skip
