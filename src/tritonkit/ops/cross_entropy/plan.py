"""Cross-entropy plans: the launches of one call (config.py's choice), fixed once per layout of
the logits and target and options and kept; a call then allocates and launches. The forward's
plan keeps its backward's plans by grad_output's layout, for the autograd engine's device
thread. Logits are (N, C) or (N, C, d); targets class indices (N,) / (N, d) or class
probabilities of the logits' shape."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tritonkit.ops._core.launch import Launch
from tritonkit.ops._core.plan import cached
from tritonkit.ops.cross_entropy.config import (
    CHECK_TARGETS,
    CROSS_ENTROPY,
    CrossEntropyConfig,
    ForwardLaunches,
    backward_launch,
    dims,
    forward_launches,
    soft_backward_launch,
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


def loss_dtype(
    logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, float32_loss: bool
) -> torch.dtype:
    """The loss's dtype: float32 under autocast (``float32_loss``); for class indices the
    logits'; for class probabilities PyTorch's promotion of logits, target and weights (its
    loss is ``-(log_softmax(x) * target * weight).sum()``)."""
    if float32_loss:
        return torch.float32
    if not target.is_floating_point():
        return logits.dtype
    dtype = torch.promote_types(logits.dtype, target.dtype)
    return dtype if weight is None else torch.promote_types(dtype, weight.dtype)


def outputs(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    reduction: str,
    need_grad: bool,
    float32_loss: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss (``loss_dtype``), per-row statistics for the backward (fp32: the logsumexps; for
    class probabilities [3, rows]: the rows' maxima, logsumexps less them, target sums; empty
    unless a gradient will be needed), fp32 [2] for the mean denominator and the weight sum)."""
    n, _, d = dims(logits)
    shape = (logits.shape[0], *logits.shape[2:]) if reduction == "none" else ()
    dtype = loss_dtype(logits, target, weight, float32_loss)
    loss = torch.empty(shape, dtype=dtype, device=logits.device)
    f32 = {"dtype": torch.float32, "device": logits.device}
    per_row = (3, n * d) if target.is_floating_point() else (n * d,)
    lse = torch.empty(per_row if need_grad else (0,), **f32)
    stats = torch.empty(2, **f32)
    return loss, lse, stats


def grad_like(t: torch.Tensor) -> torch.Tensor:
    """A new gradient for ``t``: contiguous for 2-d logits (unit class stride, whatever
    theirs), else in t's own layout where that is dense (torch.empty_like), so that the
    gradient of channels-last logits is written as they are read and autograd keeps it as is."""
    if t.dim() == 2:
        return torch.empty(t.shape, dtype=t.dtype, device=t.device)
    return torch.empty_like(t)


@dataclass(frozen=True, eq=False)
class BackwardPlan:
    """The gradient of the logits for one grad_output layout (class-index targets)."""

    launch: Launch | None  # None: no rows

    def __call__(self, grad_output, logits, target, weight, lse, stats) -> torch.Tensor:
        grad = grad_like(logits)
        if self.launch is not None:
            w = weight if weight is not None else logits
            self.launch(logits, target, w, stats, lse, grad_output, grad)
        return grad


@dataclass(frozen=True, eq=False)
class SoftBackwardPlan:
    """The gradients of the logits and of the target, each where wanted, for one grad_output
    layout (class-probability targets)."""

    launch: Launch | None  # None: no rows
    logits_grad: bool
    target_grad: bool

    def __call__(self, grad_output, logits, target, weight, rstats):
        grad = grad_like(logits) if self.logits_grad else None
        tgrad = grad_like(target) if self.target_grad else None
        if self.launch is not None:
            w = weight if weight is not None else logits
            # A pointer stands in for a gradient not wanted (the kernel writes none there).
            self.launch(logits, target, w, rstats, grad_output, grad if grad is not None else
                        logits, tgrad if tgrad is not None else target)  # fmt: skip
        return grad, tgrad


