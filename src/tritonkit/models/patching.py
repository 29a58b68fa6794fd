"""``patch(model)`` and ``unpatch(model)``: a model's modules run tritonkit's kernels, in place.

A patch never replaces a module object or a parameter: it sets instance attributes of the
model's own modules (a ``forward``; for attention, a copy of the config with another attention
implementation), so ``state_dict``, optimizers, hooks and ``.to()`` see the same model. It
changes nothing that another model shares: no class, no module-level function, no config
object two models hold (two models built from one config stay independent). Everything it
sets is recorded on the model and put back by ``unpatch``; a patched model that is garbage
collected leaves nothing to undo. Which modules are patched, how, and which are left alone
(and why) is in the returned :class:`PatchReport`.
"""

from __future__ import annotations

import contextlib
import itertools
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

_MISSING = object()
_RECORD = "_tritonkit_patch"

ATTENTION_CHOICES = ("sdpa", "sdpa_repeat_kv", "tritonkit", "keep")
LOGITS_CHOICES = ("eval", "always", "never")


@dataclass(frozen=True)
class PatchOptions:
    """What ``patch`` may replace (every switch on by default).

    Args:
        norms: RMSNorm and LayerNorm modules.
        residual: a block's residual add fused into the norm that follows it.
        mlp: gated MLPs (SwiGLU, GeGLU) and activation modules.
        attention: ``"sdpa"`` (PyTorch's SDPA; on a CUDA GPU with the fastest backend first:
            cuDNN, then flash), ``"sdpa_repeat_kv"`` (the same with K/V repeated to the query
            heads, for a backend without grouped-query support), ``"tritonkit"``
            (tritonkit.attention) or ``"keep"``.
        loss: a causal LM called with labels computes its loss with tritonkit's kernels
            (``logits`` says whether the logits are made).
        logits: what a causal LM called with labels returns as ``logits`` (with ``loss``):
            ``"eval"``: the logits in eval mode only; training runs the head's linear and the
            cross-entropy by chunks of rows without the logits in memory (``logits=None``),
            which saves the N x V logits, their gradient and the float32 copy that
            transformers' loss makes of them. ``"always"``: the logits in training too (the
            head's GEMM writes them and tritonkit's cross-entropy reads them without a float32
            copy): the memory of the logits and their gradient, as unpatched. ``"never"``:
            ``logits=None`` in eval mode too.
        rope: the rotary embedding through tritonkit's kernel, where it has one.
    """

    norms: bool = True
    residual: bool = True
    mlp: bool = True
    attention: str = "sdpa"
    loss: bool = True
    logits: str = "eval"
    rope: bool = True


@dataclass(frozen=True)
class Replaced:
    path: str  # the module's name in the model ("" for the model itself)
    kind: str  # its class
    what: str  # what now runs


@dataclass(frozen=True)
class Left:
    path: str
    kind: str
    reason: str


@dataclass
class PatchReport:
    """What ``patch`` replaced, what already ran tritonkit (modules of ``tritonkit.nn``), and
    what it left alone (with the reason)."""

    replaced: list[Replaced] = field(default_factory=list)
    left: list[Left] = field(default_factory=list)
    already: list[Left] = field(default_factory=list)

    def summary(self) -> dict[str, Counter]:
        """Counts by (class, what) of replaced modules, and by (class, reason) of the modules
        already on tritonkit and of those left alone."""
        return {
            "replaced": Counter((r.kind, r.what) for r in self.replaced),
            "already": Counter((r.kind, r.reason) for r in self.already),
            "left": Counter((r.kind, r.reason) for r in self.left),
        }

    def __str__(self) -> str:
        s = self.summary()
        lines = []
        for title, key in (
            ("tritonkit.patch: replaced", "replaced"),
            ("already tritonkit", "already"),
            ("left alone", "left"),
        ):
            if key == "already" and not s[key]:
                continue
            lines.append(title)
            lines += [f"  {n:4d} x {k}: {w}" for (k, w), n in sorted(s[key].items())]
            if not s[key]:
                lines.append("     nothing")
        return "\n".join(lines)


class Patcher:
    """Sets instance attributes on the model's modules and remembers how to put them back."""

    def __init__(self, model: nn.Module, options: PatchOptions) -> None:
        self.model = model
        self.options = options
        self.report = PatchReport()
        self.undo: list[tuple[Any, str, Any]] = []
        self.done: set[int] = set()  # modules already handled (by a rule of a parent)

    def set_attr(self, obj: Any, name: str, value: Any) -> None:
        old = obj.__dict__.get(name, _MISSING)  # absent: the class's attribute shows again
        self.undo.append((obj, name, old))
        setattr(obj, name, value)

    def set_forward(self, module: nn.Module, path: str, forward: Callable, what: str) -> None:
        """Give ``module`` an instance ``forward`` (a function of ``(module, ...)``)."""
        self.set_attr(module, "forward", types.MethodType(forward, module))
        self.done.add(id(module))
        self.report.replaced.append(Replaced(path, type(module).__name__, what))

    def replaced(self, obj: Any, path: str, what: str) -> None:
        self.report.replaced.append(Replaced(path, type(obj).__name__, what))

    def left(self, module: Any, path: str, reason: str) -> None:
        self.report.left.append(Left(path, type(module).__name__, reason))

    def already(self, path: str, kind: str, reason: str) -> None:
        self.report.already.append(Left(path, kind, reason))

    def restore(self) -> None:
        for obj, name, old in reversed(self.undo):
            if old is _MISSING:
                with contextlib.suppress(AttributeError):
                    delattr(obj, name)
            else:
                setattr(obj, name, old)
        self.undo.clear()


