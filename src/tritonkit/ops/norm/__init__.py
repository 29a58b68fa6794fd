"""Norm family: LayerNorm and RMSNorm, alone or fused with the residual add, forward and backward.

The kernels see their tensors as ``(n_outer, n_cols, n_inner)`` with real strides, as the
softmax family does (``ops/_core/rows.py``: ``row_tensors``), the normalized dims merged into the
column axis.

Forward: contiguous rows without a residual within ``RowForwardConfig``'s widths take one program
each, the row width a compile-time constant (``kernels_forward_row.py``: one compilation per width,
as torch.compile does), two sweeps over chunks, the second re-reading the row from L2 (very wide
16-bit LayerNorm rows sum the first sweep per thread). Otherwise a row that fits in registers
(``kernels_forward_tiles.py``, up to ``NormTiles.max_fused_cols``) is read once; a wider row
(``kernels_forward_looped.py``) is read twice (statistics, then the output, last chunk first), the
second time from L2. Per row it saves two fp32 values for the backward: rstd and, for LayerNorm, the
mean. LayerNorm is stable on rows with a large mean and a small variance (fp32 rows of 1e4 + N(0,
1)): every value of an fp32 row is first shifted by the row's first element, which makes the
subtraction of nearby values exact, the mean is that of the shifted values, and the variance is that
of the deviations from it (two passes over registers). A looped row is shifted (again) by its first
chunk's mean, and sums its values and squares per lane (``LoopedRowsConfig.stats_ln`` 1): that mean
is within sqrt(n / chunk) standard deviations of the row's, so E[d^2] - E[d]^2 loses at most a few
bits (chunks merged with Chan's formula with ``stats_ln`` 0, also for 16-bit rows with a residual,
their means taken relative to the first chunk's). The saved "mean" is the mean after the
first-element shift, and the backward shifts again by the same first element. 16-bit rows skip the
first-element shift (``config.shifts``): their own rounding dwarfs what it saves. Whether to shift
depends on the dtype alone, so that a backward whose path (registers or looped) differs from its
forward's reads the saved mean as the forward wrote it. Wide LayerNorm rows in registers
(``RegistersForwardConfig.pipeline_min_cols``) are walked one program per SM through the compiler's
software pipeline; narrower rows take one program per row tile.

Backward (``kernels_backward.py``): dx per row, and the weight and bias gradients as fp32 partial
sums, one row of them per program, each program walking a group of rows; a second pass sums the
partials in a fixed order, so the result is deterministic. Rows in registers reach each program
through the compiler's software pipeline (``RegistersBackwardConfig.stages``: tiles loaded into
shared memory ahead by cp.async). Rows wider than ``RegistersBackwardConfig.max_cols`` (wider rows
in registers spill) first get their two row sums (sum(w * dy * xhat), sum(w * dy)) from a looped
pass (``kernels_backward_wide.py``), then a column-block pass computes dx and the partial sums, with
the next tile's loads issued by hand before each tile's work (RMSNorm: through the compiler's
pipeline).

The fused residual forms return ``(norm(x + residual), x + residual)``: the sum is normalized in
fp32 before it is rounded and stored (the unfused eager code normalizes the rounded sum, one
rounding less accurate); the backward reads the stored sum, not x and residual.

A call's path: ``function.py`` (the public functions: validation, autocast,
``registry.apply``; the autograd Functions and the torch.library ops) -> ``plan.py`` (the plan
of one layout: allocations and launches, kept in the plan cache) -> ``ops/_core/launch.py``.
``config.py`` holds every tunable (``NormConfig``, one dataclass per kernel path) and the
choice of kernel path and tiles; ``plan.py`` builds the launches when a plan is built;
``kernels.py`` has the ``@triton.jit`` helpers the ``kernels_<path>.py`` kernels share.
"""

from tritonkit.ops.norm.config import (
    NORM,
    NormBackwardConfig,
    NormConfig,
    NormForwardConfig,
    NormTiles,
)
from tritonkit.ops.norm.function import (
    add_layer_norm,
    add_norm,
    add_rms_norm,
    layer_norm,
    norm,
    rms_norm,
)

# The public functions (tritonkit.__all__ derives from them); configs and internal entry
# points are importable from here too.
__all__ = ["add_layer_norm", "add_rms_norm", "layer_norm", "rms_norm"]
