"""The workbench's other versions of the convolution (seed 001's evolution), kept to be timed
beside the implicit GEMM: ``direct`` (the loop nest on the CUDA cores: every output tile sums
one input channel of one tap at a time, no tensor cores), ``im2col`` (the patches gathered
into a (pixels, KH*KW*C/groups) matrix in memory, then one GEMM per group) and Winograd
F(2x2, 3x3) (three transforms around 16 GEMMs)."""

from __future__ import annotations

import triton
import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.math import act
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


# ---- Winograd F(2x2, 3x3) -------------------------------------------------------------------
# Each 2x2 block of output pixels from a 4x4 patch of input: V = B^T d B per patch and channel,
# U = G g G^T per filter, then for each of the 16 positions xi of the 4x4 transform a GEMM
# M[xi] = V[xi] @ U[xi] over the channels, and Y = A^T M A. 16 products of (tiles x C) (C x K)
# instead of 36 multiply-adds per output pixel of the 3x3 window: 2.25x fewer, for transforms
# that read and write V and M in memory. The matrices (Lavin and Gray, 2016):
#   B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]
#   G = [[1, 0, 0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2], [0, 0, 1]]
#   A^T = [[1, 1, 1, 0], [0, 1, -1, -1]]


@triton.jit
def _bt(d0, d1, d2, d3):
    """B^T applied to four values along one axis of the patch."""
    return d0 - d2, d1 + d2, d2 - d1, d1 - d3


@triton.jit
def _g(g0, g1, g2):
    """G applied to three taps along one axis of the filter."""
    return g0, 0.5 * (g0 + g1 + g2), 0.5 * (g0 - g1 + g2), g2


@triton.jit
def _at(m0, m1, m2, m3):
    """A^T applied to four transform positions along one axis."""
    return m0 + m1 + m2, m1 - m2 - m3


@triton.jit
def _patch_pixel(row, ci, iw, h_ok, c_ok, W, stride_xw):
    ok = h_ok & (iw >= 0) & (iw < W)
    ptrs = row + iw.to(tl.int64) * stride_xw
    v = tl.load(ptrs[:, None] + ci[None, :], mask=ok[:, None] & c_ok[None, :], other=0.0)
    return v.to(tl.float32)


@triton.jit
def _patch_row(x_rows, ci, ih, iw0, ok_t, c_ok, H, W, stride_xh, stride_xw):
    """Patch row ``ih`` (4 pixels from ``iw0``) of every tile, zeros in the padding, in fp32,
    with B^T applied along it."""
    h_ok = ok_t & (ih >= 0) & (ih < H)
    row = x_rows + ih.to(tl.int64) * stride_xh
    return _bt(
        _patch_pixel(row, ci, iw0, h_ok, c_ok, W, stride_xw),
        _patch_pixel(row, ci, iw0 + 1, h_ok, c_ok, W, stride_xw),
        _patch_pixel(row, ci, iw0 + 2, h_ok, c_ok, W, stride_xw),
        _patch_pixel(row, ci, iw0 + 3, h_ok, c_ok, W, stride_xw),
    )


