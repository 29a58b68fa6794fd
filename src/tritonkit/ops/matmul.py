"""Matmul family: matmul, linear with a fused epilogue, FP8 scaled and INT8 GEMMs.

One tile-loop kernel (``_matmul_kernel``) computes every GEMM of the family. Its constexprs
select how the loop runs, and the named variants are points in that space, not copies:

==============  ===================================================================
``naive``       v0: CUDA-core FMAs on 32 x 32 tiles (no tensor cores), no pipelining
``tiled``       v1: tensor-core tiles (``tl.dot``), 128 x 128 x 64, no pipelining
``pipelined``   v2: the same tiles with ``num_stages`` > 1 (loads overlap the math)
``autotuned``   v3: a tuned tile / warps / stages, and grouped tile order for L2 reuse
``persistent``  v4: one program per SM walking the tiles; on Hopper the operands come
                through TMA tensor descriptors (``TensorDescriptor``); elsewhere, or
                when strides are not 16-byte aligned, the same loop with pointer loads
==============  ===================================================================

The default path (what ``matmul`` and ``linear`` run) is the persistent one, except for
skinny problems (few output tiles, long K) where K is split across programs and a second,
deterministic pass sums the partial tiles and applies the epilogue (``split_k_for``).

The epilogue is shared by all paths: per-tensor or per-row/column scales (FP8, INT8),
bias, activation (``tritonkit.ops.elementwise._act``), residual add, and, for ``linear``'s
backward pass, the pre-activation ``Z = x @ W^T + b`` rounded once to the output dtype (not
the pre-bias product: adding the bias to a rounded product again in the backward can flip the
sign of a small Z whose product and bias cancel, and relu's gradient with it). The backward
pass then computes ``dZ = dY * act'(Z)`` and the bias gradient in one read of ``dY`` and
``Z`` (the elementwise family's ``bias_act_backward`` kernel), because both weight and input
gradients consume ``dZ``: fusing ``act'`` into their GEMMs would compute it twice and take the
operand off the TMA path.

Every operand is read through its real strides: transposed and sliced views need no copy
(only batch dimensions that cannot be expressed with two strides are copied, and counted in
``_utils.LAYOUT_COPIES``). The exception is by choice: on Hopper, large FP8 and INT8 GEMMs
whose operands are not K-major (wgmma reads 8-bit operands K-major only) first transpose them
into a per-call K-major scratch buffer, also counted (``kmajor_copies``); and large IEEE fp32
GEMMs (CUDA cores) whose B is K-major, as ``F.linear``'s weight is, first copy B row-major
(``fma_copies_b``). Accumulation is fp32 (int32 for INT8); outputs are rounded once.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tritonkit import _tuning
from tritonkit._autocast import LOWER, autocast_dtype, cast, policy
from tritonkit.ops._core.device import interpreter_enabled, sm_count
from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.layout import LAYOUT_COPIES, cdiv, next_power_of_2
from tritonkit.ops._core.math import ACTIVATIONS, act
from tritonkit.ops._core.registry import apply, define_op, eager_direct
from tritonkit.ops._core.validate import (
    FLOAT_DTYPES,
    check_choice,
    check_operand,
    check_same_device,
    check_tensor,
)
from tritonkit.ops.elementwise import call_bias_act_backward
from tritonkit.ops.memory import transpose_fwd

try:  # host-side TMA descriptors (triton >= 3.3)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton: the pointer path serves everything
    TensorDescriptor = None

FP8_DTYPES: tuple[torch.dtype, ...] = (torch.float8_e4m3fn, torch.float8_e5m2)

# Scale layouts of the epilogue (constexpr codes).
_SCALE_NONE = 0
_SCALE_TENSOR = 1  # one value for the whole operand
_SCALE_VECTOR = 2  # one value per row of A / per column of B


# ----------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------


@triton.jit
def _tile_coords(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of output tile ``tile``.

    GROUP_M > 1 walks GROUP_M row blocks down one column band before moving right, so that
    tiles running at the same time share B's columns (and A's rows) in L2. GROUP_M = 1 is the
    plain row-major order.
    """
    in_group = GROUP_M * tiles_n
    first_m = (tile // in_group) * GROUP_M
    group_m = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (tile % in_group) % group_m
    pid_n = (tile % in_group) // group_m
    return pid_m, pid_n


@triton.jit
def _mac(a, b, acc, DOT: tl.constexpr, INPUT_PRECISION: tl.constexpr, MAX_IMPRECISE: tl.constexpr):
    """acc += a @ b for one K block."""
    if DOT:
        acc = tl.dot(
            a,
            b,
            acc,
            input_precision=INPUT_PRECISION,
            max_num_imprecise_acc=MAX_IMPRECISE,
            out_dtype=acc.dtype,
        )
    else:
        # v0: a broadcast multiply and a reduction over K on the CUDA cores, no tensor cores.
        # The product is an fma with 0, not a multiply: Triton's combine pass rewrites
        # sum(a[:, :, None] * b[None, :, :], 1) into tl.dot (tensor cores, tf32 for fp32
        # operands: 1e-2 errors where PyTorch computes in full fp32; seen on an H200).
        prod = tl.fma(a.to(tl.float32)[:, :, None], b.to(tl.float32)[None, :, :], 0.0)
        acc += tl.sum(prod, axis=1)
    return acc


@triton.jit
def _mac_step(
    a, b, acc, part, kb, DOT: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    MAX_IMPRECISE: tl.constexpr, PROMOTE_BLOCKS: tl.constexpr,
):  # fmt: skip
    """K block ``kb`` (counted from the loop's first) into the accumulator: ``acc += a @ b``;
    or, with PROMOTE_BLOCKS > 1, into the tensor cores' partial sum ``part``, which is added to
    the fp32 ``acc`` (on the CUDA cores) and restarted after every PROMOTE_BLOCKS blocks."""
    if PROMOTE_BLOCKS > 1:
        part = _mac(a, b, part, DOT, INPUT_PRECISION, None)
        if kb % PROMOTE_BLOCKS == PROMOTE_BLOCKS - 1:
            acc += part
            part = tl.zeros_like(part)
    else:
        acc = _mac(a, b, acc, DOT, INPUT_PRECISION, MAX_IMPRECISE)
    return acc, part


@triton.jit
def _mainloop_ptr(
    a_ptr,  # A of this batch entry: element (m, k) at a_ptr + m * stride_am + k * stride_ak
    b_ptr,  # B of this batch entry: element (k, n) at b_ptr + k * stride_bk + n * stride_bn
    off_m,  # first row of the tile
    off_n,  # first column of the tile
    k_lo,  # first K index of this program's range (a multiple of BLOCK_K)
    k_hi,  # one past the last K index of the range
    M,
    N,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    acc,  # accumulator tile [BLOCK_M, BLOCK_N], fp32 or int32
    part,  # the tensor cores' partial sum, when PROMOTE_BLOCKS > 1 (see _mac_step)
    DOT: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    MAX_IMPRECISE: tl.constexpr,
    PROMOTE_BLOCKS: tl.constexpr,
    EVEN_K: tl.constexpr,  # K is a multiple of BLOCK_K: no mask along K
    INT64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rm = off_m + tl.arange(0, BLOCK_M)
    rn = off_n + tl.arange(0, BLOCK_N)
    rk = k_lo + tl.arange(0, BLOCK_K)
    if INT64:
        rm = rm.to(tl.int64)
        rn = rn.to(tl.int64)
        rk = rk.to(tl.int64)
        step_a = tl.full((), BLOCK_K, tl.int64) * stride_ak
        step_b = tl.full((), BLOCK_K, tl.int64) * stride_bk
    else:
        step_a = BLOCK_K * stride_ak
        step_b = BLOCK_K * stride_bk
    # Masks rather than clamped indices along M and N: with an M-major A (or N-major B) the
    # clamp would break the contiguity the loads are vectorized along.
    mask_m = rm < M
    mask_n = rn < N
    a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    for k in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=mask_m[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=mask_n[None, :], other=0.0)
        else:
            mask_k = (k + tl.arange(0, BLOCK_K)) < k_hi
            a = tl.load(a_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc, part = _mac_step(
            a, b, acc, part, (k - k_lo) // BLOCK_K, DOT, INPUT_PRECISION, MAX_IMPRECISE,
            PROMOTE_BLOCKS,
        )  # fmt: skip
        a_ptrs += step_a
        b_ptrs += step_b
    return acc, part


@triton.jit
def _mainloop_tma(
    a_desc,  # descriptor of A [M, K], or of A^T [K, M] when A_T
    b_desc,  # descriptor of B [K, N], or of B^T [N, K] when B_T
    off_m,
    off_n,
    k_lo,
    k_hi,
    acc,
    part,  # the tensor cores' partial sum, when PROMOTE_BLOCKS > 1 (see _mac_step)
    A_T: tl.constexpr,  # A is stored M-major (unit stride along M)
    B_T: tl.constexpr,  # B is stored K-major (unit stride along K), like nn.Linear's weight
    DOT: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    MAX_IMPRECISE: tl.constexpr,
    PROMOTE_BLOCKS: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # TMA copies whole blocks into shared memory and zero-fills what lies outside the tensor,
    # so no masks; the transposes are views of the shared-memory tile that wgmma reads.
    for k in range(k_lo, k_hi, BLOCK_K):
        if A_T:
            a = a_desc.load([k, off_m]).T
        else:
            a = a_desc.load([off_m, k])
        if B_T:
            b = b_desc.load([off_n, k]).T
        else:
            b = b_desc.load([k, off_n])
        acc, part = _mac_step(
            a, b, acc, part, (k - k_lo) // BLOCK_K, DOT, INPUT_PRECISION, MAX_IMPRECISE,
            PROMOTE_BLOCKS,
        )  # fmt: skip
    return acc, part


@triton.jit
def _epilogue(
    acc,  # accumulator tile, fp32 or int32
    rm,  # row indices of the tile
    rn,  # column indices of the tile
    mask,  # rows < M and columns < N
    M,
    N,
    scale_a_ptr,  # fp32 scale(s) of A
    scale_b_ptr,  # fp32 scale(s) of B
    bias_ptr,  # [N] bias
    res_ptr,  # [M, N] residual
    z_ptr,  # [M, N] output for the pre-activation (after the bias)
    stride_sa,  # elements between per-row scales of A
    stride_sb,  # elements between per-column scales of B
    stride_bias,
    stride_rm,
    stride_rn,
    stride_zm,
    stride_zn,
    FLOAT_OUT: tl.constexpr,  # compute the epilogue in fp32 (an int32 accumulator is converted)
    SCALE_A: tl.constexpr,  # _SCALE_NONE / _SCALE_TENSOR / _SCALE_VECTOR (per row)
    SCALE_B: tl.constexpr,  # _SCALE_NONE / _SCALE_TENSOR / _SCALE_VECTOR (per column)
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    HAS_RES: tl.constexpr,
    STORE_Z: tl.constexpr,
):
    """((acc * scale_a * scale_b) + bias [-> z]) -> act -> + residual, in fp32."""
    if FLOAT_OUT:
        acc = acc.to(tl.float32)
    if SCALE_A == 1:
        acc = acc * tl.load(scale_a_ptr)
    elif SCALE_A == 2:
        acc = acc * tl.load(scale_a_ptr + rm * stride_sa, mask=rm < M, other=0.0)[:, None]
    if SCALE_B == 1:
        acc = acc * tl.load(scale_b_ptr)
    elif SCALE_B == 2:
        acc = acc * tl.load(scale_b_ptr + rn * stride_sb, mask=rn < N, other=0.0)[None, :]
    if HAS_BIAS:
        bias = tl.load(bias_ptr + rn * stride_bias, mask=rn < N, other=0.0)
        acc = acc + bias.to(tl.float32)[None, :]
    if STORE_Z:
        z_ptrs = z_ptr + rm[:, None] * stride_zm + rn[None, :] * stride_zn
        tl.store(z_ptrs, acc.to(z_ptr.dtype.element_ty), mask=mask)
    acc = act(acc, ACT)
    if HAS_RES:
        res = tl.load(res_ptr + rm[:, None] * stride_rm + rn[None, :] * stride_rn, mask=mask)
        acc = acc + res.to(tl.float32)
    return acc


@triton.jit
def _matmul_tile(
    t,  # work item: (batch entry, K split, output tile) flattened
    a_ptr,
    b_ptr,
    c_ptr,
    ws_ptr,
    a_desc,
    b_desc,
    c_desc,
    scale_a_ptr,
    scale_b_ptr,
    bias_ptr,
    res_ptr,
    z_ptr,
    M,
    N,
    K,
    k_split,
    plane,
    batch_inner,
    stride_ab0,
    stride_ab1,
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
    stride_sa,
    stride_sb,
    stride_bias,
    stride_rm,
    stride_rn,
    stride_zm,
    stride_zn,
    USE_TMA: tl.constexpr,
    A_T: tl.constexpr,
    B_T: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr,
    SPLIT_K: tl.constexpr,
    DOT: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    MAX_IMPRECISE: tl.constexpr,
    PROMOTE_BLOCKS: tl.constexpr,
    ACC_INT: tl.constexpr,
    EVEN_K: tl.constexpr,
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
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """One output tile (or one K split of it): main loop, then epilogue or partial store.

    The arguments are ``_matmul_kernel``'s, plus ``t``; see there for what each one is.
    """
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles = tiles_m * tiles_n
    batch = t // (tiles * SPLIT_K)
    r = t % (tiles * SPLIT_K)
    split = r // tiles
    pid_m, pid_n = _tile_coords(r % tiles, tiles_m, tiles_n, GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    k_lo = split * k_split
    k_hi = tl.minimum(K, k_lo + k_split)
    # Two batch dimensions (outer, inner), each with its own stride per operand: broadcast
    # batch dimensions have stride 0, and no batched operand needs a copy to a common layout.
    b0 = (batch // batch_inner).to(tl.int64)
    b1 = (batch % batch_inner).to(tl.int64)
    if ACC_INT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    part = tl.zeros_like(acc)  # see _mac_step (unused unless PROMOTE_BLOCKS > 1)
    if USE_TMA:
        acc, part = _mainloop_tma(
            a_desc,
            b_desc,
            off_m,
            off_n,
            k_lo,
            k_hi,
            acc,
            part,
            A_T,
            B_T,
            DOT,
            INPUT_PRECISION,
            MAX_IMPRECISE,
            PROMOTE_BLOCKS,
            BLOCK_K,
        )
    else:
        acc, part = _mainloop_ptr(
            a_ptr + b0 * stride_ab0 + b1 * stride_ab1,
            b_ptr + b0 * stride_bb0 + b1 * stride_bb1,
            off_m,
            off_n,
            k_lo,
            k_hi,
            M,
            N,
            stride_am,
            stride_ak,
            stride_bk,
            stride_bn,
            acc,
            part,
            DOT,
            INPUT_PRECISION,
            MAX_IMPRECISE,
            PROMOTE_BLOCKS,
            EVEN_K,
            INT64,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
        )
    if PROMOTE_BLOCKS > 1:
        acc += part  # the blocks after the last promotion
    rm = off_m + tl.arange(0, BLOCK_M)
    rn = off_n + tl.arange(0, BLOCK_N)
    if INT64:
        rm = rm.to(tl.int64)
        rn = rn.to(tl.int64)
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    if SPLIT_K > 1:
        # This K range's partial tile; _splitk_reduce_kernel sums the splits in a fixed order
        # (deterministic, unlike atomics) and applies the epilogue once.
        if INT64:
            ws = ws_ptr + split.to(tl.int64) * plane
        else:
            ws = ws_ptr + split * plane
        tl.store(ws + rm[:, None] * N + rn[None, :], acc, mask=mask)
    else:
        out = _epilogue(
            acc,
            rm,
            rn,
            mask,
            M,
            N,
            scale_a_ptr,
            scale_b_ptr,
            bias_ptr,
            res_ptr,
            z_ptr,
            stride_sa,
            stride_sb,
            stride_bias,
            stride_rm,
            stride_rn,
            stride_zm,
            stride_zn,
            FLOAT_OUT,
            SCALE_A,
            SCALE_B,
            HAS_BIAS,
            ACT,
            HAS_RES,
            STORE_Z,
        )
        out_ty = c_ptr.dtype.element_ty
        if USE_TMA:
            if EPILOGUE_SUBTILE:
                # Two half-width stores: half the shared-memory staging tile, which leaves room
                # for one more pipeline stage.
                halves = tl.permute(tl.reshape(out, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
                c0, c1 = tl.split(halves)
                c_desc.store([off_m, off_n], c0.to(out_ty))
                c_desc.store([off_m, off_n + BLOCK_N // 2], c1.to(out_ty))
            else:
                c_desc.store([off_m, off_n], out.to(out_ty))
        else:
            c_ptrs = c_ptr + b0 * stride_cb0 + b1 * stride_cb1
            c_ptrs += rm[:, None] * stride_cm + rn[None, :] * stride_cn
            tl.store(c_ptrs, out.to(out_ty), mask=mask)


@kernel
def _matmul_kernel(
    a_ptr,  # A [batch..., M, K], any strides
    b_ptr,  # B [batch..., K, N], any strides
    c_ptr,  # C [batch..., M, N] (written when SPLIT_K == 1)
    ws_ptr,  # [SPLIT_K, M, N] fp32/int32 partial tiles (when SPLIT_K > 1)
    a_desc,  # TMA descriptor of A or A^T (USE_TMA), else None
    b_desc,  # TMA descriptor of B or B^T (USE_TMA), else None
    c_desc,  # TMA descriptor of C (USE_TMA), else None
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
    PERSISTENT: tl.constexpr,  # NUM_SMS programs loop over the work items
    NUM_SMS: tl.constexpr,  # programs of a persistent launch
    FLATTEN: tl.constexpr,  # let the compiler pipeline across the tile loop and the K loop
    WARP_SPECIALIZE: tl.constexpr,  # producer/consumer warp groups (persistent loop only)
    USE_TMA: tl.constexpr,  # operands through TMA descriptors (Hopper), else pointer loads
    A_T: tl.constexpr,  # A is M-major: its descriptor is over A^T
    B_T: tl.constexpr,  # B is K-major: its descriptor is over B^T
    EPILOGUE_SUBTILE: tl.constexpr,  # store C in two half tiles (TMA only)
    SPLIT_K: tl.constexpr,  # programs sharing one output tile's K range
    DOT: tl.constexpr,  # tensor cores (tl.dot); False: the v0 CUDA-core loop
    INPUT_PRECISION: tl.constexpr,  # fp32 operands: "tf32" or "ieee"; else None
    MAX_IMPRECISE: tl.constexpr,  # fp8: K elements per partial sum before fp32 promotion
    PROMOTE_BLOCKS: tl.constexpr,  # fp8: or K blocks per partial sum, promoted by hand (> 1)
    ACC_INT: tl.constexpr,  # int32 accumulator (int8 operands)
    EVEN_K: tl.constexpr,
    INT64: tl.constexpr,  # 64-bit offsets: some operand spans 2**31 elements or more
    FLOAT_OUT: tl.constexpr,
    SCALE_A: tl.constexpr,
    SCALE_B: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,  # activation code (elementwise.ACTIVATIONS)
    HAS_RES: tl.constexpr,
    STORE_Z: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,  # row blocks per group of the tile order (1: row-major order)
):
    total = n_batch * tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N) * SPLIT_K
    if PERSISTENT:
        for t in tl.range(
            tl.program_id(0), total, NUM_SMS, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE
        ):
            _matmul_tile(
                t, a_ptr, b_ptr, c_ptr, ws_ptr, a_desc, b_desc, c_desc, scale_a_ptr,
                scale_b_ptr, bias_ptr, res_ptr, z_ptr, M, N, K, k_split, plane, batch_inner,
                stride_ab0, stride_ab1, stride_am, stride_ak, stride_bb0, stride_bb1,
                stride_bk, stride_bn, stride_cb0, stride_cb1, stride_cm, stride_cn,
                stride_sa, stride_sb, stride_bias, stride_rm, stride_rn, stride_zm, stride_zn,
                USE_TMA, A_T, B_T, EPILOGUE_SUBTILE, SPLIT_K, DOT, INPUT_PRECISION,
                MAX_IMPRECISE, PROMOTE_BLOCKS, ACC_INT, EVEN_K, INT64, FLOAT_OUT, SCALE_A,
                SCALE_B, HAS_BIAS, ACT, HAS_RES, STORE_Z, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
            )  # fmt: skip
    else:
        _matmul_tile(
            tl.program_id(0), a_ptr, b_ptr, c_ptr, ws_ptr, a_desc, b_desc, c_desc, scale_a_ptr,
            scale_b_ptr, bias_ptr, res_ptr, z_ptr, M, N, K, k_split, plane, batch_inner,
            stride_ab0, stride_ab1, stride_am, stride_ak, stride_bb0, stride_bb1,
            stride_bk, stride_bn, stride_cb0, stride_cb1, stride_cm, stride_cn,
            stride_sa, stride_sb, stride_bias, stride_rm, stride_rn, stride_zm, stride_zn,
            USE_TMA, A_T, B_T, EPILOGUE_SUBTILE, SPLIT_K, DOT, INPUT_PRECISION,
            MAX_IMPRECISE, PROMOTE_BLOCKS, ACC_INT, EVEN_K, INT64, FLOAT_OUT, SCALE_A, SCALE_B,
            HAS_BIAS, ACT, HAS_RES, STORE_Z, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
        )  # fmt: skip


@kernel
def _splitk_reduce_kernel(
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
    out = _epilogue(
        acc,
        rm,
        rn,
        mask,
        M,
        N,
        scale_a_ptr,
        scale_b_ptr,
        bias_ptr,
        res_ptr,
        z_ptr,
        stride_sa,
        stride_sb,
        stride_bias,
        stride_rm,
        stride_rn,
        stride_zm,
        stride_zn,
        FLOAT_OUT,
        SCALE_A,
        SCALE_B,
        HAS_BIAS,
        ACT,
        HAS_RES,
        STORE_Z,
    )
    c_ptrs = c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, out.to(c_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------------------
# Configs: every tile, schedule and candidate list of the family is chosen here.
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MatmulConfig:
    """One way to run ``_matmul_kernel``: the tile, its order and pipeline, and the schedule.

    ``tma`` and ``subtile`` are requests: a launch whose operands TMA cannot read (strides not
    16-byte aligned, a batch, no Hopper GPU) runs the same loop with pointer loads.
    """

    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    GROUP_M: int = 1
    num_warps: int = 4
    num_stages: int = 3
    SPLIT_K: int = 1
    persistent: bool = False
    tma: bool = False
    subtile: bool = False
    warp_specialize: bool = False
    dot: bool = True
    promote_k: int = 0  # FP8: K elements per fp32 promotion (_max_imprecise); 0: BLOCK_K

    def tuning(self) -> _tuning.Config:
        """As a ``_tuning.Config`` (JSON-friendly ints) for the autotune cache."""
        params = {
            f.name: int(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if f.name not in ("num_warps", "num_stages")
        }
        return _tuning.Config(params, self.num_warps, self.num_stages)

    @staticmethod
    def from_tuning(cfg: _tuning.Config) -> MatmulConfig:
        kinds = {f.name: f.type for f in dataclasses.fields(MatmulConfig)}
        params = {
            k: (bool(v) if kinds[k] in (bool, "bool") else int(v)) for k, v in cfg.params.items()
        }
        return MatmulConfig(**params, num_warps=cfg.num_warps, num_stages=cfg.num_stages)

    def smem_bytes(self, elem_a: int, elem_b: int, elem_out: int) -> int:
        """Shared memory of the operand pipeline plus the output staging tile."""
        stages = max(1, self.num_stages)
        operands = stages * (
            self.BLOCK_M * self.BLOCK_K * elem_a + self.BLOCK_K * self.BLOCK_N * elem_b
        )
        staging = self.BLOCK_M * self.BLOCK_N * elem_out // (2 if self.subtile else 1)
        return operands + staging


# FP8 on Hopper: wgmma adds products into its accumulator keeping only ~14 bits of the partial
# sum, so a long K must be summed in pieces whose partial sums are promoted into an fp32
# accumulator (on the CUDA cores). ``promote_k`` is the piece, in K elements:
# - PROMOTE_PER_BLOCK (0): BLOCK_K, through tl.dot's ``max_num_imprecise_acc``, which waits for
#   the tensor cores and adds once per K block (and per 64-row wgmma);
# - a positive value <= BLOCK_K: the same, more often;
# - a multiple of BLOCK_K above it: by hand (_mac_step), a second accumulator tile that the
#   tensor cores sum into and the loop adds to the first every promote_k / BLOCK_K blocks, so
#   the tensor cores wait that much less often. Two fp32 tiles per thread: 128 x 128 at 8 warps
#   fits (155 registers, ptxas sm_90a); 128 x 256 or 256 x 128 spill;
# - NEVER_PROMOTE (-1): never (Triton's own sm_90 default: fast accumulation).
# H200, 8192^3 e4m3, bf16 out, one interleaved group (benchmarks/NOTES.md, run 23), against
# torch._scaled_mm (relative L2 error 1.66e-3 vs float64): per block 0.813x at 1.00x its error;
# by hand every 1024 / 2048 / 4096: 0.911x / 0.935x / 0.948x at 1.05x / 1.12x / 1.28x the
# error; never 1.03x at 1.58x. The fp8 candidates (_TILES) start with 2048.
PROMOTE_PER_BLOCK = 0
NEVER_PROMOTE = -1


def _promotion(cfg: MatmulConfig) -> tuple[int | None, int]:
    """(tl.dot's ``max_num_imprecise_acc``, K blocks per promotion by hand) of an FP8 launch."""
    p, bk = cfg.promote_k, cfg.BLOCK_K
    if p == PROMOTE_PER_BLOCK:
        return bk, 1
    if p == NEVER_PROMOTE:
        return None, 1
    if 0 < p <= bk:
        return p, 1
    if p > bk and p % bk == 0:
        return None, p // bk
    raise ValueError(
        f"MatmulConfig.promote_k must be {PROMOTE_PER_BLOCK}, {NEVER_PROMOTE}, in [1, BLOCK_K = "
        f"{bk}] or a multiple of BLOCK_K, got {p}"
    )


def _cfg(bm: int, bn: int, bk: int, warps: int, stages: int, **kw) -> MatmulConfig:
    return MatmulConfig(bm, bn, bk, num_warps=warps, num_stages=stages, **kw)


# The evolution's fixed steps (16-bit operands). Each is the previous one plus one idea.
NAIVE = _cfg(32, 32, 8, 4, 1, dot=False)
TILED = _cfg(128, 128, 64, 4, 1)
PIPELINED = _cfg(128, 128, 64, 4, 3)
VARIANTS: tuple[str, ...] = ("naive", "tiled", "pipelined", "autotuned", "persistent")
_FIXED = {"naive": NAIVE, "tiled": TILED, "pipelined": PIPELINED}


def _fixed_config(name: str, elem: int) -> MatmulConfig:
    """A fixed step of the evolution for ``elem``-byte operands: the same 128-byte K rows
    (BLOCK_K 32 for fp32, 128 for 8-bit), so that its shared memory fits any GPU."""
    cfg = _FIXED[name]
    if not cfg.dot:
        return cfg
    return dataclasses.replace(cfg, BLOCK_K=cfg.BLOCK_K * 2 // elem)


# Tiles per operand class, best first (the first is the heuristic default, used untimed under
# the interpreter). Few on purpose: first-time tuning of one shape compiles each candidate.
# Hopper: 128 x 256 x 64 with 8 warps (two warp groups, each a 64 x 256 wgmma) is the usual
# best for 16-bit operands; 8-bit operands want BLOCK_K = 128 (128-byte rows for TMA).
_TILES_8BIT = (
    _cfg(128, 256, 128, 8, 3),
    _cfg(128, 128, 128, 8, 4),
    _cfg(256, 128, 128, 8, 3),
    _cfg(128, 128, 128, 4, 3),  # fits 163 KB (A100) even with an int32 output tile
)
_TILES: dict[str, tuple[MatmulConfig, ...]] = {
    "16bit": (
        _cfg(128, 256, 64, 8, 3),
        _cfg(128, 128, 64, 8, 4),
        _cfg(256, 128, 64, 8, 3),
        _cfg(128, 128, 64, 4, 4),
    ),
    "8bit": _TILES_8BIT,
    # FP8: the hand promotion's tile first (see PROMOTE_PER_BLOCK), then INT8's tiles, which
    # promote once per K block.
    "fp8": (_cfg(128, 128, 128, 8, 4, promote_k=2048), *_TILES_8BIT),
    "tf32": (
        _cfg(128, 128, 32, 8, 3),
        _cfg(128, 256, 32, 8, 3),
        _cfg(128, 64, 32, 4, 4),
        _cfg(64, 128, 32, 4, 4),
    ),
    # IEEE fp32 ("highest" precision in PyTorch) runs on the CUDA cores: FMA, no tensor cores.
    # H200 (benchmarks/NOTES.md, run 152), 4096^3, one launch each, TFLOP/s, row-major B / A
    # M-major: 64 x 64 x 16 at 4 warps 44.2 / 44.1, 64 x 128 x 16 37.3 / 47.9, 128 x 64 x 16
    # 39.1 / 47.5, 64 x 64 x 32 42.8 / 45.8 (the old candidates, tuned: 38.9 / 41.4; cuBLAS
    # SGEMM 51.0 / 51.8).
    "ieee": (
        _cfg(64, 64, 16, 4, 4),
        _cfg(64, 128, 16, 4, 4),
        _cfg(128, 64, 16, 4, 4),
        _cfg(64, 64, 32, 4, 3),
        _cfg(128, 128, 16, 8, 3),
    ),
}
# Only where TMA stores the output: a half-tile epilogue buys a 4th stage, and producer /
# consumer warp groups (flatten must then be off on Hopper).
_TMA_EXTRAS_8BIT = (_cfg(128, 256, 128, 8, 4, subtile=True),)
_TMA_EXTRAS: dict[str, tuple[MatmulConfig, ...]] = {
    "16bit": (
        _cfg(128, 256, 64, 8, 4, subtile=True),
        _cfg(128, 256, 64, 8, 3, warp_specialize=True),
    ),
    "8bit": _TMA_EXTRAS_8BIT,
    "fp8": _TMA_EXTRAS_8BIT,
}
_GROUP_M = 8  # row blocks per group of the grouped tile order (L2 reuse of B's columns)

# Split-K (skinny problems): a split is worth a second pass only when the output has too few
# tiles to occupy half the SMs and each split still runs at least _SPLITK_MIN_CHUNK of K.
_SPLITK_BLOCK_N = 128
_SPLITK_MIN_K = 2048
_SPLITK_MIN_CHUNK = 1024
_SPLITK_MAX = 16
_REDUCE_BLOCK = (32, 128)  # tile of the split-K reduction pass

_INT32_LIMIT = 2**31


def _splitk_block_m(m: int) -> int:
    """Rows per split-K tile: the problem's rows rounded up to a power of 2, within [16, 64]."""
    return max(16, min(64, next_power_of_2(m)))


def split_k_for(m: int, n: int, k: int, n_batch: int = 1, sms: int = 132) -> int:
    """How many programs should share each output tile's K range (1: no split-K).

    Splits only when the output has fewer tiles than half the SMs (small M x N) and K is long:
    then doubling the split while the programs still fit in one wave and each keeps at least
    ``_SPLITK_MIN_CHUNK`` of K. A batch of matrices already fills the GPU: never split.

    Args:
        m: rows of the output.
        n: columns of the output.
        k: the reduction length.
        n_batch: matrices in the batch.
        sms: streaming multiprocessors of the GPU.
    """
    if n_batch != 1 or k < _SPLITK_MIN_K or m == 0 or n == 0:
        return 1
    tiles = cdiv(m, _splitk_block_m(m)) * cdiv(n, _SPLITK_BLOCK_N)
    split = 1
    while (
        split * 2 <= _SPLITK_MAX
        and tiles * split * 2 <= sms
        and k // (split * 2) >= _SPLITK_MIN_CHUNK
    ):
        split *= 2
    return split


def _operand_class(dtype: torch.dtype) -> str:
    if dtype == torch.float32:
        return "tf32" if _tf32_enabled() else "ieee"
    if dtype in FP8_DTYPES:
        return "fp8"
    if dtype.itemsize == 1:
        return "8bit"
    return "16bit"


def _candidates(kind: str, cls: str, tma: bool, m: int, split: int) -> list[MatmulConfig]:
    """The configs tuning times for one problem class; the first is the untimed default."""
    if kind == "splitk":
        bm = _splitk_block_m(m)
        bk = 32 if cls in ("tf32", "ieee") else (128 if cls in ("8bit", "fp8") else 64)
        return [
            _cfg(bm, _SPLITK_BLOCK_N, bk, 4, 4, SPLIT_K=split),
            _cfg(bm, 64, bk, 4, 4, SPLIT_K=split),
            _cfg(bm, _SPLITK_BLOCK_N, 2 * bk, 4, 3, SPLIT_K=split),
        ]
    tiles = [dataclasses.replace(c, GROUP_M=_GROUP_M) for c in _TILES[cls]]
    if kind == "autotuned" or cls == "ieee":
        # The CUDA-core loop ran slower persistent (H200, run 153: 4096^3 with B row-major
        # 39.6 TFLOP/s tuned over the persistent tiles; run 152: 44.2 one tile per program).
        return tiles
    out = [dataclasses.replace(c, persistent=True, tma=tma) for c in tiles]
    if tma:
        extras = _TMA_EXTRAS.get(cls, ())
        out[1:1] = [
            dataclasses.replace(c, GROUP_M=_GROUP_M, persistent=True, tma=True) for c in extras
        ]
    return out


# ----------------------------------------------------------------------------------------------
# Problems: a GEMM as pointers, extents and strides
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Operand:
    """A matrix (or batch of them) as its base tensor and (outer, inner, row, col) strides."""

    tensor: torch.Tensor
    strides: tuple[int, int, int, int]


@dataclass(frozen=True)
class _Problem:
    """C[b] = A[b] @ B[b] for a batch of ``batch[0] * batch[1]`` matrices."""

    a: _Operand
    b: _Operand
    c: _Operand
    m: int
    n: int
    k: int
    batch: tuple[int, int] = (1, 1)

    @property
    def n_batch(self) -> int:
        return self.batch[0] * self.batch[1]


@dataclass(frozen=True)
class _Epilogue:
    """What the kernel applies to the accumulator before storing it (see ``_epilogue``)."""

    scale_a: torch.Tensor | None = None
    scale_a_rows: bool = False  # one scale per row (else one for the whole tensor)
    scale_b: torch.Tensor | None = None
    scale_b_cols: bool = False
    bias: torch.Tensor | None = None
    activation: str = "none"
    residual: torch.Tensor | None = None  # [M, N]
    z: torch.Tensor | None = None  # [M, N] output of the pre-activation x @ W^T + b


_NO_EPILOGUE = _Epilogue()


def _matrix(t: torch.Tensor) -> _Operand:
    """A 2-D tensor as a one-matrix operand."""
    return _Operand(t, (0, 0, t.stride(0), t.stride(1)))


def _coalesce_batch(
    sizes: Sequence[int], strides: Sequence[Sequence[int]]
) -> list[tuple[int, list[int]]]:
    """Merge adjacent batch dimensions wherever every operand allows it; drop size-1 ones."""
    merged: list[tuple[int, list[int]]] = []
    for i, size in enumerate(sizes):
        if size == 1:
            continue
        dim = [s[i] for s in strides]
        if merged and all(prev == cur * size for prev, cur in zip(merged[-1][1], dim)):
            merged[-1] = (merged[-1][0] * size, dim)
        else:
            merged.append((size, dim))
    return merged


def _extent(t: torch.Tensor) -> int:
    """One past the largest element offset a view reaches from its data pointer."""
    if t.numel() == 0:
        return 0
    return 1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))


def _broadcast_batch(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    """``torch.broadcast_shapes(a, b)`` of two batch shapes; when one is empty (a product of
    matrices, the common case) without its host cost, tens of microseconds per call."""
    if not b:
        return tuple(a)
    if not a:
        return tuple(b)
    return tuple(torch.broadcast_shapes(tuple(a), tuple(b)))


def matmul_shape(op: str, a_shape: Sequence[int], b_shape: Sequence[int]) -> tuple[int, ...]:
    """Output shape of ``torch.matmul`` for these operand shapes; ValueError when invalid."""
    for name, shape in (("a", a_shape), ("b", b_shape)):
        if len(shape) == 0:
            raise ValueError(f"{op}: {name} must have at least 1 dimension, got a 0-d tensor")
    ka = a_shape[-1]
    b_dim = -2 if len(b_shape) >= 2 else 0
    kb = b_shape[b_dim]
    if ka != kb:
        raise ValueError(
            f"{op}: inner dimensions must match: a.shape[-1] = {ka} but b.shape[{b_dim}] = {kb} "
            f"(a {tuple(a_shape)}, b {tuple(b_shape)})"
        )
    try:
        batch = _broadcast_batch(a_shape[:-2], b_shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"{op}: batch dimensions must broadcast: a {tuple(a_shape)}, b {tuple(b_shape)}"
        ) from None
    rows = (a_shape[-2],) if len(a_shape) >= 2 else ()
    cols = (b_shape[-1],) if len(b_shape) >= 2 else ()
    return (*batch, *rows, *cols)


def _plan_matmul(
    a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype
) -> tuple[_Problem | None, torch.Tensor]:
    """torch.matmul's semantics as one GEMM problem over strided views, and its output."""
    out_shape = matmul_shape("tritonkit.matmul", a.shape, b.shape)
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    m, k = a2.shape[-2:]
    n = b2.shape[-1]
    batch = _broadcast_batch(a2.shape[:-2], b2.shape[:-2])
    c = torch.empty((*batch, m, n), dtype=out_dtype, device=a.device)
    out = c.view(out_shape)
    if c.numel() == 0:
        return None, out
    if b2.dim() == 2 and a2.dim() > 2:
        # (..., M, K) @ (K, N): fold the batch into the rows when the layout allows (one GEMM,
        # as torch does).
        rows = math.prod(a2.shape[:-1])
        try:
            a_rows = a2.view(rows, k)
        except RuntimeError:
            a_rows = None
        if a_rows is not None:
            p = _Problem(_matrix(a_rows), _matrix(b2), _matrix(c.view(rows, n)), rows, n, k)
            return p, out
    ae = a2.expand(*batch, m, k)
    be = b2.expand(*batch, k, n)
    dims = _coalesce_batch(batch, [ae.stride()[:-2], be.stride()[:-2], c.stride()[:-2]])
    if len(dims) > 2:  # more batch dimensions than the kernel's two strides: copy once
        LAYOUT_COPIES.count += 2
        ae, be = ae.contiguous(), be.contiguous()
        dims = _coalesce_batch(batch, [ae.stride()[:-2], be.stride()[:-2], c.stride()[:-2]])
    if not dims:  # every batch dimension has size 1: one matrix
        index = (0,) * len(batch)
        p = _Problem(_matrix(ae[index]), _matrix(be[index]), _matrix(c[index]), m, n, k)
        return p, out
    if len(dims) == 1:
        dims.insert(0, (1, [0, 0, 0]))
    (n0, s0), (n1, s1) = dims

    def operand(t: torch.Tensor, i: int) -> _Operand:
        return _Operand(t, (s0[i], s1[i], t.stride(-2), t.stride(-1)))

    p = _Problem(operand(ae, 0), operand(be, 1), operand(c, 2), m, n, k, (n0, n1))
    return p, out


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------

# Tests set this to run the TMA path under the interpreter (which implements descriptors).
_INTERPRETER_TMA = False


def _tf32_enabled() -> bool:
    """Whether PyTorch would use TF32 for a float32 matmul right now."""
    with warnings.catch_warnings():  # the old flag's getter warns in recent PyTorch
        warnings.simplefilter("ignore")
        allow = bool(torch.backends.cuda.matmul.allow_tf32)
    return allow or torch.get_float32_matmul_precision() != "highest"


def _tma_device(device: torch.device) -> bool:
    if TensorDescriptor is None:
        return False
    if interpreter_enabled():
        return _INTERPRETER_TMA
    if device.type != "cuda" or torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def _tma_orientation(t: torch.Tensor, row_major: bool) -> bool:
    """Whether TMA can read 2-D ``t`` as stored: row-major (unit column stride) or, with
    ``row_major=False``, column-major; leading stride and base 16-byte aligned."""
    rows, cols = t.shape
    s_r, s_c = t.stride()
    elem = t.element_size()
    if t.data_ptr() % 16:
        return False
    if row_major:
        return s_c == 1 and s_r >= cols and (s_r * elem) % 16 == 0
    return s_r == 1 and s_c >= rows and (s_c * elem) % 16 == 0


def _layout_flags(p: _Problem) -> tuple[bool, bool]:
    """(A_T, B_T): A stored M-major, B stored K-major."""
    _, _, s_am, s_ak = p.a.strides
    _, _, s_bk, s_bn = p.b.strides
    return (s_am == 1 and s_ak != 1), (s_bk == 1 and s_bn != 1)


def _tma_ok(p: _Problem) -> bool:
    """Whether every operand of ``p`` can go through TMA descriptors."""
    if p.n_batch != 1 or min(p.m, p.n, p.k) < 16 or not _tma_device(p.c.tensor.device):
        return False
    a, b, c = p.a.tensor, p.b.tensor, p.c.tensor
    a_t, b_t = _layout_flags(p)
    if a.element_size() != 2 and (a_t or not b_t):
        # wgmma reads 8-bit and tf32 operands K-major only; other layouts take the pointer path.
        return False
    return (
        _tma_orientation(a, not a_t) and _tma_orientation(b, not b_t) and _tma_orientation(c, True)
    )


def _descriptors(p: _Problem, cfg: MatmulConfig) -> tuple:
    a_t, b_t = _layout_flags(p)
    a, b, c = p.a.tensor, p.b.tensor, p.c.tensor
    bm, bn, bk = cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K
    if a_t:
        a_desc = TensorDescriptor(a.t(), [p.k, p.m], [a.stride(1), 1], [bk, bm])
    else:
        a_desc = TensorDescriptor(a, [p.m, p.k], [a.stride(0), 1], [bm, bk])
    if b_t:
        b_desc = TensorDescriptor(b.t(), [p.n, p.k], [b.stride(1), 1], [bn, bk])
    else:
        b_desc = TensorDescriptor(b, [p.k, p.n], [b.stride(0), 1], [bk, bn])
    c_desc = TensorDescriptor(c, [p.m, p.n], [c.stride(0), 1], [bm, bn // 2 if cfg.subtile else bn])
    return a_desc, b_desc, c_desc


def _scale_mode(scale: torch.Tensor | None, vector: bool) -> int:
    if scale is None:
        return _SCALE_NONE
    return _SCALE_VECTOR if vector else _SCALE_TENSOR


def _launch(p: _Problem, epi: _Epilogue, cfg: MatmulConfig) -> None:
    """Run one GEMM with ``cfg``; the outputs in ``p`` and ``epi`` are written."""
    a, b, c = p.a.tensor, p.b.tensor, p.c.tensor
    device = c.device
    acc_int = a.dtype == torch.int8
    use_tma = cfg.tma and _tma_ok(p)
    split = cfg.SPLIT_K if p.n_batch == 1 else 1
    k_split = max(1, cdiv(cdiv(p.k, cfg.BLOCK_K), split)) * cfg.BLOCK_K
    plane = p.m * p.n
    ws = None
    if split > 1:
        ws = torch.empty(
            (split, p.m, p.n), dtype=torch.int32 if acc_int else torch.float32, device=device
        )
    descs = _descriptors(p, cfg) if use_tma else (None, None, None)
    a_t, b_t = _layout_flags(p)
    views = [a, b, c] + [t for t in (epi.residual, epi.z, ws) if t is not None]
    int64 = any(_extent(t) >= _INT32_LIMIT for t in views)
    if a.dtype == torch.float32:
        precision = "tf32" if _tf32_enabled() else "ieee"
    else:
        precision = None
    max_imprecise, promote_blocks = _promotion(cfg) if a.dtype in FP8_DTYPES else (None, 1)
    n_sms = sm_count(device)
    total = p.n_batch * cdiv(p.m, cfg.BLOCK_M) * cdiv(p.n, cfg.BLOCK_N) * split
    grid = (min(n_sms, total),) if cfg.persistent else (total,)
    sa, sb = epi.scale_a, epi.scale_b
    common = dict(
        FLOAT_OUT=c.dtype.is_floating_point,
        SCALE_A=_scale_mode(sa, epi.scale_a_rows),
        SCALE_B=_scale_mode(sb, epi.scale_b_cols),
        HAS_BIAS=epi.bias is not None,
        ACT=ACTIVATIONS[epi.activation],
        HAS_RES=epi.residual is not None,
        STORE_Z=epi.z is not None,
    )
    epi_strides = (
        sa.stride(0) if sa is not None and sa.dim() else 0,
        sb.stride(0) if sb is not None and sb.dim() else 0,
        epi.bias.stride(0) if epi.bias is not None else 0,
        *(epi.residual.stride() if epi.residual is not None else (0, 0)),
        *(epi.z.stride() if epi.z is not None else (0, 0)),
    )
    _matmul_kernel[grid](
        a,
        b,
        c,
        ws,
        *descs,
        sa,
        sb,
        epi.bias,
        epi.residual,
        epi.z,
        p.m,
        p.n,
        p.k,
        k_split,
        plane,
        p.n_batch,
        p.batch[1],
        *p.a.strides,
        *p.b.strides,
        *p.c.strides,
        *epi_strides,
        PERSISTENT=cfg.persistent,
        NUM_SMS=n_sms,
        # Flattening the tile and K loops (one software pipeline across tiles) gains with one
        # accumulator; with the hand promotion's branch it lost 22% (run 23: 0.675x vs 0.863x
        # _scaled_mm, promoting every 16 blocks).
        FLATTEN=not cfg.warp_specialize and promote_blocks == 1,
        WARP_SPECIALIZE=cfg.warp_specialize and cfg.persistent,
        USE_TMA=use_tma,
        A_T=a_t,
        B_T=b_t,
        EPILOGUE_SUBTILE=cfg.subtile and use_tma,
        SPLIT_K=split,
        DOT=cfg.dot,
        INPUT_PRECISION=precision,
        # fp8 on Hopper: promote the tensor cores' partial sums to fp32; see PROMOTE_PER_BLOCK.
        MAX_IMPRECISE=max_imprecise,
        PROMOTE_BLOCKS=promote_blocks,
        ACC_INT=acc_int,
        EVEN_K=p.k % cfg.BLOCK_K == 0,
        INT64=int64,
        BLOCK_M=cfg.BLOCK_M,
        BLOCK_N=cfg.BLOCK_N,
        BLOCK_K=cfg.BLOCK_K,
        GROUP_M=cfg.GROUP_M,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **common,
    )
    if split > 1:
        block_m, block_n = _REDUCE_BLOCK
        _splitk_reduce_kernel[(cdiv(p.m, block_m) * cdiv(p.n, block_n),)](
            ws,
            c,
            sa,
            sb,
            epi.bias,
            epi.residual,
            epi.z,
            p.m,
            p.n,
            plane,
            c.stride(0),
            c.stride(1),
            *epi_strides,
            SPLIT_K=split,
            INT64=int64,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            num_warps=4,
            **common,
        )


def _dtype_key(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# Tuning-key granularity of M and N. Up to _FINE_KEY_LIMIT, sizes in one power-of-2 bucket
# differ in tile count, hence in how full the last wave of tiles is, which decides between
# 128- and 256-wide tiles: 3072 x 3072 x 4096 ran 0.77x cuBLAS with the 128 x 256 tiles tuned
# on 4096^3, 0.84x with its own 128 x 128 (benchmarks/NOTES.md, run 55). Multiples of 256 give
# every candidate tile the same count within a class. Above the limit every config fills many
# waves, and power-of-2 buckets keep the number of tunings small.
_KEY_STEP = 256
_FINE_KEY_LIMIT = 8192


def _size_class(x: int) -> int:
    """M or N as the autotuning key holds it."""
    return cdiv(x, _KEY_STEP) * _KEY_STEP if x <= _FINE_KEY_LIMIT else next_power_of_2(x)


def _tuned(p: _Problem, epi: _Epilogue, kind: str, split: int = 1) -> MatmulConfig:
    """The best config of ``kind`` for this problem class, from the autotune cache or timed now."""
    a, b, c = p.a.tensor, p.b.tensor, p.c.tensor
    cls = _operand_class(a.dtype)
    tma = kind == "persistent" and _tma_ok(p)
    a_t, b_t = _layout_flags(p)
    key = {
        "kind": kind,
        "m": _size_class(p.m),
        "n": _size_class(p.n),
        "k": next_power_of_2(p.k),
        "batched": p.n_batch > 1,
        "a": _dtype_key(a.dtype),
        "b": _dtype_key(b.dtype),
        "out": _dtype_key(c.dtype),
        "layout": ("T" if a_t else "N") + ("T" if b_t else "N"),
        "class": cls,
        "tma": tma,
        "split": split,
    }
    sizes = (a.element_size(), b.element_size(), c.element_size())

    def prune(cfg: _tuning.Config) -> bool:
        return _tuning.fits_shared_memory(MatmulConfig.from_tuning(cfg).smem_bytes(*sizes))

    def run(cfg: _tuning.Config) -> None:
        _launch(p, epi, MatmulConfig.from_tuning(cfg))

    def choose() -> MatmulConfig:
        # Pruned here as well as in the search: with tuning off, tune() runs candidates[0] as
        # is, and the default must fit this GPU's shared memory (an A100 has 163 KB, Hopper 227).
        cands = [cand.tuning() for cand in _candidates(kind, cls, tma, p.m, split)]
        cands = [cand for cand in cands if prune(cand)] or cands
        return MatmulConfig.from_tuning(_tuning.tune("matmul", key, cands, run, prune=prune))

    # The exact M as well as its class: the split-K candidates depend on it.
    return _tuning.remembered("matmul", (tuple(key.items()), p.m, sizes), choose)


# IEEE fp32 GEMMs run tl.dot on the CUDA cores (FMA), which read a K-major B (the weight of
# F.linear: b = w.t()) through a transposed shared-memory tile. H200 (benchmarks/NOTES.md, run
# 152), 4096^3, TFLOP/s: B K-major 10.3 tuned (21.7 at the best tile timed) against 38.9 with B
# row-major, cuBLAS 50.6; tritonkit.linear in fp32 10.3 against F.linear's 50.6. So above
# _FMA_COPY_MIN_MNK such a B is first copied row-major (memory.transpose_fwd: K * N elements
# read and written, counted in LAYOUT_COPIES).
_FMA_COPY_MIN_MNK = 512**3


def fma_copies_b(p: _Problem) -> bool:
    """Whether the best path first copies ``p``'s B row-major (see ``_FMA_COPY_MIN_MNK``): an
    IEEE fp32 GEMM of one matrix with a K-major B, large, not split over K."""
    a, b = p.a.tensor, p.b.tensor
    if a.dtype != torch.float32 or _tf32_enabled() or p.n_batch != 1:
        return False
    stride_k, stride_n = p.b.strides[2:]
    if not (stride_k == 1 and stride_n != 1 and p.n > 1):
        return False
    if p.m * p.n * p.k < _FMA_COPY_MIN_MNK:
        return False
    return split_k_for(p.m, p.n, p.k, 1, sm_count(b.device)) == 1


def _run(
    p: _Problem | None, epi: _Epilogue, path: str = "best", config: MatmulConfig | None = None
) -> None:
    """Compute ``p`` along ``path``: a variant name, or "best" (persistent, split-K if skinny,
    a K-major fp32 B copied row-major for the CUDA cores)."""
    if p is None or p.m == 0 or p.n == 0:
        return
    if config is None and path == "best" and fma_copies_b(p):
        b = p.b.tensor
        # b is a (K, N) view with unit K stride: b.t() is an (N, K) row-major view (a slice's
        # row stride may exceed K), which the tiled transpose copies into (K, N) row-major.
        LAYOUT_COPIES.count += 1
        p = dataclasses.replace(p, b=_matrix(transpose_fwd(b.t())))
    if config is None:
        if path in _FIXED:
            config = _fixed_config(path, p.a.tensor.element_size())
        elif path in ("autotuned", "persistent"):
            config = _tuned(p, epi, path)
        else:
            split = split_k_for(p.m, p.n, p.k, p.n_batch, sm_count(p.c.tensor.device))
            config = _tuned(p, epi, "splitk", split) if split > 1 else _tuned(p, epi, "persistent")
    _launch(p, epi, config)


def matmul_fwd(
    a: torch.Tensor,
    b: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    path: str = "best",
    config: MatmulConfig | None = None,
) -> torch.Tensor:
    """``torch.matmul(a, b)`` with the output in ``out_dtype`` (default: a's dtype).

    ``path`` picks a variant of the evolution (``VARIANTS``) or "best"; ``config`` forces one
    launch config (tests and sweeps).
    """
    p, out = _plan_matmul(a, b, out_dtype or a.dtype)
    _run(p, _NO_EPILOGUE, path, config)
    return out


def linear_fwd(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    activation: str,
    save_z: bool,
    config: MatmulConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``act(x @ weight^T + bias) + residual`` for 2-D ``x``; returns ``(y, z)``.

    ``z`` is the pre-activation ``x @ weight^T + bias`` in x's dtype when ``save_z``, else
    empty.
    """
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    z = torch.empty((m, n) if save_z else (0,), dtype=x.dtype, device=x.device)
    p = _Problem(_matrix(x), _matrix(weight.t()), _matrix(y), m, n, k)
    epi = _Epilogue(bias=bias, activation=activation, residual=residual, z=z if save_z else None)
    _run(p, epi, config=config)
    return y, z


def _vector_scale(scale: torch.Tensor | None) -> tuple[torch.Tensor | None, bool]:
    """A scale as a 1-D view (per row / per column) or as-is (one value)."""
    if scale is None or scale.numel() == 1:
        return scale, False
    return scale.reshape(-1), True


# 8-bit operands and layout. Hopper's wgmma reads 8-bit operands (FP8, INT8) from shared memory
# K-major only: A row-major and B column-major (B^T row-major, as nn.Linear's (N, K) weight).
# Any other layout cannot use the TMA path (_tma_ok) and runs the pointer loop, six times
# slower: INT8 8192^3 on an H200 ran at 160 TOP/s with B row-major (the natural ``a @ b``),
# 1077 TOP/s K-major. So above _KMAJOR_COPY_MIN_MNK the launcher first transposes such an
# operand into a K-major scratch buffer with the tiled transpose (memory.transpose_fwd:
# coalesced reads and writes), then runs the TMA path. The scratch is allocated per call and
# freed when it returns: K * N extra bytes for B, M * K for A (one byte per element), and
# twice that in memory traffic, small beside the GEMM's 2 * M * N * K operations once the
# problem is large. Each copy is counted in LAYOUT_COPIES, so reports show it; kmajor_copies()
# says beforehand which operands a call copies. Below the threshold (and for skinny problems,
# which take split-K's pointer loop anyway) the extra launch may cost more than it saves. On
# an H200 (benchmarks/sweep_lowp.py, INT8 with b row-major) the copy route beat the pointer
# loop at every size timed: 1.63x at 512^3, 2.32x at 1024^3, 5.42x at 4096^3; smaller
# problems were not timed, so the copy starts at 512^3.
_KMAJOR_COPY_MIN_MNK = 512**3


def _kmajor_plan(
    a: torch.Tensor,
    b: torch.Tensor,
    out_dtype: torch.dtype,
    force: bool | None,
    config: MatmulConfig | None,
) -> tuple[bool, bool]:
    """(copy a, copy b) for the 8-bit GEMM ``a @ b``: see ``_KMAJOR_COPY_MIN_MNK``."""
    if a.element_size() != 1 or force is False or not _tma_device(a.device):
        return False, False
    m, k = a.shape
    n = b.shape[1]
    copy_a = not _tma_orientation(a, row_major=True)
    copy_b = not _tma_orientation(b, row_major=False)
    # The copies have K-byte rows and TMA needs 16-byte aligned strides, for the output too;
    # tiny problems never take the TMA path.
    tma_after = min(m, n, k) >= 16 and k % 16 == 0 and (n * out_dtype.itemsize) % 16 == 0
    if not (copy_a or copy_b) or not tma_after:
        return False, False
    if force is None:
        if config is not None and (not config.tma or config.SPLIT_K > 1):
            return False, False  # a forced pointer-path config would not read the copies
        if m * n * k < _KMAJOR_COPY_MIN_MNK or split_k_for(m, n, k, 1, sm_count(a.device)) > 1:
            return False, False
    return copy_a, copy_b


def kmajor_copies(
    a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype = torch.int32
) -> tuple[bool, bool]:
    """Which operands ``scaled_matmul`` / ``int8_matmul`` first copy into K-major scratch.

    Returns ``(copy_a, copy_b)``: True for an 8-bit operand that is not stored K-major (a
    row-major, b column-major) when TMA is available and the problem is large enough for the
    copy to pay; the copy of b costs ``K * N`` extra bytes per call, of a ``M * K``.
    """
    return _kmajor_plan(a, b, out_dtype, None, None)


def scaled_matmul_fwd(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor | None,
    scale_b: torch.Tensor | None,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    config: MatmulConfig | None = None,
    kmajor: bool | None = None,
) -> torch.Tensor:
    """``(a @ b) * scale_a * scale_b + bias`` for 2-D 8-bit a and b (FP8 or INT8).

    ``config`` forces one launch config; ``kmajor`` forces (True: whatever the size, wherever
    TMA could read the copies) or forbids (False) the K-major scratch copies of operands wgmma
    cannot read as stored, which by default (None) are made above ``_KMAJOR_COPY_MIN_MNK``
    (tests and sweeps).
    """
    m, k = a.shape
    n = b.shape[1]
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    copy_a, copy_b = _kmajor_plan(a, b, out_dtype, kmajor, config)
    if copy_a:
        a = transpose_fwd(a.t())  # (M, K), row-major
    if copy_b:
        b = transpose_fwd(b).t()  # (K, N) view of an (N, K) row-major scratch buffer
    LAYOUT_COPIES.count += copy_a + copy_b
    sa, rows = _vector_scale(scale_a)
    sb, cols = _vector_scale(scale_b)
    epi = _Epilogue(scale_a=sa, scale_a_rows=rows, scale_b=sb, scale_b_cols=cols, bias=bias)
    _run(_Problem(_matrix(a), _matrix(b), _matrix(out), m, n, k), epi, config=config)
    return out


# ----------------------------------------------------------------------------------------------
# torch.library registration: each launcher becomes an op that torch.compile traces as one node.
# ----------------------------------------------------------------------------------------------


@define_op("tritonkit::matmul")
def _matmul_op(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    return matmul_fwd(a, b, out_dtype)


@_matmul_op.register_fake
def _(a, b, out_dtype):
    return a.new_empty(matmul_shape("tritonkit.matmul", a.shape, b.shape), dtype=out_dtype)


@define_op("tritonkit::linear")
def _linear_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    activation: str,
    save_z: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    return linear_fwd(x, weight, bias, residual, activation, save_z)


@_linear_op.register_fake
def _(x, weight, bias, residual, activation, save_z):
    shape = (x.shape[0], weight.shape[0])
    return x.new_empty(shape), x.new_empty(shape if save_z else (0,))


@define_op("tritonkit::scaled_matmul")
def _scaled_matmul_op(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor | None,
    scale_b: torch.Tensor | None,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    return scaled_matmul_fwd(a, b, scale_a, scale_b, bias, out_dtype)


@_scaled_matmul_op.register_fake
def _(a, b, scale_a, scale_b, bias, out_dtype):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


# Eager calls on real tensors skip the ops' dispatch (see eager_direct).
call_matmul = eager_direct(_matmul_op)
call_linear = eager_direct(_linear_op)
call_scaled_matmul = eager_direct(_scaled_matmul_op)


# ----------------------------------------------------------------------------------------------
# Autograd
# ----------------------------------------------------------------------------------------------


def _mm(x: torch.Tensor, y: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    return call_matmul(x, y, out_dtype or x.dtype)


def _as_matrix(t: torch.Tensor, n_cols: int) -> torch.Tensor:
    """``t`` as (rows, n_cols): a view when its leading dimensions merge, else a counted copy."""
    rows = math.prod(t.shape[:-1])
    try:
        return t.view(rows, n_cols)
    except RuntimeError:
        LAYOUT_COPIES.count += 1
        return t.reshape(rows, n_cols)


def _reduced_product(x: torch.Tensor, y: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """``x @ y`` summed over the batch dimensions an operand of ``shape`` was broadcast over."""
    full = matmul_shape("tritonkit.matmul", x.shape, y.shape)
    if tuple(full) == tuple(shape):
        return _mm(x, y)
    rows, inner = x.shape[-2:]
    cols = y.shape[-1]
    if len(shape) == 2:
        # A matrix broadcast over the whole batch: sum_b x[b] @ y[b] is one GEMM whose
        # reduction runs over (batch, inner): (rows, B * inner) @ (B * inner, cols).
        nb = math.prod(full[:-2])
        xs = x.expand(*full[:-2], rows, inner).reshape(nb, rows, inner)
        ys = y.expand(*full[:-2], inner, cols).reshape(nb * inner, cols)
        return _mm(xs.permute(1, 0, 2).reshape(rows, nb * inner), ys)
    # General broadcast: the products in fp32, summed, rounded once.
    return _mm(x, y, torch.float32).sum_to_size(shape).to(x.dtype)


class MatmulFunction(torch.autograd.Function):
    """``torch.matmul(a, b)``: dA = dC @ B^T and dB = A^T @ dC, summed over broadcast batches."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return call_matmul(a, b, a.dtype)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        a2 = a.unsqueeze(0) if a.dim() == 1 else a
        b2 = b.unsqueeze(-1) if b.dim() == 1 else b
        g = grad.reshape(matmul_shape("tritonkit.matmul", a2.shape, b2.shape))
        da = db = None
        if ctx.needs_input_grad[0]:
            da = _reduced_product(g, b2.mT, a2.shape).reshape(a.shape)
        if ctx.needs_input_grad[1]:
            if b2.dim() == 2 and a2.dim() > 2:
                # (..., M, K) @ (K, N): dB = A^T @ dC with the batch folded into the reduction.
                k, n = b2.shape
                db = _mm(_as_matrix(a2, k).t(), _as_matrix(g, n))
            else:
                db = _reduced_product(a2.mT, g, b2.shape)
            db = db.reshape(b.shape)
        return da, db


class LinearFunction(torch.autograd.Function):
    """``act(x @ W^T + b) + residual`` with the bias, activation and residual in the epilogue.

    Backward: dZ = dY * act'(Z) and db = sum(dZ) in one pass over dY and the saved
    pre-activation Z = x @ W^T + b (elementwise family's kernel); dX = dZ @ W; dW = dZ^T @ X;
    d(residual) = dY.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, residual, activation):
        n, k = weight.shape
        lead = x.shape[:-1]
        x2 = _as_matrix(x, k)
        r2 = _as_matrix(residual, n) if residual is not None else None
        needs = ctx.needs_input_grad
        save_z = activation != "none" and any(needs[:3])
        y, z = call_linear(x2, weight, bias, r2, activation, save_z)
        ctx.activation = activation
        ctx.x_shape = x.shape
        ctx.save_for_backward(
            x2 if needs[1] else None,
            weight if needs[0] else None,
            bias,
            z if save_z else None,
        )
        return y.view(*lead, n)

    @staticmethod
    def backward(ctx, grad):
        x2, weight, bias, z = ctx.saved_tensors
        need_x, need_w, need_b, need_r = ctx.needs_input_grad[:4]
        n = grad.shape[-1]
        g = _as_matrix(grad, n)
        op = call_bias_act_backward
        db = None
        if ctx.activation != "none":
            dz, db = op(g, z, bias, None, ctx.activation, True, need_b, True)
        else:
            dz = g
            if need_b:
                _, db = op(g, None, bias, None, "none", False, True, False)
        dx = _mm(dz, weight).view(ctx.x_shape) if need_x else None
        dw = _mm(dz.t(), x2) if need_w else None
        dr = grad if need_r else None
        return dx, dw, (db if need_b else None), dr, None


# ----------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------

_LINEAR_ACTIVATIONS = (None, "relu", "gelu", "gelu_tanh", "silu")
_SCALED_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_INT8_OUT_DTYPES = (torch.int32, torch.bfloat16, torch.float16, torch.float32)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_2d(op: str, name: str, t: torch.Tensor) -> None:
    if t.dim() != 2:
        raise ValueError(f"{op}: {name} must be 2-D, got {t.dim()}-D shape {tuple(t.shape)}")


def _check_inner(op: str, a: torch.Tensor, b: torch.Tensor) -> None:
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"{op}: inner dimensions must match: a.shape[1] = {a.shape[1]} but b.shape[0] = "
            f"{b.shape[0]} (a {tuple(a.shape)}, b {tuple(b.shape)})"
        )


def _check_out_dtype(op: str, out_dtype: object, allowed: Sequence[torch.dtype]) -> None:
    if out_dtype not in allowed:
        names = ", ".join(_name(d) for d in allowed)
        got = _name(out_dtype) if isinstance(out_dtype, torch.dtype) else repr(out_dtype)
        raise TypeError(f"{op}: out_dtype must be one of {names}, got {got}")


def _check_scale(
    op: str, name: str, scale: torch.Tensor, ref: torch.Tensor, vector_shape: tuple[int, int]
) -> None:
    check_tensor(op, name, scale, (torch.float32,))
    check_same_device(op, a=ref, **{name: scale})
    if scale.numel() == 1 and scale.dim() <= 2:
        return
    if tuple(scale.shape) != vector_shape:
        raise ValueError(
            f"{op}: {name} must have one element (per-tensor scale) or shape {vector_shape}, "
            f"got {tuple(scale.shape)}"
        )


def _check_bias(op: str, bias: torch.Tensor, n: int, dtype: torch.dtype, ref: torch.Tensor) -> None:
    check_tensor(op, "bias", bias, (dtype,))
    check_same_device(op, a=ref, bias=bias)
    if tuple(bias.shape) != (n,):
        raise ValueError(f"{op}: bias must have shape ({n},), got {tuple(bias.shape)}")


@policy(cuda=LOWER, cpu=LOWER)
def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.matmul(a, b)``, with autograd.

    1-D operands, batched operands and batch broadcasting behave as in ``torch.matmul``.
    Transposed and sliced views are read through their strides, without a copy, except that a
    large float32 GEMM without TF32 (computed on the CUDA cores) first copies a K-major ``b``
    (e.g. ``w.t()``) row-major, which it reads 4x faster (``K * N`` elements; counted in
    reports). float32 uses TF32 exactly when PyTorch would
    (``torch.backends.cuda.matmul.allow_tf32`` or ``torch.get_float32_matmul_precision() !=
    "highest"``); accumulation is float32.

    Args:
        a: float32, float16 or bfloat16 tensor with at least 1 dimension, on a CUDA device.
        b: tensor of the same dtype and device; ``a.shape[-1]`` must equal ``b.shape[-2]``
            (``b.shape[0]`` for 1-D b), and the batch dimensions must broadcast.

    Returns:
        ``a @ b`` in the inputs' dtype, contiguous. Under ``torch.autocast`` both operands
        are first cast to the autocast dtype, as ``torch.matmul``'s are.
    """
    op = "tritonkit.matmul"
    a, b = cast(autocast_dtype("matmul", a), a, b)
    check_tensor(op, "a", a)
    check_operand(op, "b", b, "a", a)
    matmul_shape(op, a.shape, b.shape)
    return apply(MatmulFunction, a, b)


@policy(cuda=LOWER, cpu=LOWER)
def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """``act(F.linear(x, weight, bias)) + residual`` in one GEMM, with autograd.

    The bias, the activation and the residual add run in the GEMM's epilogue: the product
    never makes a round trip through memory. The backward pass keeps the pre-activation
    ``x @ W^T + b`` (only when an activation needs it) and computes dX, dW and the bias
    gradient. A large float32 product without TF32 first copies the weight transposed (see
    ``matmul``).

    Args:
        x: float32, float16 or bfloat16 tensor of shape ``(..., in_features)``.
        weight: ``(out_features, in_features)``, same dtype and device as x.
        bias: optional ``(out_features,)``.
        activation: None, ``"relu"``, ``"gelu"``, ``"gelu_tanh"`` or ``"silu"``.
        residual: optional tensor of the output's shape ``(..., out_features)``, added after
            the activation.

    Under ``torch.autocast`` x, weight and bias are first cast to the autocast dtype, as
    ``F.linear``'s are; a residual in another dtype is then added after the GEMM, with
    PyTorch's type promotion, as ``act(F.linear(...)) + residual`` would be.
    """
    op = "tritonkit.linear"
    dtype = autocast_dtype("linear", x)
    x, weight, bias = cast(dtype, x, weight, bias)
    if dtype is not None and isinstance(residual, torch.Tensor) and residual.dtype != dtype:
        return linear(x, weight, bias, activation) + residual
    check_tensor(op, "x", x)
    check_operand(op, "weight", weight, "x", x)
    check_choice(op, "activation", activation, _LINEAR_ACTIVATIONS)
    if x.dim() == 0:
        raise ValueError(f"{op}: x must have at least 1 dimension, got a 0-d tensor")
    if weight.dim() != 2:
        raise ValueError(
            f"{op}: weight must be 2-D (out_features, in_features), got shape {tuple(weight.shape)}"
        )
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(
            f"{op}: x.shape[-1] must equal weight.shape[1] (in_features = {k}), got {x.shape[-1]} "
            f"(x {tuple(x.shape)}, weight {tuple(weight.shape)})"
        )
    if bias is not None:
        check_operand(op, "bias", bias, "x", x, (n,), "(out_features,)")
    if residual is not None:
        check_operand(op, "residual", residual, "x", x)
        expected = (*x.shape[:-1], n)
        if tuple(residual.shape) != expected:
            raise ValueError(
                f"{op}: residual must have the output's shape {expected}, "
                f"got {tuple(residual.shape)}"
            )
    return apply(LinearFunction, x, weight, bias, residual, activation or "none")


def scaled_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """FP8 GEMM with ``torch._scaled_mm`` semantics: ``(a @ b) * scale_a * scale_b + bias``.

    Accumulation is float32: the tensor cores sum products in their own ~14-bit accumulator and
    the kernel promotes those partial sums to fp32 every 2048 K elements with the default tile
    (once per K block with the others the tuner may pick). At 8192^3 on an H200 that is a
    relative error of 1.12x ``torch._scaled_mm``'s (which promotes more often) at 0.92x its
    speed; promoting once per K block matches its error at 0.80x (``MatmulConfig.promote_k``;
    benchmarks/NOTES.md, run 23). Any layout is accepted; the
    fastest is the one ``torch._scaled_mm`` requires: a row-major, b column-major. On Hopper,
    a large problem with another layout first copies the operand into a K-major scratch buffer
    (``K * N`` bytes for b, ``M * K`` for a, per call; see ``kmajor_copies``).

    Args:
        a: ``(M, K)`` float8_e4m3fn or float8_e5m2 tensor on a CUDA device.
        b: ``(K, N)`` float8_e4m3fn or float8_e5m2 tensor.
        scale_a: float32 dequantisation scale of a: one element (per tensor) or ``(M, 1)``
            (per row).
        scale_b: float32 scale of b: one element or ``(1, N)`` (per column).
        out_dtype: bfloat16, float16 or float32.
        bias: optional ``(N,)`` tensor of dtype ``out_dtype``, added after scaling.
    """
    op = "tritonkit.scaled_matmul"
    check_tensor(op, "a", a, FP8_DTYPES)
    check_tensor(op, "b", b, FP8_DTYPES)
    check_same_device(op, a=a, b=b)
    _check_2d(op, "a", a)
    _check_2d(op, "b", b)
    _check_inner(op, a, b)
    _check_out_dtype(op, out_dtype, _SCALED_OUT_DTYPES)
    _check_scale(op, "scale_a", scale_a, a, (a.shape[0], 1))
    _check_scale(op, "scale_b", scale_b, a, (1, b.shape[1]))
    if bias is not None:
        _check_bias(op, bias, b.shape[1], out_dtype, a)
    return call_scaled_matmul(a, b, scale_a, scale_b, bias, out_dtype)


def int8_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor | None = None,
    scale_b: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.int32,
) -> torch.Tensor:
    """INT8 GEMM (W8A8): the exact int32 product as ``torch._int_mm``, or dequantised.

    With ``out_dtype=torch.int32`` the result is ``a @ b`` accumulated in int32 (no scales).
    With a floating ``out_dtype`` the epilogue computes ``(a @ b) * scale_a * scale_b`` in
    float32 and rounds once (a missing scale counts as 1).

    Args:
        a: ``(M, K)`` int8 tensor on a CUDA device.
        b: ``(K, N)`` int8 tensor; K-major (``w.t()`` of an ``(N, K)`` weight) is fastest.
            On Hopper, a large problem with a row-major (or otherwise not K-major) b first
            transposes it into a K-major scratch buffer of ``K * N`` bytes, per call
            (``kmajor_copies``); a not row-major a is copied likewise (``M * K`` bytes).
        scale_a: optional float32 scale of a: one element or ``(M, 1)``.
        scale_b: optional float32 scale of b: one element or ``(1, N)``.
        out_dtype: int32, bfloat16, float16 or float32.
    """
    op = "tritonkit.int8_matmul"
    check_tensor(op, "a", a, (torch.int8,))
    check_tensor(op, "b", b, (torch.int8,))
    check_same_device(op, a=a, b=b)
    _check_2d(op, "a", a)
    _check_2d(op, "b", b)
    _check_inner(op, a, b)
    _check_out_dtype(op, out_dtype, _INT8_OUT_DTYPES)
    if out_dtype == torch.int32 and (scale_a is not None or scale_b is not None):
        raise ValueError(
            f"{op}: scale_a and scale_b need a floating out_dtype (bfloat16, float16 or "
            "float32); out_dtype=int32 returns the exact integer product"
        )
    if scale_a is not None:
        _check_scale(op, "scale_a", scale_a, a, (a.shape[0], 1))
    if scale_b is not None:
        _check_scale(op, "scale_b", scale_b, a, (1, b.shape[1]))
    return call_scaled_matmul(a, b, scale_a, scale_b, None, out_dtype)


def matmul_variant(a: torch.Tensor, b: torch.Tensor, variant: str) -> torch.Tensor:
    """``torch.matmul(a, b)`` by one version of the kernel's evolution (no autograd).

    Args:
        a: float32, float16 or bfloat16 tensor, as for ``matmul``.
        b: tensor of the same dtype and device.
        variant: one of ``VARIANTS``: "naive", "tiled", "pipelined", "autotuned", "persistent".
    """
    op = "tritonkit.matmul_variant"
    check_choice(op, "variant", variant, VARIANTS)
    check_tensor(op, "a", a, FLOAT_DTYPES)
    check_operand(op, "b", b, "a", a)
    return matmul_fwd(a, b, path=variant)


# The family's public functions: tritonkit.__all__ and tritonkit.functional derive from these.
__all__ = ["int8_matmul", "linear", "matmul", "scaled_matmul"]
