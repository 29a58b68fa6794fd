"""The transpose's launcher. ``transpose_fwd`` is also the matmul family's copy into K-major
(8-bit GEMMs) or row-major (float32 on the CUDA cores) layouts: it takes any dtype.
"""

from __future__ import annotations

import torch

from tritonkit import _tuning
from tritonkit.ops._core.layout import LAYOUT_COPIES, cdiv, next_power_of_2
from tritonkit.ops._core.plan import cached
from tritonkit.ops.memory.config import (
    TRANSPOSE_TUNING,
    TransposeConfig,
    TransposeTuning,
    _as_tuning,
    _from_tuning,
)
from tritonkit.ops.memory.kernels import transpose_kernel


def tiled_config(
    x3: torch.Tensor, y: torch.Tensor, tuning: TransposeTuning = TRANSPOSE_TUNING
) -> TransposeConfig:
    """The tile for transposing ``x3`` ([batch, M, N]) into ``y``: cached, tuned, or default."""
    es = x3.element_size()
    default = tuning.tiled(es)
    if not _tuning.consulted():  # the interpreter: the default as is
        return default
    _, m, n = x3.shape
    cap = tuning.key_cap
    key = {"elem_size": es, "m": min(next_power_of_2(m), cap), "n": min(next_power_of_2(n), cap)}

    def choose() -> TransposeConfig:
        candidates = [default] + [
            TransposeConfig(*c) for c in tuning.candidates if TransposeConfig(*c) != default
        ]
        best = _tuning.tune(
            "transpose",
            key,
            [_as_tuning(c) for c in candidates],
            lambda cfg: _bind(x3, y, _from_tuning(cfg))(x3, y),
            # The tile passes through shared memory on its way from row- to column-major.
            prune=lambda cfg: _tuning.fits_shared_memory(
                cfg.params["BLOCK_M"] * cfg.params["BLOCK_N"] * es
            ),
        )
        return _from_tuning(best)

    return cached("transpose", tuple(key.items()), choose)


def _bind(x3: torch.Tensor, y: torch.Tensor, config: TransposeConfig):
    batch, m, n = x3.shape
    grid = (batch * cdiv(m, config.BLOCK_M) * cdiv(n, config.BLOCK_N),)
    return transpose_kernel.bind(
        grid,
        x3,
        y,
        m,
        n,
        x3.stride(0) if batch > 1 else 0,
        x3.stride(1),
        x3.stride(2),
        BLOCK_M=config.BLOCK_M,
        BLOCK_N=config.BLOCK_N,
        num_warps=config.num_warps,
    )


class _Plan:
    """transpose_fwd's decisions for one input signature."""

    __slots__ = ("copy", "run")


def transpose_fwd(
    x: torch.Tensor,
    config: TransposeConfig | None = None,
    tuning: TransposeTuning = TRANSPOSE_TUNING,
) -> torch.Tensor:
    """``x.transpose(-2, -1).contiguous()``; the launcher behind tritonkit.transpose.

    ``config`` forces a tile; else ``tuning`` chooses one (see ``TransposeTuning``).
    """
    *batch_shape, m, n = x.shape
    y = torch.empty((*batch_shape, n, m), dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return y
    key = (x.shape, x.stride(), x.dtype, x.data_ptr() % 16 == 0, config, tuning)
    plan = cached("transpose.plan", key, lambda: _plan(x, y, config, tuning))
    if plan.copy:
        LAYOUT_COPIES.count += 1
        x = x.contiguous()
    plan.run(x, y)
    return y


def _plan(x, y, config, tuning) -> _Plan:
    plan = _Plan()
    m, n = x.shape[-2:]
    try:
        x3 = x.view(-1, m, n)
        plan.copy = False
    except RuntimeError:  # batch dimensions without one common stride
        x3 = x.contiguous().view(-1, m, n)
        plan.copy = True
    y3 = y.view(-1, n, m)
    plan.run = _bind(x3, y3, config or tiled_config(x3, y3, tuning))
    return plan
