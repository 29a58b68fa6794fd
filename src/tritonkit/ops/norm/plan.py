"""Norm plans: the choice of the launches (from a layout, ``ops/_core/rows.py``, dtypes and a
``NormConfig``: the kernel, grid, scalar arguments and constexprs of the forward,
``forward_launch``: the row kernel, rows in registers or looped rows; and of the backward,
``backward_launches``: the wide rows' sums, dx with the partial sums, the partial rows' sum), and
everything a call needs that depends only on shapes, dtypes and strides (the row layout, the
weight's view, those launches), worked out once per key and kept; a call then allocates its
outputs and launches. The forward's plan keeps its backward's plans by the upstream gradient's
layout, so that the backward (run on the autograd engine's device thread) does one dict lookup
and no planning."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tritonkit.ops._core.device import shared_memory_per_block, sm_count
from tritonkit.ops._core.launch import Launch
from tritonkit.ops._core.layout import LAYOUT_COPIES, cdiv
from tritonkit.ops._core.plan import cached
from tritonkit.ops._core.reduce import colsum_kernel
from tritonkit.ops._core.rows import (
    RowLayout,
    RowPlan,
    evict_kwargs,
    lookup,
    pow2_floor,
    row_plan,
    row_warps,
)
from tritonkit.ops.norm.config import (
    LOOPED_STATS_LN_RES16,
    MAX_WARPS,
    NORM,
    PIPELINE_ELEMS_PER_THREAD,
    PIPELINE_STAGES,
    REREAD_ELEMS_PER_THREAD,
    WIDE_MID_PROGRAMS_PER_SM,
    WIDE_MID_STAGES,
    WIDE_STAGES_RMS,
    WIDE_SUMS_ELEMS_PER_THREAD_FP32,
    WIDE_SUMS_PROGRAMS_PER_SM,
    NormConfig,
    _fit_chunk,
    _looped_forward_tiles,
    backward_stages,
    backward_tile_elems,
    depth,
    row_forward_config,
    row_forward_store,
    row_forward_thread_elems,
    row_tiles,
    shifts,
    takes_row_forward,
)
from tritonkit.ops.norm.kernels_backward import norm_bwd_kernel
from tritonkit.ops.norm.kernels_backward_wide import norm_bwd_sums_kernel
from tritonkit.ops.norm.kernels_forward_looped import norm_fwd_looped_kernel
from tritonkit.ops.norm.kernels_forward_row import norm_fwd_row_kernel
from tritonkit.ops.norm.kernels_forward_tiles import norm_fwd_tiles_kernel


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


# ---- plans ---------------------------------------------------------------------------------------


def reduced(ndim: int, n_dims: int) -> tuple[int, ...]:
    """The normalized dims: the last ``n_dims`` of ``ndim``."""
    return tuple(range(ndim - n_dims, ndim))


def _vector_mode(t: torch.Tensor | None, n_cols: int) -> tuple[int, int]:
    """How a weight or bias is read as one strided row of n_cols elements: (mode, stride);
    mode 0 as it is (1-d), 1 through view(n_cols), 2 copied contiguous first (no such view)."""
    if t is None:
        return 0, 0
    if t.dim() == 1:
        return 0, t.stride(0)
    try:
        return 1, t.view(n_cols).stride(0)
    except RuntimeError:
        return 2, 1


def _vector(t: torch.Tensor, mode: int, n_cols: int) -> torch.Tensor:
    if mode == 1:
        return t.view(n_cols)
    LAYOUT_COPIES.count += 1
    return t.contiguous().view(n_cols)


def _config_device(config: NormConfig, device: torch.device) -> tuple[int, int]:
    """(SMs, shared memory bytes per program) to plan for: the config's, else the device's."""
    sms = config.sms or sm_count(device)
    smem = shared_memory_per_block(device)
    return sms, smem


@dataclass(frozen=True, eq=False)
class BackwardPlan:
    """(dx, dweight, dbias) of one layout of (dy, x, [dres]); the parameter gradients None
    where not asked for."""

    rows: RowPlan
    run: BackwardLaunches | None  # None: empty tensors
    rms: bool
    w_mode: int
    param_shape: tuple[int, ...]
    param_dtype: torch.dtype
    weight_grad: bool
    bias_grad: bool

    def __call__(self, grad, dres, xh, weight, mean, rstd):
        rows = self.rows
        dx = rows.output(grad)
        dev = grad.device
        dw = db = None
        if self.weight_grad:
            dw = torch.empty(self.param_shape, dtype=self.param_dtype, device=dev)
        if self.bias_grad:
            db = torch.empty(self.param_shape, dtype=self.param_dtype, device=dev)
        run = self.run
        if run is None:
            for t in (dw, db):
                if t is not None:
                    t.zero_()  # a sum over no rows
            return dx, dw, db
        if rows.copied:
            ins = rows.inputs((grad, xh) if dres is None else (grad, xh, dres))
            grad, xh = ins[0], ins[1]
            dres = ins[2] if dres is not None else None
        w = grad
        if weight is not None:
            w = weight if self.w_mode == 0 else _vector(weight, self.w_mode, rows.layout.n_cols)
        stat_mean = rstd if self.rms else mean
        c1 = c2 = rstd  # placeholders when the row sums are taken in registers
        if run.sums is not None:
            c1 = torch.empty_like(rstd)
            c2 = c1 if self.rms else torch.empty_like(rstd)
            run.sums(grad, xh, w, stat_mean, rstd, c1, c2)
        f32 = {"dtype": torch.float32, "device": dev}
        shape = (run.groups, rows.layout.n_cols)
        dw_part = torch.empty(shape, **f32) if dw is not None else grad
        db_part = torch.empty(shape, **f32) if db is not None else grad
        rt = dres if dres is not None else grad
        run.main(grad, xh, rt, w, stat_mean, rstd, c1, c2, dx, dw_part, db_part)
        if run.partials is not None:
            if dw is None:
                run.partials(db_part, db, db_part, db)
            elif db is None:
                run.partials(dw_part, dw, dw_part, dw)
            else:
                run.partials(dw_part, dw, db_part, db)
        return dx, dw, db


@dataclass(frozen=True, eq=False)
class ForwardPlan:
    """(y, h, mean, rstd) of one layout of (x, [residual]); h None without a residual, mean None
    for RMSNorm."""

    rows: RowPlan
    copied: bool  # some input is copied contiguous first (rows.copies)
    launch: Launch | None  # None: empty tensors
    row_kernel: bool  # the launch takes (x, w, b, y, mean, rstd)
    has_residual: bool
    rms: bool
    n_dims: int
    w_mode: int
    b_mode: int
    param_dtype: torch.dtype
    config: NormConfig | None

    def __call__(self, x, residual, weight, bias):
        rows = self.rows
        # Allocated here rather than by RowPlan's methods: the warm path stays in this file.
        if rows.outputs_like:
            y = torch.empty_like(x)
            h = torch.empty_like(x) if self.has_residual else None
        else:
            y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
            h = torch.empty(x.shape, dtype=x.dtype, device=x.device) if self.has_residual else None
        mean = None if self.rms else torch.empty(rows.keep, dtype=torch.float32, device=x.device)
        rstd = torch.empty(rows.keep, dtype=torch.float32, device=x.device)
        launch = self.launch
        if launch is None:
            return y, h, mean, rstd
        if self.copied:
            ins = rows.inputs((x,) if residual is None else (x, residual))
            x = ins[0]
            residual = ins[1] if residual is not None else None
        n_cols = rows.layout.n_cols
        w = x if weight is None else weight
        if weight is not None and self.w_mode:
            w = _vector(weight, self.w_mode, n_cols)
        b = x if bias is None else bias
        if bias is not None and self.b_mode:
            b = _vector(bias, self.b_mode, n_cols)
        stat_mean = rstd if mean is None else mean
        if self.row_kernel:
            launch(x, w, b, y, stat_mean, rstd)
        else:
            r = x if residual is None else residual
            launch(x, r, w, b, y, y if h is None else h, stat_mean, rstd)
        return y, h, mean, rstd

    def backward_plan(self, grad, dres, xh, weight, mean, rstd, need_dw, need_db):
        """The backward's plan for upstream gradients grad (and dres) of this plan's outputs."""
        return backward_plan(
            grad, dres, xh, weight, mean, rstd, self.n_dims, self.rms, need_dw, need_db,
            self.param_dtype, self.config,
        )  # fmt: skip


def _tensor_key(t: torch.Tensor | None) -> tuple | None:
    return None if t is None else (t.shape, t.stride(), t.dtype)


def param_dtype(x, weight, bias) -> torch.dtype:
    """The affine parameters' dtype (x's, or float32 beside 16-bit rows): their gradients'."""
    for t in (weight, bias):
        if t is not None:
            return t.dtype
    return x.dtype


