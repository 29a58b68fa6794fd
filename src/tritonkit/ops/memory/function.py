"""The memory family's op registration, autograd Functions and public functions: ``copy``
(the pointwise tile with nothing to compute: the yardstick of copy bandwidth) and
``transpose``.
"""

from __future__ import annotations

import torch

from tritonkit.ops._core.bias_act import call_bias_act
from tritonkit.ops._core.registry import apply, define_op, eager_direct
from tritonkit.ops._core.validate import check_tensor
from tritonkit.ops.memory.plan import transpose_fwd


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


class CopyFunction(torch.autograd.Function):
    """A new tensor equal to x: the pointwise forward with no bias and no activation; the
    gradient passes through."""

    @staticmethod
    def forward(ctx, x):
        y, _ = call_bias_act(x, None, "none", False)
        return y

    @staticmethod
    def backward(ctx, grad):
        return grad


def copy(x: torch.Tensor) -> torch.Tensor:
    """A new tensor equal to x (``torch.clone``), with autograd.

    Dense inputs keep their strides, other views give a contiguous copy, as ``torch.clone``.

    Args:
        x: float32, float16 or bfloat16 tensor on a CUDA device.
    """
    check_tensor("tritonkit.copy", "x", x)
    return apply(CopyFunction, x)


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
