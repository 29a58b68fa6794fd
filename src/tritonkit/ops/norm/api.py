"""LayerNorm and RMSNorm, alone or fused with the residual add: the public functions, their
validation and autocast policy. A call is validated once per argument facts (the plan cache
keeps the verdict), then applies its autograd Function (function.py) through
``registry.apply``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tritonkit._autocast import FP32, autocast_dtype, cast, policy
from tritonkit.ops._core.plan import arg_facts, validated
from tritonkit.ops._core.registry import apply
from tritonkit.ops._core.validate import (
    check_operand,
    check_same_dtype,
    check_same_shape,
    check_tensor,
)
from tritonkit.ops.norm.config import NormConfig
from tritonkit.ops.norm.function import AddNormFunction, NormFunction


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
