"""Row-reduction machinery shared by softmax, the norms and cross-entropy: tensors seen as
``(n_outer, n_cols, n_inner)`` with real strides (``plan_rows``, ``row_plan``), tile and grid
choice (``row_config``), launches fixed once per shape (``Launch``, ``remember``), and the
``@triton.jit`` helpers that walk rows and chunks.

Host time: a row kernel often takes less time on the GPU than the Python around its launch, and
a backward's Python runs on the autograd engine's device thread, 3-5x slower than on the main
thread (docs/performance.md, "host time on the engine's thread; the partial-row sums in one
launch"). So the families work out everything that depends only on shapes, dtypes and strides
once (a plan: the layout, the path, the grid, the constexprs), keep it in a dict keyed by them,
and per call only allocate and launch."""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import triton
import triton.language as tl

from tritonkit.ops._core.layout import LAYOUT_COPIES, cdiv, is_dense, next_power_of_2
from tritonkit.ops._core.plan import PLANS
from tritonkit.ops._core.registry import direct_call_allowed

_INT32_LIMIT = 2**31


@dataclass(frozen=True)
class RowConfig:
    """Launch config of a row-reduction kernel over a (n_outer, n_cols, n_inner) layout."""

    BLOCK_R: int  # rows per tile
    BLOCK_N: int  # columns per tile: the whole row, or one chunk of the looped path
    LOOPED: bool  # the row does not fit in one tile: two sweeps over chunks
    num_warps: int
    programs: int  # grid size; each program walks tiles pid, pid + programs, ...
    n_tiles: int
    n_iblocks: int  # tiles along the inner row axis per outer index


def pow2_floor(n: int) -> int:
    """The largest power of 2 <= n (block sizes must be powers of 2; configs need not be)."""
    return 1 << (max(1, n).bit_length() - 1)


