"""Softmax family: softmax and log_softmax over any dimension, forward and backward.

Every kernel of the row-reduction families (softmax, norms) sees its tensors as
``(n_outer, n_cols, n_inner)``: the reduced dimension is the middle axis, with its own stride,
and the other dimensions are merged into at most two "row" axes. A reduction over the last
dimension of a contiguous tensor is ``(1, C, R)`` with a row stride of C; over dim 0 it is
``(1, R, C)`` with unit-stride rows, so that a tile of adjacent rows is read coalesced. Neither
needs a transpose copy; only a layout whose row dimensions cannot be merged into two strided
axes is copied (and counted in ``_utils.LAYOUT_COPIES``).

A row that fits in registers (``MAX_FUSED_COLS``) is read once and written once. A wider row
takes the looped path: one sweep keeps a running maximum and sum per lane (an online softmax,
one exponential per element), a second sweep writes the output. The second sweep reads the row
again, last chunk first, and the grid is capped at ``LOOP_PROGRAMS_PER_SM_*`` programs per SM, so
that the rows in flight fit in L2 and that second read does not reach DRAM.

Rows that do not start on a 16-byte boundary (an odd width such as a 50257-class vocabulary)
are walked from their first aligned element, in whole 16-byte vectors, with the few elements
before and after that body loaded one by one (``ALIGNED``); otherwise every element of such a
row would be its own load.

Arithmetic is fp32 whatever the storage dtype; each output is rounded once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from tritonkit._autocast import FP32, autocast_dtype, cast, policy
from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.layout import next_power_of_2
from tritonkit.ops._core.math import LOG2E, aligned_row, edge_cols, fast_exp
from tritonkit.ops._core.registry import apply, define_op, eager_direct
from tritonkit.ops._core.rows import (
    RowConfig,
    RowLayout,
    col_ids,
    evict_kwargs,
    load_chunk,
    n_steps,
    plan_rows,
    program_row,
    reverse_start,
    row_config,
    row_program_config,
    tile_rows,
)
from tritonkit.ops._core.validate import check_tensor

# ----------------------------------------------------------------------------------------------
# Configs: every block size of the family is chosen here (benchmarks/sweep_norms.py sweeps them).
# ----------------------------------------------------------------------------------------------

# Widest row kept in registers: 16384 fp32 values are 16 per thread at 32 warps (ptxas for
# sm_90a: 32-57 registers, no spills; a 65536 row spills). Wider rows are looped in chunks of
# LOOP_BLOCK_N. H200 sweep (benchmarks/NOTES.md), (4096, 65536) bf16: chunks of 16384 at one
# program per SM gave 2725 GB/s forward and 3047 backward (8192 at 2 per SM: 2258 and 2759).
MAX_FUSED_COLS = 16384
LOOP_BLOCK_N = 16384
# Short rows share a program: a tile holds up to TILE_ELEMS elements.
TILE_ELEMS = 4096
# Rows that are adjacent in memory (a reduction over a non-last dim): rows per tile, so that a
# warp reads a contiguous run of them.
ADJACENT_ROWS = 64
# Warps are sized so that each thread holds about this many elements of a tile: rows in
# registers, and chunks of looped rows. H200 sweep (run 20), (16384, 4096) bf16: forward 3941
# GB/s at 32 (3749 at 16, 2747 at 8), backward 4072 (4063 at 16).
ELEMS_PER_THREAD = 32
MAX_WARPS = 32
# Looped path, forward and backward apart: elements per thread of a chunk, and programs per SM
# (each keeps one row in flight between its two sweeps, in L2). H200 sweep (run 21, read flush),
# (4096, 65536) bf16, chunks of 16384: forward 3575 GB/s at 32 per thread and 4 programs per SM
# (3365 at 16 and 2; 3453 at 32 and 2); backward 4056 at 16 and 2 (3979 at 32 and 4).
LOOP_ELEMS_PER_THREAD_FWD = 32
LOOP_ELEMS_PER_THREAD_BWD = 16
LOOP_PROGRAMS_PER_SM_FWD = 4
LOOP_PROGRAMS_PER_SM_BWD = 2
# Looped path: issue the next chunk's loads before working on the current one (two chunks per
# program in flight). H200 sweep (benchmarks/NOTES.md, run 14), (4096, 65536) bf16, chunks of
# 16384, 2 programs per SM: backward 3326 GB/s with it, 2744 without. The forward, with
# LOOP_CHUNK_MAX and LOOP_EVICT_FWD (run 20b): 3333 without it, 2794 with.
LOOP_PREFETCH_FWD = False
LOOP_PREFETCH_BWD = True
# Looped path: L2 eviction hints, the first sweep's loads evict_last and the second sweep's loads
# and stores evict_first, so that the rows the first sweep read are what stays in L2. H200 sweep
# (run 20), (4096, 65536) bf16: backward 3934 GB/s with them, 3310 without; the forward gains
# with LOOP_CHUNK_MAX only (below).
LOOP_EVICT_FWD = True
LOOP_EVICT_BWD = True
# Looped forward: the first sweep reduces each chunk (a max and a sum across the tile per chunk,
# half the instructions per element) instead of keeping a running maximum and sum per lane;
# the per-lane version was bound by instruction issue, not by memory. H200 sweep (run 20b),
# (4096, 65536) bf16: 3333 GB/s with both this and LOOP_EVICT_FWD (2938 with this alone, 2941
# with the hints alone, 2659 with neither).
LOOP_CHUNK_MAX = True

# Backward of one row per program with the width a compile-time constant (ROW_BWD_*), as the
# norm forward's ROW_FWD: 16-bit rows of contiguous columns, softmax's of ROW_BWD_MIN_COLS to
# ROW_BWD_MAX_COLS, log_softmax's from ROW_BWD_MIN_COLS_LOG. Two sweeps (the row sum, then dx,
# re-reading dy and y from L2); warps by the bytes of a row of dy (ROW_BWD_WARPS; wider, 32) and
# chunks of ROW_BWD_ELEMS_PER_THREAD[warps] per thread. H200 (runs 95-96, benchmarks/NOTES.md),
# bf16 backward, ms, this path / the old ones / torch.compile (run 96): softmax (7281, 9216)
# 0.0952 / 0.1188 / 0.0947, (4096, 16384) 0.0933 / 0.0968 / 0.0916, (2730, 24576) 0.0947 / 0.1309
# / 0.1209; log_softmax (2097, 32000) 0.0949 / 0.1098 / 0.0965, but (5461, 12288) 0.0945 / 0.0929.
# Narrower rows, wider ones and fp32 rows did as well or better on the old paths (run 95: softmax
# bf16 (22369, 3000) 0.1443 / 0.1077, (4096, 65536) 0.4436 / 0.3977; fp32 (1048, 32000) 0.1092 /
# 0.1031). Softmax rows of 4096-8192 take it too, at 16 warps (run 113, ms, this path / rows in
# registers / torch.compile: (16384, 4096) 0.0906 / 0.0918 / 0.0903 and, again, 0.0912 / 0.0924 /
# 0.0908; (13107, 5120) 0.0905 / 0.0920 / 0.1072; (10922, 6144) 0.0917 / 0.0927 / 0.0960; (8192,
# 8192) 0.0908 / 0.0920 / 0.0910). At 4, 8 or 32 warps, or 8 elements per thread, it lost or tied
# at 4096 (run 112).
ROW_BWD = True
ROW_BWD_MIN_COLS = 4096
ROW_BWD_MIN_COLS_LOG = 16385
ROW_BWD_MAX_COLS = 32768
ROW_BWD_WARPS = ((32768, 16),)
ROW_BWD_ELEMS_PER_THREAD = {4: 16, 8: 16, 16: 8, 32: 8}
# fp32 softmax rows of ROW_BWD_MIN_COLS to ROW_BWD_MAX_COLS_FP32 take it too, warps by
# ROW_BWD_WARPS_FP32 (wider, 32). H200 (run 131), same run, ms, this / the old path /
# torch.compile: (16384, 4096) 0.1817 at 16 warps / 0.1846 / 0.1819; (8192, 8192) 0.1817 at 32
# warps / 0.1849 / 0.1840. At (4096, 16384) the old path stayed ahead (0.1862 / 0.1869 at best).
ROW_BWD_MAX_COLS_FP32 = 8192
ROW_BWD_WARPS_FP32 = ((16384, 16),)

# Rows that do not start on a 16-byte boundary, or whose width is not a whole number of 16-byte
# vectors (a 50257-class vocabulary, a row stride of 32001): the kernels above can prove no
# alignment, so every element is its own load and store. H200 (run 119, bf16, ms, ours / the
# aligned neighbour width): softmax (1335, 50257) forward 0.1857 against (1334, 50304) 0.0940
# (eager 0.1329), backward 0.2868 / 0.1322. Such rows take the aligned-walk kernels: each row is
# cut into a body of whole vectors starting at its first 16-byte aligned element, walked in
# chunks, and an edge of fewer than two vectors' worth of elements before and after it, loaded
# element by element. Every tensor of the call must have its rows start at the same offset
# within 16 bytes (same strides modulo the vector, 16-byte aligned base pointers) and
# contiguous columns; other layouts keep the paths above. The forward takes rows wider than
# MAX_FUSED_COLS only: narrower odd rows in registers were already ahead of torch.compile (run
# 119: (16372, 4099) bf16 forward 0.1188 ms against 0.2514). Launch configs from run 120 (six
# per direction at 4099-50257 columns, bf16 and fp32), ms, this path / the old ones / the best
# of eager and torch.compile: softmax bf16 (1335, 50257) forward 0.0932 / 0.1842 / 0.1319,
# backward 0.1284 / 0.2883 / 0.2093; (2097, 32001) 0.0773 / 0.1519 / 0.1586 and 0.1300 / 0.1388 /
# 0.1942; (16372, 4099) backward 0.1109 / 0.2592 / 0.1907; fp32 (667, 50257) 0.0915 / 0.1184 /
# 0.1326 and 0.1478 / 0.3251 / 0.2233. The forward: (warps, elements per thread) by element
# size; the backward: warps by the row's bytes (ALIGNED_WARPS_BWD, wider rows 32) and
# elements per thread by warps.
ALIGNED = True
ALIGNED_MIN_COLS_FWD = MAX_FUSED_COLS + 1
ALIGNED_MIN_COLS_BWD = 4096
ALIGNED_FWD = {2: (8, 32), 4: (32, 16)}
ALIGNED_WARPS_BWD = ((16384, 8), (49152, 16))
ALIGNED_ELEMS_PER_THREAD_BWD = {8: 16, 16: 8, 32: 8}

_INT32_LIMIT = 2**31


def softmax_config(layout: RowLayout, device: torch.device, backward: bool) -> RowConfig:
    """The softmax family's config (forward or backward) from the module constants."""
    return row_config(
        layout,
        device,
        max_fused=MAX_FUSED_COLS,
        loop_block=LOOP_BLOCK_N,
        tile_elems=TILE_ELEMS,
        adjacent_rows=ADJACENT_ROWS,
        elems_per_thread=ELEMS_PER_THREAD,
        loop_elems_per_thread=LOOP_ELEMS_PER_THREAD_BWD if backward else LOOP_ELEMS_PER_THREAD_FWD,
        max_warps=MAX_WARPS,
        loop_programs_per_sm=LOOP_PROGRAMS_PER_SM_BWD if backward else LOOP_PROGRAMS_PER_SM_FWD,
    )


