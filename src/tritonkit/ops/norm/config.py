"""The norm family's launch configs, one frozen dataclass per kernel path; ``launches.py``
chooses the launches of one call from the layout, dtypes, the device and a ``NormConfig``.
``experiments/sweep_norms.py`` sweeps them (its grids are the tuning space).

Knobs ending in ``_ln`` / ``_rms`` are LayerNorm's / RMSNorm's. The measurements behind every
default are in docs/performance.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tritonkit.ops._core.reduce import PARTIAL_SUMS, PartialSumConfig


@dataclass(frozen=True)
class NormTiles:
    """Row tiles of the forward and the backward (``rows.RowConfig``): a row of up to
    ``max_fused_cols`` is held in registers, short rows share a tile of up to ``tile_elems``
    elements, adjacent rows (a transposed input) ``adjacent_rows`` per tile; wider rows loop in
    chunks of ``loop_block_n``. Warps hold about ``elems_per_thread`` elements per thread, at
    most ``max_warps``. Wide chunks keep more bytes in flight per program than narrow ones."""

    max_fused_cols: int = 16384
    loop_block_n: int = 16384
    tile_elems: int = 4096
    adjacent_rows: int = 64
    elems_per_thread: int = 16
    max_warps: int = 32


@dataclass(frozen=True)
class RegistersForwardConfig:
    """Rows in registers (``forward_tiles.py``).

    ``programs_per_sm_*`` 0: one row tile per program, launched without the grid-stride loop
    and the outer-index division; > 0: programs walk row tiles, loading the weight and bias
    once and issuing the next tile's loads before reducing the current one (``prefetch``).
    ``reread``: without a residual, the output pass re-reads the row from L1/L2 (the first
    read evict_last, the second evict_first) instead of keeping it live across the reductions,
    as torch.compile's kernels do; elements per thread by (RMSNorm, element size), no re-read
    where the key is missing. ``even_n``: a row as long as its tile skips the column selects.
    """

    elems_per_thread: int = 16
    programs_per_sm_ln: int = 0
    programs_per_sm_rms: int = 0
    prefetch: bool = True
    reread: bool = True
    reread_elems_per_thread: tuple = (((False, 2), 32), ((True, 2), 16), ((True, 4), 8))
    even_n: bool = True


@dataclass(frozen=True)
class PipelinedForwardConfig:
    """LayerNorm rows in registers of ``min_cols`` columns or more without a residual: one
    program per SM walks the row tiles through the compiler's software pipeline (``stages``
    deep, ``elems_per_thread`` per thread) instead of one 32-warp program per row."""

    min_cols: int = 16384
    stages: int = 3
    elems_per_thread: int = 32


@dataclass(frozen=True)
class LoopedForwardConfig:
    """Rows wider than ``NormTiles.max_fused_cols`` (``forward_looped.py``): read twice, the
    second time from L2.

    Programs per SM (each keeps a row in flight between its two sweeps); the next chunk's loads
    issued before the current one is reduced (``prefetch_*``); elements per thread, fewer for
    fp32 rows with a residual (``_wide``: 8 bytes loaded per element, whose per-lane sums and
    prefetched chunk would spill); ``sum_first``: fp32 rows with a residual store h = x +
    residual in the first sweep and the second reads h (a row of both outgrows what L2 keeps
    per program); ``evict``: L2 hints keeping what the first sweep reads for the second."""

    programs_per_sm_ln: int = 2
    programs_per_sm_rms: int = 4
    prefetch_ln: bool = True
    prefetch_rms: bool = False
    elems_per_thread_ln: int = 16
    elems_per_thread_rms: int = 32
    elems_per_thread_ln_wide: int = 8
    elems_per_thread_rms_wide: int = 16
    sum_first: bool = True
    evict: bool = True


@dataclass(frozen=True)
class LoopedRowsConfig:
    """Rows per tile of the looped forward (chunks ``loop_block_n / rows`` wide, so that each
    weight and bias chunk loaded serves several rows) and how its statistics are summed
    (``stats`` 1: per lane, 0: per chunk with Chan's merge; see forward_looped.py). 16-bit
    LayerNorm rows with a residual take ``*_ln_res16``: per-lane sums beside x and the residual
    would spill."""

    rows_ln: int = 2
    rows_rms: int = 1
    stats_ln: int = 1
    stats_rms: int = 0
    rows_ln_res16: int = 1
    stats_ln_res16: int = 0


@dataclass(frozen=True)
class RowForwardConfig:
    """One program per row with the row width a compile-time constant (``forward_row.py``):
    rows without a residual of ``min_cols`` to ``max_cols`` contiguous columns (``enabled``).

    The compiler unrolls both sweeps at a constant width, at the cost of one compilation per
    width; narrower rows do better several to a tile. Warps by the row's bytes (``warps_*``:
    (bytes, warps), the first entry holding the row; wider rows 32); chunks: LayerNorm within
    ``elems_per_thread_ln`` (low, high) per thread the largest power of 2 that divides the row
    (a partial last chunk costs), RMSNorm ``elems_per_thread_rms[warps]`` per thread; ``chunk``
    a fixed BLOCK_N instead. 16-bit outputs are stored with ``store`` (evict_first: they do not
    push out of L2 the rows the second sweep re-reads); RMSNorm only for rows over
    ``store_min_bytes_rms``, where it gains."""

    enabled: bool = True
    min_cols: int = 1536
    max_cols: int = 65536
    warps_ln: tuple[tuple[int, int], ...] = ((8192, 4), (20480, 8), (40960, 16))
    elems_per_thread_ln: tuple[int, int] = (4, 8)
    warps_rms: tuple[tuple[int, int], ...] = ((6144, 4), (14336, 8), (32768, 16))
    elems_per_thread_rms: tuple[tuple[int, int], ...] = ((4, 16), (8, 16), (16, 8), (32, 8))
    chunk: int | None = None
    store: str = "evict_first"
    store_min_bytes_rms: int = 65536


@dataclass(frozen=True)
class RowForwardLNConfig:
    """LayerNorm's own rules on the row path: rows up to ``max_bytes`` (fp32 ``max_bytes_fp32``,
    with Welford's update per lane); fp32 rows of a power-of-2 width stay in registers except
    the widths of ``pow2_fp32``, taken in one chunk at ``pow2_fp32_warps``; 16-bit rows of
    ``thread_sums_min_cols`` or more sum the first sweep per thread, not per lane (an unrolled
    per-lane sweep of a very wide row takes registers that keep a second program off the SM;
    ``thread_elems``: a fixed share per thread for every row instead); 16-bit rows normalized as
    x * rstd - mean * rstd, one FMA per element (``scale_first``: a 16-bit input holds no
    digits that this rounding of mean * rstd could lose)."""

    max_bytes: int = 131072
    max_bytes_fp32: int = 65536
    pow2_fp32: tuple[int, ...] = (4096, 8192)
    pow2_fp32_warps: int = 16
    thread_sums_min_cols: int = 24576
    thread_elems: int | None = None
    scale_first: bool = True


@dataclass(frozen=True)
class NormForwardConfig:
    """The forward's paths: the row kernel (``row``, ``row_ln``), rows in registers
    (``registers``, ``pipeline``), looped rows (``looped``, ``looped_rows``)."""

    registers: RegistersForwardConfig = field(default_factory=RegistersForwardConfig)
    pipeline: PipelinedForwardConfig = field(default_factory=PipelinedForwardConfig)
    looped: LoopedForwardConfig = field(default_factory=LoopedForwardConfig)
    looped_rows: LoopedRowsConfig = field(default_factory=LoopedRowsConfig)
    row: RowForwardConfig = field(default_factory=RowForwardConfig)
    row_ln: RowForwardLNConfig = field(default_factory=RowForwardLNConfig)


@dataclass(frozen=True)
class RegistersBackwardConfig:
    """The backward of rows in registers, up to ``max_cols`` columns (wider rows in registers
    spill). Programs per SM walk row groups, each writing one fp32 row of weight (and bias)
    partial sums (the kernel's registers leave one program resident per SM). Tiles of at most
    ``tile_elems`` elements and ``tile_bytes`` of the row tensors: two rows of 4096 per tile
    double the bytes each load brings. Partial sums are reduced over each tile's rows as it goes
    for tiles up to ``reduce_rows_*`` rows. Rows reach each program through the compiler's
    software pipeline, ``stages`` deep (LayerNorm's tiles of at most ``deep_tile_bytes``:
    ``stages_ln``), capped by the device's shared memory; None: the hand prefetch, which holds
    one tile in registers."""

    max_cols: int = 8192
    tile_elems: int = 8192
    tile_bytes: int = 65536
    reduce_rows_rms: int = 0
    reduce_rows_ln: int = 2
    programs_per_sm_rms: int = 1
    programs_per_sm_ln: int = 1
    stages: int | None = 3
    stages_ln: int | None = 4
    deep_tile_bytes: int = 32768


@dataclass(frozen=True)
class WideBackwardConfig:
    """Rows wider than ``RegistersBackwardConfig.max_cols``: a looped pass takes each row's two
    sums (sum(w * dy * xhat), sum(w * dy); ``backward_wide.py``), then a column-block pass
    computes dx and the partial sums.

    Rows the forward keeps in registers (``mid``) take chunks of ``mid_block_n``, both passes
    through the compiler's pipeline (``mid_stages``), the row-sum pass at
    ``mid_programs_per_sm[element size]``; wider rows ``sums_programs_per_sm``. The dx pass:
    ``block_n`` columns per program (fewer registers than a whole row), ``programs_per_sm``.
    RMSNorm's wide rows go through the pipeline (``sums_stages_rms``, ``stages_rms``; None: the
    hand prefetch, which LayerNorm keeps). fp32 rows' row-sum pass takes
    ``sums_elems_per_thread_fp32`` (dy and x at the default would spill)."""

    mid_block_n: int = 2048
    mid_stages: int = 3
    mid_programs_per_sm: tuple[tuple[int, int], ...] = ((2, 4), (4, 2))
    sums_programs_per_sm: int = 2
    block_n: int = 4096
    programs_per_sm: int = 2
    sums_stages_rms: int | None = 3
    stages_rms: int | None = 3
    sums_elems_per_thread_fp32: int = 8


@dataclass(frozen=True)
class NormBackwardConfig:
    """The backward (dx, dweight, dbias): rows in registers or wide rows, the dx pass at
    ``elems_per_thread`` per thread (the hand prefetch of the next tile where no pipeline runs:
    ``prefetch``), and the second pass over the partial rows (ops/_core/reduce.py)."""

    registers: RegistersBackwardConfig = field(default_factory=RegistersBackwardConfig)
    wide: WideBackwardConfig = field(default_factory=WideBackwardConfig)
    partial_sums: PartialSumConfig = PARTIAL_SUMS
    elems_per_thread: int = 16
    prefetch: bool = True


@dataclass(frozen=True)
class NormConfig:
    """The norm family's config: the row tiles, the forward's, the backward's, and what both
    must agree on. ``shift_16bit``: 16-bit LayerNorm rows shift by their first element too (see
    ``shifts``); ``pipeline_smem_slack``: bytes of shared memory per program every pipeline
    leaves free (reductions' scratch); ``sms`` / ``shared_memory``: the device's when None."""

    tiles: NormTiles = field(default_factory=NormTiles)
    forward: NormForwardConfig = field(default_factory=NormForwardConfig)
    backward: NormBackwardConfig = field(default_factory=NormBackwardConfig)
    shift_16bit: bool = False
    pipeline_smem_slack: int = 8192
    sms: int | None = None
    shared_memory: int | None = None


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


def depth(stages: int | None, stage_bytes: int, smem: int, slack: int) -> int | None:
    """A software-pipeline depth for loads of ``stage_bytes`` per iteration: at most ``stages``,
    with its stages - 1 buffers within ``smem`` bytes of shared memory per program less
    ``slack``; None (no pipeline) when not even two stages fit."""
    if stages is None:
        return None
    stages = min(stages, 1 + (smem - slack) // stage_bytes)
    return stages if stages >= 2 else None
