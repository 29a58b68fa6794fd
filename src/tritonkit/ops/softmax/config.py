"""The softmax family's launch configs, one frozen dataclass per kernel path (``SoftmaxConfig``
holds the tile paths' knobs and the others), and the choice of a launch from the layout,
dtypes, the device and a config (``forward_launch``, ``backward_launch``).
``experiments/sweep_norms.py`` sweeps them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from tritonkit.ops._core.launch import Launch
from tritonkit.ops._core.layout import next_power_of_2
from tritonkit.ops._core.rows import (
    RowConfig,
    RowLayout,
    evict_kwargs,
    lookup,
    row_program_config,
    variants,
)
from tritonkit.ops.softmax.kernels_aligned import (
    softmax_bwd_aligned_kernel,
    softmax_fwd_aligned_kernel,
)
from tritonkit.ops.softmax.kernels_looped import (
    softmax_bwd_looped_kernel,
    softmax_fwd_looped_kernel,
)
from tritonkit.ops.softmax.kernels_row_backward import softmax_bwd_row_kernel
from tritonkit.ops.softmax.kernels_tiles import softmax_bwd_tiles_kernel, softmax_fwd_tiles_kernel

# Constants of the paths below that no sweep varies (the sweeps' knobs are the configs' fields).
# Rows in registers: rows adjacent in memory (a reduction over a non-last dim) per tile, so that
# a warp reads a contiguous run of them; warps at most.
ADJACENT_ROWS = 64
MAX_WARPS = 32
# The looped backward's L2 hints (``LoopedSoftmaxConfig.evict_fwd`` for the forward's).
LOOPED_EVICT_BWD = True
# The row backward (``RowBackwardConfig``): 16-bit rows up to ROW_BWD_MAX_COLS, fp32 softmax rows
# up to ROW_BWD_MAX_COLS_FP32; warps by the bytes of a row of dy ((bytes, warps), fp32's
# ROW_BWD_WARPS_FP32; wider rows 32), elements per thread by warps.
ROW_BWD_MAX_COLS = 32768
ROW_BWD_MAX_COLS_FP32 = 8192
ROW_BWD_WARPS = ((32768, 16),)
ROW_BWD_WARPS_FP32 = ((16384, 16),)
ROW_BWD_ELEMS_PER_THREAD = ((4, 16), (8, 16), (16, 8), (32, 8))
# The aligned walk (``AlignedConfig``): the forward's (warps, elements per thread) by element
# size; the backward's warps by the row's bytes (wider rows 32), elements per thread by warps.
ALIGNED_FWD = ((2, (8, 32)), (4, (32, 16)))
ALIGNED_WARPS_BWD = ((16384, 8), (49152, 16))
ALIGNED_ELEMS_PER_THREAD_BWD = ((8, 16), (16, 8), (32, 8))


@dataclass(frozen=True)
class LoopedSoftmaxConfig:
    """Rows wider than ``SoftmaxConfig.max_fused_cols`` (``kernels_looped.py``), forward and
    backward apart: elements per thread of a chunk and programs per SM (each keeps one row in flight
    between its two sweeps, in L2); the next chunk's loads issued before working on the current
    one (``prefetch_*``: two chunks per program in flight); L2 hints (``evict_fwd``, the
    backward's ``LOOPED_EVICT_BWD``: the first
    sweep's loads evict_last, the second sweep's loads and stores evict_first, so that the rows
    the first sweep read are what stays in L2); ``chunk_max``: the forward's first sweep reduces
    each chunk (a max and a sum across the tile per chunk, half the instructions per element)
    instead of keeping a running maximum and sum per lane, which is bound by instruction issue,
    not by memory."""

    elems_per_thread_fwd: int = 32
    elems_per_thread_bwd: int = 16
    programs_per_sm_fwd: int = 4
    programs_per_sm_bwd: int = 2
    prefetch_fwd: bool = False
    prefetch_bwd: bool = True
    evict_fwd: bool = True
    chunk_max: bool = True


@dataclass(frozen=True)
class RowBackwardConfig:
    """The backward of one row per program with the width a compile-time constant
    (``kernels_row_backward.py``): 16-bit rows of contiguous columns, softmax's of
    ``min_cols`` to ``ROW_BWD_MAX_COLS``, log_softmax's from ``min_cols_log``; fp32 softmax rows
    up to ``ROW_BWD_MAX_COLS_FP32``; warps and chunks by the row's bytes (``ROW_BWD_*``;
    ``chunk``: a fixed BLOCK_N instead). Narrower, wider and most fp32 rows do as well or better
    on the tile paths."""

    min_cols: int = 4096
    min_cols_log: int = 16385
    chunk: int | None = None


@dataclass(frozen=True)
class AlignedConfig:
    """Rows that do not start on 16 bytes, or whose width is not a whole number of 16-byte
    vectors, take the aligned walk (``kernels_aligned.py``) where every tensor's
    rows start at the same offset within 16 bytes: the forward for rows of ``min_cols_fwd`` or more
    (narrower odd rows in registers do well already), the backward from ``min_cols_bwd``; warps
    and chunks ``ALIGNED_*``; ``chunk``: a fixed BLOCK_N for both instead."""

    min_cols_fwd: int = 16385
    min_cols_bwd: int = 4096
    chunk: int | None = None


@dataclass(frozen=True)
class SoftmaxConfig:
    """Every tunable of softmax and log_softmax, forward and backward.

    Rows in registers (``kernels_tiles.py``): a row of up to ``max_fused_cols`` is one tile (wider
    rows in registers spill); short rows share a tile of up to ``tile_elems`` elements; rows
    adjacent in memory take ``ADJACENT_ROWS`` per tile. Wider rows loop in chunks of
    ``loop_block_n`` (``looped``). Warps are sized so that each thread holds about
    ``elems_per_thread`` elements of a tile, at most ``MAX_WARPS``. ``row_backward`` and
    ``aligned``: the one-row-per-program kernels. ``sms``: streaming multiprocessors to size
    grids for; None: the device's. The measurements behind the defaults are in
    docs/performance.md.
    """

    max_fused_cols: int = 16384
    loop_block_n: int = 16384
    tile_elems: int = 4096
    elems_per_thread: int = 32
    looped: LoopedSoftmaxConfig = field(default_factory=LoopedSoftmaxConfig)
    row_backward: RowBackwardConfig = field(default_factory=RowBackwardConfig)
    aligned: AlignedConfig = field(default_factory=AlignedConfig)
    sms: int | None = None

    @classmethod
    def space(cls) -> list[SoftmaxConfig]:
        """The tuning space of rows in registers (experiments/sweep_norms.py times it)."""
        return variants(cls(), elems_per_thread=[32, 16, 8], tile_elems=[4096, 8192])


SOFTMAX = SoftmaxConfig()  # the default


def _row_config(layout: RowLayout, config: SoftmaxConfig, backward: bool, sms: int) -> RowConfig:
    return RowConfig.for_layout(
        layout,
        sms=sms,
        max_fused=config.max_fused_cols,
        loop_block=config.loop_block_n,
        tile_elems=config.tile_elems,
        adjacent_rows=ADJACENT_ROWS,
        elems_per_thread=config.elems_per_thread,
        loop_elems_per_thread=(
            config.looped.elems_per_thread_bwd if backward else config.looped.elems_per_thread_fwd
        ),
        max_warps=MAX_WARPS,
        loop_programs_per_sm=(
            config.looped.programs_per_sm_bwd if backward else config.looped.programs_per_sm_fwd
        ),
    )


def _tile_meta(cfg: RowConfig, layout: RowLayout) -> dict:
    return {
        "OUTER": layout.n_outer > 1,
        "ONE_TILE": cfg.programs == cfg.n_tiles,
        "INT64": layout.needs_int64(),
        "BLOCK_R": cfg.BLOCK_R,
        "BLOCK_N": cfg.BLOCK_N,
        "num_warps": cfg.num_warps,
    }


def misaligned_rows(
    layout: RowLayout, tensors: Sequence[torch.Tensor], config: SoftmaxConfig
) -> int:
    """Elements per 16 bytes (VEC) when the aligned-walk kernels apply to ``tensors`` (those
    with columns, in the layout's order): contiguous columns, 16-byte aligned base pointers,
    every tensor's rows starting at the same offset within 16 bytes, and some row not aligned
    (or a width not a whole number of vectors); 0 otherwise."""
    size = tensors[0].element_size()
    vec = 16 // size
    if any(t.element_size() != size or t.data_ptr() % 16 for t in tensors):
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


def aligned_config(
    n_cols: int, element_size: int, backward: bool, config: SoftmaxConfig
) -> tuple[int, int]:
    """(BLOCK_N, warps) of an aligned-walk kernel."""
    ac = config.aligned
    if backward:
        block_n, warps = row_program_config(
            n_cols, element_size, ALIGNED_WARPS_BWD, ALIGNED_ELEMS_PER_THREAD_BWD
        )
    else:
        warps, per_thread = lookup(ALIGNED_FWD, element_size, lookup(ALIGNED_FWD, 4))
        block_n = min(32 * warps * per_thread, next_power_of_2(n_cols))
    if ac.chunk is not None:
        block_n = min(ac.chunk, next_power_of_2(n_cols))
    return block_n, warps


def forward_launch(
    layout: RowLayout, x: torch.Tensor, y: torch.Tensor, log: bool, config: SoftmaxConfig, sms: int
) -> Launch:
    """The forward's launch over ``layout`` for input x and output y (their strides and base
    pointers' alignment; the launch takes (x, y))."""
    (sxo, sxn, sxi), (syo, syn, syi) = layout.strides
    if layout.n_cols >= config.aligned.min_cols_fwd:
        vec = misaligned_rows(layout, [x, y], config)
        if vec:
            block_n, warps = aligned_config(layout.n_cols, x.element_size(), False, config)
            return Launch(
                softmax_fwd_aligned_kernel,
                (layout.n_outer * layout.n_inner,),
                (layout.n_cols, layout.n_inner, sxo, sxi, syo, syi),
                {"LOG": log, "OUTER": layout.n_outer > 1, "VEC": vec, "BLOCK_N": block_n,
                 "num_warps": warps},
            )  # fmt: skip
    cfg = _row_config(layout, config, backward=False, sms=sms)
    ints = (layout.n_cols, layout.n_inner, cfg.n_iblocks, cfg.n_tiles, sxo, sxn, sxi, syo, syn, syi)
    if not cfg.LOOPED:
        return Launch(
            softmax_fwd_tiles_kernel, (cfg.programs,), ints, {"LOG": log, **_tile_meta(cfg, layout)}
        )
    meta = {
        "LOG": log,
        "PREFETCH": config.looped.prefetch_fwd,
        "CHUNK_MAX": config.looped.chunk_max,
        **evict_kwargs(config.looped.evict_fwd),
        **_tile_meta(cfg, layout),
    }
    return Launch(softmax_fwd_looped_kernel, (cfg.programs,), ints, meta)


def row_bwd_config(n_cols: int, element_size: int, config: SoftmaxConfig) -> tuple[int, int]:
    """(BLOCK_N, warps) of softmax_bwd_row_kernel."""
    rb = config.row_backward
    table = ROW_BWD_WARPS_FP32 if element_size == 4 else ROW_BWD_WARPS
    block_n, warps = row_program_config(n_cols, element_size, table, ROW_BWD_ELEMS_PER_THREAD)
    if rb.chunk is not None:
        block_n = min(rb.chunk, next_power_of_2(n_cols))
    return block_n, warps


def takes_row_backward(
    layout: RowLayout, element_size: int, log: bool, config: SoftmaxConfig
) -> bool:
    """Whether the backward takes softmax_bwd_row_kernel: contiguous rows of 16-bit (or fp32
    softmax) elements within the widths of ``RowBackwardConfig``."""
    rb = config.row_backward
    (_, sgn, _), (_, syn, _), (_, sdn, _) = layout.strides
    if not sgn == syn == sdn == 1:
        return False
    if element_size == 4:
        return not log and rb.min_cols <= layout.n_cols <= ROW_BWD_MAX_COLS_FP32
    low = rb.min_cols_log if log else rb.min_cols
    return element_size == 2 and low <= layout.n_cols <= ROW_BWD_MAX_COLS


def backward_launch(
    layout: RowLayout,
    dy: torch.Tensor,
    y: torch.Tensor,
    dx: torch.Tensor,
    log: bool,
    config: SoftmaxConfig,
    sms: int,
) -> Launch:
    """The backward's launch over ``layout`` for (dy, y, dx) (the launch takes them)."""
    (sgo, sgn, sgi), (syo, syn, syi), (sdo, sdn, sdi) = layout.strides
    row = layout.n_outer * layout.n_inner
    if layout.n_cols >= config.aligned.min_cols_bwd:
        vec = misaligned_rows(layout, [dy, y, dx], config)
        if vec:
            block_n, warps = aligned_config(layout.n_cols, y.element_size(), True, config)
            return Launch(
                softmax_bwd_aligned_kernel,
                (row,),
                (layout.n_cols, layout.n_inner, sgo, sgi, syo, syi, sdo, sdi),
                {"LOG": log, "OUTER": layout.n_outer > 1, "VEC": vec, "BLOCK_N": block_n,
                 "num_warps": warps},
            )  # fmt: skip
    if takes_row_backward(layout, y.element_size(), log, config):
        block_n, warps = row_bwd_config(layout.n_cols, y.element_size(), config)
        return Launch(
            softmax_bwd_row_kernel,
            (row,),
            (layout.n_inner, sgo, sgi, syo, syi, sdo, sdi),
            {"N_COLS": layout.n_cols, "LOG": log, "OUTER": layout.n_outer > 1,
             "BLOCK_N": block_n, "num_warps": warps},
        )  # fmt: skip
    cfg = _row_config(layout, config, backward=True, sms=sms)
    ints = (layout.n_cols, layout.n_inner, cfg.n_iblocks, cfg.n_tiles, sgo, sgn, sgi, syo, syn, syi,
            sdo, sdn, sdi)  # fmt: skip
    if not cfg.LOOPED:
        return Launch(
            softmax_bwd_tiles_kernel, (cfg.programs,), ints, {"LOG": log, **_tile_meta(cfg, layout)}
        )
    meta = {
        "LOG": log,
        "PREFETCH": config.looped.prefetch_bwd,
        **evict_kwargs(LOOPED_EVICT_BWD),
        **_tile_meta(cfg, layout),
    }
    return Launch(softmax_bwd_looped_kernel, (cfg.programs,), ints, meta)
