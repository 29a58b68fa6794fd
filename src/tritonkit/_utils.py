"""Input validation, dtype helpers, layout helpers and device/interpreter detection.

Everything here works on tensor metadata only (shape, stride, dtype, device), so the same
checks run on real tensors in eager mode and on fake tensors while torch.compile traces.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)


def interpreter_enabled() -> bool:
    """True when Triton kernels run under the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


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


# ----------------------------------------------------------------------------------------------
# Calling a registered launcher
# ----------------------------------------------------------------------------------------------


def _plain_eager() -> bool:
    """Eager mode with nothing watching the ops: not torch.compile's tracing (Dynamo, make_fx),
    no dispatch mode (FakeTensorMode, FlopCounterMode, ...), no functorch transform."""
    return not (
        torch.compiler.is_compiling()
        or torch._C._len_torch_dispatch_stack()
        or torch._C._functorch.peek_interpreter_stack() is not None
    )


_PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


def _direct_call_allowed(args: tuple) -> bool:
    """Whether a call may skip the op (see Op) and run its launcher: plain eager, real tensors.

    The op is kept wherever something must see it as one op: outside plain eager mode
    (``_plain_eager``), under torch.profiler (its traces name each op), for tensor subclasses
    and meta tensors (their fake implementation), and for an input that needs a gradient under
    grad mode (the op's Autograd kernel then says it has no derivative; the derivatives live in
    each op's autograd.Function).
    """
    if not _plain_eager() or torch.autograd._profiler_enabled():
        return False
    grad = torch.is_grad_enabled()
    for a in args:
        if isinstance(a, torch.Tensor):
            if type(a) not in _PLAIN_TENSOR_TYPES or a.device.type == "meta":
                return False
            if grad and a.requires_grad:
                return False
    return True


_LIBRARIES: dict[str, torch.library.Library] = {}


class Op:
    """A ``torch.library`` operator whose launcher the dispatcher reaches through one small
    Autograd kernel.

    ``torch.library.custom_op`` wraps an implementation in Python layers (its Autograd kernel,
    Dynamo's disable wrappers, an alias check) that cost tens of microseconds on every call
    from a torch.compile'd graph, where small tritonkit ops then cost twice their eager time
    (run 133). Here the schema is inferred from the launcher's annotations as custom_op
    infers it, the launcher is the op's CompositeExplicitAutograd kernel (every device), and
    the Autograd kernel only refuses an input that needs a gradient under grad mode, since the
    derivatives live in each op's autograd.Function, before passing the call on.
    """

    def __init__(self, qualname: str, launcher: Callable) -> None:
        namespace, name = qualname.split("::")
        lib = _LIBRARIES.get(namespace)
        if lib is None:
            lib = _LIBRARIES[namespace] = torch.library.Library(namespace, "FRAGMENT")
        schema = torch.library.infer_schema(launcher, mutates_args=())
        lib.define(name + schema, tags=(torch.Tag.pt2_compliant_tag,))
        lib.impl(name, launcher, "CompositeExplicitAutograd")
        self.qualname, self.launcher, self._lib = qualname, launcher, lib
        self.overload = overload = getattr(getattr(torch.ops, namespace), name).default
        below_autograd = torch._C._after_autograd_keyset

        def autograd_kernel(keyset, *args):
            if torch.is_grad_enabled() and any(
                isinstance(a, torch.Tensor) and a.requires_grad for a in args
            ):
                raise RuntimeError(
                    f"{qualname} has no derivative of its own: call it through its tritonkit "
                    "function, whose autograd.Function carries the backward"
                )
            return overload.redispatch(keyset & below_autograd, *args)

        lib.impl(name, autograd_kernel, "Autograd", with_keyset=True)

    def register_fake(self, fake: Callable) -> Callable:
        """Register ``fake`` (shapes, strides and dtypes of the outputs from the inputs') for
        FakeTensor and meta tensors; usable as a decorator."""
        torch.library.register_fake(self.qualname, fake, lib=self._lib)
        return fake


def define_op(qualname: str) -> Callable[[Callable], Op]:
    """Decorator: the launcher below becomes the operator ``qualname`` (see :class:`Op`)."""
    return functools.partial(Op, qualname)


def eager_direct(op: Op) -> Callable:
    """A caller of ``op`` that runs its launcher directly in plain eager calls.

    torch.compile needs the op (it traces each call as one graph node), but in eager mode its
    dispatch (the dispatcher and the Autograd kernel) costs host time that a small kernel
    does not take on the GPU. Where ``_direct_call_allowed`` says the op adds nothing, the
    launcher runs directly: the same function the op runs, with the same arguments, so the
    results are the same.
    """
    launcher = op.launcher
    overload = op.overload

    def call(*args):
        if _direct_call_allowed(args):
            return launcher(*args)
        return overload(*args)

    call.__name__ = call.__qualname__ = f"call_{launcher.__name__}"
    return call


class _NoGradContext:
    """An autograd.Function's ctx for a forward run without autograd: nothing to keep."""

    def __init__(self, n_inputs: int) -> None:
        self.needs_input_grad = (False,) * n_inputs

    def save_for_backward(self, *tensors: torch.Tensor | None) -> None:
        pass

    def set_materialize_grads(self, value: bool) -> None:
        pass


