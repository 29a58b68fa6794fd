"""Configs of the matmul family: one launch's tile and schedule (``MatmulConfig``), the tiles
tuning chooses among (``TuningSpace``), and how a launcher runs a GEMM besides its tile
(``GemmOptions``: descriptors, copies, thresholds). Each is a frozen dataclass with a default
instance, passed explicitly; tests and sweeps build their own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from tritonkit import _tuning
from tritonkit.ops._core.gemm import FP8_DTYPES, tf32_enabled
from tritonkit.ops.matmul import splitk


@dataclass(frozen=True)
class ScheduleConfig:
    """How a GEMM's output tiles are spread over programs and how its operands are read.

    ``SPLIT_K``: programs sharing one output tile's K range (partial tiles summed by a second
    kernel). ``persistent``: one program per SM looping over the tiles, else one per tile.
    ``tma`` and ``subtile`` (a half-tile TMA store epilogue) are requests: a launch whose
    operands TMA cannot read (strides not 16-byte aligned, a batch, no Hopper GPU) runs the
    same loop with pointer loads. ``warp_specialize``: producer / consumer warp groups
    (persistent only).
    """

    SPLIT_K: int = 1
    persistent: bool = False
    tma: bool = False
    subtile: bool = False
    warp_specialize: bool = False


TILES = ScheduleConfig()  # one program per output tile, pointer loads, no split
_SCHEDULE_FIELDS = tuple(f.name for f in dataclasses.fields(ScheduleConfig))


def _split_kw(kw: dict) -> tuple[dict, dict]:
    """Flat keyword arguments as (the tile's, the schedule's)."""
    sched = {k: kw[k] for k in _SCHEDULE_FIELDS if k in kw}
    return {k: v for k, v in kw.items() if k not in sched}, sched


@dataclass(frozen=True)
class MatmulConfig:
    """One way to run a GEMM kernel: the tile, its order and pipeline, the FP8 promotion, and
    the schedule (``ScheduleConfig``; its fields read through as attributes, and ``of`` /
    ``replace`` take them flat, as the tuning tables store them).
    """

    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    GROUP_M: int = 1
    num_warps: int = 4
    num_stages: int = 3
    promote_k: int = 0  # FP8: K elements per fp32 promotion (see promotion); 0: BLOCK_K
    schedule: ScheduleConfig = TILES

    @staticmethod
    def of(BLOCK_M: int, BLOCK_N: int, BLOCK_K: int, **kw) -> MatmulConfig:
        """A config from flat keyword arguments: the tile's fields and the schedule's
        (``SPLIT_K``, ``persistent``, ``tma``, ``subtile``, ``warp_specialize``)."""
        tile_kw, sched = _split_kw(kw)
        return MatmulConfig(BLOCK_M, BLOCK_N, BLOCK_K, **tile_kw, schedule=ScheduleConfig(**sched))

    def replace(self, **kw) -> MatmulConfig:
        """``dataclasses.replace`` taking the schedule's fields flat as well."""
        tile_kw, sched = _split_kw(kw)
        schedule = dataclasses.replace(self.schedule, **sched) if sched else self.schedule
        return dataclasses.replace(self, **tile_kw, schedule=schedule)

    @property
    def SPLIT_K(self) -> int:
        return self.schedule.SPLIT_K

    @property
    def persistent(self) -> bool:
        return self.schedule.persistent

    @property
    def tma(self) -> bool:
        return self.schedule.tma

    @property
    def subtile(self) -> bool:
        return self.schedule.subtile

    @property
    def warp_specialize(self) -> bool:
        return self.schedule.warp_specialize

    @property
    def dot(self) -> bool:
        """Whether the tile multiplies with tl.dot (the tensor cores): it needs K blocks of at
        least 16; narrower ones (the evolution's naive step) multiply-add on the CUDA cores."""
        return self.BLOCK_K >= 16

    def tuning(self) -> _tuning.Config:
        """As a ``_tuning.Config`` (JSON-friendly ints, the schedule's fields flat) for the
        autotune cache and the shipped tables."""
        params = {
            "BLOCK_M": self.BLOCK_M,
            "BLOCK_N": self.BLOCK_N,
            "BLOCK_K": self.BLOCK_K,
            "GROUP_M": self.GROUP_M,
            **{name: int(getattr(self.schedule, name)) for name in _SCHEDULE_FIELDS},
            "promote_k": self.promote_k,
        }
        return _tuning.Config(params, self.num_warps, self.num_stages)

    @staticmethod
    def from_tuning(cfg: _tuning.Config) -> MatmulConfig:
        kinds = {f.name: f.type for f in dataclasses.fields(ScheduleConfig)}
        kinds.update({f.name: f.type for f in dataclasses.fields(MatmulConfig)})
        kinds.pop("schedule")
        params = {
            k: (bool(v) if kinds[k] in (bool, "bool") else int(v))
            for k, v in cfg.params.items()
            if k in kinds  # an entry written before a field became derived ("dot")
        }
        return MatmulConfig.of(**params, num_warps=cfg.num_warps, num_stages=cfg.num_stages)

    def smem_bytes(self, elem_a: int, elem_b: int, elem_out: int) -> int:
        """Shared memory of the operand pipeline plus the output staging tile."""
        stages = max(1, self.num_stages)
        operands = stages * (
            self.BLOCK_M * self.BLOCK_K * elem_a + self.BLOCK_K * self.BLOCK_N * elem_b
        )
        staging = self.BLOCK_M * self.BLOCK_N * elem_out // (2 if self.subtile else 1)
        return operands + staging


