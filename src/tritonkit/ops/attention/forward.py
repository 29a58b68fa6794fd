"""The FlashAttention forward: one program per (query block, batch x head), an online softmax
over the key blocks of its band, O and each row's log-sum-exp written once.

The key range of a query block is split in three (``tiles.band_blocks``): blocks the band or
the sequence's end cuts (masked), and between them the blocks every row of the tile sees
whole, which run with no mask and no bounds on the loads: for causal attention all blocks
below the diagonal, for sliding windows all blocks inside the window, for full attention all
but the last partial block. Scores are scaled by ``scale * log2(e)`` once so that each
probability is one ``exp2`` (tiles.py). The head dim is padded to a power of 2 with masked
loads (``BLOCK_D``) where it is not one.

Precision: fp16/bf16 operands on the tensor cores with fp32 accumulation, P rounded to the
input dtype before P @ V (as FlashAttention does); fp32 inputs in IEEE fp32 (TF32 where
``torch.backends.cuda.matmul.allow_tf32`` is set), P kept in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonkit.ops._core.device import interpreter_enabled
from tritonkit.ops._core.launch import Bound, kernel
from tritonkit.ops._core.layout import cdiv
from tritonkit.ops._core.plan import current_env
from tritonkit.ops.attention.config import Problem, Tile, forward_config
from tritonkit.ops.attention.tiles import LOG2E, band_blocks, dropout_keep, mma, scores


@triton.jit
def load_rows(ptrs, rows, n_rows, offs_d, HEAD_DIM: tl.constexpr, CHECK_ROWS: tl.constexpr,
              CHECK_D: tl.constexpr):  # fmt: skip
    """A [rows, BLOCK_D] tile; out-of-range rows and padded head-dim columns read as 0."""
    if CHECK_ROWS and CHECK_D:
        tile = tl.load(
            ptrs, mask=(rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM), other=0.0
        )
    elif CHECK_ROWS:
        tile = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
    elif CHECK_D:
        tile = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    else:
        tile = tl.load(ptrs)
    return tile


@triton.jit
def _fwd_steps(
    acc, l_i, m_i, q, q_idx,  # running output, row sums, row maxima; the query tile
    k_base, v_base, mask_base,  # this (batch, head)'s K, V and attn_mask at key 0
    stride_ks, stride_kd, stride_vs, stride_vd, stride_ml, stride_ms,
    start, end,  # key blocks [start, end)
    n_q, n_k, diag, left, right, scale_log2,
    seed, offset, head, dropout_p,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BAND: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, MASK_KIND: tl.constexpr,
    HAS_DROPOUT: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k_ptrs = (
        k_base + (start + offs_n)[:, None].to(tl.int64) * stride_ks + offs_d[None, :] * stride_kd
    )
    v_ptrs = (
        v_base + (start + offs_n)[:, None].to(tl.int64) * stride_vs + offs_d[None, :] * stride_vd
    )
    # A row can have no key left only where something masks it.
    GUARD: tl.constexpr = BAND or MASK_KIND != 0
    for n in range(start, end, BLOCK_N):
        k_idx = n + offs_n
        k = load_rows(k_ptrs, k_idx, n_k, offs_d, HEAD_DIM, BAND, HEAD_DIM != BLOCK_D)
        qk = mma(q, tl.trans(k), tl.zeros((BLOCK_M, BLOCK_N), tl.float32), UPCAST, PRECISION)
        if GUARD:
            s = scores(qk, q_idx[:, None], k_idx[None, :], mask_base, stride_ml, stride_ms,
                       n_q, n_k, diag, left, right, scale_log2, BAND, HAS_LEFT, HAS_RIGHT,
                       MASK_KIND)  # fmt: skip
            m_new = tl.maximum(m_i, tl.max(s, 1))
            # a row with every score -inf so far: subtract 0, not -inf (no NaN)
            m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(s - m_new[:, None])
        else:  # scale and subtract in one FMA per score, as Triton's tutorial kernel does
            m_new = tl.maximum(m_i, tl.max(qk, 1) * scale_log2)
            p = tl.math.exp2(qk * scale_log2 - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if HAS_DROPOUT:
            p = tl.where(
                dropout_keep(seed, offset, head, q_idx, n, dropout_p, BLOCK_M, BLOCK_N), p, 0.0
            )
        v = load_rows(v_ptrs, k_idx, n_k, offs_d, HEAD_DIM, BAND, HEAD_DIM != BLOCK_D)
        acc = mma(p.to(v.dtype), v, acc, UPCAST, PRECISION)
        m_i = m_new
        k_ptrs += BLOCK_N * stride_ks
        v_ptrs += BLOCK_N * stride_vs
    return acc, l_i, m_i


@triton.jit
def sequence(cu_q_ptr, cu_k_ptr, b, seq_q, seq_k, IS_VARLEN: tl.constexpr):
    """(first query row, queries, first key row, keys) of batch entry ``b``."""
    q_start = b * 0
    k_start = q_start
    n_q = q_start + seq_q
    n_k = q_start + seq_k
    if IS_VARLEN:
        q_start = tl.load(cu_q_ptr + b)
        k_start = tl.load(cu_k_ptr + b)
        n_q = tl.load(cu_q_ptr + b + 1) - q_start
        n_k = tl.load(cu_k_ptr + b + 1) - k_start
    return q_start, n_q, k_start, n_k


@triton.jit
def check_sequence(b, n_batch, q_start, n_q, k_start, n_k, seq_q, seq_k, total_q, total_k):
    """Assert that sequence ``b`` of a packed batch lies within its tensors and the grid, as
    ``function.check_cu_values`` checks every sequence on the host for CPU tensors: then no
    row is read out of bounds and every row of O (and of dQ, dK, dV) is written. Compiled in
    only where the launch passes debug=True (CUDA, ``launch_forward``); a failed assert stops
    the kernel as PyTorch's device-side asserts do. Each program checks its own sequence
    before it reads a row of it."""
    tl.device_assert((b > 0) | (q_start == 0), "attention_varlen: cu_seqlens_q must start at 0")
    tl.device_assert((b > 0) | (k_start == 0), "attention_varlen: cu_seqlens_k must start at 0")
    tl.device_assert(
        (q_start >= 0) & (n_q >= 0) & (q_start + n_q <= total_q),
        "attention_varlen: cu_seqlens_q must not decrease and must stay within q's rows",
    )
    tl.device_assert(
        (k_start >= 0) & (n_k >= 0) & (k_start + n_k <= total_k),
        "attention_varlen: cu_seqlens_k must not decrease and must stay within k's rows",
    )
    tl.device_assert(
        (b < n_batch - 1) | (q_start + n_q == total_q),
        "attention_varlen: cu_seqlens_q must end at q.shape[0]",
    )
    tl.device_assert(
        (b < n_batch - 1) | (k_start + n_k == total_k),
        "attention_varlen: cu_seqlens_k must end at k.shape[0]",
    )
    tl.device_assert(
        n_q <= seq_q, "attention_varlen: max_seqlen_q must be at least the longest sequence"
    )
    tl.device_assert(
        n_k <= seq_k, "attention_varlen: max_seqlen_k must be at least the longest sequence"
    )


@triton.jit
def rng_state(rng_ptr, HAS_DROPOUT: tl.constexpr):
    """(seed, offset) of the Philox stream, read from the device (CUDA-graph safe)."""
    seed = 0
    offset = 0
    if HAS_DROPOUT:
        seed = tl.load(rng_ptr)
        offset = tl.load(rng_ptr + 1).to(tl.int32)
    return seed, offset


@kernel(do_not_specialize=("total_q", "total_k"))
def _attn_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, mask_ptr, cu_q_ptr, cu_k_ptr, rng_ptr,
    stride_qb, stride_qh, stride_ql, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_ob, stride_oh, stride_ol, stride_od,
    stride_lb, stride_lh, stride_ll,  # lse (base-2, fp32)
    stride_mb, stride_mh, stride_ml, stride_ms,  # attn_mask, 0 along broadcast dims
    n_heads, group,  # query heads; query heads per K/V head
    seq_q, seq_k,  # sequence lengths (dense) or the longest (varlen: from cu_seqlens)
    total_q, total_k,  # varlen: the packed rows of q and k (asserts only)
    scale_log2, left, right, dropout_p,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MASK_KIND: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    if HAS_RIGHT:  # causal-like: the query blocks with the most keys start first (as FA2)
        pid_m = tl.num_programs(0) - 1 - pid_m
    head = tl.program_id(1)
    b = head // n_heads
    h = head % n_heads
    q_start, n_q, k_start, n_k = sequence(cu_q_ptr, cu_k_ptr, b, seq_q, seq_k, IS_VARLEN)
    if IS_VARLEN:
        n_batch = tl.num_programs(1) // n_heads
        check_sequence(b, n_batch, q_start, n_q, k_start, n_k, seq_q, seq_k, total_q, total_k)
    m0 = pid_m * BLOCK_M
    if m0 >= n_q:
        return
    diag = n_q * 0
    if BOTTOM_RIGHT:
        diag = n_k - n_q
    seed, offset = rng_state(rng_ptr, HAS_DROPOUT)
    b64 = b.to(tl.int64)
    q_base = q_ptr + b64 * stride_qb + h.to(tl.int64) * stride_qh + q_start.to(tl.int64) * stride_ql
    kv = (h // group).to(tl.int64)
    k_base = k_ptr + b64 * stride_kb + kv * stride_kh + k_start.to(tl.int64) * stride_ks
    v_base = v_ptr + b64 * stride_vb + kv * stride_vh + k_start.to(tl.int64) * stride_vs
    mask_base = mask_ptr + b64 * stride_mb + h.to(tl.int64) * stride_mh

    q_idx = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_ptrs = q_base + q_idx[:, None].to(tl.int64) * stride_ql + offs_d[None, :] * stride_qd
    q = load_rows(q_ptrs, q_idx, n_q, offs_d, HEAD_DIM, True, HEAD_DIM != BLOCK_D)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    lo, full_lo, full_hi, hi = band_blocks(
        m0, n_k, diag, left, right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT
    )
    if HAS_LEFT:  # blocks the window's left edge cuts
        acc, l_i, m_i = _fwd_steps(
            acc, l_i, m_i, q, q_idx, k_base, v_base, mask_base,
            stride_ks, stride_kd, stride_vs, stride_vd, stride_ml, stride_ms,
            lo, tl.minimum(full_lo, hi), n_q, n_k, diag, left, right, scale_log2,
            seed, offset, head, dropout_p, BLOCK_M, BLOCK_N, HEAD_DIM, BLOCK_D,
            True, HAS_LEFT, HAS_RIGHT, MASK_KIND, HAS_DROPOUT, UPCAST, PRECISION,
        )  # fmt: skip
    acc, l_i, m_i = _fwd_steps(  # blocks every row sees whole: no masks
        acc, l_i, m_i, q, q_idx, k_base, v_base, mask_base,
        stride_ks, stride_kd, stride_vs, stride_vd, stride_ml, stride_ms,
        full_lo, full_hi, n_q, n_k, diag, left, right, scale_log2,
        seed, offset, head, dropout_p, BLOCK_M, BLOCK_N, HEAD_DIM, BLOCK_D,
        False, HAS_LEFT, HAS_RIGHT, MASK_KIND, HAS_DROPOUT, UPCAST, PRECISION,
    )  # fmt: skip
    acc, l_i, m_i = _fwd_steps(  # the diagonal (or the window's right edge) and the last block
        acc, l_i, m_i, q, q_idx, k_base, v_base, mask_base,
        stride_ks, stride_kd, stride_vs, stride_vd, stride_ml, stride_ms,
        full_hi, hi, n_q, n_k, diag, left, right, scale_log2,
        seed, offset, head, dropout_p, BLOCK_M, BLOCK_N, HEAD_DIM, BLOCK_D,
        True, HAS_LEFT, HAS_RIGHT, MASK_KIND, HAS_DROPOUT, UPCAST, PRECISION,
    )  # fmt: skip

    # A row that sees no key (fully masked) gives 0, as SDPA's math and CPU backends do, and
    # stores lse = +inf so that the backward recomputes its probabilities as 0.
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    inv = tl.where(empty, 0.0, 1.0 / l_safe)
    if HAS_DROPOUT:
        inv = inv / (1.0 - dropout_p)
    o_base = o_ptr + b64 * stride_ob + h.to(tl.int64) * stride_oh + q_start.to(tl.int64) * stride_ol
    o_ptrs = o_base + q_idx[:, None].to(tl.int64) * stride_ol + offs_d[None, :] * stride_od
    o_mask = (q_idx[:, None] < n_q) & (offs_d[None, :] < HEAD_DIM)
    tl.store(o_ptrs, (acc * inv[:, None]).to(o_ptr.dtype.element_ty), mask=o_mask)
    lse = tl.where(empty, float("inf"), m_i + tl.math.log2(l_safe))
    lse_base = (
        lse_ptr + b64 * stride_lb + h.to(tl.int64) * stride_lh + q_start.to(tl.int64) * stride_ll
    )
    tl.store(lse_base + q_idx.to(tl.int64) * stride_ll, lse, mask=q_idx < n_q)


# ----------------------------------------------------------------------------------------------
# Launch
# ----------------------------------------------------------------------------------------------


def head_strides(t: torch.Tensor | None, varlen: bool) -> tuple[int, int, int, int]:
    """(batch, head, row, dim) strides of a (B, H, L, D) tensor, or of a packed (T, H, D) one
    (batch stride 0: rows are found from cu_seqlens)."""
    if t is None:
        return 0, 0, 0, 0
    if varlen:
        return 0, t.stride(1), t.stride(0), t.stride(2)
    return t.stride(0), t.stride(1), t.stride(2), t.stride(3)


def lse_strides(lse: torch.Tensor, varlen: bool) -> tuple[int, int, int]:
    """(batch, head, row) strides of the fp32 lse: (B, H, L), or (H, T) packed."""
    if varlen:
        return 0, lse.stride(0), lse.stride(1)
    return lse.stride(0), lse.stride(1), lse.stride(2)


def precision(dtype: torch.dtype) -> str | None:
    """tl.dot's input precision: fp32 inputs in IEEE fp32 unless PyTorch allows TF32 matmuls."""
    if dtype != torch.float32:
        return None
    return "tf32" if current_env().tf32 else "ieee"


