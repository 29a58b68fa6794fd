"""Weight-only int8 linear: ``y = (x @ W_int8^T) * scale + bias`` with the int8 weight read as
stored (half the bytes of a bf16 weight) and widened in registers.

Every M runs the tiled kernel below, decode sizes too (a few rows, bound by reading W once), with
split-K where the tiles are too few and the fp32 partial products summed in a fixed order
(``sum_partials``). A call's plan (``weight_only_plan``) is cached per input signature."""

from __future__ import annotations

import triton.language as tl

from tritonkit.ops._core.launch import kernel


@kernel
def _wo_int8_kernel(
    x_ptr,  # (M, K) activations
    w_ptr,  # (N, K) int8 weight
    scale_ptr,  # (N,) float32 per-output-channel scale
    bias_ptr,  # (N,) bias (HAS_BIAS)
    out_ptr,  # (M, N) output, or (SPLIT_K, M, N) float32 partial products
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_om,
    stride_on,
    stride_os,  # between partial products (SPLIT_K > 1)
    k_per_split,  # K elements per split, a multiple of BLOCK_K
    HAS_BIAS: tl.constexpr,
    IEEE: tl.constexpr,  # float32 x: exact products, not TF32
    UPCAST: tl.constexpr,  # the CPU interpreter: bf16 operands as float32 (see _launch)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    k_start = pid_s.to(tl.int64) * k_per_split
    for k0 in range(0, k_per_split, BLOCK_K):
        k = k_start + k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        x = tl.load(
            x_ptr + m[:, None] * stride_xm + k[None, :] * stride_xk,
            (m < M)[:, None] & k_ok[None, :],
            other=0.0,
        )
        w = tl.load(
            w_ptr + n[:, None] * stride_wn + k[None, :] * stride_wk,
            (n < N)[:, None] & k_ok[None, :],
            other=0,
        )
        if UPCAST:  # int8 straight to float32 (the interpreter's int8 -> bf16 cast is wrong too)
            w = w.to(tl.float32)
            acc = tl.dot(x.to(tl.float32), tl.trans(w), acc, input_precision="ieee")
        else:
            w = w.to(x.dtype)  # exact: |w| <= 127 in bf16, fp16 and fp32
            if IEEE:
                acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
            else:
                acc = tl.dot(x, tl.trans(w), acc)
    acc = acc * tl.load(scale_ptr + n, n < N, other=0.0)[None, :]
    if HAS_BIAS and pid_s == 0:
        acc += tl.load(bias_ptr + n, n < N, other=0.0).to(tl.float32)[None, :]
    mask = (m < M)[:, None] & (n < N)[None, :]
    offs = pid_s * stride_os + m[:, None] * stride_om + n[None, :] * stride_on
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask)
