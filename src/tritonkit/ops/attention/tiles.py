"""Device helpers every attention kernel is built from: the band of keys a block of queries
sees, the score tile with its masks, the dropout mask, and the dot products.

Scores live in the base-2 domain: ``s = (q . k) * scale * log2(e) + bias * log2(e)``, so that
one ``exp2`` per element gives ``exp(scale * q . k + bias)``. A row's log-sum-exp is kept in the
same units (``lse2``); a row with no key to attend stores ``+inf`` there, so that every
recomputed probability ``exp2(s - lse2)`` of it is 0 in the backward.

The band. Query ``i`` sees key ``j`` when ``0 <= j < n_keys`` and, with a window,
``diag - left <= j - i <= diag + right`` (causal is ``right = 0``). ``diag`` is 0 where SDPA
aligns the diagonal top-left, ``n_keys - n_queries`` where flash-attn aligns it bottom-right.
The same relation read from the keys' side is the band of ``-diag`` with left and right
swapped, so one helper gives the block ranges of both orientations.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634

# attn_mask kinds (MASK_KIND)
NO_MASK = 0
BOOL_MASK = 1  # True: attend
ADDITIVE_MASK = 2  # added to the scaled scores


@triton.jit
def band_blocks(
    start,  # first row of this program's block
    n_cols,  # columns of this row's sequence (keys for a query block, queries for a key block)
    diag,
    left,
    right,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
):
    """Column block starts ``lo <= full_lo <= full_hi`` and the end ``hi`` for rows
    ``[start, start + BLOCK_ROWS)``: ``[lo, full_lo)`` and ``[full_hi, hi)`` need masks,
    every column block in ``[full_lo, full_hi)`` is seen whole by every row. ``lo``, ``full_lo``
    and ``full_hi`` are multiples of BLOCK_COLS; nothing is seen when ``hi <= lo``."""
    lo = start * 0
    hi = n_cols + lo
    full_lo = lo
    full_hi = (n_cols // BLOCK_COLS) * BLOCK_COLS
    if HAS_LEFT:
        first = tl.maximum(start + diag - left, 0)
        lo = (first // BLOCK_COLS) * BLOCK_COLS
        # smallest column every row of the block sees, rounded up to a block start
        every = tl.maximum(start + BLOCK_ROWS - 1 + diag - left, 0)
        full_lo = tl.cdiv(every, BLOCK_COLS) * BLOCK_COLS
    if HAS_RIGHT:
        hi = tl.minimum(tl.maximum(start + BLOCK_ROWS + diag + right, 0), n_cols)
        every_end = tl.maximum(start + diag + right + 1, 0)
        full_hi = tl.minimum(full_hi, (every_end // BLOCK_COLS) * BLOCK_COLS)
    full_lo = tl.maximum(full_lo, lo)
    full_hi = tl.maximum(full_hi, full_lo)
    return lo, full_lo, full_hi, hi


@triton.jit
def band_keep(
    q_idx, k_idx, n_keys, diag, left, right, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr
):
    """Which (query, key) pairs of a tile are inside the sequence and the band; ``q_idx`` and
    ``k_idx`` broadcast against each other (either orientation)."""
    keep = k_idx < n_keys
    if HAS_LEFT:
        keep = keep & (k_idx - q_idx >= diag - left)
    if HAS_RIGHT:
        keep = keep & (k_idx - q_idx <= diag + right)
    return keep


@triton.jit
def mask_tile(
    mask_ptr, q_idx, k_idx, stride_ml, stride_ms, n_queries, n_keys, MASK_KIND: tl.constexpr
):
    """The attn_mask tile at (q_idx, k_idx) (broadcast shapes, either orientation), read
    through its strides (0 along broadcast dims): keep flags (bool) or the additive bias times
    log2(e) (float), as float32."""
    inside = (q_idx < n_queries) & (k_idx < n_keys)
    ptrs = mask_ptr + q_idx.to(tl.int64) * stride_ml + k_idx.to(tl.int64) * stride_ms
    # One return per function: Triton compiles the statements after a constexpr branch's
    # return too (into a dead block), and its return types must agree.
    if MASK_KIND == 1:
        tile = tl.load(ptrs, mask=inside, other=0) != 0
    else:
        tile = tl.load(ptrs, mask=inside, other=0.0).to(tl.float32) * 1.4426950408889634
    return tile


@triton.jit
def scores(
    qk,  # raw q . k (float32)
    q_idx,
    k_idx,
    mask_ptr,
    stride_ml,
    stride_ms,
    n_queries,
    n_keys,
    diag,
    left,
    right,
    scale_log2,
    BAND: tl.constexpr,  # whether this tile may cross the band's or the sequence's edges
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    MASK_KIND: tl.constexpr,
):
    """Base-2 scores of a tile, -inf where masked."""
    s = qk * scale_log2
    if MASK_KIND == 2:
        s += mask_tile(mask_ptr, q_idx, k_idx, stride_ml, stride_ms, n_queries, n_keys, 2)
    if MASK_KIND == 1:
        keep = mask_tile(mask_ptr, q_idx, k_idx, stride_ml, stride_ms, n_queries, n_keys, 1)
        s = tl.where(keep, s, float("-inf"))
    if BAND:
        keep = band_keep(q_idx, k_idx, n_keys, diag, left, right, HAS_LEFT, HAS_RIGHT)
        s = tl.where(keep, s, float("-inf"))
    return s


@triton.jit
def dropout_keep(
    seed,
    offset,
    head,  # b * n_heads + h: the stream of one (batch, head)
    q_idx,  # [BLOCK_M] query indices
    k_start,  # first key of the tile
    dropout_p,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Keep flags [BLOCK_M, BLOCK_N] of the tile (q_idx, k_start + arange(BLOCK_N)): Philox
    keyed by the 64-bit seed, counters (key // 4, query, head, offset); each call yields four
    32-bit draws, one per key of a group of 4, so a tile costs a quarter of its elements in
    Philox rounds. The same pair always draws the same number (forward and backward agree)."""
    groups = k_start // 4 + tl.arange(0, BLOCK_N // 4)
    c0 = tl.broadcast_to(groups[None, :], (BLOCK_M, BLOCK_N // 4))
    c1 = tl.broadcast_to(q_idx[:, None], (BLOCK_M, BLOCK_N // 4))
    c2 = tl.full((BLOCK_M, BLOCK_N // 4), 0, tl.int32) + head
    c3 = tl.full((BLOCK_M, BLOCK_N // 4), 0, tl.int32) + offset
    r0, r1, r2, r3 = tl.philox(seed, c0, c1, c2, c3)
    r = tl.reshape(tl.join(tl.join(r0, r1), tl.join(r2, r3)), (BLOCK_M, BLOCK_N))
    return tl.uint_to_uniform_float(r) >= dropout_p


@triton.jit
def mma(a, b, acc, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """``acc + a @ b`` in float32. UPCAST: bfloat16 operands under the CPU interpreter, whose
    bf16 tl.dot is wrong, are multiplied as the float32 values they hold (exactly what the
    tensor cores multiply)."""
    if UPCAST:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc, input_precision=PRECISION)
    return out
