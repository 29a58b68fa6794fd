"""Softmax plans: everything a call needs that depends only on shapes, dtypes and strides (the
row layout, the launch of config.py's choice), worked out once per key and kept; a call then
allocates its output and launches. The forward's plan also keeps the plans of its backward, by
the upstream gradient's layout, so that the backward (run on the autograd engine's device
thread) does one dict lookup."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tritonkit.ops._core.device import sm_count
from tritonkit.ops._core.plan import cached
from tritonkit.ops._core.rows import Launch, RowPlan, row_plan
from tritonkit.ops.softmax.config import SOFTMAX, SoftmaxConfig, backward_launch, forward_launch


@dataclass(frozen=True, eq=False)
class BackwardPlan:
    """dx of softmax (log_softmax) from (dy, y) of one layout."""

    rows: RowPlan
    launch: Launch | None  # None: empty tensors

    def __call__(self, dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        rows = self.rows
        dx = rows.output(dy)
        if self.launch is not None:
            if rows.copied:
                dy, y = rows.inputs((dy, y))
            self.launch(dy, y, dx)
        return dx


@dataclass(frozen=True, eq=False)
class ForwardPlan:
    """softmax (log_softmax) of inputs of one layout."""

    rows: RowPlan
    launch: Launch | None
    dim: int
    log: bool
    config: SoftmaxConfig | None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = self.rows
        y = rows.output(x)
        if self.launch is not None:
            self.launch(rows.inputs((x,))[0] if rows.copied else x, y)
        return y

    def backward_for(self, dy: torch.Tensor, y: torch.Tensor) -> BackwardPlan:
        """The backward's plan for upstream gradient dy and this plan's output y."""
        return backward_plan(dy, y, self.dim, self.log, self.config)


def _sms(config: SoftmaxConfig, device: torch.device) -> int:
    return config.sms or sm_count(device)


def forward_plan(x: torch.Tensor, dim: int, log: bool, config: SoftmaxConfig | None) -> ForwardPlan:
    """The plan of softmax (``log``: log_softmax) of x along ``dim`` (0 <= dim < x.dim());
    ``config`` None: the default."""
    key = (x.shape, x.stride(), x.dtype, x.device, x.data_ptr() % 16 == 0, dim, log, config)
    return cached("softmax.forward", key, lambda: _forward(x, dim, log, config))


def _forward(x: torch.Tensor, dim: int, log: bool, config: SoftmaxConfig | None) -> ForwardPlan:
    cfg = config or SOFTMAX
    rows = row_plan([x], (dim,), 1)
    launch = None
    if rows.layout is not None:
        xin = x.contiguous() if rows.copied else x
        y = rows.output(x)  # a fresh allocation, as every call's: 16-byte aligned
        launch = forward_launch(rows.layout, xin, y, log, cfg, _sms(cfg, x.device))
    return ForwardPlan(rows, launch, dim, log, config)


def backward_plan(
    dy: torch.Tensor, y: torch.Tensor, dim: int, log: bool, config: SoftmaxConfig | None
) -> BackwardPlan:
    """The backward's plan for upstream gradient dy and forward output y."""
    key = (
        dy.shape, dy.stride(), y.stride(), dy.dtype, y.dtype, dy.device,
        dy.data_ptr() % 16 == 0, y.data_ptr() % 16 == 0, dim, log, config,
    )  # fmt: skip
    return cached("softmax.backward", key, lambda: _backward(dy, y, dim, log, config))


def _backward(
    dy: torch.Tensor, y: torch.Tensor, dim: int, log: bool, config: SoftmaxConfig | None
) -> BackwardPlan:
    cfg = config or SOFTMAX
    rows = row_plan([dy, y], (dim,), 1)
    launch = None
    if rows.layout is not None:
        dyin, yin = (t.contiguous() if c else t for t, c in zip((dy, y), rows.copies))
        dx = rows.output(dy)
        launch = backward_launch(rows.layout, dyin, yin, dx, log, cfg, _sms(cfg, dy.device))
    return BackwardPlan(rows, launch)
