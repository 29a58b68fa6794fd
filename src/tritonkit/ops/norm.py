"""Norm family: LayerNorm and RMSNorm, alone or fused with the residual add, forward and backward.

The kernels see their tensors as ``(n_outer, n_cols, n_inner)`` with real strides, as the
softmax family does (``ops/softmax.py``: ``plan_rows``), the normalized dims merged into the
column axis.

Forward: rows of 1536-65536 contiguous columns without a residual take one program each, the
row width a compile-time constant (``ROW_FWD``: one compilation per width, as torch.compile
does), two sweeps over chunks, the second re-reading the row from L2 (16-bit LayerNorm rows of
24576 columns or more sum the first sweep per thread: ``ROW_FWD_THREAD_SUMS_MIN_COLS``).
Otherwise a row that fits in registers (``MAX_FUSED_COLS``) is read once; a wider row is read
twice (statistics, then the output, last chunk first), the second time from L2. Per row it
saves two fp32 values for the backward: rstd and, for LayerNorm, the mean. LayerNorm is stable
on rows with a large mean and a small variance (fp32 rows of 1e4 + N(0, 1)): every value of
an fp32 row is first shifted by the row's first element, which makes the subtraction of
nearby values exact, the mean is that of the shifted values, and the variance is that of the
deviations from it (two passes over registers). A looped row is shifted (again) by its first
chunk's mean, and sums its values and squares per lane (LOOP_STATS_LN 1): that mean is within
sqrt(n / chunk) standard deviations of the row's, so E[d^2] - E[d]^2 loses at most a few bits
(chunks merged with Chan's formula with LOOP_STATS_LN 0, also for 16-bit rows with a residual,
their means taken relative to the first chunk's). The saved "mean" is the mean after the
first-element shift, and the backward shifts again by the same first element. 16-bit rows skip
the first-element shift (``_shifts``): their own rounding dwarfs what it saves. Whether to
shift depends on the dtype alone, so that a backward whose path (registers or looped) differs
from its forward's reads the saved mean as the forward wrote it. LayerNorm rows in registers
of 8193-16384 columns are walked one program per SM through the compiler's software pipeline
(``FWD_PIPELINE_*``); narrower rows take one program per row tile.

Backward: dx per row, and the weight and bias gradients as fp32 partial sums, one row of them
per program, each program walking a group of rows; a second pass sums the partials in a fixed
order, so the result is deterministic. Rows in registers reach each program through the
compiler's software pipeline (``BWD_STAGES``: tiles loaded into shared memory ahead by
cp.async). Rows wider than ``BWD_MAX_FUSED_COLS`` (8192: wider rows in registers spill) first
get their two row sums (sum(w * dy * xhat), sum(w * dy)) from a looped pass, then a
column-block pass computes dx and the partial sums, with the next tile's loads issued by hand
before each tile's work (RMSNorm: through the compiler's pipeline).

The fused residual forms return ``(norm(x + residual), x + residual)``: the sum is normalized in
fp32 before it is rounded and stored (the unfused eager code normalizes the rounded sum, one
rounding less accurate); the backward reads the stored sum, not x and residual.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from tritonkit._autocast import FP32, autocast_dtype, cast, policy
from tritonkit.ops._core.device import shared_memory_per_block, sm_count
from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.layout import LAYOUT_COPIES, cdiv, next_power_of_2
from tritonkit.ops._core.reduce import sum_partials
from tritonkit.ops._core.registry import apply, define_op, eager_direct
from tritonkit.ops._core.rows import (
    RowConfig,
    RowLayout,
    col_ids,
    evict_kwargs,
    load_chunk,
    n_steps,
    plan_rows,
    pow2_floor,
    program_row,
    reverse_start,
    row_config,
    row_program_config,
    row_program_warps,
    row_warps,
    tile_rows,
)
from tritonkit.ops._core.validate import (
    check_operand,
    check_same_dtype,
    check_same_shape,
    check_tensor,
)

# ----------------------------------------------------------------------------------------------
# Configs: every block size of the family is chosen here (benchmarks/sweep_norms.py sweeps them).
# ----------------------------------------------------------------------------------------------

# Widest row kept in registers; wider rows are looped in chunks of LOOP_BLOCK_N (forward) and
# take the two-kernel backward. Chosen by the H200 sweep (benchmarks/NOTES.md): chunks of 16384
# (rms_norm (4096, 65536) forward 3132 GB/s, 8192: 2761), 8 forward programs per SM.
MAX_FUSED_COLS = 16384
LOOP_BLOCK_N = 16384
TILE_ELEMS = 4096  # short rows share a tile of up to this many elements
ADJACENT_ROWS = 64  # rows per tile when rows are adjacent in memory (a transposed input)
ELEMS_PER_THREAD = 16
MAX_WARPS = 32
# Looped forward (rows wider than MAX_FUSED_COLS), each knob for LayerNorm (plain name) and
# RMSNorm (_RMS): programs per SM (each keeps a row in flight between its two sweeps, in L2);
# issuing the next chunk's loads before working on the current one (LOOP_PREFETCH); elements
# per thread; rows per tile (chunks of LOOP_BLOCK_N / rows columns, so that each weight and bias
# chunk loaded serves several rows); the statistics (LOOP_STATS: 1 per lane, reduced once per
# row: RMSNorm's sum of squares, LayerNorm's sums of the values shifted by the first chunk's
# mean; 0 per chunk: RMSNorm's sum, LayerNorm's Chan merge); and softmax's L2 hints (the first
# sweep's loads evict_last, the second's loads and stores evict_first). H200 sweep (run 22,
# benchmarks/NOTES.md), (4096, 65536) bf16, same-shape copy 4207 GB/s:
# - rms_norm 3689-3697 GB/s (88%): a sum per chunk, hints, no prefetch, 32 per thread, 4 per SM,
#   one row per tile (3404 with the run-14 recipe: per lane, prefetch, no hints, 2 per SM; 3151-
#   3190 at two rows per tile);
# - layer_norm 3058 (73%): per lane, hints, prefetch, 16 per thread, 2 per SM, two rows per tile
#   (2857 with Chan's merge per chunk and one row, the run-14 recipe; 2899 per lane, one row).
LOOP_PROGRAMS_PER_SM = 2
LOOP_PROGRAMS_PER_SM_RMS = 4
LOOP_PREFETCH = True
LOOP_PREFETCH_RMS = False
LOOP_ELEMS_PER_THREAD_RMS = 32  # LayerNorm: ELEMS_PER_THREAD, or LOOP_ELEMS_PER_THREAD_LN_WIDE
# The looped forward of fp32 rows with a residual (8 bytes loaded per element): elements per
# thread, LayerNorm and RMSNorm, the chunks narrowed to fit MAX_WARPS. LayerNorm's per-lane sums
# and prefetched chunk spill at ELEMS_PER_THREAD (212 bytes, ptxas for sm_90a,
# benchmarks/spill_audit.py). H200 (run 24), add_layer_norm (4096, 65536) fp32: 1.478 ms at 8,
# 1.782 at 16; add_rms_norm 1.342 at 16, 1.509 at 32. Halving did not pay with 4 bytes per
# element (layer_norm fp32 0.783 vs 0.684 ms; add_layer_norm bf16 1.038 vs 0.705).
LOOP_ELEMS_PER_THREAD_LN_WIDE = 8
LOOP_ELEMS_PER_THREAD_RMS_WIDE = 16
# Looped forward of fp32 rows with a residual: the first sweep stores h = x + residual (an
# output anyway) and the second reads h instead of x and the residual. A row of both is 512 KiB
# at 65536 columns, more than L2 keeps for every program between the sweeps.
LOOP_SUM_FIRST = True
LOOP_ROWS_LN = 2
LOOP_ROWS_RMS = 1
LOOP_STATS_LN = 1
LOOP_STATS_RMS = 0
# The looped LayerNorm forward of 16-bit rows with a residual: one row per tile and Chan's merge
# per chunk (the per-lane sums beside x and the residual spill: 16 bytes, spill_audit.py). H200
# (run 45), add_layer_norm (4096, 65536) bf16: 0.630 ms (two rows, per lane 0.717; torch.compile
# 0.680).
LOOP_ROWS_LN_RES16 = 1
LOOP_STATS_LN_RES16 = 0
LOOP_EVICT = True
# Forward of rows in registers: programs per SM walking row tiles, so that each loads the weight
# and bias once, not once per row; each issues the next tile's loads before reducing the
# current one (FWD_PREFETCH). H200 sweep (benchmarks/NOTES.md, run 9), (16384, 4096) bf16:
# 32 elements per thread (4 warps), 8 programs per SM, prefetch: rms_norm 3622-3753 GB/s
# (3495-3569 without prefetch), layer_norm 3332-3401 (3063-3090 at 16 elements per thread).
# One Chan-merge reduction for LayerNorm's mean and variance was slower (2176-2489).
# Since run 20 both norms take one row tile per program (programs per SM 0), launched without
# the grid-stride loop and the outer-index division (ONE_TILE, OUTER: both cost time in
# benchmarks/exp_row_launch.py), at 16 elements per thread. H200 sweep (run 20b), (16384, 4096)
# bf16: layer_norm 3667 GB/s (3515 persistent at 8 per SM, 3609 at 32 per thread; Liger 3636),
# rms_norm 3936 (3745 persistent; Liger 3967). Loading the weight and bias after the row
# instead of before it made no difference once the loop was gone.
FUSED_ELEMS_PER_THREAD = 16
# Rows in registers without a residual: the output pass re-reads the row (an L1/L2 hit: the
# first read evict_last, the second evict_first, the weight and bias evict_last) instead of
# keeping it live across the reductions, as torch.compile's kernels do; elements per thread by
# (RMSNorm, element size), and no re-read where the key is missing. H200 (runs 33-34,
# benchmarks/NOTES.md), ms re-read / kept, bf16: rms_norm (16384, 4096) 0.0635 / 0.0637, (8192,
# 8192) 0.0637 / 0.0661, (4096, 16384) 0.0670 / 0.0925, (16384, 5120) 0.0920 / 0.0991;
# layer_norm (65536, 1024) 0.0643 / 0.0752, (8192, 8192) 0.0734 / 0.0866, (16384, 5120) 0.1235
# / 0.1393, (16384, 4096) 0.0693 / 0.0694, (4096, 16384) 0.1132 / 0.1073. fp32: rms_norm
# (16384, 4096) 0.1248 / 0.1286; layer_norm 0.1638 / 0.1280 (kept in registers).
FWD_REREAD = True
FWD_REREAD_ELEMS_PER_THREAD = {(False, 2): 32, (True, 2): 16, (True, 4): 8}
FWD_PROGRAMS_PER_SM = 0  # LayerNorm
FWD_PROGRAMS_PER_SM_RMS = 0
FWD_PREFETCH = True
# Forward of LayerNorm rows in registers of FWD_PIPELINE_COLS columns or more (a row tile of
# 8193-16384), without a residual: one program per SM walks the row tiles through the
# compiler's software pipeline (tl.range's num_stages: cp.async into shared memory) at 32
# elements per thread, instead of one 32-warp program per row. H200 (run 42, benchmarks/NOTES.md),
# ms, against one program per row: (4096, 16384) bf16 0.0688 vs 0.1140 (torch.compile 0.0689),
# fp16 0.0699 vs 0.1095, fp32 0.1388 vs 0.1450; (2048, 16384) bf16 0.0372 vs 0.0598. Not at
# 8192 (layer_norm (8192, 8192) bf16 0.0786 vs 0.0733) nor for RMSNorm (rms_norm (4096, 16384)
# bf16 0.0679 vs 0.0663 re-read).
FWD_PIPELINE_COLS = 16384
FWD_PIPELINE_STAGES = 3
FWD_PIPELINE_ELEMS_PER_THREAD = 32
# Forward of one row per program with the width a compile-time constant (ROW_FWD_*): rows
# without a residual whose columns are contiguous (not the adjacent rows of a transposed input),
# of ROW_FWD_MIN_COLS to ROW_FWD_MAX_COLS columns. Two sweeps over chunks (statistics, then the
# output, re-reading the row from L2), the first sweep's loads evict_last, the second's
# evict_first, as torch.compile's reductions do. With the width a constant the compiler
# unrolls both sweeps; the same kernel with the width at run time (with or without tl.range's
# loop_unroll_factor) was 6-20% slower (run 84). The cost: one compilation per row width. Warps
# and chunks per norm (_row_fwd_config); LayerNorm wants chunks that divide the row (a partial
# last chunk cost up to 50% at two chunks: run 87). H200 (runs 88-89, benchmarks/NOTES.md),
# 128 MiB per tensor, ms, this path / the paths it replaces / the best of torch.compile and
# Liger: bf16 layer_norm 2560 0.0658 / 0.0908 / 0.0899, 4096 0.0666 / 0.0694 / 0.0707, 5120
# 0.0664 / 0.1008 / 0.1129, (4096, 65536) 0.3106 / 0.3460 / 0.4425; rms_norm 5120 0.0643 /
# 0.0744 / 0.0715, 10240 0.0649 / 0.0837 / 0.0649; fp32 layer_norm 5120 0.0679 / 0.0796 /
# 0.0727. Below 1536 columns it lost (layer_norm bf16 1024: 0.0762 / 0.0655).
ROW_FWD = True
ROW_FWD_MIN_COLS = 1536
ROW_FWD_MAX_COLS = 65536
ROW_FWD_MAX_BYTES_LN = 131072  # layer_norm (4096, 65536) fp32: 0.7262 ms, looped 0.6875 (run 91)
# fp32 LayerNorm rows, with Welford's update per lane: layer_norm (1024, 32768) fp32 0.0843 ms,
# torch.compile 0.0812 (run 97; the old path 0.0802 in run 89).
ROW_FWD_MAX_BYTES_LN_FP32 = 65536
# fp32 LayerNorm rows of these power-of-2 widths take the row kernel too, in one chunk at
# ROW_FWD_POW2_LN_FP32_WARPS (the other power-of-2 widths stay in registers: see _row_fwd).
# H200 (run 131, benchmarks/NOTES.md), same run, ms, this / in registers / torch.compile /
# Liger: (16384, 4096) 0.1256 / 0.1300 / 0.1270 / 0.1283; (8192, 8192) 0.1280 / 0.1308 / 0.1286.
# In chunks of 4096 at 16 warps (the byte rule's) 0.1335 at 8192; at 8 warps 0.1283-0.1324 at
# 4096. At 2048 no config gained more than 3% on rows in registers (0.1266 / 0.1310).
ROW_FWD_POW2_LN_FP32 = (4096, 8192)
ROW_FWD_POW2_LN_FP32_WARPS = 16
ROW_FWD_WARPS = ((8192, 4), (20480, 8), (40960, 16))
ROW_FWD_ELEMS_PER_THREAD = (4, 8)
ROW_FWD_WARPS_RMS = ((6144, 4), (14336, 8), (32768, 16))
ROW_FWD_ELEMS_PER_THREAD_RMS = ((4, 16), (8, 16), (16, 8), (32, 8))
# 16-bit rows: the output's stores marked evict_first (ROW_FWD_STORE), so that they do not push
# out of L2 the rows that the second sweep re-reads, and LayerNorm rows normalized as x * rstd -
# mean * rstd, one FMA per element (ROW_FWD_SCALE_FIRST; a 16-bit input holds no digits that
# this rounding of mean * rstd could lose; fp32 rows, not measured, keep both as they were).
# H200, same run (run 108), bf16, ms, both / neither / evict_first alone: layer_norm (4096,
# 65536) 0.3000 / 0.3073 / 0.3029, (16384, 4096) 0.0659 / 0.0670 / 0.0658, (6553, 10240) 0.0656
# / 0.0663 / 0.0659, (2730, 24576) 0.0701 / 0.0710 / 0.0707, (26214, 2560) 0.0658 / 0.0658 /
# 0.0660. RMSNorm gained only on the widest rows: (4096, 65536) 0.2794 / 0.2822, and lost
# 0.3-0.8% on rows of 5-48 KiB ((16384, 4096) 0.0643 / 0.0638), so its rows over
# ROW_FWD_STORE_MIN_BYTES_RMS take it (rows of 48-128 KiB were not measured).
# 16-bit LayerNorm rows of ROW_FWD_THREAD_SUMS_MIN_COLS columns or more: the first sweep's sums
# per thread (THREAD_ELEMS), not per lane. ptxas: at (4096, 65536) the per-lane sweep, fully
# unrolled with seven chunk loads in flight, takes 53 registers a thread (one 32-warp program
# per SM); per thread, the sweep stays a loop at 32 registers (two per SM). H200, same run
# (run 139, benchmarks/NOTES.md), ms, per thread / per lane / copy of the row bytes: bf16
# (4096, 65536) 0.2937-0.2940 / 0.2985-0.2992 / 0.2535-0.2537; fp16 0.2942-0.2947 /
# 0.3612-0.3622; (8192, 32768) bf16 0.2535-0.2540 / 0.2546-0.2549; (6554, 40000) bf16 0.3189 /
# 0.3481 (the sweep unrolled by tl.static_range: 0.3307, and 0.2923-0.2936 at 65536). 128 MiB
# per tensor (run 140): per thread gained 0.7-1.1% at 24576 and 32768 columns, lost 1-3% at
# 1536 (bf16), 4096, 8192 and 10240, and tied elsewhere.
ROW_FWD_THREAD_SUMS_MIN_COLS = 24576
ROW_FWD_STORE = "evict_first"
ROW_FWD_STORE_MIN_BYTES_RMS = 65536
ROW_FWD_SCALE_FIRST = True
# Backward of rows in registers up to BWD_MAX_FUSED_COLS columns; wider rows take the two-kernel
# path (row sums, then dx by column blocks). In registers, rows of 8193-16384 spill at 32 warps
# (ptxas, sm_90a: LayerNorm 368-568 bytes, RMSNorm 108-192). Rows the forward keeps in
# registers (up to MAX_FUSED_COLS) take that path in chunks of BWD_MID_BLOCK_N, both passes
# through the compiler's pipeline (BWD_MID_STAGES), the row-sum pass at
# BWD_MID_PROGRAMS_PER_SM[element size]. H200, bf16, 128 MiB per tensor, backward (dx, dw, db),
# ms (benchmarks/NOTES.md): in registers (run 77, same run) layer_norm 9216 0.669, 12288 0.552,
# 16384 0.467 against torch.compile's 0.209, 0.222, 0.208; this path (run 79, same run)
# layer_norm 9216 0.198 / 12288 0.184 / 16384 0.183 against torch.compile 0.210 / 0.224 / 0.212
# and Liger 0.326 / 0.278 / 0.246, rms_norm 0.187 / 0.176 / 0.177 against torch.compile 0.218 /
# 0.205 / 0.179 and Liger 0.216 / 0.193 / 0.183. fp32 rows (run 78) run best at 2 per SM.
BWD_MAX_FUSED_COLS = 8192
BWD_MID_BLOCK_N = 2048
BWD_MID_STAGES = 3
BWD_MID_PROGRAMS_PER_SM = {2: 4, 4: 2}
# Backward: programs per SM walking row groups; each writes one fp32 row of weight (and bias)
# partial sums and issues the next tile's loads (rows and saved statistics) before reducing
# the current one. At 8 warps the kernel takes 166-216 registers per thread (ptxas, sm_90a):
# one program is resident per SM. H200 sweep (run 9), (16384, 4096) bf16, one row per tile:
# rms_norm 3374 GB/s at 2 per SM with prefetch (3007 without, 2841 at 1); layer_norm 2614 at
# 1 per SM (2244 at 2; 1590 without prefetch).
BWD_PROGRAMS_PER_SM = 1  # RMSNorm
BWD_PROGRAMS_PER_SM_LN = 1  # LayerNorm
BWD_ELEMS_PER_THREAD = 16
BWD_PREFETCH = True
# Backward of rows in registers: the compiler's software pipeline over each program's row tiles
# (tl.range's num_stages: a tile's loads go to shared memory by cp.async, STAGES - 1 tiles in
# flight) instead of the hand prefetch into registers, which holds one tile and costs registers;
# None: the hand prefetch (BWD_PREFETCH), as for LayerNorm's wide rows (WIDE_BWD_STAGES_RMS).
# The depth is capped by the device's shared memory (_depth). LayerNorm goes one tile deeper
# where its tiles are at most BWD_DEEP_TILE_BYTES (16-bit dy and x, two rows of 4096). H200
# sweeps (runs 38-39, benchmarks/NOTES.md), ms, bf16 (16384, 4096), one program per SM:
# layer_norm 0.1142 at 4 (0.1216 at 3; hand prefetch 0.1334), rms_norm 0.1073 at 3 (0.1094 at 4;
# 0.1089); at 3 / 4 / hand: add_layer_norm bf16 0.1446 / 0.1533 / 0.1632, layer_norm fp32 (8192,
# 8192) 0.2142 / 0.2180 / 0.3291, rms_norm bf16 (4096, 16384) 0.1772 / 0.1770 / 0.2296. The hand
# prefetch stays ahead by 1-5% on fp32 rows of 1024-8192 (rms_norm (16384, 4096) 0.2032 vs
# 0.2004, layer_norm 0.2166 vs 0.2083).
BWD_STAGES = 3
BWD_STAGES_LN = 4  # LayerNorm, tiles of at most BWD_DEEP_TILE_BYTES
BWD_DEEP_TILE_BYTES = 32768
# Every pipeline of the family leaves this many bytes of the device's shared memory per program
# free (reductions' scratch; the LayerNorm backward at 4 stages takes 3 tiles + 312 bytes).
PIPELINE_SMEM_SLACK = 8192
# Backward tiles: elements per tile, at most BWD_TILE_BYTES of the row tensors read per tile (dy
# and x, and the residual's gradient for the fused forms). Rows of 4096 take two rows per tile,
# so each prefetch brings twice the bytes, except fp32 rows with a residual gradient (two of
# those spilled: add_layer_norm fp32 (16384, 4096) backward 0.470 ms vs 0.287 in run 20c). And the
# tile height up to which the weight and bias partial sums are reduced over each tile's rows as
# it goes (one row of accumulators) instead of once after the loop (a tile of them). H200
# sweep (run 20), (16384, 4096) bf16, 1 program per SM: rms_norm 3497 GB/s (3370 with one-row
# tiles at 2 per SM; 2871 reducing per tile), layer_norm 3069 reducing per tile (2990 not; 2628
# with one-row tiles).
BWD_TILE_ELEMS = 8192
BWD_TILE_BYTES = 65536
BWD_REDUCE_ROWS = 0  # RMSNorm
BWD_REDUCE_ROWS_LN = 2  # LayerNorm
# Backward of wide rows: columns per program of the dx pass (80-128 registers at 8 warps), and
# its programs per SM.
WIDE_BWD_BLOCK_N = 4096
WIDE_BWD_PROGRAMS_PER_SM = 2
# Wide rows, RMSNorm: both passes through the compiler's pipeline (the row-sum pass over its
# chunks, the dx pass over its row tiles), STAGES deep; None: the hand prefetch. H200 (run 38),
# rms_norm (4096, 65536) bf16: 0.6435 ms at 3 and 3 (hand prefetch 0.6941). LayerNorm lost with
# it (0.724 ms at best against 0.689), so it keeps the hand prefetch.
WIDE_SUMS_STAGES_RMS = 3
WIDE_BWD_STAGES_RMS = 3
# Wide rows' first backward pass (the row sums), elements per thread for fp32 rows: dy and x
# at ELEMS_PER_THREAD spill (layer_norm (4096, 65536) fp32: 260 bytes, benchmarks/spill_audit.py).
BWD_SUMS_ELEMS_PER_THREAD_FP32 = 8
# LayerNorm of 16-bit rows in registers: shift by the first element too (see _shifts). H200
# sweep (run 16), (16384, 4096) bf16, without: forward 3483 GB/s (3442 with), backward 2633
# (2605); without the selects of EVEN_N the forward took 3270.
LN_SHIFT_16BIT = False
# Rows in registers whose length is the tile's (a power of 2): the forward skips its selects.
EVEN_N = True


def _shifts(rms: bool, dtype: torch.dtype) -> bool:
    """Whether LayerNorm shifts each row by its first element: the forward saves the mean of
    the shifted row, so the backward must shift by the same value. A function of the dtype
    only, so that every forward path (rows in registers or looped, whatever the layout) and
    every backward path agree.

    Always for float32: a mean of 1e4 + N(0, 1) values in fp32 is off by ~1e-3 unshifted, an
    error in every output. A 16-bit input cannot hold such rows to that precision (bf16 steps
    by 64 at 1e4), so 16-bit rows skip the shift unless LN_SHIFT_16BIT (the looped statistics
    are taken about the first chunk's mean either way).
    """
    return not rms and (dtype == torch.float32 or LN_SHIFT_16BIT)


def norm_config(
    layout: RowLayout,
    device: torch.device,
    rms: bool = False,
    tile_elems: int = TILE_ELEMS,
    elems_per_thread: int | None = None,
    max_fused: int | None = None,
    loop_block: int | None = None,
    loop_programs_per_sm: int | None = None,
) -> RowConfig:
    """The norm family's row config (forward; the backward's tiles with _bwd_tile_elems).
    ``elems_per_thread``: rows in registers, per thread (default FUSED_ELEMS_PER_THREAD);
    ``max_fused``, ``loop_block`` and ``loop_programs_per_sm``: the widest row in registers,
    the looped chunk and programs per SM (default MAX_FUSED_COLS, LOOP_BLOCK_N and
    LOOP_PROGRAMS_PER_SM)."""
    cfg = row_config(
        layout,
        sms=sm_count(device),
        max_fused=max_fused or MAX_FUSED_COLS,
        loop_block=loop_block or LOOP_BLOCK_N,
        tile_elems=tile_elems,
        adjacent_rows=ADJACENT_ROWS,
        elems_per_thread=ELEMS_PER_THREAD,
        loop_elems_per_thread=ELEMS_PER_THREAD,
        max_warps=MAX_WARPS,
        loop_programs_per_sm=loop_programs_per_sm or LOOP_PROGRAMS_PER_SM,
    )
    if not cfg.LOOPED:  # programs per SM 0: one row tile per program
        programs = cfg.n_tiles
        per_sm = FWD_PROGRAMS_PER_SM_RMS if rms else FWD_PROGRAMS_PER_SM
        if per_sm > 0:
            programs = min(cfg.n_tiles, per_sm * sm_count(device))
        per_thread = elems_per_thread or FUSED_ELEMS_PER_THREAD
        warps = row_warps(cfg.BLOCK_R * cfg.BLOCK_N, per_thread, MAX_WARPS)
        cfg = dataclasses.replace(cfg, programs=max(1, programs), num_warps=warps)
    return cfg


def _fit_chunk(block_r: int, block_n: int, per_thread: int) -> tuple[int, int]:
    """(BLOCK_N, warps) of a tile of ``block_r`` rows: at most ``block_n`` columns, narrowed so
    that ``per_thread`` elements per thread fit MAX_WARPS."""
    block_n = min(block_n, pow2_floor(per_thread * 32 * MAX_WARPS // block_r))
    return block_n, row_warps(block_r * block_n, per_thread, MAX_WARPS)


def _bwd_tile_elems(n_row_tensors: int, dtype: torch.dtype) -> int:
    """Elements per backward row tile: BWD_TILE_ELEMS, or fewer to read at most BWD_TILE_BYTES."""
    return min(BWD_TILE_ELEMS, pow2_floor(BWD_TILE_BYTES // (n_row_tensors * dtype.itemsize)))


def _depth(stages: int | None, stage_bytes: int, device: torch.device) -> int | None:
    """A software-pipeline depth for loads of ``stage_bytes`` per iteration: at most ``stages``,
    with its STAGES - 1 buffers within the device's shared memory per program (less
    PIPELINE_SMEM_SLACK); None (no pipeline) when not even two stages fit."""
    if stages is None:
        return None
    limit = shared_memory_per_block(device) - PIPELINE_SMEM_SLACK
    stages = min(stages, 1 + limit // stage_bytes)
    return stages if stages >= 2 else None


def _bwd_stages(
    cfg: RowConfig, block_n: int, inputs: Sequence[torch.Tensor], rms: bool, mid: bool = False
) -> int | None:
    """Pipeline depth of the dx pass over its row tiles (``cfg.BLOCK_R`` rows x ``block_n``
    columns of every row tensor): BWD_STAGES (LayerNorm's small tiles BWD_STAGES_LN), wide rows
    WIDE_BWD_STAGES_RMS, looped rows of at most MAX_FUSED_COLS (``mid``) BWD_MID_STAGES; None
    for the hand prefetch."""
    tile_bytes = cfg.BLOCK_R * block_n * sum(t.element_size() for t in inputs)
    if cfg.LOOPED and mid:
        stages = BWD_MID_STAGES
    elif cfg.LOOPED:
        stages = WIDE_BWD_STAGES_RMS if rms else None
    elif not rms and tile_bytes <= BWD_DEEP_TILE_BYTES:
        stages = BWD_STAGES_LN
    else:
        stages = BWD_STAGES
    return _depth(stages, tile_bytes, inputs[0].device)


def _bwd_grid(
    cfg: RowConfig, n_cols: int, device: torch.device, rms: bool
) -> tuple[int, int, int, int]:
    """(BLOCK_N, num_warps, column blocks, row groups) of the dx / partial-sum backward pass."""
    if cfg.LOOPED:
        block_n = pow2_floor(min(WIDE_BWD_BLOCK_N, cfg.BLOCK_N))
        col_blocks = cdiv(n_cols, block_n)
        target = WIDE_BWD_PROGRAMS_PER_SM * sm_count(device) // col_blocks
    else:
        block_n, col_blocks = cfg.BLOCK_N, 1
        target = (BWD_PROGRAMS_PER_SM if rms else BWD_PROGRAMS_PER_SM_LN) * sm_count(device)
    warps = row_warps(cfg.BLOCK_R * block_n, BWD_ELEMS_PER_THREAD, MAX_WARPS)
    return block_n, warps, col_blocks, max(1, min(cfg.n_tiles, target))


# ----------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------


@triton.jit
def _raw_sum(x, r, HAS_RESIDUAL: tl.constexpr):
    """x, or x + residual, in fp32, from the values as stored."""
    out = x.to(tl.float32)
    if HAS_RESIDUAL:
        out += r.to(tl.float32)
    return out


@triton.jit
def _load_sum(
    x_ptrs, r_ptrs, mask, HAS_RESIDUAL: tl.constexpr, ROUND: tl.constexpr, EVICT: tl.constexpr
):  # fmt: skip
    """x, or x + residual, in fp32 (rounded to x's dtype first when ROUND); 0 where masked.
    EVICT: the L2 policy of x's load."""
    x = tl.load(x_ptrs, mask=mask, other=0.0, eviction_policy=EVICT)
    r = x
    if HAS_RESIDUAL:
        r = tl.load(r_ptrs, mask=mask, other=0.0)
    out = _raw_sum(x, r, HAS_RESIDUAL)
    if HAS_RESIDUAL and ROUND:
        out = out.to(x.dtype).to(tl.float32)
    return out


@triton.jit
def _chunk_raw(
    x_rows, r_rows, start, cols, n_cols, stride_xn, stride_rn, row_mask,
    HAS_RESIDUAL: tl.constexpr, EVICT: tl.constexpr,
):  # fmt: skip
    """Columns [start, start + BLOCK_N) of a tile of rows of x (and the residual) as stored,
    0 where masked (a start at or past n_cols loads nothing), with the L2 policy EVICT ("" for
    none). Converted by ``_raw_sum`` where used, so that a prefetched chunk's loads do not stall
    the warp before it is needed."""
    x = load_chunk(x_rows, start, cols, n_cols, stride_xn, row_mask, 0.0, EVICT)
    r = x
    if HAS_RESIDUAL:
        r = load_chunk(r_rows, start, cols, n_cols, stride_rn, row_mask, 0.0, EVICT)
    return x, r


@triton.jit
def _chunk_step(
    x_rows, r_rows, load_start, cols, n_cols, stride_xn, stride_rn, row_mask, xr_next, rr_next,
    HAS_RESIDUAL: tl.constexpr, EVICT: tl.constexpr, PREFETCH: tl.constexpr,
):  # fmt: skip
    """One step of a sweep over chunks: loads the chunk at ``load_start`` and returns the chunk
    to work on (x and residual as stored) and the pending one. With PREFETCH the chunk to work
    on is the one loaded a step earlier (``xr_next``, ``rr_next``) and the new load is pending,
    so that two chunks are in flight; without, it is the new load."""
    x, r = _chunk_raw(
        x_rows, r_rows, load_start, cols, n_cols, stride_xn, stride_rn, row_mask, HAS_RESIDUAL,
        EVICT,
    )  # fmt: skip
    if PREFETCH:
        x, r, xr_next, rr_next = xr_next, rr_next, x, r
    return x, r, xr_next, rr_next


@triton.jit
def _store_chunk(rows, c, stride_n, values, mask, EVICT: tl.constexpr):
    """Store ``values`` (a tile of rows x chunk columns ``c``) in the rows' dtype."""
    tl.store(
        rows[:, None] + c[None, :] * stride_n,
        values.to(rows.dtype.element_ty),
        mask=mask,
        eviction_policy=EVICT,
    )


@triton.jit
def _fwd_tile_load(
    tile, n_tiles, n_inner, n_iblocks, x_ptr, r_ptr, cols, col_mask,
    stride_xo, stride_xn, stride_xi, stride_ro, stride_rn, stride_ri,
    SHIFT: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK_R: tl.constexpr, INT64: tl.constexpr,
    OUTER: tl.constexpr, EVICT: tl.constexpr,
):  # fmt: skip
    """(x or x + residual in fp32, LayerNorm's shift) of row tile ``tile``; the shift is each
    row's first element as stored (the backward shifts by the same value). Nothing is read past
    the last tile. EVICT: the L2 policy of x's load."""
    o, i, row_mask = tile_rows(tile, n_inner, n_iblocks, BLOCK_R, INT64, OUTER)
    row_mask = row_mask & (tile < n_tiles)
    x_rows = x_ptr + o * stride_xo + i * stride_xi
    r_rows = r_ptr + o * stride_ro + i * stride_ri
    x = _load_sum(
        x_rows[:, None] + cols[None, :] * stride_xn,
        r_rows[:, None] + cols[None, :] * stride_rn,
        row_mask[:, None] & col_mask[None, :],
        HAS_RESIDUAL,
        False,
        EVICT,
    )
    shift = tl.zeros([BLOCK_R], tl.float32)
    if SHIFT:
        shift = _load_sum(x_rows, r_rows, row_mask, HAS_RESIDUAL, True, "")
    return x, shift


@kernel
def _norm_fwd_kernel(
    x_ptr,  # input, seen as (n_outer, n_cols, n_inner) with the strides below
    r_ptr,  # residual, when HAS_RESIDUAL
    w_ptr,  # weight [n_cols], when HAS_WEIGHT
    b_ptr,  # bias [n_cols], when HAS_BIAS
    y_ptr,  # normalized output
    h_ptr,  # x + residual, when HAS_RESIDUAL
    mean_ptr,  # fp32 per row: mean of the row minus its first element (LayerNorm only)
    rstd_ptr,  # fp32 per row: 1 / sqrt(var + eps), or 1 / sqrt(mean(x^2) + eps)
    n_cols,  # normalized elements per row
    n_inner,  # rows per outer index
    n_iblocks,  # row tiles per outer index
    n_tiles,  # row tiles in all
    eps,  # added to the variance (mean square) under the square root
    stride_xo,  # x: outer, column and inner strides
    stride_xn,
    stride_xi,
    stride_ro,  # residual: as for x
    stride_rn,
    stride_ri,
    stride_yo,  # y: as for x
    stride_yn,
    stride_yi,
    stride_ho,  # h: as for x
    stride_hn,
    stride_hi,
    stride_so,  # per-row statistics: outer and inner strides
    stride_si,
    stride_w,  # weight: elements between columns
    stride_b,  # bias: elements between columns
    IS_RMS: tl.constexpr,
    SHIFT: tl.constexpr,  # LayerNorm rows shifted by their first element (see _shifts)
    HAS_RESIDUAL: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    LOOPED: tl.constexpr,  # the row spans several BLOCK_N chunks: statistics, then output
    PREFETCH: tl.constexpr,  # rows in registers: load the next tile before computing this one
    LOOP_PREFETCH: tl.constexpr,  # looped: load the next chunk before reducing this one
    LOOP_STATS: tl.constexpr,  # looped statistics: 0 per chunk (LayerNorm: Chan's merge), 1 per
    # lane (RMSNorm: sum of squares; LayerNorm: sums shifted by the first chunk's mean)
    KEEP: tl.constexpr,  # looped: L2 policy of the first sweep's loads ("" or "evict_last")
    REREAD: tl.constexpr,  # rows in registers, no residual: the output pass re-reads the row
    SUM_FIRST: tl.constexpr,  # looped with a residual: the first sweep stores h = x + residual
    # and the second reads h back (half the bytes of x and residual); fp32 only, where h holds
    # the sum exactly
    DROP: tl.constexpr,  # looped: L2 policy of the second sweep ("" or "evict_first")
    STAGES: tl.constexpr,  # rows in registers: the compiler's software pipeline over the
    # program's row tiles (cp.async into shared memory); None: not pipelined
    EVEN_N: tl.constexpr,  # rows in registers: n_cols == BLOCK_N
    OUTER: tl.constexpr,  # more than one outer index
    ONE_TILE: tl.constexpr,  # one tile per program
    INT64: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    cols = col_ids(BLOCK_N, INT64)
    if not LOOPED:  # the affine parameters are loaded once per program
        col_mask = cols < n_cols
        # With REREAD the weight and bias stay in L2 while the rows stream through it.
        AFFINE: tl.constexpr = "evict_last" if REREAD else ""
        if HAS_WEIGHT:
            w = tl.load(w_ptr + cols * stride_w, mask=col_mask, eviction_policy=AFFINE)
            w = w.to(tl.float32)
        if HAS_BIAS:
            b = tl.load(b_ptr + cols * stride_b, mask=col_mask, eviction_policy=AFFINE)
            b = b.to(tl.float32)
    n_programs = tl.num_programs(0)
    if PREFETCH and not LOOPED:
        x_next, shift_next = _fwd_tile_load(
            tl.program_id(0), n_tiles, n_inner, n_iblocks, x_ptr, r_ptr, cols, col_mask,
            stride_xo, stride_xn, stride_xi, stride_ro, stride_rn, stride_ri,
            SHIFT, HAS_RESIDUAL, BLOCK_R, INT64, OUTER, "evict_last" if REREAD else "",
        )  # fmt: skip
    # A grid-stride walk; a constant trip count of 1 with ONE_TILE (see softmax's kernels).
    for step in tl.range(0, n_steps(n_tiles, ONE_TILE), num_stages=STAGES):
        tile = tl.program_id(0) + step * n_programs
        o, i, row_mask = tile_rows(tile, n_inner, n_iblocks, BLOCK_R, INT64, OUTER)
        x_rows = x_ptr + o * stride_xo + i * stride_xi
        r_rows = r_ptr + o * stride_ro + i * stride_ri
        y_rows = y_ptr + o * stride_yo + i * stride_yi
        h_rows = h_ptr + o * stride_ho + i * stride_hi
        s_offs = o * stride_so + i * stride_si
        if LOOPED:
            shift = tl.zeros([BLOCK_R], tl.float32)
            if SHIFT:
                # Each row's first element, as stored: the backward shifts by the same value.
                shift = _load_sum(x_rows, r_rows, row_mask, HAS_RESIDUAL, True, "")
            acc = tl.zeros([BLOCK_R, BLOCK_N], tl.float32)  # per lane: sum of squares / deviations
            acc2 = tl.zeros([BLOCK_R, BLOCK_N], tl.float32)  # per lane: squared deviations
            ssq = tl.zeros([BLOCK_R], tl.float32)  # RMSNorm per chunk: sum of squares so far
            mean = tl.zeros([BLOCK_R], tl.float32)
            m2 = tl.zeros([BLOCK_R], tl.float32)
            frame = tl.zeros([BLOCK_R], tl.float32)  # Chan's merge: the first chunk's mean
            first = 0
            # With LOOP_PREFETCH each chunk's loads are issued before the previous chunk is
            # reduced, in both sweeps: two chunks in flight per program instead of one (without
            # it, the pending chunk starts past the row: nothing is loaded).
            xr_next, rr_next = _chunk_raw(
                x_rows, r_rows, (1 - LOOP_PREFETCH) * n_cols, cols, n_cols, stride_xn, stride_rn,
                row_mask, HAS_RESIDUAL, KEEP,
            )  # fmt: skip
            if not IS_RMS and LOOP_STATS == 1:
                # LayerNorm per lane: the first chunk's mean c (one reduction) shifts every
                # value, so that the sums of d = x - shift - c and d^2 need no reduction until
                # the end, and var = E[d^2] - E[d]^2 cancels little: the first chunk's mean is
                # within sqrt(n / BLOCK_N) standard deviations of the row's (its squared distance
                # times BLOCK_N is part of the row's sum of squared deviations).
                xr, rr, xr_next, rr_next = _chunk_step(
                    x_rows, r_rows, LOOP_PREFETCH * BLOCK_N, cols, n_cols, stride_xn, stride_rn,
                    row_mask, xr_next, rr_next, HAS_RESIDUAL, KEEP, LOOP_PREFETCH,
                )  # fmt: skip
                mask = row_mask[:, None] & (cols < n_cols)[None, :]
                x = _raw_sum(xr, rr, HAS_RESIDUAL)
                if SUM_FIRST:
                    _store_chunk(h_rows, cols, stride_hn, x, mask, KEEP)
                xs = tl.where(mask, x - shift[:, None], 0.0)
                mean = tl.sum(xs, axis=1) / tl.minimum(n_cols, BLOCK_N)
                acc = tl.where(mask, xs - mean[:, None], 0.0)
                acc2 = acc * acc
                first = BLOCK_N
            for start in range(first, n_cols, BLOCK_N):
                c = start + cols
                mask = row_mask[:, None] & (c < n_cols)[None, :]
                # One load per iteration: this chunk, or with LOOP_PREFETCH the next one.
                xr, rr, xr_next, rr_next = _chunk_step(
                    x_rows, r_rows, start + LOOP_PREFETCH * BLOCK_N, cols, n_cols, stride_xn,
                    stride_rn, row_mask, xr_next, rr_next, HAS_RESIDUAL, KEEP, LOOP_PREFETCH,
                )  # fmt: skip
                x = _raw_sum(xr, rr, HAS_RESIDUAL)
                if SUM_FIRST:
                    _store_chunk(h_rows, c, stride_hn, x, mask, KEEP)
                if IS_RMS:
                    if LOOP_STATS == 1:
                        acc += x * x
                    else:
                        ssq += tl.sum(x * x, axis=1)
                elif LOOP_STATS == 1:
                    d = tl.where(mask, (x - shift[:, None]) - mean[:, None], 0.0)
                    acc += d
                    acc2 += d * d
                else:
                    # Chan's merge of (count, mean, M2) of the rows so far with this chunk's,
                    # each chunk's own by two passes over registers. The means are taken
                    # relative to the first chunk's: a running mean far from 0 (a row whose
                    # first element, the shift, is an outlier) would round at every merge.
                    n_a = start * 1.0
                    n_b = tl.minimum(n_cols - start, BLOCK_N) * 1.0
                    xs = tl.where(mask, (x - shift[:, None]) - frame[:, None], 0.0)
                    mean_b = tl.sum(xs, axis=1) / n_b
                    d = tl.where(mask, xs - mean_b[:, None], 0.0)
                    delta = mean_b - mean
                    mean += delta * (n_b / (n_a + n_b))
                    m2 += tl.sum(d * d, axis=1) + delta * delta * (n_a * n_b / (n_a + n_b))
                    if start == 0:
                        frame = mean
                        mean = tl.zeros_like(mean)
            if not IS_RMS and LOOP_STATS == 1:
                d_mean = tl.sum(acc, axis=1) / n_cols
                m2 = tl.sum(acc2, axis=1) - d_mean * d_mean * n_cols
                mean += d_mean
            elif not IS_RMS:
                mean += frame
            n_chunks = tl.cdiv(n_cols, BLOCK_N)
            # The second sweep's source: x (and the residual), or h stored by the first sweep.
            src_rows, src_stride, src_res = x_rows, stride_xn, HAS_RESIDUAL
            if SUM_FIRST:
                src_rows, src_stride, src_res = h_rows, stride_hn, False
                tl.debug_barrier()  # h written by other threads of the program is visible
            # Last chunk first: the chunks read last by the first sweep are still in L2. Its
            # load is issued before the statistics are reduced, which it does not need.
            if LOOP_PREFETCH:
                xr_next, rr_next = _chunk_raw(
                    src_rows, r_rows, reverse_start(0, n_chunks, BLOCK_N), cols, n_cols,
                    src_stride, stride_rn, row_mask, src_res, DROP,
                )  # fmt: skip
            if IS_RMS:
                if LOOP_STATS == 1:
                    ssq = tl.sum(acc, axis=1)
                rstd = tl.math.rsqrt(ssq / n_cols + eps)
            else:
                # E[d^2] - E[d]^2 may round below 0; a NaN stays NaN (tl.maximum would drop it)
                rstd = tl.math.rsqrt(tl.where(m2 < 0.0, 0.0, m2) / n_cols + eps)
            for k in range(0, n_chunks):
                start = reverse_start(k, n_chunks, BLOCK_N)
                c = start + cols
                mask = row_mask[:, None] & (c < n_cols)[None, :]
                xr, rr, xr_next, rr_next = _chunk_step(
                    src_rows, r_rows, reverse_start(k + LOOP_PREFETCH, n_chunks, BLOCK_N), cols,
                    n_cols, src_stride, stride_rn, row_mask, xr_next, rr_next, src_res, DROP,
                    LOOP_PREFETCH,
                )  # fmt: skip
                x = _raw_sum(xr, rr, src_res)
                if HAS_RESIDUAL and not SUM_FIRST:
                    _store_chunk(h_rows, c, stride_hn, x, mask, "")
                if IS_RMS:
                    y = x * rstd[:, None]
                else:
                    y = ((x - shift[:, None]) - mean[:, None]) * rstd[:, None]
                if HAS_WEIGHT:
                    y *= tl.load(w_ptr + c * stride_w, mask=c < n_cols).to(tl.float32)[None, :]
                if HAS_BIAS:
                    y += tl.load(b_ptr + c * stride_b, mask=c < n_cols).to(tl.float32)[None, :]
                _store_chunk(y_rows, c, stride_yn, y, mask, DROP)
        else:
            mask = row_mask[:, None] & col_mask[None, :]
            # With PREFETCH the next tile's loads are issued before this tile's reductions, so
            # that a program keeps bytes in flight while it computes.
            loaded = _fwd_tile_load(
                tile + PREFETCH * n_programs, n_tiles, n_inner, n_iblocks, x_ptr, r_ptr, cols,
                col_mask, stride_xo, stride_xn, stride_xi, stride_ro, stride_rn, stride_ri,
                SHIFT, HAS_RESIDUAL, BLOCK_R, INT64, OUTER, "evict_last" if REREAD else "",
            )  # fmt: skip
            if PREFETCH:
                x, shift = x_next, shift_next
                x_next, shift_next = loaded
            else:
                x, shift = loaded
            if HAS_RESIDUAL:
                _store_chunk(h_rows, cols, stride_hn, x, mask, "")
            if IS_RMS:
                rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
            else:
                if EVEN_N:  # no padding columns: masked rows are not stored, no selects
                    xs = x - shift[:, None]
                    mean = tl.sum(xs, axis=1) / n_cols
                    d = xs - mean[:, None]
                else:
                    xs = tl.where(mask, x - shift[:, None], 0.0)
                    mean = tl.sum(xs, axis=1) / n_cols
                    d = tl.where(mask, xs - mean[:, None], 0.0)
                rstd = tl.math.rsqrt(tl.sum(d * d, axis=1) / n_cols + eps)
            if REREAD:  # the row again, from L1 or L2, instead of holding it across the sums
                x = _load_sum(
                    x_rows[:, None] + cols[None, :] * stride_xn, x_rows, mask, False, False,
                    "evict_first",
                )  # fmt: skip
                if not IS_RMS:
                    d = (x - shift[:, None]) - mean[:, None]
            if IS_RMS:
                y = x * rstd[:, None]
            else:
                y = d * rstd[:, None]
            if HAS_WEIGHT:
                y *= w[None, :]
            if HAS_BIAS:
                y += b[None, :]
            _store_chunk(y_rows, cols, stride_yn, y, mask, "")
        if not IS_RMS:
            tl.store(mean_ptr + s_offs, mean, mask=row_mask)
        tl.store(rstd_ptr + s_offs, rstd, mask=row_mask)


@kernel
def _norm_fwd_row_kernel(
    x_ptr,  # input, seen as (n_outer, N_COLS, n_inner) with the strides below
    w_ptr,  # weight [N_COLS], when HAS_WEIGHT
    b_ptr,  # bias [N_COLS], when HAS_BIAS
    y_ptr,  # normalized output
    mean_ptr,  # fp32 per row, as _norm_fwd_kernel's (LayerNorm only)
    rstd_ptr,  # fp32 per row
    n_inner,  # rows per outer index
    eps,
    stride_xo,  # x: outer, column and inner strides
    stride_xn,
    stride_xi,
    stride_yo,  # y: as for x
    stride_yn,
    stride_yi,
    stride_so,  # per-row statistics: outer and inner strides
    stride_si,
    stride_w,
    stride_b,
    N_COLS: tl.constexpr,  # the row width, a constant, so that both sweeps unroll
    IS_RMS: tl.constexpr,
    SHIFT: tl.constexpr,  # as _norm_fwd_kernel's (see _shifts)
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    OUTER: tl.constexpr,  # more than one outer index
    WELFORD: tl.constexpr,  # LayerNorm: per-lane Welford statistics (fp32), else pivot sums
    SCALE_FIRST: tl.constexpr,  # LayerNorm: x * rstd - mean * rstd, one FMA (16-bit rows)
    STORE: tl.constexpr,  # L2 policy of the output's stores (see ROW_FWD_STORE)
    BLOCK_N: tl.constexpr,
    THREAD_ELEMS: tl.constexpr,  # LayerNorm, not WELFORD: >0, sums per thread (see below)
):
    """One row per program: statistics over chunks of BLOCK_N (per lane, reduced once at the
    end), then the output, re-reading the row (an L2 hit). LayerNorm shifts by the first
    element (SHIFT) as the other paths do; each lane keeps its mean and M2, by Welford's update
    (WELFORD: fp32 rows) or as sums about its own first value (16-bit rows: cheaper by up to
    11% on rows of several chunks, run 97, and a first value far off the lane's mean costs
    fp32 digits that a 16-bit row does not hold); the lanes are merged by Chan's formula. The
    saved mean is relative to the first-element shift.

    THREAD_ELEMS: the statistics per thread instead of per lane, each thread's THREAD_ELEMS
    contiguous values of a chunk summed in its registers about the thread's first value: two
    sums a thread instead of three per lane, and a first sweep that stays a loop (see
    ROW_FWD_THREAD_SUMS_MIN_COLS)."""
    o, i = program_row(n_inner, OUTER)
    x_row = x_ptr + o * stride_xo + i * stride_xi
    y_row = y_ptr + o * stride_yo + i * stride_yi
    s_offs = o * stride_so + i * stride_si
    if THREAD_ELEMS > 0:
        shift, mean, rstd = _row_thread_stats(
            x_row, stride_xn, eps, N_COLS, SHIFT, BLOCK_N, THREAD_ELEMS
        )  # fmt: skip
    else:
        shift, mean, rstd = _row_lane_stats(
            x_row, stride_xn, eps, N_COLS, IS_RMS, SHIFT, WELFORD, BLOCK_N
        )  # fmt: skip
    _store_row_stats(mean_ptr, rstd_ptr, s_offs, mean, rstd, IS_RMS)
    _row_fwd_output(
        x_row, y_row, w_ptr, b_ptr, stride_xn, stride_yn, stride_w, stride_b, shift, mean, rstd,
        N_COLS, IS_RMS, HAS_WEIGHT, HAS_BIAS, SCALE_FIRST, STORE, BLOCK_N,
    )  # fmt: skip


@triton.jit
def _row_lane_stats(
    x_row, stride_xn, eps, N_COLS: tl.constexpr, IS_RMS: tl.constexpr, SHIFT: tl.constexpr,
    WELFORD: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """(shift, mean relative to the shift, rstd) of a row by _norm_fwd_row_kernel's first
    sweep, per lane (shift and mean 0 for RMSNorm)."""
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N_COLS
    x = tl.load(x_row + cols * stride_xn, mask=mask, other=0.0, eviction_policy="evict_last")
    x = x.to(tl.float32)
    shift = 0.0
    frame = 0.0
    if IS_RMS:
        acc = x * x
    else:
        if SHIFT:
            shift = tl.load(x_row).to(tl.float32)
        # WELFORD: each lane's running mean (frame) and M2 (acc2), merged across lanes at the
        # end: no reduction before the end, and no cancellation whatever the values' order.
        # Else frame is the lane's pivot, acc and acc2 its sums about it.
        frame = tl.where(mask, x - shift, 0.0)
        acc2 = tl.zeros([BLOCK_N], tl.float32)
        if not WELFORD:
            acc = tl.zeros([BLOCK_N], tl.float32)
    for start in range(BLOCK_N, N_COLS, BLOCK_N):
        c = start + cols
        mask = c < N_COLS
        x = tl.load(x_row + c * stride_xn, mask=mask, other=0.0, eviction_policy="evict_last")
        x = x.to(tl.float32)
        if IS_RMS:
            acc += x * x
        elif WELFORD:
            xs = x - shift
            d = tl.where(mask, xs - frame, 0.0)
            frame += d * (1.0 / (start // BLOCK_N + 1))  # the lane's values so far
            acc2 += d * tl.where(mask, xs - frame, 0.0)
        else:
            d = tl.where(mask, (x - shift) - frame, 0.0)
            acc += d
            acc2 += d * d
    if IS_RMS:
        rstd = tl.math.rsqrt(tl.sum(acc, axis=0) / N_COLS + eps)
        mean = 0.0
    else:
        # Chan's merge of the lanes: n_j values each (0 past the row), their mean and M2.
        n_j = ((N_COLS - cols + BLOCK_N - 1) // BLOCK_N).to(tl.float32)
        if WELFORD:
            lane_mean = frame
            lane_m2 = acc2
        else:
            lane_mean, lane_m2 = _pivot_moments(frame, acc, acc2, n_j)
        mean, rstd = _merge_moments(lane_mean, lane_m2, n_j, eps, N_COLS)
    return shift, mean, rstd


@triton.jit
def _pivot_moments(pivot, acc, acc2, n):
    """(mean, M2) of parts of n values each (0: none) from their sums of d and d^2, d = value -
    pivot."""
    per = tl.maximum(n, 1.0)
    return pivot + acc / per, acc2 - acc * (acc / per)


@triton.jit
def _merge_moments(part_mean, part_m2, n, eps, N_COLS: tl.constexpr):
    """(mean, rstd) of a row of N_COLS values from its parts' counts, means and M2 (Chan's
    formula)."""
    mean = tl.sum(part_mean * n, axis=0) / N_COLS
    dev = part_mean - mean
    m2 = tl.sum(part_m2 + n * dev * dev, axis=0)
    # a part's M2 may round below 0; a NaN stays NaN (tl.maximum would drop it)
    rstd = tl.math.rsqrt(tl.where(m2 < 0.0, 0.0, m2) / N_COLS + eps)
    return mean, rstd


@triton.jit
def _store_row_stats(mean_ptr, rstd_ptr, s_offs, mean, rstd, IS_RMS: tl.constexpr):
    if not IS_RMS:
        tl.store(mean_ptr + s_offs, mean)
    tl.store(rstd_ptr + s_offs, rstd)


@triton.jit
def _row_thread_stats(
    x_row, stride_xn, eps, N_COLS: tl.constexpr, SHIFT: tl.constexpr, BLOCK_N: tl.constexpr,
    V: tl.constexpr,
):  # fmt: skip
    """(shift, mean relative to the shift, rstd) of a LayerNorm row by _norm_fwd_row_kernel's first
    sweep with THREAD_ELEMS = V: chunks of BLOCK_N seen as (BLOCK_N // V, V) tiles, one thread
    per tile row, each thread's sums about its own first value; Chan's merge of the threads."""
    T: tl.constexpr = BLOCK_N // V
    offs = tl.arange(0, T)[:, None] * V + tl.arange(0, V)[None, :]
    shift = 0.0
    if SHIFT:
        shift = tl.load(x_row).to(tl.float32)
    mask = offs < N_COLS
    x = tl.load(x_row + offs * stride_xn, mask=mask, other=0.0, eviction_policy="evict_last")
    xs = tl.where(mask, x.to(tl.float32) - shift, 0.0)
    pivot = tl.sum(tl.where(offs % V == 0, xs, 0.0), axis=1)  # the thread's first value
    d = tl.where(mask, xs - pivot[:, None], 0.0)
    acc = tl.sum(d, axis=1)
    acc2 = tl.sum(d * d, axis=1)
    for start in range(BLOCK_N, N_COLS, BLOCK_N):
        c = start + offs
        mask = c < N_COLS
        x = tl.load(x_row + c * stride_xn, mask=mask, other=0.0, eviction_policy="evict_last")
        d = tl.where(mask, (x.to(tl.float32) - shift) - pivot[:, None], 0.0)
        acc += tl.sum(d, axis=1)
        acc2 += tl.sum(d * d, axis=1)
    # The thread's count: V per full chunk, and its part of the last partial one.
    tail: tl.constexpr = N_COLS % BLOCK_N
    first = tl.arange(0, T) * V
    n_t = (N_COLS // BLOCK_N) * V + tl.minimum(tl.maximum(tail - first, 0), V)
    n_t = n_t.to(tl.float32)
    t_mean, t_m2 = _pivot_moments(pivot, acc, acc2, n_t)
    mean, rstd = _merge_moments(t_mean, t_m2, n_t, eps, N_COLS)
    return shift, mean, rstd


@triton.jit
def _row_fwd_output(
    x_row, y_row, w_ptr, b_ptr, stride_xn, stride_yn, stride_w, stride_b, shift, mean, rstd,
    N_COLS: tl.constexpr, IS_RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr, SCALE_FIRST: tl.constexpr, STORE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    """_norm_fwd_row_kernel's second sweep: the row again (an L2 hit), normalized, stored."""
    cols = tl.arange(0, BLOCK_N)
    for start in range(0, N_COLS, BLOCK_N):
        c = start + cols
        mask = c < N_COLS
        x = tl.load(x_row + c * stride_xn, mask=mask, other=0.0, eviction_policy="evict_first")
        x = x.to(tl.float32)
        if IS_RMS:
            y = x * rstd
        elif SCALE_FIRST:
            y = x * rstd - mean * rstd
        else:
            y = ((x - shift) - mean) * rstd
        if HAS_WEIGHT:
            w = tl.load(w_ptr + c * stride_w, mask=mask, eviction_policy="evict_last")
            y *= w.to(tl.float32)
        if HAS_BIAS:
            b = tl.load(b_ptr + c * stride_b, mask=mask, eviction_policy="evict_last")
            y += b.to(tl.float32)
        tl.store(y_row + c * stride_yn, y.to(y_row.dtype.element_ty), mask=mask,
                 eviction_policy=STORE)  # fmt: skip


@triton.jit
def _row_stats(
    x_rows, row_mask, mean_ptr, rstd_ptr, s_offs, IS_RMS: tl.constexpr, SHIFT: tl.constexpr
):
    """(shift, mean, rstd) saved by the forward for a row tile (shift and mean 0 for RMSNorm,
    shift 0 without SHIFT)."""
    rstd = tl.load(rstd_ptr + s_offs, mask=row_mask, other=0.0)
    shift = tl.zeros_like(rstd)
    mean = tl.zeros_like(rstd)
    if SHIFT:
        shift = tl.load(x_rows, mask=row_mask, other=0.0).to(tl.float32)
    if not IS_RMS:
        mean = tl.load(mean_ptr + s_offs, mask=row_mask, other=0.0)
    return shift, mean, rstd


@triton.jit
def _normalized(x, mask, shift, mean, rstd, IS_RMS: tl.constexpr):
    """x normalized with the saved statistics; 0 where masked."""
    if IS_RMS:
        xhat = x * rstd[:, None]
    else:
        xhat = tl.where(mask, ((x - shift[:, None]) - mean[:, None]) * rstd[:, None], 0.0)
    return xhat


@triton.jit
def _xhat(
    x, x_rows, mask, row_mask, mean_ptr, rstd_ptr, s_offs, IS_RMS: tl.constexpr,
    SHIFT: tl.constexpr,
):  # fmt: skip
    """(normalized x, rstd) from the saved statistics; 0 where masked."""
    shift, mean, rstd = _row_stats(x_rows, row_mask, mean_ptr, rstd_ptr, s_offs, IS_RMS, SHIFT)
    return _normalized(x, mask, shift, mean, rstd, IS_RMS), rstd


@triton.jit
def _add_pairs(a1, b1, a2, b2):
    return a1 + a2, b1 + b2


@kernel
def _norm_bwd_sums_kernel(
    dy_ptr,  # upstream gradient of the normalized output
    x_ptr,  # forward input (x, or x + residual as stored)
    w_ptr,  # weight [n_cols], when HAS_WEIGHT
    mean_ptr,  # saved fp32 statistics, per row
    rstd_ptr,
    c1_ptr,  # fp32 per row: mean(w * dy * xhat)
    c2_ptr,  # fp32 per row: mean(w * dy) (LayerNorm only)
    n_cols,  # as in the forward kernel
    n_inner,
    n_iblocks,
    n_tiles,
    stride_dyo,  # dy: outer, column and inner strides
    stride_dyn,
    stride_dyi,
    stride_xo,  # x: as for dy
    stride_xn,
    stride_xi,
    stride_so,  # statistics (mean, rstd, c1, c2): outer and inner strides
    stride_si,
    stride_w,  # weight: elements between columns
    IS_RMS: tl.constexpr,
    SHIFT: tl.constexpr,  # LayerNorm rows shifted by their first element (see _shifts)
    HAS_WEIGHT: tl.constexpr,
    STAGES: tl.constexpr,  # the compiler's software pipeline over the chunks; None: none
    OUTER: tl.constexpr,
    INT64: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # First pass of the wide-row backward: the two row sums that dx needs, over chunks.
    cols = col_ids(BLOCK_N, INT64)
    for tile in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        o, i, row_mask = tile_rows(tile, n_inner, n_iblocks, BLOCK_R, INT64, OUTER)
        dy_rows = dy_ptr + o * stride_dyo + i * stride_dyi
        x_rows = x_ptr + o * stride_xo + i * stride_xi
        s_offs = o * stride_so + i * stride_si
        acc1 = tl.zeros([BLOCK_R, BLOCK_N], tl.float32)
        acc2 = tl.zeros([BLOCK_R, BLOCK_N], tl.float32)
        for start in tl.range(0, n_cols, BLOCK_N, num_stages=STAGES):
            c = start + cols
            mask = row_mask[:, None] & (c < n_cols)[None, :]
            dy = tl.load(dy_rows[:, None] + c[None, :] * stride_dyn, mask=mask, other=0.0)
            x = tl.load(x_rows[:, None] + c[None, :] * stride_xn, mask=mask, other=0.0)
            xhat, _ = _xhat(
                x.to(tl.float32), x_rows, mask, row_mask, mean_ptr, rstd_ptr, s_offs, IS_RMS,
                SHIFT,
            )  # fmt: skip
            wdy = dy.to(tl.float32)
            if HAS_WEIGHT:
                wdy *= tl.load(w_ptr + c * stride_w, mask=c < n_cols).to(tl.float32)[None, :]
            acc1 += wdy * xhat
            if not IS_RMS:
                acc2 += wdy
        tl.store(c1_ptr + s_offs, tl.sum(acc1, axis=1) / n_cols, mask=row_mask)
        if not IS_RMS:
            tl.store(c2_ptr + s_offs, tl.sum(acc2, axis=1) / n_cols, mask=row_mask)


@triton.jit
def _bwd_tile_load(
    tile, n_tiles, n_inner, n_iblocks, dy_ptr, x_ptr, dres_ptr, mean_ptr, rstd_ptr, cols,
    col_mask, stride_dyo, stride_dyn, stride_dyi, stride_xo, stride_xn, stride_xi, stride_ro,
    stride_rn, stride_ri, stride_so, stride_si,
    IS_RMS: tl.constexpr, SHIFT: tl.constexpr, HAS_DRES: tl.constexpr, BLOCK_R: tl.constexpr,
    INT64: tl.constexpr, OUTER: tl.constexpr,
):  # fmt: skip
    """(dy, x, dres, shift, mean, rstd) of row tile ``tile``, tiles as stored (dres 0 without
    HAS_DRES); nothing is read past the last tile."""
    o, i, row_mask = tile_rows(tile, n_inner, n_iblocks, BLOCK_R, INT64, OUTER)
    row_mask = row_mask & (tile < n_tiles)
    mask = row_mask[:, None] & col_mask[None, :]
    x_rows = x_ptr + o * stride_xo + i * stride_xi
    dy = tl.load(
        dy_ptr + (o * stride_dyo + i * stride_dyi)[:, None] + cols[None, :] * stride_dyn,
        mask=mask,
        other=0.0,
    )
    x = tl.load(x_rows[:, None] + cols[None, :] * stride_xn, mask=mask, other=0.0)
    dres = tl.zeros_like(dy)
    if HAS_DRES:
        dres = tl.load(
            dres_ptr + (o * stride_ro + i * stride_ri)[:, None] + cols[None, :] * stride_rn,
            mask=mask,
            other=0.0,
        )
    shift, mean, rstd = _row_stats(
        x_rows, row_mask, mean_ptr, rstd_ptr, o * stride_so + i * stride_si, IS_RMS, SHIFT
    )
    return dy, x, dres, shift, mean, rstd


@kernel
def _norm_bwd_kernel(
    dy_ptr,  # upstream gradient of the normalized output
    x_ptr,  # forward input (x, or x + residual as stored)
    dres_ptr,  # upstream gradient of x + residual, when HAS_DRES
    w_ptr,  # weight [n_cols], when HAS_WEIGHT
    mean_ptr,  # saved fp32 statistics, per row
    rstd_ptr,
    c1_ptr,  # fp32 row sums from _norm_bwd_sums_kernel, when SUMS_GIVEN
    c2_ptr,
    dx_ptr,  # gradient of x (and of the residual)
    dw_part_ptr,  # fp32 [row groups, n_cols]: partial sums of dy * xhat, when WEIGHT_GRAD
    db_part_ptr,  # fp32 [row groups, n_cols]: partial sums of dy, when BIAS_GRAD
    n_cols,  # as in the forward kernel
    n_inner,
    n_iblocks,
    n_tiles,
    stride_dyo,  # dy: outer, column and inner strides
    stride_dyn,
    stride_dyi,
    stride_xo,  # x: as for dy
    stride_xn,
    stride_xi,
    stride_ro,  # dres: as for dy
    stride_rn,
    stride_ri,
    stride_dxo,  # dx: as for dy
    stride_dxn,
    stride_dxi,
    stride_so,  # statistics: outer and inner strides
    stride_si,
    stride_w,  # weight: elements between columns
    IS_RMS: tl.constexpr,
    SHIFT: tl.constexpr,  # LayerNorm rows shifted by their first element (see _shifts)
    HAS_WEIGHT: tl.constexpr,
    HAS_DRES: tl.constexpr,
    WEIGHT_GRAD: tl.constexpr,
    BIAS_GRAD: tl.constexpr,
    SUMS_GIVEN: tl.constexpr,  # wide rows: one column block here, row sums from the first pass
    PREFETCH: tl.constexpr,  # load the next tile before computing this one
    REDUCE_TILES: tl.constexpr,  # partial sums summed over each tile's rows as it goes
    STAGES: tl.constexpr,  # the compiler's software pipeline over row tiles (cp.async into
    # shared memory, STAGES - 1 tiles in flight); None: not pipelined
    OUTER: tl.constexpr,
    INT64: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Programs are (column block, row group); each walks the row tiles of its group, so the
    # weight and bias partial sums stay in registers and one row of each reaches memory.
    pid_n = tl.program_id(0)
    pid_g = tl.program_id(1)
    cols = col_ids(BLOCK_N, INT64)
    if INT64:
        pid_n = tl.cast(pid_n, tl.int64)
    cols += pid_n * BLOCK_N
    col_mask = cols < n_cols
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols * stride_w, mask=col_mask, other=0.0).to(tl.float32)
    # Partial sums: a tile of them, reduced across the tile's rows once after the loop, or with
    # REDUCE_TILES one row, each tile's rows summed into it.
    if REDUCE_TILES:
        acc_w = tl.zeros([BLOCK_N], tl.float32)
        acc_b = tl.zeros([BLOCK_N], tl.float32)
    else:
        acc_w = tl.zeros([BLOCK_R, BLOCK_N], tl.float32)
        acc_b = tl.zeros([BLOCK_R, BLOCK_N], tl.float32)
    n_groups = tl.num_programs(1)
    if PREFETCH:
        dy_n, x_n, dres_n, shift_n, mean_n, rstd_n = _bwd_tile_load(
            pid_g, n_tiles, n_inner, n_iblocks, dy_ptr, x_ptr, dres_ptr, mean_ptr, rstd_ptr,
            cols, col_mask, stride_dyo, stride_dyn, stride_dyi, stride_xo, stride_xn, stride_xi,
            stride_ro, stride_rn, stride_ri, stride_so, stride_si, IS_RMS, SHIFT, HAS_DRES,
            BLOCK_R, INT64, OUTER,
        )  # fmt: skip
    for tile in tl.range(pid_g, n_tiles, n_groups, num_stages=STAGES):
        o, i, row_mask = tile_rows(tile, n_inner, n_iblocks, BLOCK_R, INT64, OUTER)
        s_offs = o * stride_so + i * stride_si
        mask = row_mask[:, None] & col_mask[None, :]
        # With PREFETCH the next tile's loads (rows and saved statistics) are issued before
        # this tile's reduction, so that a program keeps bytes in flight while it computes: one
        # or two programs fit on an SM (166-216 registers at 8 warps, ptxas sm_90a).
        loaded = _bwd_tile_load(
            tile + PREFETCH * n_groups, n_tiles, n_inner, n_iblocks, dy_ptr, x_ptr, dres_ptr,
            mean_ptr, rstd_ptr, cols, col_mask, stride_dyo, stride_dyn, stride_dyi, stride_xo,
            stride_xn, stride_xi, stride_ro, stride_rn, stride_ri, stride_so, stride_si, IS_RMS,
            SHIFT, HAS_DRES, BLOCK_R, INT64, OUTER,
        )  # fmt: skip
        if PREFETCH:
            dy, x, dres, shift, mean, rstd = dy_n, x_n, dres_n, shift_n, mean_n, rstd_n
            dy_n, x_n, dres_n, shift_n, mean_n, rstd_n = loaded
        else:
            dy, x, dres, shift, mean, rstd = loaded
        dy = dy.to(tl.float32)
        xhat = _normalized(x.to(tl.float32), mask, shift, mean, rstd, IS_RMS)
        wdy = dy
        if HAS_WEIGHT:
            wdy = dy * w[None, :]
        if SUMS_GIVEN:
            c1 = tl.load(c1_ptr + s_offs, mask=row_mask, other=0.0)
            if not IS_RMS:
                c2 = tl.load(c2_ptr + s_offs, mask=row_mask, other=0.0)
        elif IS_RMS:
            c1 = tl.sum(wdy * xhat, axis=1) / n_cols
        else:  # both row sums in one reduction: one exchange between warps, not two
            c1, c2 = tl.reduce((wdy * xhat, wdy), axis=1, combine_fn=_add_pairs)
            c1 /= n_cols
            c2 /= n_cols
        dx = wdy - xhat * c1[:, None]
        if not IS_RMS:
            dx -= c2[:, None]
        dx *= rstd[:, None]
        if HAS_DRES:
            dx += dres.to(tl.float32)
        tl.store(
            dx_ptr + (o * stride_dxo + i * stride_dxi)[:, None] + cols[None, :] * stride_dxn,
            dx.to(dx_ptr.dtype.element_ty),
            mask=mask,
        )
        if REDUCE_TILES:
            if WEIGHT_GRAD:
                acc_w += tl.sum(dy * xhat, axis=0)
            if BIAS_GRAD:
                acc_b += tl.sum(dy, axis=0)
        else:
            if WEIGHT_GRAD:
                acc_w += dy * xhat
            if BIAS_GRAD:
                acc_b += dy
    if not REDUCE_TILES:
        acc_w = tl.sum(acc_w, axis=0)
        acc_b = tl.sum(acc_b, axis=0)
    if WEIGHT_GRAD:
        tl.store(dw_part_ptr + pid_g * n_cols + cols, acc_w, mask=col_mask)
    if BIAS_GRAD:
        tl.store(db_part_ptr + pid_g * n_cols + cols, acc_b, mask=col_mask)


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------


def _reduced(ndim: int, n_dims: int) -> tuple[int, ...]:
    return tuple(range(ndim - n_dims, ndim))


def _vector(t: torch.Tensor | None, n_cols: int) -> tuple[torch.Tensor | None, int]:
    """A weight or bias as one strided row of n_cols elements: (tensor, stride)."""
    if t is None:
        return None, 0
    try:
        v = t.view(n_cols)
    except RuntimeError:
        LAYOUT_COPIES.count += 1
        v = t.contiguous().view(n_cols)
    return v, v.stride(0)


def _fwd_plan(x, residual, n_dims, rms, count=True):
    inputs = [x] if residual is None else [x, residual]
    n_out = 1 if residual is None else 2
    n_stats = 1 if rms else 2
    return plan_rows(inputs, _reduced(x.dim(), n_dims), n_out, n_row_outputs=n_stats, count=count)


def norm_fwd(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    n_dims: int,
    eps: float,
    rms: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, h, mean, rstd) of LayerNorm / RMSNorm over the last ``n_dims`` dims of x (+ residual).

    ``h`` is ``x + residual`` (empty without a residual); ``mean`` is empty for RMSNorm. The
    statistics are fp32 of shape x.shape with the normalized dims set to 1.
    """
    inputs, outputs, stats, layout = _fwd_plan(x, residual, n_dims, rms)
    y = outputs[0]
    h = outputs[1] if residual is not None else x.new_empty(0)
    mean, rstd = (x.new_empty(0, dtype=torch.float32), stats[0]) if rms else stats
    if layout is None:
        return y, h, mean, rstd
    xt = inputs[0]
    rt = inputs[1] if residual is not None else xt
    w, stride_w = _vector(weight, layout.n_cols)
    b, stride_b = _vector(bias, layout.n_cols)
    if _row_fwd(layout, residual, rms, x.dtype):
        _row_fwd_launch(xt, (w, stride_w), (b, stride_b), y, mean, rstd, layout, eps, rms)
        return y, h, mean, rstd
    reread_per_thread = None  # the re-read forward's elements per thread, where it applies
    if FWD_REREAD and residual is None:
        reread_per_thread = FWD_REREAD_ELEMS_PER_THREAD.get((rms, x.element_size()))
    cfg = norm_config(layout, x.device, rms, elems_per_thread=reread_per_thread)
    stages = None
    if not rms and residual is None and not cfg.LOOPED and cfg.BLOCK_N >= FWD_PIPELINE_COLS:
        stage_bytes = cfg.BLOCK_R * cfg.BLOCK_N * x.element_size()
        stages = _depth(FWD_PIPELINE_STAGES, stage_bytes, x.device)
    if stages is not None:
        cfg = norm_config(layout, x.device, rms, elems_per_thread=FWD_PIPELINE_ELEMS_PER_THREAD)
        cfg = dataclasses.replace(cfg, programs=min(cfg.n_tiles, sm_count(x.device)))
    reread = reread_per_thread is not None and not cfg.LOOPED and stages is None
    res16 = residual is not None and x.element_size() == 2  # 16-bit rows with a residual
    if cfg.LOOPED:
        load_bytes = x.element_size() * (2 if residual is not None else 1)
        cfg = _looped_fwd_config(cfg, layout, x.device, rms, load_bytes, res16)
    sum_first = LOOP_SUM_FIRST and cfg.LOOPED and residual is not None and x.dtype == torch.float32
    sx, *rest = layout.strides
    if residual is not None:
        sr, sy, sh, ss = rest[0], rest[1], rest[2], rest[3]
    else:
        sr, sy, sh, ss = sx, rest[0], rest[0], rest[1]
    _norm_fwd_kernel[(cfg.programs,)](
        xt,
        rt,
        w if w is not None else xt,
        b if b is not None else xt,
        y,
        h if residual is not None else y,
        mean if not rms else rstd,
        rstd,
        layout.n_cols,
        layout.n_inner,
        cfg.n_iblocks,
        cfg.n_tiles,
        eps,
        *sx,
        *sr,
        *sy,
        *sh,
        ss[0],
        ss[2],
        stride_w,
        stride_b,
        IS_RMS=rms,
        SHIFT=_shifts(rms, x.dtype),
        HAS_RESIDUAL=residual is not None,
        HAS_WEIGHT=w is not None,
        HAS_BIAS=b is not None,
        LOOPED=cfg.LOOPED,
        PREFETCH=FWD_PREFETCH and stages is None and cfg.programs < cfg.n_tiles,  # a next tile
        LOOP_PREFETCH=cfg.LOOPED and (LOOP_PREFETCH_RMS if rms else LOOP_PREFETCH),
        LOOP_STATS=LOOP_STATS_RMS if rms else (LOOP_STATS_LN_RES16 if res16 else LOOP_STATS_LN),
        **evict_kwargs(cfg.LOOPED and LOOP_EVICT),
        STAGES=stages,
        REREAD=reread,
        SUM_FIRST=sum_first,
        EVEN_N=EVEN_N and layout.n_cols == cfg.BLOCK_N,
        ONE_TILE=cfg.programs == cfg.n_tiles,
        OUTER=layout.n_outer > 1,
        INT64=layout.needs_int64(),
        BLOCK_R=cfg.BLOCK_R,
        BLOCK_N=cfg.BLOCK_N,
        num_warps=cfg.num_warps,
    )
    return y, h, mean, rstd


def _row_fwd(
    layout: RowLayout, residual: torch.Tensor | None, rms: bool, dtype: torch.dtype
) -> bool:
    """Whether the forward takes _norm_fwd_row_kernel (see ROW_FWD)."""
    (_, stride_xn, _), (_, stride_yn, _) = layout.strides[:2]
    n_cols = layout.n_cols
    # fp32 LayerNorm rows of a power-of-2 width up to MAX_FUSED_COLS stay in registers, kept
    # there across the statistics (no re-read), which ran as fast or faster (run 90), but for
    # the widths of ROW_FWD_POW2_LN_FP32 (run 131).
    kept = (
        not rms
        and dtype == torch.float32
        and n_cols == next_power_of_2(n_cols)
        and n_cols not in ROW_FWD_POW2_LN_FP32
    )
    return (
        ROW_FWD
        and residual is None
        and stride_xn == 1  # rows contiguous (not adjacent rows of a transposed input)
        and stride_yn == 1
        and ROW_FWD_MIN_COLS <= n_cols <= ROW_FWD_MAX_COLS
        and (rms or n_cols * dtype.itemsize <= _row_fwd_max_bytes_ln(dtype))
        and not (kept and n_cols <= MAX_FUSED_COLS)
    )


def _row_fwd_max_bytes_ln(dtype: torch.dtype) -> int:
    """The widest LayerNorm row (bytes) of the row forward: fp32 rows (Welford) are held to
    ROW_FWD_MAX_BYTES_LN_FP32."""
    return ROW_FWD_MAX_BYTES_LN_FP32 if dtype == torch.float32 else ROW_FWD_MAX_BYTES_LN


def _row_fwd_config(n_cols: int, element_size: int, rms: bool) -> tuple[int, int]:
    """(BLOCK_N, warps) of _norm_fwd_row_kernel for rows of ``n_cols`` elements, warps by the
    row's bytes. RMSNorm: ROW_FWD_WARPS_RMS, chunks of ROW_FWD_ELEMS_PER_THREAD_RMS elements per
    thread. LayerNorm: ROW_FWD_WARPS, and within the bounds of ROW_FWD_ELEMS_PER_THREAD the
    largest power of 2 that divides the row (no partial last chunk)."""
    if rms:
        return row_program_config(
            n_cols, element_size, ROW_FWD_WARPS_RMS, ROW_FWD_ELEMS_PER_THREAD_RMS
        )
    if element_size == 4 and n_cols in ROW_FWD_POW2_LN_FP32:
        return n_cols, ROW_FWD_POW2_LN_FP32_WARPS
    warps = row_program_warps(n_cols * element_size, ROW_FWD_WARPS)
    low, high = (32 * warps * e for e in ROW_FWD_ELEMS_PER_THREAD)
    even = n_cols & -n_cols  # the largest power of 2 that divides n_cols
    return min(max(even, low), high, next_power_of_2(n_cols)), warps


def _row_fwd_store(n_cols: int, element_size: int, rms: bool) -> str:
    """The L2 policy of _norm_fwd_row_kernel's stores (see ROW_FWD_STORE)."""
    if element_size != 2 or (rms and n_cols * element_size <= ROW_FWD_STORE_MIN_BYTES_RMS):
        return ""
    return ROW_FWD_STORE


def _row_fwd_launch(x, weight, bias, y, mean, rstd, layout, eps, rms):
    """Launch _norm_fwd_row_kernel, one program per row of the layout; ``weight`` and ``bias``
    as (tensor or None, stride) from _vector."""
    (w, stride_w), (b, stride_b) = weight, bias
    sx, sy, ss = layout.strides[:3]
    block_n, warps = _row_fwd_config(layout.n_cols, x.element_size(), rms)
    _norm_fwd_row_kernel[(layout.n_outer * layout.n_inner,)](
        x,
        w if w is not None else x,
        b if b is not None else x,
        y,
        rstd if rms else mean,
        rstd,
        layout.n_inner,
        eps,
        *sx,
        *sy,
        ss[0],
        ss[2],
        stride_w,
        stride_b,
        N_COLS=layout.n_cols,
        IS_RMS=rms,
        SHIFT=_shifts(rms, x.dtype),
        HAS_WEIGHT=w is not None,
        HAS_BIAS=b is not None,
        OUTER=layout.n_outer > 1,
        WELFORD=x.dtype == torch.float32,
        SCALE_FIRST=ROW_FWD_SCALE_FIRST and not rms and x.element_size() == 2,
        STORE=_row_fwd_store(layout.n_cols, x.element_size(), rms),
        BLOCK_N=block_n,
        THREAD_ELEMS=_row_fwd_thread_elems(layout.n_cols, x.dtype, rms, block_n, warps),
        num_warps=warps,
    )


def _row_fwd_thread_elems(
    n_cols: int, dtype: torch.dtype, rms: bool, block_n: int, warps: int
) -> int:
    """_norm_fwd_row_kernel's THREAD_ELEMS: each thread's share of a chunk for 16-bit LayerNorm
    rows of ROW_FWD_THREAD_SUMS_MIN_COLS or more (see there), else 0 (per-lane sums)."""
    if rms or dtype == torch.float32 or n_cols < ROW_FWD_THREAD_SUMS_MIN_COLS:
        return 0
    return max(block_n // (32 * warps), 1)


def _looped_fwd_config(
    cfg: RowConfig,
    layout: RowLayout,
    device: torch.device,
    rms: bool,
    load_bytes: int,
    res16: bool,
) -> RowConfig:
    """The looped forward's own rows per tile, warps and programs per SM (LOOP_*_RMS / _LN);
    ``load_bytes``: bytes each element of a row loads (x, and the residual); ``res16``: 16-bit
    rows with a residual."""
    rows = LOOP_ROWS_RMS if rms else (LOOP_ROWS_LN_RES16 if res16 else LOOP_ROWS_LN)
    per_sm = LOOP_PROGRAMS_PER_SM_RMS if rms else LOOP_PROGRAMS_PER_SM
    if cfg.BLOCK_R == 1 and rows > 1 and layout.n_inner > 1:
        # Several rows per tile, chunks as many times narrower: each weight (and bias) chunk
        # loaded serves them all.
        block_r = min(rows, next_power_of_2(layout.n_inner))
        n_iblocks = cdiv(layout.n_inner, block_r)
        cfg = dataclasses.replace(
            cfg, BLOCK_R=block_r, BLOCK_N=cfg.BLOCK_N // block_r, n_iblocks=n_iblocks,
            n_tiles=layout.n_outer * n_iblocks,
        )  # fmt: skip
    wide = load_bytes >= 8  # fp32 x and residual
    if rms:
        per_thread = LOOP_ELEMS_PER_THREAD_RMS_WIDE if wide else LOOP_ELEMS_PER_THREAD_RMS
    else:
        per_thread = LOOP_ELEMS_PER_THREAD_LN_WIDE if wide else ELEMS_PER_THREAD
    block_n, warps = _fit_chunk(cfg.BLOCK_R, cfg.BLOCK_N, per_thread)
    return dataclasses.replace(
        cfg,
        BLOCK_N=block_n,
        programs=max(1, min(cfg.n_tiles, per_sm * sm_count(device))),
        num_warps=warps,
    )


def _bwd_plan(grad, dres, xh, mean, rstd, n_dims, rms, count=True):
    inputs = [grad, xh] + ([dres] if dres is not None else [])
    stats = [rstd] if rms else [mean, rstd]
    return plan_rows(inputs, _reduced(xh.dim(), n_dims), 1, row_inputs=stats, count=count)


def _param_grad(
    xh: torch.Tensor, n_dims: int, wanted: bool, dtype: torch.dtype
) -> torch.Tensor | None:
    """A weight or bias gradient (shaped like the normalized dims, in the parameters' dtype),
    if wanted."""
    if not wanted:
        return None
    return torch.empty(xh.shape[xh.dim() - n_dims :], dtype=dtype, device=xh.device)


def _or_empty(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    # Each output of a custom op must be its own tensor, even an empty placeholder.
    return t if t is not None else like.new_empty(0)


def norm_bwd(
    grad: torch.Tensor,
    dres: torch.Tensor | None,
    xh: torch.Tensor,
    weight: torch.Tensor | None,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    n_dims: int,
    rms: bool,
    need_dweight: bool,
    need_dbias: bool,
    param_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight, dbias); dweight and dbias are empty when not asked for, else in
    ``param_dtype`` (the weight's and bias's).

    ``xh`` is the forward input (x, or the stored x + residual); ``dres`` the gradient of the
    stored sum, added to dx; ``mean`` and ``rstd`` are norm_fwd's statistics.
    """
    inputs, (dx,), _, layout = _bwd_plan(grad, dres, xh, mean, rstd, n_dims, rms)
    empty = grad.new_empty(0)
    dw = _param_grad(xh, n_dims, need_dweight and weight is not None, param_dtype)
    db = _param_grad(xh, n_dims, need_dbias, param_dtype)
    if layout is None:
        for t in (dw, db):
            if t is not None:
                t.zero_()  # a sum over no rows
        return dx, _or_empty(dw, grad), _or_empty(db, grad)
    gt, xt = inputs[0], inputs[1]
    rt = inputs[2] if dres is not None else gt
    sg, sx, *rest = layout.strides
    sr = rest.pop(0) if dres is not None else sg
    sdx = rest.pop(0)
    ss = rest[0]
    w, stride_w = _vector(weight, layout.n_cols)
    mid = layout.n_cols <= MAX_FUSED_COLS  # a row the forward keeps in registers
    cfg = norm_config(
        layout,
        grad.device,
        tile_elems=_bwd_tile_elems(len(inputs), xh.dtype),
        max_fused=min(BWD_MAX_FUSED_COLS, MAX_FUSED_COLS),
        loop_block=BWD_MID_BLOCK_N if mid else None,
        loop_programs_per_sm=BWD_MID_PROGRAMS_PER_SM.get(xh.element_size()) if mid else None,
    )
    block_n, warps, col_blocks, groups = _bwd_grid(cfg, layout.n_cols, grad.device, rms)
    reduce_rows = BWD_REDUCE_ROWS if rms else BWD_REDUCE_ROWS_LN
    stages = _bwd_stages(cfg, block_n, inputs, rms, mid)
    stat_mean = rstd if rms else mean
    c1 = c2 = rstd  # placeholders when the sums are computed in registers
    if cfg.LOOPED:
        c1 = torch.empty_like(rstd)
        c2 = torch.empty_like(rstd) if not rms else c1
        sums_n, sums_warps = cfg.BLOCK_N, cfg.num_warps
        if xh.element_size() > 2:
            sums_n, sums_warps = _fit_chunk(cfg.BLOCK_R, sums_n, BWD_SUMS_ELEMS_PER_THREAD_FP32)
        # Each chunk loads dy, x and the weight.
        chunk_bytes = cfg.BLOCK_R * sums_n * (gt.element_size() + xt.element_size())
        chunk_bytes += sums_n * (w.element_size() if w is not None else 0)
        sums_stages = _depth(
            BWD_MID_STAGES if mid else (WIDE_SUMS_STAGES_RMS if rms else None),
            chunk_bytes,
            grad.device,
        )
        _norm_bwd_sums_kernel[(cfg.programs,)](
            gt,
            xt,
            w if w is not None else gt,
            stat_mean,
            rstd,
            c1,
            c2,
            layout.n_cols,
            layout.n_inner,
            cfg.n_iblocks,
            cfg.n_tiles,
            *sg,
            *sx,
            ss[0],
            ss[2],
            stride_w,
            IS_RMS=rms,
            SHIFT=_shifts(rms, xh.dtype),
            HAS_WEIGHT=w is not None,
            STAGES=sums_stages,
            OUTER=layout.n_outer > 1,
            INT64=layout.needs_int64(),
            BLOCK_R=cfg.BLOCK_R,
            BLOCK_N=sums_n,
            num_warps=sums_warps,
        )
    dw_part, db_part = (
        torch.empty((groups, layout.n_cols), dtype=torch.float32, device=grad.device)
        if out is not None
        else empty
        for out in (dw, db)
    )
    _norm_bwd_kernel[(col_blocks, groups)](
        gt,
        xt,
        rt,
        w if w is not None else gt,
        stat_mean,
        rstd,
        c1,
        c2,
        dx,
        dw_part,
        db_part,
        layout.n_cols,
        layout.n_inner,
        cfg.n_iblocks,
        cfg.n_tiles,
        *sg,
        *sx,
        *sr,
        *sdx,
        ss[0],
        ss[2],
        stride_w,
        IS_RMS=rms,
        SHIFT=_shifts(rms, xh.dtype),
        HAS_WEIGHT=w is not None,
        HAS_DRES=dres is not None,
        WEIGHT_GRAD=dw is not None,
        BIAS_GRAD=db is not None,
        SUMS_GIVEN=cfg.LOOPED,
        PREFETCH=BWD_PREFETCH and stages is None,
        REDUCE_TILES=1 < cfg.BLOCK_R <= reduce_rows,  # one-row tiles: the same sum either way
        STAGES=stages,
        OUTER=layout.n_outer > 1,
        INT64=layout.needs_int64(),
        BLOCK_R=cfg.BLOCK_R,
        BLOCK_N=block_n,
        num_warps=warps,
    )
    sums = [(part, out) for part, out in ((dw_part, dw), (db_part, db)) if out is not None]
    if sums:
        sum_partials(*sums[0], *(sums[1] if len(sums) > 1 else ()))
    return dx, _or_empty(dw, grad), _or_empty(db, grad)


# ----------------------------------------------------------------------------------------------
# torch.library registration
# ----------------------------------------------------------------------------------------------


@define_op("tritonkit::norm")
def _norm_op(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    n_dims: int,
    eps: float,
    rms: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return norm_fwd(x, residual, weight, bias, n_dims, eps, rms)


@_norm_op.register_fake
def _(x, residual, weight, bias, n_dims, eps, rms):
    _, outputs, stats, _ = _fwd_plan(x, residual, n_dims, rms, count=False)
    h = outputs[1] if residual is not None else x.new_empty(0)
    mean, rstd = (x.new_empty(0, dtype=torch.float32), stats[0]) if rms else stats
    return outputs[0], h, mean, rstd


@define_op("tritonkit::norm_backward")
def _norm_backward_op(
    grad: torch.Tensor,
    dres: torch.Tensor | None,
    xh: torch.Tensor,
    weight: torch.Tensor | None,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    n_dims: int,
    rms: bool,
    need_dweight: bool,
    need_dbias: bool,
    param_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return norm_bwd(
        grad, dres, xh, weight, mean, rstd, n_dims, rms, need_dweight, need_dbias, param_dtype
    )


@_norm_backward_op.register_fake
def _(grad, dres, xh, weight, mean, rstd, n_dims, rms, need_dweight, need_dbias, param_dtype):
    _, (dx,), _, _ = _bwd_plan(grad, dres, xh, mean, rstd, n_dims, rms, count=False)
    dw = _param_grad(xh, n_dims, need_dweight and weight is not None, param_dtype)
    db = _param_grad(xh, n_dims, need_dbias, param_dtype)
    return dx, _or_empty(dw, grad), _or_empty(db, grad)


# Eager calls on real tensors skip the ops' dispatch (see eager_direct).
call_norm = eager_direct(_norm_op)
call_norm_backward = eager_direct(_norm_backward_op)


# ----------------------------------------------------------------------------------------------
# Autograd
# ----------------------------------------------------------------------------------------------


def _param_dtype(x, weight, bias) -> torch.dtype:
    """The affine parameters' dtype (x's, or float32 beside 16-bit rows): their gradients'."""
    for t in (weight, bias):
        if t is not None:
            return t.dtype
    return x.dtype


def _backward(ctx, grad, dres, xh, weight, mean, rstd):
    need_dw = weight is not None and ctx.needs_input_grad[ctx.weight_index]
    need_db = ctx.has_bias and ctx.needs_input_grad[ctx.weight_index + 1]
    if grad is None:  # only the sum was used downstream
        grad = torch.zeros_like(xh)
    dx, dw, db = call_norm_backward(
        grad, dres, xh, weight, mean, rstd, ctx.n_dims, ctx.rms, need_dw, need_db, ctx.param_dtype
    )
    return dx, (dw if need_dw else None), (db if need_db else None)


class NormFunction(torch.autograd.Function):
    """LayerNorm (``rms`` False) or RMSNorm over the last ``n_dims`` dims, affine optional."""

    @staticmethod
    def forward(ctx, x, weight, bias, n_dims, eps, rms):
        y, _, mean, rstd = call_norm(x, None, weight, bias, n_dims, eps, rms)
        ctx.n_dims, ctx.rms, ctx.has_bias, ctx.weight_index = n_dims, rms, bias is not None, 1
        ctx.param_dtype = _param_dtype(x, weight, bias)
        ctx.save_for_backward(x, weight, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = _backward(ctx, grad, None, x, weight, mean, rstd)
        return (dx if ctx.needs_input_grad[0] else None), dw, db, None, None, None


class AddNormFunction(torch.autograd.Function):
    """``(norm(x + residual), x + residual)``; the backward reads the stored sum only."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, n_dims, eps, rms):
        y, h, mean, rstd = call_norm(x, residual, weight, bias, n_dims, eps, rms)
        ctx.n_dims, ctx.rms, ctx.has_bias, ctx.weight_index = n_dims, rms, bias is not None, 2
        ctx.param_dtype = _param_dtype(x, weight, bias)
        ctx.save_for_backward(h, weight, mean, rstd)
        ctx.set_materialize_grads(False)  # an unused output costs no zero-filled gradient
        return y, h

    @staticmethod
    def backward(ctx, grad, dres):
        h, weight, mean, rstd = ctx.saved_tensors
        if grad is None and dres is None:
            return None, None, None, None, None, None, None
        dx, dw, db = _backward(ctx, grad, dres, h, weight, mean, rstd)
        # d(x + residual) is the same tensor for both operands.
        return (
            dx if ctx.needs_input_grad[0] else None,
            dx if ctx.needs_input_grad[1] else None,
            dw,
            db,
            None,
            None,
            None,
        )


# ----------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------


def _normalized_shape(op: str, normalized_shape: object) -> tuple[int, ...]:
    if isinstance(normalized_shape, int) and not isinstance(normalized_shape, bool):
        return (normalized_shape,)
    if isinstance(normalized_shape, (tuple, list, torch.Size)) and all(
        isinstance(d, int) and not isinstance(d, bool) for d in normalized_shape
    ):
        if len(normalized_shape) == 0:
            raise ValueError(f"{op}: normalized_shape must have at least one dimension, got ()")
        return tuple(normalized_shape)
    raise TypeError(
        f"{op}: normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}"
    )


def _check_eps(op: str, eps: object) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"{op}: eps must be a float, got {type(eps).__name__}")
    if not eps >= 0.0:
        raise ValueError(f"{op}: eps must be >= 0, got {eps}")
    return float(eps)


def _check_norm_args(
    op: str,
    x: torch.Tensor,
    shape: Sequence[int],
    residual: torch.Tensor | None = None,
    **params: torch.Tensor | None,
) -> None:
    check_tensor(op, "x", x)
    if tuple(x.shape[max(0, x.dim() - len(shape)) :]) != tuple(shape) or x.dim() < len(shape):
        raise ValueError(
            f"{op}: the last dims of x must equal normalized_shape {tuple(shape)}, got x of shape "
            f"{tuple(x.shape)}"
        )
    if residual is not None:
        check_operand(op, "residual", residual, "x", x)
        check_same_shape(op, x=x, residual=residual)
    given = {name: t for name, t in params.items() if t is not None}
    for name, t in given.items():
        check_operand(op, name, t, "x", x, shape, "normalized_shape", or_float32=True)
    if len(given) == 2:  # one dtype for both gradients
        check_same_dtype(op, **given)


def _rms_eps(eps: float | None) -> float:
    # As F.rms_norm: None means the epsilon of the compute type, float32 for every dtype here.
    return torch.finfo(torch.float32).eps if eps is None else eps


@policy(cuda=FP32)
def layer_norm(
    x: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """``torch.nn.functional.layer_norm``, with autograd (weight and bias gradients included).

    Saves two fp32 values per row (mean and 1/std) for the backward pass; the weight and bias
    gradients are deterministic.

    Args:
        x: float32, float16 or bfloat16 tensor on a CUDA device, any strides, whose last dims
            equal ``normalized_shape``.
        normalized_shape: the trailing shape to normalize over (an int for one dim).
        weight: optional scale of shape ``normalized_shape``, on x's device, in x's dtype or
            float32 (its gradient in its own dtype).
        bias: optional shift of shape ``normalized_shape``, as weight (one dtype for both).
        eps: added to the variance before the square root.

    Under CUDA ``torch.autocast`` x, weight and bias are first cast to float32 (so is the
    result), as ``F.layer_norm``'s are.
    """
    op = "tritonkit.layer_norm"
    x, weight, bias = cast(autocast_dtype("layer_norm", x), x, weight, bias)
    shape = _normalized_shape(op, normalized_shape)
    _check_norm_args(op, x, shape, weight=weight, bias=bias)
    return apply(NormFunction, x, weight, bias, len(shape), _check_eps(op, eps), False)


def rms_norm(
    x: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None = None,
    eps: float | None = None,
) -> torch.Tensor:
    """``torch.nn.functional.rms_norm``: ``x / sqrt(mean(x^2) + eps) * weight``, with autograd.

    Args:
        x: float32, float16 or bfloat16 tensor on a CUDA device, any strides, whose last dims
            equal ``normalized_shape``.
        normalized_shape: the trailing shape to normalize over (an int for one dim).
        weight: optional scale of shape ``normalized_shape``, on x's device, in x's dtype or
            float32 (its gradient in its own dtype).
        eps: added to the mean square; None means ``torch.finfo(torch.float32).eps``, what
            ``F.rms_norm`` uses for every dtype supported here (it computes in float32).
    """
    op = "tritonkit.rms_norm"
    shape = _normalized_shape(op, normalized_shape)
    _check_norm_args(op, x, shape, weight=weight)
    eps = _rms_eps(None if eps is None else _check_eps(op, eps))
    return apply(NormFunction, x, weight, None, len(shape), eps, True)


def _add_norm(op, x, residual, weight, bias, eps, rms):
    check_tensor(op, "x", x)
    if x.dim() == 0:
        raise ValueError(f"{op}: x must have at least one dimension, got a 0-d tensor")
    shape = (x.shape[-1],)
    for t in (weight, bias):  # the affine parameters' shape is the normalized shape
        if isinstance(t, torch.Tensor):
            shape = tuple(t.shape)
            break
    _check_norm_args(op, x, shape, residual, weight=weight, bias=bias)
    return apply(AddNormFunction, x, residual, weight, bias, len(shape), eps, rms)


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + residual; (rms_norm(h, weight.shape, weight, eps), h)`` in one pass.

    The sum is normalized in fp32, then rounded and stored; the backward reads the stored sum
    (not x or residual) and returns one gradient for both operands.

    Args:
        x: float32, float16 or bfloat16 tensor on a CUDA device, any strides.
        residual: tensor of the same shape, dtype and device.
        weight: scale over the trailing dims (its shape is the normalized shape), in x's dtype
            or float32, or None to normalize over the last dim without a scale.
        eps: as in :func:`rms_norm`; None means ``torch.finfo(torch.float32).eps``.

    Returns:
        ``(normalized, x + residual)``.
    """
    op = "tritonkit.add_rms_norm"
    eps = _rms_eps(None if eps is None else _check_eps(op, eps))
    return _add_norm(op, x, residual, weight, None, eps, True)


def add_layer_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float = 1e-5,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + residual; (layer_norm(h, weight.shape, weight, bias, eps), h)`` in one pass.

    Args:
        x: float32, float16 or bfloat16 tensor on a CUDA device, any strides.
        residual: tensor of the same shape, dtype and device.
        weight: scale over the trailing dims (its shape is the normalized shape), in x's dtype
            or float32, or None to normalize over the last dim.
        bias: shift of the same shape and dtype as weight, or None.
        eps: added to the variance before the square root.

    Returns:
        ``(normalized, x + residual)``.
    """
    op = "tritonkit.add_layer_norm"
    return _add_norm(op, x, residual, weight, bias, _check_eps(op, eps), False)
