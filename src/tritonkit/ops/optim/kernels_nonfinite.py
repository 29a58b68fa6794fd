"""The non-finite gradient check: a pass that only reads, before a step that writes.

A step that meets a NaN or an infinity must leave every parameter and state tensor as it
was. One kernel cannot both update and promise that: its programs run in any order, and a
program that finds a NaN cannot undo what the others already wrote. So the check reads the
gradients first (4 bytes per float32 parameter against the step's 28; none more when
``clip_grad_norm_`` runs, whose norm pass does it on the same read) and sets one device flag;
every kernel of the step reads the flag and returns at once when it is set (``skip``: no host
sync), or the host reads it and raises before the step is launched (``raise``: one sync).

The program that sets the flag first in a step (an atomic exchange returns the old value)
also adds one to a device counter of skipped steps, which the user reads when they choose.
The flag is zeroed before each step's check (a memset, captured like any launch in a CUDA
graph), the counter never.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops.optim.kernels import load_chunk_f32


@triton.jit
def mark_nonfinite(g, t, flags_ptr, found_ptr, count_ptr, NAMES: tl.constexpr):
    """If the block ``g`` of tensor ``t`` holds a NaN or an infinity: set ``found`` to 1 (and
    ``flags[t]`` with NAMES), and count the step once, by the program that set it first."""
    # x - x is 0 for every finite x and NaN for NaN and +-inf.
    bad = tl.max(tl.where(g - g == 0.0, 0, 1), axis=0)
    if bad != 0:
        if NAMES:
            tl.store(flags_ptr + t, 1.0)
        if tl.atomic_xchg(found_ptr, 1) == 0:
            tl.atomic_add(count_ptr, 1)


@kernel(do_not_specialize=["n_tensors", "grad_row"])
def _nonfinite_kernel(
    chunk_tensor_ptr,  # int32 [n_chunks]: the tensor program c reads
    chunk_block_ptr,  # int32 [n_chunks]: which BLOCK of it
    table_ptr,  # int64 [rows, n_tensors]: addresses; the gradients are row grad_row
    numel_ptr,  # int64 [n_tensors]
    n_tensors,
    grad_row,
    flags_ptr,  # float32 [n_tensors]: set to 1 for a tensor with a non-finite element (NAMES)
    found_ptr,  # int32 [1]: set to 1 if any tensor has one
    count_ptr,  # int32 [1]: steps that met a non-finite gradient, + 1 by the first finder
    G_DTYPE: tl.constexpr,
    BLOCK: tl.constexpr,
    ALIGNED: tl.constexpr,
    NAMES: tl.constexpr,
):
    t, g = load_chunk_f32(
        chunk_tensor_ptr, chunk_block_ptr, table_ptr, numel_ptr, n_tensors, grad_row,
        G_DTYPE, BLOCK, ALIGNED,
    )  # fmt: skip
    mark_nonfinite(g, t, flags_ptr, found_ptr, count_ptr, NAMES)