@triton.jit
def _rescale(m, s, chunk_max):
    """One chunk of an online softmax: (m', ref, s rescaled to ref) for the running maximum m
    and sum s; the caller adds the chunk's sum of exp(x - ref). ref is m' = max(m, chunk_max),
    or 0 while everything so far is -inf (so that exp gives 0, not NaN)."""
    m_new = tl.maximum(m, chunk_max)
    ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    return m_new, ref, s * fast_exp(m - ref)


@triton.jit
def _output_shift(row_max, row_sum, LOG: tl.constexpr):
    """The one value per row that the output subtracts (_output): log_softmax x - (max +
    log(sum)), softmax exp2(x log2(e) - (max log2(e) + log2(sum))), one FMA and one exp2 per
    element instead of exp(x - max) / sum. H200 (run 21), (4096, 65536) bf16: 3661 GB/s, 3598
    before. An all -inf row gives NaN, as PyTorch does (-inf + inf)."""
    if LOG:
        return row_max + tl.log(row_sum)
    return row_max * LOG2E + tl.log2(row_sum)


@triton.jit
def _output(x, shift, LOG: tl.constexpr):
    """softmax (log_softmax) of fp32 x from its row's _output_shift."""
    if LOG:
        return x - shift
    return tl.exp2(x * LOG2E - shift)