def common_meta(p: Problem, device: torch.device) -> dict:
    """Constexprs shared by every kernel of the family."""
    return {
        "HEAD_DIM": p.head_dim,
        "BLOCK_D": p.block_d,
        "MASK_KIND": p.mask_kind,
        "HAS_LEFT": p.left >= 0,
        "HAS_RIGHT": p.right >= 0,
        "BOTTOM_RIGHT": p.bottom_right,
        "IS_VARLEN": p.varlen,
        "HAS_DROPOUT": p.dropout,
        "UPCAST": interpreter_enabled() and p.dtype == torch.bfloat16,
        "PRECISION": precision(p.dtype),
    }


class ForwardPlan:
    """The flash forward of one call key (shapes, strides, dtypes, the scalars, the tile):
    its outputs' layout and its launch, bound once (``launch.Bound``: the binder's
    specialization of 40-odd arguments is not redone). A call allocates O and lse and
    launches; ``run`` None: nothing to launch (no query or no head)."""

    __slots__ = ("dtype", "lse_shape", "o_shape", "o_stride", "run")

    def __init__(self, o: torch.Tensor, lse: torch.Tensor, run: Bound | None) -> None:
        self.o_shape, self.o_stride, self.dtype = o.shape, o.stride(), o.dtype
        self.lse_shape, self.run = lse.shape, run

    def __call__(self, q, k, v, mask, cu_q, cu_k, rng) -> tuple[torch.Tensor, torch.Tensor]:
        dev = q.device
        o = torch.empty_strided(self.o_shape, self.o_stride, dtype=self.dtype, device=dev)
        lse = torch.empty(self.lse_shape, dtype=torch.float32, device=dev)
        run = self.run
        if run is not None:  # absent pointers stand in as q (never read: their flags are off)
            run(
                q, k, v, o, lse, q if mask is None else mask, q if cu_q is None else cu_q,
                q if cu_k is None else cu_k, q if rng is None else rng,
            )  # fmt: skip
        return o, lse


