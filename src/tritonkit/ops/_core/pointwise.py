"""The bias + activation tiles shared by three families: ``act(x + bias)`` and its backward,
where the bias is absent (relu, gelu, silu; memory's copy), one row broadcast over every row of
``x`` (bias_act, add with a broadcast operand) or a second operand shaped like ``x`` (add),
and the backward pass of linear's epilogue (``dZ = dY * act'(Z)`` and the bias gradient in one
read); and the first pass of a plain column sum. Their launchers are in ``bias_act``.

ReLU keeps, for its backward pass, one bit per element (was the input positive?) instead of a
copy of the input or output: 16x less activation memory in bf16, and a backward pass that reads
2.125 bytes per element instead of 4.

Every kernel works on "rows": a tensor seen as ``n_rows x n_cols`` with unit column stride and
a row stride, so contiguous tensors, permuted-dense tensors and row-sliced views such as
``proj.chunk(2, dim=-1)`` are read in place without a copy (see ``layout.elementwise_rows``).
Arithmetic is fp32 whatever the storage dtype; each output is rounded once.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.math import ACT_NONE, ACT_RELU, act, act_grad


@triton.jit
def tile_ids(pid, n_cols, BLOCK_N: tl.constexpr, INT64: tl.constexpr):
    """(row block, column block) of program ``pid``; tiles in row-major order."""
    num_pid_n = tl.cdiv(n_cols, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    if INT64:  # offsets past 2**31 elements: 64-bit index arithmetic, only when needed
        pid_m = pid_m.to(tl.int64)
        pid_n = pid_n.to(tl.int64)
    return pid_m, pid_n


@triton.jit
def tile(n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INT64: tl.constexpr):
    """This program's tile: its column block, row and column indices, and the bounds mask."""
    pid_m, pid_n = tile_ids(tl.program_id(0), n_cols, BLOCK_N, INT64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    return pid_n, rows, cols, mask


@kernel
def bias_act_fwd_kernel(
    x_ptr,  # input rows, unit column stride
    b_ptr,  # bias: one row broadcast over all rows, or rows shaped like x; unused without bias
    y_ptr,  # output rows
    mask_ptr,  # uint8 [n_rows, ceil(n_cols / 8)]: relu's bits (x + b > 0), when STORE_MASK
    n_rows,  # rows of x
    n_cols,  # elements per row
    stride_xm,  # elements between rows of x
    stride_bm,  # elements between rows of the bias (when it is not a single broadcast row)
    stride_ym,  # elements between rows of y
    stride_mm,  # bytes between rows of the mask
    ACT: tl.constexpr,  # activation code
    HAS_BIAS: tl.constexpr,
    BIAS_IS_ROW: tl.constexpr,  # load the bias tile once and reuse it for every row of the tile
    STORE_MASK: tl.constexpr,
    PHI16: tl.constexpr,  # GELU: y has 16 bits, Phi from gelu_q16
    INT64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_n, rows, cols, mask = tile(n_rows, n_cols, BLOCK_M, BLOCK_N, INT64)
    # No eviction hints: evict_first lost bandwidth here (see docs/performance.md).
    z = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask).to(tl.float32)
    if HAS_BIAS:
        if BIAS_IS_ROW:
            b = tl.load(b_ptr + cols, mask=cols < n_cols)
            z += b.to(tl.float32)[None, :]
        else:
            b = tl.load(b_ptr + rows[:, None] * stride_bm + cols[None, :], mask=mask)
            z += b.to(tl.float32)
    y = act(z, ACT, PHI16)
    tl.store(
        y_ptr + rows[:, None] * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask
    )
    if STORE_MASK:
        # Eight elements to a byte, element 8k + j in bit j of byte k of its row.
        bits = tl.where(mask & (z > 0.0), 1, 0)
        bits = tl.reshape(bits, [BLOCK_M, BLOCK_N // 8, 8])
        packed = tl.sum(bits << tl.arange(0, 8)[None, None, :], axis=2)
        byte_cols = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
        byte_mask = (rows < n_rows)[:, None] & (byte_cols < tl.cdiv(n_cols, 8))[None, :]
        tl.store(
            mask_ptr + rows[:, None] * stride_mm + byte_cols[None, :],
            packed.to(tl.uint8),
            mask=byte_mask,
        )


@kernel
def bias_act_bwd_kernel(
    dy_ptr,  # upstream gradient rows
    x_ptr,  # forward input rows (unused when ACT is none or FROM_MASK)
    b_ptr,  # forward bias, as in the forward kernel
    mask_ptr,  # relu's bits from the forward kernel, when FROM_MASK
    dx_ptr,  # gradient of x (written when STORE_DX)
    dbias_partial_ptr,  # fp32 [row_groups, n_cols]: per-row-group column sums of dz
    n_rows,
    n_cols,
    rows_per_program,  # rows each program walks (a multiple of BLOCK_M)
    stride_dym,
    stride_xm,
    stride_bm,
    stride_mm,
    stride_dxm,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BIAS_IS_ROW: tl.constexpr,
    FROM_MASK: tl.constexpr,  # relu: the gradient passes where the forward stored a 1 bit
    STORE_DX: tl.constexpr,
    BIAS_PARTIALS: tl.constexpr,  # accumulate column sums of dz (the broadcast bias's gradient)
    INT64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    STAGES: tl.constexpr,  # > 1: the loop's loads pipelined through shared memory (cp.async)
):
    # Program (row group, column block) walks rows_per_program rows of its columns; the bias
    # gradient's column sums stay in registers and one partial row per group reaches memory.
    pid_g, pid_n = tile_ids(tl.program_id(0), n_cols, BLOCK_N, INT64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    if HAS_BIAS and BIAS_IS_ROW and ACT != ACT_NONE and not FROM_MASK:
        b_row = tl.load(b_ptr + cols, mask=col_mask).to(tl.float32)
    # One partial sum per column: the tile's rows sit in the same thread (TileConfig.
    # for_row_sums), so each iteration's sum over them is register adds, and BLOCK_M can grow
    # (more 16-byte loads in flight per thread) without a register per row and column.
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    row_start = pid_g * rows_per_program
    for r in tl.range(0, rows_per_program, BLOCK_M, num_stages=STAGES):
        rows = row_start + r + tl.arange(0, BLOCK_M)
        mask = (rows < n_rows)[:, None] & col_mask[None, :]
        dy = tl.load(dy_ptr + rows[:, None] * stride_dym + cols[None, :], mask=mask, other=0.0)
        dy = dy.to(tl.float32)
        if FROM_MASK:
            # One byte per 8 elements, loaded as its own tile and unpacked in registers (a byte
            # load per element made the LSU, not DRAM, the limit).
            byte_cols = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
            byte_mask = (rows < n_rows)[:, None] & (byte_cols < tl.cdiv(n_cols, 8))[None, :]
            packed = tl.load(
                mask_ptr + rows[:, None] * stride_mm + byte_cols[None, :], mask=byte_mask, other=0
            ).to(tl.int32)
            bits = (packed[:, :, None] >> tl.arange(0, 8)[None, None, :]) & 1
            on = tl.reshape(bits, [BLOCK_M, BLOCK_N]) != 0
            dz = tl.where(on, dy, 0.0)
        elif ACT != ACT_NONE:
            z = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0)
            z = z.to(tl.float32)
            if HAS_BIAS:
                if BIAS_IS_ROW:
                    z += b_row[None, :]
                else:
                    b = tl.load(
                        b_ptr + rows[:, None] * stride_bm + cols[None, :], mask=mask, other=0.0
                    )
                    z += b.to(tl.float32)
            if ACT == ACT_RELU:
                dz = tl.where(z > 0.0, dy, 0.0)  # as threshold_backward: NaN upstream stays out
            else:
                dz = dy * act_grad(z, ACT)
        else:
            dz = dy
        if STORE_DX:
            tl.store(
                dx_ptr + rows[:, None] * stride_dxm + cols[None, :],
                dz.to(dx_ptr.dtype.element_ty),
                mask=mask,
            )
        if BIAS_PARTIALS:
            acc += tl.sum(tl.where(mask, dz, 0.0), axis=0)
    if BIAS_PARTIALS:
        tl.store(dbias_partial_ptr + pid_g * n_cols + cols, acc, mask=col_mask)


@kernel
def colsum_split_kernel(
    x_ptr,  # rows to sum, unit column stride
    partial_ptr,  # fp32 [splits, n_cols]: one partial row per row split
    n_rows,
    n_cols,
    rows_per_split,  # a multiple of BLOCK_M
    stride_xm,
    EVICT: tl.constexpr,  # L2 policy of the loads ("" or "evict_first": read once)
    INT64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # First pass of a plain column sum: program (column block, row split) keeps a tile of
    # per-lane sums and reduces it across its rows once, after the loop (small tiles, many
    # programs in flight: the split reduction torch.compile generates for this sum).
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    if INT64:
        pid_n = pid_n.to(tl.int64)
        pid_s = pid_s.to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    row_start = pid_s * rows_per_split
    for r in range(0, rows_per_split, BLOCK_M):
        rows = row_start + r + tl.arange(0, BLOCK_M)
        mask = (rows < n_rows)[:, None] & col_mask[None, :]
        ptrs = x_ptr + rows[:, None] * stride_xm + cols[None, :]
        acc += tl.load(ptrs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    tl.store(partial_ptr + pid_s * n_cols + cols, tl.sum(acc, axis=0), mask=col_mask)
