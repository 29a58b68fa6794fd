"""Attention family: FlashAttention forward and backward (causal, masks, sliding windows,
dropout, GQA), packed variable-length batches, and split-KV decoding.

Modules, one per kernel path: ``tiles`` (the device helpers every kernel is built from),
``forward`` (the flash forward), ``backward`` (dQ with the fused delta pre-pass, dK/dV),
``decode`` (split-KV and merge), ``naive`` (the workbench's three-kernel baseline), ``config``
(tiles, candidates, tuning), ``validate`` (argument checks), ``function`` (ops, autograd,
public functions).
"""

from tritonkit.ops.attention.config import BwdConfig, DecodeGemmConfig, Tile
from tritonkit.ops.attention.function import (
    VARIANTS,
    AttentionFunction,
    attention,
    attention_backward,
    attention_forward,
    attention_variant,
    attention_varlen,
)
from tritonkit.ops.attention.validate import UnsupportedAttention, unsupported

# The public functions (tritonkit.__all__ derives from them); the rest is importable here too.
__all__ = ["attention", "attention_varlen"]
