"""The optimizer family's configs: the multi-tensor passes' chunks (``ChunkConfig``) and the
Newton-Schulz GEMMs' tiles (``NSConfig``), each with its heuristic and its shipped-table lookup
(``tuned/<gpu>/optim.json``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from tritonkit import _tuning
from tritonkit.ops._core.device import interpreter_enabled, sm_count
from tritonkit.ops._core.layout import cdiv, next_power_of_2
from tritonkit.ops._core.plan import cached

try:  # host-side TMA descriptors (triton >= 3.3)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton: the pointer kernel serves everything
    TensorDescriptor = None


# torch.optim.Muon's defaults (Keller Jordan's quintic iteration).
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


NS_STEPS = 5


PRODUCTS = ("fused", "matmul")


@dataclass(frozen=True)
class NSConfig:
    """Tiles of the Newton-Schulz GEMM: square ``block_sym`` tiles for the symmetric products,
    ``block_m x block_n`` for the third; and how the third product runs: ``"fused"``, this
    module's kernel with the ``a X + B X`` epilogue (PyTorch's rounding), or ``"matmul"``,
    ``tritonkit.matmul`` on ``B' = a I + B`` (the identity folded into B's epilogue, which
    rounds B's diagonal with ``a`` in it). ``tma``: operands through TMA tensor descriptors
    instead of pointer loads where the device has them (Hopper) and every operand's rows are
    16-byte aligned; elsewhere the pointer kernel runs with the same tiles."""

    product: str = "fused"
    tma: bool = False
    block_sym: int = 128
    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    num_warps: int = 8
    num_stages: int = 3

    def tuning(self) -> _tuning.Config:
        params = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        params["product"] = PRODUCTS.index(self.product)
        params["tma"] = int(self.tma)
        warps, stages = params.pop("num_warps"), params.pop("num_stages")
        return _tuning.Config(params, warps, stages)

    @staticmethod
    def from_tuning(cfg: _tuning.Config) -> NSConfig:
        params = dict(cfg.params)
        params.pop("group_m", None)  # a row written while the tile order was a field (always 8)
        params["product"] = PRODUCTS[int(params["product"])]
        params["tma"] = bool(params["tma"])
        return NSConfig(**params, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


DEFAULT_NS = NSConfig()


INTERPRETER_NS = NSConfig(
    block_sym=32, block_m=32, block_n=32, block_k=32, num_warps=4, num_stages=1
)


# Hopper's heuristic configs: operands through TMA; the third product's tiles 128 x 256 where
# that still gives every SM a tile, else 128 x 128.
HOPPER_NS = NSConfig(tma=True)


HOPPER_WIDE_NS = NSConfig(tma=True, block_n=256)


# The configs a shipped table may name (experiments/gpu_optim_defaults.py times them all).
NS_CANDIDATES = (
    DEFAULT_NS,
    HOPPER_NS,
    NSConfig(block_n=256),
    HOPPER_WIDE_NS,
    NSConfig(tma=True, num_stages=4),
    NSConfig(num_warps=4, num_stages=4),
    NSConfig(block_sym=64),
    NSConfig(block_k=128, num_stages=2),
    NSConfig(product="matmul"),
    NSConfig(product="matmul", tma=True),
)


NS_KERNEL = "optim.newton_schulz"  # the shipped tables' name for this choice (a cache key)


# Row blocks per group of the grouped tile order (L2 reuse), the same for every config: no
# sweep varied it.
NS_GROUP_M = 8


def default_ns_config() -> NSConfig:
    """The config of no particular shape or device (the interpreter's, or the pointer kernel's
    128 x 128 tiles); ``choose_ns_config`` picks one for a batch."""
    return INTERPRETER_NS if interpreter_enabled() else DEFAULT_NS


def tma_device(device: torch.device) -> bool:
    """Whether TMA descriptors can be used on ``device`` (Hopper or later; the interpreter
    runs them too)."""
    if interpreter_enabled():
        return TensorDescriptor is not None
    if TensorDescriptor is None or device.type != "cuda" or torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def heuristic_ns_config(n_batch: int, rows: int, cols: int, device: torch.device) -> NSConfig:
    """Where no table says otherwise: the pointer kernel's 128 x 128 tiles, or on Hopper the
    TMA kernel, with 128 x 256 tiles for the third product (whose output is s x n or n x s,
    s = min(rows, cols), n = max(rows, cols)) when the batch still has a tile for every SM."""
    if interpreter_enabled():
        return INTERPRETER_NS
    if not tma_device(device):
        return DEFAULT_NS
    s, n = min(rows, cols), max(rows, cols)
    tiles = n_batch * cdiv(s, HOPPER_WIDE_NS.block_m) * cdiv(n, HOPPER_WIDE_NS.block_n)
    return HOPPER_WIDE_NS if tiles >= sm_count(device) else HOPPER_NS


def ns_key(n_batch: int, rows: int, cols: int) -> dict[str, int]:
    """What the choice depends on: the matrix as iterated (s x n, s <= n) and the batch's
    power-of-two class."""
    return {"s": min(rows, cols), "n": max(rows, cols), "batch": next_power_of_2(n_batch)}


def choose_ns_config(n_batch: int, rows: int, cols: int, device: torch.device) -> NSConfig:
    """The Newton-Schulz config for a batch of ``n_batch`` ``rows x cols`` matrices: this
    GPU's shipped table (``tuned/<gpu>/optim.json``) where it has the shape and tables are
    read (``TRITONKIT_AUTOTUNE`` unset or 0), else ``heuristic_ns_config``. Nothing is timed
    in a step."""
    fallback = heuristic_ns_config(n_batch, rows, cols, device)
    if device.type != "cuda" or not _tuning.consulted() or _tuning.mode() == "1":
        return fallback
    key = ns_key(n_batch, rows, cols)

    def choose() -> NSConfig:
        with torch.cuda.device(device):
            row = _tuning.shipped_lookup(NS_KERNEL, key)
        if row is None or row not in [c.tuning() for c in NS_CANDIDATES]:
            return fallback
        config = NSConfig.from_tuning(row)
        return config if not config.tma or tma_device(device) else fallback

    return cached(NS_KERNEL, (device.index, *key.items()), choose)


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
