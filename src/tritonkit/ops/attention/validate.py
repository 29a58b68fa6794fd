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
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.dim() not in (3, 4):
            return f"{name} must be 3-d or 4-d, got {t.dim()}-d"
    if value.shape[-1] != query.shape[-1]:
        return f"value's head dim must be query's ({query.shape[-1]}), got {value.shape[-1]}"
    if query.shape[-1] > MAX_HEAD_DIM:
        return f"query's head dim must be at most {MAX_HEAD_DIM}, got {query.shape[-1]}"
    if attn_mask is not None and attn_mask.requires_grad and torch.is_grad_enabled():
        return "attn_mask must not require grad (no gradient flows to it), got requires_grad=True"
    nd = max(query.dim(), key.dim(), value.dim())
    h_k, h_v = four_d_shape(key.shape, nd)[1], four_d_shape(value.shape, nd)[1]
    if h_k != h_v and 1 not in (h_k, h_v):
        # SDPA (enable_gqa) repeats each to query's heads; the kernels read K and V through one
        # head count.
        return f"key's and value's heads must be equal or one of them 1, got {h_k} and {h_v}"
    return None


def four_d_shape(shape: tuple[int, ...], nd: int) -> tuple[int, ...]:
    """A 3-d or 4-d operand's shape as (batch, heads, rows, dim) in a call whose operands have
    at most ``nd`` dims: in a 3-d call every operand gets one head; in a 4-d call a 3-d operand
    gets a batch of 1, its first dim lined up with the heads (broadcasting aligns shapes from
    the right, as SDPA's matmuls do)."""
    if len(shape) == 4:
        return tuple(shape)
    if nd == 3:
        return (shape[0], 1, *shape[1:])
    return (1, *shape)


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
    """(q, k, v, mask, three_d): q, k, v as 4-d (batch, heads, rows, dim) tensors, validated,
    their batch dims broadcast as SDPA broadcasts them (a 3-d call gets a head dim of 1; a 3-d
    operand of a 4-d call a batch of 1), the mask broadcast to (batch, heads, L, S)."""
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
    if key.shape[-1] != query.shape[-1]:
        raise ValueError(
            f"{op}: key's head dim must be query's ({query.shape[-1]}), got {key.shape[-1]}"
        )
    if value.shape[-2] != key.shape[-2]:
        raise ValueError(
            f"{op}: value must have key's length ({key.shape[-2]}), got {value.shape[-2]}"
        )
    nd = max(query.dim(), key.dim(), value.dim())
    (bq, hq, n_q, d), (bk, hk, n_k, _), (bv, hv, _, _) = (
        four_d_shape(t.shape, nd) for t in (query, key, value)
    )
    b = _broadcast(op, "batch dims", (bq, bk, bv), (query, key, value))
    h_kv = hk if hv == 1 else hv  # equal, or one of them 1 (unsupported() said so)
    if enable_gqa:
        if not (h_kv and hq % h_kv == 0):
            raise ValueError(
                f"{op}: with enable_gqa=True, key/value heads ({h_kv}) must divide query heads "
                f"({hq})"
            )
        h = hq  # query head i reads K/V head i // (hq / h_kv), as SDPA's repeat_interleave
    elif hq == h_kv or h_kv == 1:
        h = hq  # one K/V head: read as one group of all query heads, not expanded
    elif hq == 1:
        h = h_kv  # one query head broadcast over the K/V heads
    else:
        need = " and enable_gqa=True" if h_kv and hq % h_kv == 0 else ""
        raise ValueError(
            f"{op}: key/value heads ({h_kv}) must equal query heads ({hq}), or divide them{need}"
        )
    # Broadcast operands are read through stride-0 views, never copied; autograd sums their
    # gradients over the broadcast dims (expand's backward), as it does for SDPA's.
    query = as_4d(query, nd, (b, h, n_q, d))
    key = as_4d(key, nd, (b, h_kv, n_k, d))
    value = as_4d(value, nd, (b, h_kv, n_k, value.shape[-1]))
    mask = None
    if attn_mask is not None:
        if nd == 3:
            mask = check_mask(op, attn_mask, query, (b, n_q, n_k)).unsqueeze(1)
        else:
            mask = check_mask(op, attn_mask, query, (b, h, n_q, n_k))
    return query, key, value, mask, nd == 3


def _broadcast(op: str, what: str, sizes: tuple[int, ...], tensors: tuple) -> int:
    """The broadcast of ``sizes`` (every size other than 1 the same), or ValueError."""
    grown = {n for n in sizes if n != 1}
    if len(grown) > 1:
        shapes = ", ".join(str(tuple(t.shape)) for t in tensors)
        got = ", ".join(map(str, sizes[:-1])) + f" and {sizes[-1]}"
        raise ValueError(
            f"{op}: query's, key's and value's {what} must broadcast, got {got} (shapes {shapes})"
        )
    return grown.pop() if grown else 1


def as_4d(t: torch.Tensor, nd: int, shape: tuple[int, ...]) -> torch.Tensor:
    """t as a 4-d (batch, heads, rows, dim) view of ``shape``, broadcast dims at stride 0."""
    if t.dim() == 3:
        t = t.unsqueeze(1) if nd == 3 else t.unsqueeze(0)
    return t if tuple(t.shape) == shape else t.expand(shape)


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