def forward_plan(
    p: Problem,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    mask: torch.Tensor | None,
    cu_q: torch.Tensor | None,
    cu_k: torch.Tensor | None,
    rng: torch.Tensor | None,
    scale: float,
    dropout_p: float,
    tile: Tile | None,
) -> ForwardPlan:
    """The plan of ``p`` with ``tile`` (None: the tuned tile; tuning launches on these
    tensors, which are the call's own: O and lse are its outputs)."""
    if p.seq_q == 0 or p.batch * p.heads == 0:
        return ForwardPlan(o, lse, None)
    meta = common_meta(p, q.device)
    dummy = q  # stands in for absent pointers (never read: their flags are off)
    mask_strides = mask.stride() if mask is not None else (0, 0, 0, 0)
    args = (
        q, k, v, o, lse,
        mask if mask is not None else dummy,
        cu_q if cu_q is not None else dummy,
        cu_k if cu_k is not None else dummy,
        rng if rng is not None else dummy,
        *head_strides(q, p.varlen), *head_strides(k, p.varlen), *head_strides(v, p.varlen),
        *head_strides(o, p.varlen), *lse_strides(lse, p.varlen), *mask_strides,
        p.heads, p.group, p.seq_q, p.seq_k, q.shape[0], k.shape[0], scale * LOG2E, p.left,
        p.right, dropout_p,
    )  # fmt: skip
    if p.varlen and q.is_cuda:
        # cu_seqlens checked by the kernel's asserts (check_sequence): debug=True compiles them
        # in, integer overflow checks left off (no other code changes). CPU tensors are checked
        # on the host before the launch (function.check_cu_values).
        meta.update(debug=True, sanitize_overflow=False)

    def bound(t: Tile) -> Bound:
        grid = (cdiv(p.seq_q, t.BLOCK_M), p.batch * p.heads)
        return _attn_fwd_kernel.bind(
            grid, *args, BLOCK_M=t.BLOCK_M, BLOCK_N=t.BLOCK_N, num_warps=t.num_warps,
            num_stages=t.num_stages, **meta,
        )  # fmt: skip

    def run(t: Tile) -> None:  # a tuning launch
        bound(t)(*args[:9])

    return ForwardPlan(o, lse, bound(tile if tile is not None else forward_config(p, run)))
