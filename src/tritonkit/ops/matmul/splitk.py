"""Split-K: for skinny problems (few output tiles, long K) several programs share each output
tile's K range, each writing an fp32 (int32) partial tile, and a second pass sums the partial
tiles in a fixed order (deterministic, unlike atomics) and applies the epilogue once.

The first pass is the one-tile-per-program kernel (``tiled.py``) with SPLIT_K > 1; this module
holds the rule that decides the split, its candidate tiles and the reduction kernel.
"""

from __future__ import annotations

import triton.language as tl

from tritonkit.ops._core.gemm import epilogue
from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.layout import cdiv, next_power_of_2

# When and how K is split (``split_k_for``), and the reduction pass's tile. A split is worth a
# second pass only when the output has too few tiles to occupy half the SMs and each split
# still runs at least MIN_CHUNK of K.
BLOCK_N = 128  # output columns per first-pass tile (the first candidate's)
MIN_K = 2048  # K below this is never split
MIN_CHUNK = 1024  # K elements each split keeps at least
MAX_SPLIT = 16
REDUCE_BLOCK = (32, 128)  # tile of the reduction pass
REDUCE_WARPS = 4


def block_m(m: int) -> int:
    """Rows per split-K tile: the problem's rows rounded up to a power of 2, in [16, 64]."""
    return max(16, min(64, next_power_of_2(m)))


def split_k_for(m: int, n: int, k: int, n_batch: int = 1, sms: int = 132) -> int:
    """How many programs should share each output tile's K range (1: no split-K).

    Splits only when the output has fewer tiles than half the SMs (small M x N) and K is long:
    then doubling the split while the programs still fit in one wave and each keeps at least
    ``MIN_CHUNK`` of K. A batch of matrices already fills the GPU: never split.

    Args:
        m: rows of the output.
        n: columns of the output.
        k: the reduction length.
        n_batch: matrices in the batch.
        sms: streaming multiprocessors of the GPU.
    """
    if n_batch != 1 or k < MIN_K or m == 0 or n == 0:
        return 1
    tiles = cdiv(m, block_m(m)) * cdiv(n, BLOCK_N)
    split = 1
    while split * 2 <= MAX_SPLIT and tiles * split * 2 <= sms and k // (split * 2) >= MIN_CHUNK:
        split *= 2
    return split


@kernel
def splitk_reduce_kernel(
    ws_ptr,  # [SPLIT_K, M, N] partial tiles, contiguous
    c_ptr,  # [M, N] output
    scale_a_ptr,
    scale_b_ptr,
    bias_ptr,
    res_ptr,
    z_ptr,
    M,
    N,
    plane,  # M * N
    stride_cm,
    stride_cn,
    stride_sa,
    stride_sb,
    stride_bias,
    stride_rm,
    stride_rn,
    stride_zm,
    stride_zn,
    SPLIT_K: tl.constexpr,
    INT64: tl.constexpr,
    FLOAT_OUT: tl.constexpr,
    SCALE_A: tl.constexpr,
    SCALE_B: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    HAS_RES: tl.constexpr,
    STORE_Z: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid = tl.program_id(0)
    rm = (pid // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = (pid % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    if INT64:
        rm = rm.to(tl.int64)
        rn = rn.to(tl.int64)
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    offs = rm[:, None] * N + rn[None, :]
    acc = tl.load(ws_ptr + offs, mask=mask, other=0)
    for _ in tl.static_range(1, SPLIT_K):
        ws_ptr += plane  # a pointer step: no 32-bit product of split and plane to overflow
        acc += tl.load(ws_ptr + offs, mask=mask, other=0)
    out = epilogue(
        acc, rm, rn, mask, M, N, scale_a_ptr, scale_b_ptr, bias_ptr, res_ptr, z_ptr, stride_sa,
        stride_sb, stride_bias, stride_rm, stride_rn, stride_zm, stride_zn, FLOAT_OUT, SCALE_A,
        SCALE_B, HAS_BIAS, ACT, HAS_RES, STORE_Z,
    )  # fmt: skip
    c_ptrs = c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, out.to(c_ptr.dtype.element_ty), mask=mask)
