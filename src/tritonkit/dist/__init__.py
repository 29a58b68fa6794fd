"""``tritonkit.dist``: collectives on torch.distributed.

``all_reduce``, ``broadcast``, ``all_gather`` and ``reduce_scatter`` take torch.distributed's
arguments (NCCL for CUDA tensors, gloo for CPU ones) plus ``timeout``; where tritonkit adds no
algorithm they call torch.distributed. tritonkit's own: :func:`ring_all_reduce` (reductions in
Triton), :func:`compressed_all_reduce` and its DDP hook (:func:`compressed_allreduce_hook`,
:class:`CompressionState`, :func:`register_compression`), :func:`symm_all_reduce` (symmetric
memory, CUDA) and :func:`fused_all_reduce_add_rms_norm`. :func:`set_debug` / :func:`debug`
check that all ranks pass the same shapes and dtypes. See ``ops/collectives/``.
"""

from tritonkit.ops.collectives.function import (
    CollectiveError,
    CompressionState,
    ReduceOp,
    all_gather,
    all_reduce,
    broadcast,
    compressed_all_reduce,
    compressed_allreduce_hook,
    debug,
    fused_all_reduce_add_rms_norm,
    reduce_scatter,
    register_compression,
    residual_size,
    ring_all_reduce,
    set_debug,
    symm_all_reduce,
)

__all__ = [
    "CollectiveError",
    "CompressionState",
    "ReduceOp",
    "all_gather",
    "all_reduce",
    "broadcast",
    "compressed_all_reduce",
    "compressed_allreduce_hook",
    "debug",
    "fused_all_reduce_add_rms_norm",
    "reduce_scatter",
    "register_compression",
    "residual_size",
    "ring_all_reduce",
    "set_debug",
    "symm_all_reduce",
]
