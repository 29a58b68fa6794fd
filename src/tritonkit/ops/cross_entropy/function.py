"""cross_entropy: the torch.library ops, the autograd Function and the public function.

In plain eager mode a call launches from its cached plan (plan.py); wherever something must
see the operator as one op (torch.compile, dispatch modes, the profiler, tensor subclasses)
it goes through the torch.library op, whose implementation runs the same plans with the
default config.
"""

from __future__ import annotations

import torch

from tritonkit._autocast import FP32, autocast_dtype, policy
from tritonkit.ops._core.plan import arg_facts, validated
from tritonkit.ops._core.registry import apply, define_op, direct_call_allowed
from tritonkit.ops._core.validate import (
    check_choice,
    check_operand,
    check_same_device,
    check_tensor,
)
from tritonkit.ops.cross_entropy.config import CrossEntropyConfig
from tritonkit.ops.cross_entropy.plan import (
    backward_plan,
    forward_plan,
    grad_like,
    outputs,
    soft_backward_plan,
)

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
    """(loss, per-row statistics, stats) for ``logits`` (N, C) or (N, C, d), any strides, and
    ``target`` class indices (N,) / (N, d) or class probabilities of the logits' shape; the
    loss in plan.loss_dtype (float32 with ``float32_loss``: autocast's result, the logits
    uncast).

    The last two (fp32) are what the backward needs besides the inputs; without ``need_grad``
    the per-row statistics are neither allocated nor written.
    """
    plan = forward_plan(
        logits, target, weight, ignore_index, reduction, label_smoothing, need_grad,
        float32_loss, None,
    )  # fmt: skip
    return plan(logits, target, weight)


@cross_entropy_fwd.register_fake
def _(logits, target, weight, ignore_index, reduction, label_smoothing, need_grad, float32_loss):
    return outputs(logits, target, weight, reduction, need_grad, float32_loss)


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
    """Gradient of the loss w.r.t. ``logits`` (plan.grad_like, the logits' dtype): one read of
    the logits, one write. ``grad_output`` is a scalar, or (N,) / (N, d) for reduction "none";
    ``lse`` and ``stats`` come from ``cross_entropy_fwd``."""
    plan = backward_plan(
        grad_output, logits, target, weight, ignore_index, reduction, label_smoothing, None
    )
    return plan(grad_output, logits, target, weight, lse, stats)


@cross_entropy_bwd.register_fake
def _(grad_output, logits, target, weight, lse, stats, ignore_index, reduction, label_smoothing):
    return grad_like(logits)


