"""Cross-entropy plans: the launches of one call (config.py's choice), fixed once per logits
layout and options and kept; a call then allocates and launches. The forward's plan keeps its
backward's plans by grad_output's layout, for the autograd engine's device thread."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tritonkit.ops._core.plan import cached
from tritonkit.ops._core.rows import Launch
from tritonkit.ops.cross_entropy.config import (
    CROSS_ENTROPY,
    CrossEntropyConfig,
    ForwardLaunches,
    backward_launch,
    forward_launches,
)


def check_targets(target: torch.Tensor, n_cols: int, ignore_index: int) -> None:
    """Raise IndexError, as PyTorch's CPU cross-entropy does, for a target outside [0, n_cols)
    that is not ignore_index (a host check: the CPU path)."""
    bad = (target != ignore_index) & ((target < 0) | (target >= n_cols))
    if bool(bad.any()):
        value = int(target[bad][0])
        raise IndexError(
            f"tritonkit.cross_entropy: target must be in [0, {n_cols}) (the classes) or equal "
            f"ignore_index ({ignore_index}), got {value}"
        )


def outputs(
    logits: torch.Tensor, reduction: str, need_grad: bool, float32_loss: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss (in the logits' dtype, or float32), per-row logsumexp (empty unless a gradient will
    be needed), fp32 [2] for the mean denominator and the weight sum)."""
    n_rows = logits.shape[0]
    shape = (n_rows,) if reduction == "none" else ()
    dtype = torch.float32 if float32_loss else logits.dtype
    loss = torch.empty(shape, dtype=dtype, device=logits.device)
    f32 = {"dtype": torch.float32, "device": logits.device}
    lse = torch.empty(n_rows if need_grad else 0, **f32)
    stats = torch.empty(2, **f32)
    return loss, lse, stats


@dataclass(frozen=True, eq=False)
class BackwardPlan:
    """The gradient of the logits for one grad_output layout."""

    launch: Launch | None  # None: no rows

    def __call__(self, grad_output, logits, target, weight, lse, stats) -> torch.Tensor:
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        if self.launch is not None:
            w = weight if weight is not None else logits
            self.launch(logits, target, w, stats, lse, grad_output, grad)
        return grad


@dataclass(frozen=True, eq=False)
class ForwardPlan:
    """(loss, logsumexps, stats) of logits of one layout with one set of options."""

    launches: ForwardLaunches | None  # None: no rows
    ignore_index: int
    reduction: str
    label_smoothing: float
    need_grad: bool
    float32_loss: bool
    host_check: bool  # the CPU: targets checked on the host (see CrossEntropyConfig)
    config: CrossEntropyConfig | None

    def __call__(self, logits, target, weight):
        loss, lse, stats = outputs(logits, self.reduction, self.need_grad, self.float32_loss)
        run = self.launches
        if run is None:
            if self.reduction != "none":
                loss.fill_(float("nan") if self.reduction == "mean" else 0.0)
            return loss, lse, stats
        if self.host_check:
            check_targets(target, logits.shape[1], self.ignore_index)
        w = weight if weight is not None else logits
        f32 = {"dtype": torch.float32, "device": logits.device}
        parts = torch.empty(run.parts_shape, **f32)
        rows_out = loss if run.reduce is None else torch.empty(logits.shape[0], **f32)
        if run.prep is not None:
            run.prep(weight, stats)
        run.stats(logits, target, w, parts)
        run.rows(logits, target, w, stats, parts, rows_out, lse if self.need_grad else stats)
        if run.reduce is not None:
            run.reduce(rows_out, target, w, stats, loss)
        return loss, lse, stats

    def backward_for(self, grad_output, logits, target, weight) -> BackwardPlan:
        """The backward's plan for ``grad_output`` (a scalar, or (N,) for reduction "none")."""
        return backward_plan(
            grad_output, logits, target, weight, self.ignore_index, self.reduction,
            self.label_smoothing, self.config,
        )  # fmt: skip


def _weight_key(weight: torch.Tensor | None) -> tuple | None:
    return None if weight is None else (weight.stride(), weight.dtype)


def forward_plan(
    logits, target, weight, ignore_index, reduction, label_smoothing, need_grad, float32_loss,
    config,
) -> ForwardPlan:  # fmt: skip
    """The plan of the forward over logits (N, C), any strides; ``config`` None: the default."""
    key = (
        logits.shape, logits.stride(), logits.dtype, logits.device, logits.data_ptr() % 16 == 0,
        target.stride(), _weight_key(weight), ignore_index, reduction, label_smoothing,
        need_grad, float32_loss, config,
    )  # fmt: skip

    def build() -> ForwardPlan:
        cfg = config or CROSS_ENTROPY
        launches = None
        if logits.shape[0] > 0:
            launches = forward_launches(
                logits, target, weight, ignore_index, reduction, label_smoothing, need_grad, cfg
            )
        host_check = cfg.check_targets and logits.device.type != "cuda"
        return ForwardPlan(
            launches, ignore_index, reduction, label_smoothing, need_grad, float32_loss,
            host_check, config,
        )  # fmt: skip

    return cached("cross_entropy.forward", key, build)


def backward_plan(
    grad_output, logits, target, weight, ignore_index, reduction, label_smoothing, config
) -> BackwardPlan:
    """The plan of the backward (the gradient of the logits) from grad_output."""
    key = (
        grad_output.stride(), logits.shape, logits.stride(), logits.dtype, logits.device,
        logits.data_ptr() % 16 == 0, target.stride(), _weight_key(weight), ignore_index,
        reduction, label_smoothing, config,
    )  # fmt: skip
    return cached(
        "cross_entropy.backward",
        key,
        lambda: _backward(
            grad_output, logits, target, weight, ignore_index, reduction, label_smoothing, config
        ),
    )


def _backward(
    grad_output, logits, target, weight, ignore_index, reduction, label_smoothing, config
) -> BackwardPlan:
    if logits.shape[0] == 0:
        return BackwardPlan(None)
    grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)  # as each call's
    launch = backward_launch(
        grad_output, logits, target, weight, grad, ignore_index, reduction, label_smoothing,
        config or CROSS_ENTROPY,
    )  # fmt: skip
    return BackwardPlan(launch)