@triton.jit
def _row_max_sum(
    x_rows,
    n_cols,
    stride_n,
    row_mask,
    cols,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREFETCH: tl.constexpr,
    EVICT: tl.constexpr,
    CHUNK_MAX: tl.constexpr,
):
    """Row maxima and sums of exp(x - max) in one sweep over chunks; one exp per element.

    With CHUNK_MAX each chunk is reduced as it comes: its maximum m' (a reduction across the
    tile), then s = s * exp(m - m') + sum(exp(x - m')), a max, a subtraction, an exp and an add
    per element. Without it each lane keeps its own running maximum m and sum s, combined once
    at the end: a new element x either raises the maximum (s = s * exp(m - x) + 1) or not
    (s += exp(x - m)), both exp(-|x - m|); about twice the instructions per element and no
    reduction per chunk. Either way -inf contributes nothing (a row that is -inf so far keeps
    s = 0); +inf or NaN make the row NaN, as PyTorch's softmax does.
    """
    if CHUNK_MAX:
        m = tl.full([BLOCK_R], float("-inf"), tl.float32)
        s = tl.zeros([BLOCK_R], tl.float32)
    else:
        m = tl.full([BLOCK_R, BLOCK_N], float("-inf"), tl.float32)
        s = tl.zeros([BLOCK_R, BLOCK_N], tl.float32)
    if PREFETCH:
        x_next = load_chunk(x_rows, 0, cols, n_cols, stride_n, row_mask, float("-inf"), EVICT)
    for start in range(0, n_cols, BLOCK_N):
        # One load per iteration: this chunk, or with PREFETCH the next one.
        loaded = load_chunk(
            x_rows, start + PREFETCH * BLOCK_N, cols, n_cols, stride_n, row_mask, float("-inf"),
            EVICT,
        )  # fmt: skip
        if PREFETCH:
            x = x_next
            x_next = loaded
        else:
            x = loaded
        x = x.to(tl.float32)
        if CHUNK_MAX:
            m, ref, s = _rescale(m, s, tl.max(x, axis=1))
            s += tl.sum(fast_exp(x - ref[:, None]), axis=1)
        else:
            d = x - m
            e = fast_exp(-tl.abs(d))
            s_new = tl.where(d > 0.0, s * e + 1.0, s + e)
            s = tl.where(x == float("-inf"), s, s_new)  # also masked lanes: -inf - -inf is NaN
            m = tl.maximum(m, x)
    if CHUNK_MAX:
        row_max = m
        row_sum = s
    else:
        row_max = tl.max(m, axis=1)
        row_sum = tl.sum(s * fast_exp(m - row_max[:, None]), axis=1)
    return row_max, row_sum


