"""The norm family's launch configs: ``NormForwardConfig`` and ``NormBackwardConfig`` (every
knob, with the measurements behind its default) and ``NormConfig`` (both, and what they share);
``launches.py`` chooses the launches of one call from the layout, dtypes and a config.
``experiments/sweep_norms.py`` sweeps them.

Measurements cited below are the H200's, bf16 unless said, from docs/performance.md (the
section named in quotes); "128 MiB per tensor" means shapes of every width scaled to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tritonkit.ops._core.reduce import PARTIAL_SUMS, PartialSumConfig


@dataclass(frozen=True)
class NormForwardConfig:
    """Every tunable of the LayerNorm and RMSNorm forward (with or without the residual add).

    Paths: rows without a residual of ``row_fwd_min_cols`` to ``row_fwd_max_cols`` contiguous
    columns take one program per row with the width a constant (``forward_row.py``); else a
    row of up to ``max_fused_cols`` is held in registers (``forward_tiles.py``), short rows
    sharing a tile of up to ``tile_elems`` elements, adjacent rows (a transposed input)
    ``adjacent_rows`` per tile; wider rows loop in chunks of ``loop_block_n``
    (``forward_looped.py``). Knobs ending in ``_ln`` / ``_rms`` are LayerNorm's / RMSNorm's.
    """

    # Chunks of 16384: rms_norm (4096, 65536) forward 3132 GB/s, 8192: 2761 ("final figures").
    max_fused_cols: int = 16384
    loop_block_n: int = 16384
    tile_elems: int = 4096
    adjacent_rows: int = 64
    elems_per_thread: int = 16
    max_warps: int = 32
    # Looped rows: programs per SM (each keeps a row in flight between its two sweeps, in L2);
    # the next chunk's loads issued before the current one is reduced (loop_prefetch);
    # elements per thread; rows per tile (chunks loop_block_n / rows wide, so that each weight
    # and bias chunk loaded serves several rows); the statistics (loop_stats: 1 per lane, 0 per
    # chunk, see forward_looped.py); softmax's L2 hints (loop_evict). (4096, 65536), a copy of
    # the same shape 4207 GB/s: rms_norm 3689-3697 GB/s (88%) with a sum per chunk, hints, no
    # prefetch, 32 per thread, 4 per SM, one row per tile (3404 with per lane, prefetch, no
    # hints, 2 per SM; 3151-3190 at two rows per tile); layer_norm 3058 (73%) per lane, hints,
    # prefetch, 16 per thread, 2 per SM, two rows per tile (2857 with Chan's merge per chunk and
    # one row; 2899 per lane, one row) ("lagged split backward (dropped), looped norm forward
    # per norm").
    loop_programs_per_sm_ln: int = 2
    loop_programs_per_sm_rms: int = 4
    loop_prefetch_ln: bool = True
    loop_prefetch_rms: bool = False
    loop_elems_per_thread_rms: int = 32  # LayerNorm: elems_per_thread, or _ln_wide below
    # Looped fp32 rows with a residual (8 bytes loaded per element): elements per thread, the
    # chunks narrowed to fit max_warps. LayerNorm's per-lane sums and prefetched chunk spill
    # at 16 (212 bytes, ptxas for sm_90a, experiments/spill_audit.py). add_layer_norm (4096,
    # 65536) fp32: 1.478 ms at 8, 1.782 at 16; add_rms_norm 1.342 at 16, 1.509 at 32. Halving
    # did not pay with 4 bytes per element (layer_norm fp32 0.783 vs 0.684 ms; add_layer_norm
    # bf16 1.038 vs 0.705) ("a spill audit, fp32 residual norms, backward vectors per thread").
    loop_elems_per_thread_ln_wide: int = 8
    loop_elems_per_thread_rms_wide: int = 16
    # Looped fp32 rows with a residual: the first sweep stores h = x + residual (an output
    # anyway) and the second reads h instead of x and the residual. A row of both is 512 KiB at
    # 65536 columns, more than L2 keeps for every program between the sweeps.
    loop_sum_first: bool = True
    loop_rows_ln: int = 2
    loop_rows_rms: int = 1
    loop_stats_ln: int = 1
    loop_stats_rms: int = 0
    # Looped LayerNorm of 16-bit rows with a residual: one row per tile and Chan's merge per
    # chunk (the per-lane sums beside x and the residual spill: 16 bytes, spill_audit.py).
    # add_layer_norm (4096, 65536): 0.630 ms (two rows, per lane 0.717; torch.compile 0.680)
    # ("a flattened looped forward (dropped), the 16-bit residual LayerNorm recipe").
    loop_rows_ln_res16: int = 1
    loop_stats_ln_res16: int = 0
    loop_evict: bool = True
    # Rows in registers: one row tile per program (programs per SM 0), launched without the
    # grid-stride loop and the outer-index division, at 16 elements per thread; programs per
    # SM > 0 walk row tiles so that each loads the weight and bias once, issuing the next
    # tile's loads before reducing the current one (prefetch). (16384, 4096): layer_norm 3667
    # GB/s (3515 persistent at 8 per SM, 3609 at 32 per thread; Liger 3636), rms_norm 3936
    # (3745 persistent; Liger 3967) ("one-tile launches, two-row norm backward tiles,
    # chunk-reduced looped softmax").
    fused_elems_per_thread: int = 16
    programs_per_sm_ln: int = 0
    programs_per_sm_rms: int = 0
    prefetch: bool = True
    # Rows in registers without a residual: the output pass re-reads the row (an L1/L2 hit:
    # the first read evict_last, the second evict_first, the weight and bias evict_last)
    # instead of keeping it live across the reductions, as torch.compile's kernels do; elements
    # per thread by (RMSNorm, element size), no re-read where the key is missing. ms re-read /
    # kept: rms_norm (16384, 4096) 0.0635 / 0.0637, (8192, 8192) 0.0637 / 0.0661, (4096, 16384)
    # 0.0670 / 0.0925, (16384, 5120) 0.0920 / 0.0991; layer_norm (65536, 1024) 0.0643 / 0.0752,
    # (8192, 8192) 0.0734 / 0.0866, (16384, 5120) 0.1235 / 0.1393, (16384, 4096) 0.0693 / 0.0694,
    # (4096, 16384) 0.1132 / 0.1073. fp32: rms_norm (16384, 4096) 0.1248 / 0.1286; layer_norm
    # 0.1638 / 0.1280 (kept) ("the norm forward re-reads its row; softmax's backward does not").
    reread: bool = True
    reread_elems_per_thread: tuple = (((False, 2), 32), ((True, 2), 16), ((True, 4), 8))
    # LayerNorm rows in registers of pipeline_cols columns or more without a residual: one
    # program per SM walks the row tiles through the compiler's software pipeline at 32
    # elements per thread, instead of one 32-warp program per row. ms, against one program per
    # row: (4096, 16384) 0.0688 vs 0.1140 (torch.compile 0.0689), fp16 0.0699 vs 0.1095, fp32
    # 0.1388 vs 0.1450; (2048, 16384) 0.0372 vs 0.0598. Not at 8192 (layer_norm (8192, 8192)
    # 0.0786 vs 0.0733) nor for RMSNorm (rms_norm (4096, 16384) 0.0679 vs 0.0663 re-read) ("the
    # pipelined forward for wide LayerNorm rows in registers").
    pipeline_cols: int = 16384
    pipeline_stages: int = 3
    pipeline_elems_per_thread: int = 32
    # One row per program with the width a compile-time constant (forward_row.py). With the
    # width a constant the compiler unrolls both sweeps; the same kernel with the width at run
    # time was 6-20% slower; the cost is one compilation per width. LayerNorm wants chunks that
    # divide the row (a partial last chunk cost up to 50% at two chunks). 128 MiB per tensor,
    # ms, this path / the paths it replaces / the best of torch.compile and Liger: layer_norm
    # 2560 0.0658 / 0.0908 / 0.0899, 4096 0.0666 / 0.0694 / 0.0707, 5120 0.0664 / 0.1008 /
    # 0.1129, (4096, 65536) 0.3106 / 0.3460 / 0.4425; rms_norm 5120 0.0643 / 0.0744 / 0.0715,
    # 10240 0.0649 / 0.0837 / 0.0649; fp32 layer_norm 5120 0.0679 / 0.0796 / 0.0727. Below 1536
    # columns it lost (layer_norm 1024: 0.0762 / 0.0655). LayerNorm rows up to 128 KiB
    # (layer_norm (4096, 65536) fp32: 0.7262 ms, looped 0.6875) ("the norm forward with the row
    # width a compile-time constant"); fp32 rows, with Welford's update per lane, up to 64 KiB:
    # layer_norm (1024, 32768) fp32 0.0843 ms, torch.compile 0.0812 ("Welford per lane for fp32
    # rows of the LayerNorm row forward").
    row_fwd: bool = True
    row_fwd_min_cols: int = 1536
    row_fwd_max_cols: int = 65536
    row_fwd_max_bytes_ln: int = 131072
    row_fwd_max_bytes_ln_fp32: int = 65536
    # fp32 LayerNorm rows of these power-of-2 widths take the row kernel too, in one chunk at
    # row_fwd_pow2_ln_fp32_warps (the other power-of-2 widths stay in registers). ms, this / in
    # registers / torch.compile / Liger: (16384, 4096) 0.1256 / 0.1300 / 0.1270 / 0.1283; (8192,
    # 8192) 0.1280 / 0.1308 / 0.1286. In chunks of 4096 at 16 warps 0.1335 at 8192; at 8 warps
    # 0.1283-0.1324 at 4096. At 2048 no config gained more than 3% on rows in registers ("the
    # wide LayerNorm forward's registers and re-reads (dropped); fp32 rows at 4096 columns").
    row_fwd_pow2_ln_fp32: tuple[int, ...] = (4096, 8192)
    row_fwd_pow2_ln_fp32_warps: int = 16
    # Warps by the row's bytes ((bytes, warps): the first entry holding the row; wider rows 32)
    # and chunks: LayerNorm within row_fwd_elems_per_thread (low, high) per thread the largest
    # power of 2 that divides the row; RMSNorm row_fwd_elems_per_thread_rms[warps] per thread.
    row_fwd_warps: tuple[tuple[int, int], ...] = ((8192, 4), (20480, 8), (40960, 16))
    row_fwd_elems_per_thread: tuple[int, int] = (4, 8)
    row_fwd_warps_rms: tuple[tuple[int, int], ...] = ((6144, 4), (14336, 8), (32768, 16))
    row_fwd_elems_per_thread_rms: tuple[tuple[int, int], ...] = (
        (4, 16), (8, 16), (16, 8), (32, 8),
    )  # fmt: skip
    row_fwd_chunk: int | None = None  # a fixed BLOCK_N instead of the rules above
    # 16-bit LayerNorm rows of row_fwd_thread_sums_min_cols or more: the first sweep's sums per
    # thread, not per lane (row_fwd_thread_elems: a fixed share per thread for every LayerNorm row
    # of the row kernel, fp32 included, instead of this rule). ptxas: at (4096, 65536) the per-lane
    # sweep, fully unrolled with seven chunk loads in flight, takes 53 registers a thread (one
    # 32-warp program per SM); per thread the sweep stays a loop at 32 registers (two per SM). ms,
    # per thread / per lane / a copy of the row bytes: (4096, 65536) 0.2937-0.2940 / 0.2985-0.2992 /
    # 0.2535-0.2537; fp16 0.2942-0.2947 / 0.3612-0.3622; (8192, 32768) 0.2535-0.2540 /
    # 0.2546-0.2549; (6554, 40000) 0.3189 / 0.3481. 128 MiB per tensor: per thread gained 0.7-1.1%
    # at 24576 and 32768 columns, lost 1-3% at 1536, 4096, 8192 and 10240 ("per-thread sums in the
    # LayerNorm row forward").
    row_fwd_thread_sums_min_cols: int = 24576
    row_fwd_thread_elems: int | None = None
    # 16-bit rows: the output's stores evict_first (row_fwd_store), so that they do not push out
    # of L2 the rows that the second sweep re-reads, and LayerNorm rows normalized as x * rstd
    # - mean * rstd, one FMA per element (row_fwd_scale_first; a 16-bit input holds no digits
    # that this rounding of mean * rstd could lose; fp32 rows, not measured, keep both as they
    # were). ms, both / neither / evict_first alone: layer_norm (4096, 65536) 0.3000 / 0.3073 /
    # 0.3029, (16384, 4096) 0.0659 / 0.0670 / 0.0658, (6553, 10240) 0.0656 / 0.0663 / 0.0659,
    # (2730, 24576) 0.0701 / 0.0710 / 0.0707. RMSNorm gained only on the widest rows ((4096,
    # 65536) 0.2794 / 0.2822) and lost 0.3-0.8% on rows of 5-48 KiB ((16384, 4096) 0.0643 /
    # 0.0638), so its rows over row_fwd_store_min_bytes_rms take it ("the wide LayerNorm
    # forward's affine and stores").
    row_fwd_store: str = "evict_first"
    row_fwd_store_min_bytes_rms: int = 65536
    row_fwd_scale_first: bool = True
    # Rows in registers whose length is the tile's (a power of 2): the forward skips its
    # selects; without them (16384, 4096) layer_norm took 3270 GB/s against 3483 ("16-bit
    # GELU, column sums, norm forward launches").
    even_n: bool = True


@dataclass(frozen=True)
class NormBackwardConfig:
    """Every tunable of the LayerNorm and RMSNorm backward (dx, dweight, dbias)."""

    # Rows in registers up to max_fused_cols columns; wider rows take the two-kernel path (row
    # sums, then dx by column blocks; backward_wide.py). In registers, rows of 8193-16384 spill
    # at 32 warps (ptxas, sm_90a: LayerNorm 368-568 bytes, RMSNorm 108-192). Rows the forward
    # keeps in registers take that path in chunks of mid_block_n, both passes through the
    # compiler's pipeline (mid_stages), the row-sum pass at mid_programs_per_sm[element size].
    # 128 MiB per tensor, backward (dx, dw, db), ms: in registers layer_norm 9216 0.669, 12288
    # 0.552, 16384 0.467 against torch.compile's 0.209, 0.222, 0.208; this path layer_norm 0.198
    # / 0.184 / 0.183 against torch.compile 0.210 / 0.224 / 0.212 and Liger 0.326 / 0.278 /
    # 0.246, rms_norm 0.187 / 0.176 / 0.177 against torch.compile 0.218 / 0.205 / 0.179 and
    # Liger 0.216 / 0.193 / 0.183; fp32 rows run best at 2 per SM ("a survey of model widths;
    # the backward of rows 8193-16384; a shift mismatch").
    max_fused_cols: int = 8192
    mid_block_n: int = 2048
    mid_stages: int = 3
    mid_programs_per_sm: tuple[tuple[int, int], ...] = ((2, 4), (4, 2))
    # Programs per SM walking row groups; each writes one fp32 row of weight (and bias)
    # partial sums. At 8 warps the kernel takes 166-216 registers per thread (ptxas, sm_90a):
    # one program is resident per SM. (16384, 4096), one row per tile: rms_norm 3374 GB/s at 2
    # per SM with prefetch (3007 without, 2841 at 1); layer_norm 2614 at 1 per SM (2244 at 2;
    # 1590 without prefetch) ("prefetching norms, segmented cross-entropy, 8-bit K-major
    # copies"); since tiles of two rows, 1 per SM for both (below).
    programs_per_sm_rms: int = 1
    programs_per_sm_ln: int = 1
    elems_per_thread: int = 16
    prefetch: bool = True
    # Rows in registers: the compiler's software pipeline over each program's row tiles (a
    # tile's loads go to shared memory by cp.async, stages - 1 tiles in flight) instead of the
    # hand prefetch into registers, which holds one tile and costs registers; None: the hand
    # prefetch. The depth is capped by the device's shared memory (depth()). LayerNorm goes one
    # tile deeper where its tiles are at most deep_tile_bytes (16-bit dy and x, two rows of
    # 4096). ms, (16384, 4096), one program per SM: layer_norm 0.1142 at 4 (0.1216 at 3; hand
    # prefetch 0.1334), rms_norm 0.1073 at 3 (0.1094 at 4; 0.1089); at 3 / 4 / hand:
    # add_layer_norm 0.1446 / 0.1533 / 0.1632, layer_norm fp32 (8192, 8192) 0.2142 / 0.2180 /
    # 0.3291, rms_norm (4096, 16384) 0.1772 / 0.1770 / 0.2296. The hand prefetch stays ahead by
    # 1-5% on fp32 rows of 1024-8192 (rms_norm (16384, 4096) 0.2032 vs 0.2004, layer_norm
    # 0.2166 vs 0.2083) ("the compiler's software pipeline for the norm backward").
    stages: int | None = 3
    stages_ln: int | None = 4  # LayerNorm, tiles of at most deep_tile_bytes
    deep_tile_bytes: int = 32768
    # Tiles: elements per tile, at most tile_bytes of the row tensors read per tile (dy and x,
    # and the residual's gradient for the fused forms). Rows of 4096 take two rows per tile,
    # so each load brings twice the bytes, except fp32 rows with a residual gradient (two of
    # those spilled: add_layer_norm fp32 (16384, 4096) 0.470 ms vs 0.287). And the tile height
    # up to which the weight and bias partial sums are reduced over each tile's rows as it goes
    # (one row of accumulators) instead of once after the loop (a tile of them). (16384, 4096),
    # 1 program per SM: rms_norm 3497 GB/s (3370 with one-row tiles at 2 per SM; 2871 reducing
    # per tile), layer_norm 3069 reducing per tile (2990 not; 2628 with one-row tiles) ("one-tile
    # launches, two-row norm backward tiles, chunk-reduced looped softmax").
    tile_elems: int = 8192
    tile_bytes: int = 65536
    reduce_rows_rms: int = 0
    reduce_rows_ln: int = 2
    # Wide rows: columns per program of the dx pass (80-128 registers at 8 warps), and its
    # programs per SM.
    wide_block_n: int = 4096
    wide_programs_per_sm: int = 2
    # Wide rows, RMSNorm: both passes through the compiler's pipeline (the row-sum pass over
    # its chunks, the dx pass over its row tiles), this deep; None: the hand prefetch. rms_norm
    # (4096, 65536): 0.6435 ms at 3 and 3 (hand prefetch 0.6941). LayerNorm lost with it (0.724
    # ms at best against 0.689), so it keeps the hand prefetch ("the compiler's software
    # pipeline for the norm backward").
    wide_sums_stages_rms: int | None = 3
    wide_stages_rms: int | None = 3
    # Wide rows' row-sum pass, elements per thread for fp32 rows: dy and x at elems_per_thread
    # spill (layer_norm (4096, 65536) fp32: 260 bytes, experiments/spill_audit.py).
    sums_elems_per_thread_fp32: int = 8
    # The second pass over the weight and bias partial rows (ops/_core/reduce.py).
    partial_sums: PartialSumConfig = PARTIAL_SUMS


@dataclass(frozen=True)
class NormConfig:
    """The norm family's config: the forward's, the backward's, and what both must agree on."""

    forward: NormForwardConfig = field(default_factory=NormForwardConfig)
    backward: NormBackwardConfig = field(default_factory=NormBackwardConfig)
    # 16-bit LayerNorm rows shift by their first element too (see shifts). (16384, 4096)
    # without: forward 3483 GB/s (3442 with), backward 2633 (2605) ("16-bit GELU, column sums,
    # norm forward launches").
    shift_16bit: bool = False
    # Every pipeline leaves this many bytes of the device's shared memory per program free
    # (reductions' scratch; the LayerNorm backward at 4 stages takes 3 tiles + 312 bytes).
    pipeline_smem_slack: int = 8192
    sms: int | None = None  # streaming multiprocessors to size grids for; None: the device's
    shared_memory: int | None = None  # bytes per program for pipelines; None: the device's