def tile(bm: int, bn: int, bk: int, warps: int, stages: int, **kw) -> MatmulConfig:
    return MatmulConfig.of(bm, bn, bk, num_warps=warps, num_stages=stages, **kw)


# FP8 on Hopper: wgmma adds products into its accumulator keeping only ~14 bits of the partial
# sum, so a long K must be summed in pieces whose partial sums are promoted into an fp32
# accumulator (on the CUDA cores). ``promote_k`` is the piece, in K elements:
# - PROMOTE_PER_BLOCK (0): BLOCK_K, through tl.dot's ``max_num_imprecise_acc``, which waits for
#   the tensor cores and adds once per K block (and per 64-row wgmma);
# - a positive value <= BLOCK_K: the same, more often;
# - a multiple of BLOCK_K above it: by hand (_core.gemm.mac_step), a second accumulator tile
#   that the tensor cores sum into and the loop adds to the first every promote_k / BLOCK_K
#   blocks, so the tensor cores wait that much less often. Two fp32 tiles per thread: 128 x 128
#   at 8 warps fits (155 registers, ptxas sm_90a); 128 x 256 or 256 x 128 spill;
# - NEVER_PROMOTE (-1): never (Triton's own sm_90 default: fast accumulation).
# Rarer promotion is faster and less accurate; the fp8 candidates start with 2048, which kept
# the error close to torch._scaled_mm's for most of the speed of never promoting (see
# docs/performance.md).
PROMOTE_PER_BLOCK = 0
NEVER_PROMOTE = -1


def promotion(cfg: MatmulConfig) -> tuple[int | None, int]:
    """(tl.dot's ``max_num_imprecise_acc``, K blocks per promotion by hand) of an FP8 launch."""
    p, bk = cfg.promote_k, cfg.BLOCK_K
    if p == PROMOTE_PER_BLOCK:
        return bk, 1
    if p == NEVER_PROMOTE:
        return None, 1
    if 0 < p <= bk:
        return p, 1
    if p > bk and p % bk == 0:
        return None, p // bk
    raise ValueError(
        f"MatmulConfig.promote_k must be {PROMOTE_PER_BLOCK}, {NEVER_PROMOTE}, in [1, BLOCK_K = "
        f"{bk}] or a multiple of BLOCK_K, got {p}"
    )


