"""Launchers of the shared bias + activation tiles (``pointwise``'s kernels): ``bias_act_fwd``
(``act(x + bias)``, relu's bits) and ``bias_act_bwd`` (dx, the bias gradient's row or column
sums, linear's ``dZ = dY * act'(Z)``), each planned once per input signature (views, copies,
tiles, grid, the kernel bound) and registered as ``tritonkit::bias_act`` and
``tritonkit::bias_act_backward``. The elementwise family's Functions, memory's copy and
linear's backward call them through ``call_bias_act`` and ``call_bias_act_backward``.
"""

from __future__ import annotations

import math

import torch

from tritonkit.ops._core.device import sm_count
from tritonkit.ops._core.layout import Rows, as_rows, cdiv, elementwise_output, elementwise_rows
from tritonkit.ops._core.math import ACTIVATIONS
from tritonkit.ops._core.plan import cached
from tritonkit.ops._core.pointwise import (
    bias_act_bwd_kernel,
    bias_act_fwd_kernel,
    colsum_split_kernel,
)
from tritonkit.ops._core.pointwise_config import (
    POINTWISE,
    PointwiseConfig,
    TileConfig,
    needs_int64,
    row_sum_launch,
)
from tritonkit.ops._core.reduce import sum_partials
from tritonkit.ops._core.registry import define_op, eager_direct


def bias_layout(shape: torch.Size, bias: torch.Tensor | None) -> str:
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
    if bias_layout(shape, bias) == "row":
        return bias.numel()
    return shape[-1] if len(shape) else 1


