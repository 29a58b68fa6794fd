"""The non-finite gradient check: a pass that only reads, before a step that writes.

A step that meets a NaN or an infinity must leave every parameter and state tensor as it
was. One kernel cannot both update and promise that: its programs run in any order, and a
program that finds a NaN cannot undo what the others already wrote. So the check is its own
launch over the gradients (4 bytes per float32 parameter against the step's 28), writing a
per-tensor flag and one global flag; the step then either reads the global flag on the
device and returns at once when it is set (``skip``: no host sync), or the host reads it and
raises before the step is launched (``raise``: one sync).
"""

from __future__ import annotations

import torch
import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops.optim.math import load_chunk_f32
from tritonkit.ops.optim.tables import TL_DTYPES, ChunkConfig, TensorTable


@kernel(do_not_specialize=["n_tensors", "grad_row"])
def _nonfinite_kernel(
    chunk_tensor_ptr,  # int32 [n_chunks]: the tensor program c reads
    chunk_block_ptr,  # int32 [n_chunks]: which BLOCK of it
    table_ptr,  # int64 [rows, n_tensors]: addresses; the gradients are row grad_row
    numel_ptr,  # int64 [n_tensors]
    n_tensors,
    grad_row,
    flags_ptr,  # float32 [n_tensors]: set to 1 for a tensor with a non-finite element
    found_ptr,  # float32 [1]: set to 1 if any tensor has one
    G_DTYPE: tl.constexpr,
    BLOCK: tl.constexpr,
    ALIGNED: tl.constexpr,
):
    t, g = load_chunk_f32(
        chunk_tensor_ptr, chunk_block_ptr, table_ptr, numel_ptr, n_tensors, grad_row,
        G_DTYPE, BLOCK, ALIGNED,
    )  # fmt: skip
    # x - x is 0 for every finite x and NaN for NaN and +-inf.
    bad = tl.max(tl.where(g - g == 0.0, 0, 1), axis=0)
    if bad != 0:
        tl.store(flags_ptr + t, 1.0)
        tl.store(found_ptr, 1.0)


def launch_nonfinite_check(
    table: TensorTable,
    grad_row: int,
    g_dtype: torch.dtype,
    flags: torch.Tensor,
    found: torch.Tensor,
    config: ChunkConfig,
) -> None:
    """Set ``flags[t]`` and ``found`` to 1 where tensor t of ``grad_row`` has a NaN or an
    infinity (both must be zeroed first; nothing else is written)."""
    _nonfinite_kernel[(table.n_chunks,)](
        table.chunk_tensor,
        table.chunk_block,
        table.table,
        table.numels,
        table.n_tensors,
        grad_row,
        flags,
        found,
        G_DTYPE=TL_DTYPES[g_dtype],
        BLOCK=table.block,
        ALIGNED=table.aligned,
        num_warps=config.num_warps,
    )
