"""The optimizer family's launchers: the multi-tensor table, the Adam step, the gradient norm,
the non-finite check, Muon's passes and the batched Newton-Schulz GEMMs.

Multi-tensor layout: many tensors of one dtype, updated by one launch. An optimizer step
touches every parameter, and a model has tens to hundreds of them. One launch per parameter
costs a launch's host time each (tens of microseconds through PyTorch or Triton's generic
launcher) and leaves small tensors with a grid too small to fill the GPU. Instead, each tensor
is cut into chunks of ``BLOCK`` elements and one program updates one chunk; the programs of all
tensors form one grid. A program finds its tensor and block in two small int32 arrays (the work
list), and its tensor's addresses in an int64 device table with one row per role (parameter,
gradient, each state tensor). The work list depends only on the tensors' sizes and is built
once; the table's rows change only when a tensor is replaced (a gradient reallocated by
``zero_grad(set_to_none=True)``, a state loaded), and then only that row is copied to the
device.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import torch
import triton.language as tl

from tritonkit.ops._core.device import interpreter_enabled
from tritonkit.ops._core.layout import cdiv
from tritonkit.ops.matmul import matmul

try:  # host-side TMA descriptors (triton >= 3.3)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton: the pointer kernel serves everything
    TensorDescriptor = None
from collections.abc import Sequence
from typing import Any

from tritonkit.ops.optim.config import NS_GROUP_M, ChunkConfig, NSConfig, tma_device
from tritonkit.ops.optim.kernels_adam import _adam_kernel
from tritonkit.ops.optim.kernels_clip import _sum_squares_kernel
from tritonkit.ops.optim.kernels_muon import (
    _muon_apply_kernel,
    _muon_momentum_kernel,
    _muon_norm_kernel,
    _muon_normalize_kernel,
)
from tritonkit.ops.optim.kernels_newton_schulz import _ns_gemm_kernel, _ns_gemm_tma_kernel
from tritonkit.ops.optim.kernels_nonfinite import _nonfinite_kernel

# Weight decay modes (constexpr): none, L2 (Adam: added to the gradient), decoupled (AdamW).
WD_NONE, WD_L2, WD_DECOUPLED = 0, 1, 2


# Magnitudes from which round-to-nearest gives infinity (max + half a unit in the last place).
_OVERFLOW = {torch.float16: 65520.0, torch.bfloat16: 3.3961775292304e38, torch.float32: math.inf}


@dataclass(frozen=True)
class AdamHyper:
    """One param group's hyperparameters as the kernel takes them (see ``launch_adam``)."""

    lr: float | torch.Tensor
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    decoupled: bool
    amsgrad: bool
    maximize: bool


def _log(beta: float) -> float:
    return math.log(beta) if beta > 0 else -math.inf


def launch_adam(
    table: TensorTable,
    steps: torch.Tensor,
    p_dtype: torch.dtype,
    s_dtype: torch.dtype,
    h: AdamHyper,
    *,
    master: bool = False,
    stochastic: bool = False,
    seed: int = 0,
    flag: torch.Tensor | None = None,
    grad_scale: torch.Tensor | None = None,
    config: ChunkConfig,
) -> None:
    """One Adam step over every tensor of ``table`` (no validation: the optimizer did it).

    ``steps`` holds each program's step count (``TensorTable.n_chunks`` float32 values);
    ``flag``, when given, is read on the device and a nonzero value skips the whole step
    (steps included); ``grad_scale`` divides the gradients (GradScaler), which are written
    back unscaled. A tensor ``h.lr`` is read on the device (capturable schedules).
    """
    lr_on_device = isinstance(h.lr, torch.Tensor)
    wd_mode = WD_NONE if h.weight_decay == 0 else (WD_DECOUPLED if h.decoupled else WD_L2)
    dummy = steps
    _adam_kernel[(table.n_chunks,)](
        table.chunk_tensor,
        table.chunk_block,
        steps,
        table.table,
        table.numels,
        table.n_tensors,
        dummy if flag is None else flag,
        dummy if grad_scale is None else grad_scale,
        h.lr if lr_on_device else dummy,
        0.0 if lr_on_device else float(h.lr),
        1.0 - h.beta1,
        h.beta2,
        1.0 - h.beta2,
        _log(h.beta1),
        _log(h.beta2),
        h.eps,
        h.weight_decay,
        seed,
        P_DTYPE=TL_DTYPES[p_dtype],
        S_DTYPE=TL_DTYPES[s_dtype],
        OVERFLOW=_OVERFLOW[p_dtype],
        BLOCK=table.block,
        ALIGNED=table.aligned,
        AMSGRAD=h.amsgrad,
        MAXIMIZE=h.maximize,
        WEIGHT_DECAY=wd_mode,
        HAS_FLAG=flag is not None,
        HAS_GRAD_SCALE=grad_scale is not None,
        LR_ON_DEVICE=lr_on_device,
        MASTER=master,
        STOCHASTIC=stochastic and p_dtype != torch.float32,
        num_warps=config.num_warps,
    )


