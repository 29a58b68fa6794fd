"""Attention for patched Hugging Face models: registered as attention implementations of
transformers (``AttentionInterface``), selected through the model config.

``tritonkit_sdpa`` runs transformers' own SDPA path (its masks, GQA handling and causal
flag, unchanged) with PyTorch's backends in the order given by ``SDPA_BACKENDS``: cuDNN's
fused attention first where the GPU has it, then flash, memory-efficient and math; the
dispatcher takes the first one that supports the call, so the order never changes what is
computed, only which kernel computes it. ``tritonkit_flash`` runs ``tritonkit.attention``.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import tritonkit

SDPA_NAME = "tritonkit_sdpa"
REPEAT_KV_NAME = "tritonkit_sdpa_repeat_kv"
FLASH_NAME = "tritonkit_flash"

SDPA_BACKENDS = (
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
)


_SDPA: list = []  # transformers' sdpa_attention_forward, imported on first use


def _backends(query: torch.Tensor) -> contextlib.AbstractContextManager:
    # Under torch.compile the backend is chosen when the graph is traced, by PyTorch's own
    # order: the context (a global setting) is left to eager mode.
    if query.is_cuda and not torch.compiler.is_compiling():
        return sdpa_kernel(list(SDPA_BACKENDS), set_priority=True)
    return contextlib.nullcontext()


def sdpa_forward(module, query, key, value, attention_mask, **kwargs: Any):
    """transformers' ``sdpa_attention_forward`` with the backends in ``SDPA_BACKENDS``'s order."""
    if not _SDPA:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        _SDPA.append(sdpa_attention_forward)
    with _backends(query):
        return _SDPA[0](module, query, key, value, attention_mask, **kwargs)


def _causal(module, query, key, attention_mask, is_causal) -> bool:
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    return bool(causal and attention_mask is None and query.shape[2] > 1)


def repeat_kv_forward(
    module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
):
    """SDPA with K/V repeated to the query heads (for backends without grouped-query support,
    at the cost of the repeated K/V's memory), the backends in ``SDPA_BACKENDS``'s order."""
    rep = query.shape[1] // key.shape[1]
    if rep > 1:
        key, value = key.repeat_interleave(rep, 1), value.repeat_interleave(rep, 1)
    causal = _causal(module, query, key, attention_mask, is_causal)
    if causal and key.shape[2] > query.shape[2]:
        key, value = key[:, :, : query.shape[2]], value[:, :, : query.shape[2]]
    with _backends(query):
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attention_mask, dropout, causal, scale=scaling
        )
    return out.transpose(1, 2).contiguous(), None


def flash_forward(
    module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
):
    """``tritonkit.attention`` with transformers' SDPA conventions: (B, H, L, D) inputs, a bool
    or additive mask (or None with the module's causal flag), output (B, L, H, D)."""
    q_len, kv_len = query.shape[2], key.shape[2]
    causal = _causal(module, query, key, attention_mask, is_causal)
    if causal and kv_len > q_len:
        # A prefill into an empty static cache: the keys past the queries are padding (as
        # transformers' sdpa path does, which slices them off for the same reason).
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    mask = attention_mask
    if mask is not None and mask.shape[-1] != key.shape[2]:
        mask = mask[..., : key.shape[2]]
    out = tritonkit.attention(
        query, key, value, mask, dropout, causal, scaling, key.shape[1] != query.shape[1]
    )
    return out.transpose(1, 2), None


def register() -> None:
    """Register both implementations with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    for name, fn in ((SDPA_NAME, sdpa_forward), (REPEAT_KV_NAME, repeat_kv_forward),
                     (FLASH_NAME, flash_forward)):  # fmt: skip
        AttentionInterface.register(name, fn)
        # Masks as the sdpa path builds them (None where the causal flag suffices, else bool).
        AttentionMaskInterface.register(name, sdpa_mask)
