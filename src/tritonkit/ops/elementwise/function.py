"""The elementwise family's operators, autograd Functions and public functions: activations
(relu, gelu, silu), the broadcast ``bias_act``, ``add``, and the gated units (swiglu, geglu).

``act(x + bias)`` runs on the shared pointwise tiles (``_core.pointwise``: its kernels also serve
memory's copy and linear's backward); the gated units on this family's kernels (``plan.py``),
registered as ``tritonkit::glu`` and ``tritonkit::glu_backward``.
"""

from __future__ import annotations

import math

import torch

from tritonkit.ops._core.bias_act import call_bias_act, call_bias_act_backward
from tritonkit.ops._core.layout import elementwise_output
from tritonkit.ops._core.registry import apply, define_op, eager_direct
from tritonkit.ops._core.validate import check_choice, check_operand, check_same_shape, check_tensor
from tritonkit.ops.elementwise.plan import glu_bwd, glu_fwd

# ---- the gated units' operators ---------------------------------------------------------------


@define_op("tritonkit::glu")
def _glu_op(gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
    return glu_fwd(gate, up, activation)


@_glu_op.register_fake
def _(gate, up, activation):
    return elementwise_output([gate, up])


@define_op("tritonkit::glu_backward")
def _glu_backward_op(
    grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str
) -> tuple[torch.Tensor, torch.Tensor]:
    return glu_bwd(grad, gate, up, activation)


@_glu_backward_op.register_fake
def _(grad, gate, up, activation):
    return elementwise_output([grad, gate, up]), elementwise_output([grad, gate, up])


# Eager calls on real tensors skip the ops' dispatch (see eager_direct).
call_glu = eager_direct(_glu_op)
call_glu_backward = eager_direct(_glu_backward_op)


# ---- autograd and the public functions ------------------------------------------------------


class BiasActFunction(torch.autograd.Function):
    """``act(x + bias)``; bias None, shaped like x, or broadcast over x's leading dimensions."""

    @staticmethod
    def forward(ctx, x, bias, activation):
        # ReLU keeps one bit per element for its backward pass, and only when one will run.
        save_mask = activation == "relu" and any(ctx.needs_input_grad[:2])
        y, mask = call_bias_act(x, bias, activation, save_mask)
        ctx.activation = activation
        ctx.bias_is_row = bias is not None and bias.shape != x.shape
        if activation == "none":
            # d(x + b)/dx is the identity: keep only the bias (its shape says how to reduce),
            # not x, so that add frees its inputs as early as PyTorch's add does.
            ctx.save_for_backward(bias if ctx.bias_is_row else None)
        elif save_mask:
            ctx.save_for_backward(mask, bias if ctx.bias_is_row else None)
        else:
            ctx.save_for_backward(x, bias)
        return y

    @staticmethod
    def backward(ctx, grad):
        need_dx, need_dbias = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        op = call_bias_act_backward
        if ctx.activation == "none":
            (bias,) = ctx.saved_tensors
            dbias = None
            if need_dbias:
                if ctx.bias_is_row:
                    _, dbias = op(grad, None, bias, None, "none", False, True, False)
                else:
                    dbias = grad
            return (grad if need_dx else None), dbias, None
        if ctx.activation == "relu":
            mask, bias = ctx.saved_tensors
            dx, dbias = op(grad, None, bias, mask, "relu", need_dx, need_dbias, False)
        else:
            x, bias = ctx.saved_tensors
            dx, dbias = op(grad, x, bias, None, ctx.activation, need_dx, need_dbias, False)
        if need_dbias and not ctx.bias_is_row:
            dbias = dx  # d(x + b) is the same tensor for both operands
        return (dx if need_dx else None), (dbias if need_dbias else None), None


class GLUFunction(torch.autograd.Function):
    """``act(gate) * up``."""

    @staticmethod
    def forward(ctx, gate, up, activation):
        ctx.activation = activation
        ctx.save_for_backward(gate, up)
        return call_glu(gate, up, activation)

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        dgate, dup = call_glu_backward(grad, gate, up, ctx.activation)
        return (
            dgate if ctx.needs_input_grad[0] else None,
            dup if ctx.needs_input_grad[1] else None,
            None,
        )


# ----------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------

_BIAS_ACTIVATIONS = (None, "relu", "gelu", "gelu_tanh", "silu")
_GELU_APPROXIMATIONS = {"none": "gelu", "tanh": "gelu_tanh"}


def _strip_leading_ones(shape: torch.Size) -> tuple[int, ...]:
    dims = list(shape)
    while dims and dims[0] == 1:
        dims.pop(0)
    return tuple(dims)


def add(x: torch.Tensor, y: torch.Tensor, *, alpha: float = 1) -> torch.Tensor:
    """Elementwise ``x + y`` (``torch.add`` with ``alpha`` 1), with autograd.

    Args:
        x: float32, float16 or bfloat16 tensor on a CUDA device.
        y: tensor of the same dtype and device; the two shapes broadcast as in ``torch.add``.
            Where one operand is the output's shape and the other a suffix of it (leading 1s
            aside), e.g. ``(B, S, C) + (C,)`` or ``(S, C) + (B, S, C)``, the small one is read
            as a row or rows of the big one and its gradient is a column sum in the kernel.
            Any other broadcast, e.g. ``(5, 1) + (5,)`` or ``(10, 1, 5) + (1, 10, 5)``, reads
            each operand through its broadcast (stride-0) view, copied contiguous where it has
            no unit-stride rows; its gradient is summed over the broadcast dimensions by
            autograd, as ``torch.add``'s is.
        alpha: accepted for ``torch.add``'s signature; only 1 is supported (any other value
            raises ValueError: scale ``y`` first).

    Returns:
        ``x + y`` in the inputs' dtype, computed in float32 and rounded once.
    """
    op = "tritonkit.add"
    if alpha != 1:
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
            raise TypeError(f"{op}: alpha must be a number, got {type(alpha).__name__}")
        raise ValueError(
            f"{op}: alpha must be 1 (x + alpha * y is not fused), got {alpha}; pass alpha * y"
        )
    check_tensor(op, "x", x)
    check_operand(op, "y", y, "x", x)
    if x.shape == y.shape:
        return apply(BiasActFunction, x, y, "none")
    # Not torch.broadcast_shapes: its host time per call exceeds what the kernel takes at small
    # shapes (see docs/performance.md).
    out_shape = _broadcast_shape(tuple(x.shape), tuple(y.shape))
    if out_shape is None:
        raise ValueError(
            f"{op}: x and y must be broadcastable, got shapes {tuple(x.shape)} and {tuple(y.shape)}"
        )
    for big, small in ((x, y), (y, x)):
        if big.shape != out_shape:
            continue
        core = _strip_leading_ones(small.shape)
        if len(core) <= big.dim() and tuple(big.shape[big.dim() - len(core) :]) == core:
            if small.numel() == big.numel():  # only leading 1s differ
                return apply(BiasActFunction, big, small.reshape(big.shape), "none")
            return apply(BiasActFunction, big, small.reshape(core), "none")
    numel = math.prod(out_shape)
    if x.numel() == y.numel() == numel:  # e.g. (S, C) + (1, S, C): the output up to leading 1s
        return apply(BiasActFunction, x.reshape(out_shape), y.reshape(out_shape), "none")
    # Both operands grow, or one grows along a middle dimension: the kernel adds the two
    # broadcast views (a view with no unit-stride rows, e.g. (5, 1) -> (5, 5), is copied by the
    # launcher), and each operand's gradient is expand's: summed over its broadcast dimensions.
    return apply(BiasActFunction, x.expand(out_shape), y.expand(out_shape), "none")


def _broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """The broadcast of two shapes, as torch.broadcast_shapes gives it, or None."""
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for da, db in zip(a, b):
        if da != db and da != 1 and db != 1:
            return None
        out.append(db if da == 1 else da)
    return tuple(out)


def _activation(op: str, x: torch.Tensor, activation: str) -> torch.Tensor:
    check_tensor(op, "x", x)
    return apply(BiasActFunction, x, None, activation)


def relu(x: torch.Tensor) -> torch.Tensor:
    """``torch.relu(x)``, with autograd. NaN stays NaN.

    Args:
        x: float32, float16 or bfloat16 tensor on a CUDA device, any shape and strides.
    """
    return _activation("tritonkit.relu", x, "relu")


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``torch.nn.functional.gelu(x, approximate)``, with autograd.

    Args:
        x: float32, float16 or bfloat16 tensor on a CUDA device, any shape and strides.
        approximate: ``"none"`` (exact, with erf) or ``"tanh"``.
    """
    check_choice("tritonkit.gelu", "approximate", approximate, tuple(_GELU_APPROXIMATIONS))
    return _activation("tritonkit.gelu", x, _GELU_APPROXIMATIONS[approximate])


def silu(x: torch.Tensor) -> torch.Tensor:
    """``torch.nn.functional.silu(x)`` (x * sigmoid(x)), with autograd.

    Args:
        x: float32, float16 or bfloat16 tensor on a CUDA device, any shape and strides.
    """
    return _activation("tritonkit.silu", x, "silu")


def bias_act(x: torch.Tensor, bias: torch.Tensor, activation: str | None = None) -> torch.Tensor:
    """``act(x + bias)`` in one pass, the bias broadcast over every leading dimension of x.

    PyTorch needs two passes for this (``x + bias``, then the activation); here each tile of
    bias is loaded once and reused across a block of rows. The backward pass computes
    ``dx`` and the bias gradient (a deterministic column sum) in one read of the inputs.

    Args:
        x: float32, float16 or bfloat16 tensor of shape ``(..., C)`` on a CUDA device.
        bias: tensor of shape ``(C,)``, same dtype and device as x.
        activation: None, ``"relu"``, ``"gelu"``, ``"gelu_tanh"`` or ``"silu"``.
    """
    op = "tritonkit.bias_act"
    check_tensor(op, "x", x)
    if x.dim() == 0:
        raise ValueError(f"{op}: x must have at least one dimension, got a 0-d tensor")
    check_operand(op, "bias", bias, "x", x, (x.shape[-1],), "(x.shape[-1],)")
    check_choice(op, "activation", activation, _BIAS_ACTIVATIONS)
    return apply(BiasActFunction, x, bias, activation or "none")


def _glu(op: str, gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
    check_tensor(op, "gate", gate)
    check_operand(op, "up", up, "gate", gate)
    check_same_shape(op, gate=gate, up=up)
    return apply(GLUFunction, gate, up, activation)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU: ``silu(gate) * up`` in one pass, with autograd.

    Args:
        gate: float32, float16 or bfloat16 tensor on a CUDA device. Views such as
            ``proj(x).chunk(2, dim=-1)`` are read in place.
        up: tensor of the same shape, dtype and device.
    """
    return _glu("tritonkit.swiglu", gate, up, "silu")


def geglu(gate: torch.Tensor, up: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GEGLU: ``gelu(gate, approximate) * up`` in one pass, with autograd.

    Args:
        gate: float32, float16 or bfloat16 tensor on a CUDA device.
        up: tensor of the same shape, dtype and device.
        approximate: ``"none"`` or ``"tanh"``, as in ``torch.nn.functional.gelu``.
    """
    check_choice("tritonkit.geglu", "approximate", approximate, tuple(_GELU_APPROXIMATIONS))
    return _glu("tritonkit.geglu", gate, up, _GELU_APPROXIMATIONS[approximate])
