"""Input validation shared by every launcher.

Everything here works on tensor metadata only (shape, stride, dtype, device), so the same
checks run on real tensors in eager mode and on fake tensors while torch.compile traces. Each
error names the operator, the argument, what was expected and what was given.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tritonkit.ops._core.device import interpreter_enabled

FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)


def _dtype_names(dtypes: Sequence[torch.dtype]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_tensor(
    op: str,
    name: str,
    t: object,
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
) -> torch.Tensor:
    """Check that ``t`` is a tensor of a supported dtype on a device our kernels can run on."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        got = str(t.dtype).removeprefix("torch.")
        raise TypeError(f"{op}: {name} must have dtype {_dtype_names(dtypes)}, got {got}")
    if t.device.type == "cuda":
        return t
    if t.device.type == "cpu" and interpreter_enabled():
        return t
    if t.device.type == "meta":  # shape propagation (fake tensors, meta tensors)
        return t
    hint = (
        " (CPU tensors run only under the Triton interpreter: set TRITON_INTERPRET=1 before "
        "importing tritonkit)"
        if t.device.type == "cpu"
        else ""
    )
    raise ValueError(f"{op}: {name} must be on a CUDA device, got device {t.device}{hint}")


def check_same_device(op: str, **tensors: torch.Tensor) -> None:
    names = list(tensors)
    first = names[0]
    for name in names[1:]:
        if tensors[name].device != tensors[first].device:
            raise ValueError(
                f"{op}: {name} must be on the same device as {first} "
                f"({tensors[first].device}), got {tensors[name].device}"
            )


def check_same_dtype(op: str, also_float32: bool = False, **tensors: torch.Tensor) -> None:
    """Every tensor in the first one's dtype (``also_float32``: the message says float32 is
    accepted too, where the caller allows it)."""
    names = list(tensors)
    first = names[0]
    for name in names[1:]:
        if tensors[name].dtype != tensors[first].dtype:
            raise TypeError(
                f"{op}: {name} must have the same dtype as {first} "
                f"({str(tensors[first].dtype).removeprefix('torch.')})"
                f"{' or float32' if also_float32 else ''}, "
                f"got {str(tensors[name].dtype).removeprefix('torch.')} "
                "(tritonkit does not promote dtypes; cast one operand first)"
            )


def check_same_shape(op: str, **tensors: torch.Tensor) -> None:
    names = list(tensors)
    first = names[0]
    for name in names[1:]:
        if tensors[name].shape != tensors[first].shape:
            raise ValueError(
                f"{op}: {name} must have the same shape as {first} "
                f"({tuple(tensors[first].shape)}), got {tuple(tensors[name].shape)}"
            )


def check_operand(
    op: str,
    name: str,
    t: object,
    ref_name: str,
    ref: torch.Tensor,
    shape: Sequence[int] | None = None,
    shape_name: str = "",
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
    or_float32: bool = False,
) -> torch.Tensor:
    """A tensor used with ``ref``: supported, on ref's device, in ref's dtype (or float32 with
    ``or_float32``: parameters kept in float32 beside 16-bit activations, which the PyTorch
    function accepts too), and of ``shape`` when given (``shape_name`` says what that shape is,
    e.g. ``"(C,)"``)."""
    check_tensor(op, name, t, dtypes)
    check_same_device(op, **{ref_name: ref, name: t})
    if not (or_float32 and t.dtype == torch.float32):
        check_same_dtype(op, **{ref_name: ref, name: t}, also_float32=or_float32)
    if shape is not None and tuple(t.shape) != tuple(shape):
        named = f"{shape_name} = " if shape_name else ""
        raise ValueError(
            f"{op}: {name} must have shape {named}{tuple(shape)}, got {tuple(t.shape)}"
        )
    return t


def check_choice(op: str, name: str, value: object, choices: Sequence[object]) -> None:
    if value not in choices:
        raise ValueError(f"{op}: {name} must be one of {list(choices)}, got {value!r}")
