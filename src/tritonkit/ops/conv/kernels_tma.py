"""The conv2d forward kernels that load their tiles by TMA (Hopper's tensor memory accelerator,
``tl.make_tensor_descriptor``): the implicit GEMM of any window at stride 1 or 2, and the 1x1
stride-1 GEMM.

A TMA load of a box whose coordinates fall outside the tensor fills zeros, so the padding of a
convolution costs nothing: the A tile of tap (kh, kw) is the box of input pixels shifted by
``(kh * DH - PH, kw * DW - PW)``, negative or past the edge where the window overhangs. No
address is computed per element, no mask is built: the warps only issue the copies and the
products, where the pointer kernels (``kernels.py``) spend most of their instructions on the
addresses and masks of each step's gathers.

A tile is ``NB`` images x ``BH`` output rows x ``BW`` output columns of pixels (``BLOCK_M`` =
NB * BH * BW rows of the GEMM), chosen per layer so that the boxes waste the fewest rows at the
edges (a 7x7 layer takes 2 x 8 x 8, a 56x56 one 2 x 8 x 8 with no waste).

Stride 2 is read through a view of the NHWC input as (N, H/2, 2, W/2, 2*C): input row ``ih``
is (row ``ih // 2``, phase ``ih % 2``), column ``iw`` is (column ``iw // 2``, channel offset
``(iw % 2) * C``), so the pixels of one tap at stride 2 are again one box, and a window
row before the first (``ih = -1``) is row -1: zeros, as padding is. It needs H and W even and
C a multiple of BLOCK_K (a box never reads into the other phase's channels).
"""

from __future__ import annotations

import triton
import triton.language as tl

from tritonkit.ops._core.gemm import tile_coords
from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.math import act
from tritonkit.ops.conv.kernels import _dot, _pixels, _store_tile


@triton.jit
def _tap_origin(k, PAD, DIL, S: tl.constexpr):
    """(cell, phase) of window tap ``k``: the input offset ``k * DIL - PAD`` as ``S * cell +
    phase`` with 0 <= phase < S (numerators kept non-negative: integer division truncates)."""
    d = k * DIL - PAD + S * PAD
    return d // S - PAD, d % S


