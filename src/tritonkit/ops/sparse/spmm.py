"""SpMM, C = A B with A in CSR and B dense: a row kernel and an nnz-split kernel, as SpMV's
(spmv.py), each program holding BLOCK_N columns of B.

Row kernel: a program per (row, BLOCK_N columns); the row's non-zeros BLOCK_K at a time, each
gathering BLOCK_K rows of B (BLOCK_K x BLOCK_N, contiguous along a row of B), accumulated in
float32 as a BLOCK_K x BLOCK_N tile and reduced once at the end.

Split kernel: a program per (chunk of non-zeros, BLOCK_N columns) walks the rows of its chunk
(``CSR.partition``), one at a time; rows cut by chunk boundaries leave float32 partial rows
that the fixup kernel adds in program order (the same bits on every run).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.layout import cdiv
from tritonkit.ops._core.plan import PLANS, current_env
from tritonkit.ops._core.registry import define_op, eager_direct
from tritonkit.ops.sparse.config import ROWS, SpmmConfig


@triton.jit
def _row_times_b(
    col_ptr,
    val_ptr,
    b_ptr,
    lo,
    hi,
    rn,
    nmask,
    stride_v,
    stride_bk,
    stride_bn,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """sum over non-zeros lo:hi of val * B[col, rn]: a fp32 (BLOCK_N,) vector."""
    k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
    for start in range(lo, hi, BLOCK_K):
        offs = start + k
        m = offs < hi
        c = tl.load(col_ptr + offs, mask=m, other=0).to(tl.int64)
        v = tl.load(val_ptr + offs * stride_v, mask=m, other=0.0).to(tl.float32)
        b = tl.load(
            b_ptr + c[:, None] * stride_bk + rn[None, :] * stride_bn,
            mask=m[:, None] & nmask[None, :],
            other=0.0,
        )
        acc += v[:, None] * b.to(tl.float32)
    return tl.sum(acc, axis=0)


@kernel
def spmm_rows_kernel(
    crow_ptr,  # (M + 1,) row pointers
    col_ptr,  # (nnz,) column indices
    val_ptr,  # (nnz,) values, stride stride_v
    b_ptr,  # (K, N) dense, strides stride_bk, stride_bn
    c_ptr,  # (M, N) output, contiguous
    N,
    stride_v,
    stride_bk,
    stride_bn,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    row = (pid // tiles_n).to(tl.int64)
    rn = (pid % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    lo = tl.load(crow_ptr + row).to(tl.int64)
    hi = tl.load(crow_ptr + row + 1).to(tl.int64)
    total = _row_times_b(
        col_ptr,
        val_ptr,
        b_ptr,
        lo,
        hi,
        rn,
        nmask,
        stride_v,
        stride_bk,
        stride_bn,
        BLOCK_K,
        BLOCK_N,
    )
    tl.store(c_ptr + row * N + rn, total.to(c_ptr.dtype.element_ty), mask=nmask)


@kernel
def spmm_split_kernel(
    crow_ptr,  # (M + 1,) row pointers
    col_ptr,  # (nnz,) column indices
    val_ptr,  # (nnz,) values
    b_ptr,  # (K, N) dense
    c_ptr,  # (M, N) output, contiguous
    part_ptr,  # (2 * programs, N) fp32: carry-in and head-out partial rows
    bounds_ptr,  # (programs + 1,) program p owns rows bounds[p]:bounds[p + 1]
    nnz,
    chunk,
    N,
    stride_v,
    stride_bk,
    stride_bn,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    s = pid.to(tl.int64) * chunk
    e = tl.minimum(s + chunk, nnz)
    own0 = tl.load(bounds_ptr + pid).to(tl.int64)
    own1 = tl.load(bounds_ptr + pid + 1).to(tl.int64)
    first = own0 - (pid > 0).to(tl.int64)
    for r in range(first, own1):
        r_end = tl.load(crow_ptr + r + 1).to(tl.int64)
        lo = tl.maximum(tl.load(crow_ptr + r).to(tl.int64), s)
        hi = tl.minimum(r_end, e)
        total = _row_times_b(
            col_ptr,
            val_ptr,
            b_ptr,
            lo,
            hi,
            rn,
            nmask,
            stride_v,
            stride_bk,
            stride_bn,
            BLOCK_K,
            BLOCK_N,
        )
        if r < own0:
            tl.store(part_ptr + (2 * pid).to(tl.int64) * N + rn, total, mask=nmask)
        elif r_end > e:
            tl.store(part_ptr + (2 * pid + 1).to(tl.int64) * N + rn, total, mask=nmask)
        else:
            tl.store(c_ptr + r * N + rn, total.to(c_ptr.dtype.element_ty), mask=nmask)


@kernel
def spmm_fixup_kernel(
    crow_ptr,  # (M + 1,) row pointers
    c_ptr,  # (M, N) output
    part_ptr,  # (2 * programs, N) partial rows of the split kernel
    bounds_ptr,  # (programs + 1,)
    programs,
    chunk,
    N,
    BLOCK_N: tl.constexpr,
):
    p = tl.program_id(0) + 1
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    b = tl.load(bounds_ptr + p)
    r = (b - 1).to(tl.int64)
    first = tl.load(bounds_ptr + p - 1) != b
    if first & (tl.load(crow_ptr + r + 1).to(tl.int64) > p.to(tl.int64) * chunk):
        total = tl.load(part_ptr + (2 * p - 1).to(tl.int64) * N + rn, mask=nmask, other=0.0)
        q = p
        more = q < programs
        while more:
            total += tl.load(part_ptr + (2 * q).to(tl.int64) * N + rn, mask=nmask, other=0.0)
            q += 1
            more = (q < programs) & (tl.load(bounds_ptr + q) == b)
        tl.store(c_ptr + r * N + rn, total.to(c_ptr.dtype.element_ty), mask=nmask)


@dataclass(frozen=True)
class SpmmPlan:
    """spmm's decisions for one problem: the config, the programs along the non-zeros (rows or
    chunks) and along N."""

    config: SpmmConfig
    programs: int
    tiles_n: int


def spmm_plan(n_rows: int, n: int, nnz: int, chunk: int, device: torch.device) -> SpmmPlan:
    """The plan for C = A B with A of n_rows rows holding nnz non-zeros (split in chunks of
    ``chunk``, 0: the row kernel) and B of n columns."""
    key = ("sparse.spmm", n_rows, n, nnz, chunk, device)

    def build() -> SpmmPlan:
        cfg = SpmmConfig.heuristic(n_rows, n, nnz, chunk)
        programs = n_rows if cfg.strategy == ROWS else cdiv(nnz, cfg.chunk)
        return SpmmPlan(cfg, programs, cdiv(n, cfg.BLOCK_N))

    return PLANS.get(key, current_env(), build)


def spmm_fwd(
    crow: torch.Tensor,
    col: torch.Tensor,
    val: torch.Tensor,
    b: torch.Tensor,
    bounds: torch.Tensor,
    chunk: int,
    config: SpmmConfig | None = None,
) -> torch.Tensor:
    """C = A B; with ``chunk`` > 0 the split kernel over ``bounds = CSR.partition(chunk)``."""
    n_rows, nnz = crow.numel() - 1, col.numel()
    n = b.shape[1]
    c = torch.empty((n_rows, n), dtype=val.dtype, device=val.device)
    if c.numel() == 0:
        return c
    if config is None:
        config = spmm_plan(n_rows, n, nnz, chunk, val.device).config
    tiles_n = cdiv(n, config.BLOCK_N)
    meta = dict(BLOCK_K=config.BLOCK_K, BLOCK_N=config.BLOCK_N, num_warps=config.num_warps)
    if config.strategy == ROWS or nnz == 0:
        spmm_rows_kernel[(n_rows * tiles_n,)](
            crow, col, val, b, c, n, val.stride(0), b.stride(0), b.stride(1), **meta
        )
        return c
    programs = cdiv(nnz, config.chunk)
    part = torch.empty((2 * programs, n), dtype=torch.float32, device=val.device)
    spmm_split_kernel[(programs, tiles_n)](
        crow,
        col,
        val,
        b,
        c,
        part,
        bounds,
        nnz,
        config.chunk,
        n,
        val.stride(0),
        b.stride(0),
        b.stride(1),
        **meta,
    )
    if programs > 1:
        spmm_fixup_kernel[(programs - 1, tiles_n)](
            crow,
            c,
            part,
            bounds,
            programs,
            config.chunk,
            n,
            BLOCK_N=config.BLOCK_N,
            num_warps=4,
        )
    return c


@define_op("tritonkit::sparse_spmm")
def _spmm_op(
    crow: torch.Tensor,
    col: torch.Tensor,
    val: torch.Tensor,
    b: torch.Tensor,
    bounds: torch.Tensor,
    chunk: int,
) -> torch.Tensor:
    return spmm_fwd(crow, col, val, b, bounds, chunk)


@_spmm_op.register_fake
def _(crow, col, val, b, bounds, chunk):
    return val.new_empty((crow.shape[0] - 1, b.shape[1]))


call_spmm = eager_direct(_spmm_op)
