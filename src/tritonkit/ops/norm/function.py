"""LayerNorm and RMSNorm, alone or fused with the residual add: the torch.library ops, the
autograd Functions and the public functions (validated once per argument facts: the plan cache
keeps the verdict; then ``registry.apply`` of the Function).

In plain eager mode a call launches from its cached plan (plan.py), and the forward's plan,
saved on ctx, gives the backward its launches; wherever something must see the operator as one
op (torch.compile, dispatch modes, the profiler, tensor subclasses) it goes through the
torch.library ops, whose implementations run the same plans with the default config.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tritonkit._autocast import FP32, autocast_dtype, cast, policy
from tritonkit.ops._core.plan import arg_facts, validated
from tritonkit.ops._core.registry import apply, define_op, direct_call_allowed
from tritonkit.ops._core.rows import row_tensors
from tritonkit.ops._core.validate import (
    check_operand,
    check_same_dtype,
    check_same_shape,
    check_tensor,
)
from tritonkit.ops.norm.config import NormConfig
from tritonkit.ops.norm.plan import backward_plan, forward_plan, param_dtype, reduced

# ----------------------------------------------------------------------------------------------
# torch.library registration
# ----------------------------------------------------------------------------------------------


def _fwd_outputs(x, residual, n_dims, rms, count):
    inputs = [x] if residual is None else [x, residual]
    n_stats = 1 if rms else 2
    _, outputs, stats, _ = row_tensors(
        inputs, reduced(x.dim(), n_dims), len(inputs), n_row_outputs=n_stats, count=count
    )
    h = outputs[1] if residual is not None else x.new_empty(0)
    mean, rstd = (x.new_empty(0, dtype=torch.float32), stats[0]) if rms else stats
    return outputs[0], h, mean, rstd


@define_op("tritonkit::norm")
def norm_fwd(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    n_dims: int,
    eps: float,
    rms: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, h, mean, rstd) of LayerNorm / RMSNorm over the last ``n_dims`` dims of x (+ residual),
    default config.

    ``h`` is ``x + residual`` (empty without a residual); ``mean`` is empty for RMSNorm. The
    statistics are fp32 of shape x.shape with the normalized dims set to 1.
    """
    plan = forward_plan(x, residual, weight, bias, n_dims, eps, rms, None)
    y, h, mean, rstd = plan(x, residual, weight, bias)
    # Each output of a custom op must be its own tensor, even an empty placeholder.
    h = x.new_empty(0) if h is None else h
    mean = x.new_empty(0, dtype=torch.float32) if mean is None else mean
    return y, h, mean, rstd


@norm_fwd.register_fake
def _(x, residual, weight, bias, n_dims, eps, rms):
    return _fwd_outputs(x, residual, n_dims, rms, count=False)


def _param_grad(xh, n_dims, wanted, dtype):
    if not wanted:
        return xh.new_empty(0)
    return torch.empty(xh.shape[xh.dim() - n_dims :], dtype=dtype, device=xh.device)


