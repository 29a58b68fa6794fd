"""Loss modules: drop-in for torch.nn.CrossEntropyLoss."""

import torch
from torch import nn

from tritonkit.ops.cross_entropy import cross_entropy


class CrossEntropyLoss(nn.CrossEntropyLoss):
    """``torch.nn.CrossEntropyLoss`` on tritonkit's kernels: class-index targets or class
    probabilities (a float target of the input's shape), (N, C) or (N, C, d1, ..., dk) input.

    Subclasses the torch.nn module, so the ``weight`` buffer, ``state_dict`` and the legacy
    ``size_average``/``reduce`` arguments behave as in PyTorch. The forward keeps a few floats
    per row; the backward reads the logits (and a probability target) once and writes their
    gradient (see :func:`tritonkit.ops.cross_entropy.cross_entropy`).

    Args:
        weight: optional class weights of shape (C,), in the logits' dtype or float32 (any
            float dtype with class probabilities).
        size_average: deprecated (see reduction).
        ignore_index: target value that contributes no loss and no gradient.
        reduce: deprecated (see reduction).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        label_smoothing: in [0, 1].
    """

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return cross_entropy(
            input,
            target,
            self.weight,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
        )
