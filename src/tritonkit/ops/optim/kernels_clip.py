"""The global gradient norm of ``clip_grad_norm_``, as one read of the gradients.

Clipping by the global norm needs every gradient read twice in ``torch.nn.utils``: once for
the norm, once to multiply it by the clip coefficient (a read and a write), and the optimizer
then reads it a third time. Here the norm pass writes one float32 partial sum of squares per
program of the multi-tensor table (4 bytes per ``BLOCK`` gradients); the coefficient is
computed on the device from their sum, and the step kernels divide the gradient by it as
they read it (the ``grad_scale`` path GradScaler uses), writing the clipped gradient back as
``clip_grad_norm_`` leaves it. No host sync anywhere. The same read does the step's
non-finite check (``CHECK``, ``nonfinite.mark_nonfinite``), so a clipped step reads its
gradients twice, not three times.
"""

from __future__ import annotations

import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops.optim.kernels import load_chunk_f32
from tritonkit.ops.optim.kernels_nonfinite import mark_nonfinite


@kernel(do_not_specialize=["n_tensors", "grad_row"])
def _sum_squares_kernel(
    chunk_tensor_ptr,  # int32 [n_chunks]: the tensor program c reads
    chunk_block_ptr,  # int32 [n_chunks]: which BLOCK of it
    table_ptr,  # int64 [rows, n_tensors]: addresses; the gradients are row grad_row
    numel_ptr,  # int64 [n_tensors]
    n_tensors,
    grad_row,
    partial_ptr,  # float32 [n_chunks]: sum of squares of program c's block
    flags_ptr,  # the non-finite check's (kernels_nonfinite.py), if CHECK: per-tensor flags (NAMES),
    found_ptr,  # the step's flag
    count_ptr,  # and its count of steps that met a non-finite gradient
    G_DTYPE: tl.constexpr,
    BLOCK: tl.constexpr,
    ALIGNED: tl.constexpr,
    CHECK: tl.constexpr,
    NAMES: tl.constexpr,
):
    t, g = load_chunk_f32(
        chunk_tensor_ptr, chunk_block_ptr, table_ptr, numel_ptr, n_tensors, grad_row,
        G_DTYPE, BLOCK, ALIGNED,
    )  # fmt: skip
    tl.store(partial_ptr + tl.program_id(0), tl.sum(g * g, axis=0))
    if CHECK:
        mark_nonfinite(g, t, flags_ptr, found_ptr, count_ptr, NAMES)
