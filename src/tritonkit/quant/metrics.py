"""Quantization error, measured on the tensors' device with torch ops (float64 sums): SQNR, clip
ratio, absolute-error percentiles, amax and scale statistics. One host transfer per report."""

from __future__ import annotations

import torch

from tritonkit.ops.quant.config import QFormat
from tritonkit.quant import reference
from tritonkit.quant.tensor import QuantizedTensor, dequantize

PERCENTILES = (50, 90, 99)
STAT_NAMES = (
    "sqnr_db", "clip_ratio", "p50_abs", "p90_abs", "p99_abs", "max_abs", "mean_abs",
    "nonfinite", "amax_mean", "amax_max", "scale_mean", "scale_max", "scale_min",
)  # fmt: skip


def sqnr_db(x: torch.Tensor, x_hat: torch.Tensor) -> torch.Tensor:
    """Signal-to-quantization-noise ratio, ``10 log10(sum x^2 / sum (x - x_hat)^2)`` in dB, over
    finite elements of x, in float64 (0-d tensor; inf when x_hat is exact)."""
    x64, e = x.detach().double(), x.detach().double() - x_hat.detach().double()
    keep = torch.isfinite(x64)
    signal = torch.where(keep, x64 * x64, 0.0).sum()
    noise = torch.where(keep, e * e, 0.0).sum()
    return 10 * torch.log10(signal / noise)


def percentiles(values: torch.Tensor, qs=PERCENTILES) -> torch.Tensor:
    """``numpy.percentile(values, qs)`` (linear interpolation) in float64, on values' device."""
    v = values.detach().double().flatten().sort().values
    n = v.numel()
    if n == 0:
        return torch.full((len(qs),), float("nan"), dtype=torch.float64, device=values.device)
    pos = torch.tensor([q / 100 * (n - 1) for q in qs], dtype=torch.float64, device=v.device)
    lo = pos.floor().long()
    hi = pos.ceil().long()
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _top_code_threshold(fmt: QFormat) -> float:
    """|x * qscale| at and above which the cast saturates: the largest code plus half its unit
    (ties round up, to an even code beyond the range)."""
    if not fmt.is_float:
        return fmt.qmax + 0.5
    top_exp = int(fmt.qmax).bit_length() - 1
    return fmt.qmax + 2.0 ** (top_exp - fmt.mantissa - 1)


def clip_mask(x: torch.Tensor, q: QuantizedTensor) -> torch.Tensor:
    """Finite elements of x whose code saturated (the unsaturated rounding is out of range)."""
    fmt = q.qformat
    block = tuple(b if b else 1 for b in q.block)
    x64 = x.detach().double()
    scale = q.scale.double()
    qscale = reference.f32(1.0 / scale)
    v = reference.f32(x64 * _expand(qscale, block, x64))
    if fmt.symmetric:
        out = v.abs() >= _top_code_threshold(fmt)
    else:
        c = torch.round(v) + _expand(q.zero_point.double(), block, x64)
        out = (c < fmt.qmin) | (c > fmt.qmax)
    return out & torch.isfinite(x64)


def _expand(s: torch.Tensor, block: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    if s.dim() == 0 or like.dim() == 0:
        return s
    return reference.expand(s, block)


def error_stats(
    x: torch.Tensor, q: QuantizedTensor, x_hat: torch.Tensor | None = None
) -> dict[str, float]:
    """SQNR (dB), clip ratio, |x - x_hat| p50/p90/p99, max and mean, amax and scale statistics
    of ``q`` = a quantization of ``x`` (``x_hat``: its dequantization, computed if not given)."""
    if x_hat is None:
        x_hat = dequantize(q, torch.float32)
    x64 = x.detach().double()
    finite = torch.isfinite(x64)
    err = (x64 - x_hat.double()).abs()[finite]
    zero = torch.zeros(1, dtype=torch.float64, device=x.device)
    parts = [
        sqnr_db(x, x_hat).reshape(1),
        clip_mask(x, q).sum().double().reshape(1) / finite.sum().clamp(min=1),
        percentiles(err),
        err.max().reshape(1) if err.numel() else zero,
        err.mean().reshape(1) if err.numel() else zero,
        (~finite).sum().double().reshape(1),
    ]
    amax = _block_amax(x64, q)
    scale = q.scale.double().flatten()
    parts += [amax.mean().reshape(1), amax.max().reshape(1)]
    parts += [scale.mean().reshape(1), scale.max().reshape(1), scale.min().reshape(1)]
    values = torch.cat(parts).tolist()
    return dict(zip(STAT_NAMES, values))


def _block_amax(x64: torch.Tensor, q: QuantizedTensor) -> torch.Tensor:
    if q.amax is not None:
        return q.amax.double().flatten()
    if x64.numel() == 0:
        return torch.zeros(1, dtype=torch.float64, device=x64.device)
    a = torch.where(torch.isfinite(x64), x64.abs(), 0.0)
    if x64.dim() == 0:
        return a.reshape(1)
    return reference._reduce(a, lambda t, ax: t.amax(ax), q.block).flatten()
