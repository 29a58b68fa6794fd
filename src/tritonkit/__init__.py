"""tritonkit: Triton GPU kernels that drop into PyTorch, and a workbench that holds them to account.

Functions (``tritonkit.gelu``, ``tritonkit.bias_act``, ...) and the public subpackages
(``tritonkit.nn``, ``tritonkit.optim``, ``tritonkit.quant``, ``tritonkit.functional``) are
imported on first use, so that ``import tritonkit`` stays cheap and the command line can turn
on Triton's CPU interpreter before any kernel is defined (``TRITON_INTERPRET`` is read when a
kernel is decorated). The functions are those of ``tritonkit.functional``, derived from the
families' ``__all__`` (``tritonkit.ops.FAMILIES``); ``tritonkit.__all__`` is resolved on first
use too.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# The public subpackages, reachable as attributes after ``import tritonkit``.
_SUBMODULES = ("functional", "nn", "optim", "quant", "sparse", "models", "fusion")
_FROM_MODELS = ("patch", "unpatch")  # tritonkit.models.patch / unpatch


def __getattr__(name: str):
    if name.startswith("_") and name != "__all__":  # probes (__wrapped__, ...): import nothing
        raise AttributeError(f"module 'tritonkit' has no attribute {name!r}")
    if name in _SUBMODULES:
        value = importlib.import_module(f"tritonkit.{name}")
    elif name in _FROM_MODELS:
        value = getattr(importlib.import_module("tritonkit.models"), name)
    elif name == "warmup":  # compile ahead what a model or calls will use (_warmup.py)
        value = importlib.import_module("tritonkit._warmup").warmup
    else:
        functional = importlib.import_module("tritonkit.functional")
        if name == "__all__":
            value = [*functional.__all__, *_SUBMODULES]
        elif name in functional.__all__:
            value = getattr(functional, name)
        else:
            raise AttributeError(f"module 'tritonkit' has no attribute {name!r}")
    # Kept as a module attribute, so that later lookups of tritonkit.<name> skip this hook (an
    # import_module call per lookup costs microseconds on every call of a small op).
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__getattr__("__all__")})
