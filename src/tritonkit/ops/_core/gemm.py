"""GEMM building blocks shared by the families that multiply matrices (matmul and linear today;
attention, the optimizers' Newton-Schulz iterations and quantized linear layers next): the tile
order, the K loop over pointers or TMA descriptors, the fp32 promotion of FP8 partial sums,
the epilogue (scales, bias, activation, residual, the saved pre-activation) and one output tile
built from them (``gemm_tile``), plus the host-side description of a GEMM (``Problem``,
``Operand``, ``Epilogue``) and the layout tests that decide whether TMA can read an operand.

Accumulation is fp32 (int32 for INT8 operands); each output is rounded once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tritonkit.ops._core.layout import cdiv, next_power_of_2
from tritonkit.ops._core.math import act
from tritonkit.ops._core.plan import current_env

FP8_DTYPES: tuple[torch.dtype, ...] = (torch.float8_e4m3fn, torch.float8_e5m2)

# Scale layouts of the epilogue (constexpr codes).
SCALE_NONE = 0
SCALE_TENSOR = 1  # one value for the whole operand
SCALE_VECTOR = 2  # one value per row of A / per column of B

# Where the epilogue adds the residual (HAS_RES): after the activation (linear's
# ``act(x @ W^T + b) + r``; True, as the kernels have always been given it) or before it
# (a convolution's ``act(conv + b + r)``, a ResNet block's last layer).
RES_LAST = tl.constexpr(1)
RES_FIRST = tl.constexpr(2)


# ----------------------------------------------------------------------------------------------
# Device helpers
# ----------------------------------------------------------------------------------------------


@triton.jit
def tile_coords(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr):
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
def mac(
    a, b, acc, DOT: tl.constexpr, INPUT_PRECISION: tl.constexpr, MAX_IMPRECISE: tl.constexpr,
    UPCAST: tl.constexpr,
):  # fmt: skip
    """acc += a @ b for one K block.

    UPCAST: the operands in fp32 first. The CPU interpreter computes ``tl.dot`` on bfloat16
    operands wrongly (relative errors of 1e10), and exactly on fp32 ones; launchers set it
    there only, so GPU code is unchanged.
    """
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
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
        # operands: 1e-2 errors where PyTorch computes in full fp32, as seen on the GPU).
        prod = tl.fma(a.to(tl.float32)[:, :, None], b.to(tl.float32)[None, :, :], 0.0)
        acc += tl.sum(prod, axis=1)
    return acc


@triton.jit
def mac_step(
    a, b, acc, part, kb, DOT: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    MAX_IMPRECISE: tl.constexpr, PROMOTE_BLOCKS: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """K block ``kb`` (counted from the loop's first) into the accumulator: ``acc += a @ b``;
    or, with PROMOTE_BLOCKS > 1, into the tensor cores' partial sum ``part``, which is added to
    the fp32 ``acc`` (on the CUDA cores) and restarted after every PROMOTE_BLOCKS blocks."""
    if PROMOTE_BLOCKS > 1:
        part = mac(a, b, part, DOT, INPUT_PRECISION, None, UPCAST)
        if kb % PROMOTE_BLOCKS == PROMOTE_BLOCKS - 1:
            acc += part
            part = tl.zeros_like(part)
    else:
        acc = mac(a, b, acc, DOT, INPUT_PRECISION, MAX_IMPRECISE, UPCAST)
    return acc, part


@triton.jit
def mainloop_ptr(
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
    part,  # the tensor cores' partial sum, when PROMOTE_BLOCKS > 1 (see mac_step)
    DOT: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    MAX_IMPRECISE: tl.constexpr,
    PROMOTE_BLOCKS: tl.constexpr,
    UPCAST: tl.constexpr,
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
        acc, part = mac_step(
            a, b, acc, part, (k - k_lo) // BLOCK_K, DOT, INPUT_PRECISION, MAX_IMPRECISE,
            PROMOTE_BLOCKS, UPCAST,
        )  # fmt: skip
        a_ptrs += step_a
        b_ptrs += step_b
    return acc, part


@triton.jit
def mainloop_tma(
    a_desc,  # descriptor of A [M, K], or of A^T [K, M] when A_T
    b_desc,  # descriptor of B [K, N], or of B^T [N, K] when B_T
    off_m,
    off_n,
    k_lo,
    k_hi,
    acc,
    part,  # the tensor cores' partial sum, when PROMOTE_BLOCKS > 1 (see mac_step)
    A_T: tl.constexpr,  # A is stored M-major (unit stride along M)
    B_T: tl.constexpr,  # B is stored K-major (unit stride along K), like nn.Linear's weight
    DOT: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    MAX_IMPRECISE: tl.constexpr,
    PROMOTE_BLOCKS: tl.constexpr,
    UPCAST: tl.constexpr,
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
        acc, part = mac_step(
            a, b, acc, part, (k - k_lo) // BLOCK_K, DOT, INPUT_PRECISION, MAX_IMPRECISE,
            PROMOTE_BLOCKS, UPCAST,
        )  # fmt: skip
    return acc, part


@triton.jit
def make_descriptors(
    a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
    A_T: tl.constexpr, B_T: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """TMA descriptors of A (or A^T), B (or B^T) and C, made on the device.

    The same descriptors as the host builds (see ``mainloop_tma``), written by each program
    into its global scratch (``tl.make_tensor_descriptor``): no descriptor is encoded on the
    host per call, nor passed as 128 bytes of kernel arguments.
    """
    if A_T:
        a_desc = tl.make_tensor_descriptor(a_ptr, [K, M], [stride_ak, 1], [BLOCK_K, BLOCK_M])
    else:
        a_desc = tl.make_tensor_descriptor(a_ptr, [M, K], [stride_am, 1], [BLOCK_M, BLOCK_K])
    if B_T:
        b_desc = tl.make_tensor_descriptor(b_ptr, [N, K], [stride_bn, 1], [BLOCK_N, BLOCK_K])
    else:
        b_desc = tl.make_tensor_descriptor(b_ptr, [K, N], [stride_bk, 1], [BLOCK_K, BLOCK_N])
    if EPILOGUE_SUBTILE:
        c_desc = tl.make_tensor_descriptor(c_ptr, [M, N], [stride_cm, 1], [BLOCK_M, BLOCK_N // 2])
    else:
        c_desc = tl.make_tensor_descriptor(c_ptr, [M, N], [stride_cm, 1], [BLOCK_M, BLOCK_N])
    return a_desc, b_desc, c_desc


@triton.jit
def epilogue(
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
    SCALE_A: tl.constexpr,  # SCALE_NONE / SCALE_TENSOR / SCALE_VECTOR (per row)
    SCALE_B: tl.constexpr,  # SCALE_NONE / SCALE_TENSOR / SCALE_VECTOR (per column)
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    HAS_RES: tl.constexpr,
    STORE_Z: tl.constexpr,
):
    """((acc * scale_a * scale_b) + bias [-> z]) -> act -> + residual, in fp32.

    The saved pre-activation is ``x @ W^T + b`` rounded once, not the pre-bias product: adding
    the bias to a rounded product again in the backward can flip the sign of a small z whose
    product and bias cancel, and relu's gradient with it.
    """
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
    if HAS_RES == RES_FIRST:
        res = tl.load(res_ptr + rm[:, None] * stride_rm + rn[None, :] * stride_rn, mask=mask)
        acc = acc + res.to(tl.float32)
    acc = act(acc, ACT)
    if HAS_RES == RES_LAST:
        res = tl.load(res_ptr + rm[:, None] * stride_rm + rn[None, :] * stride_rn, mask=mask)
        acc = acc + res.to(tl.float32)
    return acc


@triton.jit
def gemm_tile(
    t, a_ptr, b_ptr, c_ptr, ws_ptr, a_desc, b_desc, c_desc, scale_a_ptr, scale_b_ptr, bias_ptr,
    res_ptr, z_ptr, M, N, K, k_split, plane, batch_inner, stride_ab0, stride_ab1, stride_am,
    stride_ak, stride_bb0, stride_bb1, stride_bk, stride_bn, stride_cb0, stride_cb1, stride_cm,
    stride_cn, stride_sa, stride_sb, stride_bias, stride_rm, stride_rn, stride_zm, stride_zn,
    USE_TMA: tl.constexpr, A_T: tl.constexpr, B_T: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr,
    SPLIT_K: tl.constexpr, DOT: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    MAX_IMPRECISE: tl.constexpr, PROMOTE_BLOCKS: tl.constexpr, UPCAST: tl.constexpr,
    ACC_INT: tl.constexpr, EVEN_K: tl.constexpr, INT64: tl.constexpr, FLOAT_OUT: tl.constexpr,
    SCALE_A: tl.constexpr, SCALE_B: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
    HAS_RES: tl.constexpr, STORE_Z: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """Work item ``t`` (batch entry, K split, output tile, flattened): the K loop, then the
    epilogue and the store, or, with SPLIT_K > 1, the partial tile into the workspace.

    The arguments are those of the matmul family's kernels (ops/matmul/tiled.py says what
    each one is).
    """
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles = tiles_m * tiles_n
    batch = t // (tiles * SPLIT_K)
    r = t % (tiles * SPLIT_K)
    split = r // tiles
    pid_m, pid_n = tile_coords(r % tiles, tiles_m, tiles_n, GROUP_M)
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
    part = tl.zeros_like(acc)  # see mac_step (unused unless PROMOTE_BLOCKS > 1)
    if USE_TMA:
        acc, part = mainloop_tma(
            a_desc, b_desc, off_m, off_n, k_lo, k_hi, acc, part, A_T, B_T, DOT, INPUT_PRECISION,
            MAX_IMPRECISE, PROMOTE_BLOCKS, UPCAST, BLOCK_K,
        )  # fmt: skip
    else:
        acc, part = mainloop_ptr(
            a_ptr + b0 * stride_ab0 + b1 * stride_ab1, b_ptr + b0 * stride_bb0 + b1 * stride_bb1,
            off_m, off_n, k_lo, k_hi, M, N, stride_am, stride_ak, stride_bk, stride_bn, acc, part,
            DOT, INPUT_PRECISION, MAX_IMPRECISE, PROMOTE_BLOCKS, UPCAST, EVEN_K, INT64, BLOCK_M,
            BLOCK_N, BLOCK_K,
        )  # fmt: skip
    if PROMOTE_BLOCKS > 1:
        acc += part  # the blocks after the last promotion
    rm = off_m + tl.arange(0, BLOCK_M)
    rn = off_n + tl.arange(0, BLOCK_N)
    if INT64:
        rm = rm.to(tl.int64)
        rn = rn.to(tl.int64)
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    if SPLIT_K > 1:
        # This K range's partial tile; the split-K reduction sums the splits in a fixed order
        # (deterministic, unlike atomics) and applies the epilogue once.
        if INT64:
            ws = ws_ptr + split.to(tl.int64) * plane
        else:
            ws = ws_ptr + split * plane
        tl.store(ws + rm[:, None] * N + rn[None, :], acc, mask=mask)
    else:
        out = epilogue(
            acc, rm, rn, mask, M, N, scale_a_ptr, scale_b_ptr, bias_ptr, res_ptr, z_ptr,
            stride_sa, stride_sb, stride_bias, stride_rm, stride_rn, stride_zm, stride_zn,
            FLOAT_OUT, SCALE_A, SCALE_B, HAS_BIAS, ACT, HAS_RES, STORE_Z,
        )  # fmt: skip
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


# ----------------------------------------------------------------------------------------------
# Host: a GEMM as pointers, extents and strides
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Operand:
    """A matrix (or batch of them) as its base tensor and (outer, inner, row, col) strides."""

    tensor: torch.Tensor
    strides: tuple[int, int, int, int]


@dataclass(frozen=True)
class Problem:
    """C[b] = A[b] @ B[b] for a batch of ``batch[0] * batch[1]`` matrices."""

    a: Operand
    b: Operand
    c: Operand
    m: int
    n: int
    k: int
    batch: tuple[int, int] = (1, 1)

    @property
    def n_batch(self) -> int:
        return self.batch[0] * self.batch[1]


@dataclass(frozen=True)
class Epilogue:
    """What the kernel applies to the accumulator before storing it (see ``epilogue``)."""

    scale_a: torch.Tensor | None = None
    scale_a_rows: bool = False  # one scale per row (else one for the whole tensor)
    scale_b: torch.Tensor | None = None
    scale_b_cols: bool = False
    bias: torch.Tensor | None = None
    activation: str = "none"
    residual: torch.Tensor | None = None  # [M, N]
    residual_first: bool = False  # added before the activation (RES_FIRST), not after
    z: torch.Tensor | None = None  # [M, N] output of the pre-activation x @ W^T + b

    def res_code(self) -> bool | int:
        """The kernels' HAS_RES: False, True (RES_LAST) or RES_FIRST."""
        if self.residual is None:
            return False
        return RES_FIRST.value if self.residual_first else True

    def tensors(self) -> tuple[torch.Tensor | None, ...]:
        """The epilogue's tensors in the kernels' argument order."""
        return self.scale_a, self.scale_b, self.bias, self.residual, self.z

    def strides(self) -> tuple[int, ...]:
        """The kernels' epilogue strides: scale_a, scale_b, bias, residual (2), z (2)."""
        sa, sb = self.scale_a, self.scale_b
        return (
            sa.stride(0) if sa is not None and sa.dim() else 0,
            sb.stride(0) if sb is not None and sb.dim() else 0,
            self.bias.stride(0) if self.bias is not None else 0,
            *(self.residual.stride() if self.residual is not None else (0, 0)),
            *(self.z.stride() if self.z is not None else (0, 0)),
        )


