"""Softmax family: softmax and log_softmax over any dimension, forward and backward.

Every kernel of the row-reduction families (softmax, norms, cross-entropy) sees its tensors as
``(n_outer, n_cols, n_inner)`` (``ops/_core/rows.py``): the reduced dimension is the middle
axis, with its own stride, and the other dimensions are merged into at most two "row" axes. A
reduction over the last dimension of a contiguous tensor is ``(1, C, R)`` with a row stride of
C; over dim 0 it is ``(1, R, C)`` with unit-stride rows, so that a tile of adjacent rows is read
coalesced. Neither needs a transpose copy; only a layout whose row dimensions cannot be merged
into two strided axes is copied (and counted in ``LAYOUT_COPIES``).

Kernel paths, one module each: rows held in registers (``kernels_tiles.py``), rows wider than that
in two sweeps (``kernels_looped.py``), the backward of one row per program with the width a constant
(``kernels_row_backward.py``), rows off 16 bytes (``kernels_aligned.py``). ``config.py`` holds the
tunables (``SoftmaxConfig``) and chooses a launch; ``plan.py`` caches the launches per layout;
``function.py`` has the ops, the autograd Function and the public functions. Arithmetic is fp32
whatever the storage dtype; each output is rounded once.
"""

from tritonkit.ops.softmax.config import SOFTMAX, SoftmaxConfig
from tritonkit.ops.softmax.function import log_softmax, softmax, softmax_along

# The public functions (tritonkit.__all__ derives from them); configs and internal entry
# points are importable from here too.
__all__ = ["log_softmax", "softmax"]
