"""The transpose's config and its tuning: the tile, and how it is chosen."""

from __future__ import annotations

from dataclasses import dataclass

from tritonkit import _tuning


@dataclass(frozen=True)
class TransposeConfig:
    """Tile of the transpose kernel; BLOCK_M = 1 gives the naive strided transpose."""

    BLOCK_M: int
    BLOCK_N: int
    num_warps: int


@dataclass(frozen=True, eq=False)
class TransposeTuning:
    """The tiles the transpose chooses among: ``tiled(elem_size)`` is the default (untimed under
    the interpreter or with tuning off); on a GPU the first call per shape class times
    ``candidates`` once and the persistent autotune cache keeps the winner, keyed by element
    size and M, N rounded up to powers of 2 (at most ``key_cap``). Compared by identity (plans
    are cached per tuning object).

    32 KiB tiles, 8 warps: the best of the tile shapes swept for bf16 (128 x 128) and fp32
    (128 x 64) (see docs/performance.md).
    """

    tiled_16bit: TransposeConfig = TransposeConfig(128, 128, 8)
    tiled_default: TransposeConfig = TransposeConfig(128, 64, 8)
    candidates: tuple[tuple[int, int, int], ...] = (
        (128, 128, 8),
        (128, 64, 8),
        (64, 128, 8),
        (64, 64, 4),
        (32, 128, 4),
    )
    key_cap: int = 8192

    def tiled(self, elem_size: int) -> TransposeConfig:
        return self.tiled_16bit if elem_size == 2 else self.tiled_default


TRANSPOSE_TUNING = TransposeTuning()


STRIDED = TransposeConfig(1, 1024, 4)


def _as_tuning(c: TransposeConfig) -> _tuning.Config:
    return _tuning.Config({"BLOCK_M": c.BLOCK_M, "BLOCK_N": c.BLOCK_N}, c.num_warps, 1)


def _from_tuning(c: _tuning.Config) -> TransposeConfig:
    return TransposeConfig(c.params["BLOCK_M"], c.params["BLOCK_N"], c.num_warps)