NO_EPILOGUE = Epilogue()


def matrix(t: torch.Tensor) -> Operand:
    """A 2-D tensor as a one-matrix operand."""
    return Operand(t, (0, 0, t.stride(0), t.stride(1)))


def scale_mode(scale: torch.Tensor | None, vector: bool) -> int:
    if scale is None:
        return SCALE_NONE
    return SCALE_VECTOR if vector else SCALE_TENSOR


def coalesce_batch(
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


def extent(t: torch.Tensor) -> int:
    """One past the largest element offset a view reaches from its data pointer."""
    if t.numel() == 0:
        return 0
    return 1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))


def tma_orientation(t: torch.Tensor, row_major: bool) -> bool:
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


def layout_flags(p: Problem) -> tuple[bool, bool]:
    """(A_T, B_T): A stored M-major, B stored K-major."""
    _, _, s_am, s_ak = p.a.strides
    _, _, s_bk, s_bn = p.b.strides
    return (s_am == 1 and s_ak != 1), (s_bk == 1 and s_bn != 1)


def tf32_enabled() -> bool:
    """Whether PyTorch would use TF32 for a float32 matmul right now: the plan layer's
    snapshot of it (``Env.tf32``), read the same way for every family."""
    return current_env().tf32


def size_class(x: int, step: int = 256, fine_limit: int = 8192) -> int:
    """M or N as an autotuning key holds it: a multiple of ``step`` up to ``fine_limit``, a
    power of 2 above.

    Up to the limit, sizes in one power-of-2 bucket differ in tile count, hence in how full the
    last wave of tiles is, which decides between 128- and 256-wide tiles: a shape between two
    powers of 2 runs slower with the tile tuned at the power of 2 above it than with its own
    (see docs/performance.md). Multiples of 256 give every candidate tile the same count
    within a class. Above the limit every config fills many waves, and power-of-2 buckets keep
    the number of tunings small.
    """
    return cdiv(x, step) * step if x <= fine_limit else next_power_of_2(x)
