"""Whole models on tritonkit's kernels: ``patch(model)`` / ``unpatch(model)``, and the head's
linear + cross-entropy without logits (``linear_cross_entropy``).

``tritonkit.patch`` and ``tritonkit.unpatch`` are these. transformers is optional: it is
imported only when a Hugging Face model is patched.
"""

from tritonkit.models.loss import (
    LinearCrossEntropyConfig,
    LinearCrossEntropyFunction,
    linear_cross_entropy,
)
from tritonkit.models.patcher import PatchOptions, PatchReport
from tritonkit.models.patching import patch, patched, unpatch

__all__ = [
    "LinearCrossEntropyConfig",
    "LinearCrossEntropyFunction",
    "PatchOptions",
    "PatchReport",
    "linear_cross_entropy",
    "patch",
    "patched",
    "unpatch",
]
