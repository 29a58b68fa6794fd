"""One output tile per program: the evolution's fixed steps (``naive``: CUDA-core FMAs;
``tiled``: tensor-core tiles; ``pipelined``: the same with ``num_stages`` > 1), the tuned
``autotuned`` tiles with grouped tile order, the IEEE float32 GEMMs on the CUDA cores (which
ran slower persistent), and the first pass of split-K (``splitk.py``).

The tile itself is ``_core.gemm.gemm_tile``; this kernel only gives each program its tile.
"""

from __future__ import annotations

import triton.language as tl

from tritonkit.ops._core.gemm import gemm_tile, make_descriptors
from tritonkit.ops._core.launch import kernel


@kernel
def matmul_tile_kernel(
    a_ptr,  # A [batch..., M, K], any strides
    b_ptr,  # B [batch..., K, N], any strides
    c_ptr,  # C [batch..., M, N] (written when SPLIT_K == 1)
    ws_ptr,  # [SPLIT_K, M, N] fp32/int32 partial tiles (when SPLIT_K > 1)
    a_desc,  # host TMA descriptor of A or A^T (USE_TMA, not DEVICE_DESC), else None
    b_desc,  # host TMA descriptor of B or B^T, else None
    c_desc,  # host TMA descriptor of C, else None
    scale_a_ptr,  # fp32 scale(s) of A (SCALE_A)
    scale_b_ptr,  # fp32 scale(s) of B (SCALE_B)
    bias_ptr,  # [N] bias (HAS_BIAS)
    res_ptr,  # [M, N] residual added after the activation (HAS_RES)
    z_ptr,  # [M, N] pre-activation for linear's backward pass (STORE_Z)
    M,  # rows of A and C
    N,  # columns of B and C
    K,  # columns of A, rows of B
    k_split,  # K elements per split, a multiple of BLOCK_K (K rounded up when SPLIT_K == 1)
    plane,  # M * N: elements of one partial tile plane of the workspace
    n_batch,  # matrices in the batch
    batch_inner,  # extent of the inner batch dimension (n_batch = outer * inner)
    stride_ab0,  # A: elements between outer batch entries (0 when broadcast)
    stride_ab1,  # A: elements between inner batch entries (0 when broadcast)
    stride_am,
    stride_ak,
    stride_bb0,
    stride_bb1,
    stride_bk,
    stride_bn,
    stride_cb0,
    stride_cb1,
    stride_cm,
    stride_cn,
    stride_sa,  # elements between per-row scales of A
    stride_sb,  # elements between per-column scales of B
    stride_bias,  # elements between bias entries
    stride_rm,
    stride_rn,
    stride_zm,
    stride_zn,
    USE_TMA: tl.constexpr,  # operands through TMA descriptors (Hopper), else pointer loads
    DEVICE_DESC: tl.constexpr,  # the descriptors made here (_core.gemm.make_descriptors)
    A_T: tl.constexpr,  # A is M-major: its descriptor is over A^T
    B_T: tl.constexpr,  # B is K-major: its descriptor is over B^T
    EPILOGUE_SUBTILE: tl.constexpr,  # store C in two half tiles (TMA only)
    SPLIT_K: tl.constexpr,  # programs sharing one output tile's K range
    DOT: tl.constexpr,  # tensor cores (tl.dot); False: the v0 CUDA-core loop
    INPUT_PRECISION: tl.constexpr,  # fp32 operands: "tf32" or "ieee"; else None
    MAX_IMPRECISE: tl.constexpr,  # fp8: K elements per partial sum before fp32 promotion
    PROMOTE_BLOCKS: tl.constexpr,  # fp8: or K blocks per partial sum, promoted by hand (> 1)
    UPCAST: tl.constexpr,  # operands to fp32 before tl.dot (bf16 under the interpreter)
    ACC_INT: tl.constexpr,  # int32 accumulator (int8 operands)
    EVEN_K: tl.constexpr,
    INT64: tl.constexpr,  # 64-bit offsets: some operand spans 2**31 elements or more
    FLOAT_OUT: tl.constexpr,
    SCALE_A: tl.constexpr,
    SCALE_B: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,  # activation code (_core.math.ACTIVATIONS)
    HAS_RES: tl.constexpr,
    STORE_Z: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,  # row blocks per group of the tile order (1: row-major order)
):
    if DEVICE_DESC:
        a_d, b_d, c_d = make_descriptors(
            a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
            A_T, B_T, EPILOGUE_SUBTILE, BLOCK_M, BLOCK_N, BLOCK_K,
        )  # fmt: skip
    else:
        a_d, b_d, c_d = a_desc, b_desc, c_desc
    gemm_tile(
        tl.program_id(0), a_ptr, b_ptr, c_ptr, ws_ptr, a_d, b_d, c_d, scale_a_ptr, scale_b_ptr,
        bias_ptr, res_ptr, z_ptr, M, N, K, k_split, plane, batch_inner, stride_ab0, stride_ab1,
        stride_am, stride_ak, stride_bb0, stride_bb1, stride_bk, stride_bn, stride_cb0,
        stride_cb1, stride_cm, stride_cn, stride_sa, stride_sb, stride_bias, stride_rm,
        stride_rn, stride_zm, stride_zn, USE_TMA, A_T, B_T, EPILOGUE_SUBTILE, SPLIT_K, DOT,
        INPUT_PRECISION, MAX_IMPRECISE, PROMOTE_BLOCKS, UPCAST, ACC_INT, EVEN_K, INT64,
        FLOAT_OUT, SCALE_A, SCALE_B, HAS_BIAS, ACT, HAS_RES, STORE_Z, BLOCK_M, BLOCK_N, BLOCK_K,
        GROUP_M,
    )  # fmt: skip
