"""The persistent GEMM: one program per SM walking the output tiles (and K splits) in grouped
order, what ``matmul`` and ``linear`` run by default. On Hopper the operands come through TMA
tensor descriptors, made on the device (``DEVICE_DESC``: no descriptor encoded on the host per
call) or passed from the host (``GemmOptions.descriptors``); elsewhere, or when strides are
not 16-byte aligned, the same loop with pointer loads.

The arguments are ``tiled.matmul_tile_kernel``'s (see there), plus the loop's own.
"""

from __future__ import annotations

import triton.language as tl

from tritonkit.ops._core.gemm import gemm_tile, make_descriptors
from tritonkit.ops._core.launch import kernel


@kernel
def matmul_persistent_kernel(
    a_ptr, b_ptr, c_ptr, ws_ptr, a_desc, b_desc, c_desc, scale_a_ptr, scale_b_ptr, bias_ptr,
    res_ptr, z_ptr, M, N, K, k_split, plane, n_batch, batch_inner, stride_ab0, stride_ab1,
    stride_am, stride_ak, stride_bb0, stride_bb1, stride_bk, stride_bn, stride_cb0, stride_cb1,
    stride_cm, stride_cn, stride_sa, stride_sb, stride_bias, stride_rm, stride_rn, stride_zm,
    stride_zn,
    NUM_SMS: tl.constexpr,  # programs of the launch
    FLATTEN: tl.constexpr,  # let the compiler pipeline across the tile loop and the K loop
    WARP_SPECIALIZE: tl.constexpr,  # producer/consumer warp groups
    USE_TMA: tl.constexpr, DEVICE_DESC: tl.constexpr, A_T: tl.constexpr, B_T: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr, SPLIT_K: tl.constexpr, DOT: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, MAX_IMPRECISE: tl.constexpr, PROMOTE_BLOCKS: tl.constexpr,
    UPCAST: tl.constexpr, ACC_INT: tl.constexpr, EVEN_K: tl.constexpr, INT64: tl.constexpr,
    FLOAT_OUT: tl.constexpr, SCALE_A: tl.constexpr, SCALE_B: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr, STORE_Z: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    if DEVICE_DESC:
        # Once per program, before the tile loop: each program writes its own three.
        a_d, b_d, c_d = make_descriptors(
            a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
            A_T, B_T, EPILOGUE_SUBTILE, BLOCK_M, BLOCK_N, BLOCK_K,
        )  # fmt: skip
    else:
        a_d, b_d, c_d = a_desc, b_desc, c_desc
    total = n_batch * tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N) * SPLIT_K
    for t in tl.range(
        tl.program_id(0), total, NUM_SMS, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE
    ):
        gemm_tile(
            t, a_ptr, b_ptr, c_ptr, ws_ptr, a_d, b_d, c_d, scale_a_ptr, scale_b_ptr, bias_ptr,
            res_ptr, z_ptr, M, N, K, k_split, plane, batch_inner, stride_ab0, stride_ab1,
            stride_am, stride_ak, stride_bb0, stride_bb1, stride_bk, stride_bn, stride_cb0,
            stride_cb1, stride_cm, stride_cn, stride_sa, stride_sb, stride_bias, stride_rm,
            stride_rn, stride_zm, stride_zn, USE_TMA, A_T, B_T, EPILOGUE_SUBTILE, SPLIT_K, DOT,
            INPUT_PRECISION, MAX_IMPRECISE, PROMOTE_BLOCKS, UPCAST, ACC_INT, EVEN_K, INT64,
            FLOAT_OUT, SCALE_A, SCALE_B, HAS_BIAS, ACT, HAS_RES, STORE_Z, BLOCK_M, BLOCK_N,
            BLOCK_K, GROUP_M,
        )  # fmt: skip