@kernel
def conv_fwd_tma_kernel(
    x_ptr, w_ptr, bias_ptr, res_ptr, out_ptr,
    N, H, W, C, OH, OW, K,
    PH, PW, DH, DW,
    stride_rn, stride_rc, stride_rh, stride_rw,
    S: tl.constexpr,  # the stride, both ways: 1 or 2
    KH: tl.constexpr, KW: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BH: tl.constexpr, BW: tl.constexpr,  # output rows and columns of a tile
    SPLIT: tl.constexpr,  # > 1: program_id(1) reduces 1/SPLIT of the steps into out's slab
    W_FLAT: tl.constexpr,  # C % BLOCK_K == 0: the weight read as a (K, KH * KW * C) matrix
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """One tile of NB = BLOCK_M / (BH * BW) images x BH x BW output pixels by BLOCK_N output
    channels. x, the weight (K, KH, KW, C) and the output are dense channels_last.

    SPLIT > 1 (a layer of few tiles and a long reduction: a 7x7 plane): ``out`` is an fp32
    workspace of SPLIT dense (N, OH, OW, K) slabs, one per split, which
    ``split_epilogue_kernel`` adds in a fixed order before the epilogue."""
    NB: tl.constexpr = BLOCK_M // (BH * BW)
    tiles_h = tl.cdiv(OH, BH)
    tiles_w = tl.cdiv(OW, BW)
    per_image = tiles_h * tiles_w
    tiles_m = tl.cdiv(N, NB) * per_image
    pid_m, pid_n = tile_coords(tl.program_id(0), tiles_m, tl.cdiv(K, BLOCK_N), GROUP_M)
    n0 = (pid_m // per_image) * NB
    t = pid_m % per_image
    oh0 = (t // tiles_w) * BH
    ow0 = (t % tiles_w) * BW
    off_n = pid_n * BLOCK_N
    x_desc = tl.make_tensor_descriptor(
        x_ptr, [N, H // S, S, W // S, S * C], [H * W * C, S * W * C, W * C, S * C, 1],
        [NB, BH, 1, BW, BLOCK_K],
    )  # fmt: skip
    if W_FLAT:  # (K, KH * KW * C): 2-D blocks, which wgmma reads from shared memory as they are
        w_desc = tl.make_tensor_descriptor(
            w_ptr, [K, KH * KW * C], [KH * KW * C, 1], [BLOCK_N, BLOCK_K]
        )
    else:  # a block must not run into the next tap's channels: zeros past C
        w_desc = tl.make_tensor_descriptor(
            w_ptr, [K, KH * KW, C], [KH * KW * C, C, 1], [BLOCK_N, 1, BLOCK_K]
        )
    cb = tl.cdiv(C, BLOCK_K)
    steps = KH * KW * cb
    lo = 0
    hi = steps
    if SPLIT > 1:
        per = tl.cdiv(steps, SPLIT)
        lo = tl.program_id(1) * per
        hi = tl.minimum(steps, lo + per)
    acc_t = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for step in range(lo, hi):
        r = step // cb
        c0 = (step - r * cb) * BLOCK_K
        kh = r // KW
        cell_h, phase_h = _tap_origin(kh, PH, DH, S)
        cell_w, phase_w = _tap_origin(r - kh * KW, PW, DW, S)
        a = x_desc.load([n0, oh0 + cell_h, phase_h, ow0 + cell_w, phase_w * C + c0])
        if W_FLAT:
            b = w_desc.load([off_n, r * C + c0])
        else:
            b = w_desc.load([off_n, r, c0]).reshape(BLOCK_N, BLOCK_K)
        # out^T = W x^T: the pixels' box is wgmma's B operand, read from shared memory (the
        # reshape of a TMA box is a view there); as the A operand it would pass through
        # registers, which Triton gives an A operand that is not loaded as it is.
        acc_t = _dot(b, a.reshape(BLOCK_M, BLOCK_K).T, acc_t, INPUT_PRECISION, UPCAST)
    acc = acc_t.T
    if SPLIT > 1:
        ws_desc = tl.make_tensor_descriptor(
            out_ptr, [SPLIT, N, OH, OW, K], [N * OH * OW * K, OH * OW * K, OW * K, K, 1],
            [1, NB, BH, BW, BLOCK_N],
        )  # fmt: skip
        ws_desc.store([tl.program_id(1), n0, oh0, ow0, off_n], acc.reshape(1, NB, BH, BW, BLOCK_N))
        return
    cols = off_n + tl.arange(0, BLOCK_N)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)[None, :]
    if HAS_RES:
        i = tl.arange(0, BLOCK_M)
        n = n0 + i // (BH * BW)
        oh = oh0 + (i // BW) % BH
        ow = ow0 + i % BW
        ok = (n < N) & (oh < OH) & (ow < OW)
        rows = n.to(tl.int64) * stride_rn + oh * stride_rh + ow * stride_rw
        mask = ok[:, None] & (cols < K)[None, :]
        r_ptrs = res_ptr + rows[:, None] + (cols * stride_rc)[None, :]
        acc += tl.load(r_ptrs, mask=mask, other=0.0).to(tl.float32)
    acc = act(acc, ACT)
    o_desc = tl.make_tensor_descriptor(
        out_ptr, [N, OH, OW, K], [OH * OW * K, OW * K, K, 1], [NB, BH, BW, BLOCK_N]
    )
    out = acc.to(out_ptr.dtype.element_ty).reshape(NB, BH, BW, BLOCK_N)
    o_desc.store([n0, oh0, ow0, off_n], out)


@kernel
def conv1x1_tma_kernel(
    x_ptr, w_ptr, bias_ptr, res_ptr, out_ptr,
    M, OH, OW, C, K,
    stride_rn, stride_rc, stride_rh, stride_rw,
    stride_on, stride_oc, stride_oh, stride_ow,
    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    OUT_TMA: tl.constexpr,  # out (and the residual, if any) dense (M, K): by descriptor
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """The 1x1 GEMM with TMA loads: x dense NHWC is an (M, C) row-major matrix and the weight
    a (K, C) one (K-major B), so both tiles come in by descriptor (no masks: TMA zero-fills
    past the edges) and the pipeline's copies leave the warps free for the products.

    OUT_TMA: the output, and the residual, are dense (M, K) matrices too; the epilogue reads
    the residual's tile and writes the output's by descriptor, whole rows of 16-byte sectors,
    where loads and stores in the products' register layout touch half of each sector."""
    pid_m, pid_n = tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(K, BLOCK_N), GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    a_desc = tl.make_tensor_descriptor(x_ptr, [M, C], [C, 1], [BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(w_ptr, [K, C], [C, 1], [BLOCK_N, BLOCK_K])
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, C, BLOCK_K):
        a = a_desc.load([off_m, k])
        b = b_desc.load([off_n, k]).T
        acc = _dot(a, b, acc, INPUT_PRECISION, UPCAST)
    rn = off_n + tl.arange(0, BLOCK_N)
    if OUT_TMA:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=rn < K, other=0.0).to(tl.float32)[None, :]
        if HAS_RES:
            r_desc = tl.make_tensor_descriptor(res_ptr, [M, K], [K, 1], [BLOCK_M, BLOCK_N])
            acc += r_desc.load([off_m, off_n]).to(tl.float32)
        acc = act(acc, ACT)
        o_desc = tl.make_tensor_descriptor(out_ptr, [M, K], [K, 1], [BLOCK_M, BLOCK_N])
        o_desc.store([off_m, off_n], acc.to(out_ptr.dtype.element_ty))
    else:
        rm = off_m + tl.arange(0, BLOCK_M)
        n, oh, ow, m_ok = _pixels(rm, OH, OW, M)
        rows_o = n * stride_on + oh * stride_oh + ow * stride_ow
        rows_r = n * stride_rn + oh * stride_rh + ow * stride_rw
        _store_tile(
            acc, rows_o, rows_r, rn, m_ok, rn < K, bias_ptr, res_ptr, out_ptr, stride_rc,
            stride_oc, HAS_BIAS, HAS_RES, ACT,
        )  # fmt: skip


@kernel
def split_epilogue_kernel(
    ws_ptr, bias_ptr, res_ptr, out_ptr,
    M, OH, OW, K,
    plane,  # M * K: elements between two slabs
    stride_rn, stride_rc, stride_rh, stride_rw,
    stride_on, stride_oc, stride_oh, stride_ow,
    SPLIT: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """out = act(the sum of SPLIT fp32 (M, K) slabs + bias + residual), the slabs added in
    split order (deterministic) and the result rounded once."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n, oh, ow, m_ok = _pixels(rm, OH, OW, M)
    n_ok = rn < K
    ptrs = ws_ptr + rm.to(tl.int64)[:, None] * K + rn[None, :]
    mask = m_ok[:, None] & n_ok[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in tl.static_range(SPLIT):
        acc += tl.load(ptrs, mask=mask, other=0.0)
        ptrs += plane
    rows_o = n * stride_on + oh * stride_oh + ow * stride_ow
    rows_r = n * stride_rn + oh * stride_rh + ow * stride_rw
    _store_tile(
        acc, rows_o, rows_r, rn, m_ok, n_ok, bias_ptr, res_ptr, out_ptr, stride_rc, stride_oc,
        HAS_BIAS, HAS_RES, ACT,
    )  # fmt: skip
