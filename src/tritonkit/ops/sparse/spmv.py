"""SpMV, y = A x over CSR: a row kernel for even rows, an nnz-split kernel for skewed ones.

Row kernel: a program takes ROWS consecutive rows and walks their non-zeros BLOCK at a time as a
ROWS x BLOCK tile (columns and values read contiguously, x gathered), as many steps as its
longest row needs.

Split kernel: program ``p`` takes non-zeros ``[p * chunk, (p + 1) * chunk)``, whatever rows
they belong to (``CSR.partition``: the rows starting in each chunk, found by a device search
over the row pointers). It walks the row it starts inside of (its carry) and the rows it owns
as the row kernel does, clipped to its chunk; a chunk inside one long row takes the whole
ROWS x BLOCK width for that row. A row cut by chunk boundaries leaves float32 partial sums (its
owner's head and each later program's carry); the fixup kernel adds them in program order, so
the result is the same bits on every run (no atomics).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tritonkit.ops._core.device import sm_count
from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.layout import cdiv
from tritonkit.ops._core.registry import define_op, eager_direct
from tritonkit.ops.sparse._plan_stub import PLANS, current_env
from tritonkit.ops.sparse.config import ROWS, SpmvConfig


@triton.jit
def _row_tile_sum(
    crow_ptr,
    col_ptr,
    val_ptr,
    x_ptr,
    rows,
    rmask,
    s,
    e,
    stride_v,
    stride_x,
    BLOCK: tl.constexpr,
):
    """Sum of val * x[col] over each row's non-zeros clipped to [s, e): a fp32 vector."""
    lo = tl.maximum(tl.load(crow_ptr + rows, mask=rmask, other=0).to(tl.int64), s)
    hi = tl.minimum(tl.load(crow_ptr + rows + 1, mask=rmask, other=0).to(tl.int64), e)
    hi = tl.where(rmask, hi, lo)
    steps = tl.cdiv(tl.max(hi - lo, 0), BLOCK)
    k = tl.arange(0, BLOCK)
    acc = tl.zeros((rows.shape[0], BLOCK), dtype=tl.float32)
    for i in range(steps):
        offs = lo[:, None] + i * BLOCK + k[None, :]
        m = offs < hi[:, None]
        c = tl.load(col_ptr + offs, mask=m, other=0).to(tl.int64)
        v = tl.load(val_ptr + offs * stride_v, mask=m, other=0.0).to(tl.float32)
        xv = tl.load(x_ptr + c * stride_x, mask=m, other=0.0).to(tl.float32)
        acc += v * xv
    return tl.sum(acc, axis=1)


