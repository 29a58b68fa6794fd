"""conv2d: registration with torch.library, the autograd Function and the public function.

The forward and the three backward launchers are ops (torch.compile traces each as one node,
their fakes give the shapes and layouts); the derivatives live in ``ConvFunction``.
"""

from __future__ import annotations

import torch

from tritonkit._autocast import LOWER, autocast_dtype, cast, policy
from tritonkit.ops._core.plan import arg_facts, validated
from tritonkit.ops._core.registry import apply, define_op, direct_call_allowed, eager_direct
from tritonkit.ops._core.validate import check_same_device, check_tensor
from tritonkit.ops.conv.plan import (
    act_backward,
    bias_grad,
    conv_backward,
    conv_dgrad,
    conv_forward,
    conv_wgrad,
    output_format,
    problem,
)

ACTIVATIONS = ("none", "relu", "gelu", "silu")


class ConvArgumentError(ValueError, RuntimeError):
    """A convolution PyTorch rejects: a RuntimeError as ``F.conv2d`` raises (its message),
    and a ValueError as tritonkit's other functions raise."""


@define_op("tritonkit::conv2d")
def _conv_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    activation: str,
) -> torch.Tensor:
    return conv_forward(x, weight, bias, residual, stride, padding, dilation, groups, activation)


@_conv_op.register_fake
def _(x, weight, bias, residual, stride, padding, dilation, groups, activation):
    p = problem(x.shape, weight.shape, stride, padding, dilation, groups, x.dtype)
    return x.new_empty((p.n, p.k, p.oh, p.ow)).contiguous(memory_format=output_format(x, weight))


@define_op("tritonkit::conv2d_dgrad")
def _dgrad_op(
    grad: torch.Tensor,
    weight: torch.Tensor,
    x_shape: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
) -> torch.Tensor:
    return conv_dgrad(grad, weight, x_shape, stride, padding, dilation, groups)


@_dgrad_op.register_fake
def _(grad, weight, x_shape, stride, padding, dilation, groups):
    return grad.new_empty(x_shape).contiguous(memory_format=output_format(grad, weight))


@define_op("tritonkit::conv2d_wgrad")
def _wgrad_op(
    grad: torch.Tensor,
    x: torch.Tensor,
    w_shape: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
) -> torch.Tensor:
    return conv_wgrad(grad, x, w_shape, stride, padding, dilation, groups)


@_wgrad_op.register_fake
def _(grad, x, w_shape, stride, padding, dilation, groups):
    return x.new_empty(w_shape).contiguous(memory_format=output_format(x, grad))


@define_op("tritonkit::conv2d_bias_grad")
def _bias_grad_op(dz: torch.Tensor) -> torch.Tensor:
    return bias_grad(dz)


@_bias_grad_op.register_fake
def _(dz):
    return dz.new_empty(dz.shape[1])


@define_op("tritonkit::conv2d_act_grad")
def _act_grad_op(grad: torch.Tensor, src: torch.Tensor, activation: str) -> torch.Tensor:
    return act_backward(grad, src, activation)


@_act_grad_op.register_fake
def _(grad, src, activation):
    return torch.empty_like(src)


call_conv = eager_direct(_conv_op)
call_dgrad = eager_direct(_dgrad_op)
call_wgrad = eager_direct(_wgrad_op)
call_bias_grad = eager_direct(_bias_grad_op)
call_act_grad = eager_direct(_act_grad_op)


class ConvFunction(torch.autograd.Function):
    """``act(conv2d(x, weight) + bias + residual)``. The backward: dz = dy * act'(z) (relu
    reads the saved output; gelu and silu recompute z, one forward without the activation,
    rather than keep it), then dgrad, wgrad and the bias gradient from dz; the residual's
    gradient is dz itself."""

    @staticmethod
    def forward(ctx, x, weight, bias, residual, stride, padding, dilation, groups, activation):
        y = call_conv(x, weight, bias, residual, stride, padding, dilation, groups, activation)
        ctx.geometry = (stride, padding, dilation, groups)
        ctx.activation = activation
        ctx.save_for_backward(x, weight, bias, residual, y if activation == "relu" else None)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, residual, y = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.geometry
        act = ctx.activation
        if act == "relu":
            dz = call_act_grad(dy, y, act)
        elif act != "none":
            z = call_conv(x, weight, bias, residual, stride, padding, dilation, groups, "none")
            dz = call_act_grad(dy, z, act)
        else:
            dz = dy
        need = ctx.needs_input_grad
        if direct_call_allowed((dz, x, weight)):  # plain eager: one plan for the three
            dx, dw, db = conv_backward(
                dz, x, weight, stride, padding, dilation, groups, (need[0], need[1], need[2])
            )
            return dx, dw, db, dz if need[3] else None, None, None, None, None, None
        dx = dw = db = None
        if need[0]:
            dx = call_dgrad(dz, weight, list(x.shape), stride, padding, dilation, groups)
        if need[1]:
            dw = call_wgrad(dz, x, list(weight.shape), stride, padding, dilation, groups)
        if need[2]:
            db = call_bias_grad(dz)
        dres = dz if need[3] else None
        return dx, dw, db, dres, None, None, None, None, None


