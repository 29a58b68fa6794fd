"""Attention's argument checks: what SDPA's semantics allow that tritonkit runs, and the clear
error for what it does not (``UnsupportedAttention``, a ValueError naming the argument)."""

from __future__ import annotations

import itertools
import math

import torch

from tritonkit.ops._core.device import interpreter_enabled
from tritonkit.ops._core.validate import check_operand, check_tensor

MAX_HEAD_DIM = 256


class UnsupportedAttention(ValueError):
    """A call tritonkit cannot run, F.scaled_dot_product_attention may (the message names the
    argument, what is supported and what was given: ``unsupported``);
    ``tritonkit.nn.sdpa_patch(fallback=True)`` hands such calls to torch."""


DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DTYPE_NAMES = "float32, float16 or bfloat16"


def window_band(op: str, window: object) -> tuple[int, int]:
    """(left, right) from ``window``; None or -1 for an unbounded side."""
    if window is None:
        return -1, -1
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"{op}: window must be None or a (left, right) pair, got {window!r}")
    sides = []
    for name, w in zip(("left", "right"), window):
        if w is None:
            w = -1
        if isinstance(w, bool) or not isinstance(w, int) or w < -1:
            raise ValueError(
                f"{op}: window's {name} must be an int >= 0, or None or -1 (unbounded), got {w!r}"
            )
        sides.append(w)
    return sides[0], sides[1]


def scalars(
    op: str, dropout_p: object, scale: object, head_dim: int, scale_name: str = "scale"
) -> float:
    if (
        isinstance(dropout_p, bool)
        or not isinstance(dropout_p, (int, float))
        or not 0 <= dropout_p < 1
    ):
        raise ValueError(f"{op}: dropout_p must be a float in [0, 1), got {dropout_p!r}")
    if scale is None:
        return 1.0 / math.sqrt(head_dim) if head_dim else 1.0
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"{op}: {scale_name} must be None or a finite float, got {scale!r}")
    return float(scale)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def unsupported(query, key, value, attn_mask=None) -> str | None:
    """Why tritonkit cannot run an F.scaled_dot_product_attention call (None if it can): the
    argument, what tritonkit takes and what it got, e.g. "query must have dtype float32,
    float16 or bfloat16, got float64"."""
    tensors = {"query": query, "key": key, "value": value}
    if attn_mask is not None:
        tensors["attn_mask"] = attn_mask
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            return f"{name} must be a torch.Tensor, got {type(t).__name__}"
        if t.is_nested:
            return f"{name} must be a strided tensor, got a nested tensor"
        if t.device.type != "cuda" and not (t.device.type == "cpu" and interpreter_enabled()):
            return (
                f"{name} must be on a CUDA device (or the CPU under the Triton interpreter), got "
                f"{t.device}"
            )
    if query.dtype not in DTYPES:
        return f"query must have dtype {DTYPE_NAMES}, got {dtype_name(query.dtype)}"
    if query.dim() not in (3, 4):
        return f"query must be 3-d or 4-d, got {query.dim()}-d"
    if value.shape[-1] != query.shape[-1]:
        return f"value's head dim must be query's ({query.shape[-1]}), got {value.shape[-1]}"
    if query.shape[-1] > MAX_HEAD_DIM:
        return f"query's head dim must be at most {MAX_HEAD_DIM}, got {query.shape[-1]}"
    if attn_mask is not None and attn_mask.requires_grad and torch.is_grad_enabled():
        return "attn_mask must not require grad (no gradient flows to it), got requires_grad=True"
    if key.dim() == query.dim() and key.shape[0] != query.shape[0]:
        return (
            f"key's batch must be query's ({query.shape[0]}), got {key.shape[0]} (batches are "
            "not broadcast)"
        )
    return None


def check_mask(
    op: str, mask: torch.Tensor, q: torch.Tensor, shape: tuple[int, ...]
) -> torch.Tensor:
    check_tensor(op, "attn_mask", mask, (torch.bool, *DTYPES))
    if mask.dtype not in (torch.bool, torch.float32, q.dtype):
        raise TypeError(
            f"{op}: attn_mask must be bool, float32 or query's dtype "
            f"({str(q.dtype).removeprefix('torch.')}), got {str(mask.dtype).removeprefix('torch.')}"
        )
    if mask.device != q.device:
        raise ValueError(
            f"{op}: attn_mask must be on query's device ({q.device}), got {mask.device}"
        )
    try:
        if torch.broadcast_shapes(mask.shape, shape) != torch.Size(shape):
            raise RuntimeError
    except RuntimeError:
        raise ValueError(
            f"{op}: attn_mask must be broadcastable to {tuple(shape)} (batch, heads, L, S), got "
            f"{tuple(mask.shape)}"
        ) from None
    return mask.expand(shape)


