"""The bias + activation tiles shared by three families: ``act(x + bias)`` and its backward,
where the bias is absent (relu, gelu, silu; memory's copy), one row broadcast over every row of
``x`` (bias_act, add with a broadcast operand) or a second operand shaped like ``x`` (add),
and the backward pass of linear's epilogue (``dZ = dY * act'(Z)`` and the bias gradient in one
read). Registered as ``tritonkit::bias_act`` and ``tritonkit::bias_act_backward``; the
families' autograd Functions call them through ``call_bias_act`` and ``call_bias_act_backward``.

ReLU keeps, for its backward pass, one bit per element (was the input positive?) instead of a
copy of the input or output: 16x less activation memory in bf16, and a backward pass that reads
2.125 bytes per element instead of 4.

Every kernel works on "rows": a tensor seen as ``n_rows x n_cols`` with unit column stride and
a row stride, so contiguous tensors, permuted-dense tensors and row-sliced views such as
``proj.chunk(2, dim=-1)`` are read in place without a copy (see ``layout.elementwise_rows``).
Arithmetic is fp32 whatever the storage dtype; each output is rounded once. A launcher's
decisions (views, copies, tiles, grid) are cached per input signature (``PlanCache``).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from tritonkit.ops._core.device import sm_count
from tritonkit.ops._core.launch import PlanCache, kernel
from tritonkit.ops._core.layout import Rows, as_rows, cdiv, elementwise_output, elementwise_rows
from tritonkit.ops._core.math import ACT_NONE, ACT_RELU, ACTIVATIONS, act, act_grad
from tritonkit.ops._core.pointwise_config import (
    POINTWISE,
    PointwiseConfig,
    TileConfig,
    needs_int64,
    row_sum_launch,
)
from tritonkit.ops._core.reduce import sum_partials
from tritonkit.ops._core.registry import define_op, eager_direct


@triton.jit
def tile_ids(pid, n_cols, BLOCK_N: tl.constexpr, INT64: tl.constexpr):
    """(row block, column block) of program ``pid``; tiles in row-major order."""
    num_pid_n = tl.cdiv(n_cols, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    if INT64:  # offsets past 2**31 elements: 64-bit index arithmetic, only when needed
        pid_m = pid_m.to(tl.int64)
        pid_n = pid_n.to(tl.int64)
    return pid_m, pid_n


@triton.jit
def tile(n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INT64: tl.constexpr):
    """This program's tile: its column block, row and column indices, and the bounds mask."""
    pid_m, pid_n = tile_ids(tl.program_id(0), n_cols, BLOCK_N, INT64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    return pid_n, rows, cols, mask


@kernel
def bias_act_fwd_kernel(
    x_ptr,  # input rows, unit column stride
    b_ptr,  # bias: one row broadcast over all rows, or rows shaped like x; unused without bias
    y_ptr,  # output rows
    mask_ptr,  # uint8 [n_rows, ceil(n_cols / 8)]: relu's bits (x + b > 0), when STORE_MASK
    n_rows,  # rows of x
    n_cols,  # elements per row
    stride_xm,  # elements between rows of x
    stride_bm,  # elements between rows of the bias (when it is not a single broadcast row)
    stride_ym,  # elements between rows of y
    stride_mm,  # bytes between rows of the mask
    ACT: tl.constexpr,  # activation code
    HAS_BIAS: tl.constexpr,
    BIAS_IS_ROW: tl.constexpr,  # load the bias tile once and reuse it for every row of the tile
    STORE_MASK: tl.constexpr,
    PHI16: tl.constexpr,  # GELU: y has 16 bits, Phi from gelu_q16
    INT64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_n, rows, cols, mask = tile(n_rows, n_cols, BLOCK_M, BLOCK_N, INT64)
    # No eviction hints: evict_first cost 2-3% of bandwidth on an H200 (docs/performance.md,
    # "why 2% short of eager").
    z = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask).to(tl.float32)
    if HAS_BIAS:
        if BIAS_IS_ROW:
            b = tl.load(b_ptr + cols, mask=cols < n_cols)
            z += b.to(tl.float32)[None, :]
        else:
            b = tl.load(b_ptr + rows[:, None] * stride_bm + cols[None, :], mask=mask)
            z += b.to(tl.float32)
    y = act(z, ACT, PHI16)
    tl.store(
        y_ptr + rows[:, None] * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask
    )
    if STORE_MASK:
        # Eight elements to a byte, element 8k + j in bit j of byte k of its row.
        bits = tl.where(mask & (z > 0.0), 1, 0)
        bits = tl.reshape(bits, [BLOCK_M, BLOCK_N // 8, 8])
        packed = tl.sum(bits << tl.arange(0, 8)[None, None, :], axis=2)
        byte_cols = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
        byte_mask = (rows < n_rows)[:, None] & (byte_cols < tl.cdiv(n_cols, 8))[None, :]
        tl.store(
            mask_ptr + rows[:, None] * stride_mm + byte_cols[None, :],
            packed.to(tl.uint8),
            mask=byte_mask,
        )


@kernel
def bias_act_bwd_kernel(
    dy_ptr,  # upstream gradient rows
    x_ptr,  # forward input rows (unused when ACT is none or FROM_MASK)
    b_ptr,  # forward bias, as in the forward kernel
    mask_ptr,  # relu's bits from the forward kernel, when FROM_MASK
    dx_ptr,  # gradient of x (written when STORE_DX)
    dbias_partial_ptr,  # fp32 [row_groups, n_cols]: per-row-group column sums of dz
    n_rows,
    n_cols,
    rows_per_program,  # rows each program walks (a multiple of BLOCK_M)
    stride_dym,
    stride_xm,
    stride_bm,
    stride_mm,
    stride_dxm,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BIAS_IS_ROW: tl.constexpr,
    FROM_MASK: tl.constexpr,  # relu: the gradient passes where the forward stored a 1 bit
    STORE_DX: tl.constexpr,
    BIAS_PARTIALS: tl.constexpr,  # accumulate column sums of dz (the broadcast bias's gradient)
    INT64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    STAGES: tl.constexpr,  # > 1: the loop's loads pipelined through shared memory (cp.async)
):
    # Program (row group, column block) walks rows_per_program rows of its columns; the bias
    # gradient's column sums stay in registers and one partial row per group reaches memory.
    pid_g, pid_n = tile_ids(tl.program_id(0), n_cols, BLOCK_N, INT64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    if HAS_BIAS and BIAS_IS_ROW and ACT != ACT_NONE and not FROM_MASK:
        b_row = tl.load(b_ptr + cols, mask=col_mask).to(tl.float32)
    # One partial sum per column: the tile's rows sit in the same thread (TileConfig.
    # for_row_sums), so each iteration's sum over them is register adds, and BLOCK_M can grow
    # (more 16-byte loads in flight per thread) without a register per row and column.
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    row_start = pid_g * rows_per_program
    for r in tl.range(0, rows_per_program, BLOCK_M, num_stages=STAGES):
        rows = row_start + r + tl.arange(0, BLOCK_M)
        mask = (rows < n_rows)[:, None] & col_mask[None, :]
        dy = tl.load(dy_ptr + rows[:, None] * stride_dym + cols[None, :], mask=mask, other=0.0)
        dy = dy.to(tl.float32)
        if FROM_MASK:
            # One byte per 8 elements, loaded as its own tile and unpacked in registers (a byte
            # load per element made the LSU, not DRAM, the limit).
            byte_cols = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
            byte_mask = (rows < n_rows)[:, None] & (byte_cols < tl.cdiv(n_cols, 8))[None, :]
            packed = tl.load(
                mask_ptr + rows[:, None] * stride_mm + byte_cols[None, :], mask=byte_mask, other=0
            ).to(tl.int32)
            bits = (packed[:, :, None] >> tl.arange(0, 8)[None, None, :]) & 1
            on = tl.reshape(bits, [BLOCK_M, BLOCK_N]) != 0
            dz = tl.where(on, dy, 0.0)
        elif ACT != ACT_NONE:
            z = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0)
            z = z.to(tl.float32)
            if HAS_BIAS:
                if BIAS_IS_ROW:
                    z += b_row[None, :]
                else:
                    b = tl.load(
                        b_ptr + rows[:, None] * stride_bm + cols[None, :], mask=mask, other=0.0
                    )
                    z += b.to(tl.float32)
            if ACT == ACT_RELU:
                dz = tl.where(z > 0.0, dy, 0.0)  # as threshold_backward: NaN upstream stays out
            else:
                dz = dy * act_grad(z, ACT)
        else:
            dz = dy
        if STORE_DX:
            tl.store(
                dx_ptr + rows[:, None] * stride_dxm + cols[None, :],
                dz.to(dx_ptr.dtype.element_ty),
                mask=mask,
            )
        if BIAS_PARTIALS:
            acc += tl.sum(tl.where(mask, dz, 0.0), axis=0)
    if BIAS_PARTIALS:
        tl.store(dbias_partial_ptr + pid_g * n_cols + cols, acc, mask=col_mask)


@kernel
def colsum_split_kernel(
    x_ptr,  # rows to sum, unit column stride
    partial_ptr,  # fp32 [splits, n_cols]: one partial row per row split
    n_rows,
    n_cols,
    rows_per_split,  # a multiple of BLOCK_M
    stride_xm,
    EVICT: tl.constexpr,  # L2 policy of the loads ("" or "evict_first": read once)
    INT64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # First pass of a plain column sum: program (column block, row split) keeps a tile of
    # per-lane sums and reduces it across its rows once, after the loop (small tiles, many
    # programs in flight: the split reduction torch.compile generates for this sum).
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    if INT64:
        pid_n = pid_n.to(tl.int64)
        pid_s = pid_s.to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    row_start = pid_s * rows_per_split
    for r in range(0, rows_per_split, BLOCK_M):
        rows = row_start + r + tl.arange(0, BLOCK_M)
        mask = (rows < n_rows)[:, None] & col_mask[None, :]
        ptrs = x_ptr + rows[:, None] * stride_xm + cols[None, :]
        acc += tl.load(ptrs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    tl.store(partial_ptr + pid_s * n_cols + cols, tl.sum(acc, axis=0), mask=col_mask)


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------


def column_sum(rows: Rows, out: torch.Tensor, config: PointwiseConfig = POINTWISE) -> None:
    """out[j] = sum over the rows of ``rows`` of column j, in fp32, rounded once to out's dtype.

    Deterministic: each split's partial row is summed in a fixed order, then the splits."""
    cs = config.column_sums(rows.tensor.element_size())
    splits = max(1, min(cs.splits, cdiv(rows.n_rows, cs.block_m)))
    rows_per_split = cdiv(cdiv(rows.n_rows, splits), cs.block_m) * cs.block_m
    splits = cdiv(rows.n_rows, rows_per_split)
    partial = torch.empty((splits, rows.n_cols), dtype=torch.float32, device=out.device)
    colsum_split_kernel[(cdiv(rows.n_cols, cs.block_n), splits)](
        rows.tensor,
        partial,
        rows.n_rows,
        rows.n_cols,
        rows_per_split,
        rows.stride_row,
        EVICT=cs.evict,
        INT64=needs_int64(config, rows),
        BLOCK_M=cs.block_m,
        BLOCK_N=cs.block_n,
        num_warps=cs.warps,
    )
    sum_partials(partial, out, config=cs.final)


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


_FWD_PLANS = PlanCache()


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
    plan = _FWD_PLANS.get(key)
    if plan is None:
        plan = _FWD_PLANS[key] = _fwd_plan(x, bias, activation, save_mask, config)
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


_BWD_PLANS = PlanCache()


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
    plan = _BWD_PLANS.get(key)
    if plan is None:
        plan = _BWD_PLANS[key] = _bwd_plan(
            grad, x, bias, mask, activation, need_dx, need_dbias, bias_added, config
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
