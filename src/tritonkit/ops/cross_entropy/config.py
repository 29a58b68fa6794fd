"""The cross-entropy family's launch config: ``CrossEntropyConfig`` (every knob, with the
measurements behind its default) and the choice of the launches of one call from the logits'
layout, the options and a config (``forward_launches``, ``backward_launch``).
``experiments/sweep_ce.py`` sweeps it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tritonkit.ops._core.launch import Launch
from tritonkit.ops._core.layout import cdiv, next_power_of_2
from tritonkit.ops._core.rows import pow2_floor
from tritonkit.ops.cross_entropy.backward import ce_grad_kernel
from tritonkit.ops.cross_entropy.forward import (
    ce_reduce_kernel,
    ce_rows_kernel,
    ce_stats_kernel,
    ce_weight_sum_kernel,
)

_INT32_LIMIT = 2**31


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
    # The row kernel merges a tile of (rows, segments) partials of about this many elements.
    rows_tile: int = 1024
    rows_warps: int = 4
    # The single-program reductions over rows (mean denominator, loss sum).
    reduce_block: int = 1024
    reduce_warps: int = 4
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
    align_edge_tile: int = 2048  # elements of the row kernel's edge tile, rows x 2 * align
    # Out-of-range targets (not ignore_index) raise as PyTorch's do: on the CPU checked on the
    # host before any launch; on CUDA the row kernel is compiled with its device assert
    # (debug=True, integer overflow checks off: no other code changes), which stops the
    # kernel as PyTorch's device-side assert does, at no host time or extra launch.
    check_targets: bool = True
    int64: bool = False  # 64-bit index arithmetic even where 32 bits hold every offset


CROSS_ENTROPY = CrossEntropyConfig()  # the default (how it was chosen: docs/performance.md)


def ce_config(n_rows: int, n_cols: int, config: CrossEntropyConfig) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, n_segments, num_warps) of the stats and gradient kernels."""
    seg = pow2_floor(config.seg)
    block_n = min(next_power_of_2(n_cols), seg)
    block_m = pow2_floor(max(1, min(next_power_of_2(n_rows), seg // block_n)))
    warps = pow2_floor(max(1, config.seg_warps * block_m * block_n // seg))
    return block_m, block_n, cdiv(n_cols, block_n), warps


def align_for(block_m: int, config: CrossEntropyConfig, *tensors: torch.Tensor) -> int:
    """Elements per 128 bytes when the segments walk aligned row bodies (align): one row per
    program, contiguous classes, 16-byte aligned base pointers (the body's vectors), every
    tensor's rows starting at the same offset within 128 bytes (one head for all), and rows or
    a width that Triton's specialization (integers divisible by 16) would not prove aligned;
    0 otherwise."""
    size = tensors[0].element_size()
    vec = 128 // size
    if (
        not config.align
        or block_m != 1
        or any(t.stride(1) != 1 or t.data_ptr() % 16 for t in tensors)
    ):
        return 0
    n_rows, n_cols = tensors[0].shape
    residues = {t.stride(0) % vec if n_rows > 1 else 0 for t in tensors}
    if len(residues) != 1:
        return 0
    if n_cols % 16 == 0 and all(t.stride(0) % 16 == 0 or n_rows == 1 for t in tensors):
        return 0  # the plain segments' loads are vectors already
    return vec


def rows_config(n_rows: int, n_segments: int, config: CrossEntropyConfig) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_S) of the row kernel: rows per program, partials per row per step."""
    block_s = min(next_power_of_2(n_segments), pow2_floor(config.rows_tile))
    block_r = pow2_floor(max(1, min(next_power_of_2(n_rows), config.rows_tile // block_s)))
    return block_r, block_s


def needs_int64(
    logits: torch.Tensor, block_m: int, config: CrossEntropyConfig, *extents: int
) -> bool:
    """Whether element offsets of the logits (or of a tensor of ``extents`` elements) can pass
    2**31; row indices of a partial tile are formed before masking, so count a tile past the
    end."""
    n_rows, n_cols = logits.shape
    span = (n_rows - 1) * logits.stride(0) + (n_cols - 1) * logits.stride(1)
    return config.int64 or max(span, (n_rows + block_m) * n_cols, *extents) >= _INT32_LIMIT


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
    """The forward's launches for logits (N, C) with N > 0 (their strides and alignment)."""
    n_rows, n_cols = logits.shape
    has_weight = weight is not None
    has_smoothing = label_smoothing > 0.0
    mean = reduction == "mean"
    w_stride = weight.stride(0) if has_weight else 0
    prep = None
    if has_weight and has_smoothing:  # the row kernel needs the class weights' sum
        prep = Launch(
            ce_weight_sum_kernel,
            (1,),
            (n_cols, w_stride),
            {"BLOCK": config.reduce_block, "num_warps": config.reduce_warps},
        )
    block_m, block_n, n_segments, warps = ce_config(n_rows, n_cols, config)
    block_r, block_s = rows_config(n_rows, n_segments, config)
    align = align_for(block_m, config, logits)
    if align:  # the row kernel also reads each row's edge, a tile of 2 * align per row
        block_r = min(block_r, pow2_floor(max(1, config.align_edge_tile // (2 * align))))
    parts_shape = (3 if has_smoothing else 2, n_rows, n_segments)
    int64 = needs_int64(logits, block_m + block_r, config, parts_shape[0] * n_rows * n_segments)
    x_strides = (logits.stride(0), logits.stride(1), target.stride(0), w_stride)
    stats = Launch(
        ce_stats_kernel,
        (cdiv(n_rows, block_m) * n_segments,),
        (n_rows, n_cols, n_segments, *x_strides, n_rows * n_segments, ignore_index),
        {"HAS_WEIGHT": has_weight, "HAS_SMOOTHING": has_smoothing, "INT64": int64,
         "ALIGN": align, "BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps},
    )  # fmt: skip
    # The row kernel's assert (see check_targets), compiled in on CUDA only.
    check = {"debug": True, "sanitize_overflow": False} if config.check_targets else {}
    rows = Launch(
        ce_rows_kernel,
        (cdiv(n_rows, block_r),),
        (n_rows, n_cols, n_segments, *x_strides, n_rows * n_segments, 1, ignore_index,
         label_smoothing),
        {"HAS_WEIGHT": has_weight, "HAS_SMOOTHING": has_smoothing, "HAS_GRAD": need_grad,
         "INT64": int64, "ALIGN": align, "BLOCK_R": block_r, "BLOCK_S": block_s,
         "num_warps": config.rows_warps, **(check if logits.is_cuda else {})},
    )  # fmt: skip
    reduce = None
    if reduction != "none":
        reduce = Launch(
            ce_reduce_kernel,
            (1,),
            (n_rows, n_cols, target.stride(0), w_stride, ignore_index),
            {"MEAN": mean, "HAS_WEIGHT": has_weight, "BLOCK": config.reduce_block,
             "num_warps": config.reduce_warps},
        )  # fmt: skip
    return ForwardLaunches(prep, stats, rows, reduce, parts_shape)


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
    """The gradient's launch for logits (N, C) with N > 0 and their new gradient ``grad``."""
    n_rows, n_cols = logits.shape
    has_weight = weight is not None
    block_m, block_n, n_segments, warps = ce_config(n_rows, n_cols, config)
    return Launch(
        ce_grad_kernel,
        (cdiv(n_rows, block_m) * n_segments,),
        (n_rows, n_cols, n_segments, logits.stride(0), logits.stride(1), target.stride(0),
         weight.stride(0) if has_weight else 0,
         grad_output.stride(0) if grad_output.dim() == 1 else 0, grad.stride(0), ignore_index,
         label_smoothing),
        {"HAS_WEIGHT": has_weight, "HAS_SMOOTHING": label_smoothing > 0.0,
         "MEAN": reduction == "mean", "INT64": needs_int64(logits, block_m, config),
         "ALIGN": align_for(block_m, config, logits, grad), "BLOCK_M": block_m,
         "BLOCK_N": block_n, "num_warps": warps},
    )  # fmt: skip