def row_warps(elems: int, elems_per_thread: int, max_warps: int) -> int:
    return max(1, min(max_warps, next_power_of_2(max(1, elems // (32 * elems_per_thread)))))


def row_config(
    layout: RowLayout,
    *,
    sms: int,
    max_fused: int,
    loop_block: int,
    tile_elems: int,
    adjacent_rows: int,
    elems_per_thread: int,
    loop_elems_per_thread: int,
    max_warps: int,
    loop_programs_per_sm: int,
) -> RowConfig:
    """Tile shape, warps and grid for one row-reduction launch (shared by softmax and norms).

    The family's knobs are passed in by its own config function, so each family tunes its
    kernels in one place; ``sms``: the device's streaming multiprocessors (looped grids).
    """
    _, stride_n, stride_i = layout.strides[0]
    rows_adjacent = layout.n_inner > 1 and stride_i == 1 and stride_n != 1
    rows = next_power_of_2(layout.n_inner)
    if rows_adjacent:  # keep a run of adjacent rows per tile; chunk the columns to fit
        block_r = min(rows, pow2_floor(adjacent_rows))
        widest = max(1, tile_elems // block_r)
    else:
        block_r = 1
        widest = max_fused
    block_n = next_power_of_2(layout.n_cols)
    looped = block_n > widest
    if looped:
        block_n = pow2_floor(min(loop_block, widest))
    else:  # short rows: several per tile
        block_r = max(block_r, min(rows, pow2_floor(tile_elems // block_n)))
    n_iblocks = cdiv(layout.n_inner, block_r)
    n_tiles = layout.n_outer * n_iblocks
    programs = n_tiles
    if looped:
        programs = max(1, min(n_tiles, loop_programs_per_sm * sms))
    return RowConfig(
        BLOCK_R=block_r,
        BLOCK_N=block_n,
        LOOPED=looped,
        num_warps=row_warps(
            block_r * block_n, loop_elems_per_thread if looped else elems_per_thread, max_warps
        ),
        programs=programs,
        n_tiles=n_tiles,
        n_iblocks=n_iblocks,
    )


# ----------------------------------------------------------------------------------------------
# Layout: same-shaped tensors as (n_outer, n_cols, n_inner) with real strides.
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowLayout:
    """Tensors of one shape seen as ``(n_outer, n_cols, n_inner)``, reduced along the middle.

    ``strides[k]`` is ``(outer, col, inner)`` for the k-th tensor of the plan. Per-row tensors
    (statistics) have shape ``keepdim`` and a col stride of 0.
    """

    n_outer: int
    n_cols: int
    n_inner: int
    strides: tuple[tuple[int, int, int], ...]

    @property
    def n_rows(self) -> int:
        return self.n_outer * self.n_inner

    def needs_int64(self) -> bool:
        """Whether some element lies 2**31 or more elements from its tensor's base."""
        return any(
            (self.n_outer - 1) * so + (self.n_cols - 1) * sn + (self.n_inner - 1) * si
            >= _INT32_LIMIT
            for so, sn, si in self.strides
        )


def _layout(
    shape: Sequence[int], reduced: Sequence[int], tensors: Sequence[tuple[Sequence[int], bool]]
) -> RowLayout | None:
    """The common (outer, col, inner) view of tensors given as (strides, has_cols), or None.

    The reduced dims must merge into one strided axis in logical order (a weight is indexed by
    the logical column). The other dims may be merged in any order (rows are independent); they
    are ordered by the first tensor's strides, so that the inner axis is its smallest-stride
    one. None: more than two row axes remain, or the reduced dims do not merge.
    """
    red = [d for d in reduced if shape[d] != 1]
    n_cols = math.prod(shape[d] for d in reduced)
    col_strides = []
    for strides, has_cols in tensors:
        if not has_cols or not red:
            col_strides.append(0 if not has_cols else 1)
            continue
        for a, b in itertools.pairwise(red):
            if strides[a] != shape[b] * strides[b]:
                return None
        col_strides.append(strides[red[-1]])
    row_dims = [d for d in range(len(shape)) if d not in reduced and shape[d] != 1]
    row_dims.sort(key=lambda d: -tensors[0][0][d])
    groups: list[tuple[int, list[int]]] = []
    for d in row_dims:
        here = [strides[d] for strides, _ in tensors]
        if groups and all(g == shape[d] * s for g, s in zip(groups[-1][1], here)):
            groups[-1] = (groups[-1][0] * shape[d], here)
        else:
            groups.append((shape[d], here))
    if len(groups) > 2:
        return None
    while len(groups) < 2:
        groups.insert(0, (1, [0] * len(tensors)))
    (n_outer, so), (n_inner, si) = groups
    strides = tuple((a, b, c) for a, b, c in zip(so, col_strides, si))
    return RowLayout(n_outer, n_cols, n_inner, strides)


def _cached_layout(*key: Any) -> RowLayout | None:
    # A layout is a pure function of shapes and strides; a model calls the same few many times,
    # and working one out again costs more host time than a small kernel's launch.
    return PLANS.get(("rows.layout", key), None, lambda: _layout(*key))


def new_like(t: torch.Tensor) -> torch.Tensor:
    """A new tensor shaped like t: with t's strides when t is dense, else contiguous."""
    if is_dense(t):
        return torch.empty_like(t)
    return torch.empty(t.shape, dtype=t.dtype, device=t.device)


def keepdim_shape(shape: Sequence[int], reduced: Sequence[int]) -> tuple[int, ...]:
    return tuple(1 if d in reduced else s for d, s in enumerate(shape))


def plan_rows(
    inputs: Sequence[torch.Tensor],
    reduced: Sequence[int],
    n_outputs: int,
    row_inputs: Sequence[torch.Tensor] = (),
    n_row_outputs: int = 0,
    count: bool = True,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], RowLayout | None]:
    """Plan a row-reduction pass: (inputs, outputs, row outputs, layout).

    Outputs are shaped like ``inputs[0]`` (its strides when it is dense); row outputs are fp32
    per-row statistics of shape ``keepdim_shape``, contiguous; ``row_inputs`` are such
    statistics from an earlier pass. The layout's strides are in the order inputs, outputs,
    row inputs, row outputs. When the tensors have no common strided view, the non-contiguous
    inputs are copied (counted in ``LAYOUT_COPIES`` when ``count``; fake tensors pass False)
    and the outputs are contiguous. The layout is None for an empty tensor.
    """
    first = inputs[0]
    shape = tuple(first.shape)
    outputs = [new_like(first) for _ in range(n_outputs)]
    keep = keepdim_shape(shape, reduced)
    row_outputs = [
        torch.empty(keep, dtype=torch.float32, device=first.device) for _ in range(n_row_outputs)
    ]
    inputs = list(inputs)
    if first.numel() == 0:
        return inputs, outputs, row_outputs, None

    def attempt() -> RowLayout | None:
        described = [(t.stride(), True) for t in (*inputs, *outputs)]
        described += [(t.stride(), False) for t in (*row_inputs, *row_outputs)]
        key = (shape, tuple(reduced), tuple(described))
        try:
            return _cached_layout(*key)
        except TypeError:  # symbolic sizes (torch.compile's dynamic shapes) do not hash
            return _layout(*key)

    layout = attempt()
    if layout is None:
        copied = []
        for t in inputs:
            if not t.is_contiguous():
                if count:
                    LAYOUT_COPIES.count += 1
                t = t.contiguous()
            copied.append(t)
        inputs = copied
        outputs = [torch.empty(shape, dtype=first.dtype, device=first.device) for _ in outputs]
        layout = attempt()
        assert layout is not None  # contiguous tensors always have this view
    return inputs, outputs, row_outputs, layout


# ----------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------


@triton.jit
def tile_rows(
    tile, n_inner, n_iblocks, BLOCK_R: tl.constexpr, INT64: tl.constexpr, OUTER: tl.constexpr
):
    """(outer index, inner indices [BLOCK_R], row mask) of row tile ``tile``; without OUTER
    (one outer index) the outer index is 0 and no integer division is made."""
    if INT64:  # offsets past 2**31 elements: 64-bit index arithmetic, only when needed
        tile = tl.cast(tile, tl.int64)
    if OUTER:
        o = tile // n_iblocks
        i = (tile % n_iblocks) * BLOCK_R + tl.arange(0, BLOCK_R)
    else:
        o = tile * 0
        i = tile * BLOCK_R + tl.arange(0, BLOCK_R)
    return o, i, i < n_inner


@triton.jit
def program_row(n_inner, OUTER: tl.constexpr):
    """(outer, inner) index of the row of a one-row-per-program launch (int64)."""
    row = tl.program_id(0).to(tl.int64)
    o = row * 0
    i = row
    if OUTER:
        o = row // n_inner
        i = row % n_inner
    return o, i


@triton.jit
def n_steps(n_tiles, ONE_TILE: tl.constexpr):
    """Tiles this program walks (pid, pid + programs, ...); 1 with ONE_TILE (grid = tiles)."""
    if ONE_TILE:
        n = 1
    else:
        n = tl.cdiv(n_tiles - tl.program_id(0), tl.num_programs(0))
    return n


@triton.jit
def col_ids(BLOCK_N: tl.constexpr, INT64: tl.constexpr):
    cols = tl.arange(0, BLOCK_N)
    if INT64:
        cols = cols.to(tl.int64)
    return cols


@triton.jit
def load_chunk(
    rows, start, cols, n_cols, stride_n, row_mask, other: tl.constexpr, EVICT: tl.constexpr
):
    """Load the chunk of columns [start, start + BLOCK_N) of a tile of rows, masked to the row
    (a start at or past n_cols loads nothing), with the L2 eviction policy EVICT ("" for none;
    no default: an omitted string constexpr fails to compile for the GPU in triton 3.6)."""
    c = start + cols
    mask = row_mask[:, None] & (c < n_cols)[None, :]
    return tl.load(
        rows[:, None] + c[None, :] * stride_n, mask=mask, other=other, eviction_policy=EVICT
    )


@triton.jit
def reverse_start(k, n_chunks, BLOCK_N: tl.constexpr):
    """First column of the k-th chunk of a sweep from the last chunk to the first; past the
    row (all masked) for k = n_chunks, the prefetch after the last one."""
    return tl.where(k < n_chunks, (n_chunks - 1 - k) * BLOCK_N, n_chunks * BLOCK_N)


def evict_kwargs(evict: bool) -> dict:
    """L2 policies of a looped kernel's two sweeps (LOOP_EVICT): keep what the first reads for
    the second, and let the second's reads and writes go first."""
    return {"KEEP": "evict_last" if evict else "", "DROP": "evict_first" if evict else ""}


def row_program_warps(row_bytes: int, table: Sequence[tuple[int, int]], max_warps: int = 32) -> int:
    """Warps of a one-row-per-program kernel: those of the first (bytes, warps) entry of
    ``table`` whose bytes hold the row; ``max_warps`` for wider rows."""
    return next((w for limit, w in table if row_bytes <= limit), max_warps)


def lookup(table: Sequence[tuple[Any, Any]], key: Any, default: Any = None) -> Any:
    """The value of ``key`` in a table of (key, value) pairs (configs keep tables as tuples, so
    that they stay frozen and hashable); ``default`` where the key is missing."""
    return next((v for k, v in table if k == key), default)


def row_program_config(
    n_cols: int,
    element_size: int,
    table: Sequence[tuple[int, int]],
    elems_per_thread: Sequence[tuple[int, int]],
) -> tuple[int, int]:
    """(BLOCK_N, warps) of a one-row-per-program kernel: warps by the row's bytes
    (row_program_warps), chunks of ``lookup(elems_per_thread, warps)`` elements per thread."""
    warps = row_program_warps(n_cols * element_size, table)
    block_n = 32 * warps * lookup(elems_per_thread, warps)
    return min(block_n, next_power_of_2(n_cols)), warps


# ----------------------------------------------------------------------------------------------
# Plans: what a call needs from shapes, dtypes and strides alone, worked out once per key.
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """One kernel launch with everything but its tensors fixed: the grid, the scalar arguments
    after the tensors (sizes, strides, eps, ...), the constexprs and ``num_warps``.
    ``launch(*tensors)`` launches on the current stream."""

    kernel: Any  # a tritonkit.ops._core.launch.Kernel
    grid: tuple[int, ...]
    scalars: tuple[int | float, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self, *tensors: Any) -> None:
        self.kernel.launch(self.grid, *tensors, *self.scalars, **self.meta)


PLAN_CACHE_SIZE = 4096  # plans kept per family cache; a model calls the same few shapes


def remember(cache: dict, key: Hashable, value: Any) -> Any:
    """Store ``value`` under ``key`` (the cache emptied first when full) and return it."""
    if len(cache) >= PLAN_CACHE_SIZE:
        cache.clear()
    cache[key] = value
    return value


def arg_facts(*args: Any) -> tuple | None:
    """What argument validation reads of a call, as a key for the cache of calls validated
    before (a public function validates a call only when its key is new): each tensor's type,
    shape, dtype and device, each other value with its type (and a tuple's items' types, so
    that True and 1 differ). None where no such key holds: while torch.compile traces (a
    dict of tensors' facts is not something to trace) or for an unhashable value (a list).
    Validation depends on nothing else, so a call with a known key is a valid call."""
    if torch.compiler.is_compiling():
        return None
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append((type(a), a.shape, a.dtype, a.device))
        elif isinstance(a, tuple):
            out.append((tuple, a, tuple(map(type, a))))
        else:
            out.append((type(a), a))
    key = tuple(out)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def launches_directly(args: Sequence[Any]) -> bool:
    """Whether a call with ``args`` may launch from its cached plan in this process rather than
    through its torch.library op: the rule of ``eager_direct`` (plain eager mode, no profiler,
    plain tensors, nothing that needs a gradient)."""
    return direct_call_allowed(tuple(args))


@dataclass(frozen=True)
class RowPlan:
    """How one row pass walks its tensors, from shapes and strides alone (see ``plan_rows``):
    the layout (None for empty tensors), which inputs are copied contiguous first (no common
    strided view exists; counted in ``LAYOUT_COPIES``), and whether the outputs are allocated
    like ``inputs[0]`` (``empty_like``: dense and not copied) or contiguous."""

    layout: RowLayout | None
    copies: tuple[bool, ...]
    outputs_like: bool
    keep: tuple[int, ...]  # shape of the fp32 per-row statistics

    @property
    def copied(self) -> bool:
        return any(self.copies)

    def inputs(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The inputs as the layout reads them: copied where the plan says so (counted)."""
        out = []
        for t, copy in zip(tensors, self.copies):
            if copy:
                LAYOUT_COPIES.count += 1
                t = t.contiguous()
            out.append(t)
        return out

    def output(self, first: torch.Tensor) -> torch.Tensor:
        """A new output for the pass whose first input is ``first`` (as given, before copies)."""
        if self.outputs_like:
            return torch.empty_like(first)
        return torch.empty(first.shape, dtype=first.dtype, device=first.device)

    def row_output(self, first: torch.Tensor) -> torch.Tensor:
        """A new fp32 per-row statistic, contiguous."""
        return torch.empty(self.keep, dtype=torch.float32, device=first.device)


def row_plan(
    inputs: Sequence[torch.Tensor],
    reduced: Sequence[int],
    n_outputs: int,
    row_inputs: Sequence[torch.Tensor] = (),
    n_row_outputs: int = 0,
) -> RowPlan:
    """The ``RowPlan`` of a pass as ``plan_rows`` would run it (the same layout, copies and
    output strides), without keeping its tensors."""
    ins, _, _, layout = plan_rows(
        inputs, reduced, n_outputs, row_inputs, n_row_outputs, count=False
    )
    copies = tuple(a is not b for a, b in zip(inputs, ins))
    like = not any(copies) and is_dense(inputs[0])
    return RowPlan(layout, copies, like, keepdim_shape(inputs[0].shape, reduced))
