"""Dequantize: ``(code - zero_point) * scale`` in float32, rounded once to the output dtype, for
every granularity (a scale per block of rows and columns of a 2-D view) and packed int4."""

from __future__ import annotations

import triton.language as tl

from tritonkit.ops._core.launch import kernel


@kernel
def _dequant_kernel(
    q_ptr,  # (n_rows, n_cols) codes (PACKED: (n_rows, n_cols // 2) bytes)
    scale_ptr,  # (n_rows // rows_per_scale, n_cols // cols_per_scale) float32, unit column stride
    zp_ptr,  # same shape: int32 zero points (HAS_ZP)
    out_ptr,  # (n_rows, n_cols) output
    n_rows,
    n_cols,
    stride_qr,
    stride_qc,
    stride_or,
    stride_oc,
    rows_per_scale,
    cols_per_scale,
    stride_sr,  # scale rows apart (the compressed collectives interleave codes and scales)
    HAS_ZP: tl.constexpr,
    PACKED: tl.constexpr,
    FP8_NAN: tl.constexpr,  # interpreter, float8 codes: the smallest NaN code (0: none)
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (r < n_rows)[:, None] & (c < n_cols)[None, :]
    if PACKED:
        byte = tl.load(q_ptr + r[:, None] * stride_qr + (c // 2)[None, :], mask, other=0)
        nibble = (byte.to(tl.int32) >> ((c & 1) * 4)[None, :]) & 0xF
        code = (nibble - ((nibble & 8) << 1)).to(tl.float32)  # sign-extend 4 bits
    else:
        raw = tl.load(q_ptr + r[:, None] * stride_qr + c[None, :] * stride_qc, mask)
        code = raw.to(tl.float32)
        if FP8_NAN:  # the interpreter widens NaN and inf codes to finite numbers
            low = raw.to(tl.uint8, bitcast=True) & 0x7F
            if FP8_NAN == 0x7D:  # E5M2 has infinities
                code = tl.where(low == 0x7C, code * float("inf"), code)
            code = tl.where(low >= FP8_NAN, float("nan"), code)
    s_offs = (r // rows_per_scale)[:, None] * stride_sr + (c // cols_per_scale)[None, :]
    if HAS_ZP:
        code = code - tl.load(zp_ptr + s_offs, mask, other=0).to(tl.float32)
    out = code * tl.load(scale_ptr + s_offs, mask, other=1.0)
    tl.store(out_ptr + r[:, None] * stride_or + c[None, :] * stride_oc, out, mask)
