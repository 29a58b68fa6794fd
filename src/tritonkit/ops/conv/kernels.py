"""The conv2d kernels: implicit GEMM forward (any kernel size), the 1x1 stride-1 GEMM, the
depthwise direct kernel, dgrad and wgrad (implicit GEMMs), and the small backward helpers
(activation derivative, bias gradient).

Every kernel takes each tensor's four strides in (N, C, H, W) order, so NCHW, channels_last
and strided views are read where they lie; channels_last (C stride 1) is the fast case: a row
of the GEMM's A tile (one output pixel, a block of input channels) is then one contiguous read.

The forward GEMM view of a group: M = N * OH * OW output pixels (rows), N = Cout / groups
output channels (columns), K = KH * KW * Cin / groups, walked as (kh, kw, cin block) so that a
step reads one contiguous block of channels per pixel. Nothing is gathered into memory (no
im2col buffer): the padding, the edges and the dilation are masks and offsets of the loads.
Offsets from a batch index on are int64 (an activation can pass 2**31 elements); accumulation
is fp32. The fused epilogue computes ``act(conv + bias + residual)``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tritonkit.ops._core.gemm import tile_coords
from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.math import ACT_RELU, act, act_grad


@triton.jit
def _pixels(m, OH, OW, M):
    """(n, oh, ow, valid) of GEMM rows ``m`` (output pixels in (n, oh, ow) order)."""
    ow = m % OW
    t = m // OW
    oh = t % OH
    n = t // OH
    return n.to(tl.int64), oh, ow, m < M


@triton.jit
def _dot(a, b, acc, INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    # UPCAST: the interpreter's tl.dot is wrong on bf16 operands (docs/DESIGN.md, "Machines").
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc, input_precision=INPUT_PRECISION)


@triton.jit
def _store_tile(
    acc, rows_o, rows_r, cols, row_ok, col_ok, bias_ptr, res_ptr, out_ptr,
    stride_rc, stride_oc,
    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr,
):  # fmt: skip
    """The fused epilogue: ``act(acc + bias[col] + residual)`` stored in out's dtype."""
    mask = row_ok[:, None] & col_ok[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_RES:
        r = tl.load(res_ptr + rows_r[:, None] + (cols * stride_rc)[None, :], mask=mask, other=0.0)
        acc += r.to(tl.float32)
    acc = act(acc, ACT)
    out = out_ptr + rows_o[:, None] + (cols * stride_oc)[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


@kernel
def conv_fwd_kernel(
    x_ptr, w_ptr, bias_ptr, res_ptr, out_ptr,
    M, H, W, OH, OW,
    C_G,  # input channels per group
    K_G,  # output channels per group
    stride_xn, stride_xc, stride_xh, stride_xw,
    stride_wo, stride_wc, stride_wh, stride_ww,
    stride_rn, stride_rc, stride_rh, stride_rw,
    stride_on, stride_oc, stride_oh, stride_ow,
    SH, SW, PH, PW, DH, DW,
    KH: tl.constexpr, KW: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """One (BLOCK_M pixels) x (BLOCK_N output channels) tile of group ``program_id(1)``."""
    g = tl.program_id(1)
    pid_m, pid_n = tile_coords(
        tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(K_G, BLOCK_N), GROUP_M
    )
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n, oh, ow, m_ok = _pixels(rm, OH, OW, M)
    n_ok = rn < K_G
    ih0 = oh * SH - PH
    iw0 = ow * SW - PW
    x_rows = x_ptr + n * stride_xn + (g * C_G).to(tl.int64) * stride_xc
    w_cols = w_ptr + (g * K_G + rn).to(tl.int64)[None, :] * stride_wo
    cb = tl.cdiv(C_G, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(0, KH * KW * cb):
        r = step // cb
        c = (step - r * cb) * BLOCK_K + rk
        kh = r // KW
        kw = r - kh * KW
        ih = ih0 + kh * DH
        iw = iw0 + kw * DW
        ok = m_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        c_ok = c < C_G
        a_row = x_rows + ih.to(tl.int64) * stride_xh + iw.to(tl.int64) * stride_xw
        a = tl.load(
            a_row[:, None] + (c * stride_xc)[None, :], mask=ok[:, None] & c_ok[None, :], other=0.0
        )
        b_off = (c * stride_wc)[:, None] + kh * stride_wh + kw * stride_ww
        b = tl.load(w_cols + b_off, mask=c_ok[:, None] & n_ok[None, :], other=0.0)
        acc = _dot(a, b, acc, INPUT_PRECISION, UPCAST)
    cols = g * K_G + rn
    rows_o = n * stride_on + oh * stride_oh + ow * stride_ow
    rows_r = n * stride_rn + oh * stride_rh + ow * stride_rw
    _store_tile(
        acc, rows_o, rows_r, cols, m_ok, n_ok, bias_ptr, res_ptr, out_ptr, stride_rc, stride_oc,
        HAS_BIAS, HAS_RES, ACT,
    )  # fmt: skip


@kernel
def conv_fwd_rows_kernel(
    x_ptr, w_ptr, bias_ptr, res_ptr, out_ptr,
    M, H, W, OH, OW, C, K,
    stride_xn, stride_xh,
    stride_wo, stride_wh,
    stride_rn, stride_rc, stride_rh, stride_rw,
    stride_on, stride_oc, stride_oh, stride_ow,
    SH, SW, PH, PW, DH,
    KH: tl.constexpr,
    ROW: tl.constexpr,  # KW * C: one window row's taps, contiguous in NHWC
    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """Few input channels (a network's stem: 3): one K step reads a whole window row, KW
    pixels x C channels, which NHWC keeps contiguous (x's W stride is C, the weight is
    channels_last), instead of KW steps that would each fill 3 of 16 reduction lanes."""
    pid_m, pid_n = tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(K, BLOCK_N), GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n, oh, ow, m_ok = _pixels(rm, OH, OW, M)
    n_ok = rn < K
    iw = (ow * SW - PW)[:, None] + (rk // C)[None, :]  # tap kw of element rk
    k_ok = rk < ROW
    w_ok = m_ok[:, None] & k_ok[None, :] & (iw >= 0) & (iw < W)
    a_cols = (ow * SW - PW).to(tl.int64) * C
    w_cols = w_ptr + rn.to(tl.int64)[None, :] * stride_wo + rk[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kh in range(0, KH):
        ih = oh * SH - PH + kh * DH
        ok = w_ok & ((ih >= 0) & (ih < H))[:, None]
        a_row = x_ptr + n * stride_xn + ih.to(tl.int64) * stride_xh + a_cols
        a = tl.load(a_row[:, None] + rk[None, :], mask=ok, other=0.0)
        b = tl.load(w_cols + kh * stride_wh, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = _dot(a, b, acc, INPUT_PRECISION, UPCAST)
    rows_o = n * stride_on + oh * stride_oh + ow * stride_ow
    rows_r = n * stride_rn + oh * stride_rh + ow * stride_rw
    _store_tile(
        acc, rows_o, rows_r, rn, m_ok, n_ok, bias_ptr, res_ptr, out_ptr, stride_rc, stride_oc,
        HAS_BIAS, HAS_RES, ACT,
    )  # fmt: skip


@kernel
def conv1x1_kernel(
    x_ptr, w_ptr, bias_ptr, res_ptr, out_ptr,
    M, OH, OW, C_G, K_G,
    stride_xn, stride_xc, stride_xh, stride_xw,
    stride_wo, stride_wc,
    stride_rn, stride_rc, stride_rh, stride_rw,
    stride_on, stride_oc, stride_oh, stride_ow,
    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """1x1, stride 1, no padding: a plain GEMM of the pixels' channel rows (NHWC: a dense
    (M, Cin) matrix) with the (Cin, Cout) weight; no spatial masks, one address per row."""
    g = tl.program_id(1)
    pid_m, pid_n = tile_coords(
        tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(K_G, BLOCK_N), GROUP_M
    )
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n, oh, ow, m_ok = _pixels(rm, OH, OW, M)
    n_ok = rn < K_G
    a_rows = x_ptr + n * stride_xn + oh * stride_xh + ow * stride_xw
    a_rows += (g * C_G).to(tl.int64) * stride_xc
    w_cols = w_ptr + (g * K_G + rn).to(tl.int64)[None, :] * stride_wo
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(C_G, BLOCK_K)):
        c = k * BLOCK_K + rk
        c_ok = c < C_G
        a = tl.load(
            a_rows[:, None] + (c * stride_xc)[None, :],
            mask=m_ok[:, None] & c_ok[None, :],
            other=0.0,
        )
        b = tl.load(
            w_cols + (c * stride_wc)[:, None], mask=c_ok[:, None] & n_ok[None, :], other=0.0
        )
        acc = _dot(a, b, acc, INPUT_PRECISION, UPCAST)
    cols = g * K_G + rn
    rows_o = n * stride_on + oh * stride_oh + ow * stride_ow
    rows_r = n * stride_rn + oh * stride_rh + ow * stride_rw
    _store_tile(
        acc, rows_o, rows_r, cols, m_ok, n_ok, bias_ptr, res_ptr, out_ptr, stride_rc, stride_oc,
        HAS_BIAS, HAS_RES, ACT,
    )  # fmt: skip


@kernel
def depthwise_kernel(
    x_ptr, w_ptr, bias_ptr, res_ptr, out_ptr,
    N, H, W, OH, OW, C_OUT,
    MULT,  # output channels per input channel (groups == Cin)
    stride_xn, stride_xc, stride_xh, stride_xw,
    stride_wo, stride_wh, stride_ww,
    stride_rn, stride_rc, stride_rh, stride_rw,
    stride_on, stride_oc, stride_oh, stride_ow,
    SH, SW, PH, PW, DH, DW,
    KH: tl.constexpr, KW: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr,
    BH: tl.constexpr, BW: tl.constexpr,  # output rows and columns of a tile
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """Depthwise conv, direct: a tile of BLOCK_P pixels (BLOCK_P / (BH * BW) images of BH x BW
    output pixels) x BLOCK_C channels summing KH * KW products on the CUDA cores (each output
    reads one input channel: no GEMM to make). A tile is a block of the output plane, not a
    run of flattened pixels, so that its taps read one (BH + 2) x (BW + 2) patch (3 x 3,
    stride 1) that stays in L1: every input pixel leaves L2 about once, not once per window
    row."""
    NB: tl.constexpr = BLOCK_P // (BH * BW)
    tiles_w = tl.cdiv(OW, BW)
    per_image = tl.cdiv(OH, BH) * tiles_w
    pid = tl.program_id(0)
    t = pid % per_image
    i = tl.arange(0, BLOCK_P)
    n = ((pid // per_image) * NB + i // (BH * BW)).to(tl.int64)
    oh = (t // tiles_w) * BH + (i // BW) % BH
    ow = (t % tiles_w) * BW + i % BW
    p_ok = (n < N) & (oh < OH) & (ow < OW)
    co = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = co < C_OUT
    ci = (co // MULT).to(tl.int64) * stride_xc
    x_rows = x_ptr + n * stride_xn
    w_cols = w_ptr + co.to(tl.int64) * stride_wo
    acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    for kh in tl.static_range(KH):
        ih = oh * SH - PH + kh * DH
        h_ok = p_ok & (ih >= 0) & (ih < H)
        for kw in tl.static_range(KW):
            iw = ow * SW - PW + kw * DW
            ok = h_ok & (iw >= 0) & (iw < W)
            row = x_rows + ih.to(tl.int64) * stride_xh + iw.to(tl.int64) * stride_xw
            xv = tl.load(row[:, None] + ci[None, :], mask=ok[:, None] & c_ok[None, :], other=0.0)
            wv = tl.load(w_cols + kh * stride_wh + kw * stride_ww, mask=c_ok, other=0.0)
            acc += xv.to(tl.float32) * wv.to(tl.float32)[None, :]
    rows_o = n * stride_on + oh * stride_oh + ow * stride_ow
    rows_r = n * stride_rn + oh * stride_rh + ow * stride_rw
    _store_tile(
        acc, rows_o, rows_r, co, p_ok, c_ok, bias_ptr, res_ptr, out_ptr, stride_rc, stride_oc,
        HAS_BIAS, HAS_RES, ACT,
    )  # fmt: skip


@kernel
def conv_dgrad_kernel(
    dy_ptr, w_ptr, dx_ptr,
    M, H, W, OH, OW, C_G, K_G,
    stride_dn, stride_dc, stride_dh, stride_dw,
    stride_wo, stride_wc, stride_wh, stride_ww,
    stride_xn, stride_xc, stride_xh, stride_xw,
    SH, SW, PH, PW, DH, DW,
    KH: tl.constexpr, KW: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """dx as an implicit GEMM: rows are input pixels (n, ih, iw), columns input channels of a
    group, K walks (kh, kw, output-channel block). Input pixel ih meets output row oh where
    ``oh * SH == ih + PH - kh * DH``; the other (kh, kw) taps are masked (a stride-s layer
    keeps 1 in s**2 of them)."""
    g = tl.program_id(1)
    pid_m, pid_n = tile_coords(
        tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(C_G, BLOCK_N), GROUP_M
    )
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n, ih, iw, m_ok = _pixels(rm, H, W, M)
    n_ok = rn < C_G
    dy_rows = dy_ptr + n * stride_dn + (g * K_G).to(tl.int64) * stride_dc
    w_cols = w_ptr + (g * K_G).to(tl.int64) * stride_wo + rn[None, :] * stride_wc
    kb = tl.cdiv(K_G, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(0, KH * KW * kb):
        r = step // kb
        k = (step - r * kb) * BLOCK_K + rk
        kh = r // KW
        kw = r - kh * KW
        th = ih + PH - kh * DH
        tw = iw + PW - kw * DW
        oh = th // SH
        ow = tw // SW
        ok = m_ok & (th >= 0) & (tw >= 0) & (oh * SH == th) & (ow * SW == tw)
        ok = ok & (oh < OH) & (ow < OW)
        k_ok = k < K_G
        a_row = dy_rows + oh.to(tl.int64) * stride_dh + ow.to(tl.int64) * stride_dw
        a = tl.load(
            a_row[:, None] + (k * stride_dc)[None, :], mask=ok[:, None] & k_ok[None, :], other=0.0
        )
        b_off = k.to(tl.int64)[:, None] * stride_wo + kh * stride_wh + kw * stride_ww
        b = tl.load(w_cols + b_off, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = _dot(a, b, acc, INPUT_PRECISION, UPCAST)
    cols = g * C_G + rn
    rows = n * stride_xn + ih * stride_xh + iw * stride_xw
    _store_tile(
        acc, rows, rows, cols, m_ok, n_ok, dx_ptr, dx_ptr, dx_ptr, stride_xc, stride_xc,
        False, False, 0,
    )  # fmt: skip


@kernel
def conv_wgrad_kernel(
    dy_ptr, x_ptr, dw_ptr,
    M, H, W, OH, OW, C_G, K_G,
    stride_dn, stride_dc, stride_dh, stride_dw,
    stride_xn, stride_xc, stride_xh, stride_xw,
    stride_wo, stride_wc, stride_wh, stride_ww,
    SH, SW, PH, PW, DH, DW,
    M_PER_SPLIT,  # pixels reduced by one program (a multiple of BLOCK_K)
    SLAB,  # SPLIT > 1: elements between two splits' fp32 partial sums in dw
    KW: tl.constexpr,
    SPLIT: tl.constexpr,  # > 1: each split stores its fp32 partial sums in a slab of its own
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """dw[co, ci, kh, kw] = sum over pixels of dy[pixel, co] * x[tap (kh, kw) of pixel, ci]: a
    GEMM of (output channels) x (input channels) per tap, reducing over N * OH * OW pixels,
    split over SPLIT programs where that reduction is long and the tiles few (their partial
    sums, one slab each, are added in a fixed order by ``split_sum_kernel``: no zeroed buffer,
    no atomics)."""
    tap = tl.program_id(1)
    kh = tap // KW
    kw = tap - kh * KW
    g = tl.program_id(2) // SPLIT
    s = tl.program_id(2) % SPLIT
    tiles_n = tl.cdiv(C_G, BLOCK_N)
    pid_m = tl.program_id(0) // tiles_n
    pid_n = tl.program_id(0) % tiles_n
    co = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ci = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    co_ok = co < K_G
    ci_ok = ci < C_G
    dy_cols = dy_ptr + (g * K_G + co).to(tl.int64)[:, None] * stride_dc
    x_cols = x_ptr + (g * C_G + ci).to(tl.int64)[None, :] * stride_xc
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    m_end = tl.minimum(M, (s + 1) * M_PER_SPLIT)
    for m0 in range(s * M_PER_SPLIT, m_end, BLOCK_K):
        n, oh, ow, p_ok = _pixels(m0 + rk, OH, OW, m_end)
        ih = oh * SH - PH + kh * DH
        iw = ow * SW - PW + kw * DW
        ok = p_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        dy_off = n * stride_dn + oh.to(tl.int64) * stride_dh + ow.to(tl.int64) * stride_dw
        a = tl.load(dy_cols + dy_off[None, :], mask=co_ok[:, None] & p_ok[None, :], other=0.0)
        x_off = n * stride_xn + ih.to(tl.int64) * stride_xh + iw.to(tl.int64) * stride_xw
        b = tl.load(x_cols + x_off[:, None], mask=ok[:, None] & ci_ok[None, :], other=0.0)
        acc = _dot(a, b, acc, INPUT_PRECISION, UPCAST)
    out = dw_ptr + (g * K_G + co).to(tl.int64)[:, None] * stride_wo + (ci * stride_wc)[None, :]
    out += kh * stride_wh + kw * stride_ww
    mask = co_ok[:, None] & ci_ok[None, :]
    if SPLIT > 1:
        out += s.to(tl.int64) * SLAB
    tl.store(out, acc.to(dw_ptr.dtype.element_ty), mask=mask)


@kernel
def act_grad_kernel(
    dy_ptr, src_ptr, dz_ptr, numel,
    ACT: tl.constexpr,  # relu reads the output (z > 0 where y > 0); others read z
    BLOCK: tl.constexpr,
):  # fmt: skip
    """dz = dy * act'(z) over three dense tensors of one layout (flat)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    z = tl.load(src_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if ACT == ACT_RELU:
        dz = tl.where(z > 0.0, dy, 0.0)
    else:
        dz = dy * act_grad(z, ACT)
    tl.store(dz_ptr + offs, dz.to(dz_ptr.dtype.element_ty), mask=mask)


@kernel
def bias_grad_kernel(
    dz_ptr, db_ptr,
    M, OH, OW, C,
    stride_n, stride_c, stride_h, stride_w,
    M_PER_SPLIT,
    SPLIT: tl.constexpr,  # > 1: split s stores its fp32 partial sums at db[s * C:]
    BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """db[c] = sum over pixels of dz[pixel, c] (split: partial sums, see split_sum_kernel)."""
    c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < C
    s = tl.program_id(1)
    cols = dz_ptr + c.to(tl.int64)[None, :] * stride_c
    acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
    m_end = tl.minimum(M, (s + 1) * M_PER_SPLIT)
    for m0 in range(s * M_PER_SPLIT, m_end, BLOCK_M):
        n, oh, ow, ok = _pixels(m0 + tl.arange(0, BLOCK_M), OH, OW, m_end)
        rows = n * stride_n + oh.to(tl.int64) * stride_h + ow.to(tl.int64) * stride_w
        v = tl.load(cols + rows[:, None], mask=ok[:, None] & c_ok[None, :], other=0.0)
        acc += tl.sum(v.to(tl.float32), axis=0)
    out = db_ptr + c
    if SPLIT > 1:
        out += s.to(tl.int64) * C
    tl.store(out, acc.to(db_ptr.dtype.element_ty), mask=c_ok)


@kernel
def conv_dgrad_phase_kernel(
    dy_ptr, w_ptr, dx_ptr,
    H, W, OH, OW, C_G, K_G,
    stride_dn, stride_dc, stride_dh, stride_dw,
    stride_wo, stride_wc, stride_wh, stride_ww,
    stride_xn, stride_xc, stride_xh, stride_xw,
    PH, PW,
    N_BATCH,
    SH: tl.constexpr, SW: tl.constexpr,
    KH: tl.constexpr, KW: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """dx of a strided, undilated convolution, one stride phase per ``program_id(2)``: the
    input pixels with ``ih % SH == ph`` and ``iw % SW == pw`` meet exactly the taps ``kh ==
    (ph + PH) mod SH (+ SH, ...)``, ``kw`` likewise, so each phase is a dense implicit GEMM
    over its own taps (no masked taps, none of the s**2-fold work of ``conv_dgrad_kernel``);
    a phase no tap reaches (a 1x1 stride-2 layer's odd pixels) stores zeros."""
    g = tl.program_id(1)
    phase = tl.program_id(2)
    ph = phase // SW
    pw = phase - ph * SW
    hp = (H - ph + SH - 1) // SH  # this phase's rows and columns of pixels
    wp = (W - pw + SW - 1) // SW
    m_p = N_BATCH * hp * wp
    kh0 = (ph + PH) % SH
    kw0 = (pw + PW) % SW
    taps_h = (KH - kh0 + SH - 1) // SH
    taps_w = (KW - kw0 + SW - 1) // SW
    m_most = N_BATCH * tl.cdiv(H, SH) * tl.cdiv(W, SW)  # phase 0's pixels: the grid's rows
    pid_m, pid_n = tile_coords(
        tl.program_id(0), tl.cdiv(m_most, BLOCK_M), tl.cdiv(C_G, BLOCK_N), GROUP_M
    )
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n, i, j, m_ok = _pixels(rm, hp, wp, m_p)
    ih = ph + i * SH
    iw = pw + j * SW
    n_ok = rn < C_G
    dy_rows = dy_ptr + n * stride_dn + (g * K_G).to(tl.int64) * stride_dc
    w_cols = w_ptr + (g * K_G).to(tl.int64) * stride_wo + rn[None, :] * stride_wc
    kb = tl.cdiv(K_G, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(0, taps_h * taps_w * kb):
        r = step // kb
        k = (step - r * kb) * BLOCK_K + rk
        th = r // taps_w
        kh = kh0 + th * SH
        kw = kw0 + (r - th * taps_w) * SW
        oh = (ih + PH - kh) // SH  # exact: ih + PH - kh is a multiple of SH
        ow = (iw + PW - kw) // SW
        ok = m_ok & (ih + PH >= kh) & (iw + PW >= kw) & (oh < OH) & (ow < OW)
        k_ok = k < K_G
        a_row = dy_rows + oh.to(tl.int64) * stride_dh + ow.to(tl.int64) * stride_dw
        a_mask = ok[:, None] & k_ok[None, :]
        a = tl.load(a_row[:, None] + (k * stride_dc)[None, :], mask=a_mask, other=0.0)
        b_off = k.to(tl.int64)[:, None] * stride_wo + kh * stride_wh + kw * stride_ww
        b = tl.load(w_cols + b_off, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = _dot(a, b, acc, INPUT_PRECISION, UPCAST)
    cols = g * C_G + rn
    rows = n * stride_xn + ih * stride_xh + iw * stride_xw
    _store_tile(
        acc, rows, rows, cols, m_ok, n_ok, dx_ptr, dx_ptr, dx_ptr, stride_xc, stride_xc,
        False, False, 0,
    )  # fmt: skip


@kernel
def split_sum_kernel(src_ptr, dst_ptr, numel, SPLIT, BLOCK: tl.constexpr):
    """dst = the sum of SPLIT dense fp32 slabs of ``numel`` elements (src), added in split
    order and rounded once to dst's dtype; dst is dense in the slabs' layout (flat)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    ptrs = src_ptr + offs
    for _ in range(0, SPLIT):
        acc += tl.load(ptrs, mask=mask, other=0.0)
        ptrs += numel
    tl.store(dst_ptr + offs, acc.to(dst_ptr.dtype.element_ty), mask=mask)
