"""Memory-access patterns: a coalesced copy and a tiled transpose (with its naive strided variant).

``copy`` is the elementwise kernel with nothing to compute: each warp reads and writes
consecutive 16-byte vectors, so it runs at the copy bandwidth and is the yardstick for the
others. ``transpose`` reads a tile along rows and writes it along columns of the output; the
tile passes through shared memory (Triton inserts the layout conversion), so both the read and
the write stay coalesced. The strided variant is the same kernel with a one-row tile: reads
are coalesced, writes land ``M`` elements apart, one 32-byte sector per element.
"""

from dataclasses import dataclass

import torch
import triton.language as tl

from tritonkit import _tuning
from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.layout import LAYOUT_COPIES, cdiv, next_power_of_2
from tritonkit.ops._core.registry import apply, define_op, eager_direct
from tritonkit.ops._core.validate import check_tensor
from tritonkit.ops.elementwise import BiasActFunction


@kernel
def _transpose_kernel(
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


# 32 KiB tiles, 8 warps: the best of nine tile shapes on an H200 for bf16 (128 x 128) and
# fp32 (128 x 64) (benchmarks/NOTES.md). They are the defaults; on a GPU the first call per
# shape class times the candidates below once and the persistent autotune cache keeps the winner.
_TILED_BY_ELEMENT_SIZE = {2: TransposeConfig(128, 128, 8)}
_TILED_DEFAULT = TransposeConfig(128, 64, 8)
_CANDIDATES = [(128, 128, 8), (128, 64, 8), (64, 128, 8), (64, 64, 4), (32, 128, 4)]
STRIDED = TransposeConfig(1, 1024, 4)


def _as_tuning(c: TransposeConfig) -> _tuning.Config:
    return _tuning.Config({"BLOCK_M": c.BLOCK_M, "BLOCK_N": c.BLOCK_N}, c.num_warps, 1)


def _from_tuning(c: _tuning.Config) -> TransposeConfig:
    return TransposeConfig(c.params["BLOCK_M"], c.params["BLOCK_N"], c.num_warps)


def tiled_config(x3: torch.Tensor, y: torch.Tensor) -> TransposeConfig:
    """The tile for transposing ``x3`` ([batch, M, N]) into ``y``: cached, tuned, or default."""
    es = x3.element_size()
    default = _TILED_BY_ELEMENT_SIZE.get(es, _TILED_DEFAULT)
    if not _tuning.enabled():
        return default
    _, m, n = x3.shape
    key = {"elem_size": es, "m": min(next_power_of_2(m), 8192), "n": min(next_power_of_2(n), 8192)}

    def choose() -> TransposeConfig:
        candidates = [default] + [
            TransposeConfig(*c) for c in _CANDIDATES if TransposeConfig(*c) != default
        ]
        best = _tuning.tune(
            "transpose",
            key,
            [_as_tuning(c) for c in candidates],
            lambda cfg: _launch(x3, y, _from_tuning(cfg)),
            # The tile passes through shared memory on its way from row- to column-major.
            prune=lambda cfg: _tuning.fits_shared_memory(
                cfg.params["BLOCK_M"] * cfg.params["BLOCK_N"] * es
            ),
        )
        return _from_tuning(best)

    return _tuning.remembered("transpose", tuple(key.items()), choose)


def transpose_fwd(x: torch.Tensor, config: TransposeConfig | None = None) -> torch.Tensor:
    """``x.transpose(-2, -1).contiguous()``; the launcher behind tritonkit.transpose."""
    *batch_shape, m, n = x.shape
    y = torch.empty((*batch_shape, n, m), dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return y
    try:
        x3 = x.view(-1, m, n)
    except RuntimeError:  # batch dimensions without one common stride
        LAYOUT_COPIES.count += 1
        x3 = x.contiguous().view(-1, m, n)
    _launch(x3, y, config or tiled_config(x3, y))
    return y


def _launch(x3: torch.Tensor, y: torch.Tensor, config: TransposeConfig) -> None:
    batch, m, n = x3.shape
    grid = (batch * cdiv(m, config.BLOCK_M) * cdiv(n, config.BLOCK_N),)
    _transpose_kernel[grid](
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


@define_op("tritonkit::transpose")
def _transpose_op(x: torch.Tensor) -> torch.Tensor:
    return transpose_fwd(x)


@_transpose_op.register_fake
def _(x):
    *batch_shape, m, n = x.shape
    return x.new_empty((*batch_shape, n, m))


# Eager calls on real tensors skip the ops' dispatch (see eager_direct).
call_transpose = eager_direct(_transpose_op)


class TransposeFunction(torch.autograd.Function):
    """Materialized transpose of the last two dimensions.

    The gradient is returned as a transposed view, as PyTorch's own transpose does: autograd
    accepts any strides, and whoever needs it contiguous pays for the copy once.
    """

    @staticmethod
    def forward(ctx, x):
        return call_transpose(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.transpose(-2, -1)


def copy(x: torch.Tensor) -> torch.Tensor:
    """A new tensor equal to x (``torch.clone``), with autograd.

    Dense inputs keep their strides, other views give a contiguous copy, as ``torch.clone``.

    Args:
        x: float32, float16 or bfloat16 tensor on a CUDA device.
    """
    check_tensor("tritonkit.copy", "x", x)
    return apply(BiasActFunction, x, None, "none")


def transpose(x: torch.Tensor) -> torch.Tensor:
    """The transpose of the last two dimensions, materialized: ``x.transpose(-2, -1).contiguous()``.

    Unlike ``torch.transpose``, which returns a view, this moves the data, through a tiled
    kernel whose reads and writes are both coalesced.

    Args:
        x: float32, float16 or bfloat16 tensor of shape ``(..., M, N)`` on a CUDA device, any
            strides.

    Returns:
        A contiguous tensor of shape ``(..., N, M)``.
    """
    check_tensor("tritonkit.transpose", "x", x)
    if x.dim() < 2:
        raise ValueError(
            f"tritonkit.transpose: x must have at least 2 dimensions, got shape {tuple(x.shape)}"
        )
    return apply(TransposeFunction, x)


# The family's public functions: tritonkit.__all__ and tritonkit.functional derive from these.
__all__ = ["copy", "transpose"]
