"""The matmul family's operators: ``tritonkit::matmul``, ``linear`` and ``scaled_matmul``
registered with PyTorch, their autograd Functions, and the public functions.

The public functions validate once; the Functions' backward passes run GEMMs through the same
cached plans (``plan.py``) with no validation. ``linear``'s backward computes ``dZ = dY *
act'(Z)`` and the bias gradient in one read of ``dY`` and the saved pre-activation ``Z``
(``_core.pointwise``'s ``bias_act_backward``), because both weight and input gradients consume
``dZ``: fusing ``act'`` into their GEMMs would compute it twice and take the operand off the
TMA path.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from tritonkit._autocast import LOWER, autocast_dtype, cast, policy
from tritonkit.ops._core.bias_act import call_bias_act_backward
from tritonkit.ops._core.gemm import FP8_DTYPES
from tritonkit.ops._core.internals import any_autocast as _any_autocast
from tritonkit.ops._core.layout import LAYOUT_COPIES
from tritonkit.ops._core.plan import arg_facts, validated
from tritonkit.ops._core.registry import apply, define_op, eager_direct
from tritonkit.ops._core.validate import (
    FLOAT_DTYPES,
    check_choice,
    check_operand,
    check_same_device,
    check_tensor,
)
from tritonkit.ops.matmul.configs import VARIANTS, GemmOptions
from tritonkit.ops.matmul.launchers import (
    linear_fwd,
    linear_plan,
    matmul_fwd,
    matmul_plan,
    matmul_shape,
)
from tritonkit.ops.matmul.lowp import scaled_matmul_fwd

# ----------------------------------------------------------------------------------------------
# torch.library registration: each launcher becomes an op that torch.compile traces as one node.
# ----------------------------------------------------------------------------------------------


# The ops take their plan and run it here: the plan's run is the launch, one file down (the
# public call reaches its kernels through api.py, registry.py, plan.py and launch.py).
@define_op("tritonkit::matmul")
def _matmul_op(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    return matmul_plan(a, b, out_dtype).run(a, b, out_dtype)


@_matmul_op.register_fake
def _(a, b, out_dtype):
    return a.new_empty(matmul_shape("tritonkit.matmul", a.shape, b.shape), dtype=out_dtype)


@define_op("tritonkit::linear")
def _linear_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    activation: str,
    save_z: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    return linear_plan(x, weight, bias, residual, activation, save_z).run(x, weight, bias, residual)


@_linear_op.register_fake
def _(x, weight, bias, residual, activation, save_z):
    shape = (x.shape[0], weight.shape[0])
    return x.new_empty(shape), x.new_empty(shape if save_z else (0,))


@define_op("tritonkit::scaled_matmul")
def _scaled_matmul_op(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor | None,
    scale_b: torch.Tensor | None,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    return scaled_matmul_fwd(a, b, scale_a, scale_b, bias, out_dtype)


@_scaled_matmul_op.register_fake
def _(a, b, scale_a, scale_b, bias, out_dtype):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


# Eager calls on real tensors skip the ops' dispatch (see eager_direct).
call_matmul = eager_direct(_matmul_op)
call_linear = eager_direct(_linear_op)
call_scaled_matmul = eager_direct(_scaled_matmul_op)


# ----------------------------------------------------------------------------------------------
# Autograd
# ----------------------------------------------------------------------------------------------


def _mm(
    x: torch.Tensor,
    y: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    options: GemmOptions | None = None,
) -> torch.Tensor:
    """``x @ y`` through the op, or with explicit ``options`` through the launcher (eager)."""
    if options is None:
        return call_matmul(x, y, out_dtype or x.dtype)
    return matmul_fwd(x, y, out_dtype or x.dtype, options=options)


def _as_matrix(t: torch.Tensor, n_cols: int) -> torch.Tensor:
    """``t`` as (rows, n_cols): a view when its leading dimensions merge, else a counted copy."""
    rows = math.prod(t.shape[:-1])
    try:
        return t.view(rows, n_cols)
    except RuntimeError:
        LAYOUT_COPIES.count += 1
        return t.reshape(rows, n_cols)


def _reduced_product(
    x: torch.Tensor, y: torch.Tensor, shape: torch.Size, options: GemmOptions | None
) -> torch.Tensor:
    """``x @ y`` summed over the batch dimensions an operand of ``shape`` was broadcast over."""
    full = matmul_shape("tritonkit.matmul", x.shape, y.shape)
    if tuple(full) == tuple(shape):
        return _mm(x, y, options=options)
    rows, inner = x.shape[-2:]
    cols = y.shape[-1]
    if len(shape) == 2:
        # A matrix broadcast over the whole batch: sum_b x[b] @ y[b] is one GEMM whose
        # reduction runs over (batch, inner): (rows, B * inner) @ (B * inner, cols).
        nb = math.prod(full[:-2])
        xs = x.expand(*full[:-2], rows, inner).reshape(nb, rows, inner)
        ys = y.expand(*full[:-2], inner, cols).reshape(nb * inner, cols)
        return _mm(xs.permute(1, 0, 2).reshape(rows, nb * inner), ys, options=options)
    # General broadcast: the products in fp32, summed, rounded once.
    return _mm(x, y, torch.float32, options).sum_to_size(shape).to(x.dtype)


class MatmulFunction(torch.autograd.Function):
    """``torch.matmul(a, b)``: dA = dC @ B^T and dB = A^T @ dC, summed over broadcast batches.

    ``options`` (None: the defaults, through the registered op) is for sweeps that compare
    ``GemmOptions`` forward and backward; the public function never passes it.
    """

    @staticmethod
    def forward(ctx, a, b, options=None):
        ctx.save_for_backward(a, b)
        ctx.options = options
        return _mm(a, b, a.dtype, options)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        options = ctx.options
        a2 = a.unsqueeze(0) if a.dim() == 1 else a
        b2 = b.unsqueeze(-1) if b.dim() == 1 else b
        g = grad.reshape(matmul_shape("tritonkit.matmul", a2.shape, b2.shape))
        da = db = None
        if ctx.needs_input_grad[0]:
            da = _reduced_product(g, b2.mT, a2.shape, options).reshape(a.shape)
        if ctx.needs_input_grad[1]:
            if b2.dim() == 2 and a2.dim() > 2:
                # (..., M, K) @ (K, N): dB = A^T @ dC with the batch folded into the reduction.
                k, n = b2.shape
                db = _mm(_as_matrix(a2, k).t(), _as_matrix(g, n), options=options)
            else:
                db = _reduced_product(a2.mT, g, b2.shape, options)
            db = db.reshape(b.shape)
        return da, db, None


class LinearFunction(torch.autograd.Function):
    """``act(x @ W^T + b) + residual`` with the bias, activation and residual in the epilogue.

    Backward: dZ = dY * act'(Z) and db = sum(dZ) in one pass over dY and the saved
    pre-activation Z = x @ W^T + b (``_core.pointwise.bias_act_backward``); dX = dZ @ W;
    dW = dZ^T @ X; d(residual) = dY. ``options`` as in ``MatmulFunction``.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, residual, activation, options=None):
        n, k = weight.shape
        flat = x.dim() == 2  # the usual case: no views in or out
        x2 = x if flat else _as_matrix(x, k)
        r2 = residual if flat or residual is None else _as_matrix(residual, n)
        needs = ctx.needs_input_grad
        save_z = activation != "none" and any(needs[:3])
        if options is None:
            y, z = call_linear(x2, weight, bias, r2, activation, save_z)
        else:
            y, z = linear_fwd(x2, weight, bias, r2, activation, save_z, options=options)
        ctx.activation = activation
        ctx.x_shape = x.shape
        ctx.options = options
        ctx.save_for_backward(
            x2 if needs[1] else None,
            weight if needs[0] else None,
            bias,
            z if save_z else None,
        )
        return y if flat else y.view(*x.shape[:-1], n)

    @staticmethod
    def backward(ctx, grad):
        x2, weight, bias, z = ctx.saved_tensors
        need_x, need_w, need_b, need_r = ctx.needs_input_grad[:4]
        options = ctx.options
        n = grad.shape[-1]
        g = _as_matrix(grad, n)
        op = call_bias_act_backward
        db = None
        if ctx.activation != "none":
            dz, db = op(g, z, bias, None, ctx.activation, True, need_b, True)
        else:
            dz = g
            if need_b:
                _, db = op(g, None, bias, None, "none", False, True, False)
        dx = _mm(dz, weight, options=options).view(ctx.x_shape) if need_x else None
        dw = _mm(dz.t(), x2, options=options) if need_w else None
        dr = grad if need_r else None
        return dx, dw, (db if need_b else None), dr, None, None


