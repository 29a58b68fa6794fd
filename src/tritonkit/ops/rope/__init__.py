"""Rotary position embedding (RoPE), "rotate half" convention, forward and backward in one
pass each.

``kernel.py``: the kernel (one per direction: the backward is the same rotation transposed,
reading the sine table's halves swapped), its config and launcher; ``function.py``: the op's
registration, the autograd Function and the public function.
"""

from tritonkit.ops.rope.function import RopeFunction, rope
from tritonkit.ops.rope.kernel import RopeConfig, rope_launch

__all__ = ["rope"]