NORM = NormConfig()  # the default, tuned on an H200


def shifts(rms: bool, dtype: torch.dtype, config: NormConfig) -> bool:
    """Whether LayerNorm shifts each row by its first element: the forward saves the mean of
    the shifted row, so the backward must shift by the same value. A function of the dtype
    only, so that every forward path (rows in registers or looped, whatever the layout) and
    every backward path agree.

    Always for float32: a mean of 1e4 + N(0, 1) values in fp32 is off by ~1e-3 unshifted, an
    error in every output. A 16-bit input cannot hold such rows to that precision (bf16 steps
    by 64 at 1e4), so 16-bit rows skip the shift unless ``shift_16bit`` (the looped statistics
    are taken about the first chunk's mean either way).
    """
    return not rms and (dtype == torch.float32 or config.shift_16bit)


def depth(stages: int | None, stage_bytes: int, smem: int, slack: int) -> int | None:
    """A software-pipeline depth for loads of ``stage_bytes`` per iteration: at most ``stages``,
    with its stages - 1 buffers within ``smem`` bytes of shared memory per program less
    ``slack``; None (no pipeline) when not even two stages fit."""
    if stages is None:
        return None
    stages = min(stages, 1 + (smem - slack) // stage_bytes)
    return stages if stages >= 2 else None
