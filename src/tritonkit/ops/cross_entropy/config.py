"""The cross-entropy family's launch config: ``CrossEntropyConfig`` (every knob, with the
measurements behind its default) and the choice of the launches of one call from the tensors'
layouts, the options and a config (``forward_launches``, ``backward_launch``). Logits are
(N, C) or (N, C, d) (K-dimensional inputs with their positions flattened); rows are the N * d
(sample, position) pairs, addressed through two strides per tensor (``row_strides``).
``experiments/sweep_ce.py`` sweeps it; ``experiments/gpu_soft_ce.py`` the class-probability
kernels' segments."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tritonkit.ops._core.launch import Launch
from tritonkit.ops._core.layout import cdiv, next_power_of_2
from tritonkit.ops._core.rows import pow2_floor
from tritonkit.ops.cross_entropy.kernels_backward import ce_grad_kernel
from tritonkit.ops.cross_entropy.kernels_forward import (
    ce_reduce_kernel,
    ce_rows_kernel,
    ce_stats_kernel,
    ce_weight_sum_kernel,
)
from tritonkit.ops.cross_entropy.kernels_soft import (
    ce_soft_grad_kernel,
    ce_soft_rows_kernel,
    ce_soft_stats_kernel,
)

_INT32_LIMIT = 2**31

# Constants of the launches below that no sweep varies (the sweeps' knobs are the config's).
# The row kernel merges a tile of (rows, segments) partials of about ROWS_TILE elements, at
# ROWS_WARPS; the single-program reductions over rows (mean denominator, loss sum) take blocks
# of REDUCE_BLOCK at REDUCE_WARPS; the row kernel's edge tile of aligned rows (``align``) holds
# about ALIGN_EDGE_TILE elements, rows x 2 * align.
ROWS_TILE = 1024
ROWS_WARPS = 4
REDUCE_BLOCK = 1024
REDUCE_WARPS = 4
ALIGN_EDGE_TILE = 2048
# Out-of-range targets (not ignore_index) raise as PyTorch's do: on the CPU checked on the host
# before any launch; on CUDA the row kernel is compiled with its device assert (debug=True,
# integer overflow checks off: no other code changes), which stops the kernel as PyTorch's
# device-side assert does, at no host time or extra launch.
CHECK_TARGETS = True


@dataclass(frozen=True)
class CrossEntropyConfig:
    """Every tunable of cross_entropy, forward and backward (the measurements behind the
    defaults are in docs/performance.md)."""

    # Classes per segment of the stats and gradient kernels (rounded down to a power of 2), and
    # their warps for a full segment. Rows shorter than seg share a tile of seg elements, with
    # warps in proportion. 16384 classes at 8 warps (64 elements per thread) keep many bytes in
    # flight per program; fewer or more warps and longer segments were slower in
    # experiments/sweep_ce.py (see docs/performance.md).
    seg: int = 16384
    seg_warps: int = 8
    # Rows of one program per segment (BLOCK_M == 1) whose start or width Triton cannot prove
    # 16-byte aligned (an odd vocabulary such as GPT-2's 50,257 classes: each row starts at
    # another offset within 16 bytes) would be read one element per load. With align, segments
    # cut each row's body from its first element on a 128-byte line (whole 16-byte vectors,
    # each segment starting a line as an aligned width's do), and the fewer than 2 * 128 bytes
    # outside the body are read one by one: by the row kernel for the forward's logsumexp (in
    # the segment kernel they cost registers, 92 instead of 80: two programs per SM instead of
    # three, and a forward slower than the scalar loads'), by segment 0 for the gradient
    # (align_for). The aligned forward runs as fast as on an aligned width, and the gradient
    # much closer to it than plain segments (see docs/performance.md).
    align: bool = True
    int64: bool = False  # 64-bit index arithmetic even where 32 bits hold every offset
    # Class-probability targets: each segment program holds a segment of the logits and one
    # of the target (and computes the gradient from both), twice the registers of a
    # class-index segment, so their segments are half as long at the same warps.
    soft_seg: int = 8192
    soft_seg_warps: int = 8


CROSS_ENTROPY = CrossEntropyConfig()  # the default (how it was chosen: docs/performance.md)


def ce_config(
    n_rows: int, n_cols: int, config: CrossEntropyConfig, soft: bool = False
) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, n_segments, num_warps) of the stats and gradient kernels (``soft``:
    the class-probability kernels')."""
    seg = pow2_floor(config.soft_seg if soft else config.seg)
    seg_warps = config.soft_seg_warps if soft else config.seg_warps
    block_n = min(next_power_of_2(n_cols), seg)
    block_m = pow2_floor(max(1, min(next_power_of_2(n_rows), seg // block_n)))
    warps = pow2_floor(max(1, seg_warps * block_m * block_n // seg))
    return block_m, block_n, cdiv(n_cols, block_n), warps


def rows_of(t: torch.Tensor, inner: bool) -> tuple[int, int]:
    """(outer, inner) strides of the rows of ``t``: a scalar (0, 0); else dim 0 and, where the
    logits have positions (``inner``), the last dim (logits (N, C, d), targets (N, d) or
    (N, C, d), grad_output (N, d)); without positions (stride(0), 0)."""
    if t.dim() == 0:
        return 0, 0
    return t.stride(0), (t.stride(-1) if inner else 0)


@dataclass(frozen=True)
class Rows:
    """How the kernels of one launch address rows: row r is (r // n_inner, r % n_inner), at
    ``strides[i]`` = (outer, inner) in tensor i (segments.row_offset). ``n_inner`` is 1 where
    every tensor's rows are evenly strided (2-d logits; K-dimensional ones whose samples lie
    d positions apart, as channels-last logits do), each tensor then with its one row stride
    first."""

    n_rows: int
    n_inner: int
    strides: tuple[tuple[int, int], ...]


def row_strides(n_outer: int, n_inner: int, *tensors: torch.Tensor) -> Rows:
    """The ``Rows`` of tensors over N = ``n_outer`` samples of ``n_inner`` positions (see
    ``rows_of``; ``n_inner`` 1 for 2-d logits)."""
    pairs = tuple(rows_of(t, n_inner != 1) for t in tensors)
    if n_inner == 1:
        return Rows(n_outer, 1, tuple((o, 0) for o, _ in pairs))
    if n_outer == 1 or all(o == n_inner * i for o, i in pairs):
        return Rows(n_outer * n_inner, 1, tuple((i, 0) for _, i in pairs))
    return Rows(n_outer * n_inner, n_inner, pairs)


def align_of(
    block_m: int,
    config: CrossEntropyConfig,
    rows: Rows,
    n_cols: int,
    walked: dict[int, torch.Tensor],
) -> int:
    """Elements per 128 bytes (of the first tensor's dtype) when the segments walk aligned row
    bodies (align): one row per program, rows evenly strided, contiguous classes, 16-byte
    aligned base pointers (the body's vectors), every tensor's rows starting at the same
    offset within those 128 bytes' elements (one head for all; a tensor of wider or narrower
    elements then starts its body on a 16-byte boundary too), and rows or a width that
    Triton's specialization (integers divisible by 16) would not prove aligned; 0 otherwise.
    ``walked``: the tensors whose classes the segments walk, by their index in ``rows``,
    the logits first."""
    tensors = list(walked.values())
    vec = 128 // tensors[0].element_size()
    if (
        not config.align
        or block_m != 1
        or rows.n_inner != 1
        or any(t.stride(1) != 1 or t.data_ptr() % 16 for t in tensors)
    ):
        return 0
    n_rows = rows.n_rows
    row_stride = [rows.strides[i][0] for i in walked]
    residues = {s % vec if n_rows > 1 else 0 for s in row_stride}
    if len(residues) != 1:
        return 0
    if n_cols % 16 == 0 and all(s % 16 == 0 or n_rows == 1 for s in row_stride):
        return 0  # the plain segments' loads are vectors already
    return vec


def align_for(block_m: int, config: CrossEntropyConfig, *tensors: torch.Tensor) -> int:
    """``align_of`` for 2-d tensors (n_rows, n_cols) of one layout each."""
    n_rows, n_cols = tensors[0].shape
    rows = row_strides(n_rows, 1, *tensors)
    return align_of(block_m, config, rows, n_cols, dict(enumerate(tensors)))


def rows_config(n_rows: int, n_segments: int, config: CrossEntropyConfig) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_S) of the row kernel: rows per program, partials per row per step."""
    block_s = min(next_power_of_2(n_segments), pow2_floor(ROWS_TILE))
    block_r = pow2_floor(max(1, min(next_power_of_2(n_rows), ROWS_TILE // block_s)))
    return block_r, block_s


def needs_int64(
    tensors, block_m: int, config: CrossEntropyConfig, n_rows: int, n_cols: int, *extents: int
) -> bool:
    """Whether element offsets into ``tensors`` (or into a tensor of ``extents`` elements) can
    pass 2**31; row indices of a partial tile are formed before masking, so count a tile past
    the end."""
    if config.int64 or (n_rows + block_m) * n_cols >= _INT32_LIMIT:
        return True
    for t in tensors:
        strides = [abs(s) for s in t.stride()]
        span = sum((n - 1) * s for n, s in zip(t.shape, strides, strict=True))
        if span + (block_m + 1) * max(strides, default=0) >= _INT32_LIMIT:
            return True
    return max(extents, default=0) >= _INT32_LIMIT


def dims(logits: torch.Tensor) -> tuple[int, int, int]:
    """(N, C, d) of logits (N, C) or (N, C, d)."""
    return logits.shape[0], logits.shape[1], (logits.shape[2] if logits.dim() == 3 else 1)


@dataclass(frozen=True)
class ForwardLaunches:
    """The launches of one forward: ``prep`` (the class weights' sum, or None: not needed),
    ``stats``, ``rows``, ``reduce`` (with the mean's denominator; None for reduction "none"),
    and the shape of the fp32 partials between stats and rows."""

    prep: Launch | None
    stats: Launch
    rows: Launch
    reduce: Launch | None
    parts_shape: tuple[int, int, int]


def forward_launches(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    need_grad: bool,
    config: CrossEntropyConfig,
) -> ForwardLaunches:
    """The forward's launches for logits (N, C) or (N, C, d) with N * d > 0 (their strides and
    alignment); ``target`` holds class indices (int64) or class probabilities (a float
    tensor of the logits' shape)."""
    soft = target.is_floating_point()
    n, n_cols, d = dims(logits)
    rows = row_strides(n, d, logits, target)
    n_rows = rows.n_rows
    has_weight = weight is not None
    has_smoothing = label_smoothing > 0.0
    w_stride = weight.stride(0) if has_weight else 0
    prep = None
    if has_weight and has_smoothing and not soft:  # the row kernel needs the weights' sum
        prep = Launch(
            ce_weight_sum_kernel,
            (1,),
            (n_cols, w_stride),
            {"BLOCK": REDUCE_BLOCK, "num_warps": REDUCE_WARPS},
        )
    block_m, block_n, n_segments, warps = ce_config(n_rows, n_cols, config, soft)
    block_r, block_s = rows_config(n_rows, n_segments, config)
    walked = {0: logits, 1: target} if soft else {0: logits}
    align = align_of(block_m, config, rows, n_cols, walked)
    if align:  # the row kernel also reads each row's edge, a tile of 2 * align per row
        block_r = min(block_r, pow2_floor(max(1, ALIGN_EDGE_TILE // (2 * align))))
    planes = 4 if soft else (3 if has_smoothing else 2)
    parts_shape = (planes, n_rows, n_segments)
    int64 = needs_int64(
        (logits, target), block_m + block_r, config, n_rows, n_cols, planes * n_rows * n_segments
    )
    (xm, xs), (tm, ts) = rows.strides
    grid = (cdiv(n_rows, block_m) * n_segments,)
    tiles = {"INT64": int64, "ALIGN": align}
    if soft:
        stats = Launch(
            ce_soft_stats_kernel,
            grid,
            (n_rows, n_cols, n_segments, rows.n_inner, xm, xs, logits.stride(1), tm, ts,
             target.stride(1), w_stride, n_rows * n_segments, label_smoothing),
            {"HAS_WEIGHT": has_weight, **tiles, "BLOCK_M": block_m, "BLOCK_N": block_n,
             "num_warps": warps},
        )  # fmt: skip
        row_launch = Launch(
            ce_soft_rows_kernel,
            (cdiv(n_rows, block_r),),
            (n_rows, n_cols, n_segments, rows.n_inner, xm, xs, tm, ts, w_stride,
             n_rows * n_segments, label_smoothing),
            {"HAS_WEIGHT": has_weight, "HAS_GRAD": need_grad, **tiles, "BLOCK_R": block_r,
             "BLOCK_S": block_s, "num_warps": ROWS_WARPS},
        )  # fmt: skip
    else:
        stats = Launch(
            ce_stats_kernel,
            grid,
            (n_rows, n_cols, n_segments, rows.n_inner, xm, xs, logits.stride(1), tm, ts,
             w_stride, n_rows * n_segments, ignore_index),
            {"HAS_WEIGHT": has_weight, "HAS_SMOOTHING": has_smoothing, **tiles,
             "BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps},
        )  # fmt: skip
        # The row kernel's assert (see check_targets), compiled in on CUDA only.
        check = {"debug": True, "sanitize_overflow": False} if CHECK_TARGETS else {}
        row_launch = Launch(
            ce_rows_kernel,
            (cdiv(n_rows, block_r),),
            (n_rows, n_cols, n_segments, rows.n_inner, xm, xs, logits.stride(1), tm, ts,
             w_stride, n_rows * n_segments, 1, ignore_index, label_smoothing),
            {"HAS_WEIGHT": has_weight, "HAS_SMOOTHING": has_smoothing, "HAS_GRAD": need_grad,
             **tiles, "BLOCK_R": block_r, "BLOCK_S": block_s, "num_warps": ROWS_WARPS,
             **(check if logits.is_cuda else {})},
        )  # fmt: skip
    reduce = None
    if reduction != "none":
        reduce = Launch(
            ce_reduce_kernel,
            (1,),
            (n_rows, n_cols, rows.n_inner, tm, ts, w_stride, ignore_index),
            {"MEAN": reduction == "mean", "HAS_WEIGHT": has_weight, "SOFT": soft,
             "BLOCK": REDUCE_BLOCK, "num_warps": REDUCE_WARPS},
        )  # fmt: skip
    return ForwardLaunches(prep, stats, row_launch, reduce, parts_shape)


def backward_launch(
    grad_output: torch.Tensor,
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    grad: torch.Tensor,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    config: CrossEntropyConfig,
) -> Launch:
    """The gradient's launch for class-index targets, logits (N, C) or (N, C, d) with
    N * d > 0 and their new gradient ``grad``."""
    n, n_cols, d = dims(logits)
    rows = row_strides(n, d, logits, target, grad_output, grad)
    n_rows = rows.n_rows
    has_weight = weight is not None
    block_m, block_n, n_segments, warps = ce_config(n_rows, n_cols, config)
    align = align_of(block_m, config, rows, n_cols, {0: logits, 3: grad})
    int64 = needs_int64((logits, grad), block_m, config, n_rows, n_cols)
    x_rows, t_rows, go_rows, g_rows = rows.strides
    return Launch(
        ce_grad_kernel,
        (cdiv(n_rows, block_m) * n_segments,),
        (n_rows, n_cols, n_segments, rows.n_inner, *x_rows, logits.stride(1), *t_rows,
         weight.stride(0) if has_weight else 0, *go_rows, *g_rows, grad.stride(1),
         ignore_index, label_smoothing),
        {"HAS_WEIGHT": has_weight, "HAS_SMOOTHING": label_smoothing > 0.0,
         "MEAN": reduction == "mean", "INT64": int64, "ALIGN": align, "BLOCK_M": block_m,
         "BLOCK_N": block_n, "num_warps": warps},
    )  # fmt: skip


def soft_backward_launch(
    grad_output: torch.Tensor,
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    grad: torch.Tensor | None,
    tgrad: torch.Tensor | None,
    reduction: str,
    label_smoothing: float,
    config: CrossEntropyConfig,
) -> Launch:
    """The gradients' launch for class-probability targets: of the logits into ``grad`` and of
    the target into ``tgrad``, each where not None."""
    n, n_cols, d = dims(logits)
    outs = [t for t in (grad, tgrad) if t is not None]
    rows = row_strides(n, d, logits, target, grad_output, *outs)
    n_rows = rows.n_rows
    pairs = list(rows.strides)
    g_rows = pairs[3] if grad is not None else (0, 0)
    d_rows = pairs[-1] if tgrad is not None else (0, 0)
    block_m, block_n, n_segments, warps = ce_config(n_rows, n_cols, config, soft=True)
    tensors = (logits, target, *outs)
    walked = {0: logits, 1: target, **{3 + i: t for i, t in enumerate(outs)}}
    align = align_of(block_m, config, rows, n_cols, walked)
    return Launch(
        ce_soft_grad_kernel,
        (cdiv(n_rows, block_m) * n_segments,),
        (n_rows, n_cols, n_segments, rows.n_inner, *pairs[0], logits.stride(1), *pairs[1],
         target.stride(1), weight.stride(0) if weight is not None else 0, *pairs[2], *g_rows,
         grad.stride(1) if grad is not None else 0, *d_rows,
         tgrad.stride(1) if tgrad is not None else 0, label_smoothing),
        {"HAS_WEIGHT": weight is not None, "MEAN": reduction == "mean",
         "LOGITS_GRAD": grad is not None, "TARGET_GRAD": tgrad is not None,
         "INT64": needs_int64(tensors, block_m, config, n_rows, n_cols), "ALIGN": align,
         "BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps},
    )  # fmt: skip