@define_op("tritonkit::norm_backward")
def norm_bwd(
    grad: torch.Tensor,
    dres: torch.Tensor | None,
    xh: torch.Tensor,
    weight: torch.Tensor | None,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    n_dims: int,
    rms: bool,
    need_dweight: bool,
    need_dbias: bool,
    param_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight, dbias), default config; dweight and dbias are empty when not asked for,
    else in ``param_dtype`` (the weight's and bias's).

    ``xh`` is the forward input (x, or the stored x + residual); ``dres`` the gradient of the
    stored sum, added to dx; ``mean`` and ``rstd`` are norm_fwd's statistics.
    """
    plan = backward_plan(
        grad, dres, xh, weight, mean, rstd, n_dims, rms, need_dweight, need_dbias, param_dtype,
        None,
    )  # fmt: skip
    dx, dw, db = plan(grad, dres, xh, weight, mean, rstd)
    return dx, grad.new_empty(0) if dw is None else dw, grad.new_empty(0) if db is None else db


@norm_bwd.register_fake
def _(grad, dres, xh, weight, mean, rstd, n_dims, rms, need_dweight, need_dbias, param_dtype):
    inputs = [grad, xh] + ([dres] if dres is not None else [])
    stats = [rstd] if rms else [mean, rstd]
    _, (dx,), _, _ = row_tensors(
        inputs, reduced(xh.dim(), n_dims), 1, row_inputs=stats, count=False
    )
    dw = _param_grad(xh, n_dims, need_dweight and weight is not None, param_dtype)
    db = _param_grad(xh, n_dims, need_dbias, param_dtype)
    return dx, dw, db


# ----------------------------------------------------------------------------------------------
# Autograd
# ----------------------------------------------------------------------------------------------


def _forward(ctx, x, residual, weight, bias, n_dims, eps, rms, config):
    """The forward of both Functions: (y, h, mean, rstd), h and mean possibly None; the plan
    (or None: through the op) and the backward's facts on ctx."""
    if direct_call_allowed((x, residual, weight, bias)):
        plan = forward_plan(x, residual, weight, bias, n_dims, eps, rms, config)
        out = plan(x, residual, weight, bias)
        ctx.plan, ctx.param_dtype = plan, plan.param_dtype
    else:
        if config is not None:
            raise NotImplementedError(
                f"tritonkit.{'rms' if rms else 'layer'}_norm: a config other than the default "
                "runs in plain eager mode only (the torch.library op carries the default)"
            )
        out = norm_fwd.overload(x, residual, weight, bias, n_dims, eps, rms)
        ctx.plan, ctx.param_dtype = None, param_dtype(x, weight, bias)
    ctx.n_dims, ctx.rms, ctx.has_bias = n_dims, rms, bias is not None
    return out


def _backward(ctx, grad, dres, xh, weight, mean, rstd, first_param):
    """(dx, dweight, dbias) of both Functions; ``first_param``: the weight's input index."""
    need = ctx.needs_input_grad
    need_dw = weight is not None and need[first_param]
    need_db = ctx.has_bias and need[first_param + 1]
    if grad is None:  # only the sum was used downstream
        grad = torch.zeros_like(xh)
    plan = ctx.plan
    if plan is not None and direct_call_allowed((grad, dres)):
        run = plan.backward_plan(grad, dres, xh, weight, mean, rstd, need_dw, need_db)
        return run(grad, dres, xh, weight, mean, rstd)
    dx, dw, db = norm_bwd.overload(
        grad, dres, xh, weight, mean, rstd, ctx.n_dims, ctx.rms, need_dw, need_db,
        ctx.param_dtype,
    )  # fmt: skip
    return dx, (dw if need_dw else None), (db if need_db else None)


