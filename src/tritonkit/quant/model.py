"""Swap a model's ``nn.Linear`` modules for quantized ones, and calibrate static activation
scales over a data loader (seed 000's calibrate_quantization)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from tritonkit.nn.quantized import Float8Linear, Int8Linear

# recipe name -> (module class, its option)
RECIPES: dict[str, tuple[type, str]] = {
    "float8_tensorwise": (Float8Linear, "tensorwise"),
    "float8_rowwise": (Float8Linear, "rowwise"),
    "int8_w8a8": (Int8Linear, "w8a8"),
    "int8_weight_only": (Int8Linear, "weight_only"),
}

Filter = Callable[[str, nn.Module], bool]


def _swap(linear: nn.Linear, recipe: str) -> nn.Module:
    cls, option = RECIPES[recipe]
    return cls.from_float(linear, option)


def convert(model: nn.Module, recipe: str, filter: Filter | None = None) -> nn.Module:
    """Replace (in place) every ``nn.Linear`` of ``model`` that ``filter(name, module)`` accepts
    with its quantized version, and return the model.

    Args:
        model: any module; nn.Linear subclasses that are already quantized are left alone.
        recipe: "float8_tensorwise", "float8_rowwise" (training: Float8Linear sharing the
            original parameters), "int8_w8a8" or "int8_weight_only" (inference: Int8Linear,
            the weight quantized per output channel now).
        filter: which layers to convert (default: all); e.g. skip the output head with
            ``lambda name, m: name != "lm_head"``.
    """
    if recipe not in RECIPES:
        raise ValueError(
            f"tritonkit.quant.convert: recipe must be one of {list(RECIPES)}, got {recipe!r}"
        )
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is nn.Linear and (filter is None or filter(full, child)):
                setattr(module, child_name, _swap(child, recipe))
    return model


def _first_tensor(batch: Any) -> Any:
    if isinstance(batch, (tuple, list)):
        return batch[0]
    if isinstance(batch, dict):
        return next(iter(batch.values()))
    return batch


def calibrate(
    model: nn.Module,
    data: Iterable[Any],
    num_batches: int | None = None,
    apply: bool = True,
) -> dict[str, dict[str, float]]:
    """Run ``model`` over batches of ``data`` (tensors, or tuples/dicts whose first entry is the
    input) and record every Int8Linear's input range; with ``apply``, set each W8A8 layer's
    static per-tensor input scale to ``amax / 127`` as the kernels round it
    (``1 / (127 / amax)`` in float32), so that its forward skips the per-token amax.

    Returns {layer name: {"min", "max", "amax", "scale"}}.
    """
    layers = {n: m for n, m in model.named_modules() if isinstance(m, Int8Linear)}
    ranges: dict[str, list[torch.Tensor]] = {}
    hooks = []
    for name, layer in layers.items():
        layer.set_input_scale(None)

        def record(mod, inputs, name=name):
            x = inputs[0].detach().float()
            lo, hi = x.amin().reshape(1), x.amax().reshape(1)
            if name in ranges:
                ranges[name] = [
                    torch.minimum(ranges[name][0], lo),
                    torch.maximum(ranges[name][1], hi),
                ]
            else:
                ranges[name] = [lo, hi]

        hooks.append(layer.register_forward_pre_hook(record))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for i, batch in enumerate(data):
                if num_batches is not None and i >= num_batches:
                    break
                model(_first_tensor(batch))
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    out: dict[str, dict[str, float]] = {}
    for name, (lo, hi) in ranges.items():
        amax = torch.maximum(-lo, hi).clamp(min=1e-12)
        qscale = (torch.tensor(127.0, device=amax.device) / amax).float()
        scale = (1.0 / qscale).float()
        if apply and layers[name].mode == "w8a8":
            layers[name].set_input_scale(scale)
        out[name] = {"min": float(lo), "max": float(hi), "amax": float(amax), "scale": float(scale)}
    return out
