"""Choosing by measurement: the float8 format of each tensor role, the group size against a
clip-ratio target (seed 001), the integer bit width against a target SQNR (seed 000)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from tritonkit.quant.metrics import clip_mask, sqnr_db
from tritonkit.quant.recipes import GroupScaler
from tritonkit.quant.tensor import QuantizedTensor, dequantize, quantize

GROUP_CANDIDATES = (4, 8, 16, 32, 64)
FP8_CANDIDATES = (torch.float8_e4m3fn, torch.float8_e5m2)


def underflow_ratio(x: torch.Tensor, x_hat: torch.Tensor) -> torch.Tensor:
    """Fraction of the nonzero finite elements of x that quantize to 0."""
    nz = (x != 0) & torch.isfinite(x)
    return ((x_hat == 0) & nz).sum().double() / nz.sum().clamp(min=1)


@dataclass
class FormatChoice:
    dtype: torch.dtype
    measured: dict[str, dict[str, float]] = field(default_factory=dict)  # format -> metrics


def choose_format(
    samples: Sequence[torch.Tensor],
    granularity: str = "tensor",
    max_underflow: float = 0.01,
) -> FormatChoice:
    """E4M3 (more precision) unless it flushes more than ``max_underflow`` of the nonzero
    elements of the samples to zero, where E5M2's range (2**-16 .. 57344 against 2**-9 .. 448)
    keeps them; then whichever flushes fewer. Measured with dynamic scaling at
    ``granularity``: SQNR and underflow per format."""
    measured: dict[str, dict[str, float]] = {}
    for dtype in FP8_CANDIDATES:
        sq, uf = [], []
        for x in samples:
            q = quantize(x, dtype, granularity)
            x_hat = dequantize(q, torch.float32)
            sq.append(sqnr_db(x, x_hat))
            uf.append(underflow_ratio(x, x_hat))
        measured[str(dtype).removeprefix("torch.")] = {
            "sqnr_db": float(torch.stack(sq).mean()),
            "underflow": float(torch.stack(uf).mean()),
        }
    e4, e5 = measured["float8_e4m3fn"], measured["float8_e5m2"]
    if e4["underflow"] <= max_underflow or e4["underflow"] <= e5["underflow"]:
        return FormatChoice(torch.float8_e4m3fn, measured)
    return FormatChoice(torch.float8_e5m2, measured)


def choose_formats(
    roles: Mapping[str, Sequence[torch.Tensor]], granularity: str = "tensor", **kw
) -> dict[str, FormatChoice]:
    """``choose_format`` per tensor role ("weight", "activation", "grad_output", ...)."""
    return {role: choose_format(samples, granularity, **kw) for role, samples in roles.items()}


@dataclass
class GroupChoice:
    group_size: int
    clip_ratio: dict[int, float]  # candidate -> mean clip ratio over the samples
    target: float
    met: bool


def choose_group_size(
    samples: Sequence[torch.Tensor],
    dtype: torch.dtype = torch.float8_e4m3fn,
    candidates: Sequence[int] = GROUP_CANDIDATES,
    clip_target: float = 0.01,
    **scaler_kw,
) -> GroupChoice:
    """The smallest group of channels whose scales, kept by a ``GroupScaler`` over the samples
    (successive steps' tensors, channels last), clip at most ``clip_target`` of the elements;
    none: the largest candidate that divides the channels (seed 001's rule).

    Small groups follow each channel's range closely (less rounding error) but their amax
    moves more from step to step, so a scale set by past steps clips more; the clip ratio of a
    sample is measured with the scale the previous samples left, as it would be cast.
    """
    if len(samples) < 2:
        raise ValueError(
            f"choose_group_size: needs at least 2 samples (the clip ratio of a scale carried "
            f"over from earlier steps), got {len(samples)}"
        )
    channels = samples[0].shape[-1]
    usable = [g for g in sorted(candidates) if channels % g == 0]
    if not usable:
        raise ValueError(
            f"choose_group_size: no candidate in {list(candidates)} divides the {channels} channels"
        )
    ratios: dict[int, float] = {}
    for g in usable:
        scaler = GroupScaler(dtype, g, **scaler_kw)
        clipped = []
        for i, x in enumerate(samples):
            q = scaler(x)
            if i:
                clipped.append(clip_mask(x, q).double().mean())
        ratios[g] = float(torch.stack(clipped).mean())
    for g in usable:
        if ratios[g] <= clip_target:
            return GroupChoice(g, ratios, clip_target, True)
    return GroupChoice(usable[-1], ratios, clip_target, False)


@dataclass
class BitsChoice:
    bits: int
    symmetric: bool
    sqnr_db: float
    met: bool
    tried: list[tuple[int, bool, float]]  # (bits, symmetric, SQNR) in the order tried
    quantized: QuantizedTensor


def choose_bits(
    x: torch.Tensor,
    target_sqnr_db: float = 40.0,
    granularity: str = "tensor",
    group_size: int | None = None,
    min_bits: int = 4,
) -> BitsChoice:
    """The fewest integer bits (8 down to ``min_bits``) whose SQNR reaches the target, trying
    symmetric codes, then asymmetric, at each width (seed 000's adaptive quantization); 4 bits
    are stored packed. If 8 bits miss the target: 8 bits with the better SQNR, ``met=False``."""
    tried: list[tuple[int, bool, float]] = []
    best: tuple[int, bool, float, QuantizedTensor] | None = None
    for bits in range(8, min_bits - 1, -1):
        found = None
        for symmetric in (True, False):
            q = quantize(x, torch.int8, granularity, group_size=group_size, bits=bits,
                         symmetric=symmetric)  # fmt: skip
            s = float(sqnr_db(x, dequantize(q, torch.float32)))
            tried.append((bits, symmetric, s))
            if s >= target_sqnr_db:
                found = (bits, symmetric, s, q)
                break
            if bits == 8 and (best is None or s > best[2]):
                best = (bits, symmetric, s, q)
        if found is None:
            break
        best = found
    assert best is not None
    bits, symmetric, s, q = best
    return BitsChoice(bits, symmetric, s, s >= target_sqnr_db, tried, q)
