"""The workbench's naive attention: Q K^T, softmax and P V as three kernels, with the
(B, H, L, S) fp32 score matrix in memory between them. It exists to be measured against (time
and memory: 4 L S bytes per head), never called by ``tritonkit.attention``."""

from __future__ import annotations

import torch
import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.layout import cdiv, next_power_of_2
from tritonkit.ops.attention.config import Problem
from tritonkit.ops.attention.forward import common_meta, head_strides, load_rows
from tritonkit.ops.attention.tiles import LOG2E, mma, scores

BLOCK = 64


@kernel
def _naive_scores_kernel(
    q_ptr, k_ptr, s_ptr, mask_ptr,
    stride_qb, stride_qh, stride_ql, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_mb, stride_mh, stride_ml, stride_ms,
    n_heads, group, seq_q, seq_k, scale_log2, left, right,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MASK_KIND: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    head = tl.program_id(2)
    b64 = (head // n_heads).to(tl.int64)
    h = head % n_heads
    q_idx = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    k_idx = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q_ptrs = (q_ptr + b64 * stride_qb + h.to(tl.int64) * stride_qh
              + q_idx[:, None].to(tl.int64) * stride_ql + offs_d[None, :] * stride_qd)  # fmt: skip
    k_ptrs = (k_ptr + b64 * stride_kb + (h // group).to(tl.int64) * stride_kh
              + k_idx[:, None].to(tl.int64) * stride_ks + offs_d[None, :] * stride_kd)  # fmt: skip
    q = load_rows(q_ptrs, q_idx, seq_q, offs_d, HEAD_DIM, True, True)
    k = load_rows(k_ptrs, k_idx, seq_k, offs_d, HEAD_DIM, True, True)
    qk = mma(q, tl.trans(k), tl.zeros((BLOCK_M, BLOCK_N), tl.float32), UPCAST, PRECISION)
    mask_base = mask_ptr + b64 * stride_mb + h.to(tl.int64) * stride_mh
    s = scores(qk, q_idx[:, None], k_idx[None, :], mask_base, stride_ml, stride_ms, seq_q, seq_k,
               0, left, right, scale_log2, True, HAS_LEFT, HAS_RIGHT, MASK_KIND)  # fmt: skip
    rows = head.to(tl.int64) * seq_q + q_idx
    s_ptrs = s_ptr + rows[:, None] * seq_k + k_idx[None, :]
    tl.store(s_ptrs, s, mask=(q_idx[:, None] < seq_q) & (k_idx[None, :] < seq_k))


@kernel
def _naive_softmax_kernel(s_ptr, seq_k, BLOCK: tl.constexpr):
    """One row of base-2 scores -> probabilities, in place (a row with no key: zeros)."""
    row = s_ptr + tl.program_id(0).to(tl.int64) * seq_k
    offs = tl.arange(0, BLOCK)
    m = tl.full((BLOCK,), float("-inf"), tl.float32)
    for n in range(0, seq_k, BLOCK):
        m = tl.maximum(m, tl.load(row + n + offs, mask=n + offs < seq_k, other=float("-inf")))
    m_row = tl.max(m, 0)
    m_row = tl.where(m_row == float("-inf"), 0.0, m_row)
    total = tl.zeros((BLOCK,), tl.float32)
    for n in range(0, seq_k, BLOCK):
        s = tl.load(row + n + offs, mask=n + offs < seq_k, other=float("-inf"))
        total += tl.math.exp2(s - m_row)
    total_row = tl.sum(total, 0)
    inv = tl.where(total_row == 0.0, 0.0, 1.0 / tl.where(total_row == 0.0, 1.0, total_row))
    for n in range(0, seq_k, BLOCK):
        s = tl.load(row + n + offs, mask=n + offs < seq_k, other=float("-inf"))
        tl.store(row + n + offs, tl.math.exp2(s - m_row) * inv, mask=n + offs < seq_k)


@kernel
def _naive_pv_kernel(
    p_ptr, v_ptr, o_ptr,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_ob, stride_oh, stride_ol, stride_od,
    n_heads, group, seq_q, seq_k,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    head = tl.program_id(1)
    b64 = (head // n_heads).to(tl.int64)
    h = head % n_heads
    q_idx = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    p_rows = p_ptr + (head.to(tl.int64) * seq_q + q_idx)[:, None] * seq_k
    v_base = v_ptr + b64 * stride_vb + (h // group).to(tl.int64) * stride_vh
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for n in range(0, seq_k, BLOCK_N):
        k_idx = n + offs_n
        p = tl.load(
            p_rows + k_idx[None, :],
            mask=(q_idx[:, None] < seq_q) & (k_idx[None, :] < seq_k),
            other=0.0,
        )
        v_ptrs = v_base + k_idx[:, None].to(tl.int64) * stride_vs + offs_d[None, :] * stride_vd
        v = load_rows(v_ptrs, k_idx, seq_k, offs_d, HEAD_DIM, True, True)
        acc = mma(p.to(v.dtype), v, acc, UPCAST, PRECISION)
    o_ptrs = (o_ptr + b64 * stride_ob + h.to(tl.int64) * stride_oh
              + q_idx[:, None].to(tl.int64) * stride_ol + offs_d[None, :] * stride_od)  # fmt: skip
    tl.store(
        o_ptrs,
        acc.to(o_ptr.dtype.element_ty),
        mask=(q_idx[:, None] < seq_q) & (offs_d[None, :] < HEAD_DIM),
    )


def launch_naive(
    p: Problem,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> None:
    """O for a dense, dropout-free ``p`` through the score matrix in memory."""
    if p.seq_q == 0 or p.batch * p.heads == 0:
        return
    meta = common_meta(p, q.device)
    for flag in ("BOTTOM_RIGHT", "IS_VARLEN", "HAS_DROPOUT"):
        del meta[flag]
    s = torch.empty((p.batch, p.heads, p.seq_q, p.seq_k), device=q.device, dtype=torch.float32)
    mask_strides = mask.stride() if mask is not None else (0, 0, 0, 0)
    if p.seq_k > 0:
        grid = (cdiv(p.seq_q, BLOCK), cdiv(p.seq_k, BLOCK), p.batch * p.heads)
        _naive_scores_kernel[grid](
            q, k, s, mask if mask is not None else q, *head_strides(q, False),
            *head_strides(k, False), *mask_strides, p.heads, p.group, p.seq_q, p.seq_k,
            scale * LOG2E, p.left, p.right, BLOCK_M=BLOCK, BLOCK_N=BLOCK, **meta,
        )  # fmt: skip
        block = min(1024, max(16, next_power_of_2(p.seq_k)))
        _naive_softmax_kernel[(p.batch * p.heads * p.seq_q,)](s, p.seq_k, BLOCK=block, num_warps=4)
    for flag in ("MASK_KIND", "HAS_LEFT", "HAS_RIGHT"):
        del meta[flag]
    _naive_pv_kernel[(cdiv(p.seq_q, BLOCK), p.batch * p.heads)](
        s, v, o, *head_strides(v, False), *head_strides(o, False),
        p.heads, p.group, p.seq_q, p.seq_k, BLOCK_M=BLOCK, BLOCK_N=BLOCK, **meta,
    )  # fmt: skip
