"""Elementwise family: activations, the broadcast bias + activation operator, add, and GLUs.

One tiled kernel pair serves most of the family: ``act(x + bias)``, where the bias is either
absent (relu, gelu, silu), one row broadcast over every row of ``x`` (bias_act, add with a
broadcast operand), or a second operand shaped like ``x`` (add). A second pair computes the
gated units ``act(gate) * up`` (swiglu, geglu).

ReLU keeps, for its backward pass, one bit per element (was the input positive?) instead of a
copy of the input or output: 16x less activation memory in bf16, and a backward pass that reads
2.125 bytes per element instead of 4.

Every kernel works on "rows": a tensor seen as ``n_rows x n_cols`` with unit column stride and
a row stride, so contiguous tensors, permuted-dense tensors and row-sliced views such as
``proj.chunk(2, dim=-1)`` are read in place without a copy (see ``_utils.elementwise_rows``).
Arithmetic is fp32 whatever the storage dtype; each output is rounded once.
"""

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tritonkit.ops._core.device import sm_count
from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.layout import (
    Rows,
    as_rows,
    cdiv,
    elementwise_output,
    elementwise_rows,
    next_power_of_2,
)
from tritonkit.ops._core.math import ACT_NONE, ACT_RELU, ACTIVATIONS, act, act_grad
from tritonkit.ops._core.reduce import PartialSumConfig, sum_partials
from tritonkit.ops._core.registry import apply, define_op, eager_direct
from tritonkit.ops._core.validate import check_choice, check_operand, check_same_shape, check_tensor


