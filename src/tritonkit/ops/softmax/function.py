"""softmax and log_softmax: the torch.library ops, the autograd Function and the public
functions.

In plain eager mode a call launches from its cached plan (plan.py); wherever something must
see the operator as one op (torch.compile, dispatch modes, the profiler, tensor subclasses)
it goes through the torch.library op, whose implementation runs the same plans with the
default config.
"""

from __future__ import annotations

import torch

from tritonkit._autocast import FP32, autocast_dtype, cast, policy
from tritonkit.ops._core.plan import arg_facts, validated
from tritonkit.ops._core.registry import apply, define_op, direct_call_allowed
from tritonkit.ops._core.rows import row_tensors
from tritonkit.ops._core.validate import FLOAT_DTYPES, check_tensor
from tritonkit.ops.softmax.config import SoftmaxConfig
from tritonkit.ops.softmax.plan import backward_plan, forward_plan

# ----------------------------------------------------------------------------------------------
# torch.library registration
# ----------------------------------------------------------------------------------------------


@define_op("tritonkit::softmax")
def softmax_fwd(x: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    """softmax (``log``: log_softmax) of x along ``dim`` (0 <= dim < x.dim()), default config."""
    return forward_plan(x, dim, log, None)(x)


@softmax_fwd.register_fake
def _(x, dim, log):
    return row_tensors([x], (dim,), 1, count=False)[1][0]


@define_op("tritonkit::softmax_backward")
def softmax_bwd(grad: torch.Tensor, y: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    """Gradient of softmax (log_softmax) along ``dim`` from the upstream gradient and output."""
    return backward_plan(grad, y, dim, log, None)(grad, y)


@softmax_bwd.register_fake
def _(grad, y, dim, log):
    return row_tensors([grad, y], (dim,), 1, count=False)[1][0]


# ----------------------------------------------------------------------------------------------
# Autograd
# ----------------------------------------------------------------------------------------------


def _traced(op: str, config: SoftmaxConfig | None) -> None:
    if config is not None:
        raise NotImplementedError(
            f"{op}: a config other than the default runs in plain eager mode only (the "
            "torch.library op that torch.compile and dispatch modes see carries the default)"
        )


class SoftmaxFunction(torch.autograd.Function):
    """softmax or log_softmax along one dim; the backward needs only the output. ``config``:
    None for the default (see ``SoftmaxConfig``)."""

    @staticmethod
    def forward(ctx, x, dim, log, config):
        if direct_call_allowed((x,)):
            plan = forward_plan(x, dim, log, config)
            y = plan(x)
        else:
            _traced("tritonkit.softmax", config)
            plan = None
            y = softmax_fwd.overload(x, dim, log)
        ctx.plan, ctx.dim, ctx.log = plan, dim, log
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        plan = ctx.plan
        if plan is not None and direct_call_allowed((grad,)):
            return plan.backward_for(grad, y)(grad, y), None, None, None
        return softmax_bwd.overload(grad, y, ctx.dim, ctx.log), None, None, None


# ----------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------


def normalize_dim(op: str, name: str, dim: object, ndim: int) -> int:
    """``dim`` as an index in ``[0, max(ndim, 1))``; a 0-d tensor accepts 0 and -1."""
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{op}: {name} must be an int, got {type(dim).__name__}")
    rank = max(ndim, 1)
    if not -rank <= dim < rank:
        raise ValueError(
            f"{op}: {name} must be in [{-rank}, {rank - 1}] for a {ndim}-d tensor, got {dim}"
        )
    return dim % rank


_DTYPE_NAMES = "float32, float16 or bfloat16"


def _in_dtype(op: str, x: object, dtype: object) -> torch.Tensor:
    """x cast to ``dtype`` as torch.softmax's ``dtype=`` casts it, before the op: autograd's
    cast carries the gradient back to x's dtype. Refused: a dtype the kernels do not compute
    in (float64: they compute in float32), and a complex x (whose cast would drop the
    imaginary part)."""
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"{op}: dtype must be a torch.dtype or None, got {type(dtype).__name__}")
    if dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{op}: dtype must be {_DTYPE_NAMES} or None, got {str(dtype).removeprefix('torch.')}"
            " (the kernels compute in float32: a float64 result would not have float64's "
            "accuracy)"
        )
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: x must be a torch.Tensor, got {type(x).__name__}")
    if x.is_complex():
        raise TypeError(
            f"{op}: x must be real to be cast to dtype, got {str(x.dtype).removeprefix('torch.')}"
        )
    return x.to(dtype)


def softmax_along(
    x: torch.Tensor,
    dim: int,
    log: bool,
    config: SoftmaxConfig | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """softmax (``log``: log_softmax) of x along ``dim``, validated, with autograd: what the
    public functions run, with ``config`` (None: the default; another runs in plain eager
    mode only) and ``dtype`` (None: x's; else x is cast to it first)."""
    name = "log_softmax" if log else "softmax"
    op = "tritonkit." + name
    if dtype is None:
        (x,) = cast(autocast_dtype(name, x), x)
    else:
        # As torch.autocast does for softmax given a dtype: no autocast cast, dtype's alone.
        x = _in_dtype(op, x, dtype)

    def validate() -> int:
        check_tensor(op, "x", x)
        return normalize_dim(op, "dim", dim, x.dim())

    d = validated(op, arg_facts(x, dim, log), validate)
    if x.dim() == 0:
        return apply(SoftmaxFunction, x.reshape(1), 0, log, config).reshape(())
    return apply(SoftmaxFunction, x, d, log, config)


@policy(cuda=FP32)
def softmax(x: torch.Tensor, dim: int = -1, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.softmax(x, dim, dtype)``, with autograd.

    A row that fits in registers (up to ``SoftmaxConfig.max_fused_cols`` elements) is read
    once; a longer one is read twice, the second time from L2. Any ``dim`` is reduced in place
    through strides, without a transpose copy.

    Args:
        x: float32, float16 or bfloat16 tensor on a CUDA device, any shape and strides (with
            ``dtype``, any real dtype: it is cast first).
        dim: the dimension to normalize over (negative counts from the end).
        dtype: None, or float32, float16 or bfloat16: x is cast to it before the op, as
            ``torch.softmax`` casts it (the result is in ``dtype``, x's gradient in x's
            dtype). float64 raises TypeError: the kernels compute in float32.

    Returns:
        A tensor like x (its strides when x is dense), in x's dtype (or ``dtype``); rows
        containing NaN or +inf are NaN, as in PyTorch. Under CUDA ``torch.autocast`` without
        ``dtype``, x is first cast to float32 (so is the result), as ``torch.softmax``'s is.
    """
    return softmax_along(x, dim, False, dtype=dtype)


@policy(cuda=FP32)
def log_softmax(x: torch.Tensor, dim: int = -1, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.log_softmax(x, dim, dtype)``, with autograd; computed as
    ``x - max - log(sum(exp))``.

    Args:
        x: float32, float16 or bfloat16 tensor on a CUDA device, any shape and strides (with
            ``dtype``, any real dtype: it is cast first).
        dim: the dimension to normalize over (negative counts from the end).
        dtype: None, or float32, float16 or bfloat16, as in ``softmax``.

    Returns:
        A tensor like x (its strides when x is dense), in x's dtype or ``dtype`` (float32
        under CUDA ``torch.autocast`` without ``dtype``, as for ``torch.log_softmax``).
    """
    return softmax_along(x, dim, True, dtype=dtype)
