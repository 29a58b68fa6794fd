"""Matmul family: matmul, linear with a fused epilogue, FP8 scaled and INT8 GEMMs.

One output tile (``_core.gemm.gemm_tile``) computes every GEMM of the family; kernels differ in
how programs take tiles, and the named variants are points in that space, not copies:

==============  ===================================================================
``naive``       v0: CUDA-core FMAs on 32 x 32 tiles (no tensor cores), no pipelining
``tiled``       v1: tensor-core tiles (``tl.dot``), 128 x 128 x 64, no pipelining
``pipelined``   v2: the same tiles with ``num_stages`` > 1 (loads overlap the math)
``autotuned``   v3: a tuned tile / warps / stages, and grouped tile order for L2 reuse
``persistent``  v4: one program per SM walking the tiles; on Hopper the operands come
                through TMA tensor descriptors; elsewhere, or when strides are not
                16-byte aligned, the same loop with pointer loads
==============  ===================================================================

Modules: ``tiled`` (one tile per program: v0-v3, IEEE float32 on the CUDA cores, split-K's
first pass), ``persistent`` (v4, what ``matmul`` and ``linear`` run by default), ``splitk``
(skinny problems: K split across programs, a deterministic reduction that applies the
epilogue), ``ieee`` and ``lowp`` (float32 without TF32; FP8 and INT8 with their layout
copies), ``configs`` (tiles, tuning space, options), ``plan`` (the host path: a cached plan per
input signature), ``launchers`` (``matmul_fwd``, ``linear_fwd``), ``api`` (registration,
autograd, public functions).

Every operand is read through its real strides: transposed and sliced views need no copy
(only batch dimensions that cannot be expressed with two strides are copied, and counted in
``LAYOUT_COPIES``). The exceptions are by choice: on Hopper, large FP8 and INT8 GEMMs whose
operands are not K-major first transpose them into K-major scratch (``lowp.kmajor_copies``),
and large IEEE fp32 GEMMs whose B is K-major copy B row-major (``ieee.fma_copies_b``), both
counted. Accumulation is fp32 (int32 for INT8); outputs are rounded once.
"""

from tritonkit.ops._core.gemm import FP8_DTYPES
from tritonkit.ops.matmul.api import (
    LinearFunction,
    MatmulFunction,
    int8_matmul,
    linear,
    matmul,
    matmul_variant,
    scaled_matmul,
)
from tritonkit.ops.matmul.configs import (
    GEMM_OPTIONS,
    NEVER_PROMOTE,
    PROMOTE_PER_BLOCK,
    VARIANTS,
    GemmOptions,
    MatmulConfig,
)
from tritonkit.ops.matmul.launchers import (
    linear_fwd,
    linear_plan,
    matmul_fwd,
    matmul_plan,
    matmul_problem,
    matmul_shape,
)
from tritonkit.ops.matmul.lowp import kmajor_copies, scaled_matmul_fwd, scaled_matmul_plan
from tritonkit.ops.matmul.splitk import split_k_for

__all__ = ["int8_matmul", "linear", "matmul", "scaled_matmul"]
