"""The output head's linear layer and cross-entropy, without the logits in memory.

A language model's head turns N hidden rows into N x V logits (V: the vocabulary), and the
loss reads them once more; with V = 32000 and N = 8192 rows that is 0.5 GB of bf16 logits,
1 GB again when the loss upcasts them to float32 (as Hugging Face's loss does), and the same
for their gradient. Here the rows are cut into chunks: per chunk, the logits are computed,
the loss and its gradient taken at once (tritonkit's cross-entropy), and the chunk's
contributions to the gradients of the hidden rows and of the weight accumulated; the chunk's
logits are then freed. The forward therefore does the backward's GEMMs too, and the backward
only scales the saved gradients by ``grad_output``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tritonkit.ops.cross_entropy.function import loss_and_grad

_REDUCTIONS = ("mean", "sum")


@dataclass(frozen=True)
class LinearCrossEntropyConfig:
    """How the rows are chunked: ``chunk_bytes`` of logits per chunk (at least ``min_rows``
    rows, so that each GEMM stays large enough to run near the device's peak)."""

    chunk_bytes: int = 64 << 20
    min_rows: int = 512

    def rows(self, n_rows: int, vocab: int, itemsize: int) -> int:
        rows = max(self.min_rows, self.chunk_bytes // max(1, vocab * itemsize))
        return max(1, min(n_rows, rows))


DEFAULT_CONFIG = LinearCrossEntropyConfig()


class LinearCrossEntropyFunction(torch.autograd.Function):
    """Forward: the loss, and the gradients of x, weight and bias (kept for the backward)."""

    @staticmethod
    def forward(
        ctx, x, weight, bias, target, ignore_index, reduction, label_smoothing, config
    ):  # fmt: skip
        n, _ = x.shape
        vocab = weight.shape[0]
        need = ctx.needs_input_grad
        if reduction == "mean":
            # 1 / the number of counted rows, on the device (no host sync); NaN when none are.
            scale = torch.reciprocal((target != ignore_index).sum().to(torch.float32))
        else:
            scale = torch.ones((), dtype=torch.float32, device=x.device)
        grad_x = torch.empty_like(x) if need[0] else None
        grad_w = torch.zeros_like(weight) if need[1] else None
        grad_b = torch.zeros(vocab, dtype=torch.float32, device=x.device) if need[2] else None
        total = torch.zeros((), dtype=torch.float32, device=x.device)
        rows = config.rows(n, vocab, x.element_size())
        for start in range(0, n, rows):
            stop = min(n, start + rows)
            xc = x[start:stop]
            logits = torch.nn.functional.linear(xc, weight, bias)
            # The chunk's summed float32 loss and the gradient of scale * loss, from the
            # cross-entropy kernels back to back (no trip through the autograd engine).
            loss, grad = loss_and_grad(
                logits, target[start:stop], ignore_index, "sum", label_smoothing, scale
            )
            del logits
            total += loss
            if grad_x is not None:
                torch.mm(grad, weight, out=grad_x[start:stop])
            if grad_w is not None:
                grad_w.addmm_(grad.t(), xc)
            if grad_b is not None:
                grad_b += grad.sum(0, dtype=torch.float32)
        if reduction == "mean":
            total = total * scale
        ctx.save_for_backward(grad_x, grad_w, grad_b)
        ctx.bias_dtype = None if bias is None else bias.dtype
        return total

    @staticmethod
    def backward(ctx, grad_output):
        grad_x, grad_w, grad_b = ctx.saved_tensors
        g = grad_output.reshape(())
        # The gradients were computed for grad_output = 1; a loss scale multiplies them here.
        if grad_x is not None:
            grad_x = grad_x * g.to(grad_x.dtype)
        if grad_w is not None:
            grad_w = grad_w * g.to(grad_w.dtype)
        if grad_b is not None:
            grad_b = (grad_b * g).to(ctx.bias_dtype)
        return grad_x, grad_w, grad_b, None, None, None, None, None


@torch.compiler.disable  # its forward runs autograd itself: a graph break, not a trace
def linear_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    config: LinearCrossEntropyConfig = DEFAULT_CONFIG,
) -> torch.Tensor:
    """``F.cross_entropy(F.linear(x, weight, bias).float(), target, ...)`` without the logits
    in memory, with autograd (gradients of x, weight and bias).

    Args:
        x: hidden rows ``(..., H)``, float32, float16 or bfloat16 (flattened to ``(N, H)``).
        weight: the head's ``(V, H)`` weight, x's dtype and device.
        target: int64 class indices of x's leading shape, in ``[0, V)`` or ``ignore_index``.
        bias: optional ``(V,)``, x's dtype.
        ignore_index: targets equal to it add no loss and no gradient, and are left out of
            the mean's denominator.
        reduction: ``"mean"`` (NaN when every target is ignored, as in PyTorch) or ``"sum"``.
        label_smoothing: in [0, 1], as in ``F.cross_entropy``.
        config: the chunking (:class:`LinearCrossEntropyConfig`).

    Returns:
        The float32 loss (a 0-d tensor).
    """
    op = "tritonkit.models.linear_cross_entropy"
    for name, t in (("x", x), ("weight", weight), ("target", target)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a tensor, got {type(t).__name__}")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {list(_REDUCTIONS)}, got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing}")
    if weight.dim() != 2:
        raise ValueError(f"{op}: weight must be 2-D (V, H), got shape {tuple(weight.shape)}")
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"{op}: x.shape[-1] must equal weight.shape[1] ({weight.shape[1]}), got {x.shape[-1]}"
        )
    if x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(f"{op}: weight must have x's dtype {x.dtype}, got {weight.dtype}")
    if target.dtype != torch.int64:
        raise TypeError(f"{op}: target must be int64, got {target.dtype}")
    if tuple(target.shape) != tuple(x.shape[:-1]):
        raise ValueError(
            f"{op}: target must have x's leading shape {tuple(x.shape[:-1])}, got "
            f"{tuple(target.shape)}"
        )
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(
            f"{op}: bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}"
        )
    x2 = x.reshape(-1, x.shape[-1])
    t1 = target.reshape(-1)
    device = x.device.type
    if torch.is_autocast_enabled(device):
        # As F.linear under autocast: the GEMM's operands in the autocast dtype (the casts
        # carry the gradients back to the float32 parameters).
        dtype = torch.get_autocast_dtype(device)
        x2, weight = x2.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
    with torch.autocast(device, enabled=False):
        return LinearCrossEntropyFunction.apply(
            x2, weight, bias, t1, ignore_index, reduction, float(label_smoothing), config
        )
