"""The FlashAttention-2 backward: probabilities recomputed from Q, K and the forward's
log-sum-exp, never stored.

Two kernels, in this order on the stream:

- dQ, one program per (query block, batch x head): it first computes its rows'
  ``delta = rowsum(dO * O)`` (stored for the second kernel: FA2's pre-pass fused here), then
  walks the key blocks of its band: ``P = exp2(S - lse)``, ``dP = dO V^T``,
  ``dS = P * (dP - delta)``, ``dQ += dS K``.
- dK/dV, one program per (key block, batch x K/V head): it walks the query blocks of its band
  for every query head of its group (GQA sums there, deterministically):
  ``dV += P^T dO``, ``dK += dS^T Q``.

``BwdConfig.atomic_dq`` takes the other road of FA2: the dQ kernel only computes delta, and
the dK/dV kernel adds each ``dS K`` into an fp32 dQ with atomics (one pass over the scores
instead of two, but atomics and a non-deterministic sum order); the fp32 buffer is then cast
to dQ's dtype. The default is the deterministic two-pass form.

Dropout: the keep mask of each (query, key) is drawn again from the same Philox counters as
in the forward (tiles.dropout_keep), so ``dP`` and ``P^T`` see exactly the forward's mask.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonkit.ops._core.launch import Bound, kernel
from tritonkit.ops._core.layout import cdiv
from tritonkit.ops.attention.config import BwdConfig, Problem, Tile, backward_config
from tritonkit.ops.attention.forward import (
    common_meta,
    head_strides,
    load_rows,
    lse_strides,
    rng_state,
    sequence,
)
from tritonkit.ops.attention.tiles import LOG2E, band_blocks, dropout_keep, mma, scores


@triton.jit
def _dq_steps(
    dq, q, do, lse, delta, q_idx,
    k_base, v_base, mask_base, stride_ks, stride_kd, stride_vs, stride_vd, stride_ml, stride_ms,
    start, end, n_q, n_k, diag, left, right, scale_log2,
    seed, offset, head, dropout_p, inv_keep,
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
    for n in range(start, end, BLOCK_N):
        k_idx = n + offs_n
        k = load_rows(k_ptrs, k_idx, n_k, offs_d, HEAD_DIM, BAND, HEAD_DIM != BLOCK_D)
        v = load_rows(v_ptrs, k_idx, n_k, offs_d, HEAD_DIM, BAND, HEAD_DIM != BLOCK_D)
        qk = mma(q, tl.trans(k), tl.zeros((BLOCK_M, BLOCK_N), tl.float32), UPCAST, PRECISION)
        s = scores(qk, q_idx[:, None], k_idx[None, :], mask_base, stride_ml, stride_ms, n_q, n_k,
                   diag, left, right, scale_log2, BAND, HAS_LEFT, HAS_RIGHT, MASK_KIND)  # fmt: skip
        p = tl.math.exp2(s - lse[:, None])
        dp = mma(do, tl.trans(v), tl.zeros((BLOCK_M, BLOCK_N), tl.float32), UPCAST, PRECISION)
        if HAS_DROPOUT:
            keep = dropout_keep(seed, offset, head, q_idx, n, dropout_p, BLOCK_M, BLOCK_N)
            dp = tl.where(keep, dp * inv_keep, 0.0)
        ds = p * (dp - delta[:, None])
        dq = mma(ds.to(k.dtype), k, dq, UPCAST, PRECISION)
        k_ptrs += BLOCK_N * stride_ks
        v_ptrs += BLOCK_N * stride_vs
    return dq


@kernel
def _attn_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, mask_ptr,
    cu_q_ptr, cu_k_ptr, rng_ptr,
    stride_qb, stride_qh, stride_ql, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_ob, stride_oh, stride_ol, stride_od,
    stride_dob, stride_doh, stride_dol, stride_dod,
    stride_dqb, stride_dqh, stride_dql, stride_dqd,
    stride_lb, stride_lh, stride_ll,  # lse and delta (same layout)
    stride_mb, stride_mh, stride_ml, stride_ms,
    n_heads, group, seq_q, seq_k, scale, scale_log2, left, right, dropout_p,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MASK_KIND: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    DELTA_ONLY: tl.constexpr,  # atomic dQ: only delta here
):  # fmt: skip
    pid_m = tl.program_id(0)
    if HAS_RIGHT:  # causal-like: the query blocks with the most keys start first (as FA2)
        pid_m = tl.num_programs(0) - 1 - pid_m
    head = tl.program_id(1)
    b = head // n_heads
    h = head % n_heads
    q_start, n_q, k_start, n_k = sequence(cu_q_ptr, cu_k_ptr, b, seq_q, seq_k, IS_VARLEN)
    m0 = pid_m * BLOCK_M
    if m0 >= n_q:
        return
    diag = n_q * 0
    if BOTTOM_RIGHT:
        diag = n_k - n_q
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    row0 = q_start.to(tl.int64)
    q_idx = m0 + tl.arange(0, BLOCK_M)
    rows = q_idx[:, None].to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    o_ptrs = (
        o_ptr
        + b64 * stride_ob
        + h64 * stride_oh
        + (row0 + rows) * stride_ol
        + offs_d[None, :] * stride_od
    )
    do_ptrs = (
        do_ptr
        + b64 * stride_dob
        + h64 * stride_doh
        + (row0 + rows) * stride_dol
        + offs_d[None, :] * stride_dod
    )
    do = load_rows(do_ptrs, q_idx, n_q, offs_d, HEAD_DIM, True, not EVEN_D)
    o = load_rows(o_ptrs, q_idx, n_q, offs_d, HEAD_DIM, True, not EVEN_D)
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
    lse_off = b64 * stride_lb + h64 * stride_lh + (row0 + q_idx.to(tl.int64)) * stride_ll
    tl.store(delta_ptr + lse_off, delta, mask=q_idx < n_q)
    if not DELTA_ONLY:
        seed, offset = rng_state(rng_ptr, HAS_DROPOUT)
        inv_keep = 1.0 / (1.0 - dropout_p)
        q_ptrs = (
            q_ptr
            + b64 * stride_qb
            + h64 * stride_qh
            + (row0 + rows) * stride_ql
            + offs_d[None, :] * stride_qd
        )
        q = load_rows(q_ptrs, q_idx, n_q, offs_d, HEAD_DIM, True, not EVEN_D)
        lse = tl.load(lse_ptr + lse_off, mask=q_idx < n_q, other=float("inf"))
        kv = (h // group).to(tl.int64)
        k_base = k_ptr + b64 * stride_kb + kv * stride_kh + k_start.to(tl.int64) * stride_ks
        v_base = v_ptr + b64 * stride_vb + kv * stride_vh + k_start.to(tl.int64) * stride_vs
        mask_base = mask_ptr + b64 * stride_mb + h64 * stride_mh
        dq = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
        lo, full_lo, full_hi, hi = band_blocks(
            m0, n_k, diag, left, right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT
        )
        if HAS_LEFT:
            dq = _dq_steps(
                dq, q, do, lse, delta, q_idx, k_base, v_base, mask_base,
                stride_ks, stride_kd, stride_vs, stride_vd, stride_ml, stride_ms,
                lo, tl.minimum(full_lo, hi), n_q, n_k, diag, left, right, scale_log2,
                seed, offset, head, dropout_p, inv_keep, BLOCK_M, BLOCK_N, HEAD_DIM, BLOCK_D,
                True, HAS_LEFT, HAS_RIGHT, MASK_KIND, HAS_DROPOUT, UPCAST, PRECISION,
            )  # fmt: skip
        dq = _dq_steps(
            dq, q, do, lse, delta, q_idx, k_base, v_base, mask_base,
            stride_ks, stride_kd, stride_vs, stride_vd, stride_ml, stride_ms,
            full_lo, full_hi, n_q, n_k, diag, left, right, scale_log2,
            seed, offset, head, dropout_p, inv_keep, BLOCK_M, BLOCK_N, HEAD_DIM, BLOCK_D,
            False, HAS_LEFT, HAS_RIGHT, MASK_KIND, HAS_DROPOUT, UPCAST, PRECISION,
        )  # fmt: skip
        dq = _dq_steps(
            dq, q, do, lse, delta, q_idx, k_base, v_base, mask_base,
            stride_ks, stride_kd, stride_vs, stride_vd, stride_ml, stride_ms,
            full_hi, hi, n_q, n_k, diag, left, right, scale_log2,
            seed, offset, head, dropout_p, inv_keep, BLOCK_M, BLOCK_N, HEAD_DIM, BLOCK_D,
            True, HAS_LEFT, HAS_RIGHT, MASK_KIND, HAS_DROPOUT, UPCAST, PRECISION,
        )  # fmt: skip
        dq_ptrs = (
            dq_ptr
            + b64 * stride_dqb
            + h64 * stride_dqh
            + (row0 + rows) * stride_dql
            + offs_d[None, :] * stride_dqd
        )
        dq_mask = (q_idx[:, None] < n_q) & (offs_d[None, :] < HEAD_DIM)
        tl.store(dq_ptrs, (dq * scale).to(dq_ptr.dtype.element_ty), mask=dq_mask)


@triton.jit
def _dkdv_steps(
    dk, dv, k, v, n0, k_idx,
    q_base, do_base, lse_base, delta_base, mask_base, dq_base,
    stride_ql, stride_qd, stride_dol, stride_dod, stride_ll, stride_ml, stride_ms,
    stride_dql, stride_dqd,
    start, end, n_q, n_k, diag, left, right, scale, scale_log2,
    seed, offset, head, dropout_p, inv_keep,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BAND: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, MASK_KIND: tl.constexpr,
    HAS_DROPOUT: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    ATOMIC_DQ: tl.constexpr,
):  # fmt: skip
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    rows = (start + offs_m)[:, None].to(tl.int64)
    q_ptrs = q_base + rows * stride_ql + offs_d[None, :] * stride_qd
    do_ptrs = do_base + rows * stride_dol + offs_d[None, :] * stride_dod
    for m in range(start, end, BLOCK_M):
        q_idx = m + offs_m
        q = load_rows(q_ptrs, q_idx, n_q, offs_d, HEAD_DIM, BAND, HEAD_DIM != BLOCK_D)
        do = load_rows(do_ptrs, q_idx, n_q, offs_d, HEAD_DIM, BAND, HEAD_DIM != BLOCK_D)
        row_off = q_idx.to(tl.int64) * stride_ll
        if BAND:
            lse = tl.load(lse_base + row_off, mask=q_idx < n_q, other=float("inf"))
            delta = tl.load(delta_base + row_off, mask=q_idx < n_q, other=0.0)
        else:
            lse = tl.load(lse_base + row_off)
            delta = tl.load(delta_base + row_off)
        qk_t = mma(k, tl.trans(q), tl.zeros((BLOCK_N, BLOCK_M), tl.float32), UPCAST, PRECISION)
        s_t = scores(qk_t, q_idx[None, :], k_idx[:, None], mask_base, stride_ml, stride_ms,
                     n_q, n_k, diag, left, right, scale_log2, BAND, HAS_LEFT, HAS_RIGHT,
                     MASK_KIND)  # fmt: skip
        p_t = tl.math.exp2(s_t - lse[None, :])
        dp_t = mma(v, tl.trans(do), tl.zeros((BLOCK_N, BLOCK_M), tl.float32), UPCAST, PRECISION)
        if HAS_DROPOUT:
            keep_t = tl.trans(
                dropout_keep(seed, offset, head, q_idx, n0, dropout_p, BLOCK_M, BLOCK_N)
            )
            dv = mma(tl.where(keep_t, p_t, 0.0).to(do.dtype), do, dv, UPCAST, PRECISION)
            dp_t = tl.where(keep_t, dp_t * inv_keep, 0.0)
        else:
            dv = mma(p_t.to(do.dtype), do, dv, UPCAST, PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = mma(ds_t.to(q.dtype), q, dk, UPCAST, PRECISION)
        if ATOMIC_DQ:
            dq = mma(
                tl.trans(ds_t.to(k.dtype)),
                k,
                tl.zeros((BLOCK_M, BLOCK_D), tl.float32),
                UPCAST,
                PRECISION,
            )
            dq_ptrs = (
                dq_base + q_idx[:, None].to(tl.int64) * stride_dql + offs_d[None, :] * stride_dqd
            )
            dq_mask = (q_idx[:, None] < n_q) & (offs_d[None, :] < HEAD_DIM)
            tl.atomic_add(dq_ptrs, dq * scale, mask=dq_mask, sem="relaxed")
        q_ptrs += BLOCK_M * stride_ql
        do_ptrs += BLOCK_M * stride_dol
    return dk, dv


@kernel
def _attn_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, dq_ptr, mask_ptr,
    cu_q_ptr, cu_k_ptr, rng_ptr,
    stride_qb, stride_qh, stride_ql, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_dob, stride_doh, stride_dol, stride_dod,
    stride_dkb, stride_dkh, stride_dks, stride_dkd,
    stride_dvb, stride_dvh, stride_dvs, stride_dvd,
    stride_dqb, stride_dqh, stride_dql, stride_dqd,  # the fp32 dQ of ATOMIC_DQ
    stride_lb, stride_lh, stride_ll,
    stride_mb, stride_mh, stride_ml, stride_ms,
    n_heads, group, seq_q, seq_k, scale, scale_log2, left, right, dropout_p,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MASK_KIND: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr, ATOMIC_DQ: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    kv_head = tl.program_id(1)
    n_kv = n_heads // group
    b = kv_head // n_kv
    hkv = kv_head % n_kv
    q_start, n_q, k_start, n_k = sequence(cu_q_ptr, cu_k_ptr, b, seq_q, seq_k, IS_VARLEN)
    n0 = pid_n * BLOCK_N
    if n0 >= n_k:
        return
    diag = n_q * 0
    if BOTTOM_RIGHT:
        diag = n_k - n_q
    seed, offset = rng_state(rng_ptr, HAS_DROPOUT)
    inv_keep = 1.0 / (1.0 - dropout_p)
    b64 = b.to(tl.int64)
    k_idx = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    k_rows = (k_start + k_idx)[:, None].to(tl.int64)
    k_ptrs = (
        k_ptr
        + b64 * stride_kb
        + hkv.to(tl.int64) * stride_kh
        + k_rows * stride_ks
        + offs_d[None, :] * stride_kd
    )
    v_ptrs = (
        v_ptr
        + b64 * stride_vb
        + hkv.to(tl.int64) * stride_vh
        + k_rows * stride_vs
        + offs_d[None, :] * stride_vd
    )
    k = load_rows(k_ptrs, k_idx, n_k, offs_d, HEAD_DIM, True, not EVEN_D)
    v = load_rows(v_ptrs, k_idx, n_k, offs_d, HEAD_DIM, True, not EVEN_D)
    dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    # The band from the keys' side: -diag, with the window's left and right swapped.
    lo, full_lo, full_hi, hi = band_blocks(
        n0, n_q, -diag, right, left, BLOCK_N, BLOCK_M, HAS_RIGHT, HAS_LEFT
    )
    row0 = q_start.to(tl.int64)
    for g in range(group):
        h = hkv * group + g
        h64 = h.to(tl.int64)
        q_base = q_ptr + b64 * stride_qb + h64 * stride_qh + row0 * stride_ql
        do_base = do_ptr + b64 * stride_dob + h64 * stride_doh + row0 * stride_dol
        lse_base = lse_ptr + b64 * stride_lb + h64 * stride_lh + row0 * stride_ll
        delta_base = delta_ptr + b64 * stride_lb + h64 * stride_lh + row0 * stride_ll
        mask_base = mask_ptr + b64 * stride_mb + h64 * stride_mh
        dq_base = dq_ptr + b64 * stride_dqb + h64 * stride_dqh + row0 * stride_dql
        head = b * n_heads + h
        if HAS_RIGHT:  # query blocks the window's right edge (the causal diagonal) cuts
            dk, dv = _dkdv_steps(
                dk, dv, k, v, n0, k_idx, q_base, do_base, lse_base, delta_base, mask_base, dq_base,
                stride_ql, stride_qd, stride_dol, stride_dod, stride_ll, stride_ml, stride_ms,
                stride_dql, stride_dqd, lo, tl.minimum(full_lo, hi), n_q, n_k, diag, left, right,
                scale, scale_log2, seed, offset, head, dropout_p, inv_keep,
                BLOCK_M, BLOCK_N, HEAD_DIM, BLOCK_D, True, HAS_LEFT, HAS_RIGHT, MASK_KIND,
                HAS_DROPOUT, UPCAST, PRECISION, ATOMIC_DQ,
            )  # fmt: skip
        dk, dv = _dkdv_steps(
            dk, dv, k, v, n0, k_idx, q_base, do_base, lse_base, delta_base, mask_base, dq_base,
            stride_ql, stride_qd, stride_dol, stride_dod, stride_ll, stride_ml, stride_ms,
            stride_dql, stride_dqd, full_lo, full_hi, n_q, n_k, diag, left, right,
            scale, scale_log2, seed, offset, head, dropout_p, inv_keep,
            BLOCK_M, BLOCK_N, HEAD_DIM, BLOCK_D, False, HAS_LEFT, HAS_RIGHT, MASK_KIND,
            HAS_DROPOUT, UPCAST, PRECISION, ATOMIC_DQ,
        )  # fmt: skip
        dk, dv = _dkdv_steps(
            dk, dv, k, v, n0, k_idx, q_base, do_base, lse_base, delta_base, mask_base, dq_base,
            stride_ql, stride_qd, stride_dol, stride_dod, stride_ll, stride_ml, stride_ms,
            stride_dql, stride_dqd, full_hi, hi, n_q, n_k, diag, left, right,
            scale, scale_log2, seed, offset, head, dropout_p, inv_keep,
            BLOCK_M, BLOCK_N, HEAD_DIM, BLOCK_D, True, HAS_LEFT, HAS_RIGHT, MASK_KIND,
            HAS_DROPOUT, UPCAST, PRECISION, ATOMIC_DQ,
        )  # fmt: skip
    if HAS_DROPOUT:
        dv = dv * inv_keep
    dk_ptrs = (
        dk_ptr
        + b64 * stride_dkb
        + hkv.to(tl.int64) * stride_dkh
        + k_rows * stride_dks
        + offs_d[None, :] * stride_dkd
    )
    dv_ptrs = (
        dv_ptr
        + b64 * stride_dvb
        + hkv.to(tl.int64) * stride_dvh
        + k_rows * stride_dvs
        + offs_d[None, :] * stride_dvd
    )
    kv_mask = (k_idx[:, None] < n_k) & (offs_d[None, :] < HEAD_DIM)
    tl.store(dk_ptrs, (dk * scale).to(dk_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(dv_ptrs, dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)


# ----------------------------------------------------------------------------------------------
# Launch
# ----------------------------------------------------------------------------------------------


class BackwardPlan:
    """The backward of one call key: dQ, dK and dV allocated like q, k and v, and the
    kernels' launches bound once (``launch.Bound``). ``dq``: the dQ kernel (with the fused
    delta pre-pass; ``atomic``: the pre-pass alone, dQ summed by the dK/dV kernel in fp32 and
    cast); ``dkdv``: the dK/dV kernel; both None where nothing is launched. ``zero``: no query
    or no key, every gradient is 0."""

    __slots__ = ("atomic", "dkdv", "dq", "zero")

    def __init__(self, dq: Bound | None, dkdv: Bound | None, atomic: bool, zero: bool = False):
        self.dq, self.dkdv, self.atomic, self.zero = dq, dkdv, atomic, zero

    def __call__(self, do, q, k, v, o, lse, mask, cu_q, cu_k, rng):
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        if self.zero:  # nothing attends
            return dq.zero_(), dk.zero_(), dv.zero_()
        if self.dkdv is None:
            return dq, dk, dv
        delta = torch.empty_like(lse)
        # absent pointers stand in as q (never read: their flags are off)
        mask = q if mask is None else mask
        cu_q = q if cu_q is None else cu_q
        cu_k = q if cu_k is None else cu_k
        rng = q if rng is None else rng
        if not self.atomic:
            if self.dq is not None:
                self.dq(q, k, v, o, do, lse, delta, dq, mask, cu_q, cu_k, rng)
            self.dkdv(q, k, v, do, lse, delta, dk, dv, q, mask, cu_q, cu_k, rng)
            return dq, dk, dv
        dq32 = torch.zeros(dq.shape, dtype=torch.float32, device=dq.device)
        if self.dq is not None:
            self.dq(q, k, v, o, do, lse, delta, dq, mask, cu_q, cu_k, rng)
        self.dkdv(q, k, v, do, lse, delta, dk, dv, dq32, mask, cu_q, cu_k, rng)
        dq.copy_(dq32)  # the cast to dQ's dtype
        return dq, dk, dv


def backward_plan(
    p: Problem,
    do: torch.Tensor,
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
    config: BwdConfig | None,
) -> BackwardPlan:
    """The plan of ``p``'s backward with ``config`` (None: the tuned tiles; tuning launches on
    these tensors and scratch gradients)."""
    if p.seq_k == 0 or p.seq_q == 0:
        return BackwardPlan(None, None, False, zero=True)
    if p.batch * p.kv_heads == 0:
        return BackwardPlan(None, None, False)
    meta = common_meta(p, q.device)
    delta = torch.empty_like(lse)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dummy = q
    mask_arg = mask if mask is not None else dummy
    cu = (cu_q if cu_q is not None else dummy, cu_k if cu_k is not None else dummy)
    rng_arg = rng if rng is not None else dummy
    mask_strides = mask.stride() if mask is not None else (0, 0, 0, 0)
    vl = p.varlen
    consts = (p.heads, p.group, p.seq_q, p.seq_k, scale, scale * LOG2E, p.left, p.right, dropout_p)
    dq32 = torch.empty(dq.shape, dtype=torch.float32, device=dq.device)
    dq_args = (
        q, k, v, o, do, lse, delta, dq, mask_arg, *cu, rng_arg,
        *head_strides(q, vl), *head_strides(k, vl), *head_strides(v, vl),
        *head_strides(o, vl), *head_strides(do, vl), *head_strides(dq, vl),
        *lse_strides(lse, vl), *mask_strides, *consts,
    )  # fmt: skip

    def bind_dq(t: Tile, delta_only: bool = False) -> Bound | None:
        if p.seq_q == 0:
            return None
        return _attn_bwd_dq_kernel.bind(
            (cdiv(p.seq_q, t.BLOCK_M), p.batch * p.heads), *dq_args,
            BLOCK_M=t.BLOCK_M, BLOCK_N=t.BLOCK_N, DELTA_ONLY=delta_only,
            num_warps=t.num_warps, num_stages=t.num_stages, **meta,
        )  # fmt: skip

    def bind_dkdv(t: Tile, atomic: bool = False) -> Bound:
        scratch = dq32 if atomic else None
        return _attn_bwd_dkdv_kernel.bind(
            (cdiv(p.seq_k, t.BLOCK_N), p.batch * p.kv_heads),
            q, k, v, do, lse, delta, dk, dv, scratch if atomic else dummy, mask_arg,
            *cu, rng_arg,
            *head_strides(q, vl), *head_strides(k, vl), *head_strides(v, vl),
            *head_strides(do, vl), *head_strides(dk, vl), *head_strides(dv, vl),
            *head_strides(scratch, vl), *lse_strides(lse, vl), *mask_strides, *consts,
            BLOCK_M=t.BLOCK_M, BLOCK_N=t.BLOCK_N, ATOMIC_DQ=atomic,
            num_warps=t.num_warps, num_stages=t.num_stages, **meta,
        )  # fmt: skip

    def run_dq(t: Tile) -> None:  # tuning launches
        bound = bind_dq(t)
        if bound is not None:
            bound(*dq_args[:12])

    def run_dkdv(t: Tile) -> None:
        bind_dkdv(t)(q, k, v, do, lse, delta, dk, dv, dummy, mask_arg, *cu, rng_arg)

    if config is None:
        config = backward_config(p, run_dkdv, run_dq)
    if not config.atomic_dq:
        return BackwardPlan(bind_dq(config.dq), bind_dkdv(config.dkdv), False)
    return BackwardPlan(bind_dq(config.dq, delta_only=True), bind_dkdv(config.dkdv, True), True)
