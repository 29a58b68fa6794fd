"""Multi-tensor layout: many tensors of one dtype, updated by one launch.

An optimizer step touches every parameter, and a model has tens to hundreds of them. One
launch per parameter costs a launch's host time each (tens of microseconds through PyTorch or
Triton's generic launcher) and leaves small tensors with a grid too small to fill the GPU.
Instead, each tensor is cut into chunks of ``BLOCK`` elements and one program updates one
chunk; the programs of all tensors form one grid. A program finds its tensor and block in two
small int32 arrays (the work list), and its tensor's addresses in an int64 device table with
one row per role (parameter, gradient, each state tensor). The work list depends only on the
tensors' sizes and is built once; the table's rows change only when a tensor is replaced (a
gradient reallocated by ``zero_grad(set_to_none=True)``, a state loaded), and then only that
row is copied to the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton.language as tl

from tritonkit import _tuning
from tritonkit.ops._core.layout import cdiv
from tritonkit.ops._core.plan import cached

TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


@dataclass(frozen=True)
class ChunkConfig:
    """How elementwise multi-tensor kernels cut tensors: ``block`` elements per program, run
    by ``num_warps`` warps (``default_chunks`` picks one where none is given)."""

    block: int
    num_warps: int

    def tuning(self) -> _tuning.Config:
        return _tuning.Config({"BLOCK": self.block}, self.num_warps, 1)

    @staticmethod
    def from_tuning(cfg: _tuning.Config) -> ChunkConfig:
        return ChunkConfig(int(cfg.params["BLOCK"]), cfg.num_warps)


# The configs a shipped table may name (experiments/gpu_optim_defaults.py times them all).
CHUNK_CANDIDATES = (
    ChunkConfig(1024, 4),
    ChunkConfig(2048, 4),
    ChunkConfig(4096, 4),
    ChunkConfig(4096, 8),
    ChunkConfig(8192, 8),
    ChunkConfig(16384, 8),
)
CHUNKS_KERNEL = "optim.chunks"  # the shipped tables' name for this choice (a cache key)
_HEURISTIC_WARPS = 4
_VECTORS_PER_THREAD = 2  # 16-byte vectors of each tensor per thread and program


def heuristic_chunks(dtype: torch.dtype) -> ChunkConfig:
    """Where no table says otherwise: 4 warps, each thread moving two 16-byte vectors of each
    tensor (1024 float32 or 2048 16-bit elements per program), the per-thread share of the
    float32 winner of every mode in the H200 sweep (experiments/gpu_optim_defaults.py)."""
    per_thread = _VECTORS_PER_THREAD * 16 // torch.empty((), dtype=dtype).element_size()
    return ChunkConfig(_HEURISTIC_WARPS * 32 * per_thread, _HEURISTIC_WARPS)


def chunks_key(dtype: torch.dtype) -> dict[str, str]:
    return {"dtype": str(dtype).removeprefix("torch.")}


def default_chunks(device: torch.device, dtype: torch.dtype) -> ChunkConfig:
    """The multi-tensor passes' config for parameters of ``dtype`` on ``device``: this GPU's
    shipped table (``tuned/<gpu>/optim.json``, key: the dtype) where it has a row and tables
    are read (``TRITONKIT_AUTOTUNE`` unset or 0), else ``heuristic_chunks``. Nothing is
    timed: a step cannot time candidates without changing the parameters."""
    fallback = heuristic_chunks(dtype)
    if device.type != "cuda" or not _tuning.consulted() or _tuning.mode() == "1":
        return fallback
    key = chunks_key(dtype)

    def choose() -> ChunkConfig:
        with torch.cuda.device(device):
            row = _tuning.shipped_lookup(CHUNKS_KERNEL, key)
        if row is None or row not in [c.tuning() for c in CHUNK_CANDIDATES]:
            return fallback
        return ChunkConfig.from_tuning(row)

    return cached(CHUNKS_KERNEL, (device.index, *key.items()), choose)


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