def model_device(model: nn.Module) -> torch.device | None:
    """Where the model's first parameter (or buffer) lives; None when it has neither."""
    for t in itertools.chain(model.parameters(), model.buffers()):
        return t.device
    return None


def with_globals(fn: Callable, overrides: dict[str, Any]) -> Callable | None:
    """A copy of ``fn`` whose global names in ``overrides`` resolve to their values there, or
    None when no call of the copy would read one of them.

    Decorators made with ``functools.wraps`` (a wrapper holding the function it wraps in a
    closure cell, and as ``__wrapped__``) are copied too, around the copy of what they wrap.
    The copies read the other globals of their module as they are now: the module itself is
    not changed, so no other caller of the function sees the overrides.
    """

    def names_of(code: types.CodeType) -> set[str]:
        out = set(code.co_names)
        for c in code.co_consts:
            if isinstance(c, types.CodeType):  # nested functions read the same globals
                out |= names_of(c)
        return out

    def copy(f: Any) -> tuple[Callable, bool] | None:
        """(the copy, whether it reads an override), or None if f cannot be copied."""
        if not isinstance(f, types.FunctionType):
            return None
        closure, inner, inner_copy, used = (
            f.__closure__,
            getattr(f, "__wrapped__", None),
            None,
            False,
        )
        if isinstance(inner, types.FunctionType) and closure:
            copied = copy(inner)
            if copied is None:
                return None
            inner_copy, inner_used = copied
            cells = []
            for cell in closure:
                try:
                    held = cell.cell_contents is inner
                except ValueError:  # an empty cell
                    held = False
                cells.append(types.CellType(inner_copy) if held else cell)
                # The wrapper calls the copy only through a cell that held the original.
                used = used or (held and inner_used)
            closure = tuple(cells)
        names = names_of(f.__code__) & set(overrides)
        glob = f.__globals__
        if names:
            used = True
            glob = {**glob, **{n: overrides[n] for n in names}}
        out = types.FunctionType(f.__code__, glob, f.__name__, f.__defaults__, closure)
        out.__kwdefaults__ = f.__kwdefaults__
        out.__dict__.update(f.__dict__)
        out.__qualname__, out.__module__ = f.__qualname__, f.__module__
        out.__doc__, out.__annotations__ = f.__doc__, f.__annotations__
        if inner_copy is not None:
            out.__wrapped__ = inner_copy
        return out, used

    copied = copy(fn)
    return copied[0] if copied is not None and copied[1] else None


def original_forward(module: nn.Module) -> Callable:
    """The class's forward bound to ``module`` (what runs when the patch cannot)."""
    return types.MethodType(type(module).forward, module)


def patch(model: nn.Module, **options: Any) -> PatchReport:
    """Make ``model`` run tritonkit's kernels, in place; returns what was replaced and what
    was left alone.

    Hugging Face transformers models (Llama, Mistral, Qwen2/Qwen3, GPT-2) get fused norms
    (with the residual add where the block has one), SwiGLU/GeGLU MLPs, attention through
    PyTorch's SDPA with the fastest backend first (or tritonkit's), and the causal-LM loss
    through the head without materialized logits. Plain PyTorch modules (``nn.LayerNorm``,
    ``nn.RMSNorm``, ``nn.GELU``, ``nn.SiLU``, ``nn.ReLU``, ``nn.Softmax``,
    ``nn.CrossEntropyLoss``) run the matching tritonkit function. Anything else is left
    alone and listed in the report with the reason. Outputs agree with the unpatched model's
    within the dtype's rounding (bf16: the kernels round once where PyTorch rounds between
    operations).

    Args:
        model: the model (or any ``nn.Module``); not yet patched.
        **options: fields of :class:`PatchOptions` (``norms``, ``residual``, ``mlp``,
            ``attention``, ``loss``, ``logits``, ``rope``).

    Returns:
        A :class:`PatchReport` (also kept as ``model._tritonkit_patch.report``).

    Raises:
        TypeError: model is not an ``nn.Module``; an unknown option.
        ValueError: model is already patched; an option out of range.
    """
    from tritonkit.models import rules

    op = "tritonkit.patch"
    if not isinstance(model, nn.Module):
        raise TypeError(f"{op}: model must be a torch.nn.Module, got {type(model).__name__}")
    if getattr(model, _RECORD, None) is not None:
        raise ValueError(f"{op}: model is already patched (tritonkit.unpatch(model) first)")
    known = set(PatchOptions.__dataclass_fields__)
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"{op}: unknown options {unknown}; known: {sorted(known)}")
    opts = PatchOptions(**options)
    if opts.attention not in ATTENTION_CHOICES:
        raise ValueError(
            f"{op}: attention must be one of {list(ATTENTION_CHOICES)}, got {opts.attention!r}"
        )
    if opts.logits not in LOGITS_CHOICES:
        raise ValueError(f"{op}: logits must be one of {list(LOGITS_CHOICES)}, got {opts.logits!r}")
    patcher = Patcher(model, opts)
    try:
        rules.apply(patcher)
    except Exception:
        patcher.restore()
        raise
    model.__dict__[_RECORD] = patcher
    return patcher.report


def unpatch(model: nn.Module) -> PatchReport:
    """Undo :func:`patch`: every forward and config it set on the model's modules is put back.

    Args:
        model: a model patched by :func:`patch`.

    Returns:
        The report of the patch that was undone.

    Raises:
        ValueError: model is not patched.
    """
    patcher = model.__dict__.pop(_RECORD, None) if isinstance(model, nn.Module) else None
    if patcher is None:
        raise ValueError("tritonkit.unpatch: model is not patched by tritonkit.patch")
    patcher.restore()
    return patcher.report


def patched(model: nn.Module) -> bool:
    """Whether ``model`` is patched by :func:`patch`."""
    return isinstance(model, nn.Module) and _RECORD in model.__dict__
