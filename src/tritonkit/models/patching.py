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

from typing import Any

from torch import nn

from tritonkit.models import rules
from tritonkit.models.patcher import (
    _RECORD,
    ATTENTION_CHOICES,
    LOGITS_CHOICES,
    Patcher,
    PatchOptions,
    PatchReport,
)


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
