"""``patch(model)`` and ``unpatch(model)``: a model's modules run tritonkit's kernels, in place.

A patch never replaces a module object or a parameter: it sets an instance ``forward`` (and,
for attention, the model config's attention implementation), so ``state_dict``, optimizers,
hooks and ``.to()`` see the same model. Everything it sets is recorded on the model and put
back by ``unpatch``. Which modules are patched, how, and which are left alone (and why) is
in the returned :class:`PatchReport`.
"""

from __future__ import annotations

import contextlib
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

_MISSING = object()
_RECORD = "_tritonkit_patch"

ATTENTION_CHOICES = ("sdpa", "sdpa_repeat_kv", "tritonkit", "keep")


@dataclass(frozen=True)
class PatchOptions:
    """What ``patch`` may replace (every switch on by default).

    Args:
        norms: RMSNorm and LayerNorm modules.
        residual: a block's residual add fused into the norm that follows it.
        mlp: gated MLPs (SwiGLU, GeGLU) and activation modules.
        attention: ``"sdpa"`` (PyTorch's SDPA with the fastest backend first: cuDNN, then
            flash), ``"sdpa_repeat_kv"`` (the same with K/V repeated to the query heads, for
            a backend without grouped-query support), ``"tritonkit"`` (tritonkit.attention)
            or ``"keep"``.
        loss: the causal-LM head's linear + cross-entropy without logits, when labels are
            given and the model trains (``skip_logits`` also in eval mode).
        skip_logits: with labels, return ``logits=None`` in eval mode too (saves their memory).
        rope: the rotary embedding through tritonkit's kernel, where it has one.
    """

    norms: bool = True
    residual: bool = True
    mlp: bool = True
    attention: str = "sdpa"
    loss: bool = True
    skip_logits: bool = False
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
    """What ``patch`` replaced and what it left alone (with the reason)."""

    replaced: list[Replaced] = field(default_factory=list)
    left: list[Left] = field(default_factory=list)

    def summary(self) -> dict[str, Counter]:
        """Counts by (class, what) of replaced modules, and by (class, reason) of left ones."""
        return {
            "replaced": Counter((r.kind, r.what) for r in self.replaced),
            "left": Counter((r.kind, r.reason) for r in self.left),
        }

    def __str__(self) -> str:
        s = self.summary()
        lines = ["tritonkit.patch: replaced"]
        lines += [f"  {n:4d} x {k}: {w}" for (k, w), n in sorted(s["replaced"].items())]
        lines.append("left alone")
        lines += [f"  {n:4d} x {k}: {w}" for (k, w), n in sorted(s["left"].items())]
        return "\n".join(lines)


class Patcher:
    """Sets attributes on objects and remembers how to put them back."""

    def __init__(self, model: nn.Module, options: PatchOptions) -> None:
        self.model = model
        self.options = options
        self.report = PatchReport()
        self.undo: list[tuple[Any, str, Any]] = []
        self.on_restore: list[Callable[[], None]] = []  # run by restore, last first
        self.done: set[int] = set()  # modules already handled (by a rule of a parent)

    def set_attr(self, obj: Any, name: str, value: Any) -> None:
        if isinstance(getattr(type(obj), name, None), property):
            old = getattr(obj, name)  # a property (a config field): set back through it
        else:
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

    def restore(self) -> None:
        for fn in reversed(self.on_restore):
            fn()
        self.on_restore.clear()
        for obj, name, old in reversed(self.undo):
            if old is _MISSING:
                with contextlib.suppress(AttributeError):
                    delattr(obj, name)
            else:
                setattr(obj, name, old)
        self.undo.clear()


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
            ``attention``, ``loss``, ``skip_logits``, ``rope``).

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
    patcher = Patcher(model, opts)
    try:
        rules.apply(patcher)
    except Exception:
        patcher.restore()
        raise
    model.__dict__[_RECORD] = patcher
    return patcher.report


def unpatch(model: nn.Module) -> PatchReport:
    """Undo :func:`patch`: every forward, config field and function it set is put back.

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
