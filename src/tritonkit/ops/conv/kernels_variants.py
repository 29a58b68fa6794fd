"""The workbench's earlier versions of the convolution (seed 001's evolution), kept to be timed
beside the implicit GEMM: ``direct`` (the loop nest on the CUDA cores: every output tile sums
one input channel of one tap at a time, no tensor cores) and ``im2col`` (the patches gathered
into a (pixels, KH*KW*C/groups) matrix in memory, then one GEMM per group)."""

from __future__ import annotations

import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops.conv.kernels import _pixels, _store_tile


@kernel
def conv_direct_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr,
    M, H, W, OH, OW, C_G, K_G,
    stride_xn, stride_xc, stride_xh, stride_xw,
    stride_wo, stride_wc, stride_wh, stride_ww,
    stride_on, stride_oc, stride_oh, stride_ow,
    SH, SW, PH, PW, DH, DW,
    KH: tl.constexpr, KW: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Direct convolution: a (BLOCK_M pixels) x (BLOCK_N channels) tile accumulates the outer
    product of one input channel's column with one weight row per (kh, kw, c), in fp32 FMAs."""
    g = tl.program_id(2)
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n, oh, ow, m_ok = _pixels(rm, OH, OW, M)
    n_ok = rn < K_G
    x_rows = x_ptr + n * stride_xn + (g * C_G).to(tl.int64) * stride_xc
    w_cols = w_ptr + (g * K_G + rn).to(tl.int64) * stride_wo
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kh in range(0, KH):
        ih = oh * SH - PH + kh * DH
        for kw in range(0, KW):
            iw = ow * SW - PW + kw * DW
            ok = m_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            a_row = x_rows + ih.to(tl.int64) * stride_xh + iw.to(tl.int64) * stride_xw
            w_tap = w_cols + kh * stride_wh + kw * stride_ww
            for c in range(0, C_G):
                a = tl.load(a_row + c * stride_xc, mask=ok, other=0.0).to(tl.float32)
                b = tl.load(w_tap + c * stride_wc, mask=n_ok, other=0.0).to(tl.float32)
                acc += a[:, None] * b[None, :]
    rows = n * stride_on + oh * stride_oh + ow * stride_ow
    _store_tile(
        acc, rows, rows, g * K_G + rn, m_ok, n_ok, bias_ptr, out_ptr, out_ptr, stride_oc,
        stride_oc, HAS_BIAS, False, ACT,
    )  # fmt: skip


@kernel
def im2col_kernel(
    x_ptr, cols_ptr,
    M, H, W, OH, OW, C_G, K_COLS,
    stride_xn, stride_xc, stride_xh, stride_xw,
    stride_cg, stride_cm,
    SH, SW, PH, PW, DH, DW,
    KW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """cols[g, pixel, (kh * KW + kw) * C_G + c] = x[n, g * C_G + c, ih, iw] (0 in the padding):
    the patch matrix the im2col variant multiplies, written to memory."""
    g = tl.program_id(2)
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    n, oh, ow, m_ok = _pixels(rm, OH, OW, M)
    k_ok = rk < K_COLS
    tap = rk // C_G
    c = rk - tap * C_G
    kh = tap // KW
    kw = tap - kh * KW
    ih = (oh * SH - PH)[:, None] + (kh * DH)[None, :]
    iw = (ow * SW - PW)[:, None] + (kw * DW)[None, :]
    ok = m_ok[:, None] & k_ok[None, :] & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
    src = x_ptr + (n * stride_xn)[:, None] + ((g * C_G + c).to(tl.int64) * stride_xc)[None, :]
    src += ih.to(tl.int64) * stride_xh + iw.to(tl.int64) * stride_xw
    v = tl.load(src, mask=ok, other=0.0)
    dst = cols_ptr + g.to(tl.int64) * stride_cg + rm.to(tl.int64)[:, None] * stride_cm + rk[None, :]
    tl.store(dst, v, mask=m_ok[:, None] & k_ok[None, :])