def _pair(op: str, name: str, v: object) -> list[int]:
    if isinstance(v, int) and not isinstance(v, bool):
        return [v, v]
    if isinstance(v, (tuple, list)) and all(isinstance(e, int) for e in v):
        if len(v) == 1:
            return [v[0], v[0]]
        if len(v) == 2:
            return list(v)
        raise ConvArgumentError(
            f"{op}: expected {name} to be a single integer value or a list of 2 values to "
            f"match the convolution dimensions, but got {name}={list(v)}"
        )
    raise TypeError(f"{op}: {name} must be an int or a tuple of 2 ints, got {v!r}")


def _padding(op, padding, stride, dilation, weight) -> list[int]:
    """(top, bottom, left, right) from an int, a pair, "valid" or "same" (torch's rules)."""
    if isinstance(padding, str):
        if padding == "valid":
            return [0, 0, 0, 0]
        if padding != "same":
            raise ValueError(
                f"{op}: Invalid padding string {padding!r}, should be one of 'valid', 'same'"
            )
        if stride != [1, 1]:
            raise ConvArgumentError(
                f"{op}: padding='same' is not supported for strided convolutions (stride={stride})"
            )
        out = []
        for d, k in zip(dilation, weight.shape[2:], strict=True):
            total = d * (k - 1)  # torch pads the odd element at the end
            out += [total // 2, total - total // 2]
        return out
    ph, pw = _pair(op, "padding", padding)
    if ph < 0 or pw < 0:
        raise ConvArgumentError(f"{op}: negative padding is not supported, got padding={padding}")
    return [ph, ph, pw, pw]


def _check(op, x, weight, bias, residual, stride, padding, dilation, groups, activation):
    check_tensor(op, "x", x)
    check_tensor(op, "weight", weight)
    check_same_device(op, x=x, weight=weight)
    if weight.dtype != x.dtype:
        raise TypeError(f"{op}: weight must have x's dtype {x.dtype}, got {weight.dtype}")
    if x.dim() != 4:
        raise ConvArgumentError(
            f"{op}: Expected 3D (unbatched) or 4D (batched) input x to conv2d, but got input "
            f"of size: {list(x.shape)}"
        )
    if weight.dim() != 4:
        raise ConvArgumentError(
            f"{op}: weight must be 4-D (out_channels, in_channels / groups, kH, kW), got size "
            f"{list(weight.shape)}"
        )
    if isinstance(groups, bool) or not isinstance(groups, int):
        raise TypeError(f"{op}: groups must be an int, got {groups!r}")
    if groups <= 0:
        raise ConvArgumentError(f"{op}: non-positive groups is not supported, got {groups}")
    s = _pair(op, "stride", stride)
    d = _pair(op, "dilation", dilation)
    if min(s) <= 0:
        raise ConvArgumentError(f"{op}: non-positive stride is not supported, got {stride}")
    if min(d) <= 0:
        raise ConvArgumentError(f"{op}: dilation should be greater than zero, got {dilation}")
    pad = _padding(op, padding, s, d, weight)
    k, cg, kh, kw = weight.shape
    if k % groups:
        raise ConvArgumentError(
            f"{op}: Given groups={groups}, expected weight to be divisible by {groups} at "
            f"dimension 0, but got weight of size {list(weight.shape)} instead"
        )
    if x.shape[1] != cg * groups:
        raise ConvArgumentError(
            f"{op}: Given groups={groups}, weight of size {list(weight.shape)}, expected input x"
            f"{list(x.shape)} to have {cg * groups} channels, but got {x.shape[1]} channels "
            "instead"
        )
    ph, pw = x.shape[2] + pad[0] + pad[1], x.shape[3] + pad[2] + pad[3]
    eh, ew = d[0] * (kh - 1) + 1, d[1] * (kw - 1) + 1
    if ph < eh or pw < ew:
        raise ConvArgumentError(
            f"{op}: Calculated padded input size per channel: ({ph} x {pw}). Kernel size: "
            f"({eh} x {ew}). Kernel size can't be greater than actual input size"
        )
    if bias is not None:
        check_tensor(op, "bias", bias)
        check_same_device(op, x=x, bias=bias)
        if bias.dtype != x.dtype:
            raise TypeError(f"{op}: bias must have x's dtype {x.dtype}, got {bias.dtype}")
        if tuple(bias.shape) != (k,):
            raise ConvArgumentError(
                f"{op}: Given weight of size {list(weight.shape)}, expected bias to be "
                f"1-dimensional with {k} elements, but got bias of size {list(bias.shape)} instead"
            )
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"{op}: activation must be one of {ACTIVATIONS} or None, got {activation!r}"
        )
    if residual is not None:
        check_tensor(op, "residual", residual)
        check_same_device(op, x=x, residual=residual)
        if residual.dtype != x.dtype:
            raise TypeError(f"{op}: residual must have x's dtype {x.dtype}, got {residual.dtype}")
        p = problem(x.shape, weight.shape, s, pad, d, groups, x.dtype)
        if tuple(residual.shape) != (p.n, p.k, p.oh, p.ow):
            raise ValueError(
                f"{op}: residual must have the output's shape {[p.n, p.k, p.oh, p.ow]}, got "
                f"{list(residual.shape)}"
            )
    return tuple(s), tuple(pad), tuple(d)