# ----------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------

_LINEAR_ACTIVATIONS = (None, "relu", "gelu", "gelu_tanh", "silu")
_SCALED_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_INT8_OUT_DTYPES = (torch.int32, torch.bfloat16, torch.float16, torch.float32)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_2d(op: str, name: str, t: torch.Tensor) -> None:
    if t.dim() != 2:
        raise ValueError(f"{op}: {name} must be 2-D, got {t.dim()}-D shape {tuple(t.shape)}")


def _check_inner(op: str, a: torch.Tensor, b: torch.Tensor) -> None:
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"{op}: inner dimensions must match: a.shape[1] = {a.shape[1]} but b.shape[0] = "
            f"{b.shape[0]} (a {tuple(a.shape)}, b {tuple(b.shape)})"
        )


def _check_out_dtype(op: str, out_dtype: object, allowed: Sequence[torch.dtype]) -> None:
    if out_dtype not in allowed:
        names = ", ".join(_name(d) for d in allowed)
        got = _name(out_dtype) if isinstance(out_dtype, torch.dtype) else repr(out_dtype)
        raise TypeError(f"{op}: out_dtype must be one of {names}, got {got}")


def _check_scale(
    op: str, name: str, scale: torch.Tensor, ref: torch.Tensor, vector_shape: tuple[int, int]
) -> None:
    check_tensor(op, name, scale, (torch.float32,))
    check_same_device(op, a=ref, **{name: scale})
    if scale.numel() == 1 and scale.dim() <= 2:
        return
    if tuple(scale.shape) != vector_shape:
        raise ValueError(
            f"{op}: {name} must have one element (per-tensor scale) or shape {vector_shape}, "
            f"got {tuple(scale.shape)}"
        )


