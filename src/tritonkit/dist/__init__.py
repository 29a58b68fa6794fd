"""``tritonkit.dist``: collectives on torch.distributed.

``all_reduce``, ``broadcast``, ``all_gather`` and ``reduce_scatter`` take torch.distributed's
arguments (NCCL for CUDA tensors, gloo for CPU ones) plus ``timeout``; where tritonkit adds no
algorithm they call torch.distributed. tritonkit's own: :func:`ring_all_reduce` (reductions in
Triton), :func:`compressed_all_reduce` and its DDP hook (:func:`compressed_allreduce_hook`,
:class:`CompressionState`, :func:`register_compression`), :func:`symm_all_reduce` (symmetric
memory, CUDA), :func:`fused_all_reduce_add_rms_norm` and :func:`all_gather_matmul` (the gather
overlapped with the product). :func:`set_debug` / :func:`debug`
check that all ranks pass the same shapes and dtypes. See ``ops/collectives/``.
"""

# The public list is the family's own (one list, kept in ops/collectives/function.py).
from tritonkit.ops.collectives import function as _function
from tritonkit.ops.collectives.function import *  # noqa: F403

__all__ = list(_function.__all__)
