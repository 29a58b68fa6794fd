"""The tiled transpose (and its naive strided variant, a one-row tile): reads a tile along rows
and writes it along columns of the output; the tile passes through shared memory (Triton inserts
the layout conversion), so both the read and the write stay coalesced. The strided variant's
reads are coalesced, its writes land ``M`` elements apart, one 32-byte sector per element.

``transpose_fwd`` is also the matmul family's copy into K-major (8-bit GEMMs) or row-major
(float32 on the CUDA cores) layouts: it takes any dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton.language as tl

from tritonkit import _tuning
from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.layout import LAYOUT_COPIES, cdiv, next_power_of_2
from tritonkit.ops._core.plan import cached
from tritonkit.ops._core.registry import define_op, eager_direct


@kernel
def transpose_kernel(
    x_ptr,  # input [batch, M, N], any strides
    y_ptr,  # output [batch, N, M], contiguous
    M,
    N,
    stride_xb,
    stride_xm,
    stride_xn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles = tl.cdiv(M, BLOCK_M) * tiles_n
    batch = pid // tiles
    pid_m = (pid % tiles) // tiles_n
    pid_n = pid % tiles_n
    rm = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    x_base = x_ptr + batch.to(tl.int64) * stride_xb
    tile = tl.load(x_base + rm[:, None] * stride_xm + rn[None, :] * stride_xn, mask=mask)
    y_base = y_ptr + batch.to(tl.int64) * M * N
    tl.store(y_base + rn[:, None] * M + rm[None, :], tl.trans(tile), mask=tl.trans(mask))


@dataclass(frozen=True)
class TransposeConfig:
    """Tile of the transpose kernel; BLOCK_M = 1 gives the naive strided transpose."""

    BLOCK_M: int
    BLOCK_N: int
    num_warps: int


@dataclass(frozen=True, eq=False)
class TransposeTuning:
    """The tiles the transpose chooses among: ``tiled(elem_size)`` is the default (untimed under
    the interpreter or with tuning off); on a GPU the first call per shape class times
    ``candidates`` once and the persistent autotune cache keeps the winner, keyed by element
    size and M, N rounded up to powers of 2 (at most ``key_cap``). Compared by identity (plans
    are cached per tuning object).

    32 KiB tiles, 8 warps: the best of the tile shapes swept for bf16 (128 x 128) and fp32
    (128 x 64) (see docs/performance.md).
    """

    tiled_16bit: TransposeConfig = TransposeConfig(128, 128, 8)
    tiled_default: TransposeConfig = TransposeConfig(128, 64, 8)
    candidates: tuple[tuple[int, int, int], ...] = (
        (128, 128, 8),
        (128, 64, 8),
        (64, 128, 8),
        (64, 64, 4),
        (32, 128, 4),
    )
    key_cap: int = 8192

    def tiled(self, elem_size: int) -> TransposeConfig:
        return self.tiled_16bit if elem_size == 2 else self.tiled_default


TRANSPOSE_TUNING = TransposeTuning()
STRIDED = TransposeConfig(1, 1024, 4)


def _as_tuning(c: TransposeConfig) -> _tuning.Config:
    return _tuning.Config({"BLOCK_M": c.BLOCK_M, "BLOCK_N": c.BLOCK_N}, c.num_warps, 1)


def _from_tuning(c: _tuning.Config) -> TransposeConfig:
    return TransposeConfig(c.params["BLOCK_M"], c.params["BLOCK_N"], c.num_warps)


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


@define_op("tritonkit::transpose")
def _transpose_op(x: torch.Tensor) -> torch.Tensor:
    return transpose_fwd(x)


@_transpose_op.register_fake
def _(x):
    *batch_shape, m, n = x.shape
    return x.new_empty((*batch_shape, n, m))


# Eager calls on real tensors skip the ops' dispatch (see eager_direct).
call_transpose = eager_direct(_transpose_op)
