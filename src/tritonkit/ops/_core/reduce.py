"""Partial and column sums shared by the families: the second pass that sums fp32 partial rows
(one per row group of a first pass) in a fixed order, so that gradients summed over rows (a
bias's, a norm's weight and bias) are deterministic."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tritonkit.ops._core.device import sm_count
from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.layout import next_power_of_2
from tritonkit.ops._core.plan import cached


@kernel
def colsum_kernel(
    partial_ptr,  # fp32 [n_rows, n_cols], contiguous
    out_ptr,  # [n_cols]
    partial2_ptr,  # a second pair summed alongside, when SECOND (a norm's weight and bias)
    out2_ptr,
    n_rows,
    n_cols,
    SECOND: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Second pass of the bias gradient: a fixed summation order, so results are deterministic.
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(0, n_rows, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
        offs = rows[:, None] * n_cols + cols[None, :]
        acc += tl.load(partial_ptr + offs, mask=mask, other=0.0)
        if SECOND:
            acc2 += tl.load(partial2_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + cols, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=cols < n_cols)
    if SECOND:
        tl.store(
            out2_ptr + cols, tl.sum(acc2, axis=0).to(out2_ptr.dtype.element_ty), mask=cols < n_cols
        )


# Elements of a partial-sum tile per thread (``PartialSumConfig``).
PARTIAL_SUM_ELEMS_PER_THREAD = 64


@dataclass(frozen=True)
class PartialSumConfig:
    """How ``sum_partials`` sizes its programs: columns per program narrowed until the programs
    about fill the SMs (between ``min_block_n`` and ``max_block_n``), up to ``max_rows``
    partial rows loaded in one step, ``PARTIAL_SUM_ELEMS_PER_THREAD`` of a tile per thread.

    The default, tall tiles of partial rows in narrow column blocks sized so that the
    programs fill the SMs, both gradients summed in one launch, beat 32 x 128 tiles with one
    launch per gradient in the norm backward (see docs/performance.md); (256, 32) tiles at 4
    warps take 255 registers without spills (sm_90a, two sums).
    """

    min_block_n: int = 32
    max_block_n: int = 128
    max_rows: int = 256
    min_warps: int = 2
    max_warps: int = 8

    def launch(self, n_rows: int, n_cols: int, sms: int) -> tuple[int, int, int]:
        """(BLOCK_M, BLOCK_N, num_warps) over ``n_rows`` partial rows of ``n_cols`` on a device
        of ``sms`` SMs."""
        per_sm = max(1, n_cols // sms)
        block_n = max(self.min_block_n, min(self.max_block_n, 1 << (per_sm.bit_length() - 1)))
        block_m = min(next_power_of_2(n_rows), self.max_rows)
        warps = block_m * block_n // (32 * PARTIAL_SUM_ELEMS_PER_THREAD)
        return block_m, block_n, max(self.min_warps, min(self.max_warps, warps))


PARTIAL_SUMS = PartialSumConfig()


def sum_partials(
    partial: torch.Tensor,
    out: torch.Tensor,
    partial2: torch.Tensor | None = None,
    out2: torch.Tensor | None = None,
    config: PartialSumConfig | None = None,
) -> None:
    """``out[j] = sum_i partial[i, j]`` over fp32 partial rows (contiguous), in a fixed order,
    rounded once to out's dtype; with ``partial2`` and ``out2``, a second pair of the same shape
    in the same launch (a norm's weight and bias gradients).

    ``config`` defaults to ``PARTIAL_SUMS`` (read at each call)."""
    config = config or PARTIAL_SUMS
    second = partial2 is not None
    key = (partial.shape, out.dtype, out.stride(), out.device, second, config)

    def build():
        n_rows, n_cols = partial.shape
        block_m, block_n, warps = config.launch(n_rows, n_cols, sm_count(out.device))
        return colsum_kernel.bind(
            (triton.cdiv(n_cols, block_n),),
            partial,
            out,
            partial2 if second else partial,
            out2 if second else out,
            n_rows,
            n_cols,
            SECOND=second,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            num_warps=warps,
        )

    launch = cached("sum_partials", key, build)
    if second:
        launch(partial, out, partial2, out2)
    else:
        launch(partial, out, partial, out)
