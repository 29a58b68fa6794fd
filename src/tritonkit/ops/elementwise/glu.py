"""Gated linear units ``act(gate) * up`` (swiglu, geglu): a forward and a backward kernel over
rows (``_core.layout.elementwise_rows``: views such as ``proj.chunk(2, dim=-1)`` are read in
place), registered as ``tritonkit::glu`` and ``tritonkit::glu_backward``.
"""

from __future__ import annotations

import torch
import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.layout import elementwise_output, elementwise_rows
from tritonkit.ops._core.math import ACTIVATIONS, act, act_grad
from tritonkit.ops._core.plan import cached
from tritonkit.ops._core.pointwise import tile
from tritonkit.ops._core.pointwise_config import (
    POINTWISE,
    PointwiseConfig,
    TileConfig,
    needs_int64,
)
from tritonkit.ops._core.registry import define_op, eager_direct


@kernel
def glu_fwd_kernel(
    gate_ptr,  # gate rows
    up_ptr,  # up rows
    y_ptr,  # output rows
    n_rows,
    n_cols,
    stride_gm,
    stride_um,
    stride_ym,
    ACT: tl.constexpr,
    PHI16: tl.constexpr,  # GELU: y has 16 bits, Phi from gelu_q16
    INT64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    _, rows, cols, mask = tile(n_rows, n_cols, BLOCK_M, BLOCK_N, INT64)
    g = tl.load(gate_ptr + rows[:, None] * stride_gm + cols[None, :], mask=mask).to(tl.float32)
    u = tl.load(up_ptr + rows[:, None] * stride_um + cols[None, :], mask=mask).to(tl.float32)
    y = act(g, ACT, PHI16) * u
    tl.store(
        y_ptr + rows[:, None] * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask
    )


@kernel
def glu_bwd_kernel(
    dy_ptr,
    gate_ptr,
    up_ptr,
    dgate_ptr,
    dup_ptr,
    n_rows,
    n_cols,
    stride_dym,
    stride_gm,
    stride_um,
    stride_dgm,
    stride_dum,
    ACT: tl.constexpr,
    INT64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    _, rows, cols, mask = tile(n_rows, n_cols, BLOCK_M, BLOCK_N, INT64)
    dy = tl.load(dy_ptr + rows[:, None] * stride_dym + cols[None, :], mask=mask).to(tl.float32)
    g = tl.load(gate_ptr + rows[:, None] * stride_gm + cols[None, :], mask=mask).to(tl.float32)
    u = tl.load(up_ptr + rows[:, None] * stride_um + cols[None, :], mask=mask).to(tl.float32)
    dgate = dy * u * act_grad(g, ACT)
    dup = dy * act(g, ACT)  # gelu_parts' Phi, shared with act_grad
    dg_ptrs = dgate_ptr + rows[:, None] * stride_dgm + cols[None, :]
    tl.store(dg_ptrs, dgate.to(dgate_ptr.dtype.element_ty), mask=mask)
    tl.store(
        dup_ptr + rows[:, None] * stride_dum + cols[None, :],
        dup.to(dup_ptr.dtype.element_ty),
        mask=mask,
    )


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
    cfg = TileConfig.for_rows(
        gr.n_rows, gr.n_cols, gate.element_size(), config, config.heavy_vectors
    )
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
    elem = gate.element_size()
    vectors = config.bwd_vectors_for(activation, elem)
    cfg = TileConfig.for_rows(gr.n_rows, gr.n_cols, elem, config, vectors)
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


@define_op("tritonkit::glu")
def _glu_op(gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
    return glu_fwd(gate, up, activation)


@_glu_op.register_fake
def _(gate, up, activation):
    return elementwise_output([gate, up])


@define_op("tritonkit::glu_backward")
def _glu_backward_op(
    grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str
) -> tuple[torch.Tensor, torch.Tensor]:
    return glu_bwd(grad, gate, up, activation)


@_glu_backward_op.register_fake
def _(grad, gate, up, activation):
    return elementwise_output([grad, gate, up]), elementwise_output([grad, gate, up])


# Eager calls on real tensors skip the ops' dispatch (see eager_direct).
call_glu = eager_direct(_glu_op)
call_glu_backward = eager_direct(_glu_backward_op)
