"""The gated units' launchers: per input signature, a cached plan of the copies, the outputs
and the bound launch (``glu_fwd``, ``glu_bwd``)."""

from __future__ import annotations

import torch

from tritonkit.ops._core.layout import elementwise_rows
from tritonkit.ops._core.math import ACTIVATIONS
from tritonkit.ops._core.plan import cached
from tritonkit.ops._core.pointwise_config import POINTWISE, PointwiseConfig, needs_int64
from tritonkit.ops.elementwise.config import glu_tiles
from tritonkit.ops.elementwise.kernels import glu_bwd_kernel, glu_fwd_kernel


def _signature(t: torch.Tensor) -> tuple:
    return t.shape, t.stride(), t.dtype, t.data_ptr() % 16 == 0


class _Plan:
    """A GLU launcher's decisions for one input signature: copies, outputs, the launch."""

    __slots__ = ("copies", "like", "run")

    def __init__(self, inputs, in_rows, outs, numel: int) -> None:
        self.copies = tuple(
            r.tensor.data_ptr() != t.data_ptr() or r.tensor.stride() != t.stride()
            for t, r in zip(inputs, in_rows)
        )
        # Outputs as layout.elementwise_output makes them: like the first input, or contiguous.
        first = inputs[0]
        self.like = outs[0].tensor.stride() == first.stride() and not self.copies[0]
        self.run = None

    def prepare(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [t.contiguous() if c else t for t, c in zip(inputs, self.copies)]

    def output(self, first: torch.Tensor) -> torch.Tensor:
        if self.like:
            return torch.empty_like(first)
        return torch.empty(first.shape, dtype=first.dtype, device=first.device)


def glu_fwd(
    gate: torch.Tensor, up: torch.Tensor, activation: str, config: PointwiseConfig = POINTWISE
) -> torch.Tensor:
    """``act(gate) * up``."""
    key = (_signature(gate), _signature(up), activation, config)
    plan = cached("glu.forward", key, lambda: _fwd_plan(gate, up, activation, config))
    gate, up = plan.prepare([gate, up])
    y = plan.output(gate)
    if plan.run is not None:
        plan.run(gate, up, y)
    return y


def _fwd_plan(gate, up, activation, config) -> _Plan:
    (gr, ur), (yr,) = elementwise_rows([gate, up])
    plan = _Plan([gate, up], [gr, ur], [yr], gate.numel())
    if gate.numel() == 0:
        return plan
    cfg = glu_tiles(gr.n_rows, gr.n_cols, gate.element_size(), activation, False, config)
    plan.run = glu_fwd_kernel.bind(
        cfg.grid(gr.n_rows, gr.n_cols),
        gr.tensor,
        ur.tensor,
        yr.tensor,
        gr.n_rows,
        gr.n_cols,
        gr.stride_row,
        ur.stride_row,
        yr.stride_row,
        ACT=ACTIVATIONS[activation],
        PHI16=config.phi16(activation, yr.tensor),
        INT64=needs_int64(config, gr, ur, yr),
        BLOCK_M=cfg.BLOCK_M,
        BLOCK_N=cfg.BLOCK_N,
        num_warps=cfg.num_warps,
    )
    return plan


def glu_bwd(
    grad: torch.Tensor,
    gate: torch.Tensor,
    up: torch.Tensor,
    activation: str,
    config: PointwiseConfig = POINTWISE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of ``act(gate) * up``: (dgate, dup)."""
    key = (_signature(grad), _signature(gate), _signature(up), activation, config)
    plan = cached("glu.backward", key, lambda: _bwd_plan(grad, gate, up, activation, config))
    grad, gate, up = plan.prepare([grad, gate, up])
    dgate, dup = plan.output(grad), plan.output(grad)
    if plan.run is not None:
        plan.run(grad, gate, up, dgate, dup)
    return dgate, dup


def _bwd_plan(grad, gate, up, activation, config) -> _Plan:
    (dyr, gr, ur), (dgr, dur) = elementwise_rows([grad, gate, up], n_outputs=2)
    plan = _Plan([grad, gate, up], [dyr, gr, ur], [dgr, dur], gate.numel())
    if gate.numel() == 0:
        return plan
    cfg = glu_tiles(gr.n_rows, gr.n_cols, gate.element_size(), activation, True, config)
    plan.run = glu_bwd_kernel.bind(
        cfg.grid(gr.n_rows, gr.n_cols),
        dyr.tensor,
        gr.tensor,
        ur.tensor,
        dgr.tensor,
        dur.tensor,
        gr.n_rows,
        gr.n_cols,
        dyr.stride_row,
        gr.stride_row,
        ur.stride_row,
        dgr.stride_row,
        dur.stride_row,
        ACT=ACTIVATIONS[activation],
        INT64=needs_int64(config, dyr, gr, ur, dgr, dur),
        BLOCK_M=cfg.BLOCK_M,
        BLOCK_N=cfg.BLOCK_N,
        num_warps=cfg.num_warps,
    )
    return plan
