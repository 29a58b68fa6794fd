"""Configs of the sparse kernels: frozen dataclasses, each with a heuristic constructor from the
problem (rows, columns, non-zeros, longest row) and the device, and the space a sweep tries.

The load-balancing rule (``strategy``) lives here too: docs/sparse.md says why it is what it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from tritonkit.ops._core.layout import cdiv, next_power_of_2

ROWS = "rows"  # a program per group of rows: every row's non-zeros in one program
SPLIT = "split"  # a program per chunk of non-zeros: long rows cut across programs

# A row this many times longer than the mean (and longer than two loads of the row kernel)
# stalls the program that holds it while the others are done: the rows are split instead.
SKEW_RATIO = 8.0


def strategy(n_rows: int, nnz: int, max_row: int, block: int) -> str:
    """The load-balancing strategy for a matrix whose longest row has ``max_row`` non-zeros:
    ``SPLIT`` when that row is over ``SKEW_RATIO`` times the mean and over two ``block`` loads
    long, else ``ROWS``."""
    mean = nnz / max(n_rows, 1)
    if max_row > SKEW_RATIO * max(mean, 1.0) and max_row > 2 * block:
        return SPLIT
    return ROWS


def _clamp(v: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, v))


def _chunk(nnz: int, programs_wanted: int, quantum: int, cap: int) -> int:
    """Non-zeros per program of a split launch: enough programs to fill the device, a multiple
    of ``quantum`` (one full tile), at most ``cap``."""
    per = cdiv(max(nnz, 1), max(programs_wanted, 1))
    return _clamp(cdiv(per, quantum) * quantum, quantum, cap)


def _spmv_block(mean: float) -> int:
    return _clamp(next_power_of_2(max(1, round(mean))), 4, 64)


def _spmm_block_k(mean: float) -> int:
    return _clamp(next_power_of_2(max(1, round(mean))), 4, 16)


def split_chunk(op: str, n_rows: int, nnz: int, max_row: int, sms: int) -> int:
    """Non-zeros per program of ``op``'s ("spmv" or "spmm") split launch, or 0 where its rows
    are balanced enough for the row kernel (``strategy``). A function of the matrix alone (not
    of the dense operand), so that the partition can be computed once and kept on the matrix."""
    mean = nnz / max(n_rows, 1)
    if op == "spmv":
        if strategy(n_rows, nnz, max_row, _spmv_block(mean)) != SPLIT:
            return 0
        return _chunk(nnz, 16 * sms, 1024, 8192)
    block_k = _spmm_block_k(mean)
    if strategy(n_rows, nnz, max_row, block_k) != SPLIT:
        return 0
    return _chunk(nnz, 8 * sms, 32, 2048)  # whole BLOCK_K = 32 steps of the split kernel


@dataclass(frozen=True)
class SpmvConfig:
    """y = A x over CSR. Row kernel: ``ROWS`` x ``BLOCK`` is one program's tile (ROWS rows,
    BLOCK non-zeros of each per step). Split kernel: ``chunk`` non-zeros per program, taken
    ``ROWS * BLOCK`` at a time (ROWS = 1); ``strategy``: split where there is a chunk."""

    ROWS: int
    BLOCK: int
    chunk: int
    num_warps: int

    @property
    def strategy(self) -> str:
        return SPLIT if self.chunk else ROWS

    @classmethod
    def heuristic(cls, n_rows: int, nnz: int, chunk: int, sms: int) -> SpmvConfig:
        """The config for a matrix whose split chunk (``split_chunk``) is ``chunk``."""
        # Tiles of 512 non-zeros on 4 warps, four per thread (about 60 registers, sm_90 ptxas):
        # the best of the sweep on the uniform and the power-law acceptance matrices, row and
        # split kernels alike (docs/sparse.md).
        if chunk:
            return cls(1, 512, chunk, 4)
        block = _spmv_block(nnz / max(n_rows, 1))
        rows = _clamp(512 // block, 1, 256)
        rows = min(rows, max(1, next_power_of_2(cdiv(n_rows, 4 * sms))))
        return cls(rows, block, 0, 8 if rows * block > 512 else 4)

    def space(self) -> list[SpmvConfig]:
        """The configs a sweep tries for this problem (this one first; same chunk)."""
        out = [self]
        for warps in (4, 8):
            if self.strategy == SPLIT:
                out += [SpmvConfig(1, t, self.chunk, warps) for t in (256, 512, 1024, 2048)]
                continue
            for block in (16, 32, 64):
                for tile in (512, 1024, 2048):
                    out.append(SpmvConfig(max(1, tile // block), block, 0, warps))
        return list(dict.fromkeys(out))


@dataclass(frozen=True)
class SpmmConfig:
    """C = A B over CSR. A program holds one row (or a chunk's rows, one at a time) and
    ``BLOCK_N`` columns of B; ``BLOCK_K`` non-zeros (rows of B gathered) per step; ``strategy``:
    split where there is a chunk."""

    BLOCK_K: int
    BLOCK_N: int
    chunk: int
    num_warps: int

    @property
    def strategy(self) -> str:
        return SPLIT if self.chunk else ROWS

    @classmethod
    def heuristic(cls, n_rows: int, n: int, nnz: int, chunk: int) -> SpmmConfig:
        # A gathered row of B is read in runs of BLOCK_N columns. The sweep's best on the
        # acceptance matrices (docs/sparse.md): 128 columns by 16 non-zeros for the row kernel,
        # 64 by 32 for the split one (its chunks hold rows of every length), on 4 warps.
        if chunk:
            return cls(32, _clamp(next_power_of_2(n), 16, 64), chunk, 4)
        block_n = _clamp(next_power_of_2(n), 16, 128)
        block_k = _spmm_block_k(nnz / max(n_rows, 1))
        warps = 4 if block_n * block_k <= 2048 else 8
        return cls(block_k, block_n, chunk, warps)

    def space(self) -> list[SpmmConfig]:
        out = [self]
        for block_n in (64, 128, 256):
            for block_k in (8, 16, 32):
                for warps in (4, 8):
                    out.append(SpmmConfig(block_k, block_n, self.chunk, warps))
        return list(dict.fromkeys(out))


@dataclass(frozen=True)
class SddmmConfig:
    """Sampled product at a pattern: ``BLOCK`` non-zeros per program, ``BLOCK_K`` of the inner
    dimension per step (a BLOCK x BLOCK_K gather from each dense operand)."""

    BLOCK: int
    BLOCK_K: int
    num_warps: int

    @classmethod
    def heuristic(cls, nnz: int, k: int) -> SddmmConfig:
        # 32 non-zeros by 16 of the inner dimension on 2 warps: the sweep's best at the
        # acceptance shape (K = 64), 1.7x the wider tiles (docs/sparse.md).
        return cls(32, 16, 2)

    def space(self) -> list[SddmmConfig]:
        out = [self]
        for block in (16, 32, 64, 128):
            for block_k in (16, 32, 64):
                for warps in (2, 4, 8):
                    out.append(SddmmConfig(block, block_k, warps))
        return list(dict.fromkeys(out))


@dataclass(frozen=True)
class BsrConfig:
    """Block-sparse (BSR) times dense on the tensor cores: a program per (block row, BLOCK_N
    columns), one ``tl.dot`` per stored block."""

    BLOCK_N: int
    num_warps: int
    num_stages: int

    @classmethod
    def heuristic(cls, block_rows: int, block_m: int, n: int, sms: int) -> BsrConfig:
        block_n = _clamp(next_power_of_2(n), 16, 128)
        # Fewer, wider tiles waste nothing while there are programs for every SM.
        if block_rows * cdiv(n, 256) >= 2 * sms and block_m <= 64:
            block_n = min(256, _clamp(next_power_of_2(n), 16, 256))
        warps = 8 if block_m * block_n >= 128 * 128 else 4
        return cls(block_n, warps, 3)

    def space(self) -> list[BsrConfig]:
        out = [self]
        for block_n in (64, 128, 256):
            for warps in (4, 8):
                for stages in (2, 3, 4):
                    out.append(BsrConfig(block_n, warps, stages))
        return list(dict.fromkeys(out))