@define_op("tritonkit::cross_entropy_soft_backward")
def cross_entropy_soft_bwd(
    grad_output: torch.Tensor,
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    rstats: torch.Tensor,
    reduction: str,
    label_smoothing: float,
    logits_grad: bool,
    target_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of the loss over class probabilities w.r.t. ``logits`` and ``target`` (in
    their dtypes), each where asked for (else an empty tensor): one read of both, one write of
    each gradient. ``rstats`` comes from ``cross_entropy_fwd``."""
    plan = soft_backward_plan(
        grad_output, logits, target, weight, reduction, label_smoothing, logits_grad,
        target_grad, None,
    )  # fmt: skip
    grad, tgrad = plan(grad_output, logits, target, weight, rstats)
    return _or_empty(grad, logits), _or_empty(tgrad, target)


def _or_empty(grad: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    return grad if grad is not None else like.new_empty(0)


@cross_entropy_soft_bwd.register_fake
def _(grad_output, logits, target, weight, rstats, reduction, label_smoothing, logits_grad,
      target_grad):  # fmt: skip
    return (
        grad_like(logits) if logits_grad else logits.new_empty(0),
        grad_like(target) if target_grad else target.new_empty(0),
    )


# ----------------------------------------------------------------------------------------------
# Autograd
# ----------------------------------------------------------------------------------------------


def _forward(logits, target, weight, args, need_grad, f32, config):
    """(plan or None, the forward's outputs): the plan's launches in plain eager mode, else the
    torch.library op (which carries the default config only)."""
    if direct_call_allowed((logits, target, weight)):
        plan = forward_plan(logits, target, weight, *args, need_grad, f32, config)
        return plan, plan(logits, target, weight)
    if config is not None:
        raise NotImplementedError(
            "tritonkit.cross_entropy: a config other than the default runs in plain "
            "eager mode only (the torch.library op carries the default)"
        )
    return None, cross_entropy_fwd.overload(logits, target, weight, *args, need_grad, f32)


class CrossEntropyFunction(torch.autograd.Function):
    """Cross-entropy; the forward keeps the rows' logsumexps for the backward. ``config``: None
    for the default (see ``CrossEntropyConfig``)."""

    @staticmethod
    def forward(
        ctx, logits, target, weight, ignore_index, reduction, label_smoothing, need_grad, f32,
        config,
    ):  # fmt: skip
        args = (ignore_index, reduction, label_smoothing)
        plan, (loss, lse, stats) = _forward(logits, target, weight, args, need_grad, f32, config)
        if need_grad:
            ctx.save_for_backward(logits, target, weight, lse, stats)
        ctx.plan, ctx.args = plan, args
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        logits, target, weight, lse, stats = ctx.saved_tensors
        plan = ctx.plan
        if plan is not None and direct_call_allowed((grad_output,)):
            run = plan.backward_for(grad_output, logits, target, weight)
            grad = run(grad_output, logits, target, weight, lse, stats)
        else:
            grad = cross_entropy_bwd.overload(
                grad_output, logits, target, weight, lse, stats, *ctx.args
            )
        return grad, None, None, None, None, None, None, None, None


def loss_and_grad(
    logits: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    grad_output: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 loss, gradient of ``grad_output * loss`` w.r.t. ``logits``) for 2-D logits and
    class-index targets, without autograd: the kernels and arguments of ``cross_entropy``'s
    forward and backward under autocast, called one after the other. For a caller that wants
    both at once (the chunks of ``linear_cross_entropy``): ``torch.autograd.grad`` through the
    op would hand each chunk's backward to the autograd engine's device thread and wait.
    ``grad_output``: a float32 0-d tensor on the logits' device."""
    args = (ignore_index, reduction, label_smoothing)
    plan, (loss, lse, stats) = _forward(logits, target, None, args, True, True, None)
    if plan is not None:
        run = plan.backward_for(grad_output, logits, target, None)
        return loss, run(grad_output, logits, target, None, lse, stats)
    grad = cross_entropy_bwd.overload(grad_output, logits, target, None, lse, stats, *args)
    return loss, grad


class SoftCrossEntropyFunction(torch.autograd.Function):
    """Cross-entropy over class probabilities; the forward keeps each row's logsumexp and
    target sum for the backward, which differentiates the logits and the target, each where
    it needs a gradient (PyTorch differentiates both). ``config``: None for the default."""

    @staticmethod
    def forward(ctx, logits, target, weight, reduction, label_smoothing, need_grad, f32, config):
        # ignore_index has no role with class probabilities: one constant keeps one plan.
        args = (-100, reduction, label_smoothing)
        plan, (loss, rstats, _) = _forward(logits, target, weight, args, need_grad, f32, config)
        if need_grad:
            ctx.save_for_backward(logits, target, weight, rstats)
        ctx.plan, ctx.args = plan, (reduction, label_smoothing)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        logits, target, weight, rstats = ctx.saved_tensors
        dx, dt = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        plan = ctx.plan
        if plan is not None and direct_call_allowed((grad_output,)):
            run = plan.soft_backward_for(grad_output, logits, target, weight, dx, dt)
            grad, tgrad = run(grad_output, logits, target, weight, rstats)
        else:
            grad, tgrad = cross_entropy_soft_bwd.overload(
                grad_output, logits, target, weight, rstats, *ctx.args, dx, dt
            )
            grad, tgrad = (grad if dx else None), (tgrad if dt else None)
        return grad, tgrad, None, None, None, None, None, None


# ----------------------------------------------------------------------------------------------
# Public function
# ----------------------------------------------------------------------------------------------


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _validate(input, target, weight, ignore_index, reduction, label_smoothing) -> bool:
    """Raise on a bad call; else whether ``target`` holds class probabilities."""
    op = "tritonkit.cross_entropy"
    check_tensor(op, "input", input)
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"{op}: target must be a torch.Tensor, got {type(target).__name__}")
    if input.dim() == 0:
        raise ValueError(
            f"{op}: input must be (C,), (N, C) or (N, C, d1, ...) logits, got a scalar"
        )
    shape = tuple(input.shape)
    n_cols = shape[1] if input.dim() >= 2 else shape[0]
    if n_cols == 0:
        raise ValueError(f"{op}: input must have at least one class, got shape {shape}")
    soft = tuple(target.shape) == shape
    indices = (shape[0], *shape[2:]) if input.dim() >= 2 else ()
    if soft:  # class probabilities, as PyTorch decides: a target of the input's shape
        if not target.is_floating_point():
            raise TypeError(
                f"{op}: target of input's shape {shape} holds class probabilities and must have "
                f"dtype float32, float16 or bfloat16, got {_name(target.dtype)} (class indices "
                f"have shape {indices})"
            )
        check_tensor(op, "target", target)
    elif target.is_floating_point() and tuple(target.shape) == indices:
        raise TypeError(
            f"{op}: target of shape {indices} holds class indices and must have dtype int64, "
            f"got {_name(target.dtype)} (class probabilities have input's shape {shape})"
        )
    elif target.is_floating_point():
        raise ValueError(
            f"{op}: target must be class indices (int64) of shape {indices} or class "
            f"probabilities of input's shape {shape}, got a {_name(target.dtype)} target of "
            f"shape {tuple(target.shape)}"
        )
    else:
        check_tensor(op, "target", target, dtypes=(torch.int64,))
        if tuple(target.shape) != indices:
            raise ValueError(
                f"{op}: target must have shape {indices} for input of shape {shape} (or be "
                f"class probabilities of the input's shape), got {tuple(target.shape)}"
            )
    check_same_device(op, input=input, target=target)
    if weight is not None:
        if soft:  # any float dtype: PyTorch promotes it with the logits' and the target's
            check_tensor(op, "weight", weight)
            check_same_device(op, input=input, weight=weight)
            if tuple(weight.shape) != (n_cols,):
                raise ValueError(
                    f"{op}: weight must have shape (C,) = ({n_cols},), got {tuple(weight.shape)}"
                )
        else:
            check_operand(op, "weight", weight, "input", input, (n_cols,), "(C,)", or_float32=True)
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"{op}: ignore_index must be an int, got {type(ignore_index).__name__}")
    if soft and ignore_index >= 0:
        raise ValueError(
            f"{op}: ignore_index must be negative (unused) with class-probability targets, as "
            f"in PyTorch, got {ignore_index}"
        )
    check_choice(op, "reduction", reduction, REDUCTIONS)
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)):
        raise TypeError(
            f"{op}: label_smoothing must be a float, got {type(label_smoothing).__name__}"
        )
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing}")
    return soft


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
    soft = validated(
        "tritonkit.cross_entropy",
        arg_facts(input, target, weight, ignore_index, reduction, label_smoothing),
        lambda: _validate(input, target, weight, ignore_index, reduction, label_smoothing),
    )
    grad_mode = torch.is_grad_enabled()
    smoothing = float(label_smoothing)
    if soft:
        if grad_mode and weight is not None and weight.requires_grad:
            raise ValueError(
                "tritonkit.cross_entropy: weight must not require grad with class-probability "
                "targets (PyTorch differentiates it there; tritonkit does not): detach it"
            )
        need_grad = grad_mode and (input.requires_grad or target.requires_grad)
        function = SoftCrossEntropyFunction
        args = (weight, reduction, smoothing, need_grad, float32_loss, config)
    else:
        need_grad = grad_mode and input.requires_grad
        function = CrossEntropyFunction
        args = (weight, ignore_index, reduction, smoothing, need_grad, float32_loss, config)
    if input.dim() == 1:
        loss = apply(function, input.unsqueeze(0), target.unsqueeze(0), *args)
        return loss.squeeze(0) if reduction == "none" else loss
    if input.dim() > 3:
        # The positions (d1, ..., dk) flattened into one dim: a view where they are evenly
        # strided (contiguous, channels-last, ...), else flatten's copy.
        logits, target = input.flatten(2), target.flatten(2 if soft else 1)
        loss = apply(function, logits, target, *args)
        return loss.view(input.shape[:1] + input.shape[2:]) if reduction == "none" else loss
    return apply(function, input, target, *args)