def launch_sum_squares(
    table: TensorTable,
    grad_row: int,
    g_dtype: torch.dtype,
    partials: torch.Tensor,
    config: ChunkConfig,
    check: tuple[torch.Tensor | None, torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """``partials[c]`` = the sum of squares (float32) of program c's block of ``grad_row``;
    ``partials`` holds ``table.n_chunks`` float32 values (every one is written). ``check``:
    (flags or None, found, count) of ``launch_nonfinite_check``, checked on the same read."""
    flags, found, count = check if check is not None else (None, partials, partials)
    _sum_squares_kernel[(table.n_chunks,)](
        table.chunk_tensor,
        table.chunk_block,
        table.table,
        table.numels,
        table.n_tensors,
        grad_row,
        partials,
        found if flags is None else flags,
        found,
        count,
        G_DTYPE=TL_DTYPES[g_dtype],
        BLOCK=table.block,
        ALIGNED=table.aligned,
        CHECK=check is not None,
        NAMES=flags is not None,
        num_warps=config.num_warps,
    )


def launch_momentum(
    table: TensorTable,
    partials: torch.Tensor,
    p_dtype: torch.dtype,
    momentum: float,
    nesterov: bool,
    flag: torch.Tensor | None,
    grad_scale: torch.Tensor | None,
    config: ChunkConfig,
) -> None:
    dummy = partials
    _muon_momentum_kernel[(table.n_chunks,)](
        table.chunk_tensor,
        table.chunk_block,
        table.table,
        table.numels,
        table.n_tensors,
        partials,
        dummy if flag is None else flag,
        dummy if grad_scale is None else grad_scale,
        momentum,
        1.0 - momentum,
        P_DTYPE=TL_DTYPES[p_dtype],
        BLOCK=table.block,
        ALIGNED=table.aligned,
        NESTEROV=nesterov,
        HAS_FLAG=flag is not None,
        HAS_GRAD_SCALE=grad_scale is not None,
        num_warps=config.num_warps,
    )


def _as_bfloat16(x: float) -> float:
    """``x`` rounded as ``torch.tensor(x, dtype=torch.bfloat16)`` rounds it (to float32, then
    to bfloat16, to nearest even), on the host without a tensor: it runs every step."""
    try:
        (bits,) = struct.unpack("<I", struct.pack("<f", x))
    except OverflowError:  # beyond float32: infinity, as the conversion gives
        return math.copysign(math.inf, x)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def launch_normalize(
    table: TensorTable,
    partials: torch.Tensor,
    norms: torch.Tensor,
    eps: float,
    flag: torch.Tensor | None,
    config: ChunkConfig,
) -> None:
    """Divide every matrix's bfloat16 update by its Frobenius norm (two launches: the norms
    from the momentum pass's partial sums, then the division)."""
    _muon_norm_kernel[(table.n_tensors,)](
        partials,
        table.first_chunk,
        table.n_chunks_of,
        norms,
        _as_bfloat16(eps),
        PARTIALS=1024,
    )
    _muon_normalize_kernel[(table.n_chunks,)](
        table.chunk_tensor,
        table.chunk_block,
        table.table,
        table.numels,
        table.n_tensors,
        norms,
        norms if flag is None else flag,
        BLOCK=table.block,
        ALIGNED=table.aligned,
        HAS_FLAG=flag is not None,
        num_warps=config.num_warps,
    )


def launch_apply(
    table: TensorTable,
    ratios: torch.Tensor,
    p_dtype: torch.dtype,
    lr: float | torch.Tensor,
    weight_decay: float,
    flag: torch.Tensor | None,
    config: ChunkConfig,
) -> None:
    lr_on_device = isinstance(lr, torch.Tensor)
    _muon_apply_kernel[(table.n_chunks,)](
        table.chunk_tensor,
        table.chunk_block,
        table.table,
        table.numels,
        table.n_tensors,
        ratios,
        ratios if flag is None else flag,
        lr if lr_on_device else ratios,
        0.0 if lr_on_device else float(lr),
        weight_decay,
        P_DTYPE=TL_DTYPES[p_dtype],
        BLOCK=table.block,
        ALIGNED=table.aligned,
        HAS_FLAG=flag is not None,
        LR_ON_DEVICE=lr_on_device,
        num_warps=config.num_warps,
    )


def _natural(t: torch.Tensor) -> tuple[torch.Tensor, bool] | None:
    """(a row-major view, whether t is its transpose) for a TMA descriptor, or None."""
    for view, trans in ((t, False), (t.transpose(1, 2), True)):
        st = view.stride()
        aligned = (st[1] * 2) % 16 == 0 and (st[0] * 2) % 16 == 0 and view.data_ptr() % 16 == 0
        if st[2] == 1 and aligned:
            return view, trans
    return None


def _desc(t: torch.Tensor, rows: int, cols: int) -> TensorDescriptor:
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, rows, cols])