# The evolution's fixed steps (16-bit operands). Each is the previous one plus one idea.
NAIVE = tile(32, 32, 8, 4, 1)  # BLOCK_K 8: no tl.dot
TILED = tile(128, 128, 64, 4, 1)
PIPELINED = tile(128, 128, 64, 4, 3)
VARIANTS: tuple[str, ...] = ("naive", "tiled", "pipelined", "autotuned", "persistent")
FIXED: Mapping[str, MatmulConfig] = {"naive": NAIVE, "tiled": TILED, "pipelined": PIPELINED}


def fixed_config(name: str, elem: int) -> MatmulConfig:
    """A fixed step of the evolution for ``elem``-byte operands: the same 128-byte K rows
    (BLOCK_K 32 for fp32, 128 for 8-bit), so that its shared memory fits any GPU."""
    cfg = FIXED[name]
    if not cfg.dot:
        return cfg
    return cfg.replace(BLOCK_K=cfg.BLOCK_K * 2 // elem)


# Tiles per operand class, best first (the first is the heuristic default, used untimed under
# the interpreter). Few on purpose: first-time tuning of one shape compiles each candidate.
# Hopper: 128 x 256 x 64 with 8 warps (two warp groups, each a 64 x 256 wgmma) is the usual
# best for 16-bit operands; 8-bit operands want BLOCK_K = 128 (128-byte rows for TMA).
_TILES_8BIT = (
    tile(128, 256, 128, 8, 3),
    tile(128, 128, 128, 8, 4),
    tile(256, 128, 128, 8, 3),
    tile(128, 128, 128, 4, 3),  # fits 163 KB (A100) even with an int32 output tile
)
_TILES: Mapping[str, tuple[MatmulConfig, ...]] = {
    "16bit": (
        tile(128, 256, 64, 8, 3),
        tile(128, 128, 64, 8, 4),
        tile(256, 128, 64, 8, 3),
        tile(128, 128, 64, 4, 4),
    ),
    "8bit": _TILES_8BIT,
    # FP8: the hand promotion's tile first (see PROMOTE_PER_BLOCK), then INT8's tiles, which
    # promote once per K block.
    "fp8": (tile(128, 128, 128, 8, 4, promote_k=2048), *_TILES_8BIT),
    "tf32": (
        tile(128, 128, 32, 8, 3),
        tile(128, 256, 32, 8, 3),
        tile(128, 64, 32, 4, 4),
        tile(64, 128, 32, 4, 4),
    ),
    # IEEE fp32 ("highest" precision in PyTorch) runs on the CUDA cores: FMA, no tensor cores.
    # Small tiles, mostly with BLOCK_K 16: 64 x 64 is best with B row-major, 64 x 128 and
    # 128 x 64 with A M-major; tuned over, they beat the wider tiles tried before (see
    # docs/performance.md).
    "ieee": (
        tile(64, 64, 16, 4, 4),
        tile(64, 128, 16, 4, 4),
        tile(128, 64, 16, 4, 4),
        tile(64, 64, 32, 4, 3),
        tile(128, 128, 16, 8, 3),
    ),
}
# Only where TMA stores the output: a half-tile epilogue buys a 4th stage, and producer /
# consumer warp groups (flatten must then be off on Hopper).
_TMA_EXTRAS_8BIT = (tile(128, 256, 128, 8, 4, subtile=True),)
_TMA_EXTRAS: Mapping[str, tuple[MatmulConfig, ...]] = {
    "16bit": (
        tile(128, 256, 64, 8, 4, subtile=True),
        tile(128, 256, 64, 8, 3, warp_specialize=True),
    ),
    "8bit": _TMA_EXTRAS_8BIT,
    "fp8": _TMA_EXTRAS_8BIT,
}


@dataclass(frozen=True, eq=False)
class TuningSpace:
    """The tiles tuning times per operand class (``candidates``) and how its key rounds sizes.

    ``key_step`` and ``fine_key_limit`` shape the autotune cache's keys (``_core.gemm.
    size_class``): changing them orphans the committed tuning.
    """

    tiles: Mapping[str, tuple[MatmulConfig, ...]] = field(default_factory=lambda: _TILES)
    tma_extras: Mapping[str, tuple[MatmulConfig, ...]] = field(default_factory=lambda: _TMA_EXTRAS)
    group_m: int = 8  # row blocks per group of the grouped tile order (L2 reuse of B's columns)
    key_step: int = 256
    fine_key_limit: int = 8192


TUNING_SPACE = TuningSpace()


@dataclass(frozen=True, eq=False)
class GemmOptions:
    """How a launcher runs a GEMM besides its tile config: nothing here is tuned per shape.

    Compared by identity (plans are cached per options object): build one and reuse it.
    """

    # Where TMA descriptors are built: "device" (each program makes its own in global scratch,
    # _core.gemm.make_descriptors) or "host" (TensorDescriptor objects, encoded into 128-byte
    # CUtensorMaps by the launcher on every call).
    descriptors: str = "device"
    interpreter_tma: bool = False  # take the TMA path under the CPU interpreter (tests)
    int64_above: int = 2**31  # offsets from this many elements on use 64-bit arithmetic
    sms: int | None = None  # SMs the schedule plans for; None: the device's
    # IEEE fp32 GEMMs copy a K-major B row-major from this M * N * K on (ieee.fma_copies_b).
    fma_copy_min_mnk: int = 512**3
    # 8-bit GEMMs copy an operand wgmma cannot read into K-major scratch from this M * N * K on
    # (lowp.kmajor_copies).
    kmajor_copy_min_mnk: int = 512**3
    space: TuningSpace = TUNING_SPACE
    # Products of at most this many rows (<= 16) take the decode kernel (decode.py), unless a
    # config is forced; 0: never.
    decode_max_m: int = 16

    def __post_init__(self) -> None:
        if self.descriptors not in ("device", "host"):
            raise ValueError(
                f"GemmOptions.descriptors must be 'device' or 'host', got {self.descriptors!r}"
            )


GEMM_OPTIONS = GemmOptions()


def operand_class(dtype: torch.dtype) -> str:
    if dtype == torch.float32:
        return "tf32" if tf32_enabled() else "ieee"
    if dtype in FP8_DTYPES:
        return "fp8"
    if dtype.itemsize == 1:
        return "8bit"
    return "16bit"


def candidates(
    kind: str, cls: str, tma: bool, m: int, split: int, options: GemmOptions = GEMM_OPTIONS
) -> list[MatmulConfig]:
    """The configs tuning times for one problem class; the first is the untimed default."""
    space = options.space
    if kind == "splitk":
        bm = splitk.block_m(m)
        bn = splitk.BLOCK_N
        bk = 32 if cls in ("tf32", "ieee") else (128 if cls in ("8bit", "fp8") else 64)
        return [
            tile(bm, bn, bk, 4, 4, SPLIT_K=split),
            tile(bm, 64, bk, 4, 4, SPLIT_K=split),
            tile(bm, bn, 2 * bk, 4, 3, SPLIT_K=split),
        ]
    tiles = [c.replace(GROUP_M=space.group_m) for c in space.tiles[cls]]
    if kind == "autotuned" or cls == "ieee":
        # The CUDA-core loop ran slower persistent than one tile per program (see
        # docs/performance.md).
        return tiles
    out = [c.replace(persistent=True, tma=tma) for c in tiles]
    if tma:
        extras = space.tma_extras.get(cls, ())
        out[1:1] = [c.replace(GROUP_M=space.group_m, persistent=True, tma=True) for c in extras]
    return out
