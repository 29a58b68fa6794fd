"""Launch configs of the collectives' kernels, and the measured symmetric-memory crossover.

The message size below which the symmetric-memory all-reduce beats NCCL is measured, per GPU
and world size, by ``experiments/gpu_dist.py`` and shipped as rows of
``tuned/<gpu>/collectives.json`` (kernel ``collectives.symm``, key ``{"world_size", "dtype"}``,
params ``max_bytes`` and ``one_shot_max_bytes``); without a row, ``all_reduce(...,
algorithm="auto")`` stays on NCCL.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SYMM_TABLE_KERNEL = "collectives.symm"


@dataclass(frozen=True)
class RingConfig:
    """The ring's reduction kernel: elements per program."""

    block: int = 4096
    num_warps: int = 4

    @classmethod
    def heuristic(cls, numel: int) -> RingConfig:
        # Small chunks (latency-bound) in 1K tiles, large ones in 4K: two specializations.
        return cls(block=1024 if numel <= (64 << 10) else 4096)


@dataclass(frozen=True)
class CompressConfig:
    """The compressed all-reduce: code format, elements per scale, launch shape."""

    dtype: torch.dtype = torch.int8  # or torch.float8_e4m3fn
    block: int = 256  # elements per scale: 4 / 256 bytes of scale per element
    block_elems: int = 4096  # elements per program (block * blocks per program)
    num_warps: int = 4

    @property
    def blocks_per_program(self) -> int:
        return max(1, self.block_elems // self.block)

    @property
    def reduce_launch(self) -> tuple[int, int]:
        """(blocks per program, warps) of the dequantize-accumulate-requantize kernel."""
        # 2K-element tiles of 8 warps: the fastest or within noise of it among the tile and
        # warp shapes gpu_dist.py times, in every H200 run (docs/performance.md). The tile
        # changes no result: every block is requantized on its own.
        return max(1, 2048 // self.block), 8

    @classmethod
    def heuristic(
        cls, numel: int, dtype: torch.dtype = torch.int8, residual: torch.dtype | None = None
    ) -> CompressConfig:
        # 256 elements a scale keeps the scales at 1.6% of the int8 bytes (3.9x fewer bytes
        # than float32); a tiny message still gets whole 4K programs (one or two). A float32
        # error-feedback residual takes 2K-element tiles: its extra registers made 4K ones the
        # slowest of the probe's shapes (experiments/gpu_symm_probe.py; docs/performance.md).
        return cls(
            dtype=dtype,
            block=256 if numel >= 256 else 64,
            block_elems=2048 if residual == torch.float32 else 4096,
        )

    def bytes_per_element(self) -> float:
        """Wire bytes per element: one code plus a share of a float32 scale."""
        return 1.0 + 4.0 / self.block


@dataclass(frozen=True)
class SymmConfig:
    """The symmetric-memory all-reduce: one-shot or two-shot, tile, programs."""

    one_shot: bool = True
    block: int = 2048  # elements per tile (two-shot: per rank's part of a span)
    max_programs: int = 64  # programs loop over tiles; each uses WORLD signal slots
    num_warps: int = 8

    @classmethod
    def heuristic(cls, nbytes: int, world: int, one_shot_max_bytes: int) -> SymmConfig:
        one_shot = nbytes <= one_shot_max_bytes
        # Small messages: many small tiles, so that every SM's loads overlap (latency-bound);
        # larger: 4K-element tiles. Programs capped: the signal pad holds 64 x WORLD slots.
        block = 1024 if nbytes <= (256 << 10) else 4096
        return cls(
            one_shot=one_shot, block=block, max_programs=64, num_warps=8 if block > 1024 else 4
        )

    @staticmethod
    def default_one_shot_max_bytes(world: int) -> int:
        # The one-shot reads world - 1 peers' whole messages, the two-shot 2 (world - 1) /
        # world of it in three barriers: below ~512 KB / (world / 2) the barriers cost more.
        return (1 << 20) // max(1, world)


@dataclass(frozen=True)
class FusedNormConfig:
    """The fused all-reduce + residual add + RMSNorm: one row per program iteration."""

    max_programs: int = 64
    num_warps: int = 8

    @classmethod
    def heuristic(cls, hidden: int) -> FusedNormConfig:
        return cls(num_warps=4 if hidden <= 2048 else (8 if hidden <= 8192 else 16))


def symm_crossover(world: int, dtype: torch.dtype) -> tuple[int, int] | None:
    """(max_bytes, one_shot_max_bytes) measured for this GPU and world size, or None."""
    from tritonkit import _tuning

    if not torch.cuda.is_available():
        return None
    key = {"world_size": world, "dtype": str(dtype).removeprefix("torch.")}
    cfg = _tuning.shipped_lookup(SYMM_TABLE_KERNEL, key)
    if cfg is None:
        return None
    params = dict(cfg.params)
    return int(params["max_bytes"]), int(params.get("one_shot_max_bytes", params["max_bytes"]))
