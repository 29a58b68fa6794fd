"""IEEE float32 GEMMs ("highest" precision in PyTorch: TF32 off) run on the CUDA cores, in the
one-tile-per-program kernel (``tiled.py``) with the ``ieee`` tiles (``configs.py``).

``tl.dot`` on the CUDA cores (FMA) reads a K-major B (the weight of ``F.linear``: b = w.t())
through a transposed shared-memory tile, several times slower than a row-major B (see
docs/performance.md). So above ``GemmOptions.fma_copy_min_mnk`` such a B is first
copied row-major (``memory.transpose_fwd``: K * N elements read and written, counted in
LAYOUT_COPIES).
"""

from __future__ import annotations

import torch

from tritonkit.ops._core.device import sm_count
from tritonkit.ops._core.gemm import Problem, tf32_enabled
from tritonkit.ops.matmul.configs import GEMM_OPTIONS, GemmOptions
from tritonkit.ops.matmul.splitk import split_k_for


def fma_copies_b(p: Problem, options: GemmOptions = GEMM_OPTIONS) -> bool:
    """Whether the best path first copies ``p``'s B row-major: an IEEE fp32 GEMM of one
    matrix with a K-major B, from ``options.fma_copy_min_mnk`` on, not split over K."""
    a, b = p.a.tensor, p.b.tensor
    if a.dtype != torch.float32 or p.n_batch != 1 or tf32_enabled():
        return False
    stride_k, stride_n = p.b.strides[2:]
    if not (stride_k == 1 and stride_n != 1 and p.n > 1):
        return False
    if p.m * p.n * p.k < options.fma_copy_min_mnk:
        return False
    sms = options.sms or sm_count(b.device)
    return split_k_for(p.m, p.n, p.k, 1, sms) == 1
