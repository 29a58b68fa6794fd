"""LayerNorm and RMSNorm, alone or fused with the residual add: the torch.library ops and the
autograd Functions (the public functions, in api.py, apply them).

In plain eager mode a call launches from its cached plan (plan.py), and the forward's plan,
saved on ctx, gives the backward its launches; wherever something must see the operator as one
op (torch.compile, dispatch modes, the profiler, tensor subclasses) it goes through the
torch.library ops, whose implementations run the same plans with the default config.
"""

from __future__ import annotations

import torch

from tritonkit.ops._core.registry import define_op, direct_call_allowed
from tritonkit.ops._core.rows import row_tensors
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
