"""The softmax family's launch configs: ``SoftmaxConfig`` (every knob, with the measurements
behind its default) and the choice of a launch from the layout, dtypes and a config
(``forward_launch``, ``backward_launch``). ``experiments/sweep_norms.py`` sweeps them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tritonkit.ops._core.layout import next_power_of_2
from tritonkit.ops._core.rows import (
    Launch,
    RowConfig,
    RowLayout,
    evict_kwargs,
    lookup,
    row_config,
    row_program_config,
)
from tritonkit.ops.softmax.aligned import softmax_bwd_aligned_kernel, softmax_fwd_aligned_kernel
from tritonkit.ops.softmax.looped import softmax_bwd_looped_kernel, softmax_fwd_looped_kernel
from tritonkit.ops.softmax.row_backward import softmax_bwd_row_kernel
from tritonkit.ops.softmax.tiles import softmax_bwd_tiles_kernel, softmax_fwd_tiles_kernel

# Measurements cited below are the H200's, bf16 unless said, from docs/performance.md (the
# section named in quotes).


@dataclass(frozen=True)
class SoftmaxConfig:
    """Every tunable of softmax and log_softmax, forward and backward.

    Rows in registers (``tiles.py``): a row of up to ``max_fused_cols`` is one tile; short rows
    share a tile of up to ``tile_elems`` elements; rows adjacent in memory (a reduction over a
    non-last dim) take ``adjacent_rows`` per tile, so that a warp reads a contiguous run of
    them. Wider rows loop in chunks of ``loop_block_n`` (``looped.py``). Warps are sized so that
    each thread holds about ``elems_per_thread`` elements of a tile (``loop_elems_per_thread_*``
    of a looped chunk), at most ``max_warps``.
    """

    # 16384 fp32 values are 16 per thread at 32 warps (ptxas for sm_90a: 32-57 registers, no
    # spills; a 65536 row spills). (4096, 65536): chunks of 16384 at one program per SM gave
    # 2725 GB/s forward and 3047 backward, 8192 at 2 per SM 2258 and 2759 ("final figures").
    max_fused_cols: int = 16384
    loop_block_n: int = 16384
    tile_elems: int = 4096
    adjacent_rows: int = 64
    # (16384, 4096): forward 3941 GB/s at 32 (3749 at 16, 2747 at 8), backward 4072 (4063 at
    # 16) ("one-tile launches, two-row norm backward tiles, chunk-reduced looped softmax").
    elems_per_thread: int = 32
    max_warps: int = 32
    # Looped rows, forward and backward apart: elements per thread of a chunk, and programs per
    # SM (each keeps one row in flight between its two sweeps, in L2). (4096, 65536), chunks of
    # 16384, read flush: forward 3575 GB/s at 32 per thread and 4 per SM (3365 at 16 and 2;
    # 3453 at 32 and 2); backward 4056 at 16 and 2 (3979 at 32 and 4) ("rows split across
    # programs (not adopted), ncu, the read flush, softmax's looped forward").
    loop_elems_per_thread_fwd: int = 32
    loop_elems_per_thread_bwd: int = 16
    loop_programs_per_sm_fwd: int = 4
    loop_programs_per_sm_bwd: int = 2
    # Looped rows: issue the next chunk's loads before working on the current one (two chunks
    # per program in flight). (4096, 65536), chunks of 16384, 2 programs per SM: backward 3326
    # GB/s with it, 2744 without ("cross-entropy gradient in the backward, looped-row prefetch,
    # FP8 BLOCK_K 256"). The forward, with loop_chunk_max and loop_evict_fwd: 3333 without it,
    # 2794 with ("one-tile launches, ...").
    loop_prefetch_fwd: bool = False
    loop_prefetch_bwd: bool = True
    # Looped rows: L2 eviction hints, the first sweep's loads evict_last and the second sweep's
    # loads and stores evict_first, so that the rows the first sweep read are what stays in L2.
    # (4096, 65536): backward 3934 GB/s with them, 3310 without; the forward gains with
    # loop_chunk_max only ("one-tile launches, ...").
    loop_evict_fwd: bool = True
    loop_evict_bwd: bool = True
    # Looped forward: the first sweep reduces each chunk (a max and a sum across the tile per
    # chunk, half the instructions per element) instead of keeping a running maximum and sum
    # per lane, which was bound by instruction issue, not by memory. (4096, 65536): 3333 GB/s
    # with both this and loop_evict_fwd (2938 with this alone, 2941 with the hints alone, 2659
    # with neither) ("one-tile launches, ...").
    loop_chunk_max: bool = True

    # Backward of one row per program with the width a compile-time constant (row_backward.py):
    # 16-bit rows of contiguous columns, softmax's of row_bwd_min_cols to row_bwd_max_cols,
    # log_softmax's from row_bwd_min_cols_log; warps by the bytes of a row of dy
    # (row_bwd_warps; wider, 32) and chunks of row_bwd_elems_per_thread[warps] per thread (or
    # row_bwd_chunk columns where set). ms, this path / the old ones / torch.compile: softmax
    # (7281, 9216) 0.0952 / 0.1188 / 0.0947, (4096, 16384) 0.0933 / 0.0968 / 0.0916, (2730,
    # 24576) 0.0947 / 0.1309 / 0.1209; log_softmax (2097, 32000) 0.0949 / 0.1098 / 0.0965, but
    # (5461, 12288) 0.0945 / 0.0929. Narrower rows, wider ones and fp32 rows did as well or
    # better on the old paths (softmax (22369, 3000) 0.1443 / 0.1077, (4096, 65536) 0.4436 /
    # 0.3977; fp32 (1048, 32000) 0.1092 / 0.1031) ("host overhead; the softmax backward with
    # the row width a constant"). Softmax rows of 4096-8192 take it too, at 16 warps: (16384,
    # 4096) 0.0906 / 0.0918 (rows in registers) / 0.0903; (13107, 5120) 0.0905 / 0.0920 /
    # 0.1072; (8192, 8192) 0.0908 / 0.0920 / 0.0910; at 4, 8 or 32 warps, or 8 elements per
    # thread, it lost or tied at 4096 ("softmax's backward at 4096 columns").
    row_bwd: bool = True
    row_bwd_min_cols: int = 4096
    row_bwd_min_cols_log: int = 16385
    row_bwd_max_cols: int = 32768
    row_bwd_warps: tuple[tuple[int, int], ...] = ((32768, 16),)
    row_bwd_elems_per_thread: tuple[tuple[int, int], ...] = ((4, 16), (8, 16), (16, 8), (32, 8))
    row_bwd_chunk: int | None = None  # a fixed BLOCK_N instead of the rule above
    # fp32 softmax rows of row_bwd_min_cols to row_bwd_max_cols_fp32 take it too, warps by
    # row_bwd_warps_fp32 (wider, 32). ms, this / the old path / torch.compile: (16384, 4096)
    # 0.1817 at 16 warps / 0.1846 / 0.1819; (8192, 8192) 0.1817 at 32 warps / 0.1849 / 0.1840;
    # at (4096, 16384) the old path stayed ahead ("the wide LayerNorm forward's registers and
    # re-reads (dropped); fp32 rows at 4096 columns").
    row_bwd_max_cols_fp32: int = 8192
    row_bwd_warps_fp32: tuple[tuple[int, int], ...] = ((16384, 16),)

    # Rows that do not start on 16 bytes or whose width is not a whole number of 16-byte vectors
    # take the aligned walk (aligned.py) where every tensor's rows start at the same offset
    # within 16 bytes; ms, bf16 unless said, ours before / the aligned neighbour width: softmax
    # (1335, 50257) forward 0.1857 against (1334, 50304) 0.0940 (eager 0.1329), backward 0.2868
    # / 0.1322. The forward takes rows wider than max_fused_cols only: narrower odd rows in
    # registers were already ahead of torch.compile ((16372, 4099) forward 0.1188 ms against
    # 0.2514). Launch configs: ms, this path / the old ones / the best of eager and
    # torch.compile: (1335, 50257) forward 0.0932 / 0.1842 / 0.1319, backward 0.1284 / 0.2883 /
    # 0.2093; (2097, 32001) 0.0773 / 0.1519 / 0.1586 and 0.1300 / 0.1388 / 0.1942; (16372,
    # 4099) backward 0.1109 / 0.2592 / 0.1907; fp32 (667, 50257) 0.0915 / 0.1184 / 0.1326 and
    # 0.1478 / 0.3251 / 0.2233 ("rows off 16 bytes: the aligned walk for softmax"). The
    # forward: (warps, elements per thread) by element size; the backward: warps by the row's
    # bytes (aligned_warps_bwd, wider rows 32) and elements per thread by warps; aligned_chunk:
    # a fixed BLOCK_N for both instead.
    aligned: bool = True
    aligned_min_cols_fwd: int = 16385
    aligned_min_cols_bwd: int = 4096
    aligned_fwd: tuple[tuple[int, tuple[int, int]], ...] = ((2, (8, 32)), (4, (32, 16)))
    aligned_warps_bwd: tuple[tuple[int, int], ...] = ((16384, 8), (49152, 16))
    aligned_elems_per_thread_bwd: tuple[tuple[int, int], ...] = ((8, 16), (16, 8), (32, 8))
    aligned_chunk: int | None = None

    sms: int | None = None  # streaming multiprocessors to size grids for; None: the device's


SOFTMAX = SoftmaxConfig()  # the default, tuned on an H200


def _row_config(layout: RowLayout, config: SoftmaxConfig, backward: bool, sms: int) -> RowConfig:
    return row_config(
        layout,
        sms=sms,
        max_fused=config.max_fused_cols,
        loop_block=config.loop_block_n,
        tile_elems=config.tile_elems,
        adjacent_rows=config.adjacent_rows,
        elems_per_thread=config.elems_per_thread,
        loop_elems_per_thread=(
            config.loop_elems_per_thread_bwd if backward else config.loop_elems_per_thread_fwd
        ),
        max_warps=config.max_warps,
        loop_programs_per_sm=(
            config.loop_programs_per_sm_bwd if backward else config.loop_programs_per_sm_fwd
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
    if not config.aligned or any(t.element_size() != size or t.data_ptr() % 16 for t in tensors):
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
    if backward:
        block_n, warps = row_program_config(
            n_cols, element_size, config.aligned_warps_bwd, config.aligned_elems_per_thread_bwd
        )
    else:
        warps, per_thread = lookup(config.aligned_fwd, element_size, lookup(config.aligned_fwd, 4))
        block_n = min(32 * warps * per_thread, next_power_of_2(n_cols))
    if config.aligned_chunk is not None:
        block_n = min(config.aligned_chunk, next_power_of_2(n_cols))
    return block_n, warps


def forward_launch(
    layout: RowLayout, x: torch.Tensor, y: torch.Tensor, log: bool, config: SoftmaxConfig, sms: int
) -> Launch:
    """The forward's launch over ``layout`` for input x and output y (their strides and base
    pointers' alignment; the launch takes (x, y))."""
    (sxo, sxn, sxi), (syo, syn, syi) = layout.strides
    if layout.n_cols >= config.aligned_min_cols_fwd:
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
        "PREFETCH": config.loop_prefetch_fwd,
        "CHUNK_MAX": config.loop_chunk_max,
        **evict_kwargs(config.loop_evict_fwd),
        **_tile_meta(cfg, layout),
    }
    return Launch(softmax_fwd_looped_kernel, (cfg.programs,), ints, meta)


