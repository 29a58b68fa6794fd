"""Block-sparse (BSR) times dense on the tensor cores: a grouped GEMM over the stored blocks.

A program takes one block row (R rows of the output) and BLOCK_N columns, and runs one
``tl.dot`` per stored block of its row: the R x C block times the C rows of B that the block's
column selects (a dense tile), accumulated in float32. Empty block rows write zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton.language as tl

from tritonkit.ops._core.device import interpreter_enabled, sm_count
from tritonkit.ops._core.gemm import mac
from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.layout import cdiv
from tritonkit.ops._core.plan import PLANS, current_env
from tritonkit.ops._core.registry import define_op, eager_direct
from tritonkit.ops.sparse.config import BsrConfig


@kernel
def bsr_mm_kernel(
    crow_ptr,  # (M / R + 1,) block-row pointers
    col_ptr,  # (nnz_blocks,) block column of each block
    val_ptr,  # (nnz_blocks, R, C) blocks, contiguous
    b_ptr,  # (K, N) dense, strides stride_bk, stride_bn
    c_ptr,  # (M, N) output, contiguous
    N,
    stride_bk,
    stride_bn,
    R: tl.constexpr,
    C: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,  # float32 blocks: "ieee" or "tf32"; 16-bit: None
    UPCAST: tl.constexpr,  # operands to fp32 first (the interpreter's bf16 dot is wrong)
):
    pid_m = tl.program_id(0)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    rm = tl.arange(0, R)
    rk = tl.arange(0, C)
    lo = tl.load(crow_ptr + pid_m).to(tl.int64)
    hi = tl.load(crow_ptr + pid_m + 1).to(tl.int64)
    acc = tl.zeros((R, BLOCK_N), dtype=tl.float32)
    for i in range(lo, hi):
        bc = tl.load(col_ptr + i).to(tl.int64)
        a = tl.load(val_ptr + i * (R * C) + rm[:, None] * C + rk[None, :])
        b = tl.load(
            b_ptr + (bc * C + rk)[:, None] * stride_bk + rn[None, :] * stride_bn,
            mask=nmask[None, :],
            other=0.0,
        )
        acc = mac(a, b, acc, True, PRECISION, None, UPCAST)
    rows = pid_m.to(tl.int64) * R + rm
    tl.store(
        c_ptr + rows[:, None] * N + rn[None, :],
        acc.to(c_ptr.dtype.element_ty),
        mask=nmask[None, :],
    )


@dataclass(frozen=True)
class BsrPlan:
    """bsr_mm's decisions: the config, tl.dot's precision, the interpreter's upcast."""

    config: BsrConfig
    precision: str | None
    upcast: bool


def bsr_plan(m: int, n: int, blocksize: tuple, dtype: torch.dtype, device: torch.device):
    env = current_env()
    key = ("sparse.bsr_mm", m, n, blocksize, dtype, device)

    def build() -> BsrPlan:
        cfg = BsrConfig.heuristic(m // blocksize[0], blocksize[0], n, sm_count(device))
        # float32 follows PyTorch's switch for its own float32 products.
        precision = None  # 16-bit operands: the tensor cores' own product
        if dtype == torch.float32:
            precision = "tf32" if env.tf32 and device.type == "cuda" else "ieee"
        return BsrPlan(cfg, precision, interpreter_enabled() and dtype == torch.bfloat16)

    return PLANS.get(key, env, build)


def bsr_mm_fwd(
    crow: torch.Tensor,
    col: torch.Tensor,
    val: torch.Tensor,
    b: torch.Tensor,
    n_rows: int,
    config: BsrConfig | None = None,
) -> torch.Tensor:
    """C = A B with A in BSR (``val``: (nnz_blocks, R, C), contiguous) and B dense."""
    r, cb = val.shape[1], val.shape[2]
    n = b.shape[1]
    c = torch.empty((n_rows, n), dtype=val.dtype, device=val.device)
    if c.numel() == 0:
        return c
    plan = bsr_plan(n_rows, n, (r, cb), val.dtype, val.device)
    config = config or plan.config
    bsr_mm_kernel[(n_rows // r, cdiv(n, config.BLOCK_N))](
        crow,
        col,
        val,
        b,
        c,
        n,
        b.stride(0),
        b.stride(1),
        R=r,
        C=cb,
        BLOCK_N=config.BLOCK_N,
        PRECISION=plan.precision,
        UPCAST=plan.upcast,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return c


@define_op("tritonkit::sparse_bsr_mm")
def _bsr_mm_op(
    crow: torch.Tensor, col: torch.Tensor, val: torch.Tensor, b: torch.Tensor, n_rows: int
) -> torch.Tensor:
    return bsr_mm_fwd(crow, col, val, b, n_rows)


@_bsr_mm_op.register_fake
def _(crow, col, val, b, n_rows):
    return val.new_empty((n_rows, b.shape[1]))


call_bsr_mm = eager_direct(_bsr_mm_op)