def apply(function: type[torch.autograd.Function], *args):
    """``function.apply(*args)``; in plain eager calls where no input needs a gradient (grad mode
    off, or no tensor that requires one), its forward alone.

    Autograd's bookkeeping (the graph node, the ctx, the outputs' wrapping) costs host time
    on every call; with no gradient to come it keeps nothing, so inference skips it. The
    forward is the same code either way; it sees ``needs_input_grad`` all False, as it would
    under ``apply``.
    """
    if _plain_eager() and not (
        torch.is_grad_enabled()
        and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
    ):
        return function.forward(_NoGradContext(len(args)), *args)
    return function.apply(*args)


# ----------------------------------------------------------------------------------------------
# Layout: how a launcher walks a tensor's memory without copying it.
# ----------------------------------------------------------------------------------------------


def is_dense(t: torch.Tensor) -> bool:
    """True when t's elements fill exactly ``numel`` consecutive slots of memory in some order.

    Such a tensor (contiguous, or a permutation of a contiguous one such as ``x.t()``) can be
    processed elementwise in storage order, and ``torch.empty_like`` gives an output with the
    same strides, which is what PyTorch's own elementwise ops return.
    """
    if t.is_contiguous():  # the common case, answered without sorting
        return True
    expected = 1
    for size, stride in sorted(
        ((s, st) for s, st in zip(t.shape, t.stride()) if s != 1), key=lambda p: p[1]
    ):
        if stride != expected:
            return False
        expected *= size
    return True


@dataclass(frozen=True)
class Rows:
    """A tensor seen as ``n_rows`` rows of ``n_cols`` unit-stride elements, ``stride_row`` apart."""

    tensor: torch.Tensor
    n_rows: int
    n_cols: int
    stride_row: int


def flat_rows(t: torch.Tensor) -> Rows:
    """A dense tensor as a single row in storage order."""
    n = t.numel()
    return Rows(t, 1, n, max(n, 1))


def row_view(t: torch.Tensor, n_cols: int) -> Rows | None:
    """View t (in logical row-major order) as rows of ``n_cols`` unit-stride elements, or None.

    None means the layout has no such view (for example a slice along a middle dimension);
    the caller then decides whether to copy.
    """
    if t.numel() == 0:  # nothing to walk; any view will do
        return Rows(t, 0, n_cols, max(n_cols, 1))
    if n_cols == 0 or t.numel() % n_cols:
        return None
    try:
        v = t.view(-1, n_cols)
    except RuntimeError:
        return None
    if n_cols > 1 and v.stride(1) != 1:
        return None
    n_rows = v.shape[0]
    stride_row = v.stride(0) if n_rows > 1 else n_cols
    return Rows(t, n_rows, n_cols, stride_row)


class _LayoutCopies:
    """Counts inputs that a launcher had to copy because no strided view of them exists.

    Reports print the count so that a copy never hides inside a timing.
    """

    def __init__(self) -> None:
        self.count = 0

    def reset(self) -> int:
        n, self.count = self.count, 0
        return n


LAYOUT_COPIES = _LayoutCopies()


def as_rows(tensors: Sequence[torch.Tensor], n_cols: int) -> list[Rows]:
    """Views of same-shaped tensors as rows of ``n_cols``; an input with no such view is copied."""
    views = []
    for t in tensors:
        r = row_view(t, n_cols)
        if r is None:
            LAYOUT_COPIES.count += 1
            r = row_view(t.contiguous(), n_cols)
            assert r is not None  # a contiguous tensor always has a row view
        views.append(r)
    return views


def elementwise_output(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """A new output for an elementwise op over same-shaped inputs, laid out as PyTorch would.

    Dense inputs with identical strides give an output with those strides (``x.t()`` in,
    ``y.t()``-shaped memory out); anything else gives a contiguous output.
    """
    first = inputs[0]
    if all(is_dense(t) and t.stride() == first.stride() for t in inputs):
        return torch.empty_like(first)
    return torch.empty(first.shape, dtype=first.dtype, device=first.device)


def elementwise_rows(
    inputs: Sequence[torch.Tensor], n_outputs: int = 1
) -> tuple[list[Rows], list[Rows]]:
    """Plan an elementwise pass over same-shaped tensors: row views of the inputs and new outputs.

    Dense inputs with identical strides are walked flat, in storage order; anything else is
    walked as rows of the last dimension (an input with no such view is copied).
    """
    first = inputs[0]
    outs = [elementwise_output(inputs) for _ in range(n_outputs)]
    if all(is_dense(t) and t.stride() == first.stride() for t in inputs):
        return [flat_rows(t) for t in inputs], [flat_rows(o) for o in outs]
    n_cols = first.shape[-1] if first.dim() else 1
    return as_rows(inputs, n_cols), as_rows(outs, n_cols)


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def prod(xs: Sequence[int]) -> int:
    return math.prod(xs)


@functools.cache
def shared_memory_per_block(device: torch.device) -> int:
    """Bytes of shared memory one program may take on a CUDA device (the opt-in limit: 227 KiB
    on H100/H200, 163 KiB on A100, 99 KiB on Ada); unbounded under the interpreter."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return getattr(props, "shared_memory_per_block_optin", 49152)
    return 1 << 30


@functools.cache
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; a small stand-in under the interpreter."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4