@kernel
def winograd_input_kernel(
    x_ptr, v_ptr,
    T, TH, TW, C, H, W,
    stride_xn, stride_xc, stride_xh, stride_xw,
    PH, PW,
    PLANE,  # T * C: elements of one transform position's (T, C) matrix
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """V[xi, t, c] = (B^T d B)[xi] for the 4x4 input patch d of tile t (output pixels (2 th, 2
    tw) to (2 th + 1, 2 tw + 1) of image n) and channel c; V is dense (16, T, C)."""
    rt = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    rc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    n, th, tw, ok_t = _pixels(rt, TH, TW, T)
    c_ok = rc < C
    x_rows = x_ptr + n * stride_xn
    ci = rc.to(tl.int64) * stride_xc
    ih0 = 2 * th - PH
    iw0 = 2 * tw - PW
    # Rows of the patch with B^T applied along each row (over its 4 columns).
    r0 = _patch_row(x_rows, ci, ih0, iw0, ok_t, c_ok, H, W, stride_xh, stride_xw)
    r1 = _patch_row(x_rows, ci, ih0 + 1, iw0, ok_t, c_ok, H, W, stride_xh, stride_xw)
    r2 = _patch_row(x_rows, ci, ih0 + 2, iw0, ok_t, c_ok, H, W, stride_xh, stride_xw)
    r3 = _patch_row(x_rows, ci, ih0 + 3, iw0, ok_t, c_ok, H, W, stride_xh, stride_xw)
    mask = ok_t[:, None] & c_ok[None, :]
    dst = v_ptr + rt.to(tl.int64)[:, None] * C + rc[None, :]
    for j in tl.static_range(4):  # then B^T down each column
        v = _bt(r0[j], r1[j], r2[j], r3[j])
        for i in tl.static_range(4):
            tl.store(dst + (i * 4 + j) * PLANE, v[i].to(v_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _filter_row(src, ok, stride_ww):
    return _g(
        tl.load(src, mask=ok, other=0.0).to(tl.float32),
        tl.load(src + stride_ww, mask=ok, other=0.0).to(tl.float32),
        tl.load(src + 2 * stride_ww, mask=ok, other=0.0).to(tl.float32),
    )


@kernel
def winograd_weight_kernel(
    w_ptr, u_ptr, K, C,
    stride_wo, stride_wc, stride_wh, stride_ww,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """U[xi, c, k] = (G g G^T)[xi] for the 3x3 filter g of output channel k and input channel
    c, computed in fp32; U is dense (16, C, K), the B operands of the 16 GEMMs."""
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = r < K * C
    k = r // C
    c = r - k * C
    src = w_ptr + k.to(tl.int64) * stride_wo + c.to(tl.int64) * stride_wc
    r0 = _filter_row(src + 0 * stride_wh, ok, stride_ww)  # G along each filter row
    r1 = _filter_row(src + 1 * stride_wh, ok, stride_ww)
    r2 = _filter_row(src + 2 * stride_wh, ok, stride_ww)
    dst = u_ptr + c.to(tl.int64) * K + k
    for j in tl.static_range(4):  # then G down each column
        u = _g(r0[j], r1[j], r2[j])
        for i in tl.static_range(4):
            tl.store(dst + (i * 4 + j) * K * C, u[i].to(u_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _product_row(src, i: tl.constexpr, PLANE, mask):
    return _at(
        tl.load(src + (i * 4 + 0) * PLANE, mask=mask, other=0.0),
        tl.load(src + (i * 4 + 1) * PLANE, mask=mask, other=0.0),
        tl.load(src + (i * 4 + 2) * PLANE, mask=mask, other=0.0),
        tl.load(src + (i * 4 + 3) * PLANE, mask=mask, other=0.0),
    )


@kernel
def winograd_output_kernel(
    m_ptr, bias_ptr, out_ptr,
    T, TH, TW, K, OH, OW,
    stride_on, stride_oc, stride_oh, stride_ow,
    PLANE,  # T * K
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """out = act(A^T M A + bias) for the 2x2 output block of each tile; M is dense fp32
    (16, T, K), the 16 GEMMs' products; blocks past the plane's edge are masked."""
    rt = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    rk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    n, th, tw, ok_t = _pixels(rt, TH, TW, T)
    k_ok = rk < K
    src = m_ptr + rt.to(tl.int64)[:, None] * K + rk[None, :]
    mask = ok_t[:, None] & k_ok[None, :]
    r0 = _product_row(src, 0, PLANE, mask)  # A^T along each row of M
    r1 = _product_row(src, 1, PLANE, mask)
    r2 = _product_row(src, 2, PLANE, mask)
    r3 = _product_row(src, 3, PLANE, mask)
    bias = tl.zeros((BLOCK_K,), dtype=tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + rk, mask=k_ok, other=0.0).to(tl.float32)
    base = out_ptr + (n * stride_on)[:, None] + (rk.to(tl.int64) * stride_oc)[None, :]
    for b in tl.static_range(2):  # then A^T down each column: output column 2 tw + b
        y = _at(r0[b], r1[b], r2[b], r3[b])
        ow = 2 * tw + b
        for a in tl.static_range(2):
            oh = 2 * th + a
            ok = mask & ((oh < OH) & (ow < OW))[:, None]
            v = act(y[a] + bias[None, :], ACT)
            ptrs = base + (oh.to(tl.int64) * stride_oh + ow.to(tl.int64) * stride_ow)[:, None]
            tl.store(ptrs, v.to(out_ptr.dtype.element_ty), mask=ok)
