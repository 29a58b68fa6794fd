"""cross_entropy: the torch.library ops, the autograd Function and the public function.

In plain eager mode a call launches from its cached plan (plan.py); wherever something must
see the operator as one op (torch.compile, dispatch modes, the profiler, tensor subclasses)
it goes through the torch.library op, whose implementation runs the same plans with the
default config.
"""

from __future__ import annotations

import torch

from tritonkit._autocast import FP32, autocast_dtype, policy
from tritonkit.ops._core.plan import validated
from tritonkit.ops._core.registry import apply, define_op
from tritonkit.ops._core.rows import arg_facts, launches_directly
from tritonkit.ops._core.validate import (
    check_choice,
    check_operand,
    check_same_device,
    check_tensor,
)
from tritonkit.ops.cross_entropy.config import CrossEntropyConfig
from tritonkit.ops.cross_entropy.plan import backward_plan, forward_plan, outputs

REDUCTIONS = ("mean", "sum", "none")

# ----------------------------------------------------------------------------------------------
# torch.library registration
# ----------------------------------------------------------------------------------------------


@define_op("tritonkit::cross_entropy")
def cross_entropy_fwd(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    need_grad: bool,
    float32_loss: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, logsumexp per row, stats) for ``logits`` (N, C), any strides; the loss in the
    logits' dtype, or float32 with ``float32_loss`` (autocast's result, the logits uncast).

    The last two (fp32, N and 2 elements) are what ``cross_entropy_bwd`` needs besides the
    inputs; without ``need_grad`` the logsumexps are neither allocated nor written.
    """
    plan = forward_plan(
        logits, target, weight, ignore_index, reduction, label_smoothing, need_grad,
        float32_loss, None,
    )  # fmt: skip
    return plan(logits, target, weight)


@cross_entropy_fwd.register_fake
def _(logits, target, weight, ignore_index, reduction, label_smoothing, need_grad, float32_loss):
    return outputs(logits, reduction, need_grad, float32_loss)


@define_op("tritonkit::cross_entropy_backward")
def cross_entropy_bwd(
    grad_output: torch.Tensor,
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    lse: torch.Tensor,
    stats: torch.Tensor,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
) -> torch.Tensor:
    """Gradient of the loss w.r.t. ``logits`` (contiguous, the logits' dtype): one read of the
    logits, one write. ``grad_output`` is a scalar, or (N,) for reduction "none"; ``lse`` and
    ``stats`` come from ``cross_entropy_fwd``."""
    plan = backward_plan(
        grad_output, logits, target, weight, ignore_index, reduction, label_smoothing, None
    )
    return plan(grad_output, logits, target, weight, lse, stats)


@cross_entropy_bwd.register_fake
def _(grad_output, logits, target, weight, lse, stats, ignore_index, reduction, label_smoothing):
    return torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)


# ----------------------------------------------------------------------------------------------
# Autograd
# ----------------------------------------------------------------------------------------------


class CrossEntropyFunction(torch.autograd.Function):
    """Cross-entropy; the forward keeps the rows' logsumexps for the backward. ``config``: None
    for the default (see ``CrossEntropyConfig``)."""

    @staticmethod
    def forward(
        ctx, logits, target, weight, ignore_index, reduction, label_smoothing, need_grad, f32,
        config,
    ):  # fmt: skip
        args = (ignore_index, reduction, label_smoothing)
        if launches_directly((logits, target, weight)):
            plan = forward_plan(logits, target, weight, *args, need_grad, f32, config)
            loss, lse, stats = plan(logits, target, weight)
        else:
            if config is not None:
                raise NotImplementedError(
                    "tritonkit.cross_entropy: a config other than the default runs in plain "
                    "eager mode only (the torch.library op carries the default)"
                )
            plan = None
            loss, lse, stats = cross_entropy_fwd.overload(
                logits, target, weight, *args, need_grad, f32
            )
        if need_grad:
            ctx.save_for_backward(logits, target, weight, lse, stats)
        ctx.plan, ctx.args = plan, args
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        logits, target, weight, lse, stats = ctx.saved_tensors
        plan = ctx.plan
        if plan is not None and launches_directly((grad_output,)):
            run = plan.backward_for(grad_output, logits, target, weight)
            grad = run(grad_output, logits, target, weight, lse, stats)
        else:
            grad = cross_entropy_bwd.overload(
                grad_output, logits, target, weight, lse, stats, *ctx.args
            )
        return grad, None, None, None, None, None, None, None, None


# ----------------------------------------------------------------------------------------------
# Public function
# ----------------------------------------------------------------------------------------------


def _validate(input, target, weight, ignore_index, reduction, label_smoothing) -> None:
    op = "tritonkit.cross_entropy"
    check_tensor(op, "input", input)
    check_tensor(op, "target", target, dtypes=(torch.int64,))
    check_same_device(op, input=input, target=target)
    if input.dim() not in (1, 2):
        raise ValueError(
            f"{op}: input must be (N, C) logits or (C,), got shape {tuple(input.shape)} "
            "(spatial dims are not supported)"
        )
    expected = tuple(input.shape[:1]) if input.dim() == 2 else ()
    if tuple(target.shape) != expected:
        raise ValueError(
            f"{op}: target must have shape {expected} for input of shape {tuple(input.shape)}, "
            f"got {tuple(target.shape)}"
        )
    n_cols = input.shape[-1]
    if n_cols == 0:
        raise ValueError(
            f"{op}: input must have at least one class, got shape {tuple(input.shape)}"
        )
    if weight is not None:
        check_operand(op, "weight", weight, "input", input, (n_cols,), "(C,)", or_float32=True)
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"{op}: ignore_index must be an int, got {type(ignore_index).__name__}")
    check_choice(op, "reduction", reduction, REDUCTIONS)
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)):
        raise TypeError(
            f"{op}: label_smoothing must be a float, got {type(label_smoothing).__name__}"
        )
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing}")


def cross_entropy_loss(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    config: CrossEntropyConfig | None = None,
) -> torch.Tensor:
    """``cross_entropy``, validated, with autograd: what the public function runs, with
    ``config`` (None: the default; another runs in plain eager mode only)."""
    float32_loss = autocast_dtype("cross_entropy", input) == torch.float32
    validated(
        "tritonkit.cross_entropy",
        arg_facts(input, target, weight, ignore_index, reduction, label_smoothing),
        lambda: _validate(input, target, weight, ignore_index, reduction, label_smoothing) or True,
    )
    need_grad = input.requires_grad and torch.is_grad_enabled()
    args = (weight, ignore_index, reduction, float(label_smoothing), need_grad, float32_loss)
    if input.dim() == 1:
        loss = apply(CrossEntropyFunction, input.unsqueeze(0), target.unsqueeze(0), *args, config)
        return loss.squeeze(0) if reduction == "none" else loss
    return apply(CrossEntropyFunction, input, target, *args, config)


@policy(cuda=FP32, cpu=FP32)
def cross_entropy(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """``torch.nn.functional.cross_entropy`` for class-index targets, with autograd.

    The forward reads the logits once and keeps only the rows' logsumexps; the backward reads
    them once more and writes the gradient in the logits' dtype (never an N x C float32 copy).
    The logits are never modified.

    Args:
        input: logits of shape (N, C) or (C,), float32, float16 or bfloat16, on a CUDA device,
            any strides.
        target: int64 class indices of shape (N,) (or () for 1-d input), in ``[0, C)`` or equal
            to ``ignore_index``; another value raises, as in PyTorch: IndexError on the CPU,
            a device-side assert on CUDA (the CUDA context is then unusable, as after
            PyTorch's own).
        weight: optional class weights of shape (C,), on input's device, in input's dtype or
            float32; no gradient flows to it (it is not differentiable in PyTorch either).
        ignore_index: targets equal to it contribute no loss and no gradient, and are left out
            of the mean's denominator.
        reduction: ``"mean"`` (divided by the summed weights of non-ignored targets; NaN when
            all are ignored), ``"sum"`` or ``"none"``.
        label_smoothing: in [0, 1]; mixes the one-hot target with the uniform distribution.

    Under ``torch.autocast`` the loss is float32, as ``F.cross_entropy``'s is there (PyTorch
    casts the logits to float32 first; here they are read as they are, the arithmetic being
    float32 anyway, and their gradient keeps their dtype, as it does under autocast).
    """
    return cross_entropy_loss(input, target, weight, ignore_index, reduction, label_smoothing)
