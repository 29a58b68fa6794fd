"""Launch configs of the pointwise tiles (``_core.pointwise``, the elementwise family's GLUs,
memory's copy): tile bytes and vectors per thread, the bias gradient's row sums and plain
column sums. One frozen ``PointwiseConfig`` holds them all; ``POINTWISE`` is the default that
launchers take unless given another (tests and sweeps build their own).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tritonkit.ops._core.layout import Rows, cdiv, next_power_of_2
from tritonkit.ops._core.reduce import PARTIAL_SUMS, PartialSumConfig

# Bytes each thread loads or stores at once: one 16-byte vector.
VECTOR_BYTES = 16
# The backward passes (dy and x in, dx out; the GLUs' five tensors): vectors per thread by
# (activation, element size), one where not listed (SiLU, fp32): two for GELU in 16 bits, whose
# derivative is heavier; a second vector helped only there (see docs/performance.md).
BWD_VECTORS = (("gelu", 2, 2), ("gelu_tanh", 2, 2))
# When a tile spans several rows (a broadcast bias is reused across them), its widest row.
MAX_BLOCK_N_MULTIROW = 512


@dataclass(frozen=True)
class RowSumConfig:
    """The bias gradient's two passes: per-row-group partial column sums, then their sum.

    The first pass uses wide, short tiles whose rows all sit in the same thread (one 16-byte
    vector of each row per thread), so the column sums accumulate in registers with no
    cross-thread reduction; each program walks a group of rows and writes one fp32 partial row
    (tall tiles reduced across warps ran well below copy bandwidth, this shape close to it; see
    docs/performance.md). The second pass sums the partial rows in a fixed order
    (``reduce.sum_partials``).
    """

    warps: int  # per first-pass program, whose columns are 32 * warps * 16 bytes wide
    rows: int  # rows per loop iteration: the 16-byte loads each thread has in flight
    programs_per_sm: int  # row groups x column blocks is about this many programs per SM
    stages: int = 1  # > 1: the loop's loads pipelined through shared memory


# The second pass of a plain column sum: up to 16 partial rows x 128 columns per program.
FINAL_COLUMN_SUMS = PartialSumConfig(
    min_block_n=128, max_block_n=128, max_rows=16, min_warps=4, max_warps=4
)


@dataclass(frozen=True)
class ColumnSumConfig:
    """A plain column sum (add's broadcast gradient, bias_act's without an activation or dx):
    programs of (column block, row split), each summing its rows into a tile of per-lane sums
    reduced once after the loop (``pointwise.colsum_split_kernel``), then the splits' partial
    rows summed in a fixed order (``reduce.sum_partials``)."""

    block_m: int  # rows per loop iteration
    block_n: int  # columns per program
    warps: int
    splits: int  # row splits: partial rows
    evict: str = "evict_first"  # the rows are read once
    final: PartialSumConfig = FINAL_COLUMN_SUMS


@dataclass(frozen=True, eq=False)
class PointwiseConfig:
    """Every block size of the pointwise tiles.

    Compared by identity (launch plans are cached per config object): build one and reuse it.
    """

    # 2 KiB of each tensor per program, one 16-byte vector per thread, matches PyTorch's own
    # vectorized kernels (1024 bf16 or 512 fp32 elements, 4 warps); wider tiles left bandwidth
    # behind (experiments/sweep_elementwise.py; see docs/performance.md).
    tile_bytes: int = 2048
    # Activations that cost more arithmetic (GELU, SiLU) give each thread two vectors: more
    # independent work in flight, which raised their bandwidth (see docs/performance.md).
    heavy_vectors: int = 2
    # GELU forward with a 16-bit output: Phi from one exp2 of a polynomial (math.gelu_q16)
    # instead of gelu_parts. False: the old path (the sweep times both); float32 always uses it.
    gelu_phi16: bool = True
    int64_above: int = 2**31  # offsets from this many elements on use 64-bit arithmetic
    sms: int | None = None  # SMs the row sums plan for; None: the device's
    # By element size: the bias gradient summed beside dx or an activation's gradient
    # (bias_act's backward): 8 KiB (bf16) / 16 KiB (fp32) per iteration, best on average over
    # bias_relu, bias_gelu and add broadcast (experiments/sweep_elementwise.py; see
    # docs/performance.md).
    row_sums_by_size: tuple[tuple[int, RowSumConfig], ...] = (
        (2, RowSumConfig(warps=8, rows=2, programs_per_sm=4)),
        (4, RowSumConfig(warps=8, rows=4, programs_per_sm=4)),
    )
    # By element size: 8 x 64 tiles at 4 warps (4 elements per thread) in 16 row splits, the
    # shape of torch.compile's own split reduction; it beat the bias gradient's in-thread row
    # sums, taller tiles and other split counts (see docs/performance.md).
    column_sums_by_size: tuple[tuple[int, ColumnSumConfig], ...] = (
        (2, ColumnSumConfig(block_m=8, block_n=64, warps=4, splits=16)),
        (4, ColumnSumConfig(block_m=8, block_n=64, warps=4, splits=16)),
    )
    # The second pass of the bias gradient's row sums.
    partial_sums: PartialSumConfig = field(default=PARTIAL_SUMS)

    def row_sums(self, elem_size: int) -> RowSumConfig:
        return dict(self.row_sums_by_size)[elem_size]

    def column_sums(self, elem_size: int) -> ColumnSumConfig:
        return dict(self.column_sums_by_size)[elem_size]

    def vectors(self, activation: str) -> int:
        """16-byte vectors per thread of a forward pass."""
        return 1 if activation in ("none", "relu") else self.heavy_vectors

    def bwd_vectors_for(self, activation: str, elem_size: int) -> int:
        for act, size, vectors in BWD_VECTORS:
            if act == activation and size == elem_size:
                return vectors
        return 1

    def phi16(self, activation: str, out: torch.Tensor) -> bool:
        """Whether a forward GELU computes Phi with gelu_q16 (its output rounded to 16 bits)."""
        return self.gelu_phi16 and activation == "gelu" and out.element_size() == 2


POINTWISE = PointwiseConfig()


@dataclass(frozen=True)
class TileConfig:
    """Tile shape and warps for one pointwise launch."""

    BLOCK_M: int
    BLOCK_N: int
    num_warps: int

    @staticmethod
    def for_rows(
        n_rows: int,
        n_cols: int,
        elem_size: int,
        config: PointwiseConfig = POINTWISE,
        vectors: int = 1,
        min_block_n: int = 8,
    ) -> TileConfig:
        tile = config.tile_bytes * vectors // elem_size
        widest = tile if n_rows == 1 else MAX_BLOCK_N_MULTIROW
        block_n = max(min_block_n, min(next_power_of_2(n_cols), widest))
        block_m = max(1, min(next_power_of_2(n_rows), tile // block_n))
        threads = block_m * block_n * elem_size // (VECTOR_BYTES * vectors)
        num_warps = min(16, max(4, next_power_of_2(threads // 32)))
        return TileConfig(block_m, block_n, num_warps)

    @staticmethod
    def for_row_sums(
        n_rows: int, n_cols: int, elem_size: int, rs: RowSumConfig, vector_bytes: int = VECTOR_BYTES
    ) -> TileConfig:
        per_warp = 32 * vector_bytes // elem_size  # columns of one warp's 16-byte vectors
        block_n = max(8, min(next_power_of_2(n_cols), rs.warps * per_warp))
        # No more warps than the row is wide, or the layout would spread rows across warps and
        # every iteration's row sum would go through shared memory.
        num_warps = max(1, min(rs.warps, block_n // per_warp))
        block_m = max(1, min(next_power_of_2(n_rows), rs.rows))
        return TileConfig(block_m, block_n, num_warps)

    def grid(self, n_rows: int, n_cols: int) -> tuple[int]:
        return (cdiv(n_rows, self.BLOCK_M) * cdiv(n_cols, self.BLOCK_N),)


def row_sum_launch(
    n_rows: int, n_cols: int, elem_size: int, rs: RowSumConfig, sms: int
) -> tuple[TileConfig, int, int]:
    """The bias gradient's first pass: (tile, rows per program, row groups = partial rows).

    Row groups x column blocks is about ``rs.programs_per_sm`` programs per SM, one wave when
    that many fit (registers: experiments/sweep_gelu_colsum.py reports them).
    """
    cfg = TileConfig.for_row_sums(n_rows, n_cols, elem_size, rs)
    col_blocks = cdiv(n_cols, cfg.BLOCK_N)
    # Programs narrowed to fewer warps (narrow rows) come that many times more per SM.
    per_sm = rs.programs_per_sm * rs.warps // cfg.num_warps
    target = max(1, per_sm * sms // col_blocks)
    groups = max(1, min(cdiv(n_rows, cfg.BLOCK_M), target))
    rows_per_program = cdiv(cdiv(n_rows, groups), cfg.BLOCK_M) * cfg.BLOCK_M
    return cfg, rows_per_program, cdiv(n_rows, rows_per_program)


def needs_int64(config: PointwiseConfig, *views: Rows) -> bool:
    """Whether some element of these row views lies ``config.int64_above`` or more elements
    from its base."""
    limit = config.int64_above
    return any((v.n_rows - 1) * v.stride_row + v.n_cols >= limit for v in views if v.n_rows)
