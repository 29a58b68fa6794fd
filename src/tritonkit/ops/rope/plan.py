"""The rope launcher: output allocation, config, grid and launch."""

import torch

from tritonkit.ops._core.layout import cdiv, next_power_of_2
from tritonkit.ops.rope.config import ROPE_WARPS, RopeConfig
from tritonkit.ops.rope.kernels import rope_kernel


def rope_launch(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    backward: bool,
    config: RopeConfig | None = None,
) -> torch.Tensor:
    """The rotation of ``x`` (4-D, unit last stride) by ``cos``/``sin`` (3-D ``(B, T, D)``,
    unit last stride, equal strides), or its transpose when ``backward``."""
    b, h, t, dim = x.shape
    half = dim // 2
    out = torch.empty_like(x)  # x's layout when dense (the transposed projection stays so)
    if out.stride(-1) != 1:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out
    cfg = config or RopeConfig.for_head_dim(dim)
    grid = (b * h, cdiv(t, cfg.block_t))
    rope_kernel[grid](
        x, cos, sin, out, h, t, half,
        x.stride(0), x.stride(1), x.stride(2),
        cos.stride(0), cos.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        half if backward else 0,
        0 if backward else half,
        -1.0 if backward else 1.0,
        BLOCK_T=cfg.block_t,
        BLOCK_D=next_power_of_2(half),
        num_warps=ROPE_WARPS,
    )  # fmt: skip
    return out
