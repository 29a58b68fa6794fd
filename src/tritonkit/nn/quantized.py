"""Quantized ``nn.Linear`` replacements: ``Float8Linear`` (training with FP8 GEMMs) and
``Int8Linear`` (inference: W8A8 or weight-only int8)."""

from __future__ import annotations

import weakref

import torch
from torch import nn

from tritonkit.ops._core.plan import arg_facts, validated
from tritonkit.ops._core.validate import check_choice, check_operand, check_tensor
from tritonkit.ops.quant.function import (
    SCALINGS,
    float8_linear,
    float8_linear_inference,
    float8_weight,
    int8_linear_w8a8,
    int8_linear_weight_only,
)
from tritonkit.quant.tensor import quantize

INT8_MODES = ("w8a8", "weight_only")


def _check_input(op: str, x: object, weight: torch.Tensor) -> torch.Tensor:
    x = check_tensor(op, "x", x)
    if x.dim() == 0 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"{op}: x.shape[-1] must equal in_features = {weight.shape[1]}, got shape "
            f"{tuple(x.shape)}"
        )
    return x


_F8 = "tritonkit.nn.Float8Linear"
_I8 = "tritonkit.nn.Int8Linear"


def _check_float8(x, weight, bias) -> bool:
    _check_input(_F8, x, weight)
    check_tensor(_F8, "weight", weight)
    if bias is not None:
        check_tensor(_F8, "bias", bias)
    return True


def _check_int8(x, weight, bias) -> bool:
    x = _check_input(_I8, x, weight)
    if bias is not None:
        check_operand(_I8, "bias", bias, "x", x)
    return True


class Float8Linear(nn.Linear):
    """``nn.Linear`` whose forward and backward GEMMs run in FP8 (torchao's float8 training):
    x, W and the output gradient are cast to float8 with dynamic scales per tensor
    ("tensorwise") or per row of each GEMM operand ("rowwise"); the weight and its gradient
    stay in the parameter's dtype. The output is in x's dtype (the autocast dtype under
    ``torch.autocast``).

    Where no gradient follows (``torch.no_grad()``, inference), the weight's float8 codes and
    scale are kept from one call to the next (half the weight's bytes again, in FP8) and cast
    again only when the weight changes: another tensor, an in-place update (an optimizer step:
    PyTorch counts it in the tensor's version), or a call of ``train()`` / ``eval()``. A
    forward with gradients casts the weight itself, as training needs.

    Args:
        in_features, out_features, bias, device, dtype: as ``nn.Linear``.
        scaling: "tensorwise" or "rowwise".
    """

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None,
                 scaling: str = "tensorwise") -> None:  # fmt: skip
        check_choice("tritonkit.nn.Float8Linear", "scaling", scaling, SCALINGS)
        super().__init__(in_features, out_features, bias, device, dtype)
        self.scaling = scaling

    @classmethod
    def from_float(cls, linear: nn.Linear, scaling: str = "tensorwise") -> Float8Linear:
        """A Float8Linear sharing ``linear``'s parameters."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        check_choice("tritonkit.nn.Float8Linear", "scaling", scaling, SCALINGS)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight, new.bias, new.scaling = linear.weight, linear.bias, scaling
        return new

    def _weight_codes(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The weight's (codes, scale) for a forward no gradient follows: kept while the weight
        is the same tensor (same storage) at the same version; None where the weight cannot be
        told apart from its later values (an inference tensor has no version counter)."""
        w = self.weight
        if w.is_inference():
            return None
        key = (w.data_ptr(), w._version, w.dtype, w.shape, w.device, self.scaling)
        cached = self.__dict__.get("_fp8_weight")
        if cached is not None and cached[0]() is w and cached[1] == key:
            return cached[2]
        codes = float8_weight(w.detach(), self.scaling)
        self.__dict__["_fp8_weight"] = (weakref.ref(w), key, codes)
        return codes

    def train(self, mode: bool = True) -> Float8Linear:
        # A switch between training and evaluation forgets the cached codes: an update that
        # PyTorch's version counter does not see (a kernel writing the weight in place outside
        # ATen) cannot outlive it.
        self.__dict__.pop("_fp8_weight", None)
        return super().train(mode)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled(x.device.type):
            x = x.to(torch.get_autocast_dtype(x.device.type))
        weight, bias = self.weight, self.bias
        validated(_F8, arg_facts(x, weight, bias), lambda: _check_float8(x, weight, bias))
        grad = torch.is_grad_enabled() and (
            x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
        )
        if not grad and not torch.compiler.is_compiling():
            codes = self._weight_codes()
            if codes is not None:
                return float8_linear_inference(x, *codes, bias, self.scaling)
        return float8_linear(x, weight, bias, self.scaling)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, scaling={self.scaling}"


class Int8Linear(nn.Module):
    """Inference ``nn.Linear`` with an int8 weight (one symmetric scale per output channel).

    mode "w8a8": x is quantized to int8 per token at run time (or with a static per-tensor
    scale from calibration, ``input_scale``) and the GEMM runs on int8 tensor cores
    (``tritonkit.int8_matmul``, scales in its epilogue). mode "weight_only": x stays in its
    dtype and the int8 weight is widened in registers (half the bytes of a bf16 weight read:
    the decode case).

    Build one from a trained layer with ``Int8Linear.from_float(linear, mode)``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 mode: str = "w8a8", device=None, dtype=torch.bfloat16) -> None:  # fmt: skip
        super().__init__()
        check_choice("tritonkit.nn.Int8Linear", "mode", mode, INT8_MODES)
        self.in_features, self.out_features, self.mode = in_features, out_features, mode
        self.register_buffer(
            "weight_int8", torch.zeros(out_features, in_features, dtype=torch.int8, device=device)
        )
        self.register_buffer("weight_scale", torch.ones(out_features, 1, device=device))
        self.register_buffer("input_scale", None)
        self.bias = (
            nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype), requires_grad=False)
            if bias
            else None
        )

    @classmethod
    def from_float(cls, linear: nn.Linear, mode: str = "w8a8") -> Int8Linear:
        """Quantize ``linear``'s weight per output channel (int8, symmetric)."""
        w = linear.weight.detach()
        new = cls(linear.in_features, linear.out_features, linear.bias is not None, mode,
                  w.device, w.dtype)  # fmt: skip
        q = quantize(w, torch.int8, "row")
        new.weight_int8.copy_(q.data)
        new.weight_scale.copy_(q.scale)
        if linear.bias is not None:
            new.bias.data = linear.bias.detach().clone()
        return new

    def set_input_scale(self, scale: torch.Tensor | float | None) -> None:
        """A static per-tensor dequantization scale for x (W8A8), e.g. from ``calibrate``."""
        if scale is not None:
            scale = torch.as_tensor(scale, dtype=torch.float32, device=self.weight_int8.device)
            scale = scale.reshape(1, 1)
        self.input_scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, bias = self.weight_int8, self.bias
        validated(_I8, arg_facts(x, w, bias), lambda: _check_int8(x, w, bias))
        if self.mode == "weight_only":
            return int8_linear_weight_only(x, w, self.weight_scale, bias)
        return int8_linear_w8a8(x, w, self.weight_scale, bias, self.input_scale)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, mode={self.mode}, "
            f"static_input_scale={self.input_scale is not None}"
        )