@kernel
def spmv_rows_kernel(
    crow_ptr,  # (n_rows + 1,) row pointers
    col_ptr,  # (nnz,) column indices
    val_ptr,  # (nnz,) values, stride stride_v
    x_ptr,  # (n_cols,) dense vector, stride stride_x
    y_ptr,  # (n_rows,) output
    n_rows,
    nnz,
    stride_v,
    stride_x,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    rmask = rows < n_rows
    total = _row_tile_sum(
        crow_ptr, col_ptr, val_ptr, x_ptr, rows, rmask, 0, nnz, stride_v, stride_x, BLOCK
    )
    tl.store(y_ptr + rows, total.to(y_ptr.dtype.element_ty), mask=rmask)


@kernel
def spmv_split_kernel(
    crow_ptr,  # (n_rows + 1,) row pointers
    col_ptr,  # (nnz,) column indices
    val_ptr,  # (nnz,) values
    x_ptr,  # (n_cols,) dense vector
    y_ptr,  # (n_rows,) output
    part_ptr,  # (2 * programs,) fp32: each program's carry-in and head-out partial sums
    bounds_ptr,  # (programs + 1,) program p owns rows bounds[p]:bounds[p + 1]
    nnz,
    chunk,  # non-zeros per program
    stride_v,
    stride_x,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    s = pid.to(tl.int64) * chunk
    e = tl.minimum(s + chunk, nnz)
    own0 = tl.load(bounds_ptr + pid).to(tl.int64)
    own1 = tl.load(bounds_ptr + pid + 1).to(tl.int64)
    first = own0 - (pid > 0).to(tl.int64)  # the row carried in from the previous chunk
    n_rows_here = own1 - first
    if n_rows_here == 1:
        # One row: the whole tile width on it (a chunk inside a long row).
        r = first
        lo = tl.maximum(tl.load(crow_ptr + r).to(tl.int64), s)
        r_end = tl.load(crow_ptr + r + 1).to(tl.int64)
        hi = tl.minimum(r_end, e)
        k = tl.arange(0, ROWS * BLOCK)
        acc = tl.zeros((ROWS * BLOCK,), dtype=tl.float32)
        for start in range(lo, hi, ROWS * BLOCK):
            offs = start + k
            m = offs < hi
            c = tl.load(col_ptr + offs, mask=m, other=0).to(tl.int64)
            v = tl.load(val_ptr + offs * stride_v, mask=m, other=0.0).to(tl.float32)
            acc += v * tl.load(x_ptr + c * stride_x, mask=m, other=0.0).to(tl.float32)
        total = tl.sum(acc, axis=0)
        if r < own0:
            tl.store(part_ptr + 2 * pid, total)
        elif r_end > e:
            tl.store(part_ptr + 2 * pid + 1, total)
        else:
            tl.store(y_ptr + r, total.to(y_ptr.dtype.element_ty))
    else:
        for g in range(0, n_rows_here, ROWS):
            rows = first + g + tl.arange(0, ROWS)
            rmask = rows < own1
            total = _row_tile_sum(
                crow_ptr, col_ptr, val_ptr, x_ptr, rows, rmask, s, e, stride_v, stride_x, BLOCK
            )
            r_end = tl.load(crow_ptr + rows + 1, mask=rmask, other=0).to(tl.int64)
            carry = rows < own0
            head = (~carry) & (r_end > e)
            tl.store(y_ptr + rows, total.to(y_ptr.dtype.element_ty), mask=rmask & ~carry & ~head)
            slot = 2 * pid + tl.where(carry, 0, 1)
            tl.store(part_ptr + slot, total, mask=rmask & (carry | head))


@kernel
def spmv_fixup_kernel(
    crow_ptr,  # (n_rows + 1,) row pointers
    y_ptr,  # (n_rows,) output
    part_ptr,  # (2 * programs,) partial sums of the split kernel
    bounds_ptr,  # (programs + 1,)
    programs,
    chunk,
):
    # Program p >= 1 finishes the row it carries in, if it is the first to carry that row:
    # the owner's head (program p - 1) plus every carry, in program order.
    p = tl.program_id(0) + 1
    b = tl.load(bounds_ptr + p)
    r = b - 1
    first = tl.load(bounds_ptr + p - 1) != b
    if first & (tl.load(crow_ptr + r + 1).to(tl.int64) > p.to(tl.int64) * chunk):
        total = tl.load(part_ptr + 2 * p - 1)
        q = p
        more = q < programs
        while more:
            total += tl.load(part_ptr + 2 * q)
            q += 1
            more = (q < programs) & (tl.load(bounds_ptr + q) == b)
        tl.store(y_ptr + r, total.to(y_ptr.dtype.element_ty))


@dataclass(frozen=True)
class SpmvPlan:
    """spmv's decisions for one problem: the config, the programs of its launch."""

    config: SpmvConfig
    programs: int


def spmv_plan(n_rows: int, nnz: int, chunk: int, device: torch.device) -> SpmvPlan:
    """The plan for y = A x with A of n_rows rows holding nnz non-zeros, split in chunks of
    ``chunk`` (``config.split_chunk``; 0: the row kernel)."""
    key = ("sparse.spmv", n_rows, nnz, chunk, device)

    def build() -> SpmvPlan:
        cfg = SpmvConfig.heuristic(n_rows, nnz, chunk, sm_count(device))
        if cfg.strategy == ROWS:
            return SpmvPlan(cfg, cdiv(n_rows, cfg.ROWS))
        return SpmvPlan(cfg, cdiv(nnz, cfg.chunk))

    return PLANS.get(key, current_env(device.type), build)


def spmv_fwd(
    crow: torch.Tensor,
    col: torch.Tensor,
    val: torch.Tensor,
    x: torch.Tensor,
    bounds: torch.Tensor,
    chunk: int,
    config: SpmvConfig | None = None,
) -> torch.Tensor:
    """y = A x; with ``chunk`` > 0 the split kernel over ``bounds = CSR.partition(chunk)``.
    ``config`` forces a config (tests, sweeps) of the same chunk."""
    n_rows, nnz = crow.numel() - 1, col.numel()
    y = torch.empty(n_rows, dtype=val.dtype, device=val.device)
    if n_rows == 0:
        return y
    if config is None:
        plan = spmv_plan(n_rows, nnz, chunk, val.device)
        config, programs = plan.config, plan.programs
    else:
        programs = cdiv(n_rows, config.ROWS) if config.strategy == ROWS else cdiv(nnz, config.chunk)
    if config.strategy == ROWS or nnz == 0:
        spmv_rows_kernel[(cdiv(n_rows, config.ROWS),)](
            crow,
            col,
            val,
            x,
            y,
            n_rows,
            nnz,
            val.stride(0),
            x.stride(0),
            ROWS=config.ROWS,
            BLOCK=config.BLOCK,
            num_warps=config.num_warps,
        )
        return y
    part = torch.empty(2 * programs, dtype=torch.float32, device=val.device)
    spmv_split_kernel[(programs,)](
        crow,
        col,
        val,
        x,
        y,
        part,
        bounds,
        nnz,
        config.chunk,
        val.stride(0),
        x.stride(0),
        ROWS=config.ROWS,
        BLOCK=config.BLOCK,
        num_warps=config.num_warps,
    )
    if programs > 1:
        spmv_fixup_kernel[(programs - 1,)](
            crow, y, part, bounds, programs, config.chunk, num_warps=1
        )
    return y


@define_op("tritonkit::sparse_spmv")
def _spmv_op(
    crow: torch.Tensor,
    col: torch.Tensor,
    val: torch.Tensor,
    x: torch.Tensor,
    bounds: torch.Tensor,
    chunk: int,
) -> torch.Tensor:
    return spmv_fwd(crow, col, val, x, bounds, chunk)


@_spmv_op.register_fake
def _(crow, col, val, x, bounds, chunk):
    return val.new_empty((crow.shape[0] - 1,))


call_spmv = eager_direct(_spmv_op)
