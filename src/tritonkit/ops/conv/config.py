"""Launch configs of the conv family and the problem they are chosen for.

One frozen dataclass per kernel path: ``GemmConfig`` (the implicit-GEMM forward, the 1x1
GEMM and dgrad, three GEMMs of one shape of tile), ``WgradConfig`` and ``DepthwiseConfig``.
Each ``heuristic`` derives a config from the problem and the hardware; ``candidates`` lists
the few worth timing (the heuristic first) for ``tritonkit._tuning``, which takes a tuned
winner from the machine's cache or the shipped table ``tuned/<gpu>/conv.json`` (written by
``experiments/gpu_conv.py --tune``), keyed by ``ConvProblem.key``.

The Hopper starting points are those of Triton's bf16 GEMMs on sm_90: 128-pixel tiles, 64 or
128 output channels, 64 input channels per step, 4-8 warps, 3-4 stages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from tritonkit import _tuning
from tritonkit.ops._core.device import interpreter_enabled
from tritonkit.ops._core.layout import cdiv, next_power_of_2


class ConvProblem(NamedTuple):
    """One convolution's sizes (batched, after padding modes are resolved)."""

    n: int
    c: int  # input channels
    h: int
    w: int
    k: int  # output channels
    kh: int
    kw: int
    oh: int
    ow: int
    stride: tuple[int, int]
    padding: tuple[int, int]  # top, left (the bottom/right edge is masked)
    dilation: tuple[int, int]
    groups: int
    dtype: torch.dtype

    @property
    def c_g(self) -> int:
        return self.c // self.groups

    @property
    def k_g(self) -> int:
        return self.k // self.groups

    @property
    def m(self) -> int:
        return self.n * self.oh * self.ow

    @property
    def depthwise(self) -> bool:
        return self.groups > 1 and self.c_g == 1

    @property
    def pointwise(self) -> bool:
        """1x1, stride 1, no padding: a plain GEMM over the pixels."""
        return (self.kh, self.kw, self.stride, self.padding) == (1, 1, (1, 1), (0, 0))

    def key(self, kind: str) -> dict:
        """What a tuned config depends on: the GEMM's per-group sizes, the kernel window, the
        stride, the dtype and the pixel count's power-of-4 class (coarse enough that a
        network's layers at batch 32 and 64 share their tuned configs)."""
        return {
            "kind": kind,
            "dtype": str(self.dtype).removeprefix("torch."),
            "c": self.c_g,
            "k": self.k_g,
            "window": [self.kh, self.kw],
            "stride": list(self.stride),
            "m": _power_of_4(self.m),
        }


def _power_of_4(n: int) -> int:
    """The least power of 4 >= n (integers only: no float rounding at exact powers)."""
    out = 1
    while out < n:
        out *= 4
    return out


def _floor16(n: int, cap: int) -> int:
    """A tile side for ``n`` channels: a power of 2 in [16, cap] (tl.dot needs 16)."""
    return max(16, min(cap, next_power_of_2(n)))


