"""Cross-entropy over class-index targets, with class weights, label smoothing and ignore_index.

``F.cross_entropy`` in eager mode materializes log_softmax (N x C), then for the backward a
zero-filled N x C gradient of nll_loss and the log_softmax gradient: three N x C tensors and
six passes over them. Here one kernel reads each row of logits in chunks with an online
logsumexp, computes the row's loss and, when the logits need a gradient, sweeps the row again
(in reverse, so that the chunks read last are still in L2) and writes the row's gradient
``scale * (softmax - smoothed one-hot)`` in the logits' dtype: one read of the logits from DRAM
and one write of the gradient, and no N x C float32 tensor anywhere. The backward only scales
that gradient in place by grad_output; a scalar grad_output of 1.0 (``loss.backward()``) is
detected on the device and the kernel exits without touching memory. The user's logits are
never written.

Because the backward consumes the gradient buffer in place, a second backward through the same
graph (``retain_graph=True``) is refused with an error rather than silently scaled twice.

Loss, as ``F.cross_entropy`` defines it, for row i with target t, class weights w (1 without),
smoothing e and C classes::

    loss_i = (1 - e) * w[t] * (lse_i - x[i, t]) + e / C * sum_c w[c] * (lse_i - x[i, c])

ignored rows give 0; ``mean`` divides the sum by ``sum_i w[t_i]`` over non-ignored rows (NaN
when every target is ignored, as in PyTorch). Targets outside ``[0, C)`` (other than
ignore_index) give a NaN loss and gradient row; PyTorch raises a device-side assert there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonkit._utils import (
    cdiv,
    check_choice,
    check_operand,
    check_same_device,
    check_tensor,
    next_power_of_2,
    sm_count,
)
from tritonkit.ops.softmax import pow2_floor

# ----------------------------------------------------------------------------------------------
# Configs: every block size of the family is chosen here (benchmarks/sweep_norms.py sweeps them).
# ----------------------------------------------------------------------------------------------

# Classes per chunk of the row sweeps; short rows share a tile of up to TILE_ELEMS elements.
BLOCK_N = 8192
TILE_ELEMS = 4096
ELEMS_PER_THREAD = 8
MAX_WARPS = 32
# Programs per SM, each walking rows: bounds the rows in flight between the loss sweep and the
# gradient sweep (132 SMs x 4 x 250 KiB for a bf16 row of 128256 classes) so that the second
# sweep reads from L2. H200 sweep: 8 elements per thread at 4 programs per SM, 1492 GB/s
# forward + backward (16 at 2: 1383).
PROGRAMS_PER_SM = 4
# The in-place backward scaling: a tile of (rows, classes), and its warps.
SCALE_BLOCK = (4, 1024)
SCALE_WARPS = 4
# The single-program reductions over rows (mean denominator, loss sum).
REDUCE_BLOCK = 1024

_INT32_LIMIT = 2**31
REDUCTIONS = ("mean", "sum", "none")


def ce_config(n_rows: int, n_cols: int, device: torch.device) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, programs) of the cross-entropy forward kernel."""
    block_n = min(next_power_of_2(n_cols), pow2_floor(BLOCK_N))
    block_m = pow2_floor(max(1, min(next_power_of_2(n_rows), TILE_ELEMS // block_n)))
    elems = block_m * block_n
    warps = max(1, min(MAX_WARPS, next_power_of_2(max(1, elems // (32 * ELEMS_PER_THREAD)))))
    programs = max(1, min(cdiv(n_rows, block_m), PROGRAMS_PER_SM * sm_count(device)))
    return block_m, block_n, warps, programs


# ----------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------


@triton.jit
def _ce_prep_kernel(
    t_ptr,  # int64 targets [n_rows]
    w_ptr,  # class weights [n_cols], when HAS_WEIGHT
    stats_ptr,  # fp32 [2]: out: mean denominator, sum of all class weights
    n_rows,  # targets
    n_cols,  # classes
    stride_t,  # targets: elements between rows
    stride_w,  # weights: elements between classes
    ignore_index,
    HAS_WEIGHT: tl.constexpr,
    NEED_DENOM: tl.constexpr,  # reduction "mean": sum of w[t] over non-ignored rows (or count)
    NEED_WEIGHT_SUM: tl.constexpr,  # label smoothing with class weights
    BLOCK: tl.constexpr,
):
    # One program, fixed summation order: deterministic, and only N + C elements are read.
    offs = tl.arange(0, BLOCK)
    if NEED_DENOM:
        if HAS_WEIGHT:
            acc = tl.zeros([BLOCK], tl.float32)
        else:
            count = tl.zeros([BLOCK], tl.int32)  # exact for any number of rows
        for start in range(0, n_rows, BLOCK):
            r = start + offs
            t = tl.load(t_ptr + r * stride_t, mask=r < n_rows, other=ignore_index)
            keep = (r < n_rows) & (t != ignore_index)
            if HAS_WEIGHT:
                in_range = keep & (t >= 0) & (t < n_cols)
                wt = tl.load(w_ptr + tl.where(in_range, t, 0) * stride_w, mask=in_range, other=0.0)
                acc += wt.to(tl.float32)
            else:
                count += keep.to(tl.int32)
        if HAS_WEIGHT:
            tl.store(stats_ptr, tl.sum(acc, axis=0))
        else:
            tl.store(stats_ptr, tl.sum(count, axis=0).to(tl.float32))
    if NEED_WEIGHT_SUM:
        acc_w = tl.zeros([BLOCK], tl.float32)
        for start in range(0, n_cols, BLOCK):
            c = start + offs
            acc_w += tl.load(w_ptr + c * stride_w, mask=c < n_cols, other=0.0).to(tl.float32)
        tl.store(stats_ptr + 1, tl.sum(acc_w, axis=0))


@triton.jit
def _row_ids(tile, BLOCK_M: tl.constexpr, INT64: tl.constexpr):
    if INT64:  # offsets past 2**31 elements: 64-bit index arithmetic, only when needed
        tile = tl.cast(tile, tl.int64)
    return tile * BLOCK_M + tl.arange(0, BLOCK_M)


@triton.jit
def _ce_fwd_kernel(
    x_ptr,  # logits [n_rows, n_cols], any strides
    t_ptr,  # int64 targets [n_rows]
    w_ptr,  # class weights [n_cols], when HAS_WEIGHT
    stats_ptr,  # fp32 [2] from _ce_prep_kernel: mean denominator, sum of class weights
    loss_ptr,  # per-row losses: fp32 (summed later) or the output dtype (reduction "none")
    grad_ptr,  # gradient of the logits [n_rows, n_cols], unit class stride, when HAS_GRAD
    n_rows,
    n_cols,
    n_tiles,  # row tiles: cdiv(n_rows, BLOCK_M)
    stride_xm,  # logits: elements between rows
    stride_xn,  # logits: elements between classes
    stride_t,  # targets: elements between rows
    stride_w,  # weights: elements between classes
    stride_l,  # losses: elements between rows
    stride_gm,  # gradient: elements between rows
    ignore_index,  # rows with this target: zero loss and gradient, logits not read
    smoothing,  # label_smoothing, in [0, 1]
    HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr,  # smoothing > 0: the sum_c w[c] * x[c] term is needed
    HAS_GRAD: tl.constexpr,
    MEAN: tl.constexpr,  # the gradient is divided by the mean denominator
    INT64: tl.constexpr,
    BLOCK_M: tl.constexpr,  # rows per tile (1 unless the rows are short)
    BLOCK_N: tl.constexpr,  # classes per chunk
):
    cols = tl.arange(0, BLOCK_N)
    if INT64:
        cols = cols.to(tl.int64)
    n_chunks = tl.cdiv(n_cols, BLOCK_N)
    w_sum = n_cols * 1.0
    if HAS_SMOOTHING and HAS_WEIGHT:
        w_sum = tl.load(stats_ptr + 1)
    scale = 1.0
    if HAS_GRAD and MEAN:
        scale = 1.0 / tl.load(stats_ptr)  # inf when every target is ignored: no row uses it
    for tile in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        rows = _row_ids(tile, BLOCK_M, INT64)
        row_in = rows < n_rows
        t = tl.load(t_ptr + rows * stride_t, mask=row_in, other=ignore_index)
        ignored = t == ignore_index
        # Ignored rows are masked off: their logits are never read.
        active = row_in & (t != ignore_index)
        valid = (t >= 0) & (t < n_cols)
        t_safe = tl.where(valid, t, 0)
        x_rows = x_ptr + rows * stride_xm
        g_rows = grad_ptr + rows * stride_gm
        # Online logsumexp, one exp per element (see softmax._online_max_sum).
        m = tl.full([BLOCK_M, BLOCK_N], float("-inf"), tl.float32)
        s = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        if HAS_SMOOTHING:
            wx = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k in range(0, n_chunks):
            c = k * BLOCK_N + cols
            mask = active[:, None] & (c < n_cols)[None, :]
            x = tl.load(x_rows[:, None] + c[None, :] * stride_xn, mask=mask, other=float("-inf"))
            x = x.to(tl.float32)
            d = x - m
            e = tl.exp(-tl.abs(d))
            s_new = tl.where(d > 0.0, s * e + 1.0, s + e)
            s = tl.where(x == float("-inf"), s, s_new)
            m = tl.maximum(m, x)
            if HAS_SMOOTHING:
                if HAS_WEIGHT:
                    w = tl.load(w_ptr + c * stride_w, mask=c < n_cols, other=0.0).to(tl.float32)
                    wx += tl.where(mask, w[None, :] * x, 0.0)
                else:
                    wx += tl.where(mask, x, 0.0)
        row_max = tl.max(m, axis=1)
        lse = row_max + tl.log(tl.sum(s * tl.exp(m - row_max[:, None]), axis=1))
        x_t = tl.load(x_rows + t_safe * stride_xn, mask=active, other=0.0).to(tl.float32)
        w_t = tl.full([BLOCK_M], 1.0, tl.float32)
        if HAS_WEIGHT:
            w_t = tl.load(w_ptr + t_safe * stride_w, mask=active, other=0.0).to(tl.float32)
        loss = (1.0 - smoothing) * w_t * (lse - x_t)
        if HAS_SMOOTHING:  # skipped at 0: its -inf logits would make 0 * inf = NaN
            loss += smoothing / n_cols * (lse * w_sum - tl.sum(wx, axis=1))
        loss = tl.where(ignored, 0.0, tl.where(valid, loss, float("nan")))
        tl.store(loss_ptr + rows * stride_l, loss.to(loss_ptr.dtype.element_ty), mask=row_in)
        if HAS_GRAD:
            # d loss / dx[c] = p[c] * ((1 - e) w[t] + e/C sum(w)) - (1 - e) w[t] [c == t]
            #                  - e/C w[c], times the reduction's scale.
            coef_p = (1.0 - smoothing) * w_t * scale
            if HAS_SMOOTHING:
                coef_p += smoothing / n_cols * w_sum * scale
            coef_t = (1.0 - smoothing) * w_t * scale
            coef_c = smoothing / n_cols * scale
            for k in range(0, n_chunks):
                # Last chunk first: the chunks read last by the loss sweep are still in L2.
                c = (n_chunks - 1 - k) * BLOCK_N + cols
                in_row = (c < n_cols)[None, :]
                x = tl.load(
                    x_rows[:, None] + c[None, :] * stride_xn, mask=active[:, None] & in_row
                ).to(tl.float32)
                g = tl.exp(x - lse[:, None]) * coef_p[:, None]
                g -= tl.where(c[None, :] == t[:, None], coef_t[:, None], 0.0)
                if HAS_SMOOTHING:
                    if HAS_WEIGHT:
                        w = tl.load(w_ptr + c * stride_w, mask=c < n_cols, other=0.0)
                        g -= w.to(tl.float32)[None, :] * coef_c
                    else:
                        g -= coef_c
                g = tl.where(valid[:, None], g, float("nan"))
                g = tl.where(ignored[:, None], 0.0, g)  # written, so the buffer is all defined
                tl.store(
                    g_rows[:, None] + c[None, :],
                    g.to(grad_ptr.dtype.element_ty),
                    mask=row_in[:, None] & in_row,
                )


@triton.jit
def _ce_reduce_kernel(
    loss_ptr,  # fp32 per-row losses [n_rows], contiguous
    stats_ptr,  # fp32 [2]: the mean denominator first
    out_ptr,  # the reduced loss, a scalar in the logits' dtype
    n_rows,  # losses to sum
    MEAN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # One program, fixed summation order: deterministic.
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_rows, BLOCK):
        acc += tl.load(loss_ptr + start + offs, mask=start + offs < n_rows, other=0.0)
    total = tl.sum(acc, axis=0)
    if MEAN:
        total = total / tl.load(stats_ptr)  # 0 / 0 = NaN when every target is ignored
    tl.store(out_ptr, total.to(out_ptr.dtype.element_ty))


@triton.jit
def _ce_scale_kernel(
    grad_ptr,  # the forward's gradient [n_rows, n_cols], unit class stride; scaled in place
    go_ptr,  # grad_output: a scalar, or one value per row when PER_ROW
    n_rows,
    n_cols,
    stride_gm,  # gradient: elements between rows
    stride_go,  # grad_output: elements between rows (PER_ROW)
    PER_ROW: tl.constexpr,
    INT64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    if INT64:
        pid = tl.cast(pid, tl.int64)
    col_blocks = tl.cdiv(n_cols, BLOCK_N)
    rows = (pid // col_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = (pid % col_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    ptrs = grad_ptr + rows[:, None] * stride_gm + cols[None, :]
    if PER_ROW:
        f = tl.load(go_ptr + rows * stride_go, mask=rows < n_rows, other=0.0).to(tl.float32)
        g = tl.load(ptrs, mask=mask).to(tl.float32) * f[:, None]
        tl.store(ptrs, g.to(grad_ptr.dtype.element_ty), mask=mask)
    else:
        f = tl.load(go_ptr).to(tl.float32)
        if f != 1.0:  # loss.backward(): the gradient is already final, leave memory alone
            g = tl.load(ptrs, mask=mask).to(tl.float32) * f
            tl.store(ptrs, g.to(grad_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------


def _outputs(logits, reduction, need_grad):
    n_rows = logits.shape[0]
    shape = (n_rows,) if reduction == "none" else ()
    loss = torch.empty(shape, dtype=logits.dtype, device=logits.device)
    if need_grad:
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    else:
        grad = logits.new_empty(0)
    return loss, grad


def cross_entropy_fwd(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    need_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, gradient of the reduced loss w.r.t. the logits, or an empty tensor).

    ``logits`` is (N, C), any strides; the gradient is contiguous, in the logits' dtype, and
    assumes grad_output = 1 (``cross_entropy_scale_`` applies the real one).
    """
    loss, grad = _outputs(logits, reduction, need_grad)
    n_rows, n_cols = logits.shape
    if n_rows == 0:
        if reduction != "none":
            loss.fill_(float("nan") if reduction == "mean" else 0.0)
        return loss, grad
    dev = logits.device
    has_weight = weight is not None
    smoothing = float(label_smoothing)
    mean = reduction == "mean"
    need_weight_sum = has_weight and smoothing > 0.0
    stats = torch.zeros(2, dtype=torch.float32, device=dev)
    if mean or need_weight_sum:
        _ce_prep_kernel[(1,)](
            target,
            weight if has_weight else stats,
            stats,
            n_rows,
            n_cols,
            target.stride(0),
            weight.stride(0) if has_weight else 0,
            ignore_index,
            HAS_WEIGHT=has_weight,
            NEED_DENOM=mean,
            NEED_WEIGHT_SUM=need_weight_sum,
            BLOCK=REDUCE_BLOCK,
            num_warps=4,
        )
    rows_out = loss if reduction == "none" else torch.empty(n_rows, dtype=torch.float32, device=dev)
    block_m, block_n, warps, programs = ce_config(n_rows, n_cols, dev)
    span = (n_rows - 1) * logits.stride(0) + (n_cols - 1) * logits.stride(1)
    _ce_fwd_kernel[(programs,)](
        logits,
        target,
        weight if has_weight else logits,
        stats,
        rows_out,
        grad if need_grad else logits,
        n_rows,
        n_cols,
        cdiv(n_rows, block_m),
        logits.stride(0),
        logits.stride(1),
        target.stride(0),
        weight.stride(0) if has_weight else 0,
        rows_out.stride(0),
        n_cols,
        ignore_index,
        smoothing,
        HAS_WEIGHT=has_weight,
        HAS_SMOOTHING=smoothing > 0.0,
        HAS_GRAD=need_grad,
        MEAN=mean,
        INT64=max(span, (n_rows + block_m) * n_cols) >= _INT32_LIMIT,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=warps,
    )
    if reduction != "none":
        _ce_reduce_kernel[(1,)](
            rows_out, stats, loss, n_rows, MEAN=mean, BLOCK=REDUCE_BLOCK, num_warps=4
        )
    return loss, grad


def cross_entropy_scale_(grad: torch.Tensor, grad_output: torch.Tensor) -> None:
    """Scale the forward's gradient in place by grad_output (a scalar, or one value per row)."""
    n_rows, n_cols = grad.shape
    if grad.numel() == 0:
        return
    block_m, block_n = SCALE_BLOCK
    per_row = grad_output.dim() == 1
    grid = (cdiv(n_rows, block_m) * cdiv(n_cols, block_n),)
    _ce_scale_kernel[grid](
        grad,
        grad_output,
        n_rows,
        n_cols,
        grad.stride(0),
        grad_output.stride(0) if per_row else 0,
        PER_ROW=per_row,
        INT64=grad.numel() + block_m * n_cols >= _INT32_LIMIT,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=SCALE_WARPS,
    )


# ----------------------------------------------------------------------------------------------
# torch.library registration
# ----------------------------------------------------------------------------------------------


@torch.library.custom_op("tritonkit::cross_entropy", mutates_args=())
def _cross_entropy_op(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    need_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    return cross_entropy_fwd(
        logits, target, weight, ignore_index, reduction, label_smoothing, need_grad
    )


@_cross_entropy_op.register_fake
def _(logits, target, weight, ignore_index, reduction, label_smoothing, need_grad):
    return _outputs(logits, reduction, need_grad)


@torch.library.custom_op("tritonkit::cross_entropy_scale_", mutates_args=("grad",))
def _cross_entropy_scale_op(grad: torch.Tensor, grad_output: torch.Tensor) -> None:
    cross_entropy_scale_(grad, grad_output)


@_cross_entropy_scale_op.register_fake
def _(grad, grad_output):
    return None


# ----------------------------------------------------------------------------------------------
# Autograd
# ----------------------------------------------------------------------------------------------

_SECOND_BACKWARD = (
    "tritonkit.cross_entropy: the backward pass ran twice through the same graph "
    "(retain_graph=True). The gradient is computed by the forward pass and scaled in place by "
    "the first backward; recompute the loss for another backward"
)


class CrossEntropyFunction(torch.autograd.Function):
    """Cross-entropy whose forward also computes the logits' gradient (grad_output = 1)."""

    @staticmethod
    def forward(ctx, logits, target, weight, ignore_index, reduction, label_smoothing, need_grad):
        loss, grad = torch.ops.tritonkit.cross_entropy(
            logits, target, weight, ignore_index, reduction, label_smoothing, need_grad
        )
        ctx.save_for_backward(grad)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        try:
            (grad,) = ctx.saved_tensors
        except RuntimeError as exc:  # the version counter of the consumed buffer moved on
            raise RuntimeError(_SECOND_BACKWARD) from exc
        torch.ops.tritonkit.cross_entropy_scale_(grad, grad_output)
        return grad, None, None, None, None, None, None


# ----------------------------------------------------------------------------------------------
# Public function
# ----------------------------------------------------------------------------------------------


def cross_entropy(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """``torch.nn.functional.cross_entropy`` for class-index targets, with autograd.

    The gradient is computed during the forward pass (in the logits' dtype, never an N x C
    float32 copy) and scaled in place by the backward, so a second backward through the same
    graph raises. The logits are never modified.

    Args:
        input: logits of shape (N, C) or (C,), float32, float16 or bfloat16, on a CUDA device,
            any strides.
        target: int64 class indices of shape (N,) (or () for 1-d input), in ``[0, C)`` or equal
            to ``ignore_index``; other values give a NaN loss.
        weight: optional class weights of shape (C,), same dtype and device as input; no
            gradient flows to it (it is not differentiable in PyTorch either).
        ignore_index: targets equal to it contribute no loss and no gradient, and are left out
            of the mean's denominator.
        reduction: ``"mean"`` (divided by the summed weights of non-ignored targets; NaN when
            all are ignored), ``"sum"`` or ``"none"``.
        label_smoothing: in [0, 1]; mixes the one-hot target with the uniform distribution.
    """
    op = "tritonkit.cross_entropy"
    check_tensor(op, "input", input)
    check_tensor(op, "target", target, dtypes=(torch.int64,))
    check_same_device(op, input=input, target=target)
    if input.dim() not in (1, 2):
        raise ValueError(
            f"{op}: input must be (N, C) logits or (C,), got shape {tuple(input.shape)} "
            "(spatial dims are not supported)"
        )
    expected = tuple(input.shape[:1]) if input.dim() == 2 else ()
    if tuple(target.shape) != expected:
        raise ValueError(
            f"{op}: target must have shape {expected} for input of shape {tuple(input.shape)}, "
            f"got {tuple(target.shape)}"
        )
    n_cols = input.shape[-1]
    if n_cols == 0:
        raise ValueError(
            f"{op}: input must have at least one class, got shape {tuple(input.shape)}"
        )
    if weight is not None:
        check_operand(op, "weight", weight, "input", input, (n_cols,), "(C,)")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"{op}: ignore_index must be an int, got {type(ignore_index).__name__}")
    check_choice(op, "reduction", reduction, REDUCTIONS)
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)):
        raise TypeError(
            f"{op}: label_smoothing must be a float, got {type(label_smoothing).__name__}"
        )
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing}")
    need_grad = input.requires_grad and torch.is_grad_enabled()
    if input.dim() == 1:
        loss = CrossEntropyFunction.apply(
            input.unsqueeze(0),
            target.unsqueeze(0),
            weight,
            ignore_index,
            reduction,
            float(label_smoothing),
            need_grad,
        )
        return loss.squeeze(0) if reduction == "none" else loss
    return CrossEntropyFunction.apply(
        input, target, weight, ignore_index, reduction, float(label_smoothing), need_grad
    )
