"""Rotary position embedding (RoPE), "rotate half" convention, forward and backward in one
pass each.

``kernels.py``: the kernel (the backward is the same rotation transposed, reading the sine
table's halves swapped); ``config.py``: its config and heuristic; ``plan.py``: the launcher;
``function.py``: the op's registration, the autograd Function and the public function.
"""

from tritonkit.ops.rope.config import RopeConfig
from tritonkit.ops.rope.function import RopeFunction, rope
from tritonkit.ops.rope.plan import rope_launch

__all__ = ["rope"]