@dataclass(frozen=True)
class GemmConfig:
    """An implicit-GEMM tile: BLOCK_M pixels x BLOCK_N channels, BLOCK_K reduction channels
    per step, GROUP_M row tiles walked per column band (L2 reuse), warps, pipeline stages."""

    BLOCK_M: int = 128
    BLOCK_N: int = 128
    BLOCK_K: int = 64
    GROUP_M: int = 8
    num_warps: int = 8
    num_stages: int = 3

    def tuning(self) -> _tuning.Config:
        params = {"BLOCK_M": self.BLOCK_M, "BLOCK_N": self.BLOCK_N, "BLOCK_K": self.BLOCK_K}
        return _tuning.Config({**params, "GROUP_M": self.GROUP_M}, self.num_warps, self.num_stages)

    @staticmethod
    def from_tuning(cfg: _tuning.Config) -> GemmConfig:
        p = cfg.params
        return GemmConfig(
            int(p["BLOCK_M"]), int(p["BLOCK_N"]), int(p["BLOCK_K"]), int(p["GROUP_M"]),
            cfg.num_warps, cfg.num_stages,
        )  # fmt: skip

    def smem_bytes(self, elem: int) -> int:
        return self.num_stages * (self.BLOCK_M + self.BLOCK_N) * self.BLOCK_K * elem

    @classmethod
    def heuristic(cls, p: ConvProblem, reduce_c: int, out_c: int) -> GemmConfig:
        """``reduce_c`` channels are reduced per tap (Cin/g forward, Cout/g dgrad), ``out_c``
        make the columns."""
        if interpreter_enabled():
            # Small unequal tiles: the test shapes cross several blocks each way.
            return cls(32, _floor16(out_c, 32), 16, 2, 4, 1)
        wide = p.dtype != torch.float32
        block_k = _floor16(reduce_c, 64 if wide else 32)
        block_n = _floor16(out_c, 128)
        block_m = 128 if p.m >= 4096 else 64
        warps = 8 if block_m * block_n >= 128 * 128 else 4
        return cls(block_m, block_n, block_k, 8, warps, 4 if block_k <= 32 else 3)

    @classmethod
    def candidates(cls, p: ConvProblem, reduce_c: int, out_c: int) -> list[GemmConfig]:
        first = cls.heuristic(p, reduce_c, out_c)
        out = [first]
        if interpreter_enabled():
            return out
        bk = first.BLOCK_K
        for bm, bn, warps, stages in (
            (128, 128, 8, 3), (128, 128, 4, 4), (128, 64, 4, 4), (128, 256, 8, 3),
            (256, 128, 8, 3), (64, 128, 4, 4), (64, 64, 4, 4), (128, 64, 4, 3),
        ):  # fmt: skip
            if bn > 2 * max(16, next_power_of_2(out_c)):
                continue
            c = cls(bm, bn, bk, 8, warps, stages)
            if c not in out:
                out.append(c)
        return out


# The most a split wgrad's fp32 partial sums take (see splits): well inside an H100's 50 MB
# L2, where they are written and read back.
SLAB_BYTES = 32 << 20


