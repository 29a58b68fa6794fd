"""Functional forms of the optimizer kernels, on single tensors: the workbench's view of them.

``adam_step`` updates one parameter and its moments in place, and ``newton_schulz``
orthogonalizes a batch of matrices; both run the same kernels as the optimizers (a table of
one tensor, a batch of matrices), so ``tritonkit check`` and ``tritonkit bench`` measure what
a step does.
"""

from __future__ import annotations

import torch

from tritonkit.ops._core.layout import LAYOUT_COPIES, is_dense
from tritonkit.ops._core.plan import cached
from tritonkit.ops._core.validate import check_operand, check_tensor
from tritonkit.ops.optim import kernels_adam as adam_ops
from tritonkit.ops.optim import kernels_muon as muon_ops
from tritonkit.ops.optim.config import (
    NS_COEFFICIENTS,
    NS_STEPS,
    ChunkConfig,
    NSConfig,
    choose_ns_config,
    default_chunks,
)
from tritonkit.ops.optim.plan import (
    AdamHyper,
    NSWorkspace,
    TensorTable,
    launch_adam,
    launch_momentum,
    launch_normalize,
    newton_schulz_,
)


def _table(
    n_rows: int, numels: tuple[int, ...], device: torch.device, chunks: ChunkConfig
) -> TensorTable:
    return cached(
        "optim.table",
        (n_rows, numels, device, chunks),
        lambda: TensorTable(n_rows, numels, device, chunks.block),
    )


def _same_layout(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors walked flat in one memory order: kept when dense with equal strides, else
    copied contiguous (counted in ``LAYOUT_COPIES``)."""
    first = tensors[0]
    if all(is_dense(t) and t.stride() == first.stride() for t in tensors):
        return tensors
    LAYOUT_COPIES.count += len(tensors)
    return [t.contiguous() for t in tensors]


def adam_step(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    *,
    step: int = 1,
    lr: float = 1e-3,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    decoupled_weight_decay: bool = True,
    maximize: bool = False,
) -> None:
    """One Adam (AdamW with ``decoupled_weight_decay``) step on one tensor, in place: the
    optimizers' kernel, as ``torch.optim._functional.adam`` on a single parameter.

    Args:
        param, grad, exp_avg, exp_avg_sq: tensors of one shape, dtype and device (float32,
            float16 or bfloat16; the moments in the parameter's dtype). ``param``,
            ``exp_avg`` and ``exp_avg_sq`` are updated in place; ``grad`` is only read.
        step: the step being taken (1 for the first), which sets the bias corrections.
        lr, beta1, beta2, eps, weight_decay, maximize: as ``torch.optim.Adam``.
        decoupled_weight_decay: AdamW's decay (True) or Adam's L2 term (False).

    Reads 4 tensors and writes 3: 28 bytes per float32 parameter. Tensors that are not dense
    with one common layout are updated through contiguous copies (counted in
    ``LAYOUT_COPIES``).
    """
    op = "tritonkit.optim.functional.adam_step"
    check_tensor(op, "param", param)
    for name, t in (("grad", grad), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        check_operand(op, name, t, "param", param, param.shape, "param.shape")
    if param.numel() == 0:
        return
    targets = (param, exp_avg, exp_avg_sq)
    work = _same_layout([param, grad, exp_avg, exp_avg_sq])
    chunks = default_chunks(param.device, param.dtype)
    table = _table(adam_ops.N_ROWS, (param.numel(),), param.device, chunks)
    for row, t in zip((adam_ops.ROW_P, adam_ops.ROW_G, adam_ops.ROW_M, adam_ops.ROW_V), work):
        table.set_row(row, [t])
    for dst, src in (
        (adam_ops.ROW_P_OUT, adam_ops.ROW_P),
        (adam_ops.ROW_M_OUT, adam_ops.ROW_M),
        (adam_ops.ROW_V_OUT, adam_ops.ROW_V),
    ):
        table.copy_row(dst, src)
    steps = torch.full((table.n_chunks,), float(step - 1), device=param.device)
    hyper = AdamHyper(lr, beta1, beta2, eps, weight_decay, decoupled_weight_decay, False, maximize)
    launch_adam(table, steps, param.dtype, param.dtype, hyper, config=chunks)
    for target, done in zip(targets, (work[0], work[2], work[3])):
        if done is not target:  # updated through a contiguous copy: write it back
            target.copy_(done)


def newton_schulz(
    g: torch.Tensor,
    steps: int = NS_STEPS,
    coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
    eps: float = 1e-7,
    config: NSConfig | None = None,
) -> torch.Tensor:
    """Muon's orthogonalization of each matrix of ``g`` (``torch.optim.Muon``'s
    ``_zeropower_via_newtonschulz``): bfloat16, divided by its Frobenius norm (clamped to
    ``eps``), then ``steps`` Newton-Schulz iterations with ``coefficients``, on the transpose
    when rows > cols.

    Args:
        g: ``(rows, cols)`` or ``(batch, rows, cols)``, float32, float16 or bfloat16.
        steps, coefficients, eps: the iteration's.
        config: the GEMM's tiles and product path (``NSConfig``); None: as ``Muon`` picks
            it for this batch (``choose_ns_config``).

    Returns:
        A bfloat16 tensor of g's shape.
    """
    op = "tritonkit.optim.functional.newton_schulz"
    check_tensor(op, "g", g)
    if g.dim() not in (2, 3):
        raise ValueError(
            f"{op}: g must be 2-D or 3-D (batch, rows, cols), got shape {tuple(g.shape)}"
        )
    batch = g if g.dim() == 3 else g.unsqueeze(0)
    n_batch, rows, cols = batch.shape
    if batch.numel() == 0:
        return torch.empty(g.shape, dtype=torch.bfloat16, device=g.device)
    ws = NSWorkspace(n_batch, rows, cols, g.device)
    # The momentum pass with momentum 0 and no Nesterov is exactly "x = bf16(g)" with the
    # partial sums of squares: the same kernels as the optimizer, no extra ones.
    # Each matrix is walked in row-major order (NS on a column-major copy would be wrong).
    matrices = list(batch.unbind(0))
    if not all(m.is_contiguous() for m in matrices):
        LAYOUT_COPIES.count += 1
        matrices = list(batch.contiguous().unbind(0))
    buffers = [torch.zeros_like(m) for m in matrices]  # lerp(0, g, 1) = g, exactly
    chunks = default_chunks(g.device, g.dtype)
    table = TensorTable(muon_ops.N_ROWS, [m.numel() for m in matrices], g.device, chunks.block)
    table.set_row(muon_ops.ROW_G, matrices)
    table.set_row(muon_ops.ROW_BUF, buffers)
    table.set_row(muon_ops.ROW_X, list(ws.x.unbind(0)))
    partials = torch.empty(table.n_chunks, dtype=torch.float32, device=g.device)
    norms = torch.empty(n_batch, dtype=torch.float32, device=g.device)
    launch_momentum(table, partials, g.dtype, 0.0, False, None, None, chunks)
    launch_normalize(table, partials, norms, eps, None, chunks)
    config = config or choose_ns_config(n_batch, rows, cols, g.device)
    out = newton_schulz_(ws, steps, coefficients, config)
    return out if g.dim() == 3 else out[0]