def row_bwd_config(n_cols: int, element_size: int, config: SoftmaxConfig) -> tuple[int, int]:
    """(BLOCK_N, warps) of softmax_bwd_row_kernel."""
    table = config.row_bwd_warps_fp32 if element_size == 4 else config.row_bwd_warps
    block_n, warps = row_program_config(
        n_cols, element_size, table, config.row_bwd_elems_per_thread
    )
    if config.row_bwd_chunk is not None:
        block_n = min(config.row_bwd_chunk, next_power_of_2(n_cols))
    return block_n, warps


def takes_row_backward(
    layout: RowLayout, element_size: int, log: bool, config: SoftmaxConfig
) -> bool:
    """Whether the backward takes softmax_bwd_row_kernel: contiguous rows of 16-bit (or fp32
    softmax) elements within the widths of ``config.row_bwd_*``."""
    (_, sgn, _), (_, syn, _), (_, sdn, _) = layout.strides
    if not (config.row_bwd and sgn == syn == sdn == 1):
        return False
    if element_size == 4:
        return not log and config.row_bwd_min_cols <= layout.n_cols <= config.row_bwd_max_cols_fp32
    low = config.row_bwd_min_cols_log if log else config.row_bwd_min_cols
    return element_size == 2 and low <= layout.n_cols <= config.row_bwd_max_cols


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
    if layout.n_cols >= config.aligned_min_cols_bwd:
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
        "PREFETCH": config.loop_prefetch_bwd,
        **evict_kwargs(config.loop_evict_bwd),
        **_tile_meta(cfg, layout),
    }
    return Launch(softmax_bwd_looped_kernel, (cfg.programs,), ints, meta)