class NormFunction(torch.autograd.Function):
    """LayerNorm (``rms`` False) or RMSNorm over the last ``n_dims`` dims, affine optional;
    ``config`` None for the default (see ``NormConfig``)."""

    @staticmethod
    def forward(ctx, x, weight, bias, n_dims, eps, rms, config):
        y, _, mean, rstd = _forward(ctx, x, None, weight, bias, n_dims, eps, rms, config)
        ctx.save_for_backward(x, weight, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = _backward(ctx, grad, None, x, weight, mean, rstd, 1)
        return (dx if ctx.needs_input_grad[0] else None), dw, db, None, None, None, None


class AddNormFunction(torch.autograd.Function):
    """``(norm(x + residual), x + residual)``; the backward reads the stored sum only."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, n_dims, eps, rms, config):
        y, h, mean, rstd = _forward(ctx, x, residual, weight, bias, n_dims, eps, rms, config)
        ctx.save_for_backward(h, weight, mean, rstd)
        ctx.set_materialize_grads(False)  # an unused output costs no zero-filled gradient
        return y, h

    @staticmethod
    def backward(ctx, grad, dres):
        h, weight, mean, rstd = ctx.saved_tensors
        if grad is None and dres is None:
            return None, None, None, None, None, None, None, None
        dx, dw, db = _backward(ctx, grad, dres, h, weight, mean, rstd, 2)
        need = ctx.needs_input_grad
        # d(x + residual) is the same tensor for both operands.
        return (dx if need[0] else None), (dx if need[1] else None), dw, db, None, None, None, None


# ----------------------------------------------------------------------------------------------
# The public functions
# ----------------------------------------------------------------------------------------------


def _normalized_shape(op: str, normalized_shape: object) -> tuple[int, ...]:
    if isinstance(normalized_shape, int) and not isinstance(normalized_shape, bool):
        return (normalized_shape,)
    if isinstance(normalized_shape, (tuple, list, torch.Size)) and all(
        isinstance(d, int) and not isinstance(d, bool) for d in normalized_shape
    ):
        if len(normalized_shape) == 0:
            raise ValueError(f"{op}: normalized_shape must have at least one dimension, got ()")
        return tuple(normalized_shape)
    raise TypeError(
        f"{op}: normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}"
    )


def _check_eps(op: str, eps: object) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"{op}: eps must be a float, got {type(eps).__name__}")
    if not eps >= 0.0:
        raise ValueError(f"{op}: eps must be >= 0, got {eps}")
    return float(eps)


def _check_norm_args(
    op: str,
    x: torch.Tensor,
    shape: Sequence[int],
    residual: torch.Tensor | None = None,
    **params: torch.Tensor | None,
) -> None:
    check_tensor(op, "x", x)
    if tuple(x.shape[max(0, x.dim() - len(shape)) :]) != tuple(shape) or x.dim() < len(shape):
        raise ValueError(
            f"{op}: the last dims of x must equal normalized_shape {tuple(shape)}, got x of shape "
            f"{tuple(x.shape)}"
        )
    if residual is not None:
        check_operand(op, "residual", residual, "x", x)
        check_same_shape(op, x=x, residual=residual)
    given = {name: t for name, t in params.items() if t is not None}
    for name, t in given.items():
        check_operand(op, name, t, "x", x, shape, "normalized_shape", or_float32=True)
    if len(given) == 2:  # one dtype for both gradients
        check_same_dtype(op, **given)


def _rms_eps(eps: float | None) -> float:
    # As F.rms_norm: None means the epsilon of the compute type, float32 for every dtype here.
    return torch.finfo(torch.float32).eps if eps is None else eps


def _validate_norm(op, x, normalized_shape, weight, bias, eps, rms) -> tuple[int, float]:
    shape = _normalized_shape(op, normalized_shape)
    _check_norm_args(op, x, shape, weight=weight, bias=bias)
    if rms:
        eps = _rms_eps(None if eps is None else _check_eps(op, eps))
    else:
        eps = _check_eps(op, eps)
    return len(shape), eps


def norm(
    x: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float | None,
    rms: bool,
    config: NormConfig | None = None,
) -> torch.Tensor:
    """layer_norm (``rms`` False) or rms_norm (``bias`` None), validated, with autograd: what
    the public functions run, with ``config`` (None: the default; another runs in plain eager
    mode only)."""
    if not rms:
        x, weight, bias = cast(autocast_dtype("layer_norm", x), x, weight, bias)
    op = "tritonkit.rms_norm" if rms else "tritonkit.layer_norm"
    n_dims, eps = validated(
        op,
        arg_facts(x, normalized_shape, weight, bias, eps, rms),
        lambda: _validate_norm(op, x, normalized_shape, weight, bias, eps, rms),
    )
    return apply(NormFunction, x, weight, bias, n_dims, eps, rms, config)


def _validate_add_norm(op, x, residual, weight, bias, eps, rms) -> tuple[int, float]:
    eps = _rms_eps(None if eps is None else _check_eps(op, eps)) if rms else _check_eps(op, eps)
    check_tensor(op, "x", x)
    if x.dim() == 0:
        raise ValueError(f"{op}: x must have at least one dimension, got a 0-d tensor")
    shape = (x.shape[-1],)
    for t in (weight, bias):  # the affine parameters' shape is the normalized shape
        if isinstance(t, torch.Tensor):
            shape = tuple(t.shape)
            break
    _check_norm_args(op, x, shape, residual, weight=weight, bias=bias)
    return len(shape), eps


def add_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float | None,
    rms: bool,
    config: NormConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """add_layer_norm (``rms`` False) or add_rms_norm (``bias`` None), validated, with autograd,
    with ``config`` (as :func:`norm`)."""
    op = "tritonkit.add_rms_norm" if rms else "tritonkit.add_layer_norm"
    n_dims, eps = validated(
        op,
        arg_facts(x, residual, weight, bias, eps, rms),
        lambda: _validate_add_norm(op, x, residual, weight, bias, eps, rms),
    )
    return apply(AddNormFunction, x, residual, weight, bias, n_dims, eps, rms, config)


@policy(cuda=FP32)
def layer_norm(
    x: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """``torch.nn.functional.layer_norm``, with autograd (weight and bias gradients included).

    Saves two fp32 values per row (mean and 1/std) for the backward pass; the weight and bias
    gradients are deterministic.

    Args:
        x: float32, float16 or bfloat16 tensor on a CUDA device, any strides, whose last dims
            equal ``normalized_shape``.
        normalized_shape: the trailing shape to normalize over (an int for one dim).
        weight: optional scale of shape ``normalized_shape``, on x's device, in x's dtype or
            float32 (its gradient in its own dtype).
        bias: optional shift of shape ``normalized_shape``, as weight (one dtype for both).
        eps: added to the variance before the square root.

    Under CUDA ``torch.autocast`` x, weight and bias are first cast to float32 (so is the
    result), as ``F.layer_norm``'s are.
    """
    return norm(x, normalized_shape, weight, bias, eps, False)


def rms_norm(
    x: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None = None,
    eps: float | None = None,
) -> torch.Tensor:
    """``torch.nn.functional.rms_norm``: ``x / sqrt(mean(x^2) + eps) * weight``, with autograd.

    Args:
        x: float32, float16 or bfloat16 tensor on a CUDA device, any strides, whose last dims
            equal ``normalized_shape``.
        normalized_shape: the trailing shape to normalize over (an int for one dim).
        weight: optional scale of shape ``normalized_shape``, on x's device, in x's dtype or
            float32 (its gradient in its own dtype).
        eps: added to the mean square; None means ``torch.finfo(torch.float32).eps``, what
            ``F.rms_norm`` uses for every dtype supported here (it computes in float32).
    """
    return norm(x, normalized_shape, weight, None, eps, True)


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + residual; (rms_norm(h, weight.shape, weight, eps), h)`` in one pass.

    The sum is normalized in fp32, then rounded and stored; the backward reads the stored sum
    (not x or residual) and returns one gradient for both operands.

    Args:
        x: float32, float16 or bfloat16 tensor on a CUDA device, any strides.
        residual: tensor of the same shape, dtype and device.
        weight: scale over the trailing dims (its shape is the normalized shape), in x's dtype
            or float32, or None to normalize over the last dim without a scale.
        eps: as in :func:`rms_norm`; None means ``torch.finfo(torch.float32).eps``.

    Returns:
        ``(normalized, x + residual)``.
    """
    return add_norm(x, residual, weight, None, eps, True)


def add_layer_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float = 1e-5,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + residual; (layer_norm(h, weight.shape, weight, bias, eps), h)`` in one pass.

    Args:
        x: float32, float16 or bfloat16 tensor on a CUDA device, any strides.
        residual: tensor of the same shape, dtype and device.
        weight: scale over the trailing dims (its shape is the normalized shape), in x's dtype
            or float32, or None to normalize over the last dim.
        bias: shift of the same shape and dtype as weight, or None.
        eps: added to the variance before the square root.

    Returns:
        ``(normalized, x + residual)``.
    """
    return add_norm(x, residual, weight, bias, eps, False)