def conv_geometry(x, weight, stride=1, padding=0, dilation=1, groups=1):
    """(stride, padding as (top, bottom, left, right), dilation) as ``conv2d`` resolves them,
    after its checks: what the workbench's variants (specs/conv.py) launch with."""
    op = "tritonkit.conv2d"
    return _check(op, x, weight, None, None, stride, padding, dilation, groups, "none")


@policy(cuda=LOWER, cpu=LOWER)
def conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] | str = 0,
    dilation: int | tuple[int, int] = 1,
    groups: int = 1,
    *,
    residual: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor:
    """``F.conv2d`` (2-D cross-correlation) with autograd, as an implicit GEMM on the tensor
    cores (no im2col buffer; on Hopper, for dense channels_last operands at stride 1 or 2, its
    tiles loaded by TMA with the padding as the copies' zero fill), a plain GEMM for 1x1
    stride-1 layers and a direct kernel for depthwise ones; optionally fused with ``act(conv +
    bias + residual)``.

    Args:
        x: (N, C, H, W) or unbatched (C, H, W); float32, float16 or bfloat16 on a CUDA device;
            any strides (channels_last is the fast layout; NCHW is read as it lies).
        weight: (K, C / groups, KH, KW) in x's dtype (a copy to channels_last, counted in
            LAYOUT_COPIES, where its input channels are not unit-stride).
        bias: optional (K,) in x's dtype.
        stride, dilation: an int or a pair (height, width), positive.
        padding: an int or a pair (zeros on both sides), or "valid" (none) or "same" (output
            of the input's size, stride 1 only; an odd total pads one more at the end).
        groups: input and output channels are split into this many independent groups.
        residual: optional tensor of the output's shape and x's dtype, added before the
            activation (a ResNet block's ``relu(bn(conv(x)) + identity)``).
        activation: None (or "none"), "relu", "gelu" (erf) or "silu", applied last.

    Returns:
        The output (N, K, OH, OW) (or (K, OH, OW)), channels_last when x's or weight's strides
        suggest it, as PyTorch's convolution lays it out. float32 uses TF32 products where
        ``torch.backends.cudnn.allow_tf32`` says so, as PyTorch's convolution does. Invalid
        geometry (channels not divisible by groups, a window larger than the padded input,
        ...) raises ``F.conv2d``'s message as an error that is both a RuntimeError (PyTorch's
        type) and a ValueError. Under ``torch.autocast`` the inputs are cast as for F.conv2d.
    """
    op = "tritonkit.conv2d"
    dt = autocast_dtype("conv2d", x)
    x, weight, bias, residual = cast(dt, x, weight, bias, residual)
    activation = "none" if activation is None else activation
    unbatched = isinstance(x, torch.Tensor) and x.dim() == 3
    if unbatched:
        x = x.unsqueeze(0)
        if residual is not None and isinstance(residual, torch.Tensor):
            residual = residual.unsqueeze(0)
    s, pad, d = validated(
        op,
        arg_facts(x, weight, bias, residual, stride, padding, dilation, groups, activation),
        lambda: _check(
            op, x, weight, bias, residual, stride, padding, dilation, groups, activation
        ),
    )
    out = apply(ConvFunction, x, weight, bias, residual, s, pad, d, groups, activation)
    return out.squeeze(0) if unbatched else out