@policy(cuda=FP32, cpu=FP32)
def cross_entropy(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """``torch.nn.functional.cross_entropy``, with autograd: class-index or class-probability
    targets, 1-d, 2-d or K-dimensional input.

    The forward reads the logits (and a probability target) once and keeps only per-row
    statistics; the backward reads them once more and writes the gradient in the logits' dtype
    (never an N x C float32 copy). The inputs are never modified.

    Args:
        input: logits of shape (C,), (N, C) or (N, C, d1, ..., dk), float32, float16 or
            bfloat16, on a CUDA device, any strides (positions whose strides do not flatten
            into one are copied first).
        target: either int64 class indices of shape (), (N,) or (N, d1, ..., dk), in ``[0, C)``
            or equal to ``ignore_index``; another value raises, as in PyTorch: IndexError on
            the CPU, a device-side assert on CUDA (the CUDA context is then unusable, as after
            PyTorch's own). Or class probabilities: a float32, float16 or bfloat16 tensor of
            input's shape (any dtype beside the logits'; rows need not sum to 1), which gets a
            gradient where it requires one, as in PyTorch.
        weight: optional class weights of shape (C,), on input's device; with class indices in
            input's dtype or float32, and no gradient flows to it (PyTorch refuses one); with
            class probabilities any float dtype, and it must not require grad.
        ignore_index: targets equal to it contribute no loss and no gradient, and are left out
            of the mean's denominator; with class probabilities it must be negative (unused),
            as PyTorch requires.
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` (a loss per sample and position).
            With class indices the mean divides by the summed weights of non-ignored targets
            (NaN when all are ignored); with class probabilities by N * d1 * ... * dk, whatever
            the weights, as PyTorch's (NaN when that is 0).
        label_smoothing: in [0, 1]; mixes the target with the uniform distribution over the
            C classes: ``(1 - e) * target + e / C`` (the one-hot target for class indices).

    The loss has the logits' dtype with class indices and PyTorch's promotion of the logits',
    target's and weights' dtypes with class probabilities. Under ``torch.autocast`` the loss is
    float32, as ``F.cross_entropy``'s is there (PyTorch casts the logits to float32 first; here
    they are read as they are, the arithmetic being float32 anyway, and their gradient keeps
    their dtype, as it does under autocast).
    """
    return cross_entropy_loss(input, target, weight, ignore_index, reduction, label_smoothing)
