"""Route ``F.scaled_dot_product_attention`` to tritonkit inside a ``with`` block, so that an
existing model (Hugging Face's sdpa attention, ``nn.MultiheadAttention``, ...) runs
tritonkit's FlashAttention without edits."""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch.nn.functional as F

from tritonkit.ops.attention import UnsupportedAttention, attention, unsupported


@dataclass
class SdpaPatchReport:
    """What a ``sdpa_patch`` block did: calls run by tritonkit, and calls handed to torch by
    reason (only with ``fallback=True``)."""

    routed: int = 0
    fallbacks: Counter = field(default_factory=Counter)


@contextlib.contextmanager
def sdpa_patch(fallback: bool = False, warn: bool = True) -> Iterator[SdpaPatchReport]:
    """Inside the block, ``torch.nn.functional.scaled_dot_product_attention`` is
    ``tritonkit.attention``; yields a :class:`SdpaPatchReport`.

    Code that looks the function up when it calls it (``F.scaled_dot_product_attention(...)``,
    as PyTorch's own modules and Hugging Face's attention do) is routed; a name imported
    before the block (``from torch.nn.functional import scaled_dot_product_attention``) is not.

    Args:
        fallback: a call tritonkit cannot run (``tritonkit.ops.attention.unsupported``: fp64,
            CPU tensors, a value head dim != the query's, head dims above 256, a mask that
            needs a gradient, ...) raises ``UnsupportedAttention`` when False; when True it
            runs on PyTorch's own SDPA and is counted in the report under its reason.
        warn: with ``fallback``, warn once per reason the first time it falls back.

    Example::

        with tritonkit.nn.sdpa_patch(fallback=True) as report:
            loss = model(batch).loss
        print(report.routed, dict(report.fallbacks))
    """
    original = F.scaled_dot_product_attention
    report = SdpaPatchReport()

    def patched(
        query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
        enable_gqa=False,
    ):  # fmt: skip
        why = unsupported(query, key, value, attn_mask)
        if why is None:
            report.routed += 1
            return attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        if not fallback:
            raise UnsupportedAttention(
                f"tritonkit.nn.sdpa_patch: not supported: {why} (sdpa_patch(fallback=True) runs "
                "such calls on PyTorch's SDPA)"
            )
        if warn and why not in report.fallbacks:
            warnings.warn(f"tritonkit.nn.sdpa_patch: {why}: running PyTorch's SDPA", stacklevel=2)
        report.fallbacks[why] += 1
        return original(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )

    F.scaled_dot_product_attention = patched
    try:
        yield report
    finally:
        F.scaled_dot_product_attention = original