def mask_shape(shape: torch.Size, bias: torch.Tensor | None) -> tuple[int, int]:
    """Shape of relu's bit mask for an input of ``shape`` (uint8, 8 elements a byte)."""
    numel = math.prod(shape)
    n_cols = _logical_cols(shape, bias)
    return (numel // n_cols if n_cols else 0, cdiv(n_cols, 8))


def _signature(t: torch.Tensor | None) -> tuple | None:
    if t is None:
        return None
    return t.shape, t.stride(), t.dtype, t.data_ptr() % 16 == 0


class _FwdPlan:
    """bias_act_fwd's decisions for one input signature: copies, the output, the launch."""

    __slots__ = ("copy_b", "copy_x", "like", "mask_shape", "run")


def bias_act_fwd(
    x: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str,
    save_mask: bool = False,
    config: PointwiseConfig = POINTWISE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``act(x + bias)`` with bias absent, shaped like x, or a suffix of x's shape.

    Returns ``(y, mask)``; with ``save_mask`` (relu only) ``mask`` holds one bit per element
    of ``x + bias > 0`` in logical row-major order, rows of ``_logical_cols``; else it is empty.
    """
    key = (_signature(x), _signature(bias), activation, save_mask, config)
    plan = cached(
        "bias_act.forward", key, lambda: _fwd_plan(x, bias, activation, save_mask, config)
    )
    if plan.copy_x:
        x = x.contiguous()
    if plan.copy_b:
        bias = bias.contiguous()
    if plan.like:
        y = torch.empty_like(x)
    else:
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    mask = torch.empty(plan.mask_shape, dtype=torch.uint8, device=x.device)
    if plan.run is not None:
        plan.run(x, bias if bias is not None else x, y, mask)
    return y, mask


def _fwd_plan(x, bias, activation, save_mask, config) -> _FwdPlan:
    plan = _FwdPlan()
    layout = bias_layout(x.shape, bias)
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
        plan.like = False
    else:
        in_rows, (yr,) = elementwise_rows(operands)
        xr = in_rows[0]
        br = in_rows[1] if bias is not None else None
        y = yr.tensor
        plan.like = y.stride() == x.stride()  # empty_like(x) then has these strides
    # A copy made here (no row view) is made again on every call; the views are by shape.
    plan.copy_x = xr.tensor.data_ptr() != x.data_ptr() or xr.tensor.stride() != x.stride()
    plan.copy_b = br is not None and (
        br.tensor.data_ptr() != bias.data_ptr() or br.tensor.stride() != bias.stride()
    )
    plan.mask_shape = mask_shape(x.shape, bias) if save_mask else (0,)
    plan.run = None
    if x.numel() == 0:
        return plan
    mask = torch.empty(plan.mask_shape, dtype=torch.uint8, device=x.device)
    cfg = TileConfig.for_rows(
        xr.n_rows, xr.n_cols, x.element_size(), config, config.vectors(activation)
    )
    plan.run = bias_act_fwd_kernel.bind(
        cfg.grid(xr.n_rows, xr.n_cols),
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
        PHI16=config.phi16(activation, y),
        INT64=needs_int64(config, xr, yr) or (br is not None and needs_int64(config, br)),
        BLOCK_M=cfg.BLOCK_M,
        BLOCK_N=cfg.BLOCK_N,
        num_warps=cfg.num_warps,
    )
    return plan


class _BwdPlan:
    """bias_act_bwd's decisions for one input signature (see ``bias_act_bwd``)."""

    __slots__ = ("copies", "dbias", "dx", "mode", "partial", "reads", "run", "sums")


def bias_act_bwd(
    grad: torch.Tensor,
    x: torch.Tensor | None,
    bias: torch.Tensor | None,
    mask: torch.Tensor | None,
    activation: str,
    need_dx: bool,
    need_dbias: bool,
    bias_added: bool = False,
    config: PointwiseConfig = POINTWISE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of ``act(x + bias)``: (dx, dbias); an output not asked for is an empty tensor.

    ``x`` is the forward input, or None when relu's bit ``mask`` (from bias_act_fwd) stands in
    for it, or when the activation is none. With ``bias_added``, ``x`` is already ``x + bias``
    (linear's saved pre-activation) and a broadcast ``bias`` only shapes its gradient. With a
    bias shaped like x, the two gradients are the same tensor: only dx is returned (dbias
    empty) and the caller uses dx for both.
    """
    key = (
        _signature(grad), _signature(x), _signature(bias), _signature(mask), activation,
        need_dx, need_dbias, bias_added, config,
    )  # fmt: skip
    plan = cached(
        "bias_act.backward",
        key,
        lambda: _bwd_plan(grad, x, bias, mask, activation, need_dx, need_dbias, bias_added, config),
    )
    empty = grad.new_empty(0)
    if plan.mode == "none":
        return empty, empty
    copy_g, copy_x, copy_b = plan.copies
    g = grad.contiguous() if copy_g else grad
    if copy_x:
        x = x.contiguous()
    if copy_b:
        bias = bias.contiguous()
    dx = empty
    if plan.dx == "like":
        dx = torch.empty_like(g)
    elif plan.dx == "contiguous":
        dx = torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)
    dbias = empty
    if plan.dbias:
        dbias = torch.empty(bias.shape, dtype=bias.dtype, device=bias.device)
    if plan.mode == "zero":
        dbias.zero_()  # a sum over no rows
    elif plan.mode == "colsum":
        partial = torch.empty(plan.partial, dtype=torch.float32, device=grad.device)
        plan.run(g, partial)
        sum_partials(partial, dbias, config=plan.sums)
    elif plan.mode == "kernel":
        partial = empty
        if plan.partial is not None:
            partial = torch.empty(plan.partial, dtype=torch.float32, device=grad.device)
        read_x, read_b, read_mask = plan.reads
        stand_in = g  # a pointer for an operand the kernel does not read or write
        plan.run(
            g,
            x if read_x else stand_in,
            bias if read_b else stand_in,
            mask if read_mask else stand_in,
            dx if plan.dx else stand_in,
            partial,
        )
        if plan.partial is not None:
            sum_partials(partial, dbias, config=plan.sums)
    return dx, dbias


def _copied(rows: Rows | None, t: torch.Tensor | None) -> bool:
    """Whether a row view of ``t`` had to be a copy (made again on every call)."""
    return rows is not None and (
        rows.tensor.data_ptr() != t.data_ptr() or rows.tensor.stride() != t.stride()
    )


def _bwd_plan(grad, x, bias, mask, activation, need_dx, need_dbias, bias_added, config):
    plan = _BwdPlan()
    plan.run, plan.partial, plan.sums = None, None, None
    layout = bias_layout(grad.shape, bias)
    if bias_added and layout == "full":
        raise ValueError("bias_act_bwd: bias_added needs a bias broadcast over rows")
    if layout == "full":
        need_dx = need_dx or need_dbias
    row_partials = layout == "row" and need_dbias
    plan.copies, plan.dx, plan.dbias = (False, False, False), None, row_partials
    if not (need_dx or row_partials):
        plan.mode = "none"
        return plan
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
            plan.dx = "contiguous"
            dx = torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)
            (dxr,) = as_rows([dx], n_cols)
    else:
        operands = (
            [grad] + ([x] if needs_x else []) + ([bias] if bias is not None and needs_x else [])
        )
        in_rows, (dxr,) = elementwise_rows(operands)
        gr, xr = in_rows[0], in_rows[1:2]
        br = in_rows[2] if len(in_rows) > 2 else None
        if need_dx:
            like = dxr.tensor.stride() == grad.stride() and not _copied(gr, grad)
            plan.dx = "like" if like else "contiguous"
        else:
            dxr = gr
    xr = xr[0] if xr else None
    plan.copies = (_copied(gr, grad), _copied(xr, x), _copied(br, bias))
    if grad.numel() == 0:
        plan.mode = "zero" if row_partials else "empty"
        return plan
    elem = grad.element_size()
    sms = config.sms or sm_count(grad.device)
    if row_partials and activation == "none" and not need_dx:  # a plain column sum
        plan.mode = "colsum"
        cs = config.column_sums(elem)
        splits = max(1, min(cs.splits, cdiv(gr.n_rows, cs.block_m)))
        rows_per_split = cdiv(cdiv(gr.n_rows, splits), cs.block_m) * cs.block_m
        splits = cdiv(gr.n_rows, rows_per_split)
        plan.partial, plan.sums = (splits, gr.n_cols), cs.final
        partial = torch.empty(plan.partial, dtype=torch.float32, device=grad.device)
        plan.run = colsum_split_kernel.bind(
            (cdiv(gr.n_cols, cs.block_n), splits), gr.tensor, partial, gr.n_rows, gr.n_cols,
            rows_per_split, gr.stride_row, EVICT=cs.evict, INT64=needs_int64(config, gr),
            BLOCK_M=cs.block_m, BLOCK_N=cs.block_n, num_warps=cs.warps,
        )  # fmt: skip
        return plan
    plan.mode = "kernel"
    rs = config.row_sums(elem)
    if row_partials:
        cfg, rows_per_program, groups = row_sum_launch(gr.n_rows, gr.n_cols, elem, rs, sms)
        plan.partial, plan.sums = (groups, gr.n_cols), config.partial_sums
        partial = torch.empty(plan.partial, dtype=torch.float32, device=grad.device)
    else:
        vectors = config.bwd_vectors_for(activation, elem)
        cfg = TileConfig.for_rows(gr.n_rows, gr.n_cols, elem, config, vectors)
        rows_per_program = cfg.BLOCK_M
        groups = cdiv(gr.n_rows, cfg.BLOCK_M)
        partial = grad.new_empty(0)
    if bias_added:
        br = None  # the activation's input is x itself
    plan.reads = (xr is not None, br is not None, from_mask)
    views = [v for v in (gr, xr, br, dxr) if v is not None]
    plan.run = bias_act_bwd_kernel.bind(
        (groups * cdiv(gr.n_cols, cfg.BLOCK_N),),
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
        INT64=needs_int64(config, *views),
        BLOCK_M=cfg.BLOCK_M,
        BLOCK_N=cfg.BLOCK_N,
        STAGES=rs.stages if row_partials else 1,
        num_warps=cfg.num_warps,
    )
    return plan


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
    if bias_layout(x.shape, bias) == "row" or save_mask:
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    else:
        y = elementwise_output([x] if bias is None else [x, bias])
    shape = mask_shape(x.shape, bias) if save_mask else (0,)
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
    layout = bias_layout(grad.shape, bias)
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


# Eager calls on real tensors skip the ops' dispatch (see eager_direct).
call_bias_act = eager_direct(_bias_act_op)
call_bias_act_backward = eager_direct(_bias_act_backward_op)