def forward_plan(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    n_dims: int,
    eps: float,
    rms: bool,
    config: NormConfig | None,
) -> ForwardPlan:
    """The plan of LayerNorm (``rms``: RMSNorm) over the last ``n_dims`` dims of x (+ residual);
    ``config`` None: the default."""
    key = (
        x.shape, x.stride(), x.dtype, x.device,
        None if residual is None else residual.stride(),
        _tensor_key(weight), _tensor_key(bias), n_dims, eps, rms, config,
    )  # fmt: skip
    return cached(
        "norm.forward", key, lambda: _forward(x, residual, weight, bias, n_dims, eps, rms, config)
    )


def _forward(x, residual, weight, bias, n_dims, eps, rms, config) -> ForwardPlan:
    cfg = config or NORM
    inputs = [x] if residual is None else [x, residual]
    rows = row_plan(inputs, reduced(x.dim(), n_dims), len(inputs), n_row_outputs=1 if rms else 2)
    w_mode = b_mode = 0
    launch = None
    row_kernel = False
    if rows.layout is not None:
        n_cols = rows.layout.n_cols
        w_mode, stride_w = _vector_mode(weight, n_cols)
        b_mode, stride_b = _vector_mode(bias, n_cols)
        sms, smem = _config_device(cfg, x.device)
        launch = forward_launch(
            rows.layout, x.dtype, residual is not None, weight is not None, bias is not None,
            stride_w, stride_b, eps, rms, cfg, sms, smem,
        )  # fmt: skip
        row_kernel = launch.kernel is norm_fwd_row_kernel
    return ForwardPlan(
        rows, any(rows.copies), launch, row_kernel, residual is not None, rms, n_dims, w_mode,
        b_mode, param_dtype(x, weight, bias), config,
    )  # fmt: skip