@dataclass(frozen=True, eq=False)
class ForwardPlan:
    """(loss, logsumexps, stats) of logits of one layout with one set of options."""

    launches: ForwardLaunches | None  # None: no rows
    ignore_index: int
    reduction: str
    label_smoothing: float
    need_grad: bool
    float32_loss: bool
    host_check: bool  # the CPU, class indices: targets checked on the host (CrossEntropyConfig)
    config: CrossEntropyConfig | None

    def __call__(self, logits, target, weight):
        loss, lse, stats = outputs(
            logits, target, weight, self.reduction, self.need_grad, self.float32_loss
        )
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
        rows_out = loss if run.reduce is None else torch.empty(run.parts_shape[1], **f32)
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

    def soft_backward_for(
        self, grad_output, logits, target, weight, logits_grad, target_grad
    ) -> SoftBackwardPlan:
        """The backward's plan for class probabilities, for the gradients wanted."""
        return soft_backward_plan(
            grad_output, logits, target, weight, self.reduction, self.label_smoothing,
            logits_grad, target_grad, self.config,
        )  # fmt: skip


def _weight_key(weight: torch.Tensor | None) -> tuple | None:
    return None if weight is None else (weight.stride(), weight.dtype)


def forward_plan(
    logits, target, weight, ignore_index, reduction, label_smoothing, need_grad, float32_loss,
    config,
) -> ForwardPlan:  # fmt: skip
    """The plan of the forward over logits (N, C) or (N, C, d), any strides; ``config`` None:
    the default."""
    key = (
        logits.shape, logits.stride(), logits.dtype, logits.device, logits.data_ptr() % 16 == 0,
        target.shape, target.stride(), target.dtype, target.data_ptr() % 16 == 0,
        _weight_key(weight), ignore_index, reduction, label_smoothing, need_grad, float32_loss,
        config,
    )  # fmt: skip

    def build() -> ForwardPlan:
        cfg = config or CROSS_ENTROPY
        launches = None
        if logits.numel() > 0:
            launches = forward_launches(
                logits, target, weight, ignore_index, reduction, label_smoothing, need_grad, cfg
            )
        host_check = (
            CHECK_TARGETS and logits.device.type != "cuda" and not target.is_floating_point()
        )
        return ForwardPlan(
            launches, ignore_index, reduction, label_smoothing, need_grad, float32_loss,
            host_check, config,
        )  # fmt: skip

    return cached("cross_entropy.kernels_forward", key, build)


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
        "cross_entropy.kernels_backward",
        key,
        lambda: _backward(
            grad_output, logits, target, weight, ignore_index, reduction, label_smoothing, config
        ),
    )


def _backward(
    grad_output, logits, target, weight, ignore_index, reduction, label_smoothing, config
) -> BackwardPlan:
    if logits.numel() == 0:
        return BackwardPlan(None)
    grad = grad_like(logits)  # as each call's
    launch = backward_launch(
        grad_output, logits, target, weight, grad, ignore_index, reduction, label_smoothing,
        config or CROSS_ENTROPY,
    )  # fmt: skip
    return BackwardPlan(launch)


def soft_backward_plan(
    grad_output, logits, target, weight, reduction, label_smoothing, logits_grad, target_grad,
    config,
) -> SoftBackwardPlan:  # fmt: skip
    """The plan of the class-probability backward from grad_output: the gradient of the logits
    (``logits_grad``) and of the target (``target_grad``)."""
    key = (
        grad_output.stride(), logits.shape, logits.stride(), logits.dtype, logits.device,
        logits.data_ptr() % 16 == 0, target.stride(), target.dtype,
        target.data_ptr() % 16 == 0, _weight_key(weight), reduction, label_smoothing,
        logits_grad, target_grad, config,
    )  # fmt: skip

    def build() -> SoftBackwardPlan:
        if logits.numel() == 0 or not (logits_grad or target_grad):
            return SoftBackwardPlan(None, logits_grad, target_grad)
        launch = soft_backward_launch(
            grad_output, logits, target, weight,
            grad_like(logits) if logits_grad else None,  # as each call's
            grad_like(target) if target_grad else None, reduction, label_smoothing,
            config or CROSS_ENTROPY,
        )  # fmt: skip
        return SoftBackwardPlan(launch, logits_grad, target_grad)

    return cached("cross_entropy.soft_backward", key, build)
