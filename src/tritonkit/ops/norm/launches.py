"""The choice of the norm family's launches: from a layout (``ops/_core/rows.py``), dtypes
and a ``NormConfig``, the kernel, grid, scalar arguments and constexprs of the forward
(``forward_launch``: the row kernel, rows in registers or looped rows) and of the backward
(``backward_launches``: the wide rows' sums, dx with the partial sums, the partial rows' sum).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from tritonkit.ops._core.launch import Launch
from tritonkit.ops._core.layout import cdiv, next_power_of_2
from tritonkit.ops._core.reduce import colsum_kernel
from tritonkit.ops._core.rows import (
    RowConfig,
    RowLayout,
    evict_kwargs,
    lookup,
    pow2_floor,
    row_program_config,
    row_program_warps,
    row_warps,
)
from tritonkit.ops.norm.backward import norm_bwd_kernel
from tritonkit.ops.norm.backward_wide import norm_bwd_sums_kernel
from tritonkit.ops.norm.config import (
    ADJACENT_ROWS,
    BWD_DEEP_TILE_BYTES,
    BWD_TILE_BYTES,
    LOOPED_ROWS_LN_RES16,
    LOOPED_STATS_LN_RES16,
    LOOPED_WIDE_ELEMS_LN,
    LOOPED_WIDE_ELEMS_RMS,
    MAX_WARPS,
    PIPELINE_ELEMS_PER_THREAD,
    PIPELINE_STAGES,
    REREAD_ELEMS_PER_THREAD,
    ROW_ELEMS_PER_THREAD_LN,
    ROW_ELEMS_PER_THREAD_RMS,
    ROW_MAX_BYTES_LN,
    ROW_MAX_BYTES_LN_FP32,
    ROW_MAX_COLS,
    ROW_POW2_FP32,
    ROW_POW2_FP32_WARPS,
    ROW_STORE,
    ROW_STORE_MIN_BYTES_RMS,
    ROW_THREAD_SUMS_MIN_COLS,
    ROW_WARPS_LN,
    ROW_WARPS_RMS,
    TILE_ELEMS_PER_THREAD,
    WIDE_MID_PROGRAMS_PER_SM,
    WIDE_MID_STAGES,
    WIDE_STAGES_RMS,
    WIDE_SUMS_ELEMS_PER_THREAD_FP32,
    WIDE_SUMS_PROGRAMS_PER_SM,
    NormConfig,
    NormForwardConfig,
    RegistersBackwardConfig,
    depth,
    shifts,
)
from tritonkit.ops.norm.forward_looped import norm_fwd_looped_kernel
from tritonkit.ops.norm.forward_row import norm_fwd_row_kernel
from tritonkit.ops.norm.forward_tiles import norm_fwd_tiles_kernel


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


def forward_launch(
    layout: RowLayout,
    dtype: torch.dtype,
    has_residual: bool,
    has_weight: bool,
    has_bias: bool,
    stride_w: int,
    stride_b: int,
    eps: float,
    rms: bool,
    config: NormConfig,
    sms: int,
    smem: int,
) -> Launch:
    """The forward's launch over ``layout`` (the plan's: x, [residual], y, [h], statistics).
    It takes (x, residual, weight, bias, y, h, mean, rstd), placeholders where absent."""
    fc = config.forward
    size = dtype.itemsize
    shift = shifts(rms, dtype, config)
    sx, *rest = layout.strides
    if has_residual:
        sr, sy, sh, ss = rest[0], rest[1], rest[2], rest[3]
    else:
        sr, sy, sh, ss = sx, rest[0], rest[0], rest[1]
    if takes_row_forward(layout, has_residual, rms, dtype, config):
        block_n, warps = row_forward_config(layout.n_cols, size, rms, fc)
        return Launch(
            norm_fwd_row_kernel,
            (layout.n_outer * layout.n_inner,),
            (layout.n_inner, eps, *sx, *sy, ss[0], ss[2], stride_w, stride_b),
            {
                "N_COLS": layout.n_cols,
                "IS_RMS": rms,
                "SHIFT": shift,
                "HAS_WEIGHT": has_weight,
                "HAS_BIAS": has_bias,
                "OUTER": layout.n_outer > 1,
                "WELFORD": dtype == torch.float32,
                "SCALE_FIRST": not rms and size == 2,
                "STORE": row_forward_store(layout.n_cols, size, rms, fc),
                "BLOCK_N": block_n,
                "THREAD_ELEMS": row_forward_thread_elems(
                    layout.n_cols, dtype, rms, block_n, warps, fc
                ),
                "num_warps": warps,
            },
        )
    rc, lc = fc.registers, fc.looped
    reread_per_thread = None  # the re-read forward's elements per thread, where it applies
    if rc.reread and not has_residual:
        reread_per_thread = lookup(REREAD_ELEMS_PER_THREAD, (rms, size))
    cfg = row_tiles(layout, config, sms, elems_per_thread=reread_per_thread)
    stages = None
    if not rms and not has_residual and not cfg.LOOPED and rc.pipeline_min_cols <= cfg.BLOCK_N:
        stage_bytes = cfg.BLOCK_R * cfg.BLOCK_N * size
        stages = depth(PIPELINE_STAGES, stage_bytes, smem)
    if stages is not None:
        cfg = row_tiles(layout, config, sms, elems_per_thread=PIPELINE_ELEMS_PER_THREAD)
        cfg = dataclasses.replace(cfg, programs=min(cfg.n_tiles, sms))
    common = {
        "IS_RMS": rms,
        "SHIFT": shift,
        "HAS_RESIDUAL": has_residual,
        "HAS_WEIGHT": has_weight,
        "HAS_BIAS": has_bias,
    }
    if cfg.LOOPED:
        res16 = has_residual and size == 2  # 16-bit rows with a residual
        load_bytes = size * (2 if has_residual else 1)
        cfg = _looped_forward_tiles(cfg, layout, config, rms, load_bytes, res16, sms)
        lr = fc.looped_rows
        meta = {
            **common,
            "LOOP_PREFETCH": lc.prefetch_rms if rms else lc.prefetch_ln,
            "LOOP_STATS": lr.stats_rms
            if rms
            else (LOOPED_STATS_LN_RES16 if res16 else lr.stats_ln),
            **evict_kwargs(lc.evict),
            "SUM_FIRST": lc.sum_first and has_residual and dtype == torch.float32,
        }
        kernel = norm_fwd_looped_kernel
    else:
        meta = {
            **common,
            "PREFETCH": stages is None and cfg.programs < cfg.n_tiles,
            "REREAD": reread_per_thread is not None and stages is None,
            "STAGES": stages,
            "EVEN_N": rc.even_n and layout.n_cols == cfg.BLOCK_N,
        }
        kernel = norm_fwd_tiles_kernel
    meta.update(
        ONE_TILE=cfg.programs == cfg.n_tiles,
        OUTER=layout.n_outer > 1,
        INT64=layout.needs_int64(),
        BLOCK_R=cfg.BLOCK_R,
        BLOCK_N=cfg.BLOCK_N,
        num_warps=cfg.num_warps,
    )
    scalars = (
        layout.n_cols, layout.n_inner, cfg.n_iblocks, cfg.n_tiles, eps, *sx, *sr, *sy, *sh,
        ss[0], ss[2], stride_w, stride_b,
    )  # fmt: skip
    return Launch(kernel, (cfg.programs,), scalars, meta)


# ----------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BackwardLaunches:
    """The launches of one backward: the row sums of wide rows (``sums``, or None), dx with the
    partial sums (``main``), the partial rows' sum (``partials``, or None: no parameter
    gradient), and the partial rows per gradient (``groups``)."""

    sums: Launch | None
    main: Launch
    partials: Launch | None
    groups: int


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


def backward_launches(
    layout: RowLayout,
    dtype: torch.dtype,
    element_sizes: tuple[int, ...],
    weight_size: int,
    stride_w: int,
    rms: bool,
    has_weight: bool,
    has_dres: bool,
    weight_grad: bool,
    bias_grad: bool,
    config: NormConfig,
    sms: int,
    smem: int,
) -> BackwardLaunches:
    """The backward's launches over ``layout`` (the plan's: dy, x, [dres], dx, statistics);
    ``element_sizes``: of dy, x (and dres); ``weight_size``: the weight's element size (0 for
    none). ``sums`` takes (dy, x, w, mean, rstd, c1, c2); ``main`` (dy, x, dres, w, mean, rstd,
    c1, c2, dx, dw_part, db_part); ``partials`` (partial, out, partial2, out2)."""
    bc = config.backward
    rc, wc = bc.registers, bc.wide
    max_warps = MAX_WARPS
    sg, sx, *rest = layout.strides
    sr = rest.pop(0) if has_dres else sg
    sdx = rest.pop(0)
    ss = rest[0]
    n_cols = layout.n_cols
    mid = n_cols <= config.tiles.max_fused_cols  # a row the forward keeps in registers
    cfg = row_tiles(
        layout,
        config,
        sms,
        tile_elems=backward_tile_elems(len(element_sizes), dtype, rc),
        max_fused=min(rc.max_cols, config.tiles.max_fused_cols),
        loop_block=wc.mid_block_n if mid else None,
        loop_programs_per_sm=(
            lookup(WIDE_MID_PROGRAMS_PER_SM, dtype.itemsize) if mid else WIDE_SUMS_PROGRAMS_PER_SM
        ),
    )
    # The dx / partial-sum pass: (BLOCK_N, warps, column blocks, row groups).
    if cfg.LOOPED:
        block_n = pow2_floor(min(wc.block_n, cfg.BLOCK_N))
        col_blocks = cdiv(n_cols, block_n)
        target = wc.programs_per_sm * sms // col_blocks
    else:
        block_n, col_blocks = cfg.BLOCK_N, 1
        target = rc.programs_per_sm * sms
    warps = row_warps(cfg.BLOCK_R * block_n, bc.elems_per_thread, max_warps)
    groups = max(1, min(cfg.n_tiles, target))
    reduce_rows = rc.reduce_rows_rms if rms else rc.reduce_rows_ln
    stages = backward_stages(cfg, block_n, element_sizes, rms, config, smem, mid)
    shift = shifts(rms, dtype, config)
    int64 = layout.needs_int64()
    sums = None
    if cfg.LOOPED:
        sums_n, sums_warps = cfg.BLOCK_N, cfg.num_warps
        if dtype.itemsize > 2:
            sums_n, sums_warps = _fit_chunk(
                cfg.BLOCK_R, sums_n, WIDE_SUMS_ELEMS_PER_THREAD_FP32, max_warps
            )
        # Each chunk loads dy, x and the weight.
        chunk_bytes = cfg.BLOCK_R * sums_n * (element_sizes[0] + element_sizes[1])
        chunk_bytes += sums_n * weight_size
        sums_stages = depth(
            WIDE_MID_STAGES if mid else (WIDE_STAGES_RMS if rms else None), chunk_bytes, smem
        )
        sums = Launch(
            norm_bwd_sums_kernel,
            (cfg.programs,),
            (n_cols, layout.n_inner, cfg.n_iblocks, cfg.n_tiles, *sg, *sx, ss[0], ss[2],
             stride_w),
            {"IS_RMS": rms, "SHIFT": shift, "HAS_WEIGHT": has_weight, "STAGES": sums_stages,
             "OUTER": layout.n_outer > 1, "INT64": int64, "BLOCK_R": cfg.BLOCK_R,
             "BLOCK_N": sums_n, "num_warps": sums_warps},
        )  # fmt: skip
    main = Launch(
        norm_bwd_kernel,
        (col_blocks, groups),
        (n_cols, layout.n_inner, cfg.n_iblocks, cfg.n_tiles, *sg, *sx, *sr, *sdx, ss[0], ss[2],
         stride_w),
        {"IS_RMS": rms, "SHIFT": shift, "HAS_WEIGHT": has_weight, "HAS_DRES": has_dres,
         "WEIGHT_GRAD": weight_grad, "BIAS_GRAD": bias_grad, "SUMS_GIVEN": cfg.LOOPED,
         "PREFETCH": stages is None,
         # one-row tiles: the same sum either way
         "REDUCE_TILES": 1 < cfg.BLOCK_R <= reduce_rows,
         "STAGES": stages, "OUTER": layout.n_outer > 1, "INT64": int64,
         "BLOCK_R": cfg.BLOCK_R, "BLOCK_N": block_n, "num_warps": warps},
    )  # fmt: skip
    partials = None
    if weight_grad or bias_grad:
        block_m, block_nc, sum_warps = bc.partial_sums.launch(groups, n_cols, sms)
        partials = Launch(
            colsum_kernel,
            (cdiv(n_cols, block_nc),),
            (groups, n_cols),
            {"SECOND": weight_grad and bias_grad, "BLOCK_M": block_m, "BLOCK_N": block_nc,
             "num_warps": sum_warps},
        )  # fmt: skip
    return BackwardLaunches(sums, main, partials, groups)
