"""The quant family's formats (what a code holds, how a float becomes one) and its launch configs,
one frozen dataclass per kernel path with its heuristic."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tritonkit import _tuning
from tritonkit.ops._core.layout import cdiv, next_power_of_2

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


# A group fits one program's registers up to this many elements; longer rows take two passes
# (kernels_twopass.py).
MAX_GROUP = 16384


@dataclass(frozen=True)
class GroupsConfig:
    """Launch config of the one-pass group kernel."""

    block_elems: int = 4096  # elements per program (BLOCK_G * next_power_of_2(G))
    num_warps: int = 4

    def block_groups(self, g_p2: int) -> int:
        return max(1, self.block_elems // g_p2)


def default_groups_config(group: int) -> GroupsConfig:
    g_p2 = next_power_of_2(group)
    # A whole long row in one program: more warps hold it without spilling.
    return GroupsConfig(block_elems=max(4096, g_p2), num_warps=8 if g_p2 >= 8192 else 4)


@dataclass(frozen=True)
class SmallTensorConfig:
    """When a per-tensor scale takes the one-pass kernel (up to ``MAX_NUMEL`` elements), and its
    launch."""

    block: int = 4096
    num_warps: int = 8

    def takes(self, x: torch.Tensor, fmt: QFormat) -> bool:
        """Whether ``x`` quantized to ``fmt`` with one scale takes this kernel: contiguous,
        small, a symmetric unpacked format."""
        return 0 < x.numel() <= MAX_NUMEL and x.is_contiguous() and fmt.symmetric and not fmt.packed


SMALL_TENSOR = SmallTensorConfig()


@dataclass(frozen=True)
class StridedConfig:
    """Launch config of the one-pass strided kernel."""

    block_elems: int = 4096
    num_warps: int = 4


def fits_one_pass(k: int) -> bool:
    return next_power_of_2(k) * MIN_BLOCK_I <= MAX_TILE


@dataclass(frozen=True)
class TwoPassConfig:
    """Tiles of both passes (the amax pass: ``AMAX_ITERS`` tiles per program)."""

    block_r: int = 16
    block_c: int = 256
    num_warps: int = 4


# Amax-pass tiles per program: fewer atomics (the same for both tile shapes; no sweep varied it).
AMAX_ITERS = 8


ROW_MAJOR_TILES = TwoPassConfig()


# Codes written transposed (a column-major copy) leave the tile through shared memory: square
# tiles keep both the loads and the stores whole lines.
TRANSPOSING_TILES = TwoPassConfig(block_r=64, block_c=64, num_warps=4)


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


LAYOUTS = ("row", "col", "both")


FORMATS: dict[str, QFormat] = {
    **{f.name: f for f in FLOAT8.values()},
    **{int_format(b, s).name: int_format(b, s) for b in range(4, 9) for s in (True, False)},
}


# The largest tensor the one-pass kernel takes (every program reads all of it: the reads grow as
# numel**2 / block); 16 rows of a 16384-wide hidden state fit.
MAX_NUMEL = 1 << 18


# A group of K rows times at least 16 columns fits one program up to this many elements.
MAX_TILE = 8192


MIN_BLOCK_I = 16
