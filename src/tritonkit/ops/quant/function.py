"""The quant family's torch.library ops, autograd Functions and functions: quantize, quantize
with a given scale, dequantize, and the quantized linear layers' compute: float8 training
(forward and both backward GEMMs in FP8) and int8 inference (W8A8 and weight-only), on the
family's quantize kernels and the matmul family's FP8/INT8 GEMMs (``tritonkit.scaled_matmul``,
``tritonkit.int8_matmul``). The public API is ``tritonkit.quant``.

Float8 training follows torchao's float8 recipes:

- "tensorwise": one scale per tensor, e4m3 for x and W, e5m2 for the output gradient. Each
  tensor is cast once, in both layouts its GEMMs read fastest (``layout="both"``: the codes and
  their transpose from the same pass), so y = x W^T, dX = dY W and dW = dY^T x read K-major
  operands without a copy.
- "rowwise": all e4m3, one power-of-two scale per row of each GEMM operand along the GEMM's
  reduction dimension (torchao's "rowwise" recipe): x and dY per row for y and dX, x and dY
  per column for dW, W per row for y and per column for dX. The per-column casts write
  column-major codes (the b operand's K-major layout).

The weight stays in its own (high) precision; its gradient is returned in its dtype.
"""

from __future__ import annotations

import torch

from tritonkit.ops._core.registry import apply, define_op, eager_direct
from tritonkit.ops.matmul import int8_matmul, scaled_matmul
from tritonkit.ops.matmul.api import call_scaled_matmul
from tritonkit.ops.quant.config import FORMATS, QFormat
from tritonkit.ops.quant.plan import (
    _codes_shape,
    dequantize_fwd,
    plan,
    quantize_fwd,
    quantize_with_scale_fwd,
    weight_only_fwd,
)


