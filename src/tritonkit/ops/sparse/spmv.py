"""SpMV, y = A x over CSR: a row kernel for even rows, an nnz-split kernel for skewed ones.

Row kernel: a program takes ROWS consecutive rows and walks their non-zeros BLOCK at a time as a
ROWS x BLOCK tile (columns and values read contiguously, x gathered), as many steps as its
longest row needs.

Split kernel (merge-path style): program ``p`` takes non-zeros ``[p * chunk, (p + 1) *
chunk)``, whatever rows they belong to (``CSR.partition``: the rows starting in each chunk,
found once by a device search over the row pointers), TILE at a time: every lane a non-zero,
its row found by a binary search over the chunk's few row pointers, the products summed per
row by a segmented scan, each row's sum stored by its last lane. Short and long rows cost the
same per non-zero. A row cut by chunk boundaries leaves float32 partial sums (its owner's head
and each later program's carry); the fixup kernel adds them in program order, so the result
is the same bits on every run (no atomics).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tritonkit.ops._core.device import sm_count
from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.layout import cdiv
from tritonkit.ops._core.plan import PLANS, current_env
from tritonkit.ops._core.registry import define_op, eager_direct
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
        # The matrix streams through once; x is gathered again and again: kept in L2.
        c = tl.load(col_ptr + offs, mask=m, other=0, eviction_policy="evict_first").to(tl.int64)
        v = tl.load(val_ptr + offs * stride_v, mask=m, other=0.0, eviction_policy="evict_first")
        xv = tl.load(x_ptr + c * stride_x, mask=m, other=0.0, eviction_policy="evict_last")
        acc += v.to(tl.float32) * xv.to(tl.float32)
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


@triton.jit
def _segmented_add(v1, f1, v2, f2):
    """Combine of a segmented inclusive sum: f marks the first element of a segment."""
    return tl.where(f2 != 0, v2, v1 + v2), f1 | f2


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
    TILE: tl.constexpr,  # non-zeros per step
):
    pid = tl.program_id(0)
    s = pid.to(tl.int64) * chunk
    e = tl.minimum(s + chunk, nnz)
    own0 = tl.load(bounds_ptr + pid).to(tl.int64)
    own1 = tl.load(bounds_ptr + pid + 1).to(tl.int64)
    first = own0 - (pid > 0).to(tl.int64)  # the row carried in from the previous chunk
    lane = tl.arange(0, TILE)
    # Empty rows own no non-zero: written here.
    for g in range(own0, own1, TILE):
        rows = g + lane
        rm = rows < own1
        start = tl.load(crow_ptr + rows, mask=rm, other=0)
        end = tl.load(crow_ptr + rows + 1, mask=rm, other=0)
        tl.store(y_ptr + rows, tl.zeros((TILE,), y_ptr.dtype.element_ty), mask=rm & (start == end))
    # Binary search steps over the chunk's rows first..own1 (crow[own1] >= e).
    steps = tl.zeros((), tl.int32)  # a tensor: loop-carried through the while below
    width = own1 - first
    while width > 1:
        width = (width + 1) // 2
        steps += 1
    carry_val = tl.zeros((), tl.float32)  # a row running on from the previous tile
    carry_row = tl.full((), -1, tl.int64)
    carried = tl.zeros((), tl.float32)  # the carry-in row's sum over this chunk
    head = tl.zeros((), tl.float32)  # the sum of a last row that runs past the chunk
    for t in range(s, e, TILE):
        j = t + lane
        m = j < e
        c = tl.load(col_ptr + j, mask=m, other=0, eviction_policy="evict_first").to(tl.int64)
        v = tl.load(val_ptr + j * stride_v, mask=m, other=0.0, eviction_policy="evict_first")
        xv = tl.load(x_ptr + c * stride_x, mask=m, other=0.0, eviction_policy="evict_last")
        prod = v.to(tl.float32) * xv.to(tl.float32)
        # Each lane's row: the last row starting at or before it.
        lo = tl.full((TILE,), 0, tl.int64) + first
        hi = tl.full((TILE,), 0, tl.int64) + own1
        for _ in range(steps):
            open_ = hi - lo > 1
            mid = (lo + hi) // 2
            at_or_before = tl.load(crow_ptr + mid, mask=m & open_, other=0).to(tl.int64) <= j
            lo = tl.where(open_ & at_or_before, mid, lo)
            hi = tl.where(open_ & ~at_or_before, mid, hi)
        r_start = tl.load(crow_ptr + lo, mask=m, other=0).to(tl.int64)
        r_end = tl.load(crow_ptr + lo + 1, mask=m, other=0).to(tl.int64)
        starts = (j == tl.maximum(r_start, t)).to(tl.int32)
        total, _ = tl.associative_scan((prod, starts), 0, _segmented_add)
        total += tl.where(lo == carry_row, carry_val, 0.0)
        ends_here = m & (j == tl.minimum(r_end, e) - 1)  # the row's last non-zero here
        is_carry = lo < own0
        is_head = (~is_carry) & (r_end > e)
        tl.store(
            y_ptr + lo,
            total.to(y_ptr.dtype.element_ty),
            mask=ends_here & ~is_carry & ~is_head,
        )
        carried += tl.sum(tl.where(ends_here & is_carry, total, 0.0), axis=0)
        head += tl.sum(tl.where(ends_here & is_head, total, 0.0), axis=0)
        # The tile's last lane, if its row goes on: carried into the next tile.
        last = m & (lane == TILE - 1) & ~ends_here
        carry_val = tl.sum(tl.where(last, total, 0.0), axis=0)
        carry_row = tl.max(tl.where(last, lo, -1), axis=0)
    if pid > 0:
        tl.store(part_ptr + 2 * pid, carried)
    tl.store(part_ptr + 2 * pid + 1, head)


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

    return PLANS.get(key, current_env(), build)


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
        TILE=config.ROWS * config.BLOCK,
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
