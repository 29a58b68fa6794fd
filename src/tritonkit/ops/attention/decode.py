"""Split-KV decoding (flash-decoding): a few queries against a long K/V.

With L of 1-16 queries per head, one program per query block would leave most of the GPU idle
and each program would walk the whole K/V. Here the keys are split into ``splits`` chunks,
one program per (chunk, row block, batch x K/V head), and every program takes the rows of
all the query heads that share its K/V head (``group x L`` rows: GQA reads K and V once per
K/V head, not once per query head). Each writes its chunk's normalized partial output and
log-sum-exp in fp32; a second kernel merges the chunks of each row:
``o = sum_s 2^(lse_s - m) o_s / sum_s 2^(lse_s - m)``, ``lse = m + log2(sum_s 2^(lse_s - m))``.

Masks, windows and causal (SDPA's top-left alignment) are applied per element as in the
forward kernel; a chunk the band excludes is skipped without reading it.
"""

from __future__ import annotations

import torch
import triton.language as tl

from tritonkit.ops._core.launch import Bound, kernel
from tritonkit.ops._core.layout import cdiv, next_power_of_2
from tritonkit.ops.attention.config import DecodeGemmConfig, Problem, decode_config, decode_splits
from tritonkit.ops.attention.forward import common_meta, head_strides, load_rows
from tritonkit.ops.attention.tiles import LOG2E, mma, scores