def backward_plan(
    grad, dres, xh, weight, mean, rstd, n_dims, rms, need_dweight, need_dbias, dtype, config
) -> BackwardPlan:
    """The backward's plan (``xh``: the forward's input, x or the stored x + residual; ``dtype``:
    the parameters' gradients')."""
    key = (
        grad.shape, grad.stride(), grad.dtype, None if dres is None else dres.stride(),
        xh.stride(), xh.dtype, _tensor_key(weight), rstd.stride(), n_dims, rms, need_dweight,
        need_dbias, dtype, config,
    )  # fmt: skip
    return cached(
        "norm.backward",
        key,
        lambda: _backward(
            grad, dres, xh, weight, mean, rstd, n_dims, rms, need_dweight, need_dbias, dtype,
            config,
        ),
    )  # fmt: skip


def _backward(
    grad, dres, xh, weight, mean, rstd, n_dims, rms, need_dweight, need_dbias, dtype, config
) -> BackwardPlan:
    cfg = config or NORM
    inputs: Sequence[torch.Tensor] = [grad, xh] + ([dres] if dres is not None else [])
    stats = [rstd] if rms else [mean, rstd]
    rows = row_plan(inputs, reduced(xh.dim(), n_dims), 1, row_inputs=stats)
    weight_grad = need_dweight and weight is not None
    param_shape = tuple(xh.shape[xh.dim() - n_dims :])
    run = None
    w_mode = 0
    if rows.layout is not None:
        n_cols = rows.layout.n_cols
        w_mode, stride_w = _vector_mode(weight, n_cols)
        sms, smem = _config_device(cfg, grad.device)
        sizes = tuple(t.element_size() for t in inputs)
        run = backward_launches(
            rows.layout, xh.dtype, sizes, weight.element_size() if weight is not None else 0,
            stride_w, rms, weight is not None, dres is not None, weight_grad, need_dbias, cfg,
            sms, smem,
        )  # fmt: skip
    return BackwardPlan(rows, run, rms, w_mode, param_shape, dtype, weight_grad, need_dbias)
