"""tritonkit: Triton GPU kernels that drop into PyTorch, and a workbench that holds them to account.

Functions (``tritonkit.gelu``, ``tritonkit.bias_act``, ...) and modules (``tritonkit.nn``) are
imported on first use, so that ``import tritonkit`` stays cheap and the command line can turn
on Triton's CPU interpreter before any kernel is defined (``TRITON_INTERPRET`` is read when a
kernel is decorated).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_FUNCTIONS = (
    "add",
    "add_layer_norm",
    "add_rms_norm",
    "attention",
    "attention_varlen",
    "bias_act",
    "copy",
    "cross_entropy",
    "geglu",
    "gelu",
    "int8_matmul",
    "layer_norm",
    "linear",
    "log_softmax",
    "matmul",
    "relu",
    "rms_norm",
    "scaled_matmul",
    "silu",
    "softmax",
    "swiglu",
    "transpose",
)
__all__ = [*_FUNCTIONS, "functional", "nn"]

if TYPE_CHECKING:
    from tritonkit import functional as functional
    from tritonkit import nn as nn
    from tritonkit.functional import add as add
    from tritonkit.functional import add_layer_norm as add_layer_norm
    from tritonkit.functional import add_rms_norm as add_rms_norm
    from tritonkit.functional import attention as attention
    from tritonkit.functional import attention_varlen as attention_varlen
    from tritonkit.functional import bias_act as bias_act
    from tritonkit.functional import copy as copy
    from tritonkit.functional import cross_entropy as cross_entropy
    from tritonkit.functional import geglu as geglu
    from tritonkit.functional import gelu as gelu
    from tritonkit.functional import int8_matmul as int8_matmul
    from tritonkit.functional import layer_norm as layer_norm
    from tritonkit.functional import linear as linear
    from tritonkit.functional import log_softmax as log_softmax
    from tritonkit.functional import matmul as matmul
    from tritonkit.functional import relu as relu
    from tritonkit.functional import rms_norm as rms_norm
    from tritonkit.functional import scaled_matmul as scaled_matmul
    from tritonkit.functional import silu as silu
    from tritonkit.functional import softmax as softmax
    from tritonkit.functional import swiglu as swiglu
    from tritonkit.functional import transpose as transpose


def __getattr__(name: str):
    if name in _FUNCTIONS:
        value = getattr(importlib.import_module("tritonkit.functional"), name)
    elif name in ("functional", "nn"):
        value = importlib.import_module(f"tritonkit.{name}")
    else:
        raise AttributeError(f"module 'tritonkit' has no attribute {name!r}")
    # Kept as a module attribute, so that later lookups of tritonkit.<name> skip this hook (an
    # import_module call per lookup costs microseconds on every call of a small op).
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
