"""Normalization modules: drop-in for torch.nn.LayerNorm and torch.nn.RMSNorm.

Each subclasses its torch.nn counterpart, so parameters, initialization, ``state_dict`` and
``repr`` are PyTorch's own; only ``forward`` runs on tritonkit's kernels.
"""

import torch
from torch import nn

from tritonkit.ops.norm import layer_norm, rms_norm


class LayerNorm(nn.LayerNorm):
    """``torch.nn.LayerNorm`` on tritonkit's kernels; loads a ``torch.nn.LayerNorm`` state_dict.

    Args:
        normalized_shape: the trailing shape to normalize over.
        eps: added to the variance before the square root.
        elementwise_affine: whether to learn a per-element scale (and shift).
        bias: whether the affine transform has a shift.
        device: where to create the parameters.
        dtype: dtype of the parameters; inputs must have the same dtype.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.RMSNorm):
    """``torch.nn.RMSNorm`` on tritonkit's kernels; loads a ``torch.nn.RMSNorm`` state_dict.

    Args:
        normalized_shape: the trailing shape to normalize over.
        eps: added to the mean square; None means ``torch.finfo(torch.float32).eps``, as
            ``torch.nn.RMSNorm`` computes.
        elementwise_affine: whether to learn a per-element scale.
        device: where to create the parameters.
        dtype: dtype of the parameters; inputs must have the same dtype.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.normalized_shape, self.weight, self.eps)
