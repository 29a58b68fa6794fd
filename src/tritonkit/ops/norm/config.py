"""The norm family's launch configs, one frozen dataclass per kernel path; ``plan.py``
chooses the launches of one call from the layout, dtypes, the device and a ``NormConfig``.
``experiments/sweep_norms.py`` sweeps them (its grids are the tuning space).

Knobs ending in ``_ln`` / ``_rms`` are LayerNorm's / RMSNorm's. The measurements behind every
default are in docs/performance.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from tritonkit.ops._core.layout import cdiv, next_power_of_2
from tritonkit.ops._core.reduce import PARTIAL_SUMS, PartialSumConfig
from tritonkit.ops._core.rows import (
    RowConfig,
    RowLayout,
    pow2_floor,
    row_program_config,
    row_program_warps,
    row_warps,
)

# Constants of the paths below that no sweep varies (the sweeps' knobs are the configs' fields).
# Row tiles: adjacent rows (a transposed input) per tile, elements per thread, warps at most.
ADJACENT_ROWS = 64
TILE_ELEMS_PER_THREAD = 16
MAX_WARPS = 32
# Rows in registers re-read (``RegistersForwardConfig.reread``): elements per thread by
# (RMSNorm, element size), no re-read where the key is missing.
REREAD_ELEMS_PER_THREAD = (((False, 2), 32), ((True, 2), 16), ((True, 4), 8))
# The pipelined LayerNorm forward (``RegistersForwardConfig.pipeline_min_cols``): depth,
# elements per thread.
PIPELINE_STAGES = 3
PIPELINE_ELEMS_PER_THREAD = 32
# The looped forward's elements per thread for fp32 rows with a residual (8 bytes loaded per
# element, whose per-lane sums and prefetched chunk would spill at the default), LayerNorm's
# and RMSNorm's; 16-bit LayerNorm rows with a residual: one row per tile, stats per chunk
# (per-lane sums beside x and the residual would spill).
LOOPED_WIDE_ELEMS_LN = 8
LOOPED_WIDE_ELEMS_RMS = 16
LOOPED_ROWS_LN_RES16 = 1
LOOPED_STATS_LN_RES16 = 0
# The row kernel (``RowForwardConfig``): rows up to ROW_MAX_COLS; warps by the row's bytes
# ((bytes, warps), the first entry holding the row; wider rows 32); LayerNorm chunks within
# (low, high) elements per thread, RMSNorm's by warps; 16-bit outputs stored evict_first (they
# do not push out of L2 the rows the second sweep re-reads), RMSNorm's only for rows over
# ROW_STORE_MIN_BYTES_RMS, where it gains.
ROW_MAX_COLS = 65536
ROW_WARPS_LN = ((8192, 4), (20480, 8), (40960, 16))
ROW_ELEMS_PER_THREAD_LN = (4, 8)
ROW_WARPS_RMS = ((6144, 4), (14336, 8), (32768, 16))
ROW_ELEMS_PER_THREAD_RMS = ((4, 16), (8, 16), (16, 8), (32, 8))
ROW_STORE = "evict_first"
ROW_STORE_MIN_BYTES_RMS = 65536
# LayerNorm on the row kernel: rows up to ROW_MAX_BYTES_LN (fp32: ROW_MAX_BYTES_LN_FP32, with
# Welford's update per lane); fp32 rows of a power-of-2 width stay in registers except the
# widths of ROW_POW2_FP32, taken in one chunk at ROW_POW2_FP32_WARPS; 16-bit rows of
# ROW_THREAD_SUMS_MIN_COLS or more sum the first sweep per thread, not per lane (an unrolled
# per-lane sweep of a very wide row takes registers that keep a second program off the SM).
# 16-bit LayerNorm rows are normalized as x * rstd - mean * rstd, one FMA per element (a 16-bit
# input holds no digits that this rounding of mean * rstd could lose).
ROW_MAX_BYTES_LN = 131072
ROW_MAX_BYTES_LN_FP32 = 65536
ROW_POW2_FP32 = (4096, 8192)
ROW_POW2_FP32_WARPS = 16
ROW_THREAD_SUMS_MIN_COLS = 24576
# The backward: tiles of at most BWD_TILE_BYTES of the row tensors; LayerNorm's tiles of at most
# BWD_DEEP_TILE_BYTES take ``stages_ln``. Wide rows (``WideBackwardConfig``): rows the forward
# keeps in registers through the pipeline WIDE_MID_STAGES deep, their row-sum pass at
# WIDE_MID_PROGRAMS_PER_SM[element size] per SM, wider rows' at WIDE_SUMS_PROGRAMS_PER_SM;
# RMSNorm's wide rows through the pipeline WIDE_STAGES_RMS deep (both passes; LayerNorm keeps
# the hand prefetch); fp32 rows' row-sum pass at WIDE_SUMS_ELEMS_PER_THREAD_FP32 per thread
# (dy and x at the default would spill).
BWD_TILE_BYTES = 65536
BWD_DEEP_TILE_BYTES = 32768
WIDE_MID_STAGES = 3
WIDE_MID_PROGRAMS_PER_SM = ((2, 4), (4, 2))
WIDE_SUMS_PROGRAMS_PER_SM = 2
WIDE_STAGES_RMS = 3
WIDE_SUMS_ELEMS_PER_THREAD_FP32 = 8
# Bytes of shared memory per program every pipeline leaves free (reductions' scratch).
PIPELINE_SMEM_SLACK = 8192


@dataclass(frozen=True)
class NormTiles:
    """Row tiles of the forward and the backward (``rows.RowConfig``): a row of up to
    ``max_fused_cols`` is held in registers, short rows share a tile of up to ``tile_elems``
    elements; wider rows loop in chunks of ``loop_block_n``. Wide chunks keep more bytes in
    flight per program than narrow ones."""

    max_fused_cols: int = 16384
    loop_block_n: int = 16384
    tile_elems: int = 4096


@dataclass(frozen=True)
class RegistersForwardConfig:
    """Rows in registers (``kernels_forward_tiles.py``).

    ``programs_per_sm`` (LayerNorm's and RMSNorm's) 0: one row tile per program, launched
    without the grid-stride loop and the outer-index division; > 0: programs walk row tiles,
    loading the weight and bias once and issuing the next tile's loads before reducing the
    current one (the hand prefetch, where no software pipeline runs).
    ``reread``: without a residual, the output pass re-reads the row from L1/L2 (the first
    read evict_last, the second evict_first) instead of keeping it live across the reductions,
    as torch.compile's kernels do (``REREAD_ELEMS_PER_THREAD``). ``even_n``: a row as long as
    its tile skips the column selects. LayerNorm rows of ``pipeline_min_cols`` columns or more
    without a residual: one program per SM walks the row tiles through the compiler's software
    pipeline (``PIPELINE_STAGES`` deep) instead of one 32-warp program per row.
    """

    elems_per_thread: int = 16
    programs_per_sm: int = 0
    reread: bool = True
    even_n: bool = True
    pipeline_min_cols: int = 16384


@dataclass(frozen=True)
class LoopedForwardConfig:
    """Rows wider than ``NormTiles.max_fused_cols`` (``kernels_forward_looped.py``): read twice, the
    second time from L2.

    Programs per SM (each keeps a row in flight between its two sweeps); the next chunk's loads
    issued before the current one is reduced (``prefetch_*``); elements per thread (fewer for
    fp32 rows with a residual: ``LOOPED_WIDE_ELEMS_*``); ``sum_first``: fp32 rows with a
    residual store h = x + residual in the first sweep and the second reads h (a row of both
    outgrows what L2 keeps per program); ``evict``: L2 hints keeping what the first sweep reads
    for the second."""

    programs_per_sm_ln: int = 2
    programs_per_sm_rms: int = 4
    prefetch_ln: bool = True
    prefetch_rms: bool = False
    elems_per_thread_ln: int = 16
    elems_per_thread_rms: int = 32
    sum_first: bool = True
    evict: bool = True


@dataclass(frozen=True)
class LoopedRowsConfig:
    """Rows per tile of the looped forward (chunks ``loop_block_n / rows`` wide, so that each
    weight and bias chunk loaded serves several rows) and how its statistics are summed
    (``stats`` 1: per lane, 0: per chunk with Chan's merge; see kernels_forward_looped.py). 16-bit
    LayerNorm rows with a residual take ``LOOPED_*_LN_RES16``."""

    rows_ln: int = 2
    rows_rms: int = 1
    stats_ln: int = 1
    stats_rms: int = 0


@dataclass(frozen=True)
class RowForwardConfig:
    """One program per row with the row width a compile-time constant (``kernels_forward_row.py``):
    rows without a residual of ``min_cols`` to ``ROW_MAX_COLS`` contiguous columns (none where
    ``min_cols`` is above ``ROW_MAX_COLS``). The compiler unrolls both sweeps at a constant
    width, at the cost of one compilation per width; narrower rows do better several to a tile.
    ``chunk``: a fixed BLOCK_N instead of the one by the row's bytes (``ROW_*`` above);
    ``thread_elems``: a fixed share per thread of LayerNorm's first sweep for every row instead
    of per-lane sums below ``ROW_THREAD_SUMS_MIN_COLS``."""

    min_cols: int = 1536
    chunk: int | None = None
    thread_elems: int | None = None


@dataclass(frozen=True)
class NormForwardConfig:
    """The forward's paths: the row kernel (``row``), rows in registers (``registers``),
    looped rows (``looped``, ``looped_rows``)."""

    registers: RegistersForwardConfig = field(default_factory=RegistersForwardConfig)
    looped: LoopedForwardConfig = field(default_factory=LoopedForwardConfig)
    looped_rows: LoopedRowsConfig = field(default_factory=LoopedRowsConfig)
    row: RowForwardConfig = field(default_factory=RowForwardConfig)


@dataclass(frozen=True)
class RegistersBackwardConfig:
    """The backward of rows in registers, up to ``max_cols`` columns (wider rows in registers
    spill). Programs per SM walk row groups, each writing one fp32 row of weight (and bias)
    partial sums (the kernel's registers leave one program resident per SM). Tiles of at most
    ``tile_elems`` elements and ``BWD_TILE_BYTES`` of the row tensors: two rows of 4096 per
    tile double the bytes each load brings. Partial sums are reduced over each tile's rows as
    it goes for tiles up to ``reduce_rows_*`` rows. Rows reach each program through the
    compiler's software pipeline, ``stages`` deep (LayerNorm's tiles of at most
    ``BWD_DEEP_TILE_BYTES``: ``stages_ln``), capped by the device's shared memory; None: the
    hand prefetch, which holds one tile in registers."""

    max_cols: int = 8192
    tile_elems: int = 8192
    reduce_rows_rms: int = 0
    reduce_rows_ln: int = 2
    programs_per_sm: int = 1  # LayerNorm's and RMSNorm's
    stages: int | None = 3
    stages_ln: int | None = 4


@dataclass(frozen=True)
class WideBackwardConfig:
    """Rows wider than ``RegistersBackwardConfig.max_cols``: a looped pass takes each row's two
    sums (sum(w * dy * xhat), sum(w * dy); ``kernels_backward_wide.py``), then a column-block pass
    computes dx and the partial sums.

    Rows the forward keeps in registers (``mid``) take chunks of ``mid_block_n``. The dx pass:
    ``block_n`` columns per program (fewer registers than a whole row), ``programs_per_sm``.
    The rest is constant (``WIDE_*`` above)."""

    mid_block_n: int = 2048
    block_n: int = 4096
    programs_per_sm: int = 2


@dataclass(frozen=True)
class NormBackwardConfig:
    """The backward (dx, dweight, dbias): rows in registers or wide rows, the dx pass at
    ``elems_per_thread`` per thread (the hand prefetch of the next tile where no pipeline
    runs), and the second pass over the partial rows (ops/_core/reduce.py)."""

    registers: RegistersBackwardConfig = field(default_factory=RegistersBackwardConfig)
    wide: WideBackwardConfig = field(default_factory=WideBackwardConfig)
    partial_sums: PartialSumConfig = PARTIAL_SUMS
    elems_per_thread: int = 16


@dataclass(frozen=True)
class NormConfig:
    """The norm family's config: the row tiles, the forward's, the backward's, and what both
    must agree on. ``shift_16bit``: 16-bit LayerNorm rows shift by their first element too (see
    ``shifts``); ``sms``: the device's when None."""

    tiles: NormTiles = field(default_factory=NormTiles)
    forward: NormForwardConfig = field(default_factory=NormForwardConfig)
    backward: NormBackwardConfig = field(default_factory=NormBackwardConfig)
    shift_16bit: bool = False
    sms: int | None = None


NORM = NormConfig()  # the default


def shifts(rms: bool, dtype: torch.dtype, config: NormConfig) -> bool:
    """Whether LayerNorm shifts each row by its first element: the forward saves the mean of
    the shifted row, so the backward must shift by the same value. A function of the dtype
    only, so that every forward path (rows in registers or looped, whatever the layout) and
    every backward path agree.

    Always for float32: the mean of values far from zero with a small spread loses the spread's
    digits unshifted, an error in every output. A 16-bit input cannot hold such rows to that
    precision, so 16-bit rows skip the shift unless ``shift_16bit`` (the looped statistics are
    taken about the first chunk's mean either way).
    """
    return not rms and (dtype == torch.float32 or config.shift_16bit)


def depth(
    stages: int | None, stage_bytes: int, smem: int, slack: int = PIPELINE_SMEM_SLACK
) -> int | None:
    """A software-pipeline depth for loads of ``stage_bytes`` per iteration: at most ``stages``,
    with its stages - 1 buffers within ``smem`` bytes of shared memory per program less
    ``slack``; None (no pipeline) when not even two stages fit."""
    if stages is None:
        return None
    stages = min(stages, 1 + (smem - slack) // stage_bytes)
    return stages if stages >= 2 else None


# ---- the launch choices: which kernel path, and its tiles -------------------------------------


def row_tiles(
    layout: RowLayout,
    config: NormConfig,
    sms: int,
    tile_elems: int | None = None,
    elems_per_thread: int | None = None,
    max_fused: int | None = None,
    loop_block: int | None = None,
    loop_programs_per_sm: int = 1,
) -> RowConfig:
    """The row tiles of a norm pass (the forward's by default; the backward passes its own
    tile size, widest row in registers, looped chunk and programs per SM; the looped forward
    sizes its own grid after). Rows in registers are one tile per program (programs per SM 0)
    at ``elems_per_thread`` per thread (default ``RegistersForwardConfig.elems_per_thread``)."""
    tc = config.tiles
    rc = config.forward.registers
    cfg = RowConfig.for_layout(
        layout,
        sms=sms,
        max_fused=max_fused or tc.max_fused_cols,
        loop_block=loop_block or tc.loop_block_n,
        tile_elems=tile_elems or tc.tile_elems,
        adjacent_rows=ADJACENT_ROWS,
        elems_per_thread=TILE_ELEMS_PER_THREAD,
        loop_elems_per_thread=TILE_ELEMS_PER_THREAD,
        max_warps=MAX_WARPS,
        loop_programs_per_sm=loop_programs_per_sm,
    )
    if not cfg.LOOPED:  # programs per SM 0: one row tile per program
        programs = cfg.n_tiles
        per_sm = rc.programs_per_sm
        if per_sm > 0:
            programs = min(cfg.n_tiles, per_sm * sms)
        per_thread = elems_per_thread or rc.elems_per_thread
        warps = row_warps(cfg.BLOCK_R * cfg.BLOCK_N, per_thread, MAX_WARPS)
        cfg = dataclasses.replace(cfg, programs=max(1, programs), num_warps=warps)
    return cfg


def _fit_chunk(block_r: int, block_n: int, per_thread: int, max_warps: int) -> tuple[int, int]:
    """(BLOCK_N, warps) of a tile of ``block_r`` rows: at most ``block_n`` columns, narrowed so
    that ``per_thread`` elements per thread fit ``max_warps``."""
    block_n = min(block_n, pow2_floor(per_thread * 32 * max_warps // block_r))
    return block_n, row_warps(block_r * block_n, per_thread, max_warps)


# ----------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------


def takes_row_forward(
    layout: RowLayout, has_residual: bool, rms: bool, dtype: torch.dtype, config: NormConfig
) -> bool:
    """Whether the forward takes norm_fwd_row_kernel: rows without a residual of contiguous
    columns within the widths of ``RowForwardConfig``. fp32 LayerNorm rows of a power-of-2
    width up to max_fused_cols stay in registers, kept there across the statistics (no
    re-read), which runs as fast or faster, but for the widths of
    ``ROW_POW2_FP32``."""
    row = config.forward.row
    (_, stride_xn, _), (_, stride_yn, _) = layout.strides[:2]
    n_cols = layout.n_cols
    kept = (
        not rms
        and dtype == torch.float32
        and n_cols == next_power_of_2(n_cols)
        and n_cols not in ROW_POW2_FP32
    )
    max_bytes_ln = ROW_MAX_BYTES_LN_FP32 if dtype == torch.float32 else ROW_MAX_BYTES_LN
    return (
        not has_residual
        and stride_xn == 1  # rows contiguous (not adjacent rows of a transposed input)
        and stride_yn == 1
        and row.min_cols <= n_cols <= ROW_MAX_COLS
        and (rms or n_cols * dtype.itemsize <= max_bytes_ln)
        and not (kept and n_cols <= config.tiles.max_fused_cols)
    )


def row_forward_config(
    n_cols: int, element_size: int, rms: bool, fc: NormForwardConfig
) -> tuple[int, int]:
    """(BLOCK_N, warps) of norm_fwd_row_kernel, warps by the row's bytes. RMSNorm:
    ROW_WARPS_RMS, chunks of ROW_ELEMS_PER_THREAD_RMS per thread. LayerNorm: ROW_WARPS_LN, and
    within the bounds of ROW_ELEMS_PER_THREAD_LN the largest power of 2 that divides the row
    (no partial last chunk)."""
    row = fc.row
    if rms:
        block_n, warps = row_program_config(
            n_cols, element_size, ROW_WARPS_RMS, ROW_ELEMS_PER_THREAD_RMS
        )
    elif element_size == 4 and n_cols in ROW_POW2_FP32:
        block_n, warps = n_cols, ROW_POW2_FP32_WARPS
    else:
        warps = row_program_warps(n_cols * element_size, ROW_WARPS_LN)
        low, high = (32 * warps * e for e in ROW_ELEMS_PER_THREAD_LN)
        even = n_cols & -n_cols  # the largest power of 2 that divides n_cols
        block_n = min(max(even, low), high, next_power_of_2(n_cols))
    if row.chunk is not None:
        block_n = min(row.chunk, next_power_of_2(n_cols))
    return block_n, warps


def row_forward_store(n_cols: int, element_size: int, rms: bool, fc: NormForwardConfig) -> str:
    """The L2 policy of norm_fwd_row_kernel's stores (see ``ROW_STORE``)."""
    if element_size != 2 or (rms and n_cols * element_size <= ROW_STORE_MIN_BYTES_RMS):
        return ""
    return ROW_STORE


def row_forward_thread_elems(
    n_cols: int, dtype: torch.dtype, rms: bool, block_n: int, warps: int, fc: NormForwardConfig
) -> int:
    """norm_fwd_row_kernel's THREAD_ELEMS: each thread's share of a chunk for 16-bit LayerNorm
    rows of ROW_THREAD_SUMS_MIN_COLS or more (or thread_elems for every LayerNorm row), else 0
    (per-lane sums)."""
    if rms:
        return 0
    if fc.row.thread_elems is not None:
        return min(fc.row.thread_elems, block_n)
    if dtype == torch.float32 or n_cols < ROW_THREAD_SUMS_MIN_COLS:
        return 0
    return max(block_n // (32 * warps), 1)


def _looped_forward_tiles(
    cfg: RowConfig,
    layout: RowLayout,
    config: NormConfig,
    rms: bool,
    load_bytes: int,
    res16: bool,
    sms: int,
) -> RowConfig:
    """The looped forward's own rows per tile, warps and programs per SM (``LoopedForwardConfig``,
    ``LoopedRowsConfig``); ``load_bytes``: bytes each element of a row loads (x, and the
    residual); ``res16``: 16-bit rows with a residual."""
    lc, lr = config.forward.looped, config.forward.looped_rows
    rows = lr.rows_rms if rms else (LOOPED_ROWS_LN_RES16 if res16 else lr.rows_ln)
    per_sm = lc.programs_per_sm_rms if rms else lc.programs_per_sm_ln
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
        per_thread = LOOPED_WIDE_ELEMS_RMS if wide else lc.elems_per_thread_rms
    else:
        per_thread = LOOPED_WIDE_ELEMS_LN if wide else lc.elems_per_thread_ln
    block_n, warps = _fit_chunk(cfg.BLOCK_R, cfg.BLOCK_N, per_thread, MAX_WARPS)
    return dataclasses.replace(
        cfg, BLOCK_N=block_n, programs=max(1, min(cfg.n_tiles, per_sm * sms)), num_warps=warps
    )


def backward_tile_elems(n_row_tensors: int, dtype: torch.dtype, rc: RegistersBackwardConfig) -> int:
    """Elements per backward row tile: tile_elems, or fewer to read at most BWD_TILE_BYTES."""
    return min(rc.tile_elems, pow2_floor(BWD_TILE_BYTES // (n_row_tensors * dtype.itemsize)))


def backward_stages(
    cfg: RowConfig,
    block_n: int,
    element_sizes: tuple[int, ...],
    rms: bool,
    config: NormConfig,
    smem: int,
    mid: bool = False,
) -> int | None:
    """Pipeline depth of the dx pass over its row tiles (``cfg.BLOCK_R`` rows x ``block_n``
    columns of row tensors of ``element_sizes``): stages (LayerNorm's small tiles stages_ln),
    wide rows WIDE_STAGES_RMS, looped rows of at most the forward's max_fused_cols (``mid``)
    WIDE_MID_STAGES; None for the hand prefetch."""
    rc = config.backward.registers
    tile_bytes = cfg.BLOCK_R * block_n * sum(element_sizes)
    if cfg.LOOPED and mid:
        stages = WIDE_MID_STAGES
    elif cfg.LOOPED:
        stages = WIDE_STAGES_RMS if rms else None
    elif not rms and tile_bytes <= BWD_DEEP_TILE_BYTES:
        stages = rc.stages_ln
    else:
        stages = rc.stages
    return depth(stages, tile_bytes, smem)
