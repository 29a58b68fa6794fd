"""The gated linear units' kernels, ``act(gate) * up`` (swiglu, geglu) and its gradients, over rows
(``_core.layout.elementwise_rows``: views such as ``proj.chunk(2, dim=-1)`` are read in place).
The activations and ``bias_act`` run on the shared pointwise tiles (``_core.pointwise``).
"""

import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.math import act, act_grad
from tritonkit.ops._core.pointwise import tile


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