@kernel
def _attn_decode_kernel(
    q_ptr, k_ptr, v_ptr, o_part_ptr, lse_part_ptr, mask_ptr,
    stride_qb, stride_qh, stride_ql, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_pb, stride_ph, stride_pl, stride_ps,  # partial lse (B, H, L, splits); O adds D
    stride_mb, stride_mh, stride_ml, stride_ms,
    n_heads, group, seq_q, seq_k, split_len, scale_log2, left, right,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MASK_KIND: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    split = tl.program_id(0)
    kv_head = tl.program_id(2)
    n_kv = n_heads // group
    b64 = (kv_head // n_kv).to(tl.int64)
    hkv = kv_head % n_kv
    r = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # row = (head in group, query)
    valid = r < group * seq_q
    i = r % seq_q
    h64 = (hkv * group + r // seq_q).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    q_ptrs = (q_ptr + b64 * stride_qb + h64[:, None] * stride_qh
              + i[:, None].to(tl.int64) * stride_ql + offs_d[None, :] * stride_qd)  # fmt: skip
    q = tl.load(q_ptrs, mask=valid[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    mask_rows = mask_ptr + b64 * stride_mb + h64[:, None] * stride_mh  # [BLOCK_M, 1] pointers
    start = split * split_len
    end = tl.minimum(start + split_len, seq_k)
    lo = start
    if HAS_LEFT:  # keys left of every row's window
        lo = tl.maximum(start, start + (tl.maximum(-left - start, 0) // BLOCK_N) * BLOCK_N)
    if HAS_RIGHT:  # keys right of every row's window
        end = tl.minimum(end, tl.maximum(seq_q + right, 0))
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    kv_off = b64 * stride_kb + hkv.to(tl.int64) * stride_kh
    k_ptrs = (
        k_ptr
        + kv_off
        + (lo + offs_n)[:, None].to(tl.int64) * stride_ks
        + offs_d[None, :] * stride_kd
    )
    kv_off = b64 * stride_vb + hkv.to(tl.int64) * stride_vh
    v_ptrs = (
        v_ptr
        + kv_off
        + (lo + offs_n)[:, None].to(tl.int64) * stride_vs
        + offs_d[None, :] * stride_vd
    )
    for n in range(lo, end, BLOCK_N):
        k_idx = n + offs_n
        k = load_rows(k_ptrs, k_idx, end, offs_d, HEAD_DIM, True, HEAD_DIM != BLOCK_D)
        qk = mma(q, tl.trans(k), tl.zeros((BLOCK_M, BLOCK_N), tl.float32), UPCAST, PRECISION)
        s = scores(qk, i[:, None], k_idx[None, :], mask_rows, stride_ml, stride_ms, seq_q, end,
                   0, left, right, scale_log2, True, HAS_LEFT, HAS_RIGHT, MASK_KIND)  # fmt: skip
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = load_rows(v_ptrs, k_idx, end, offs_d, HEAD_DIM, True, HEAD_DIM != BLOCK_D)
        acc = mma(p.to(v.dtype), v, acc * alpha[:, None], UPCAST, PRECISION)
        m_i = m_new
        k_ptrs += BLOCK_N * stride_ks
        v_ptrs += BLOCK_N * stride_vs
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    part = b64 * stride_pb + h64 * stride_ph + i.to(tl.int64) * stride_pl + split * stride_ps
    tl.store(
        lse_part_ptr + part, tl.where(empty, float("-inf"), m_i + tl.math.log2(l_safe)), mask=valid
    )
    o_ptrs = o_part_ptr + part[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(o_ptrs, acc / l_safe[:, None], mask=valid[:, None] & (offs_d[None, :] < HEAD_DIM))


@kernel
def _attn_merge_kernel(
    o_part_ptr, lse_part_ptr, o_ptr, lse_ptr,
    stride_ob, stride_oh, stride_ol, stride_od,
    stride_lb, stride_lh, stride_ll,
    n_heads, seq_q, splits,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)  # (b, h, i) in the partials' contiguous order
    i = row % seq_q
    h = (row // seq_q) % n_heads
    b = row // (seq_q * n_heads)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    part = row.to(tl.int64) * splits + offs_s
    lse_s = tl.load(lse_part_ptr + part, mask=offs_s < splits, other=float("-inf"))
    m = tl.max(lse_s, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.math.exp2(lse_s - m)
    total = tl.sum(w, 0)
    in_range = (offs_s[:, None] < splits) & (offs_d[None, :] < HEAD_DIM)
    o_s = tl.load(o_part_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], mask=in_range, other=0.0)
    empty = total == 0.0
    total_safe = tl.where(empty, 1.0, total)
    o = tl.sum(w[:, None] * o_s, 0) / total_safe
    o_off = b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh + i.to(tl.int64) * stride_ol
    tl.store(
        o_ptr + o_off + offs_d * stride_od, o.to(o_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM
    )
    lse_off = b.to(tl.int64) * stride_lb + h.to(tl.int64) * stride_lh + i.to(tl.int64) * stride_ll
    tl.store(lse_ptr + lse_off, tl.where(empty, float("inf"), m + tl.math.log2(total_safe)))


def decode_rows(p: Problem) -> int:
    """Rows per program: the group's queries, at least 16 (tl.dot's smallest M), at most 64."""
    return max(16, min(64, next_power_of_2(p.group * p.seq_q)))


class DecodePlan:
    """Split-KV decoding of one call key: the outputs' and the partials' layouts and both
    kernels' launches bound once (``launch.Bound``); a call allocates and launches."""

    __slots__ = ("dtype", "lse_shape", "merge", "o_shape", "o_stride", "part_shape", "split")

    def __init__(self, o, lse, part_shape, split: Bound, merge: Bound) -> None:
        self.o_shape, self.o_stride, self.dtype = o.shape, o.stride(), o.dtype
        self.lse_shape, self.part_shape = lse.shape, part_shape
        self.split, self.merge = split, merge

    def __call__(self, q, k, v, mask, cu_q, cu_k, rng) -> tuple[torch.Tensor, torch.Tensor]:
        dev = q.device
        o = torch.empty_strided(self.o_shape, self.o_stride, dtype=self.dtype, device=dev)
        lse = torch.empty(self.lse_shape, dtype=torch.float32, device=dev)
        self.launch(q, k, v, mask, o, lse)
        return o, lse

    def launch(self, q, k, v, mask, o, lse) -> None:
        """Write O and lse (of this plan's layouts) through the fp32 partials."""
        shape = self.part_shape
        lse_part = torch.empty(shape[:-1], device=q.device, dtype=torch.float32)
        o_part = torch.empty(shape, device=q.device, dtype=torch.float32)
        self.split(q, k, v, o_part, lse_part, q if mask is None else mask)
        self.merge(o_part, lse_part, o, lse)


def decode_plan(
    p: Problem,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    config: DecodeGemmConfig | None,
) -> DecodePlan:
    """The plan of a dense, dropout-free ``p`` with few queries, split over the keys
    (``config`` None: tuned, launching on these tensors)."""
    meta = common_meta(p, q.device)
    for flag in ("BOTTOM_RIGHT", "IS_VARLEN", "HAS_DROPOUT"):
        del meta[flag]
    block_m = decode_rows(p)
    mask_strides = mask.stride() if mask is not None else (0, 0, 0, 0)
    mask_arg = mask if mask is not None else q

    def bind(cfg: DecodeGemmConfig) -> tuple[tuple, Bound, Bound]:
        """(the partials' shape, the split launch, the merge launch) of ``cfg``."""
        splits = cfg.splits or decode_splits(p, q.device, block_m)
        split_len = cdiv(cdiv(p.seq_k, splits), cfg.BLOCK_N) * cfg.BLOCK_N
        splits = cdiv(p.seq_k, split_len)
        shape = (p.batch, p.heads, p.seq_q, splits)
        lse_part = torch.empty(shape, device=q.device, dtype=torch.float32)
        o_part = torch.empty((*shape, p.head_dim), device=q.device, dtype=torch.float32)
        grid = (splits, cdiv(p.group * p.seq_q, block_m), p.batch * p.kv_heads)
        split = _attn_decode_kernel.bind(
            grid, q, k, v, o_part, lse_part, mask_arg,
            *head_strides(q, False), *head_strides(k, False), *head_strides(v, False),
            *lse_part.stride(), *mask_strides,
            p.heads, p.group, p.seq_q, p.seq_k, split_len, scale * LOG2E, p.left, p.right,
            BLOCK_M=block_m, BLOCK_N=cfg.BLOCK_N, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages, **meta,
        )  # fmt: skip
        merge = _attn_merge_kernel.bind(
            (p.batch * p.heads * p.seq_q,),
            o_part, lse_part, o, lse, *head_strides(o, False), *lse.stride(),
            p.heads, p.seq_q, splits, HEAD_DIM=p.head_dim, BLOCK_D=p.block_d,
            BLOCK_S=max(2, next_power_of_2(splits)), num_warps=4,
        )  # fmt: skip
        return o_part.shape, split, merge

    def run(cfg: DecodeGemmConfig) -> None:  # a tuning launch
        shape, split, merge = bind(cfg)
        lse_part = torch.empty(shape[:-1], device=q.device, dtype=torch.float32)
        o_part = torch.empty(shape, device=q.device, dtype=torch.float32)
        split(q, k, v, o_part, lse_part, mask_arg)
        merge(o_part, lse_part, o, lse)

    shape, split, merge = bind(config if config is not None else decode_config(p, run))
    return DecodePlan(o, lse, shape, split, merge)


def launch_decode(p, q, k, v, o, lse, mask, scale, config) -> None:
    """Write O and lse for ``p`` with ``config`` (None: tuned), planned for this call alone."""
    decode_plan(p, q, k, v, o, lse, mask, scale, config).launch(q, k, v, mask, o, lse)
