"""Quantization: ``quantize`` / ``dequantize`` (int8, int4, float8 at every granularity), scaling
recipes with state, choosers, error metrics, ``convert`` for models and calibration.

Submodules are imported on first use (``tritonkit.quant.recipes``, ``.choose``, ``.metrics``,
``.convert``); the names below are available from ``tritonkit.quant`` directly.
"""

from __future__ import annotations

import importlib

from tritonkit.quant.tensor import GRANULARITIES, QuantizedTensor, dequantize, quantize

_LAZY = {
    "AmaxMonitor": "recipes",
    "DelayedScaling": "recipes",
    "DynamicScaling": "recipes",
    "EMAScaling": "recipes",
    "GroupScaler": "recipes",
    "PerChannelScaler": "recipes",
    "choose_bits": "choose",
    "choose_format": "choose",
    "choose_formats": "choose",
    "choose_group_size": "choose",
    "error_stats": "metrics",
    "sqnr_db": "metrics",
    "percentiles": "metrics",
    "convert": "model",
    "calibrate": "model",
}
__all__ = ["GRANULARITIES", "QuantizedTensor", "dequantize", "quantize", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"tritonkit.quant.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tritonkit.quant' has no attribute {name!r}")