@triton.jit
def _tile_ids(pid, n_cols, BLOCK_N: tl.constexpr, INT64: tl.constexpr):
    """(row block, column block) of program ``pid``; tiles in row-major order."""
    num_pid_n = tl.cdiv(n_cols, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    if INT64:  # offsets past 2**31 elements: 64-bit index arithmetic, only when needed
        pid_m = pid_m.to(tl.int64)
        pid_n = pid_n.to(tl.int64)
    return pid_m, pid_n


@triton.jit
def _tile(n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INT64: tl.constexpr):
    """This program's tile: its column block, row and column indices, and the bounds mask."""
    pid_m, pid_n = _tile_ids(tl.program_id(0), n_cols, BLOCK_N, INT64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    return pid_n, rows, cols, mask


@kernel
def _bias_act_fwd_kernel(
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
    pid_n, rows, cols, mask = _tile(n_rows, n_cols, BLOCK_M, BLOCK_N, INT64)
    # No eviction hints: evict_first cost 2-3% of bandwidth on an H200 (benchmarks/NOTES.md).
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
def _bias_act_bwd_kernel(
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
    pid_g, pid_n = _tile_ids(tl.program_id(0), n_cols, BLOCK_N, INT64)
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
def _colsum_split_kernel(
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


@kernel
def _glu_fwd_kernel(
    gate_ptr,  # gate rows
    up_ptr,  # up rows
    y_ptr,  # output rows
    n_rows,
    n_cols,
    stride_gm,
    stride_um,
    stride_ym,
    ACT: tl.constexpr,
    PHI16: tl.constexpr,  # GELU: y has 16 bits, Phi from gelu_q16
    INT64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    _, rows, cols, mask = _tile(n_rows, n_cols, BLOCK_M, BLOCK_N, INT64)
    g = tl.load(gate_ptr + rows[:, None] * stride_gm + cols[None, :], mask=mask).to(tl.float32)
    u = tl.load(up_ptr + rows[:, None] * stride_um + cols[None, :], mask=mask).to(tl.float32)
    y = act(g, ACT, PHI16) * u
    tl.store(
        y_ptr + rows[:, None] * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask
    )


@kernel
def _glu_bwd_kernel(
    dy_ptr,
    gate_ptr,
    up_ptr,
    dgate_ptr,
    dup_ptr,
    n_rows,
    n_cols,
    stride_dym,
    stride_gm,
    stride_um,
    stride_dgm,
    stride_dum,
    ACT: tl.constexpr,
    INT64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    _, rows, cols, mask = _tile(n_rows, n_cols, BLOCK_M, BLOCK_N, INT64)
    dy = tl.load(dy_ptr + rows[:, None] * stride_dym + cols[None, :], mask=mask).to(tl.float32)
    g = tl.load(gate_ptr + rows[:, None] * stride_gm + cols[None, :], mask=mask).to(tl.float32)
    u = tl.load(up_ptr + rows[:, None] * stride_um + cols[None, :], mask=mask).to(tl.float32)
    dgate = dy * u * act_grad(g, ACT)
    dup = dy * act(g, ACT)  # _gelu_parts' Phi, shared with act_grad
    dg_ptrs = dgate_ptr + rows[:, None] * stride_dgm + cols[None, :]
    tl.store(dg_ptrs, dgate.to(dgate_ptr.dtype.element_ty), mask=mask)
    tl.store(
        dup_ptr + rows[:, None] * stride_dum + cols[None, :],
        dup.to(dup_ptr.dtype.element_ty),
        mask=mask,
    )


# ----------------------------------------------------------------------------------------------
# Configs: every block size of the family is chosen here.
# ----------------------------------------------------------------------------------------------

# Chosen by benchmarks/sweep_elementwise.py on an H200 (benchmarks/NOTES.md): 2 KiB of each
# tensor per program, one 16-byte vector per thread, matched PyTorch's own vectorized kernels
# (1024 bf16 or 512 fp32 elements, 4 warps); wider tiles left up to 10% of the bandwidth behind.
_TILE_BYTES = 2048
_VECTOR_BYTES = 16
# Activations that cost more arithmetic (GELU, SiLU) give each thread two vectors: more
# independent work in flight (bf16 GELU 3088 -> 3633 GB/s, SiLU 3925 -> 4111).
_HEAVY_VECTORS = 2
# The backward passes (dy and x in, dx out; the GLUs' five tensors), by (activation, element
# size): one vector for SiLU and for fp32, two for GELU in 16 bits, whose derivative is heavier.
# H200 sweep (run 25, benchmarks/NOTES.md), (16384, 8192), ms at one vector vs two: silu bf16
# 0.1836 / 0.1840, fp32 0.3660 / 0.3674; swiglu bf16 0.3097 / 0.3117, fp32 0.6202 / 0.6255;
# gelu fp32 0.3673 / 0.3688; gelu bf16 0.1938 / 0.1882, gelu_tanh bf16 0.1924 / 0.1840.
_BWD_VECTORS: dict[tuple[str, int], int] = {
    ("gelu", 2): 2,
    ("gelu_tanh", 2): 2,
}
# GELU forward with a 16-bit output: Phi from one exp2 of a polynomial (gelu_q16) instead of
# _gelu_parts. False restores the old path (the sweep times both); float32 always uses the old.
_GELU_PHI16 = True
# When a tile spans several rows (a broadcast bias is reused across them), its widest row.
_MAX_BLOCK_N_MULTIROW = 512
_INT32_LIMIT = 2**31


@dataclass(frozen=True)
class RowSumConfig:
    """The bias gradient's two passes: per-row-group partial column sums, then their sum.

    The first pass uses wide, short tiles whose rows all sit in the same thread (one 16-byte
    vector of each row per thread), so the column sums accumulate in registers with no
    cross-thread reduction; each program walks a group of rows and writes one fp32 partial row
    (tall tiles reduced across warps ran at 20-70% of copy bandwidth; this shape at 80-95%,
    benchmarks/NOTES.md). The second pass sums the partial rows in a fixed order
    (``_core.reduce.sum_partials``).
    """

    warps: int  # per first-pass program, whose columns are 32 * warps * 16 bytes wide
    rows: int  # rows per loop iteration: the 16-byte loads each thread has in flight
    programs_per_sm: int  # row groups x column blocks is about this many programs per SM
    stages: int = 1  # > 1: the loop's loads pipelined through shared memory


# By element size: the bias gradient summed beside dx or an activation's gradient (bias_act's
# backward). Chosen by benchmarks/sweep_elementwise.py (run 5, mean of bias_relu, bias_gelu and
# add broadcast): 8 KiB (bf16) / 16 KiB (fp32) per iteration. A plain column sum takes
# ColumnSumConfig.
_ROW_SUMS: dict[int, RowSumConfig] = {
    2: RowSumConfig(warps=8, rows=2, programs_per_sm=4),
    4: RowSumConfig(warps=8, rows=4, programs_per_sm=4),
}


_FINAL_COLUMN_SUMS = PartialSumConfig(
    min_block_n=128, max_block_n=128, max_rows=16, min_warps=4, max_warps=4
)


@dataclass(frozen=True)
class ColumnSumConfig:
    """A plain column sum (add's broadcast gradient, bias_act's without an activation or dx):
    programs of (column block, row split), each summing its rows into a tile of per-lane sums
    reduced once after the loop (_colsum_split_kernel), then the splits' partial rows summed in
    a fixed order (``_core.reduce.sum_partials``)."""

    block_m: int  # rows per loop iteration
    block_n: int  # columns per program
    warps: int
    splits: int  # row splits: partial rows
    evict: str = "evict_first"  # the rows are read once
    # The second pass: up to 16 partial rows x 128 columns per program, 4 warps.
    final: PartialSumConfig = _FINAL_COLUMN_SUMS


# By element size. H200 (benchmarks/NOTES.md, run 30), grad (16384, 8192) bf16: 0.0674 ms with
# 8 x 64 tiles at 4 warps (4 elements per thread) in 16 splits, torch.compile 0.0680 (its own
# split reduction has this shape), the in-thread row sums of _bias_act_bwd_kernel 0.0690;
# 16-row tiles 0.0699, 32 splits 0.0689, 8 splits 0.0681.
_COLUMN_SUMS: dict[int, ColumnSumConfig] = {
    2: ColumnSumConfig(block_m=8, block_n=64, warps=4, splits=16),
    4: ColumnSumConfig(block_m=8, block_n=64, warps=4, splits=16),
}


@dataclass(frozen=True)
class TileConfig:
    """Tile shape and warps for one elementwise launch."""

    BLOCK_M: int
    BLOCK_N: int
    num_warps: int

    @staticmethod
    def for_rows(
        n_rows: int, n_cols: int, elem_size: int, vectors: int = 1, min_block_n: int = 8
    ) -> "TileConfig":
        tile = _TILE_BYTES * vectors // elem_size
        widest = tile if n_rows == 1 else _MAX_BLOCK_N_MULTIROW
        block_n = max(min_block_n, min(next_power_of_2(n_cols), widest))
        block_m = max(1, min(next_power_of_2(n_rows), tile // block_n))
        threads = block_m * block_n * elem_size // (_VECTOR_BYTES * vectors)
        num_warps = min(16, max(4, next_power_of_2(threads // 32)))
        return TileConfig(block_m, block_n, num_warps)

    @staticmethod
    def for_row_sums(n_rows: int, n_cols: int, elem_size: int, rs: RowSumConfig) -> "TileConfig":
        per_warp = 32 * _VECTOR_BYTES // elem_size  # columns of one warp's 16-byte vectors
        block_n = max(8, min(next_power_of_2(n_cols), rs.warps * per_warp))
        # No more warps than the row is wide, or the layout would spread rows across warps and
        # every iteration's row sum would go through shared memory.
        num_warps = max(1, min(rs.warps, block_n // per_warp))
        block_m = max(1, min(next_power_of_2(n_rows), rs.rows))
        return TileConfig(block_m, block_n, num_warps)

    def grid(self, n_rows: int, n_cols: int) -> tuple[int]:
        return (cdiv(n_rows, self.BLOCK_M) * cdiv(n_cols, self.BLOCK_N),)


def _vectors(activation: str) -> int:
    return 1 if activation in ("none", "relu") else _HEAVY_VECTORS


def _bwd_vectors(activation: str, elem_size: int) -> int:
    return _BWD_VECTORS.get((activation, elem_size), 1)


def _phi16(activation: str, out: torch.Tensor) -> bool:
    """Whether a forward GELU computes Phi with gelu_q16 (its output rounded to 16 bits)."""
    return _GELU_PHI16 and activation == "gelu" and out.element_size() == 2


def row_sum_launch(
    n_rows: int, n_cols: int, elem_size: int, rs: RowSumConfig, sms: int
) -> tuple[TileConfig, int, int]:
    """The bias gradient's first pass: (tile, rows per program, row groups = partial rows).

    Row groups x column blocks is about ``rs.programs_per_sm`` programs per SM, one wave when
    that many fit (registers: benchmarks/sweep_gelu_colsum.py reports them).
    """
    cfg = TileConfig.for_row_sums(n_rows, n_cols, elem_size, rs)
    col_blocks = cdiv(n_cols, cfg.BLOCK_N)
    # Programs narrowed to fewer warps (narrow rows) come that many times more per SM.
    per_sm = rs.programs_per_sm * rs.warps // cfg.num_warps
    target = max(1, per_sm * sms // col_blocks)
    groups = max(1, min(cdiv(n_rows, cfg.BLOCK_M), target))
    rows_per_program = cdiv(cdiv(n_rows, groups), cfg.BLOCK_M) * cfg.BLOCK_M
    return cfg, rows_per_program, cdiv(n_rows, rows_per_program)


def _needs_int64(*views: Rows) -> bool:
    """Whether some element of these row views lies 2**31 or more elements from its base."""
    return any((v.n_rows - 1) * v.stride_row + v.n_cols >= _INT32_LIMIT for v in views if v.n_rows)


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------


def column_sum(rows: Rows, out: torch.Tensor) -> None:
    """out[j] = sum over the rows of ``rows`` of column j, in fp32, rounded once to out's dtype.

    Deterministic: each split's partial row is summed in a fixed order, then the splits."""
    cs = _COLUMN_SUMS[rows.tensor.element_size()]
    splits = max(1, min(cs.splits, cdiv(rows.n_rows, cs.block_m)))
    rows_per_split = cdiv(cdiv(rows.n_rows, splits), cs.block_m) * cs.block_m
    splits = cdiv(rows.n_rows, rows_per_split)
    partial = torch.empty((splits, rows.n_cols), dtype=torch.float32, device=out.device)
    _colsum_split_kernel[(cdiv(rows.n_cols, cs.block_n), splits)](
        rows.tensor,
        partial,
        rows.n_rows,
        rows.n_cols,
        rows_per_split,
        rows.stride_row,
        EVICT=cs.evict,
        INT64=_needs_int64(rows),
        BLOCK_M=cs.block_m,
        BLOCK_N=cs.block_n,
        num_warps=cs.warps,
    )
    sum_partials(partial, out, config=cs.final)


def _bias_layout(shape: torch.Size, bias: torch.Tensor | None) -> str:
    """'none', 'full' (bias shaped like x) or 'row' (bias broadcast over x's leading dims)."""
    if bias is None:
        return "none"
    if bias.shape == shape:
        return "full"
    return "row"


def _bias_row(bias: torch.Tensor) -> Rows:
    """A broadcast bias as one unit-stride row (the kernels index it by column alone)."""
    (r,) = as_rows([bias], bias.numel())
    return Rows(r.tensor, 1, r.n_cols, 0)


def _logical_cols(shape: torch.Size, bias: torch.Tensor | None) -> int:
    """Row length of the logical row-major view that relu's bit mask is indexed by."""
    if _bias_layout(shape, bias) == "row":
        return bias.numel()
    return shape[-1] if len(shape) else 1


def _mask_shape(shape: torch.Size, bias: torch.Tensor | None) -> tuple[int, int]:
    numel = math.prod(shape)
    n_cols = _logical_cols(shape, bias)
    return (numel // n_cols if n_cols else 0, cdiv(n_cols, 8))


def bias_act_fwd(
    x: torch.Tensor, bias: torch.Tensor | None, activation: str, save_mask: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``act(x + bias)`` with bias absent, shaped like x, or a suffix of x's shape.

    Returns ``(y, mask)``; with ``save_mask`` (relu only) ``mask`` holds one bit per element
    of ``x + bias > 0`` in logical row-major order, rows of ``_logical_cols``; else it is empty.
    """
    layout = _bias_layout(x.shape, bias)
    operands = [x] if bias is None else [x, bias]
    if layout == "row" or save_mask:
        # Logical row-major rows, so that relu's bits can be found from any gradient's layout.
        n_cols = _logical_cols(x.shape, bias)
        (xr,) = as_rows([x], n_cols)
        br = _bias_row(bias) if layout == "row" else None
        if layout == "full":
            (br,) = as_rows([bias], n_cols)
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        (yr,) = as_rows([y], n_cols)
    else:
        in_rows, (yr,) = elementwise_rows(operands)
        xr = in_rows[0]
        br = in_rows[1] if bias is not None else None
        y = yr.tensor
    mask = torch.empty(
        _mask_shape(x.shape, bias) if save_mask else (0,), dtype=torch.uint8, device=x.device
    )
    if x.numel() == 0:
        return y, mask
    cfg = TileConfig.for_rows(xr.n_rows, xr.n_cols, x.element_size(), _vectors(activation))
    _bias_act_fwd_kernel[cfg.grid(xr.n_rows, xr.n_cols)](
        xr.tensor,
        br.tensor if br is not None else xr.tensor,
        yr.tensor,
        mask,
        xr.n_rows,
        xr.n_cols,
        xr.stride_row,
        br.stride_row if br is not None else 0,
        yr.stride_row,
        mask.stride(0) if save_mask else 0,
        ACT=ACTIVATIONS[activation],
        HAS_BIAS=bias is not None,
        BIAS_IS_ROW=layout == "row",
        STORE_MASK=save_mask,
        PHI16=_phi16(activation, y),
        INT64=_needs_int64(xr, yr) or (br is not None and _needs_int64(br)),
        BLOCK_M=cfg.BLOCK_M,
        BLOCK_N=cfg.BLOCK_N,
        num_warps=cfg.num_warps,
    )
    return y, mask


def bias_act_bwd(
    grad: torch.Tensor,
    x: torch.Tensor | None,
    bias: torch.Tensor | None,
    mask: torch.Tensor | None,
    activation: str,
    need_dx: bool,
    need_dbias: bool,
    bias_added: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of ``act(x + bias)``: (dx, dbias); an output not asked for is an empty tensor.

    ``x`` is the forward input, or None when relu's bit ``mask`` (from bias_act_fwd) stands in
    for it, or when the activation is none. With ``bias_added``, ``x`` is already ``x + bias``
    (linear's saved pre-activation) and a broadcast ``bias`` only shapes its gradient. With a
    bias shaped like x, the two gradients are the same tensor: only dx is returned (dbias
    empty) and the caller uses dx for both.
    """
    layout = _bias_layout(grad.shape, bias)
    if bias_added and layout == "full":
        raise ValueError("bias_act_bwd: bias_added needs a bias broadcast over rows")
    empty = grad.new_empty(0)
    if layout == "full":
        need_dx = need_dx or need_dbias
    row_partials = layout == "row" and need_dbias
    if not (need_dx or row_partials):
        return empty, empty
    from_mask = mask is not None
    needs_x = activation != "none" and not from_mask
    if layout == "row" or from_mask:
        n_cols = _logical_cols(grad.shape, bias)
        gr, *xr = as_rows([grad] + ([x] if needs_x else []), n_cols)
        br = _bias_row(bias) if layout == "row" else None
        if layout == "full" and needs_x:
            (br,) = as_rows([bias], n_cols)
        dxr = gr  # a stand-in pointer: no buffer for a gradient nobody asked for
        if need_dx:
            dx_buf = torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)
            (dxr,) = as_rows([dx_buf], n_cols)
    else:
        operands = (
            [grad] + ([x] if needs_x else []) + ([bias] if bias is not None and needs_x else [])
        )
        in_rows, (dxr,) = elementwise_rows(operands)
        gr, xr = in_rows[0], in_rows[1:2]
        br = in_rows[2] if len(in_rows) > 2 else None
    xr = xr[0] if xr else None
    dx = dxr.tensor if need_dx else empty
    dbias = torch.empty(bias.shape, dtype=bias.dtype, device=bias.device) if row_partials else empty
    if grad.numel() == 0:
        if row_partials:
            dbias.zero_()  # a sum over no rows
        return dx, dbias

    elem = grad.element_size()
    if row_partials and activation == "none" and not need_dx:  # a plain column sum
        column_sum(gr, dbias)
        return dx, dbias
    rs = _ROW_SUMS[elem]
    if row_partials:
        cfg, rows_per_program, groups = row_sum_launch(
            gr.n_rows, gr.n_cols, elem, rs, sm_count(grad.device)
        )
        partial = torch.empty((groups, gr.n_cols), dtype=torch.float32, device=grad.device)
    else:
        cfg = TileConfig.for_rows(gr.n_rows, gr.n_cols, elem, _bwd_vectors(activation, elem))
        rows_per_program = cfg.BLOCK_M
        groups = cdiv(gr.n_rows, cfg.BLOCK_M)
        partial = empty
    if bias_added:
        br = None  # the activation's input is x itself
    views = [v for v in (gr, xr, br, dxr) if v is not None]
    grid = (groups * cdiv(gr.n_cols, cfg.BLOCK_N),)
    _bias_act_bwd_kernel[grid](
        gr.tensor,
        xr.tensor if xr is not None else gr.tensor,
        br.tensor if br is not None else gr.tensor,
        mask if from_mask else gr.tensor,
        dxr.tensor,
        partial,
        gr.n_rows,
        gr.n_cols,
        rows_per_program,
        gr.stride_row,
        xr.stride_row if xr is not None else 0,
        br.stride_row if br is not None else 0,
        mask.stride(0) if from_mask else 0,
        dxr.stride_row,
        ACT=ACTIVATIONS[activation],
        HAS_BIAS=br is not None,
        BIAS_IS_ROW=layout == "row",
        FROM_MASK=from_mask,
        STORE_DX=need_dx,
        BIAS_PARTIALS=row_partials,
        INT64=_needs_int64(*views),
        BLOCK_M=cfg.BLOCK_M,
        BLOCK_N=cfg.BLOCK_N,
        STAGES=rs.stages if row_partials else 1,
        num_warps=cfg.num_warps,
    )
    if row_partials:
        sum_partials(partial, dbias)
    return dx, dbias


def glu_fwd(gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
    """``act(gate) * up``."""
    (gr, ur), (yr,) = elementwise_rows([gate, up])
    if gate.numel() == 0:
        return yr.tensor
    cfg = TileConfig.for_rows(gr.n_rows, gr.n_cols, gate.element_size(), _HEAVY_VECTORS)
    _glu_fwd_kernel[cfg.grid(gr.n_rows, gr.n_cols)](
        gr.tensor,
        ur.tensor,
        yr.tensor,
        gr.n_rows,
        gr.n_cols,
        gr.stride_row,
        ur.stride_row,
        yr.stride_row,
        ACT=ACTIVATIONS[activation],
        PHI16=_phi16(activation, yr.tensor),
        INT64=_needs_int64(gr, ur, yr),
        BLOCK_M=cfg.BLOCK_M,
        BLOCK_N=cfg.BLOCK_N,
        num_warps=cfg.num_warps,
    )
    return yr.tensor


def glu_bwd(
    grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of ``act(gate) * up``: (dgate, dup)."""
    (dyr, gr, ur), (dgr, dur) = elementwise_rows([grad, gate, up], n_outputs=2)
    if gate.numel() == 0:
        return dgr.tensor, dur.tensor
    elem = gate.element_size()
    cfg = TileConfig.for_rows(gr.n_rows, gr.n_cols, elem, _bwd_vectors(activation, elem))
    _glu_bwd_kernel[cfg.grid(gr.n_rows, gr.n_cols)](
        dyr.tensor,
        gr.tensor,
        ur.tensor,
        dgr.tensor,
        dur.tensor,
        gr.n_rows,
        gr.n_cols,
        dyr.stride_row,
        gr.stride_row,
        ur.stride_row,
        dgr.stride_row,
        dur.stride_row,
        ACT=ACTIVATIONS[activation],
        INT64=_needs_int64(dyr, gr, ur, dgr, dur),
        BLOCK_M=cfg.BLOCK_M,
        BLOCK_N=cfg.BLOCK_N,
        num_warps=cfg.num_warps,
    )
    return dgr.tensor, dur.tensor


# ----------------------------------------------------------------------------------------------
# torch.library registration: each launcher becomes an op that torch.compile traces as one node.
# ----------------------------------------------------------------------------------------------


@define_op("tritonkit::bias_act")
def _bias_act_op(
    x: torch.Tensor, bias: torch.Tensor | None, activation: str, save_mask: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    return bias_act_fwd(x, bias, activation, save_mask)


@_bias_act_op.register_fake
def _(x, bias, activation, save_mask):
    if _bias_layout(x.shape, bias) == "row" or save_mask:
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    else:
        y = elementwise_output([x] if bias is None else [x, bias])
    shape = _mask_shape(x.shape, bias) if save_mask else (0,)
    return y, torch.empty(shape, dtype=torch.uint8, device=x.device)


@define_op("tritonkit::bias_act_backward")
def _bias_act_backward_op(
    grad: torch.Tensor,
    x: torch.Tensor | None,
    bias: torch.Tensor | None,
    mask: torch.Tensor | None,
    activation: str,
    need_dx: bool,
    need_dbias: bool,
    bias_added: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    return bias_act_bwd(grad, x, bias, mask, activation, need_dx, need_dbias, bias_added)


@_bias_act_backward_op.register_fake
def _(grad, x, bias, mask, activation, need_dx, need_dbias, bias_added):
    layout = _bias_layout(grad.shape, bias)
    empty = grad.new_empty(0)
    if layout == "full":
        need_dx = need_dx or need_dbias
    dx = empty
    if need_dx:
        needs_x = activation != "none" and mask is None
        if layout == "row" or mask is not None:
            dx = torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)
        else:
            operands = [grad] + ([x] if needs_x else [])
            operands += [bias] if bias is not None and needs_x else []
            dx = elementwise_output(operands)
    dbias = empty
    if layout == "row" and need_dbias:
        dbias = torch.empty(bias.shape, dtype=bias.dtype, device=bias.device)
    return dx, dbias


@define_op("tritonkit::glu")
def _glu_op(gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
    return glu_fwd(gate, up, activation)


@_glu_op.register_fake
def _(gate, up, activation):
    return elementwise_output([gate, up])


@define_op("tritonkit::glu_backward")
def _glu_backward_op(
    grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str
) -> tuple[torch.Tensor, torch.Tensor]:
    return glu_bwd(grad, gate, up, activation)


@_glu_backward_op.register_fake
def _(grad, gate, up, activation):
    return elementwise_output([grad, gate, up]), elementwise_output([grad, gate, up])


# Eager calls on real tensors skip the ops' dispatch (see eager_direct).
call_bias_act = eager_direct(_bias_act_op)
call_bias_act_backward = eager_direct(_bias_act_backward_op)
call_glu = eager_direct(_glu_op)
call_glu_backward = eager_direct(_glu_backward_op)


# ----------------------------------------------------------------------------------------------
# Autograd
# ----------------------------------------------------------------------------------------------


class BiasActFunction(torch.autograd.Function):
    """``act(x + bias)``; bias None, shaped like x, or broadcast over x's leading dimensions."""

    @staticmethod
    def forward(ctx, x, bias, activation):
        # ReLU keeps one bit per element for its backward pass, and only when one will run.
        save_mask = activation == "relu" and any(ctx.needs_input_grad[:2])
        y, mask = call_bias_act(x, bias, activation, save_mask)
        ctx.activation = activation
        ctx.bias_is_row = bias is not None and bias.shape != x.shape
        if activation == "none":
            # d(x + b)/dx is the identity: keep only the bias (its shape says how to reduce),
            # not x, so that add frees its inputs as early as PyTorch's add does.
            ctx.save_for_backward(bias if ctx.bias_is_row else None)
        elif save_mask:
            ctx.save_for_backward(mask, bias if ctx.bias_is_row else None)
        else:
            ctx.save_for_backward(x, bias)
        return y

    @staticmethod
    def backward(ctx, grad):
        need_dx, need_dbias = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        op = call_bias_act_backward
        if ctx.activation == "none":
            (bias,) = ctx.saved_tensors
            dbias = None
            if need_dbias:
                if ctx.bias_is_row:
                    _, dbias = op(grad, None, bias, None, "none", False, True, False)
                else:
                    dbias = grad
            return (grad if need_dx else None), dbias, None
        if ctx.activation == "relu":
            mask, bias = ctx.saved_tensors
            dx, dbias = op(grad, None, bias, mask, "relu", need_dx, need_dbias, False)
        else:
            x, bias = ctx.saved_tensors
            dx, dbias = op(grad, x, bias, None, ctx.activation, need_dx, need_dbias, False)
        if need_dbias and not ctx.bias_is_row:
            dbias = dx  # d(x + b) is the same tensor for both operands
        return (dx if need_dx else None), (dbias if need_dbias else None), None


class GLUFunction(torch.autograd.Function):
    """``act(gate) * up``."""

    @staticmethod
    def forward(ctx, gate, up, activation):
        ctx.activation = activation
        ctx.save_for_backward(gate, up)
        return call_glu(gate, up, activation)

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        dgate, dup = call_glu_backward(grad, gate, up, ctx.activation)
        return (
            dgate if ctx.needs_input_grad[0] else None,
            dup if ctx.needs_input_grad[1] else None,
            None,
        )


# ----------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------

_BIAS_ACTIVATIONS = (None, "relu", "gelu", "gelu_tanh", "silu")
_GELU_APPROXIMATIONS = {"none": "gelu", "tanh": "gelu_tanh"}


def _strip_leading_ones(shape: torch.Size) -> tuple[int, ...]:
    dims = list(shape)
    while dims and dims[0] == 1:
        dims.pop(0)
    return tuple(dims)


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Elementwise ``x + y`` (``torch.add`` without ``alpha``), with autograd.

    Args:
        x: float32, float16 or bfloat16 tensor on a CUDA device.
        y: tensor of the same dtype and device. Either operand may be broadcast over the
            other's leading dimensions (its shape, leading 1s aside, a suffix of the other's),
            e.g. ``(B, S, C) + (C,)`` or ``(S, C) + (B, S, C)``; other broadcasts raise.

    Returns:
        ``x + y`` in the inputs' dtype, computed in float32 and rounded once.
    """
    op = "tritonkit.add"
    check_tensor(op, "x", x)
    check_operand(op, "y", y, "x", x)
    try:
        out_shape = torch.broadcast_shapes(x.shape, y.shape)
    except RuntimeError:
        raise ValueError(
            f"{op}: x and y must be broadcastable, got shapes {tuple(x.shape)} and {tuple(y.shape)}"
        ) from None
    if x.shape == y.shape:
        return apply(BiasActFunction, x, y, "none")
    for big, small in ((x, y), (y, x)):
        if big.shape != out_shape:
            continue
        core = _strip_leading_ones(small.shape)
        if len(core) <= big.dim() and tuple(big.shape[big.dim() - len(core) :]) == core:
            if small.numel() == big.numel():  # only leading 1s differ
                return apply(BiasActFunction, big, small.reshape(big.shape), "none")
            return apply(BiasActFunction, big, small.reshape(core), "none")
    if x.numel() == y.numel():  # e.g. (S, C) + (1, S, C): both are the output up to leading 1s
        return apply(BiasActFunction, x.reshape(out_shape), y.reshape(out_shape), "none")
    raise ValueError(
        f"{op}: only broadcasting over leading dimensions is supported (one operand's shape a "
        f"suffix of the other's), got shapes {tuple(x.shape)} and {tuple(y.shape)}"
    )


def _activation(op: str, x: torch.Tensor, activation: str) -> torch.Tensor:
    check_tensor(op, "x", x)
    return apply(BiasActFunction, x, None, activation)


def relu(x: torch.Tensor) -> torch.Tensor:
    """``torch.relu(x)``, with autograd. NaN stays NaN.

    Args:
        x: float32, float16 or bfloat16 tensor on a CUDA device, any shape and strides.
    """
    return _activation("tritonkit.relu", x, "relu")


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``torch.nn.functional.gelu(x, approximate)``, with autograd.

    Args:
        x: float32, float16 or bfloat16 tensor on a CUDA device, any shape and strides.
        approximate: ``"none"`` (exact, with erf) or ``"tanh"``.
    """
    check_choice("tritonkit.gelu", "approximate", approximate, tuple(_GELU_APPROXIMATIONS))
    return _activation("tritonkit.gelu", x, _GELU_APPROXIMATIONS[approximate])


def silu(x: torch.Tensor) -> torch.Tensor:
    """``torch.nn.functional.silu(x)`` (x * sigmoid(x)), with autograd.

    Args:
        x: float32, float16 or bfloat16 tensor on a CUDA device, any shape and strides.
    """
    return _activation("tritonkit.silu", x, "silu")


def bias_act(x: torch.Tensor, bias: torch.Tensor, activation: str | None = None) -> torch.Tensor:
    """``act(x + bias)`` in one pass, the bias broadcast over every leading dimension of x.

    PyTorch needs two passes for this (``x + bias``, then the activation); here each tile of
    bias is loaded once and reused across a block of rows. The backward pass computes
    ``dx`` and the bias gradient (a deterministic column sum) in one read of the inputs.

    Args:
        x: float32, float16 or bfloat16 tensor of shape ``(..., C)`` on a CUDA device.
        bias: tensor of shape ``(C,)``, same dtype and device as x.
        activation: None, ``"relu"``, ``"gelu"``, ``"gelu_tanh"`` or ``"silu"``.
    """
    op = "tritonkit.bias_act"
    check_tensor(op, "x", x)
    if x.dim() == 0:
        raise ValueError(f"{op}: x must have at least one dimension, got a 0-d tensor")
    check_operand(op, "bias", bias, "x", x, (x.shape[-1],), "(x.shape[-1],)")
    check_choice(op, "activation", activation, _BIAS_ACTIVATIONS)
    return apply(BiasActFunction, x, bias, activation or "none")


def _glu(op: str, gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
    check_tensor(op, "gate", gate)
    check_operand(op, "up", up, "gate", gate)
    check_same_shape(op, gate=gate, up=up)
    return apply(GLUFunction, gate, up, activation)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU: ``silu(gate) * up`` in one pass, with autograd.

    Args:
        gate: float32, float16 or bfloat16 tensor on a CUDA device. Views such as
            ``proj(x).chunk(2, dim=-1)`` are read in place.
        up: tensor of the same shape, dtype and device.
    """
    return _glu("tritonkit.swiglu", gate, up, "silu")


def geglu(gate: torch.Tensor, up: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GEGLU: ``gelu(gate, approximate) * up`` in one pass, with autograd.

    Args:
        gate: float32, float16 or bfloat16 tensor on a CUDA device.
        up: tensor of the same shape, dtype and device.
        approximate: ``"none"`` or ``"tanh"``, as in ``torch.nn.functional.gelu``.
    """
    check_choice("tritonkit.geglu", "approximate", approximate, tuple(_GELU_APPROXIMATIONS))
    return _glu("tritonkit.geglu", gate, up, _GELU_APPROXIMATIONS[approximate])


# The family's public functions: tritonkit.__all__ and tritonkit.functional derive from these.
__all__ = ["add", "bias_act", "geglu", "gelu", "relu", "silu", "swiglu"]
