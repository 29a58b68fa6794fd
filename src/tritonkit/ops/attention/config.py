"""Launch configs of the attention family and the problem description they are chosen for.

Every tile size, warp count and pipeline depth of the family is chosen here: frozen
dataclasses passed explicitly to the launchers (tests build their own), defaults per head
dim, and candidate lists that ``tritonkit._tuning`` times once per machine, keyed by
(head dim, dtype, band kind, mask kind, sequence-length bucket).

The Hopper candidates follow the fastest Triton FlashAttention kernels for sm_90 (Triton's
tutorial 06 and its autotune space): 128-query tiles, 64 or 128 keys per step, 4 or 8 warps,
3-4 pipeline stages; the backward's key tiles of 64-128 with 16-32 query steps (dK, dV) and
query tiles of 64-128 with 32-64 key steps (dQ). None of them has been timed by this code yet:
experiments/gpu_attention.py sweeps them on the GPU and the tuner keeps the best per key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from tritonkit import _tuning
from tritonkit.ops._core.device import interpreter_enabled, sm_count
from tritonkit.ops._core.layout import cdiv, next_power_of_2
from tritonkit.ops._core.plan import cached


@dataclass(frozen=True)
class Tile:
    """One kernel's launch: BLOCK_M query rows by BLOCK_N keys per step (the dK/dV kernel:
    BLOCK_N keys per program, BLOCK_M queries per step), warps, pipeline stages."""

    BLOCK_M: int
    BLOCK_N: int
    num_warps: int = 4
    num_stages: int = 2

    def tuning(self) -> _tuning.Config:
        return _tuning.Config(
            {"BLOCK_M": self.BLOCK_M, "BLOCK_N": self.BLOCK_N}, self.num_warps, self.num_stages
        )

    @staticmethod
    def from_tuning(cfg: _tuning.Config) -> Tile:
        p = cfg.params
        return Tile(int(p["BLOCK_M"]), int(p["BLOCK_N"]), cfg.num_warps, cfg.num_stages)

    def smem_bytes(self, block_d: int, elem: int, kernel: str = "fwd") -> int:
        """Shared memory of a launch of ``kernel`` ("fwd", "dq" or "dkdv"): the streamed
        tiles (K and V; Q and dO for dK/dV) in every pipeline stage, the resident ones (Q; Q
        and dO; K and V), and 1 KiB for the row vectors. Within 1% of what Triton allocates
        for sm_90a (experiments/ptxas_attention.py's compiles: 224 KiB for the forward's
        128 x 128 tile at D = 128 in 3 stages)."""
        stream = self.BLOCK_M if kernel == "dkdv" else self.BLOCK_N
        resident = {"fwd": self.BLOCK_M, "dq": 2 * self.BLOCK_M, "dkdv": 2 * self.BLOCK_N}[kernel]
        stages = max(1, self.num_stages)
        return (2 * stages * stream + resident) * block_d * elem + 1024


@dataclass(frozen=True)
class BwdConfig:
    """The backward: the dK/dV kernel's tile, the dQ kernel's tile, and how dQ is summed:
    by its own pass over the keys (deterministic, two launches) or with fp32 atomics from
    the dK/dV kernel (``atomic_dq``: a delta pre-pass, the dK/dV kernel, a cast)."""

    dkdv: Tile
    dq: Tile
    atomic_dq: bool = False


@dataclass(frozen=True)
class DecodeGemmConfig:
    """Split-KV decoding: keys per step, warps, stages, and the number of key splits
    (0: enough programs for two per SM, each at least MIN_SPLIT_KEYS keys)."""

    BLOCK_N: int = 64
    num_warps: int = 4
    num_stages: int = 3
    splits: int = 0

    def tuning(self) -> _tuning.Config:
        return _tuning.Config({"BLOCK_N": self.BLOCK_N}, self.num_warps, self.num_stages)

    @staticmethod
    def from_tuning(cfg: _tuning.Config, splits: int = 0) -> DecodeGemmConfig:
        return DecodeGemmConfig(int(cfg.params["BLOCK_N"]), cfg.num_warps, cfg.num_stages, splits)


MIN_SPLIT_KEYS = 256
DECODE_MAX_QUERIES = 16  # queries per (batch, head) up to which the split-KV path is taken

# Under the interpreter: small tiles (every path crosses several blocks at the test shapes),
# unequal so that row and column block logic are told apart.
INTERPRETER_FWD = Tile(32, 16, 4, 1)
INTERPRETER_BWD = BwdConfig(Tile(16, 32, 4, 1), Tile(32, 16, 4, 1))
INTERPRETER_DECODE = DecodeGemmConfig(16, 4, 1)

# The "flash" variant of the workbench: the same kernel with no software pipelining.
UNPIPELINED_FWD = Tile(64, 64, 4, 1)


# Candidates, heuristic default first. Pruned of the tiles that spill registers in ptxas's
# report for sm_90a (experiments/ptxas_attention.py, bf16, causal and not): the forward's
# 128 x 64 at 4 warps and D = 128 (~900 bytes), 128 x 128 at 4 warps and D = 64; the dK/dV
# kernel (K and V resident, two fp32 accumulators) spills in most tiles, least with 16-32
# query rows per step and 8 warps (D = 128: 16 x 128 at 8 warps spills 0 bytes without a
# causal band, 100-144 bytes with one; 64 x 128 at 8 warps, 1-2 KB).


def _fwd_candidates(block_d: int) -> list[Tile]:
    if block_d <= 64:
        return [Tile(128, 64, 4, 3), Tile(128, 128, 8, 3), Tile(128, 64, 4, 4), Tile(64, 64, 4, 3)]
    if block_d <= 128:
        return [
            Tile(128, 64, 8, 3),
            Tile(128, 128, 8, 3),
            Tile(128, 64, 8, 4),
            Tile(128, 32, 4, 3),
            Tile(64, 64, 4, 3),
        ]
    return [Tile(128, 64, 8, 2), Tile(128, 32, 8, 2), Tile(64, 32, 4, 3)]


def _dkdv_candidates(block_d: int) -> list[Tile]:
    if block_d <= 64:
        return [
            Tile(32, 128, 8, 3),
            Tile(32, 128, 8, 2),
            Tile(32, 64, 4, 1),
            Tile(64, 128, 8, 1),
            Tile(32, 64, 4, 2),
        ]
    if block_d <= 128:
        return [
            Tile(16, 128, 8, 3),
            Tile(16, 128, 8, 2),
            Tile(16, 64, 8, 4),
            Tile(32, 128, 8, 1),
            Tile(32, 128, 8, 3),
        ]
    return [Tile(16, 64, 8, 2), Tile(16, 32, 4, 3), Tile(16, 32, 8, 2), Tile(32, 64, 8, 1)]


def _dq_candidates(block_d: int) -> list[Tile]:
    if block_d <= 64:
        return [
            Tile(128, 32, 4, 4),
            Tile(128, 64, 8, 3),
            Tile(64, 64, 4, 3),
            Tile(64, 32, 4, 4),
            Tile(128, 128, 8, 3),
        ]
    if block_d <= 128:
        return [
            Tile(128, 64, 8, 3),
            Tile(128, 32, 8, 3),
            Tile(64, 64, 4, 3),
            Tile(64, 32, 4, 4),
        ]
    return [Tile(64, 64, 8, 2), Tile(32, 32, 4, 3), Tile(64, 32, 8, 2)]


def _decode_candidates(block_d: int) -> list[DecodeGemmConfig]:
    if block_d <= 128:
        return [
            DecodeGemmConfig(64, 4, 3),
            DecodeGemmConfig(128, 4, 3),
            DecodeGemmConfig(128, 8, 3),
            DecodeGemmConfig(64, 4, 4),
            DecodeGemmConfig(256, 8, 2),
        ]
    return [DecodeGemmConfig(64, 4, 2), DecodeGemmConfig(32, 4, 3), DecodeGemmConfig(64, 8, 2)]


@dataclass(frozen=True)
class Problem:
    """What a launch config depends on, besides the tensors' addresses and strides."""

    batch: int
    heads: int
    kv_heads: int
    seq_q: int  # the longest sequence of a packed batch
    seq_k: int
    head_dim: int
    dtype: torch.dtype
    mask_kind: int  # tiles.NO_MASK, BOOL_MASK, ADDITIVE_MASK
    left: int  # -1: unbounded
    right: int  # -1: unbounded (causal: 0)
    bottom_right: bool  # the diagonal's alignment for causal and windows
    varlen: bool
    dropout: bool

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def block_d(self) -> int:
        return max(16, next_power_of_2(self.head_dim))

    def key(self) -> dict:
        """The tuning key: head dim, dtype, band kind, mask kind, sequence-length bucket."""
        band = ("L" if self.left >= 0 else "") + ("R" if self.right >= 0 else "")
        if self.right == 0 and self.left < 0:
            band = "causal"
        return {
            "d": self.block_d,
            "dtype": str(self.dtype).removeprefix("torch."),
            "band": band or "full",
            "mask": self.mask_kind,
            "seq": next_power_of_2(max(self.seq_q, 1)),
            "seq_k": next_power_of_2(max(self.seq_k, 1)),
            "varlen": self.varlen,
            "dropout": self.dropout,
        }


