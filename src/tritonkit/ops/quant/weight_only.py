"""Weight-only int8 linear: ``y = (x @ W_int8^T) * scale + bias`` with the int8 weight read as
stored (half the bytes of a bf16 weight) and widened in registers.

Decode (at most 16 rows of x) is bound by reading W once: it runs the matmul family's decode
kernel (``ops/matmul/decode.py``: narrow bands of output channels, 16-byte loads of W, the
scale and bias in the epilogue). More rows run the tiled kernel below, with split-K where the
tiles are too few and the fp32 partial products summed in a fixed order (``sum_partials``).
A call's plan (``weight_only_plan``) is cached per input signature."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton.language as tl

from tritonkit import _tuning
from tritonkit.ops._core.device import interpreter_enabled, sm_count
from tritonkit.ops._core.gemm import Epilogue, Problem, matrix
from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.layout import cdiv, next_power_of_2
from tritonkit.ops._core.plan import cached
from tritonkit.ops._core.reduce import sum_partials
from tritonkit.ops._core.registry import define_op, eager_direct
from tritonkit.ops.matmul.plan import DecodeGemmLaunch, decode_launch, signature


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


@dataclass(frozen=True)
class WeightOnlyConfig:
    """Tiles, K splits (partial products summed after) and warps/stages of the GEMM."""

    block_m: int = 16
    block_n: int = 64
    block_k: int = 256
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4

    def to_tuning(self) -> _tuning.Config:
        params = {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n, "BLOCK_K": self.block_k,
                  "SPLIT_K": self.split_k}  # fmt: skip
        return _tuning.Config(params, self.num_warps, self.num_stages)

    @staticmethod
    def from_tuning(c: _tuning.Config) -> WeightOnlyConfig:
        p = c.params
        return WeightOnlyConfig(p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"], p["SPLIT_K"],
                                c.num_warps, c.num_stages)  # fmt: skip


def default_config(m: int, n: int, k: int, sms: int) -> WeightOnlyConfig:
    """Few rows: narrow tiles of N and enough K splits for two programs per SM; more rows: wider
    tiles and no split (the GEMM is no longer bound by reading W alone)."""
    block_m = min(max(16, next_power_of_2(m)), 64)
    if m > 64:
        return WeightOnlyConfig(64, 128, 64, 1, 4, 3)
    block_n, block_k = 64, 256
    tiles = cdiv(n, block_n) * cdiv(m, block_m)
    split = 1
    while tiles * split < 2 * sms and k // (split * 2) >= 4 * block_k:
        split *= 2
    return WeightOnlyConfig(block_m, block_n, block_k, split, 4, 4)


def _candidates(m: int, n: int, k: int, sms: int) -> list[WeightOnlyConfig]:
    first = default_config(m, n, k, sms)
    if m > 64:
        return [
            first,
            WeightOnlyConfig(128, 128, 64, 1, 8, 3),
            WeightOnlyConfig(64, 64, 64, 1, 4, 4),
        ]
    out = [first]
    for bn in (32, 64, 128):
        for bk in (128, 256):
            for split in (1, 2, 4, 8):
                for warps in (4, 8):
                    c = WeightOnlyConfig(first.block_m, bn, bk, split, warps, 4)
                    if c not in out and k // split >= bk:
                        out.append(c)
    return out


def _launch(x2, w, scale, bias, out, cfg: WeightOnlyConfig) -> None:
    m, k = x2.shape
    n = w.shape[0]
    k_per_split = cdiv(cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    grid = (cdiv(n, cfg.block_n), cdiv(m, cfg.block_m), cfg.split_k)
    target = out
    if cfg.split_k > 1:
        target = torch.empty((cfg.split_k, m, n), dtype=torch.float32, device=x2.device)
    _wo_int8_kernel[grid](
        x2, w, scale, bias, target, m, n, k, *x2.stride(), *w.stride(),
        n, 1, m * n, k_per_split,
        HAS_BIAS=bias is not None, IEEE=x2.dtype == torch.float32,
        # The interpreter's bf16 tl.dot is wrong; float32 products of the same bf16 values are
        # exact, as the tensor cores' are, so the result is the GPU's up to the summation order.
        UPCAST=interpreter_enabled() and x2.dtype == torch.bfloat16,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if cfg.split_k > 1:
        sum_partials(target.view(cfg.split_k, m * n), out.view(m * n))


def _config(x2, w, scale, bias, out) -> WeightOnlyConfig:
    m, k = x2.shape
    n = w.shape[0]
    sms = sm_count(x2.device)
    if not _tuning.consulted():  # the interpreter: the default as is
        return default_config(m, n, k, sms)
    key = {"m": next_power_of_2(m), "n": n, "k": k, "dtype": str(x2.dtype)}

    def choose() -> WeightOnlyConfig:
        cands = [c.to_tuning() for c in _candidates(m, n, k, sms)]
        best = _tuning.tune(
            "int8_weight_only", key, cands,
            lambda c: _launch(x2, w, scale, bias, out, WeightOnlyConfig.from_tuning(c)),
        )  # fmt: skip
        return WeightOnlyConfig.from_tuning(best)

    return cached("int8_weight_only", tuple(key.items()), choose)


class WeightOnlyPlan:
    """``weight_only_fwd``'s plan for one input signature: the output's shape and either the
    decode kernel's bound launch (at most ``DECODE_MAX_M`` rows) or the tiled kernel's config.
    """

    __slots__ = ("config", "decode", "shape")

    def __init__(self, shape, decode: DecodeGemmLaunch | None, config: WeightOnlyConfig | None):
        self.shape, self.decode, self.config = shape, decode, config

    def run(self, x2, w, scale, bias) -> torch.Tensor:
        out = torch.empty(self.shape, dtype=x2.dtype, device=x2.device)
        if self.decode is not None:
            self.decode(x2, w, out, (None, scale, bias, None, None))
            return out
        if out.numel() == 0:
            return out
        if x2.shape[1] == 0:
            return out.zero_() if bias is None else out.copy_(bias.expand(self.shape))
        scale = scale.reshape(-1).contiguous()  # (N,) vectors, read with unit stride
        bias = bias.contiguous() if bias is not None else None
        cfg = self.config or _config(x2, w, scale, bias, out)
        _launch(x2, w, scale, bias, out, cfg)
        return out


# Decode-sized x (a few tokens) takes the matmul family's decode kernel: W streamed once in
# 16-byte loads by enough narrow bands of columns to fill the GPU, the scale per output
# channel and the bias in its epilogue.
DECODE_MAX_M = 16


def weight_only_plan(x2, w, scale, bias, config: WeightOnlyConfig | None = None) -> WeightOnlyPlan:
    """The plan ``weight_only_fwd`` runs for these inputs (cached; built now if new)."""
    key = (signature(x2), signature(w), signature(scale), signature(bias), x2.device, config)

    def build() -> WeightOnlyPlan:
        m, k = x2.shape
        n = w.shape[0]
        if config is None and 0 < m <= DECODE_MAX_M and n > 0 and k > 0:
            out = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
            p = Problem(matrix(x2), matrix(w.t()), matrix(out), m, n, k)
            epi = Epilogue(scale_b=scale, scale_b_cols=True, bias=bias)
            return WeightOnlyPlan((m, n), decode_launch(p, epi), None)
        return WeightOnlyPlan((m, n), None, config)

    return cached("int8_weight_only.plan", key, build)


def weight_only_fwd(
    x2: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    config: WeightOnlyConfig | None = None,
) -> torch.Tensor:
    """``(x2 @ w.T) * scale + bias`` for (M, K) x2 and an (N, K) int8 w; scale (N,) float32
    (or (N, 1), a column with unit stride: Int8Linear's buffer).

    ``config`` forces the tiled kernel with that config (tests)."""
    return weight_only_plan(x2, w, scale, bias, config).run(x2, w, scale, bias)


@define_op("tritonkit::int8_weight_only_linear")
def _weight_only_op(
    x2: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    return weight_only_fwd(x2, w, scale, bias)


@_weight_only_op.register_fake
def _(x2, w, scale, bias):
    return x2.new_empty((x2.shape[0], w.shape[0]))


call_weight_only = eager_direct(_weight_only_op)
