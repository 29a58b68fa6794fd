"""Quantized formats: what a code can hold, and how a float becomes one.

Every quantize path of the family rounds the same way, and ``tritonkit.quant.reference``
repeats it in float64 bit for bit:

- amax = max |x| over the finite elements of a group (min and max for asymmetric formats);
- symmetric (float8 and int): ``qscale = qmax / max(amax, EPS)`` (float32, rounded to
  nearest), optionally floored to a power of two; the dequantization scale is
  ``scale = 1 / qscale`` (float32, rounded to nearest);
- asymmetric int: ``scale = max(hi - lo, EPS) / (qmax - qmin)`` and ``qscale = 1 / scale``,
  with lo = min(min x, 0) and hi = max(max x, 0) so that 0 is exact; the zero point is
  ``clamp(qmin - rne(lo * qscale), qmin, qmax)``;
- codes: float8 ``cast_rne(clamp(x * qscale, -qmax, qmax))`` (a saturating cast, round to
  nearest even); int ``clamp(rne(x * qscale) + zero_point, qmin, qmax)``;
- dequantized: ``(code - zero_point) * scale`` in float32, rounded once to the output dtype.

Non-finite inputs: +-inf saturates to +-qmax (and is left out of amax); NaN stays NaN in the
float8 formats and becomes the code 0 in the integer formats (``quantize(check_finite=True)``
raises instead).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# Smallest amax (and asymmetric range) a scale is computed from: an all-zero group gets a
# finite scale (torchao's float8 casts use the same floor).
EPS = 1e-12


@dataclass(frozen=True)
class QFormat:
    """One code format: its storage dtype, range, and (float8) the bits of its significand."""

    name: str
    storage: torch.dtype  # dtype of the data tensor (uint8 for packed int4)
    bits: int
    qmin: float
    qmax: float
    is_float: bool
    symmetric: bool
    mantissa: int = 0  # float8: stored significand bits
    emin: int = 0  # float8: exponent of the smallest normal number

    @property
    def packed(self) -> bool:
        """Two codes per byte (4-bit integers)."""
        return self.bits == 4


FLOAT8 = {
    torch.float8_e4m3fn: QFormat("float8_e4m3fn", torch.float8_e4m3fn, 8, -448.0, 448.0, True,
                                 True, mantissa=3, emin=-6),
    torch.float8_e5m2: QFormat("float8_e5m2", torch.float8_e5m2, 8, -57344.0, 57344.0, True,
                               True, mantissa=2, emin=-14),
}  # fmt: skip

QUANT_DTYPES = (torch.int8, torch.float8_e4m3fn, torch.float8_e5m2)
INT_BITS = (4, 5, 6, 7, 8)


def int_format(bits: int, symmetric: bool) -> QFormat:
    """``bits``-bit integers: symmetric codes in [-(2^(b-1) - 1), 2^(b-1) - 1], asymmetric in
    [-2^(b-1), 2^(b-1) - 1] with a zero point; 4-bit codes are packed two per byte."""
    top = float(2 ** (bits - 1) - 1)
    storage = torch.uint8 if bits == 4 else torch.int8
    name = f"int{bits}{'' if symmetric else '_asym'}"
    return QFormat(name, storage, bits, -top if symmetric else -top - 1, top, False, symmetric)


def get_format(dtype: torch.dtype, bits: int = 8, symmetric: bool = True) -> QFormat:
    """The format for a target dtype (int8 with ``bits`` and ``symmetric``, or float8)."""
    if dtype in FLOAT8:
        return FLOAT8[dtype]
    return int_format(bits, symmetric)


def empty_group_scale(fmt: QFormat, pow2: bool = False) -> tuple[float, int]:
    """(scale, zero point) of a group with no nonzero finite element, rounded as the kernels
    round (float32 division, to nearest)."""
    one, eps = np.float32(1.0), np.float32(EPS)
    if fmt.symmetric:
        qscale = np.float32(fmt.qmax) / eps
        if pow2:
            qscale = np.float32(2.0 ** np.floor(np.log2(qscale)))
        return float(one / qscale), 0
    scale = eps / np.float32(fmt.qmax - fmt.qmin)
    return float(scale), int(fmt.qmin)
