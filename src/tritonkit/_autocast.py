"""torch.autocast for tritonkit's functions: the casts PyTorch makes for the functions they
replace.

Autocast does not know tritonkit's custom ops, so each public function whose PyTorch
counterpart autocast casts applies the same policy itself, before its checks: matmul and
linear run in the autocast dtype ("lower precision"); softmax, log_softmax and layer_norm run
in float32 on CUDA; cross_entropy returns a float32 loss. Each public function declares its
policy beside its definition (``@policy``), following PyTorch's lists
(aten/src/ATen/autocast_mode.cpp). Functions PyTorch does not cast under autocast (the
elementwise family, rms_norm) are not cast here either; the fused residual norms have no
PyTorch counterpart and follow their inputs' dtypes.
"""

from __future__ import annotations

import torch

LOWER = "lower"  # the autocast dtype (float16 or bfloat16, as the autocast context says)
FP32 = "fp32"

# By device type, the policy of each tritonkit function that has one, by the function's name.
# Filled by ``policy`` where each public function is defined.
POLICY: dict[str, dict[str, str]] = {"cuda": {}, "cpu": {}}


def policy(cuda: str | None = None, cpu: str | None = None, names: tuple[str, ...] = ()):
    """Decorator: declare, beside a public function, the cast torch.autocast makes on each device
    type for the PyTorch function it replaces (``LOWER`` or ``FP32``); ``names`` adds other
    names the function's body looks the policy up by (log_softmax's shared body, say). The
    function is returned unchanged: its body calls ``autocast_dtype`` with its own name."""

    def declare(fn):
        for device_type, p in (("cuda", cuda), ("cpu", cpu)):
            if p is not None:
                for name in (fn.__name__, *names):
                    POLICY[device_type][name] = p
        return fn

    return declare


# Autocast casts floating tensors of these dtypes only (float64 is left as it is).
_CASTABLE = (torch.float16, torch.bfloat16, torch.float32)


def autocast_dtype(op: str, t: object) -> torch.dtype | None:
    """The dtype autocast runs ``op`` in for tensor ``t``'s device, or None where autocast is off
    there or does not cast ``op``."""
    if not isinstance(t, torch.Tensor):
        return None
    device_type = t.device.type
    policy = POLICY.get(device_type, {}).get(op)
    if policy is None or not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type) if policy == LOWER else torch.float32


def cast(dtype: torch.dtype | None, *tensors: object) -> tuple:
    """Each castable floating tensor in ``dtype`` (``autocast_dtype``'s answer); with None,
    or for anything else, as given."""
    return tuple(
        t.to(dtype)
        if dtype is not None
        and isinstance(t, torch.Tensor)
        and t.dtype in _CASTABLE
        and t.dtype != dtype
        else t
        for t in tensors
    )
