"""The float64 reference of tritonkit's quantization: the same rounding as the kernels
(tritonkit/ops/quant/config.py), step by step, with every float32 operation computed in
float64 and rounded to float32 (exact: float64 holds a float32 product, and a float64
quotient rounded to float32 is the correctly rounded float32 quotient). Tests and specs compare
the kernels with it bit for bit."""

from __future__ import annotations

import math

import torch

from tritonkit.ops.quant.config import EPS, QFormat


def f32(t: torch.Tensor) -> torch.Tensor:
    """Round float64 values to float32 (to nearest, ties to even), kept as float64."""
    return t.float().double()


def _blocked(t: torch.Tensor, block: tuple[int, ...]) -> torch.Tensor:
    """t viewed as (n0 / b0, b0, n1 / b1, b1, ...): a block's elements on the odd axes."""
    dims = []
    for n, b in zip(t.shape, block):
        dims += [n // b, b]
    return t.reshape(dims)


def _reduce(t: torch.Tensor, fn, block: tuple[int, ...]) -> torch.Tensor:
    out = _blocked(t, block)
    for axis in range(len(block) * 2 - 1, 0, -2):
        out = fn(out, axis)
    return out


def expand(s: torch.Tensor, block: tuple[int, ...]) -> torch.Tensor:
    """Per-block values repeated over their blocks (the shape of x)."""
    for d, b in enumerate(block):
        s = s.repeat_interleave(b, dim=d)
    return s


def _pow2_floor(q: torch.Tensor) -> torch.Tensor:
    _, e = torch.frexp(q)
    return torch.ldexp(torch.ones_like(q), e - 1)


def scales(
    x: torch.Tensor, fmt: QFormat, block: tuple[int, ...], pow2: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(qscale, scale, zero_point, amax) per block, float64 holding float32 values."""
    x64 = x.detach().double().cpu()
    finite = torch.isfinite(x64)
    eps = f32(torch.tensor(EPS, dtype=torch.float64))
    empty = x64.numel() == 0
    zeros = torch.zeros([n // b if b else 1 for n, b in zip(x.shape, block)], dtype=torch.float64)
    if fmt.symmetric:
        a = torch.where(finite, x64.abs(), 0.0)
        amax = zeros if empty else _reduce(a, lambda t, ax: t.amax(ax), block)
        qscale = f32(fmt.qmax / torch.maximum(amax, eps))
        if pow2:
            qscale = _pow2_floor(qscale)
        return qscale, f32(1.0 / qscale), None, amax
    v = torch.where(finite, x64, 0.0)
    lo = zeros if empty else torch.clamp(_reduce(v, lambda t, ax: t.amin(ax), block), max=0.0)
    hi = zeros if empty else torch.clamp(_reduce(v, lambda t, ax: t.amax(ax), block), min=0.0)
    span = torch.maximum(f32(hi - lo), eps)
    scale = f32(span / (fmt.qmax - fmt.qmin))
    qscale = f32(1.0 / scale)
    zp = torch.clamp(fmt.qmin - torch.round(f32(lo * qscale)), fmt.qmin, fmt.qmax)
    return qscale, scale, zp, torch.maximum(-lo, hi)


def encode(v: torch.Tensor, zp: torch.Tensor | None, fmt: QFormat) -> torch.Tensor:
    """Codes of v = x * qscale (float64 holding float32), in the format's storage dtype
    (4-bit codes unpacked, as int8)."""
    if fmt.is_float:
        return torch.clamp(v, fmt.qmin, fmt.qmax).float().to(fmt.storage)
    c = torch.round(torch.clamp(v, -(2.0**22), 2.0**22))
    if zp is not None:
        c = c + zp
    c = torch.clamp(c, fmt.qmin, fmt.qmax)
    return torch.where(torch.isnan(v), 0.0, c).to(torch.int8)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Pairs of 4-bit codes along the last dim, the first in the low nibble."""
    c = codes.to(torch.int32) & 0xF
    return (c[..., 0::2] | (c[..., 1::2] << 4)).to(torch.uint8)


def quantize(
    x: torch.Tensor,
    fmt: QFormat,
    block: tuple[int, ...],
    pow2: bool = False,
    given_scale: torch.Tensor | None = None,
    given_qscale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(codes, scale, zero_point) as the kernels compute them (codes unpacked)."""
    if x.dim() == 0:
        codes, scale, zp = quantize(x.reshape(1), fmt, (1,), pow2, given_scale, given_qscale)
        return codes.reshape(()), scale.reshape(()), None if zp is None else zp.reshape(())
    if given_scale is not None or given_qscale is not None:
        if given_scale is not None:
            scale = given_scale.detach().double().cpu()
            qscale = f32(1.0 / scale)
        else:
            qscale = given_qscale.detach().double().cpu()
            scale = f32(1.0 / qscale)
        zp = None
    else:
        qscale, scale, zp, _ = scales(x, fmt, block, pow2)
    if x.numel() == 0:
        codes = torch.empty(x.shape, dtype=torch.int8 if not fmt.is_float else fmt.storage)
        return codes, scale.float(), None if zp is None else zp.to(torch.int32)
    v = f32(x.detach().double().cpu() * expand(qscale.cpu(), block))
    codes = encode(v, None if zp is None else expand(zp, block), fmt)
    return codes, scale.float(), None if zp is None else zp.to(torch.int32)


def dequantize(
    codes: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None,
    block: tuple[int, ...],
    dtype: torch.dtype,
) -> torch.Tensor:
    """``(codes - zero_point) * scale`` in float32, rounded once to ``dtype`` (codes unpacked)."""
    if codes.dim() == 0:
        return dequantize(codes.reshape(1), scale.reshape(1), zero_point, (1,), dtype).reshape(())
    c = codes.double().cpu()
    if c.numel() == 0:
        return c.to(dtype)
    if zero_point is not None:
        c = c - expand(zero_point.double().cpu(), block)
    return f32(c * expand(scale.double().cpu(), block)).to(dtype)


def sqnr_db(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """10 log10(mean x^2 / mean (x - x_hat)^2) in float64 (inf when exact)."""
    x64, e = x.double(), x.double() - x_hat.double()
    noise = float((e * e).mean())
    return math.inf if noise == 0 else 10 * math.log10(float((x64 * x64).mean()) / noise)