def _ns_gemm_tma(a, b, c, out, alpha, beta, diag, symmetric, block_m, block_n, grid, config):
    """The TMA kernel, if every operand has a descriptor layout; returns whether it ran."""
    views = [_natural(t) for t in (a, b, out if c is None else c, out)]
    if TensorDescriptor is None or any(v is None for v in views) or views[2][1] or views[3][1]:
        return False
    (a_nat, a_t), (b_nat, b_t), (c_nat, _), (o_nat, _) = views
    bk = config.block_k
    _ns_gemm_tma_kernel[grid](
        _desc(a_nat, bk, block_m) if a_t else _desc(a_nat, block_m, bk),
        _desc(b_nat, block_n, bk) if b_t else _desc(b_nat, bk, block_n),
        _desc(c_nat, block_m, block_n),
        _desc(o_nat, block_m, block_n),
        a.shape[1], b.shape[2], a.shape[2],
        alpha, beta, diag,
        A_TRANS=a_t, B_TRANS=b_t,
        SYMMETRIC=symmetric, HAS_C=c is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=bk,
        GROUP_M=NS_GROUP_M, UPCAST=interpreter_enabled(),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return True


def ns_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor | None,
    out: torch.Tensor,
    alpha: float,
    beta: float,
    symmetric: bool,
    config: NSConfig,
    diag: float = 0.0,
) -> None:
    """``out = alpha * (a @ b) + beta * c + diag * I`` over a batch (3-D views, any strides); with
    ``symmetric`` the caller promises that the product is symmetric (``b`` holds ``a``
    transposed), and only the lower triangle's tiles are computed."""
    n_batch, m, k = a.shape
    n = b.shape[2]
    if symmetric:
        block_m = block_n = config.block_sym
        tiles = cdiv(m, block_m)
        grid = (tiles * (tiles + 1) // 2, n_batch)
    else:
        block_m, block_n = config.block_m, config.block_n
        grid = (cdiv(m, block_m) * cdiv(n, block_n), n_batch)
    tma = config.tma and tma_device(a.device)
    if tma and _ns_gemm_tma(
        a, b, c, out, alpha, beta, diag, symmetric, block_m, block_n, grid, config
    ):
        return
    cc = out if c is None else c
    _ns_gemm_kernel[grid](
        a, b, cc, out,
        m, n, k,
        *a.stride(), *b.stride(), *cc.stride(), *out.stride(),
        alpha, beta, diag,
        SYMMETRIC=symmetric,
        HAS_C=c is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=config.block_k,
        GROUP_M=NS_GROUP_M,
        EVEN_K=k % config.block_k == 0,
        UPCAST=interpreter_enabled(),
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )  # fmt: skip


class NSWorkspace:
    """The buffers of one batch of same-shape matrices: X and its next iterate (``rows x
    cols``), the Gram matrix A and the polynomial B (``s x s``, s = min(rows, cols)), bf16."""

    def __init__(self, n_batch: int, rows: int, cols: int, device: torch.device) -> None:
        s = min(rows, cols)
        self.rows, self.cols = rows, cols
        self.x = torch.empty((n_batch, rows, cols), dtype=torch.bfloat16, device=device)
        self.x_next = torch.empty_like(self.x)
        self.gram = torch.empty((n_batch, s, s), dtype=torch.bfloat16, device=device)
        self.poly = torch.empty_like(self.gram)

    def result(self, steps: int) -> torch.Tensor:
        """The buffer that holds X after ``steps`` iterations (they alternate)."""
        return self.x if steps % 2 == 0 else self.x_next


def newton_schulz_(
    ws: NSWorkspace,
    steps: int,
    coefficients: tuple[float, float, float],
    config: NSConfig,
) -> torch.Tensor:
    """Run ``steps`` iterations on ``ws.x`` (already normalized); returns ``ws.result(steps)``.

    Per iteration: A = X X^T (symmetric), B = c A A + b A (symmetric), X' = a X + B X (wide)
    or a X + X B (tall, where the Gram matrix is X^T X), 3 launches for the whole batch.
    """
    a_coef, b_coef, c_coef = coefficients
    tall = ws.rows > ws.cols
    fused = config.product == "fused"
    cur, nxt = ws.x, ws.x_next
    for _ in range(steps):
        xs = cur.transpose(1, 2) if tall else cur
        ns_gemm(xs, xs.transpose(1, 2), None, ws.gram, 1.0, 0.0, True, config)
        # A is exactly symmetric (mirrored), so A A = A A^T: read A row-major as the B operand.
        diag = 0.0 if fused else a_coef
        ns_gemm(ws.gram, ws.gram, ws.gram, ws.poly, c_coef, b_coef, True, config, diag)
        if fused:
            a_op, b_op = (cur, ws.poly) if tall else (ws.poly, cur)
            ns_gemm(a_op, b_op, cur, nxt, 1.0, a_coef, False, config)
        else:
            nxt = matmul(cur, ws.poly) if tall else matmul(ws.poly, cur)
        cur, nxt = nxt, cur
    out = ws.result(steps)
    if cur is not out:  # "matmul" returns new tensors: the result goes where callers look
        out.copy_(cur)
    return out


def launch_nonfinite_check(
    table: TensorTable,
    grad_row: int,
    g_dtype: torch.dtype,
    flags: torch.Tensor | None,
    found: torch.Tensor,
    count: torch.Tensor,
    config: ChunkConfig,
) -> None:
    """Set ``found`` to 1 (and ``flags[t]``, if given) where tensor t of ``grad_row`` has a
    NaN or an infinity, and add 1 to ``count`` if ``found`` was 0 (``found`` and ``flags``
    must be zeroed before a step's first check; nothing else is written)."""
    _nonfinite_kernel[(table.n_chunks,)](
        table.chunk_tensor,
        table.chunk_block,
        table.table,
        table.numels,
        table.n_tensors,
        grad_row,
        found if flags is None else flags,
        found,
        count,
        G_DTYPE=TL_DTYPES[g_dtype],
        BLOCK=table.block,
        ALIGNED=table.aligned,
        NAMES=flags is not None,
        num_warps=config.num_warps,
    )


TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def _index(row: Any) -> int:
    """A row number given as an int or as the ``tl.constexpr`` that kernels index with."""
    return int(getattr(row, "value", row))


def upload(src: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device`` without a host sync: a blocking copy from pageable memory
    waits for the stream (everything queued before it, a backward pass included), so CUDA
    copies go through pinned memory, stream-ordered; the caching host allocator keeps the
    pinned block alive until the copy has run."""
    if device.type == "cuda":
        return src.pin_memory().to(device, non_blocking=True)
    return src.to(device)


def _write(dst: torch.Tensor, values: Sequence[int]) -> None:
    """Copy host integers into the device tensor ``dst`` (stream-ordered, no host sync)."""
    src = torch.tensor(values, dtype=dst.dtype)
    if dst.device.type == "cuda":
        dst.copy_(src.pin_memory(), non_blocking=True)
    else:
        dst.copy_(src)


class TensorTable:
    """``n_rows`` roles x ``len(numels)`` tensors laid out for one multi-tensor launch.

    Attributes used by launchers: ``chunk_tensor`` and ``chunk_block`` (int32 per program),
    ``table`` (int64, ``[n_rows, n_tensors]`` addresses), ``numels`` (int64 per tensor),
    ``first_chunk`` and ``n_chunks_of`` (int32 per tensor: the programs of each tensor),
    ``n_chunks`` (the grid) and ``aligned`` (every address a multiple of 16 bytes, which lets
    the kernels use 16-byte vector loads).
    """

    def __init__(
        self, n_rows: int, numels: Sequence[int], device: torch.device, block: int
    ) -> None:
        self.n_tensors = len(numels)
        self.block = block
        self.device = device
        # At least one program per tensor, even an empty one: it still counts its step.
        counts = [max(1, cdiv(n, block)) for n in numels]
        first = [0] * len(counts)
        for i in range(1, len(counts)):
            first[i] = first[i - 1] + counts[i - 1]
        self.n_chunks = sum(counts)
        self.counts = counts
        self.first = first
        tensor_of = torch.repeat_interleave(
            torch.arange(self.n_tensors, dtype=torch.int32), torch.tensor(counts)
        )
        block_of = torch.arange(self.n_chunks, dtype=torch.int32) - torch.tensor(
            first, dtype=torch.int32
        ).repeat_interleave(torch.tensor(counts))
        self.chunk_tensor = upload(tensor_of, device)
        self.chunk_block = upload(block_of, device)
        self.first_chunk = upload(torch.tensor(first, dtype=torch.int32), device)
        self.n_chunks_of = upload(torch.tensor(counts, dtype=torch.int32), device)
        self.numels = upload(torch.tensor(list(numels), dtype=torch.int64), device)
        self.table = torch.zeros((n_rows, self.n_tensors), dtype=torch.int64, device=device)
        self._nonempty = [n > 0 for n in numels]
        self._row_aligned = [True] * n_rows
        self.aligned = True
        self.host_rows: list[tuple[int, ...] | None] = [None] * n_rows

    def set_row(self, row: Any, tensors: Sequence[torch.Tensor | None]) -> None:
        """Point ``row`` at ``tensors`` (None: a role this launch does not read)."""
        self.set_row_ptrs(row, tuple(0 if t is None else t.data_ptr() for t in tensors))

    def set_row_ptrs(self, row: Any, ptrs: tuple[int, ...]) -> None:
        row = _index(row)
        if ptrs == self.host_rows[row]:
            return
        self.host_rows[row] = ptrs
        _write(self.table[row], ptrs)
        self._row_aligned[row] = all(p % 16 == 0 for p, used in zip(ptrs, self._nonempty) if used)
        self.aligned = all(self._row_aligned)

    def copy_row(self, dst: Any, src: Any) -> None:
        """Make row ``dst`` hold row ``src``'s addresses (an in-place update's outputs)."""
        ptrs = self.host_rows[_index(src)]
        self.set_row_ptrs(dst, ptrs if ptrs is not None else (0,) * self.n_tensors)
