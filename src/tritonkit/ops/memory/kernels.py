"""The tiled transpose kernel (and its naive strided variant, a one-row tile): reads a tile
along rows and writes it along columns of the output; the tile passes through shared memory
(Triton inserts the layout conversion), so both the read and the write stay coalesced. The
strided variant's reads are coalesced, its writes land ``M`` elements apart, one 32-byte sector
per element.
"""

from __future__ import annotations

import triton.language as tl

from tritonkit.ops._core.launch import kernel


@kernel
def transpose_kernel(
    x_ptr,  # input [batch, M, N], any strides
    y_ptr,  # output [batch, N, M], contiguous
    M,
    N,
    stride_xb,
    stride_xm,
    stride_xn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles = tl.cdiv(M, BLOCK_M) * tiles_n
    batch = pid // tiles
    pid_m = (pid % tiles) // tiles_n
    pid_n = pid % tiles_n
    rm = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    x_base = x_ptr + batch.to(tl.int64) * stride_xb
    tile = tl.load(x_base + rm[:, None] * stride_xm + rn[None, :] * stride_xn, mask=mask)
    y_base = y_ptr + batch.to(tl.int64) * M * N
    tl.store(y_base + rn[:, None] * M + rm[None, :], tl.trans(tile), mask=tl.trans(mask))
