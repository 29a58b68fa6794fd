"""Loss modules: drop-in for torch.nn.CrossEntropyLoss."""

import torch
from torch import nn

from tritonkit.ops.cross_entropy import cross_entropy


class CrossEntropyLoss(nn.CrossEntropyLoss):
    """``torch.nn.CrossEntropyLoss`` for class-index targets, on tritonkit's kernel.

    Subclasses the torch.nn module, so the ``weight`` buffer, ``state_dict`` and the legacy
    ``size_average``/``reduce`` arguments behave as in PyTorch. The forward keeps only the rows'
    logsumexps; the backward reads the logits once and writes their gradient (see
    :func:`tritonkit.ops.cross_entropy.cross_entropy`).

    Args:
        weight: optional class weights of shape (C,), same dtype as the logits.
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
