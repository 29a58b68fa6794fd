"""Norm plans: everything a call needs that depends only on shapes, dtypes and strides (the row
layout, the weight's view, the launches of config.py's choice), worked out once per key and
kept; a call then allocates its outputs and launches. The forward's plan keeps its backward's
plans by the upstream gradient's layout, so that the backward (run on the autograd engine's
device thread) does one dict lookup and no planning."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tritonkit.ops._core.device import shared_memory_per_block, sm_count
from tritonkit.ops._core.launch import Launch
from tritonkit.ops._core.layout import LAYOUT_COPIES
from tritonkit.ops._core.plan import cached
from tritonkit.ops._core.rows import RowPlan, row_plan
from tritonkit.ops.norm.config import NORM, NormConfig
from tritonkit.ops.norm.forward_row import norm_fwd_row_kernel
from tritonkit.ops.norm.launches import BackwardLaunches, backward_launches, forward_launch


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
