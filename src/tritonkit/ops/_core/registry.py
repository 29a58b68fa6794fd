"""How an operator is registered with PyTorch and called: ``torch.library`` ops that
torch.compile traces as one node, and eager calls that skip the dispatcher where it adds
nothing."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from tritonkit.ops._core import internals, replay
from tritonkit.ops._core import launch as _launch


def _recording() -> bool:
    """Whether this thread is recording a call (replay.py), ``tritonkit.warmup`` runs calls
    launching nothing, or a first call's launches wait for their compiles (launch.pipelined)
    with nothing else on the dispatch stack: a dispatch mode of tritonkit's own watches the
    ops, and the call must take the path a plain eager call takes."""
    return (
        _launch.RECORDER.rec is not None
        or _launch.WARMUP.session is not None
        or (_launch.PIPE.mode is not None and internals.dispatch_stack_len() == 1)
    )


def _plain_eager() -> bool:
    """Eager mode with nothing watching the ops: not torch.compile's tracing (Dynamo, make_fx),
    no dispatch mode (FakeTensorMode, FlopCounterMode, ...), no functorch transform."""
    return _recording() or not (
        torch.compiler.is_compiling()
        or internals.dispatch_stack_len()
        or internals.functorch_stack() is not None
    )


_PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


def direct_call_allowed(args: tuple) -> bool:
    """Whether a call may skip the op (see Op) and run its launcher: plain eager, real tensors.

    The op is kept wherever something must see it as one op: outside plain eager mode
    (``_plain_eager``), under torch.profiler (its traces name each op), for tensor subclasses
    and meta tensors (their fake implementation), and for an input that needs a gradient under
    grad mode (the op's Autograd kernel then says it has no derivative; the derivatives live in
    each op's autograd.Function).
    """
    if not _plain_eager() or internals.profiler_enabled():
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
    (docs/performance.md). Here the schema is inferred
    from the launcher's annotations as custom_op infers it, the launcher is the op's
    CompositeExplicitAutograd kernel (every device), and the Autograd kernel only refuses an
    input that needs a gradient under grad mode, since the derivatives live in each op's
    autograd.Function, before passing the call on.
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
        below_autograd = internals.after_autograd_keyset

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
    does not take on the GPU. Where ``direct_call_allowed`` says the op adds nothing, the
    launcher runs directly: the same function the op runs, with the same arguments, so the
    results are the same.
    """
    launcher = op.launcher
    overload = op.overload

    def call(*args):
        if direct_call_allowed(args):
            return launcher(*args)
        return overload(*args)

    call.__name__ = call.__qualname__ = f"call_{launcher.__name__}"
    return call


def apply(function: type[torch.autograd.Function], *args):
    """``function.apply(*args)``; in plain eager calls, replayed from C++ where the call's
    metadata was seen before (replay.py), and where no input needs a gradient (grad mode off,
    or no tensor that requires one), its forward alone.

    Autograd's bookkeeping (the graph node, the ctx, the outputs' wrapping) costs host time
    on every call; with no gradient to come it keeps nothing, so inference skips it. The
    forward is the same code either way; it sees ``needs_input_grad`` all False, as it would
    under ``apply``.
    """
    if not _plain_eager():
        return function.apply(*args)
    if _launch.PIPE.pending:  # deferred launches go before a replayed call's
        _launch.flush()
    if _REPLAY and _launch.RECORDER.rec is None and not internals.profiler_enabled():
        out = replay.call(function, args)
        if out is replay.WITH_GRAD:
            return _python_path(function, args, True)
        if out is replay.FORWARD_ONLY:
            return _python_path(function, args, False)
        return out
    grad = torch.is_grad_enabled() and any(
        isinstance(a, torch.Tensor) and a.requires_grad for a in args
    )
    return _python_path(function, args, grad)


def _python_path(function: type[torch.autograd.Function], args: tuple, grad: bool):
    """``function.apply(*args)`` (``grad``) or its forward alone. Until a call of ``function``
    compiles nothing (its first calls), in a ``pipelined`` region: its kernels compile in
    parallel, and with ``grad`` so do its backward's (the backward runs in one too)."""
    if function.__dict__.get("_tk_warm") and not _launch.PIPE.every:
        if grad:
            return function.apply(*args)
        return function.forward(replay.NoGradContext(len(args)), *args)
    region = _launch.pipelined()
    with region:
        if grad:
            out = _launch.pipelined_class(function).apply(*args)
        else:
            out = function.forward(replay.NoGradContext(len(args)), *args)
    if region.opened and region.misses == 0:
        function._tk_warm = True
    return out


_REPLAY = replay.enabled()