@define_op("tritonkit::int8_weight_only_linear")
def _weight_only_op(
    x2: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    return weight_only_fwd(x2, w, scale, bias)


@_weight_only_op.register_fake
def _(x2, w, scale, bias):
    return x2.new_empty((x2.shape[0], w.shape[0]))


call_weight_only = eager_direct(_weight_only_op)


@define_op("tritonkit::quantize")
def _quantize_op(
    x: torch.Tensor, fmt_name: str, block: list[int], pow2: bool, return_amax: bool, layout: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return quantize_fwd(x, fmt_name, block, pow2, return_amax, layout)


def _fake_outputs(x: torch.Tensor, fmt: QFormat, block: list[int], layout: str):
    p = plan(tuple(x.shape), tuple(block))
    shape = tuple(x.shape)
    if layout == "col":
        data = x.new_empty((p.n_cols, p.n_rows), dtype=fmt.storage).t()
    else:
        data = x.new_empty(_codes_shape(shape, fmt), dtype=fmt.storage)
    rows_cols = (p.n_cols, p.n_rows) if layout == "both" else (0,)
    return p, data, x.new_empty(rows_cols, dtype=fmt.storage)


@_quantize_op.register_fake
def _(x, fmt_name, block, pow2, return_amax, layout):
    fmt = FORMATS[fmt_name]
    p, data, data_t = _fake_outputs(x, fmt, block, layout)
    scale = x.new_empty(p.scale_shape, dtype=torch.float32)
    zp = x.new_empty(p.scale_shape if not fmt.symmetric else (0,), dtype=torch.int32)
    amax = x.new_empty(p.scale_shape if return_amax else (0,), dtype=torch.float32)
    return data, data_t, scale, zp, amax


@define_op("tritonkit::quantize_with_scale")
def _quantize_with_scale_op(
    x: torch.Tensor,
    scale: torch.Tensor,
    fmt_name: str,
    block: list[int],
    given: str,
    record_amax: bool,
    layout: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return quantize_with_scale_fwd(x, scale, fmt_name, block, given, record_amax, layout)


@_quantize_with_scale_op.register_fake
def _(x, scale, fmt_name, block, given, record_amax, layout):
    p, data, data_t = _fake_outputs(x, FORMATS[fmt_name], block, layout)
    out_scale = x.new_empty(p.scale_shape, dtype=torch.float32)
    amax = x.new_empty(p.scale_shape if record_amax else (0,), dtype=torch.float32)
    return data, data_t, out_scale, amax


@define_op("tritonkit::dequantize")
def _dequantize_op(
    data: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None,
    shape: list[int],
    block: list[int],
    out_dtype: torch.dtype,
) -> torch.Tensor:
    return dequantize_fwd(data, scale, zero_point, shape, block, out_dtype)


@_dequantize_op.register_fake
def _(data, scale, zero_point, shape, block, out_dtype):
    return data.new_empty(shape, dtype=out_dtype)


call_quantize = eager_direct(_quantize_op)


call_quantize_with_scale = eager_direct(_quantize_with_scale_op)


call_dequantize = eager_direct(_dequantize_op)


E4M3, E5M2 = "float8_e4m3fn", "float8_e5m2"


SCALINGS = ("tensorwise", "rowwise")


def _q(x: torch.Tensor, fmt: str, block: list[int], pow2: bool, layout: str):
    data, data_t, scale, _, _ = call_quantize(x, fmt, block, pow2, False, layout)
    return data, data_t, scale


class Float8LinearFunction(torch.autograd.Function):
    """``x2 @ weight.T + bias`` with FP8 GEMMs forward and backward (see the module docstring)."""

    @staticmethod
    def forward(ctx, x2, weight, bias, rowwise: bool):
        m, k = x2.shape
        n = weight.shape[0]
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        b = bias.to(x2.dtype) if bias is not None else None
        if rowwise:
            xd, _, xs = _q(x2, E4M3, [1, k], True, "row")
            wd, _, ws = _q(weight, E4M3, [1, k], True, "row")
            y = scaled_matmul(xd, wd.t(), xs, ws.reshape(1, n), x2.dtype, b)
            saved = [weight]
            if need_dw:  # x per column (over the tokens) for dW = dY^T x
                xcd, _, xcs = _q(x2, E4M3, [m, 1], True, "col")
                saved += [xcd, xcs]
        else:
            xd, xt, xs = _q(x2, E4M3, [m, k], False, "both" if need_dw else "row")
            wd, wt, ws = _q(weight, E4M3, [n, k], False, "both" if need_dx else "row")
            y = scaled_matmul(xd, wd.t(), xs, ws, x2.dtype, b)
            saved = [xt, xs, wt, ws]
        ctx.save_for_backward(*saved)
        ctx.rowwise = rowwise
        ctx.has_bias = bias is not None
        ctx.weight_dtype = weight.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        dx = dw = db = None
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dy = dy.contiguous()
        m, n = dy.shape
        if ctx.rowwise:
            weight, *xcol = ctx.saved_tensors
            weight.shape[1]
            if need_dx:
                gd, _, gs = _q(dy, E4M3, [1, n], True, "row")
                wcd, _, wcs = _q(weight, E4M3, [n, 1], True, "col")
                dx = scaled_matmul(gd, wcd, gs, wcs, dy.dtype)
            if need_dw:
                xcd, xcs = xcol
                gcd, _, gcs = _q(dy, E4M3, [m, 1], True, "col")
                dw = scaled_matmul(gcd.t(), xcd, gcs.reshape(n, 1), xcs, ctx.weight_dtype)
        else:
            xt, xs, wt, ws = ctx.saved_tensors
            gd, gt, gs = _q(dy, E5M2, [m, n], False, "both" if need_dw else "row")
            if need_dx:
                dx = scaled_matmul(gd, wt.t(), gs, ws, dy.dtype)
            if need_dw:
                dw = scaled_matmul(gt, xt.t(), gs, xs, ctx.weight_dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy.sum(0)
        return dx, dw, db, None


def float8_weight(weight: torch.Tensor, scaling: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scale) of ``weight`` as Float8Linear's forward GEMM reads it: e4m3 codes, (N, K)
    row-major, with one scale (tensorwise) or a power-of-two scale per row (rowwise, (N, 1))."""
    n, k = weight.shape
    if scaling == "rowwise":
        wd, _, ws = _q(weight, E4M3, [1, k], True, "row")
    else:
        wd, _, ws = _q(weight, E4M3, [n, k], False, "row")
    return wd, ws


class Float8InferenceFunction(torch.autograd.Function):
    """Float8Linear's forward with the weight already cast (``float8_weight``): x cast in one
    pass, then one FP8 GEMM; the same kernels and arguments as ``Float8LinearFunction``'s
    forward, so the same output. Only for calls no gradient follows (``registry.apply`` runs
    its forward alone there, or replays it)."""

    @staticmethod
    def forward(ctx, x2, wd, ws, bias, rowwise: bool):
        m, k = x2.shape
        n = wd.shape[0]
        b = bias.to(x2.dtype) if bias is not None else None
        if rowwise:
            xd, _, xs = _q(x2, E4M3, [1, k], True, "row")
            return call_scaled_matmul(xd, wd.t(), xs, ws.reshape(1, n), b, x2.dtype)
        xd, _, xs = _q(x2, E4M3, [m, k], False, "row")
        return call_scaled_matmul(xd, wd.t(), xs, ws, b, x2.dtype)

    @staticmethod
    def backward(ctx, dy):
        raise RuntimeError(
            "tritonkit.nn.Float8Linear: the cached-weight forward has no backward (it runs only "
            "where no gradient follows)"
        )


def float8_linear_inference(
    x: torch.Tensor, wd: torch.Tensor, ws: torch.Tensor, bias: torch.Tensor | None, scaling: str
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` in FP8 with the weight's codes and scale given
    (``float8_weight``), where no gradient follows (checked by the caller: Float8Linear)."""
    x2 = x.reshape(-1, x.shape[-1])
    y = apply(Float8InferenceFunction, x2, wd, ws, bias, scaling == "rowwise")
    return y.reshape(*x.shape[:-1], wd.shape[0])


def float8_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, scaling: str
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with FP8 GEMMs forward and backward (checked by the caller:
    Float8Linear)."""
    x2 = x.reshape(-1, x.shape[-1])
    y = apply(Float8LinearFunction, x2, weight, bias, scaling == "rowwise")
    return y.reshape(*x.shape[:-1], weight.shape[0])


def int8_linear_w8a8(
    x: torch.Tensor,
    w_int8: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    x_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """W8A8: x quantized to int8 per token (or with the static per-tensor ``x_scale``), the
    int32 GEMM with both scales applied in its epilogue, then the bias (int8_matmul has no bias
    epilogue: one elementwise add)."""
    x2 = x.reshape(-1, x.shape[-1])
    m, k = x2.shape
    n = w_int8.shape[0]
    if x_scale is None:
        xd, _, xs = _q(x2, "int8", [1, k], False, "row")
    else:
        xd, _, xs, _ = call_quantize_with_scale(
            x2, x_scale.reshape(1, 1), "int8", [m, k], "scale", False, "row"
        )
    y = int8_matmul(xd, w_int8.t(), xs, w_scale.reshape(1, n), x2.dtype)
    if bias is not None:
        y += bias
    return y.reshape(*x.shape[:-1], n)


class WeightOnlyFunction(torch.autograd.Function):
    """The weight-only int8 GEMM as a Function, so that ``registry.apply`` can run (and replay)
    its forward alone; only for calls no gradient follows (the GEMM has no derivative)."""

    @staticmethod
    def forward(ctx, x2, w_int8, w_scale, bias):
        return call_weight_only(x2, w_int8, w_scale, bias)

    @staticmethod
    def backward(ctx, dy):
        raise RuntimeError("tritonkit.nn.Int8Linear: the int8 weight-only GEMM has no backward")


def int8_linear_weight_only(
    x: torch.Tensor, w_int8: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """Weight-only int8: ``x @ (w_int8 * w_scale).T + bias`` with W read as int8; ``w_scale``
    (N,) or (N, 1)."""
    if torch.is_grad_enabled() and (
        x.requires_grad or (bias is not None and bias.requires_grad)
    ):  # the op refuses a gradient, as it always did
        x2 = x.reshape(-1, x.shape[-1])
        y = call_weight_only(x2, w_int8, w_scale.reshape(-1), bias)
        return y.reshape(*x.shape[:-1], w_int8.shape[0])
    if x.dim() == 2:
        return apply(WeightOnlyFunction, x, w_int8, w_scale, bias)
    y = apply(WeightOnlyFunction, x.reshape(-1, x.shape[-1]), w_int8, w_scale, bias)
    return y.reshape(*x.shape[:-1], w_int8.shape[0])