@kernel
def _softmax_fwd_kernel(
    x_ptr,  # input, seen as (n_outer, n_cols, n_inner) with the strides below
    y_ptr,  # output, same view
    n_cols,  # length of the reduced dimension
    n_inner,  # rows per outer index
    n_iblocks,  # row tiles per outer index: cdiv(n_inner, BLOCK_R)
    n_tiles,  # row tiles in all: n_outer * n_iblocks
    stride_xo,  # x: elements between outer indices
    stride_xn,  # x: elements between columns (along the reduced dim)
    stride_xi,  # x: elements between inner rows
    stride_yo,  # y: as for x
    stride_yn,
    stride_yi,
    LOG: tl.constexpr,  # log_softmax instead of softmax
    LOOPED: tl.constexpr,  # the row spans several BLOCK_N chunks
    PREFETCH: tl.constexpr,  # looped: load the next chunk before using the current one
    KEEP: tl.constexpr,  # looped: L2 policy of the first sweep's loads ("" or "evict_last")
    DROP: tl.constexpr,  # looped: L2 policy of the second sweep ("" or "evict_first")
    CHUNK_MAX: tl.constexpr,  # looped: the first sweep reduces each chunk (see _row_max_sum)
    OUTER: tl.constexpr,  # more than one outer index
    ONE_TILE: tl.constexpr,  # one tile per program
    INT64: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    cols = col_ids(BLOCK_N, INT64)
    # A grid-stride walk over tiles; with ONE_TILE a constant trip count of 1, which the compiler
    # removes (a loop around one tile's body cost 2-19% in benchmarks/exp_row_launch.py).
    for step in range(0, n_steps(n_tiles, ONE_TILE)):
        tile = tl.program_id(0) + step * tl.num_programs(0)
        o, i, row_mask = tile_rows(tile, n_inner, n_iblocks, BLOCK_R, INT64, OUTER)
        x_rows = x_ptr + o * stride_xo + i * stride_xi
        y_rows = y_ptr + o * stride_yo + i * stride_yi
        if LOOPED:
            row_max, row_sum = _row_max_sum(
                x_rows, n_cols, stride_xn, row_mask, cols, BLOCK_R, BLOCK_N, PREFETCH, KEEP,
                CHUNK_MAX,
            )  # fmt: skip
            shift = _output_shift(row_max, row_sum, LOG)
            n_chunks = tl.cdiv(n_cols, BLOCK_N)
            # Last chunk first: the chunks read last by the first sweep are still in L2.
            if PREFETCH:
                x_next = load_chunk(x_rows, reverse_start(0, n_chunks, BLOCK_N), cols, n_cols,
                                stride_xn, row_mask, 0.0, DROP)  # fmt: skip
            for k in range(0, n_chunks):
                start = reverse_start(k, n_chunks, BLOCK_N)
                loaded = load_chunk(x_rows, reverse_start(k + PREFETCH, n_chunks, BLOCK_N), cols,
                                n_cols, stride_xn, row_mask, 0.0, DROP)  # fmt: skip
                if PREFETCH:
                    x = x_next
                    x_next = loaded
                else:
                    x = loaded
                c = start + cols
                mask = row_mask[:, None] & (c < n_cols)[None, :]
                y = _output(x.to(tl.float32), shift[:, None], LOG)
                tl.store(
                    y_rows[:, None] + c[None, :] * stride_yn,
                    y.to(y_ptr.dtype.element_ty),
                    mask=mask,
                    eviction_policy=DROP,
                )
        else:
            mask = row_mask[:, None] & (cols < n_cols)[None, :]
            x = tl.load(x_rows[:, None] + cols[None, :] * stride_xn, mask=mask, other=float("-inf"))
            x = x.to(tl.float32)
            z = x - tl.max(x, axis=1)[:, None]
            e = fast_exp(z)
            row_sum = tl.sum(e, axis=1)
            if LOG:
                y = z - tl.log(row_sum)[:, None]
            else:
                y = e * (1.0 / row_sum)[:, None]
            tl.store(
                y_rows[:, None] + cols[None, :] * stride_yn, y.to(y_ptr.dtype.element_ty), mask=mask
            )


@kernel
def _softmax_bwd_kernel(
    dy_ptr,  # upstream gradient, seen as (n_outer, n_cols, n_inner)
    y_ptr,  # forward output (softmax, or log_softmax when LOG)
    dx_ptr,  # gradient of the input
    n_cols,  # as in the forward kernel
    n_inner,
    n_iblocks,
    n_tiles,
    stride_dyo,  # dy: outer, column and inner strides
    stride_dyn,
    stride_dyi,
    stride_yo,  # y: as for dy
    stride_yn,
    stride_yi,
    stride_dxo,  # dx: as for dy
    stride_dxn,
    stride_dxi,
    LOG: tl.constexpr,
    LOOPED: tl.constexpr,
    PREFETCH: tl.constexpr,
    KEEP: tl.constexpr,  # as in the forward kernel
    DROP: tl.constexpr,
    OUTER: tl.constexpr,
    ONE_TILE: tl.constexpr,
    INT64: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # softmax: dx = y * (dy - sum(dy * y)); log_softmax: dx = dy - exp(y) * sum(dy).
    cols = col_ids(BLOCK_N, INT64)
    # A grid-stride walk over tiles; with ONE_TILE a constant trip count of 1, which the compiler
    # removes (a loop around one tile's body cost 2-19% in benchmarks/exp_row_launch.py).
    for step in range(0, n_steps(n_tiles, ONE_TILE)):
        tile = tl.program_id(0) + step * tl.num_programs(0)
        o, i, row_mask = tile_rows(tile, n_inner, n_iblocks, BLOCK_R, INT64, OUTER)
        dy_rows = dy_ptr + o * stride_dyo + i * stride_dyi
        y_rows = y_ptr + o * stride_yo + i * stride_yi
        dx_rows = dx_ptr + o * stride_dxo + i * stride_dxi
        if LOOPED:
            # softmax needs sum(dy * y), log_softmax only sum(dy): y is not read in this sweep.
            acc = tl.zeros([BLOCK_R, BLOCK_N], tl.float32)
            if PREFETCH:
                dy_next = load_chunk(dy_rows, 0, cols, n_cols, stride_dyn, row_mask, 0.0, KEEP)
                if not LOG:
                    y_next = load_chunk(y_rows, 0, cols, n_cols, stride_yn, row_mask, 0.0, KEEP)
            for start in range(0, n_cols, BLOCK_N):
                at = start + PREFETCH * BLOCK_N
                dy_loaded = load_chunk(dy_rows, at, cols, n_cols, stride_dyn, row_mask, 0.0, KEEP)
                if not LOG:
                    y_loaded = load_chunk(y_rows, at, cols, n_cols, stride_yn, row_mask, 0.0, KEEP)
                if PREFETCH:
                    dy = dy_next
                    dy_next = dy_loaded
                    if not LOG:
                        y = y_next
                        y_next = y_loaded
                else:
                    dy = dy_loaded
                    if not LOG:
                        y = y_loaded
                if LOG:
                    acc += dy.to(tl.float32)
                else:
                    acc += dy.to(tl.float32) * y.to(tl.float32)
            total = tl.sum(acc, axis=1)
            n_chunks = tl.cdiv(n_cols, BLOCK_N)
            # In reverse, as in the forward.
            if PREFETCH:
                first = reverse_start(0, n_chunks, BLOCK_N)
                dy_next = load_chunk(dy_rows, first, cols, n_cols, stride_dyn, row_mask, 0.0, DROP)
                y_next = load_chunk(y_rows, first, cols, n_cols, stride_yn, row_mask, 0.0, DROP)
            for k in range(0, n_chunks):
                start = reverse_start(k, n_chunks, BLOCK_N)
                at = reverse_start(k + PREFETCH, n_chunks, BLOCK_N)
                dy_loaded = load_chunk(dy_rows, at, cols, n_cols, stride_dyn, row_mask, 0.0, DROP)
                y_loaded = load_chunk(y_rows, at, cols, n_cols, stride_yn, row_mask, 0.0, DROP)
                if PREFETCH:
                    dy, y = dy_next, y_next
                    dy_next, y_next = dy_loaded, y_loaded
                else:
                    dy, y = dy_loaded, y_loaded
                c = start + cols
                mask = row_mask[:, None] & (c < n_cols)[None, :]
                dy = dy.to(tl.float32)
                y = y.to(tl.float32)
                if LOG:
                    dx = dy - fast_exp(y) * total[:, None]
                else:
                    dx = y * (dy - total[:, None])
                tl.store(
                    dx_rows[:, None] + c[None, :] * stride_dxn,
                    dx.to(dx_ptr.dtype.element_ty),
                    mask=mask,
                    eviction_policy=DROP,
                )
        else:
            mask = row_mask[:, None] & (cols < n_cols)[None, :]
            dy = tl.load(dy_rows[:, None] + cols[None, :] * stride_dyn, mask=mask, other=0.0)
            y = tl.load(y_rows[:, None] + cols[None, :] * stride_yn, mask=mask, other=0.0)
            dy = dy.to(tl.float32)
            y = y.to(tl.float32)
            if LOG:
                dx = dy - fast_exp(y) * tl.sum(dy, axis=1)[:, None]
            else:
                dx = y * (dy - tl.sum(dy * y, axis=1)[:, None])
            tl.store(
                dx_rows[:, None] + cols[None, :] * stride_dxn,
                dx.to(dx_ptr.dtype.element_ty),
                mask=mask,
            )


@kernel
def _softmax_bwd_row_kernel(
    dy_ptr,  # upstream gradient, seen as (n_outer, N_COLS, n_inner), columns contiguous
    y_ptr,  # forward output (softmax, or log_softmax when LOG)
    dx_ptr,  # gradient of the input
    n_inner,  # rows per outer index
    stride_dyo,  # dy: outer and inner strides
    stride_dyi,
    stride_yo,  # y: as for dy
    stride_yi,
    stride_dxo,  # dx: as for dy
    stride_dxi,
    N_COLS: tl.constexpr,  # the row width, a constant, so that both sweeps unroll
    LOG: tl.constexpr,
    OUTER: tl.constexpr,  # more than one outer index
    BLOCK_N: tl.constexpr,
):
    """One row per program: sum(dy * y) (log_softmax: sum(dy)) over chunks of BLOCK_N, then dx,
    re-reading dy and y (L2 hits)."""
    o, i = program_row(n_inner, OUTER)
    dy_row = dy_ptr + o * stride_dyo + i * stride_dyi
    y_row = y_ptr + o * stride_yo + i * stride_yi
    dx_row = dx_ptr + o * stride_dxo + i * stride_dxi
    total = _bwd_row_total(dy_row, y_row, N_COLS, LOG, BLOCK_N)
    _bwd_row_dx(dy_row, y_row, dx_row, N_COLS, total, LOG, BLOCK_N)


@triton.jit
def _bwd_row_total(dy_row, y_row, n_cols, LOG: tl.constexpr, BLOCK_N: tl.constexpr):
    """sum(dy * y) (log_softmax: sum(dy)) over the columns [0, n_cols) of one row, in chunks,
    its loads kept in L2 for the second sweep (_bwd_row_dx)."""
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        c = start + cols
        mask = c < n_cols
        dy = tl.load(dy_row + c, mask=mask, other=0.0, eviction_policy="evict_last")
        if LOG:
            acc += dy.to(tl.float32)
        else:
            y = tl.load(y_row + c, mask=mask, other=0.0, eviction_policy="evict_last")
            acc += dy.to(tl.float32) * y.to(tl.float32)
    return tl.sum(acc, axis=0)


@triton.jit
def _bwd_row_dx(dy_row, y_row, dx_row, n_cols, total, LOG: tl.constexpr, BLOCK_N: tl.constexpr):
    """dx over the columns [0, n_cols) of one row, in chunks, from its row sum ``total``."""
    cols = tl.arange(0, BLOCK_N)
    for start in range(0, n_cols, BLOCK_N):
        c = start + cols
        mask = c < n_cols
        dy = tl.load(dy_row + c, mask=mask, other=0.0, eviction_policy="evict_first")
        y = tl.load(y_row + c, mask=mask, other=0.0, eviction_policy="evict_first")
        dy = dy.to(tl.float32)
        y = y.to(tl.float32)
        if LOG:
            dx = dy - fast_exp(y) * total
        else:
            dx = y * (dy - total)
        tl.store(dx_row + c, dx.to(dx_row.dtype.element_ty), mask=mask)


@kernel
def _softmax_fwd_aligned_kernel(
    x_ptr,  # input, seen as (n_outer, n_cols, n_inner), columns contiguous
    y_ptr,  # output, whose rows start at the same offsets within 16 bytes as x's
    n_cols,
    n_inner,
    stride_xo,
    stride_xi,
    stride_yo,
    stride_yi,
    LOG: tl.constexpr,
    OUTER: tl.constexpr,
    VEC: tl.constexpr,  # elements per 16 bytes
    BLOCK_N: tl.constexpr,
):
    """One row per program, two sweeps as in the looped _softmax_fwd_kernel (CHUNK_MAX), over
    the row's aligned body in chunks and its edge (see ALIGNED)."""
    o, i = program_row(n_inner, OUTER)
    x_off = o * stride_xo + i * stride_xi
    y_off = o * stride_yo + i * stride_yi
    head, n_body = aligned_row(x_off, n_cols, VEC)
    x_body = x_ptr + tl.multiple_of(x_off + head, VEC)
    y_body = y_ptr + tl.multiple_of(y_off + head, VEC)
    ec, em = edge_cols(head, n_body, n_cols, VEC)
    xe = tl.load(x_ptr + x_off + ec, mask=em, other=float("-inf")).to(tl.float32)
    m = tl.max(xe, axis=0)
    ref = tl.where(m == float("-inf"), 0.0, m)  # as in _rescale
    s = tl.sum(fast_exp(xe - ref), axis=0)
    cols = tl.arange(0, BLOCK_N)
    for start in range(0, n_body, BLOCK_N):
        c = start + cols
        x = tl.load(x_body + c, mask=c < n_body, other=float("-inf"), eviction_policy="evict_last")
        x = x.to(tl.float32)
        m, ref, s = _rescale(m, s, tl.max(x, axis=0))
        s += tl.sum(fast_exp(x - ref), axis=0)
    shift = _output_shift(m, s, LOG)
    ye = _output(xe, shift, LOG)
    tl.store(y_ptr + y_off + ec, ye.to(y_ptr.dtype.element_ty), mask=em)
    n_chunks = tl.cdiv(n_body, BLOCK_N)
    for k in range(0, n_chunks):  # last chunk first: the chunks read last are still in L2
        c = (n_chunks - 1 - k) * BLOCK_N + cols
        mask = c < n_body
        x = tl.load(x_body + c, mask=mask, other=0.0, eviction_policy="evict_first")
        y = _output(x.to(tl.float32), shift, LOG)
        tl.store(y_body + c, y.to(y_ptr.dtype.element_ty), mask=mask, eviction_policy="evict_first")


@kernel
def _softmax_bwd_aligned_kernel(
    dy_ptr,  # as in _softmax_bwd_row_kernel; every tensor's rows start at the same offsets
    y_ptr,  # within 16 bytes
    dx_ptr,
    n_cols,
    n_inner,
    stride_dyo,
    stride_dyi,
    stride_yo,
    stride_yi,
    stride_dxo,
    stride_dxi,
    LOG: tl.constexpr,
    OUTER: tl.constexpr,
    VEC: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One row per program: sum(dy * y) (log_softmax: sum(dy)), then dx, over the row's aligned
    body in chunks and its edge (see ALIGNED)."""
    o, i = program_row(n_inner, OUTER)
    dy_off = o * stride_dyo + i * stride_dyi
    y_off = o * stride_yo + i * stride_yi
    dx_off = o * stride_dxo + i * stride_dxi
    head, n_body = aligned_row(dy_off, n_cols, VEC)
    dy_body = dy_ptr + tl.multiple_of(dy_off + head, VEC)
    y_body = y_ptr + tl.multiple_of(y_off + head, VEC)
    dx_body = dx_ptr + tl.multiple_of(dx_off + head, VEC)
    ec, em = edge_cols(head, n_body, n_cols, VEC)
    dye = tl.load(dy_ptr + dy_off + ec, mask=em, other=0.0).to(tl.float32)
    ye = tl.load(y_ptr + y_off + ec, mask=em, other=0.0).to(tl.float32)
    total = _bwd_row_total(dy_body, y_body, n_body, LOG, BLOCK_N)
    if LOG:
        total += tl.sum(dye, axis=0)
        dxe = dye - fast_exp(ye) * total
    else:
        total += tl.sum(dye * ye, axis=0)
        dxe = ye * (dye - total)
    tl.store(dx_ptr + dx_off + ec, dxe.to(dx_ptr.dtype.element_ty), mask=em)
    _bwd_row_dx(dy_body, y_body, dx_body, n_body, total, LOG, BLOCK_N)


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------


def _launch_kwargs(cfg: RowConfig, layout: RowLayout) -> dict:
    return {
        "OUTER": layout.n_outer > 1,
        "ONE_TILE": cfg.programs == cfg.n_tiles,
        "INT64": layout.needs_int64(),
        "BLOCK_R": cfg.BLOCK_R,
        "BLOCK_N": cfg.BLOCK_N,
        "num_warps": cfg.num_warps,
    }


def misaligned_rows(layout: RowLayout, tensors: Sequence[torch.Tensor]) -> int:
    """Elements per 16 bytes (VEC) when the aligned-walk kernels apply to ``tensors`` (those
    with columns, in the layout's order): contiguous columns, 16-byte aligned base pointers,
    every tensor's rows starting at the same offset within 16 bytes, and some row not aligned
    (or a width not a whole number of vectors); 0 otherwise (see ALIGNED)."""
    size = tensors[0].element_size()
    vec = 16 // size
    if not ALIGNED or any(t.element_size() != size or t.data_ptr() % 16 for t in tensors):
        return 0
    if any(strides[1] != 1 for strides in layout.strides):
        return 0
    axes = [a for a, n in ((0, layout.n_outer), (2, layout.n_inner)) if n > 1]
    residues = {tuple(strides[a] % vec for a in axes) for strides in layout.strides}
    if len(residues) != 1:
        return 0
    if layout.n_cols % vec == 0 and not any(next(iter(residues))):
        return 0  # aligned rows: the other kernels' loads are vectors already
    return vec


def _aligned_config(n_cols: int, element_size: int, backward: bool) -> tuple[int, int]:
    """(BLOCK_N, warps) of an aligned-walk kernel (see ALIGNED)."""
    if backward:
        return row_program_config(
            n_cols, element_size, ALIGNED_WARPS_BWD, ALIGNED_ELEMS_PER_THREAD_BWD
        )
    warps, per_thread = ALIGNED_FWD.get(element_size, ALIGNED_FWD[4])
    return min(32 * warps * per_thread, next_power_of_2(n_cols)), warps


def softmax_fwd(x: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    """softmax (or log_softmax) of x along ``dim`` (already normalized to 0 <= dim < x.dim())."""
    (x,), (y,), _, layout = plan_rows([x], (dim,), 1)
    if layout is None:
        return y
    (sxo, sxn, sxi), (syo, syn, syi) = layout.strides
    if layout.n_cols >= ALIGNED_MIN_COLS_FWD:
        vec = misaligned_rows(layout, [x, y])
        if vec:
            block_n, warps = _aligned_config(layout.n_cols, x.element_size(), backward=False)
            _softmax_fwd_aligned_kernel[(layout.n_outer * layout.n_inner,)](
                x, y, layout.n_cols, layout.n_inner, sxo, sxi, syo, syi,
                LOG=log, OUTER=layout.n_outer > 1, VEC=vec, BLOCK_N=block_n, num_warps=warps,
            )  # fmt: skip
            return y
    cfg = softmax_config(layout, x.device, backward=False)
    _softmax_fwd_kernel[(cfg.programs,)](
        x,
        y,
        layout.n_cols,
        layout.n_inner,
        cfg.n_iblocks,
        cfg.n_tiles,
        sxo,
        sxn,
        sxi,
        syo,
        syn,
        syi,
        LOG=log,
        LOOPED=cfg.LOOPED,
        PREFETCH=cfg.LOOPED and LOOP_PREFETCH_FWD,
        CHUNK_MAX=cfg.LOOPED and LOOP_CHUNK_MAX,
        **evict_kwargs(cfg.LOOPED and LOOP_EVICT_FWD),
        **_launch_kwargs(cfg, layout),
    )
    return y


def _row_bwd_config(n_cols: int, element_size: int) -> tuple[int, int]:
    """(BLOCK_N, warps) of _softmax_bwd_row_kernel (see ROW_BWD)."""
    table = ROW_BWD_WARPS_FP32 if element_size == 4 else ROW_BWD_WARPS
    return row_program_config(n_cols, element_size, table, ROW_BWD_ELEMS_PER_THREAD)


def _row_bwd(layout: RowLayout, element_size: int, log: bool) -> bool:
    """Whether the backward takes _softmax_bwd_row_kernel (see ROW_BWD): contiguous rows
    of 16-bit (or fp32 softmax) elements within the widths above."""
    (_, sgn, _), (_, syn, _), (_, sdn, _) = layout.strides
    if not (ROW_BWD and sgn == syn == sdn == 1):
        return False
    if element_size == 4:
        return not log and ROW_BWD_MIN_COLS <= layout.n_cols <= ROW_BWD_MAX_COLS_FP32
    low = ROW_BWD_MIN_COLS_LOG if log else ROW_BWD_MIN_COLS
    return element_size == 2 and low <= layout.n_cols <= ROW_BWD_MAX_COLS


def softmax_bwd(grad: torch.Tensor, y: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    """Gradient of softmax (log_softmax) along ``dim`` from the upstream gradient and output."""
    (grad, y), (dx,), _, layout = plan_rows([grad, y], (dim,), 1)
    if layout is None:
        return dx
    (sgo, sgn, sgi), (syo, syn, syi), (sdo, sdn, sdi) = layout.strides
    if layout.n_cols >= ALIGNED_MIN_COLS_BWD:
        vec = misaligned_rows(layout, [grad, y, dx])
        if vec:
            block_n, warps = _aligned_config(layout.n_cols, y.element_size(), backward=True)
            _softmax_bwd_aligned_kernel[(layout.n_outer * layout.n_inner,)](
                grad, y, dx, layout.n_cols, layout.n_inner, sgo, sgi, syo, syi, sdo, sdi,
                LOG=log, OUTER=layout.n_outer > 1, VEC=vec, BLOCK_N=block_n, num_warps=warps,
            )  # fmt: skip
            return dx
    if _row_bwd(layout, y.element_size(), log):
        block_n, warps = _row_bwd_config(layout.n_cols, y.element_size())
        _softmax_bwd_row_kernel[(layout.n_outer * layout.n_inner,)](
            grad, y, dx, layout.n_inner, sgo, sgi, syo, syi, sdo, sdi,
            N_COLS=layout.n_cols, LOG=log, OUTER=layout.n_outer > 1, BLOCK_N=block_n,
            num_warps=warps,
        )  # fmt: skip
        return dx
    cfg = softmax_config(layout, y.device, backward=True)
    _softmax_bwd_kernel[(cfg.programs,)](
        grad,
        y,
        dx,
        layout.n_cols,
        layout.n_inner,
        cfg.n_iblocks,
        cfg.n_tiles,
        sgo,
        sgn,
        sgi,
        syo,
        syn,
        syi,
        sdo,
        sdn,
        sdi,
        LOG=log,
        LOOPED=cfg.LOOPED,
        PREFETCH=cfg.LOOPED and LOOP_PREFETCH_BWD,
        **evict_kwargs(cfg.LOOPED and LOOP_EVICT_BWD),
        **_launch_kwargs(cfg, layout),
    )
    return dx


# ----------------------------------------------------------------------------------------------
# torch.library registration
# ----------------------------------------------------------------------------------------------


@define_op("tritonkit::softmax")
def _softmax_op(x: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    return softmax_fwd(x, dim, log)


@_softmax_op.register_fake
def _(x, dim, log):
    return plan_rows([x], (dim,), 1, count=False)[1][0]


@define_op("tritonkit::softmax_backward")
def _softmax_backward_op(grad: torch.Tensor, y: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    return softmax_bwd(grad, y, dim, log)


@_softmax_backward_op.register_fake
def _(grad, y, dim, log):
    return plan_rows([grad, y], (dim,), 1, count=False)[1][0]


# Eager calls on real tensors skip the ops' dispatch (see eager_direct).
call_softmax = eager_direct(_softmax_op)
call_softmax_backward = eager_direct(_softmax_backward_op)


# ----------------------------------------------------------------------------------------------
# Autograd
# ----------------------------------------------------------------------------------------------


class SoftmaxFunction(torch.autograd.Function):
    """softmax or log_softmax along one dim; the backward needs only the output."""

    @staticmethod
    def forward(ctx, x, dim, log):
        y = call_softmax(x, dim, log)
        ctx.dim, ctx.log = dim, log
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return call_softmax_backward(grad, y, ctx.dim, ctx.log), None, None


# ----------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------


def normalize_dim(op: str, name: str, dim: object, ndim: int) -> int:
    """``dim`` as an index in ``[0, max(ndim, 1))``; a 0-d tensor accepts 0 and -1."""
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{op}: {name} must be an int, got {type(dim).__name__}")
    rank = max(ndim, 1)
    if not -rank <= dim < rank:
        raise ValueError(
            f"{op}: {name} must be in [{-rank}, {rank - 1}] for a {ndim}-d tensor, got {dim}"
        )
    return dim % rank


def _softmax(op: str, x: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    (x,) = cast(autocast_dtype("log_softmax" if log else "softmax", x), x)
    check_tensor(op, "x", x)
    d = normalize_dim(op, "dim", dim, x.dim())
    if x.dim() == 0:
        return apply(SoftmaxFunction, x.reshape(1), 0, log).reshape(())
    return apply(SoftmaxFunction, x, d, log)


@policy(cuda=FP32)
def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``torch.softmax(x, dim)``, with autograd.

    A row that fits in registers (up to ``MAX_FUSED_COLS`` elements) is read once; a longer one
    is read twice, the second time from L2. Any ``dim`` is reduced in place through strides,
    without a transpose copy.

    Args:
        x: float32, float16 or bfloat16 tensor on a CUDA device, any shape and strides.
        dim: the dimension to normalize over (negative counts from the end).

    Returns:
        A tensor like x (its strides when x is dense), in x's dtype; rows containing NaN or
        +inf are NaN, as in PyTorch. Under CUDA ``torch.autocast`` x is first cast to float32
        (so is the result), as ``torch.softmax``'s is.
    """
    return _softmax("tritonkit.softmax", x, dim, False)


@policy(cuda=FP32)
def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``torch.log_softmax(x, dim)``, with autograd; computed as ``x - max - log(sum(exp))``.

    Args:
        x: float32, float16 or bfloat16 tensor on a CUDA device, any shape and strides.
        dim: the dimension to normalize over (negative counts from the end).

    Returns:
        A tensor like x (its strides when x is dense), in x's dtype (float32 under CUDA
        ``torch.autocast``, as for ``torch.log_softmax``).
    """
    return _softmax("tritonkit.log_softmax", x, dim, True)


# The family's public functions: tritonkit.__all__ and tritonkit.functional derive from these.
__all__ = ["log_softmax", "softmax"]