@dataclass(frozen=True)
class WgradConfig:
    """The weight gradient: BLOCK_M output channels x BLOCK_N input channels per tap,
    BLOCK_K pixels per step, ``split`` programs sharing one tile's reduction (0: chosen from
    the machine), warps, stages."""

    BLOCK_M: int = 128
    BLOCK_N: int = 128
    BLOCK_K: int = 64
    split: int = 0
    num_warps: int = 8
    num_stages: int = 3

    def tuning(self) -> _tuning.Config:
        params = {"BLOCK_M": self.BLOCK_M, "BLOCK_N": self.BLOCK_N, "BLOCK_K": self.BLOCK_K}
        return _tuning.Config({**params, "SPLIT": self.split}, self.num_warps, self.num_stages)

    @staticmethod
    def from_tuning(cfg: _tuning.Config) -> WgradConfig:
        p = cfg.params
        return WgradConfig(
            int(p["BLOCK_M"]), int(p["BLOCK_N"]), int(p["BLOCK_K"]), int(p["SPLIT"]),
            cfg.num_warps, cfg.num_stages,
        )  # fmt: skip

    def splits(self, p: ConvProblem, sms: int) -> int:
        """How many programs share one tile's pixels: enough tiles for two waves of the
        machine (more for tiles under 64 x 64, a stem's few input channels: such programs are
        light, and only many of them hide their loads' latency), each split at least 8 steps
        long, the splits' fp32 partial sums (one slab of the weight's size each) at most
        ``SLAB_BYTES``. The slabs are added in a fixed order (no atomics), so a split
        reduction is deterministic too."""
        if self.split:
            return self.split
        tiles = cdiv(p.k_g, self.BLOCK_M) * cdiv(p.c_g, self.BLOCK_N) * p.kh * p.kw * p.groups
        waves = 2 * max(1, min(8, 4096 // (self.BLOCK_M * self.BLOCK_N)))
        most = max(1, p.m // (8 * self.BLOCK_K))
        most = min(most, max(1, SLAB_BYTES // (4 * p.k * p.c_g * p.kh * p.kw)))
        return max(1, min(most, cdiv(waves * sms, tiles)))

    @classmethod
    def heuristic(cls, p: ConvProblem) -> WgradConfig:
        if interpreter_enabled():
            return cls(_floor16(p.k_g, 32), 16, 16, 0, 4, 1)
        wide = p.dtype != torch.float32
        bm = _floor16(p.k_g, 128)
        bn = _floor16(p.c_g, 128)
        warps = 8 if bm * bn >= 128 * 128 else 4
        return cls(bm, bn, 64 if wide else 32, 0, warps, 3)

    @classmethod
    def candidates(cls, p: ConvProblem) -> list[WgradConfig]:
        first = cls.heuristic(p)
        out = [first]
        if interpreter_enabled():
            return out
        for bm, bn, bk, warps, stages in (
            (128, 128, 64, 8, 3), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 64, 64, 4, 4),
            (128, 128, 32, 8, 4),
        ):  # fmt: skip
            c = cls(min(bm, first.BLOCK_M), min(bn, first.BLOCK_N), bk, 0, warps, stages)
            if c not in out:
                out.append(c)
        return out


@dataclass(frozen=True)
class DepthwiseConfig:
    """The depthwise direct kernel: BLOCK_P pixels x BLOCK_C channels per program, warps."""

    BLOCK_P: int = 64
    BLOCK_C: int = 64
    num_warps: int = 4

    def tuning(self) -> _tuning.Config:
        return _tuning.Config({"BLOCK_P": self.BLOCK_P, "BLOCK_C": self.BLOCK_C}, self.num_warps, 1)

    @staticmethod
    def from_tuning(cfg: _tuning.Config) -> DepthwiseConfig:
        return DepthwiseConfig(
            int(cfg.params["BLOCK_P"]), int(cfg.params["BLOCK_C"]), cfg.num_warps
        )

    @classmethod
    def heuristic(cls, p: ConvProblem) -> DepthwiseConfig:
        if interpreter_enabled():
            return cls(16, 16, 4)
        block_c = max(8, min(64, next_power_of_2(p.k)))
        return cls(max(16, 4096 // block_c), block_c, 4)

    @classmethod
    def candidates(cls, p: ConvProblem) -> list[DepthwiseConfig]:
        out = [cls.heuristic(p)]
        if interpreter_enabled():
            return out
        # Larger blocks of the plane too (256 pixels: 16 x 16): a patch's halo is then a
        # smaller share of what a tile reads.
        for bp, bc, warps in (
            (32, 64, 4), (64, 32, 4), (128, 32, 4), (32, 128, 4), (128, 64, 8), (128, 16, 4),
            (256, 32, 8), (256, 64, 8), (256, 16, 4),
        ):  # fmt: skip
            c = cls(bp, bc, warps)
            if c not in out and bc <= 2 * max(8, next_power_of_2(p.k)):
                out.append(c)
        return out


def plane_tile(p: ConvProblem, block_m: int) -> tuple[int, int]:
    """(BH, BW) of a tile of ``block_m`` output pixels that is a block of the output planes
    (``conv_fwd_tma_kernel``'s TMA boxes, ``depthwise_kernel``'s patches): block_m / (BH * BW)
    images of BH x BW pixels (powers of 2, a TMA box's sides at most 256), the shape that
    covers the batch and the planes with the fewest pixels past their edges; of equal ones,
    the fewest images, then the widest rows."""
    best = None
    for bw in (1, 2, 4, 8, 16, 32, 64, 128):
        for bh in (1, 2, 4, 8, 16, 32, 64, 128):
            nb = block_m // (bh * bw)
            if nb < 1 or nb > 256 or nb * bh * bw != block_m:
                continue
            rows = cdiv(p.n, nb) * nb * cdiv(p.oh, bh) * bh * cdiv(p.ow, bw) * bw
            rank = (rows, nb, -bw)
            if best is None or rank < best[0]:
                best = (rank, (bh, bw))
    return best[1]


def fwd_splits(tiles: int, steps: int, sms: int) -> int:
    """How many programs share one tile's reduction in the TMA forward: none while the tiles
    fill the machine; else as many as one wave of programs holds, each at least 8 steps long,
    at most 8 (their fp32 slabs are written and read back)."""
    if tiles >= sms:
        return 1
    return max(1, min(sms // tiles, steps // 8, 8))


def fits(cfg: _tuning.Config, elem: int) -> bool:
    """Prune: the GEMM tiles' pipeline buffers fit the active profile's shared memory."""
    p = cfg.params
    if "BLOCK_K" not in p:
        return True
    need = cfg.num_stages * (p["BLOCK_M"] + p["BLOCK_N"]) * p["BLOCK_K"] * elem
    return _tuning.fits_shared_memory(need)
