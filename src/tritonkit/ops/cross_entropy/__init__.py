"""Cross-entropy over class-index targets (with class weights, label smoothing and
ignore_index) or class probabilities (soft.py), over (N, C) or K-dimensional (N, C, d1, ...)
logits.

``F.cross_entropy`` in eager mode materializes log_softmax (N x C), then for the backward a
zero-filled N x C gradient of nll_loss and the log_softmax gradient: three N x C tensors and
six passes over them. Here each row is cut into segments of up to
``CrossEntropyConfig.seg`` classes, and every (row tile, segment) pair is an independent
program, so the passes stream like an elementwise kernel with many bytes in flight (a loop
over a whole row per program kept too few, and a second sweep that hoped to find the row in
L2 found DRAM instead):

1. ``ce_stats_kernel`` reads the logits once and writes per-segment partials in float32:
   the segment's maximum, the sum of exp(x - maximum) and, with label smoothing,
   sum_c w[c] * x[c]. That is 2 (3 with smoothing) floats per segment, 8 (12) bytes per
   segment: 0.05% (0.07%) of the bytes of bf16 logits in segments of 8192.
2. ``ce_rows_kernel`` merges a row's partials into its logsumexp and writes the row's loss
   (and the logsumexp when a gradient is needed): N rows, no N x C traffic but x[i, t_i].
3. The backward: ``ce_grad_kernel`` reads the logits again and writes the gradient
   ``grad_output * scale * (softmax - smoothed one-hot)`` in the logits' dtype.

Rows that do not start on a 16-byte boundary (an odd vocabulary) are cut into segments from
their first 128-byte line instead, so that every segment is read in 16-byte vectors; the few
classes around that aligned body are read by the row kernel and by the gradient's first
segment (``CrossEntropyConfig.align``).

So the forward reads the logits once, and the backward reads them once and writes their
gradient: no N x C float32 tensor anywhere, and no N x C tensor at all is kept between the
passes (only the N logsumexps). Computing the gradient inside the forward pass instead (the
earlier design here, and Liger's) saves nothing when grad_output is 1 (the same reads and
write, in the other pass) and costs a second read and write of the whole gradient whenever
it is not (a loss scale, reduction "none", a weighted sum of losses): 10.5 GB instead of
6.3 GB for bf16 logits (8192, 128256). The user's logits are never written, and a second
backward through the same graph (``retain_graph=True``) gives the same gradient again.

Loss, as ``F.cross_entropy`` defines it, for row i with target t, class weights w (1 without),
smoothing e and C classes::

    loss_i = (1 - e) * w[t] * (lse_i - x[i, t]) + e / C * sum_c w[c] * (lse_i - x[i, c])

ignored rows give 0; ``mean`` divides the sum by ``sum_i w[t_i]`` over non-ignored rows (NaN
when every target is ignored, as in PyTorch). Targets outside ``[0, C)`` (other than
ignore_index) raise, as in PyTorch: on the CPU a host check before any launch, on CUDA the row
kernel's device assert (``config.CHECK_TARGETS``).

Class probabilities (a float target of the logits' shape) take the same segments: the forward
reads logits and target once, the backward reads both again and writes the gradient of the
logits (and of the target, where it requires one); see soft.py for the arithmetic. K-dimensional
logits (N, C, d1, ..., dk) are (N, C, d) with their positions flattened (a view where they are
evenly strided): a row is a (sample, position) pair, addressed through two strides per tensor
(segments.row_offset), one where every tensor's rows are evenly strided.

Modules: ``kernels_segments.py`` (the segment helpers), ``kernels_forward.py`` (the forward's
kernels), ``kernels_backward.py`` (the gradient kernel), ``kernels_soft.py`` (the class-probability
kernels), ``config.py`` (``CrossEntropyConfig`` and the choice of launches), ``plan.py`` (launches
cached per layout), ``function.py`` (ops, autograd, the public function).
"""

from tritonkit.ops.cross_entropy.config import CROSS_ENTROPY, CrossEntropyConfig
from tritonkit.ops.cross_entropy.function import cross_entropy, cross_entropy_loss

# The public functions (tritonkit.__all__ derives from them); configs and internal entry
# points are importable from here too.
__all__ = ["cross_entropy"]