def _check_bias(op: str, bias: torch.Tensor, n: int, dtype: torch.dtype, ref: torch.Tensor) -> None:
    check_tensor(op, "bias", bias, (dtype,))
    check_same_device(op, a=ref, bias=bias)
    if tuple(bias.shape) != (n,):
        raise ValueError(f"{op}: bias must have shape ({n},), got {tuple(bias.shape)}")


@policy(cuda=LOWER, cpu=LOWER)
def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.matmul(a, b)``, with autograd.

    1-D operands, batched operands and batch broadcasting behave as in ``torch.matmul``.
    Transposed and sliced views are read through their strides, without a copy, except that a
    large float32 GEMM without TF32 (computed on the CUDA cores) first copies a K-major ``b``
    (e.g. ``w.t()``) row-major, which it reads 4x faster (``K * N`` elements; counted in
    reports). float32 uses TF32 exactly when PyTorch would
    (``torch.backends.cuda.matmul.allow_tf32`` or ``torch.get_float32_matmul_precision() !=
    "highest"``); accumulation is float32.

    Args:
        a: float32, float16 or bfloat16 tensor with at least 1 dimension, on a CUDA device.
        b: tensor of the same dtype and device; ``a.shape[-1]`` must equal ``b.shape[-2]``
            (``b.shape[0]`` for 1-D b), and the batch dimensions must broadcast.

    Returns:
        ``a @ b`` in the inputs' dtype, contiguous. Under ``torch.autocast`` both operands
        are first cast to the autocast dtype, as ``torch.matmul``'s are.
    """
    op = "tritonkit.matmul"
    a, b = cast(autocast_dtype("matmul", a), a, b)
    check_tensor(op, "a", a)
    check_operand(op, "b", b, "a", a)
    matmul_shape(op, a.shape, b.shape)
    return apply(MatmulFunction, a, b)


def _check_linear(x, weight, bias, activation, residual) -> bool:
    op = "tritonkit.linear"
    check_tensor(op, "x", x)
    check_operand(op, "weight", weight, "x", x)
    check_choice(op, "activation", activation, _LINEAR_ACTIVATIONS)
    if x.dim() == 0:
        raise ValueError(f"{op}: x must have at least 1 dimension, got a 0-d tensor")
    if weight.dim() != 2:
        raise ValueError(
            f"{op}: weight must be 2-D (out_features, in_features), got shape {tuple(weight.shape)}"
        )
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(
            f"{op}: x.shape[-1] must equal weight.shape[1] (in_features = {k}), got {x.shape[-1]} "
            f"(x {tuple(x.shape)}, weight {tuple(weight.shape)})"
        )
    if bias is not None:
        check_operand(op, "bias", bias, "x", x, (n,), "(out_features,)")
    if residual is not None:
        check_operand(op, "residual", residual, "x", x)
        expected = (*x.shape[:-1], n)
        if tuple(residual.shape) != expected:
            raise ValueError(
                f"{op}: residual must have the output's shape {expected}, "
                f"got {tuple(residual.shape)}"
            )
    return True


@policy(cuda=LOWER, cpu=LOWER)
def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """``act(F.linear(x, weight, bias)) + residual`` in one GEMM, with autograd.

    The bias, the activation and the residual add run in the GEMM's epilogue: the product
    never makes a round trip through memory. The backward pass keeps the pre-activation
    ``x @ W^T + b`` (only when an activation needs it) and computes dX, dW and the bias
    gradient. A large float32 product without TF32 first copies the weight transposed (see
    ``matmul``).

    Args:
        x: float32, float16 or bfloat16 tensor of shape ``(..., in_features)``.
        weight: ``(out_features, in_features)``, same dtype and device as x.
        bias: optional ``(out_features,)``.
        activation: None, ``"relu"``, ``"gelu"``, ``"gelu_tanh"`` or ``"silu"``.
        residual: optional tensor of the output's shape ``(..., out_features)``, added after
            the activation.

    Under ``torch.autocast`` x, weight and bias are first cast to the autocast dtype, as
    ``F.linear``'s are; a residual in another dtype is then added after the GEMM, with
    PyTorch's type promotion, as ``act(F.linear(...)) + residual`` would be.
    """
    if _any_autocast():  # one C call; under autocast, its casts first
        dtype = autocast_dtype("linear", x)
        x, weight, bias = cast(dtype, x, weight, bias)
        if dtype is not None and isinstance(residual, torch.Tensor) and residual.dtype != dtype:
            return linear(x, weight, bias, activation) + residual
    # Validation reads only the arguments' facts (types, shapes, dtypes, devices): a call with
    # facts seen before is valid, and its check is one lookup in the plan cache.
    facts = arg_facts(x, weight, bias, residual, activation)
    validated(
        "tritonkit.linear", facts, lambda: _check_linear(x, weight, bias, activation, residual)
    )
    return apply(LinearFunction, x, weight, bias, residual, activation or "none")


def scaled_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """FP8 GEMM with ``torch._scaled_mm`` semantics: ``(a @ b) * scale_a * scale_b + bias``.

    Accumulation is float32: the tensor cores sum products in their own ~14-bit accumulator and
    the kernel promotes those partial sums to fp32 every 2048 K elements with the default tile
    (once per K block with the others the tuner may pick): a little more error than
    ``torch._scaled_mm``'s (which promotes more often) for fewer tensor-core stalls; promoting
    once per K block matches its error at a lower speed (``MatmulConfig.promote_k``; see
    docs/performance.md). Any
    layout is accepted; the fastest is the one ``torch._scaled_mm`` requires: a row-major, b
    column-major. On Hopper,
    a large problem with another layout first copies the operand into a K-major scratch buffer
    (``K * N`` bytes for b, ``M * K`` for a, per call; see ``kmajor_copies``).

    Args:
        a: ``(M, K)`` float8_e4m3fn or float8_e5m2 tensor on a CUDA device.
        b: ``(K, N)`` float8_e4m3fn or float8_e5m2 tensor.
        scale_a: float32 dequantisation scale of a: one element (per tensor) or ``(M, 1)``
            (per row).
        scale_b: float32 scale of b: one element or ``(1, N)`` (per column).
        out_dtype: bfloat16, float16 or float32.
        bias: optional ``(N,)`` tensor of dtype ``out_dtype``, added after scaling.
    """
    op = "tritonkit.scaled_matmul"
    check_tensor(op, "a", a, FP8_DTYPES)
    check_tensor(op, "b", b, FP8_DTYPES)
    check_same_device(op, a=a, b=b)
    _check_2d(op, "a", a)
    _check_2d(op, "b", b)
    _check_inner(op, a, b)
    _check_out_dtype(op, out_dtype, _SCALED_OUT_DTYPES)
    _check_scale(op, "scale_a", scale_a, a, (a.shape[0], 1))
    _check_scale(op, "scale_b", scale_b, a, (1, b.shape[1]))
    if bias is not None:
        _check_bias(op, bias, b.shape[1], out_dtype, a)
    return call_scaled_matmul(a, b, scale_a, scale_b, bias, out_dtype)


def int8_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor | None = None,
    scale_b: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.int32,
) -> torch.Tensor:
    """INT8 GEMM (W8A8): the exact int32 product as ``torch._int_mm``, or dequantised.

    With ``out_dtype=torch.int32`` the result is ``a @ b`` accumulated in int32 (no scales).
    With a floating ``out_dtype`` the epilogue computes ``(a @ b) * scale_a * scale_b`` in
    float32 and rounds once (a missing scale counts as 1).

    Args:
        a: ``(M, K)`` int8 tensor on a CUDA device.
        b: ``(K, N)`` int8 tensor; K-major (``w.t()`` of an ``(N, K)`` weight) is fastest.
            On Hopper, a large problem with a row-major (or otherwise not K-major) b first
            transposes it into a K-major scratch buffer of ``K * N`` bytes, per call
            (``kmajor_copies``); a not row-major a is copied likewise (``M * K`` bytes).
        scale_a: optional float32 scale of a: one element or ``(M, 1)``.
        scale_b: optional float32 scale of b: one element or ``(1, N)``.
        out_dtype: int32, bfloat16, float16 or float32.
    """
    op = "tritonkit.int8_matmul"
    check_tensor(op, "a", a, (torch.int8,))
    check_tensor(op, "b", b, (torch.int8,))
    check_same_device(op, a=a, b=b)
    _check_2d(op, "a", a)
    _check_2d(op, "b", b)
    _check_inner(op, a, b)
    _check_out_dtype(op, out_dtype, _INT8_OUT_DTYPES)
    if out_dtype == torch.int32 and (scale_a is not None or scale_b is not None):
        raise ValueError(
            f"{op}: scale_a and scale_b need a floating out_dtype (bfloat16, float16 or "
            "float32); out_dtype=int32 returns the exact integer product"
        )
    if scale_a is not None:
        _check_scale(op, "scale_a", scale_a, a, (a.shape[0], 1))
    if scale_b is not None:
        _check_scale(op, "scale_b", scale_b, a, (1, b.shape[1]))
    return call_scaled_matmul(a, b, scale_a, scale_b, None, out_dtype)


def matmul_variant(a: torch.Tensor, b: torch.Tensor, variant: str) -> torch.Tensor:
    """``torch.matmul(a, b)`` by one version of the kernel's evolution (no autograd).

    Args:
        a: float32, float16 or bfloat16 tensor, as for ``matmul``.
        b: tensor of the same dtype and device.
        variant: one of ``VARIANTS``: "naive", "tiled", "pipelined", "autotuned", "persistent".
    """
    op = "tritonkit.matmul_variant"
    check_choice(op, "variant", variant, VARIANTS)
    check_tensor(op, "a", a, FLOAT_DTYPES)
    check_operand(op, "b", b, "a", a)
    return matmul_fwd(a, b, path=variant)
