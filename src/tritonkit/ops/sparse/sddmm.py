"""SDDMM: the product of two dense matrices sampled at a sparsity pattern,
``out[k] = beta * input[k] + alpha * dot(mat1[row_k, :], mat2[:, col_k])``.

A program takes BLOCK non-zeros (their rows and columns, read contiguously) and walks the inner
dimension BLOCK_K at a time, gathering a BLOCK x BLOCK_K tile from each dense operand: row_k of
mat1 and column col_k of mat2 (contiguous where mat2 is stored K-major, as the gradient of
spmm's values reads B; a row-major mat2 is copied to K-major once per call where that moves
fewer bytes than its strided gathers).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.layout import cdiv
from tritonkit.ops._core.plan import PLANS, current_env
from tritonkit.ops._core.registry import define_op, eager_direct
from tritonkit.ops.sparse.config import SddmmConfig


@kernel
def sddmm_kernel(
    row_ptr,  # (nnz,) row of each non-zero
    col_ptr,  # (nnz,) column of each non-zero
    in_ptr,  # (nnz,) input values (read when HAS_INPUT), stride stride_in
    a_ptr,  # (M, K) mat1, strides stride_am, stride_ak
    b_ptr,  # (K, N) mat2, strides stride_bk, stride_bn
    out_ptr,  # (nnz,) output values
    nnz,
    K,
    stride_in,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    beta,
    alpha,
    HAS_INPUT: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < nnz
    r = tl.load(row_ptr + offs, mask=m, other=0).to(tl.int64)
    c = tl.load(col_ptr + offs, mask=m, other=0).to(tl.int64)
    kk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + kk
        mk = m[:, None] & (ks < K)[None, :]
        a = tl.load(a_ptr + r[:, None] * stride_am + ks[None, :] * stride_ak, mask=mk, other=0.0)
        b = tl.load(b_ptr + ks[None, :] * stride_bk + c[:, None] * stride_bn, mask=mk, other=0.0)
        acc += a.to(tl.float32) * b.to(tl.float32)
    out = alpha * tl.sum(acc, axis=1)
    if HAS_INPUT:
        out += beta * tl.load(in_ptr + offs * stride_in, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=m)


@dataclass(frozen=True)
class SddmmPlan:
    """sddmm's decisions: the config, and whether mat2 is copied K-major first."""

    config: SddmmConfig
    copy_mat2: bool


def sddmm_plan(nnz: int, k: int, n: int, mat2_stride: tuple, device: torch.device) -> SddmmPlan:
    key = ("sparse.sddmm", nnz, k, n, mat2_stride, device)

    def build() -> SddmmPlan:
        # A strided gather reads a 32-byte sector per element: once nnz * K exceeds a copy's
        # few passes over mat2, copying it K-major is cheaper.
        copy = k > 1 and mat2_stride[0] != 1 and nnz * k > 4 * k * n
        return SddmmPlan(SddmmConfig.heuristic(nnz, k), copy)

    return PLANS.get(key, current_env(), build)


def sddmm_fwd(
    rows: torch.Tensor,
    col: torch.Tensor,
    inp: torch.Tensor,
    mat1: torch.Tensor,
    mat2: torch.Tensor,
    beta: float,
    alpha: float,
    config: SddmmConfig | None = None,
) -> torch.Tensor:
    """The values of ``beta * input + alpha * (mat1 @ mat2)`` at the pattern (rows, col)."""
    nnz, k = col.numel(), mat1.shape[1]
    out = torch.empty(nnz, dtype=mat1.dtype, device=mat1.device)
    if nnz == 0:
        return out
    plan = sddmm_plan(nnz, k, mat2.shape[1], tuple(mat2.stride()), mat1.device)
    config = config or plan.config
    if plan.copy_mat2:
        mat2 = mat2.t().contiguous().t()
    sddmm_kernel[(cdiv(nnz, config.BLOCK),)](
        rows,
        col,
        inp,
        mat1,
        mat2,
        out,
        nnz,
        k,
        inp.stride(0),
        mat1.stride(0),
        mat1.stride(1),
        mat2.stride(0),
        mat2.stride(1),
        beta,
        alpha,
        HAS_INPUT=beta != 0,
        BLOCK=config.BLOCK,
        BLOCK_K=config.BLOCK_K,
        num_warps=config.num_warps,
    )
    return out


@define_op("tritonkit::sparse_sddmm")
def _sddmm_op(
    rows: torch.Tensor,
    col: torch.Tensor,
    inp: torch.Tensor,
    mat1: torch.Tensor,
    mat2: torch.Tensor,
    beta: float,
    alpha: float,
) -> torch.Tensor:
    return sddmm_fwd(rows, col, inp, mat1, mat2, beta, alpha)


@_sddmm_op.register_fake
def _(rows, col, inp, mat1, mat2, beta, alpha):
    return mat1.new_empty((col.shape[0],))


call_sddmm = eager_direct(_sddmm_op)
