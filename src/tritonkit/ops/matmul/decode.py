"""Decode-shape GEMMs: ``C = A @ B`` with at most 16 rows of A (a few tokens against a weight),
bound by reading B once.

At M <= 16 the product is a matrix-vector product in disguise: its time is the time to stream
the weight (``N * K`` elements) from memory, and the tiled GEMM's 128-wide tiles give too few
programs to keep every SM's loads in flight (16 x 128 tiles over an 8192 x 8192 weight: 64
tiles for 132 SMs). Here each program owns a band of ``BLOCK_N`` output columns (weight rows)
and walks a range of K, loading ``(BLOCK_N, BLOCK_K)`` weight tiles along their contiguous K
axis (16-byte loads, ``num_stages`` deep in shared memory) with the same K columns of every
row of A, and multiplies on the tensor cores, all M rows in one 16-row tile; the accumulator
is fp32 (int32 for INT8 x INT8). Rows of A past M are masked: they load nothing.

Every band reads all of A's rows over its K range (from L2), so narrow bands multiply A's
reads; the band is the narrowest that keeps them at half of B's bytes (16 columns for one
token, wider for 16). Where the bands are fewer than the SMs, K is split and a second pass
(``splitk.py``'s reduction) sums the fp32 partial tiles in a fixed order and applies the
epilogue: no atomics, the same bits on every run.

Operands may differ in dtype: a 16-bit or float32 A against an INT8 weight (weight-only
quantization: the codes widened in registers, exactly), FP8 against FP8 (both widened to
float16, exactly: every product is exact in fp32, so the sum is as accurate as fp32
accumulation makes it, more than the tensor cores' FP8 accumulator), INT8 against INT8 (an
int32 accumulator: exact). Scales per tensor, per row of A and per column of B, the bias, the
activation, the residual and the saved pre-activation are ``_core.gemm.epilogue``'s, as in the
tiled GEMM.

``DecodeGemmConfig`` holds a launch: ``heuristic`` is the untimed default, ``space`` and
``neighbours`` what tuning times on a GPU (``plan.decode_config``); ``plan.DecodeGemmLaunch``
binds the launches.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tritonkit import _tuning
from tritonkit.ops._core.gemm import (
    FP8_DTYPES,
    Problem,
    epilogue,
    tf32_enabled,
)
from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.layout import cdiv, next_power_of_2

MAX_M = 16  # rows of A one program multiplies: one tensor-core tile of 16 rows

# How the operands meet in tl.dot (OPERANDS):
SAME = tl.constexpr(0)  # B widened to A's dtype (16-bit or float32 A; B that dtype or INT8)
F16 = tl.constexpr(1)  # both widened to float16, exactly (FP8: e4m3 and e5m2 fit in fp16)
INT8 = tl.constexpr(2)  # INT8 x INT8 with an int32 accumulator


@triton.jit
def _mac(a, w, acc, OPERANDS: tl.constexpr, INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """acc += a @ w^T for one K block; w is the (BLOCK_N, BLOCK_K) tile of B^T as loaded."""
    if UPCAST:
        acc = tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
    elif OPERANDS == INT8:
        acc = tl.dot(a, tl.trans(w), acc, out_dtype=tl.int32)
    elif OPERANDS == F16:
        acc = tl.dot(a.to(tl.float16), tl.trans(w.to(tl.float16)), acc)
    else:  # INT8 codes are exact in every float dtype (|w| <= 127)
        acc = tl.dot(a, tl.trans(w.to(a.dtype)), acc, input_precision=INPUT_PRECISION)
    return acc


@kernel
def decode_gemm_kernel(
    a_ptr,  # A (M, K), any strides, M <= BLOCK_M
    b_ptr,  # B (K, N), any strides; fastest K-major (B = W^T of an (N, K) row-major weight)
    c_ptr,  # C (M, N) when SPLIT_K == 1, else the (SPLIT_K, M, N) partial tiles, contiguous
    scale_a_ptr,  # fp32 scale(s) of A (SCALE_A)
    scale_b_ptr,  # fp32 scale(s) of B (SCALE_B)
    bias_ptr,  # (N,) bias (HAS_BIAS)
    res_ptr,  # (M, N) residual added after the activation (HAS_RES)
    z_ptr,  # (M, N) pre-activation for linear's backward pass (STORE_Z)
    M,
    N,
    K,
    k_split,  # K elements per split, a multiple of BLOCK_K
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    stride_sa,  # elements between per-row scales of A
    stride_sb,  # elements between per-column scales of B
    stride_bias,
    stride_rm,
    stride_rn,
    stride_zm,
    stride_zn,
    OPERANDS: tl.constexpr,  # SAME, F16 or INT8 (see above)
    INPUT_PRECISION: tl.constexpr,  # float32 operands: "tf32" or "ieee"; else None
    UPCAST: tl.constexpr,  # operands to fp32 first (the interpreter's bf16 tl.dot is wrong)
    EVEN_K: tl.constexpr,  # K is a multiple of BLOCK_K: no mask along K
    SPLIT_K: tl.constexpr,
    FLOAT_OUT: tl.constexpr,
    SCALE_A: tl.constexpr,
    SCALE_B: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    HAS_RES: tl.constexpr,
    STORE_Z: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    # 64-bit column offsets: a vocabulary-sized weight has more than 2**31 elements.
    rn = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = pid_s * k_split
    k_hi = tl.minimum(K, k_lo + k_split)
    rk = k_lo + tl.arange(0, BLOCK_K)
    # Masks, not clamped indices: masked rows of A (M < 16) and columns past N load nothing.
    mask_m = rm < M
    mask_n = rn < N
    a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rn[:, None] * stride_bn + rk[None, :].to(tl.int64) * stride_bk
    step_a = BLOCK_K * stride_ak
    step_b = tl.full((), BLOCK_K, tl.int64) * stride_bk
    if OPERANDS == INT8:
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.int32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=mask_m[:, None], other=0.0)
            w = tl.load(b_ptrs, mask=mask_n[:, None], other=0.0)  # (BLOCK_N, BLOCK_K): K-rows
        else:
            mask_k = (k + tl.arange(0, BLOCK_K)) < k_hi
            a = tl.load(a_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
            w = tl.load(b_ptrs, mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        acc = _mac(a, w, acc, OPERANDS, INPUT_PRECISION, UPCAST)
        a_ptrs += step_a
        b_ptrs += step_b
    mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K == 1:
        out = epilogue(
            acc, rm, rn, mask, M, N, scale_a_ptr, scale_b_ptr, bias_ptr, res_ptr, z_ptr,
            stride_sa, stride_sb, stride_bias, stride_rm, stride_rn, stride_zm, stride_zn,
            FLOAT_OUT, SCALE_A, SCALE_B, HAS_BIAS, ACT, HAS_RES, STORE_Z,
        )  # fmt: skip
        c_ptrs = c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn
        tl.store(c_ptrs, out.to(c_ptr.dtype.element_ty), mask=mask)
    else:
        c_ptrs = c_ptr + pid_s.to(tl.int64) * M * N + rm[:, None] * N + rn[None, :]
        tl.store(c_ptrs, acc, mask=mask)


# ----------------------------------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecodeGemmConfig:
    """One launch of ``decode_gemm_kernel``: the band of output columns per program, the K block,
    the K splits (a second pass sums them) and the pipeline."""

    BLOCK_N: int = 32
    BLOCK_K: int = 128
    SPLIT_K: int = 1
    num_warps: int = 4
    num_stages: int = 4

    # Bytes of one weight row a K block loads: 16-byte loads, 16 per row, whatever the dtype.
    ROW_BYTES = 256
    # Operand bytes per pipeline stage at most: four stages of two programs fit an SM.
    STAGE_BYTES = 24 * 1024
    # Every program reads all M rows of its K range of A (from L2): with bands of BLOCK_N
    # columns, A is read N / BLOCK_N times. The band is at least this many times M * a_bytes /
    # b_bytes wide, so that those reads (L2 hits) stay at half of B's bytes (misses) or less.
    A_READS = 2
    # K blocks each split keeps at least (shorter splits spend more on the reduction).
    MIN_BLOCKS_PER_SPLIT = 4
    MAX_SPLIT = 16

    @classmethod
    def heuristic(
        cls, m: int, n: int, k: int, a_bytes: int, b_bytes: int, sms: int, b_kmajor: bool = True
    ) -> DecodeGemmConfig:
        """The untimed default for an (M <= 16, K) x (K, N) product whose operands have
        ``a_bytes`` and ``b_bytes`` per element: the narrowest band (16 to 128 columns) that
        keeps the reads of A at half of B's bytes (``A_READS``), and for an N-major B
        (``b_kmajor`` False: the row-major b of ``x @ w``) one whose rows are ``ROW_BYTES``
        long, since its loads run along N; K blocks of ``ROW_BYTES`` of B (fewer where a stage
        would exceed ``STAGE_BYTES``: a program's pipeline then keeps 72 KB of loads in
        flight, more than an SM's share of the memory's bandwidth-latency product); K split in
        powers of 2 only while there are fewer programs than SMs (a bandwidth-bound band runs
        as well one or two to an SM; the split costs a second launch) and each split keeps
        ``MIN_BLOCKS_PER_SPLIT`` K blocks; 8 warps for the widest tiles."""
        band = cdiv(cls.A_READS * m * a_bytes, b_bytes)
        if not b_kmajor:
            band = max(band, cls.ROW_BYTES // b_bytes)
        block_n = max(16, min(128, next_power_of_2(band)))
        block_k = max(32, min(cls.ROW_BYTES // b_bytes, next_power_of_2(k)))
        while block_k > 32 and block_k * (MAX_M * a_bytes + block_n * b_bytes) > cls.STAGE_BYTES:
            block_k //= 2
        split = 1
        while (
            cdiv(n, block_n) * split < sms
            and split < cls.MAX_SPLIT
            and k // (2 * split) >= cls.MIN_BLOCKS_PER_SPLIT * block_k
        ):
            split *= 2
        warps = 8 if block_n * block_k >= 128 * 128 else 4
        return cls(block_n, block_k, split, warps)

    @classmethod
    def space(
        cls, m: int, n: int, k: int, a_bytes: int, b_bytes: int, sms: int, b_kmajor: bool = True
    ) -> list[DecodeGemmConfig]:
        """What tuning times first (the heuristic first): the heuristic's K block with bands of
        half, the same and twice its width, each with the split that gives as many programs
        and with none; ``neighbours`` then walks from the best (bands of 16 to 128, K blocks
        of 32 elements to 512 bytes, splits up to ``MAX_SPLIT``, 4 or 8 warps, 3 to 5
        stages)."""
        first = cls.heuristic(m, n, k, a_bytes, b_bytes, sms, b_kmajor)
        grid = [first]
        for block_n in (first.BLOCK_N // 2, first.BLOCK_N, first.BLOCK_N * 2):
            if not 16 <= block_n <= 128:
                continue
            same = max(1, first.SPLIT_K * first.BLOCK_N // block_n)
            for split in (same, 1):
                cand = dataclasses.replace(first, BLOCK_N=block_n, SPLIT_K=split)
                if cand not in grid and cand.fits(k) and split <= cls.MAX_SPLIT:
                    grid.append(cand)
        return grid

    def neighbours(self, k: int, b_bytes: int) -> list[DecodeGemmConfig]:
        """Configs one step away from this one (tuning's hill climb)."""
        out = []
        block_k_max = max(32, min(512 // b_bytes, next_power_of_2(k)))
        steps = {
            "BLOCK_N": (self.BLOCK_N // 2, self.BLOCK_N * 2),
            "BLOCK_K": (self.BLOCK_K // 2, self.BLOCK_K * 2),
            "SPLIT_K": (self.SPLIT_K // 2, self.SPLIT_K * 2),
            "num_warps": (4, 8),
            "num_stages": (self.num_stages - 1, self.num_stages + 1),
        }
        for name, values in steps.items():
            for v in values:
                cand = dataclasses.replace(self, **{name: v})
                ok = (
                    16 <= cand.BLOCK_N <= 128
                    and 32 <= cand.BLOCK_K <= block_k_max
                    and 1 <= cand.SPLIT_K <= self.MAX_SPLIT
                    and 3 <= cand.num_stages <= 5
                )
                if ok and cand != self and cand.fits(k) and cand not in out:
                    out.append(cand)
        return out

    def fits(self, k: int) -> bool:
        """Whether every split keeps at least two K blocks (else splitting only adds work)."""
        return self.SPLIT_K == 1 or k // self.SPLIT_K >= 2 * self.BLOCK_K

    def smem_bytes(self, a_bytes: int, b_bytes: int) -> int:
        """Shared memory of the operand pipeline: A's 16 rows and B's band, per stage."""
        return self.num_stages * self.BLOCK_K * (MAX_M * a_bytes + self.BLOCK_N * b_bytes)

    def tuning(self) -> _tuning.Config:
        params = {"BLOCK_N": self.BLOCK_N, "BLOCK_K": self.BLOCK_K, "SPLIT_K": self.SPLIT_K}
        return _tuning.Config(params, self.num_warps, self.num_stages)

    @classmethod
    def from_tuning(cls, c: _tuning.Config) -> DecodeGemmConfig:
        p = c.params
        return cls(p["BLOCK_N"], p["BLOCK_K"], p["SPLIT_K"], c.num_warps, c.num_stages)


def operands_mode(a_dtype: torch.dtype, b_dtype: torch.dtype) -> int | None:
    """How ``decode_gemm_kernel`` multiplies A and B of these dtypes (SAME, F16, INT8), or None for
    a pair it does not take."""
    floats = (torch.float32, torch.float16, torch.bfloat16)
    if a_dtype in floats and (b_dtype == a_dtype or b_dtype == torch.int8):
        return SAME.value
    if a_dtype in FP8_DTYPES and b_dtype in FP8_DTYPES:
        return F16.value
    if a_dtype == torch.int8 and b_dtype == torch.int8:
        return INT8.value
    return None


def decode_ok(p: Problem, max_m: int = MAX_M) -> bool:
    """Whether ``p`` takes the decode kernel: one matrix of at most ``max_m`` (<= 16) rows,
    operand dtypes it takes, something to compute."""
    a, b = p.a.tensor, p.b.tensor
    return (
        p.n_batch == 1
        and 0 < p.m <= min(max_m, MAX_M)
        and p.n > 0
        and p.k > 0
        and operands_mode(a.dtype, b.dtype) is not None
    )


def input_precision(a_dtype: torch.dtype, b_dtype: torch.dtype) -> str | None:
    """tl.dot's precision for float32 A: a float32 product follows PyTorch's TF32 setting; a
    weight-only INT8 one multiplies exactly, as the product with the widened weight in
    float32 would. None for other dtypes."""
    if a_dtype != torch.float32:
        return None
    return "tf32" if b_dtype == torch.float32 and tf32_enabled() else "ieee"