def check_dense(op, query, key, value, attn_mask, enable_gqa):
    """(q, k, v, mask) as 4-d tensors (a 3-d call gets a head dim of 1), validated."""
    why = unsupported(query, key, value, attn_mask)
    if why is not None:
        # What SDPA refuses too (not a tensor, not a float) is a TypeError; what tritonkit
        # alone does not run (fp64, a head dim above 256, ...) is UnsupportedAttention.
        for name, t in (("query", query), ("key", key), ("value", value), ("attn_mask", attn_mask)):
            if not isinstance(t, torch.Tensor) and not (name == "attn_mask" and t is None):
                raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
            if name != "attn_mask" and not t.is_floating_point():
                raise TypeError(
                    f"{op}: {name} must have dtype {DTYPE_NAMES}, got {dtype_name(t.dtype)}"
                )
        raise UnsupportedAttention(f"{op}: {why}")
    check_tensor(op, "query", query, DTYPES)
    for name, t in (("key", key), ("value", value)):
        check_operand(op, name, t, "query", query, dtypes=DTYPES)
        if t.dim() != query.dim():
            raise ValueError(f"{op}: {name} must be {query.dim()}-d like query, got {t.dim()}-d")
    if key.shape[:-1] != value.shape[:-1]:
        raise ValueError(
            f"{op}: value must have key's batch, heads and length {tuple(key.shape[:-1])}, got "
            f"{tuple(value.shape[:-1])}"
        )
    if key.shape[-1] != query.shape[-1]:
        raise ValueError(
            f"{op}: key's head dim must be query's ({query.shape[-1]}), got {key.shape[-1]}"
        )
    three_d = query.dim() == 3
    if three_d:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
    b, h, n_q, _ = query.shape
    h_kv, n_k = key.shape[1], key.shape[2]
    if h != h_kv and not (h_kv and h % h_kv == 0 and (enable_gqa or h_kv == 1)):
        need = " and enable_gqa=True" if h_kv and h % h_kv == 0 else ""
        raise ValueError(
            f"{op}: key/value heads ({h_kv}) must equal query heads ({h}), or divide them{need}"
        )
    mask = None
    if attn_mask is not None:
        if three_d:
            mask = check_mask(op, attn_mask, query, (b, n_q, n_k)).unsqueeze(1)
        else:
            mask = check_mask(op, attn_mask, query, (b, h, n_q, n_k))
    return query, key, value, mask, three_d


def check_cu(op: str, name: str, cu: object, q: torch.Tensor) -> torch.Tensor:
    check_tensor(op, name, cu, (torch.int32,))
    if cu.dim() != 1 or cu.shape[0] < 1:
        raise ValueError(
            f"{op}: {name} must be 1-d of length batch + 1, got shape {tuple(cu.shape)}"
        )
    if cu.device != q.device:
        raise ValueError(f"{op}: {name} must be on q's device ({q.device}), got {cu.device}")
    return cu.contiguous()  # read with unit stride (batch + 1 integers)


def check_cu_values(
    cu_q: torch.Tensor, cu_k: torch.Tensor, total_q: int, total_k: int, max_q: int, max_k: int
) -> None:
    """cu_seqlens checked on the host, where reading them costs no synchronization (CPU
    tensors): each starts at 0, does not decrease and ends at its packed length (q's or k's
    rows), and its longest sequence is at most max_seqlen. Every row then belongs to exactly
    one sequence: none is read out of bounds, none of O, dQ, dK, dV is left unwritten. On CUDA
    the forward kernel asserts the same on the device (forward.py, ``check_sequence``)."""
    op = "tritonkit.attention_varlen"
    for name, cu, total, rows, longest, max_name in (
        ("cu_seqlens_q", cu_q, total_q, "q", max_q, "max_seqlen_q"),
        ("cu_seqlens_k", cu_k, total_k, "k", max_k, "max_seqlen_k"),
    ):
        values = cu.tolist()
        if values[0] != 0:
            raise ValueError(f"{op}: {name} must start at 0, got {values[0]}")
        lengths = [b - a for a, b in itertools.pairwise(values)]
        if any(n < 0 for n in lengths):
            i = next(i for i, n in enumerate(lengths) if n < 0)
            raise ValueError(
                f"{op}: {name} must not decrease, got {values[i]} then {values[i + 1]} at index {i}"
            )
        if values[-1] != total:
            raise ValueError(
                f"{op}: {name} must end at {rows}'s packed length {total} ({rows}.shape[0]), "
                f"got {values[-1]}"
            )
        if lengths and max(lengths) > longest:
            raise ValueError(
                f"{op}: {max_name} must be at least the longest sequence of {name} "
                f"({max(lengths)}), got {longest}"
            )
