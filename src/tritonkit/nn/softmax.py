"""Softmax modules: drop-in for torch.nn.Softmax and torch.nn.LogSoftmax."""

import warnings

import torch
from torch import nn

from tritonkit.ops.softmax import log_softmax, softmax


def _dim(module: nn.Module, x: torch.Tensor) -> int:
    if module.dim is not None:
        return module.dim
    # torch.nn's legacy rule for dim=None, with its deprecation warning.
    warnings.warn(
        f"Implicit dimension choice for {type(module).__name__.lower()} has been deprecated. "
        "Change the call to include dim=X as an argument.",
        stacklevel=3,
    )
    return 0 if x.dim() in (0, 1, 3) else 1


class Softmax(nn.Softmax):
    """``torch.nn.Softmax`` on tritonkit's kernel (any dim, read through strides).

    Args:
        dim: the dimension to normalize over; None picks it as torch.nn.Softmax does (with
            the same deprecation warning).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softmax(x, _dim(self, x))


class LogSoftmax(nn.LogSoftmax):
    """``torch.nn.LogSoftmax`` on tritonkit's kernel.

    Args:
        dim: the dimension to normalize over; None picks it as torch.nn.LogSoftmax does.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return log_softmax(x, _dim(self, x))