def _choose(name: str, p: Problem, cands: list[Tile], run, kernel: str) -> Tile:
    elem = p.dtype.itemsize

    def prune(cfg: _tuning.Config) -> bool:
        bytes_needed = Tile.from_tuning(cfg).smem_bytes(p.block_d, elem, kernel)
        return _tuning.fits_shared_memory(bytes_needed)

    def choose() -> Tile:
        tuned = [c.tuning() for c in cands]
        tuned = [c for c in tuned if prune(c)] or tuned
        return Tile.from_tuning(_tuning.tune(name, p.key(), tuned, run, prune=prune))

    return cached(name, tuple(p.key().items()), choose)


def forward_config(p: Problem, run) -> Tile:
    """The forward's tile for ``p``: tuned on a GPU (``run(tile)`` launches it), the small
    interpreter tile on the CPU."""
    if interpreter_enabled():
        return INTERPRETER_FWD
    return _choose(
        "attention_fwd", p, _fwd_candidates(p.block_d), lambda c: run(Tile.from_tuning(c)), "fwd"
    )


def backward_config(p: Problem, run_dkdv, run_dq) -> BwdConfig:
    """The backward's tiles for ``p`` (each kernel tuned on its own; dQ by its own pass)."""
    if interpreter_enabled():
        return INTERPRETER_BWD
    dq = _choose(
        "attention_bwd_dq",
        p,
        _dq_candidates(p.block_d),
        lambda c: run_dq(Tile.from_tuning(c)),
        "dq",
    )
    dkdv = _choose(
        "attention_bwd_dkdv",
        p,
        _dkdv_candidates(p.block_d),
        lambda c: run_dkdv(Tile.from_tuning(c)),
        "dkdv",
    )
    return BwdConfig(dkdv, dq)


def decode_splits(p: Problem, device: torch.device, rows_per_block: int) -> int:
    """Key splits for the split-KV path: enough programs for two waves of one per SM, each
    split at least MIN_SPLIT_KEYS keys."""
    programs = p.batch * p.kv_heads * cdiv(p.group * p.seq_q, rows_per_block)
    want = cdiv(2 * sm_count(device), max(programs, 1))
    return max(1, min(want, cdiv(p.seq_k, MIN_SPLIT_KEYS)))


def decode_config(p: Problem, run) -> DecodeGemmConfig:
    """The split-KV tile for ``p`` (tuned on a GPU; splits are chosen by ``decode_splits``)."""
    if interpreter_enabled():
        return INTERPRETER_DECODE

    def choose() -> DecodeGemmConfig:
        cands = [c.tuning() for c in _decode_candidates(p.block_d)]
        return DecodeGemmConfig.from_tuning(
            _tuning.tune(
                "attention_decode", p.key(), cands, lambda c: run(DecodeGemmConfig.from_tuning(c))
            )
        )

    return cached("attention_decode", tuple(p.key().items()), choose)


def replace(config, **changes):
    """A copy of a config with some fields changed."""
    return dataclasses.replace(config, **changes)
