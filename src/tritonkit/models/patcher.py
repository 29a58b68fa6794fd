"""What a patch records and reports: its options, the :class:`Patcher` that sets instance
attributes on a model's modules and puts them back, and the helpers the rules use
(``rules.py`` decides what to patch; ``patching.py`` holds the public functions)."""

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
