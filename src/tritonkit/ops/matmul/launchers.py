"""The launchers ``matmul_fwd`` and ``linear_fwd``: torch.matmul's and F.linear's semantics as
GEMM problems over strided views, planned once per input signature (``plan.build_plan``) and
run from the plan on every later call."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from tritonkit.ops._core.gemm import NO_EPILOGUE, Epilogue, Operand, Problem, coalesce_batch, matrix
from tritonkit.ops._core.layout import LAYOUT_COPIES
from tritonkit.ops._core.plan import cached
from tritonkit.ops.matmul.configs import GEMM_OPTIONS, GemmOptions, MatmulConfig
from tritonkit.ops.matmul.plan import (
    LinearPlan,
    MatmulPlan,
    Prep,
    as_is,
    build_plan,
    fp32_mode,
    signature,
)

# ---- matmul: torch.matmul's semantics --------------------------------------------------------


def _broadcast_batch(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    """``torch.broadcast_shapes(a, b)`` of two batch shapes; when one is empty (a product of
    matrices, the common case) without its host cost, tens of microseconds per call."""
    if not b:
        return tuple(a)
    if not a:
        return tuple(b)
    return tuple(torch.broadcast_shapes(tuple(a), tuple(b)))


def matmul_shape(op: str, a_shape: Sequence[int], b_shape: Sequence[int]) -> tuple[int, ...]:
    """Output shape of ``torch.matmul`` for these operand shapes; ValueError when invalid."""
    for name, shape in (("a", a_shape), ("b", b_shape)):
        if len(shape) == 0:
            raise ValueError(f"{op}: {name} must have at least 1 dimension, got a 0-d tensor")
    ka = a_shape[-1]
    b_dim = -2 if len(b_shape) >= 2 else 0
    kb = b_shape[b_dim]
    if ka != kb:
        raise ValueError(
            f"{op}: inner dimensions must match: a.shape[-1] = {ka} but b.shape[{b_dim}] = {kb} "
            f"(a {tuple(a_shape)}, b {tuple(b_shape)})"
        )
    try:
        batch = _broadcast_batch(a_shape[:-2], b_shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"{op}: batch dimensions must broadcast: a {tuple(a_shape)}, b {tuple(b_shape)}"
        ) from None
    rows = (a_shape[-2],) if len(a_shape) >= 2 else ()
    cols = (b_shape[-1],) if len(b_shape) >= 2 else ()
    return (*batch, *rows, *cols)


def _matrix2(t: torch.Tensor, vector_dim: int) -> torch.Tensor:
    return t.unsqueeze(vector_dim) if t.dim() == 1 else t


def _batch_copy(shape: tuple[int, ...], vector_dim: int) -> Prep:
    """The operand expanded to the batch and copied contiguous (counted by the plan)."""
    return lambda t: _matrix2(t, vector_dim).expand(*shape).contiguous()


def matmul_problem(
    a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype
) -> tuple[Problem | None, torch.Tensor, tuple]:
    """torch.matmul's semantics as one GEMM problem over strided views, its output, and the
    copies it made ((a's, b's): None or "batch")."""
    out_shape = matmul_shape("tritonkit.matmul", a.shape, b.shape)
    a2, b2 = _matrix2(a, 0), _matrix2(b, -1)
    m, k = a2.shape[-2:]
    n = b2.shape[-1]
    batch = _broadcast_batch(a2.shape[:-2], b2.shape[:-2])
    c = torch.empty((*batch, m, n), dtype=out_dtype, device=a.device)
    out = c.view(out_shape)
    if c.numel() == 0:
        return None, out, (None, None)
    if b2.dim() == 2 and a2.dim() > 2:
        # (..., M, K) @ (K, N): fold the batch into the rows when the layout allows (one GEMM,
        # as torch does).
        rows = math.prod(a2.shape[:-1])
        try:
            a_rows = a2.view(rows, k)
        except RuntimeError:
            a_rows = None
        if a_rows is not None:
            p = Problem(matrix(a_rows), matrix(b2), matrix(c.view(rows, n)), rows, n, k)
            return p, out, (None, None)
    ae = a2.expand(*batch, m, k)
    be = b2.expand(*batch, k, n)
    copies = (None, None)
    dims = coalesce_batch(batch, [ae.stride()[:-2], be.stride()[:-2], c.stride()[:-2]])
    if len(dims) > 2:  # more batch dimensions than the kernel's two strides: copy once
        LAYOUT_COPIES.count += 2
        ae, be = ae.contiguous(), be.contiguous()
        copies = ("batch", "batch")
        dims = coalesce_batch(batch, [ae.stride()[:-2], be.stride()[:-2], c.stride()[:-2]])
    if not dims:  # every batch dimension has size 1: one matrix
        index = (0,) * len(batch)
        p = Problem(matrix(ae[index]), matrix(be[index]), matrix(c[index]), m, n, k)
        return p, out, copies
    if len(dims) == 1:
        dims.insert(0, (1, [0, 0, 0]))
    (n0, s0), (n1, s1) = dims

    def operand(t: torch.Tensor, i: int) -> Operand:
        return Operand(t, (s0[i], s1[i], t.stride(-2), t.stride(-1)))

    p = Problem(operand(ae, 0), operand(be, 1), operand(c, 2), m, n, k, (n0, n1))
    return p, out, copies


def matmul_plan(
    a: torch.Tensor,
    b: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    path: str = "best",
    config: MatmulConfig | None = None,
    options: GemmOptions = GEMM_OPTIONS,
) -> MatmulPlan:
    """The plan ``matmul_fwd`` runs for these inputs (cached; built now if new)."""
    out_dtype = out_dtype or a.dtype
    key = (
        signature(a), signature(b), out_dtype, a.device, path, config, options, fp32_mode(a.dtype)
    )  # fmt: skip

    def build() -> MatmulPlan:
        p, out, copies = matmul_problem(a, b, out_dtype)
        c_shape = _c_shape(a, b)
        out_shape = None if tuple(out.shape) == c_shape else tuple(out.shape)
        if p is None or p.m == 0 or p.n == 0:
            return MatmulPlan(c_shape, out_shape, None)
        prep_a = prep_b = as_is
        if copies[0]:
            LAYOUT_COPIES.count -= 2  # counted again by the plan's first run
            prep_a = _batch_copy(tuple(p.a.tensor.shape), 0)
            prep_b = _batch_copy(tuple(p.b.tensor.shape), -1)
        b_dim = b.dim()
        gemm = build_plan(
            p, NO_EPILOGUE, path, config, options, prep_a, prep_b, copies,
            b2d=as_is if b_dim == 2 else (lambda t: t.reshape(t.shape[-2:])),
        )  # fmt: skip
        return MatmulPlan(c_shape, out_shape, gemm)

    return cached("matmul.plan", key, build)


def _c_shape(a: torch.Tensor, b: torch.Tensor) -> tuple[int, ...]:
    a2, b2 = _matrix2(a, 0), _matrix2(b, -1)
    batch = _broadcast_batch(a2.shape[:-2], b2.shape[:-2])
    return (*batch, a2.shape[-2], b2.shape[-1])


def matmul_fwd(
    a: torch.Tensor,
    b: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    path: str = "best",
    config: MatmulConfig | None = None,
    options: GemmOptions = GEMM_OPTIONS,
) -> torch.Tensor:
    """``torch.matmul(a, b)`` with the output in ``out_dtype`` (default: a's dtype).

    ``path`` picks a variant of the evolution (``configs.VARIANTS``) or "best"; ``config``
    forces one launch config, ``options`` how the GEMM runs (tests and sweeps).
    """
    out_dtype = out_dtype or a.dtype
    return matmul_plan(a, b, out_dtype, path, config, options).run(a, b, out_dtype)


def matmul_into(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """``out[:] = a @ b`` for 2-D ``a`` (m, k) and ``b`` (k, n), ``out`` (m, n) of ``a``'s dtype:
    the plan's GEMM launched into ``out`` (a block of rows of a larger output, no copy) when it
    is contiguous and 16-byte aligned as the plan's own output is, else computed and copied."""
    plan = matmul_plan(a, b, out.dtype)
    gemm = plan.gemm
    if (
        gemm is None
        or tuple(out.shape) != plan.c_shape
        or not out.is_contiguous()
        or out.data_ptr() % 16
    ):
        out.copy_(plan.run(a, b, out.dtype))
        return
    a2, b2 = gemm.operands(a, b)
    gemm.launch(a2, b2, out, (None,) * 5)


# ---- linear: act(x @ W^T + bias) + residual --------------------------------------------------


def linear_plan(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    activation: str,
    save_z: bool,
    config: MatmulConfig | None = None,
    options: GemmOptions = GEMM_OPTIONS,
) -> LinearPlan:
    """The plan ``linear_fwd`` runs for these inputs (cached; built now if new)."""
    key = (
        signature(x), signature(weight), signature(bias), signature(residual), activation,
        save_z, x.device, config, options, fp32_mode(x.dtype),
    )  # fmt: skip

    def build() -> LinearPlan:
        m, k = x.shape
        n = weight.shape[0]
        if m == 0 or n == 0:
            return LinearPlan(m, n, save_z, None)
        y = torch.empty((m, n), dtype=x.dtype, device=x.device)
        z = torch.empty((m, n), dtype=x.dtype, device=x.device) if save_z else None
        p = Problem(matrix(x), matrix(weight.t()), matrix(y), m, n, k)
        epi = Epilogue(bias=bias, activation=activation, residual=residual, z=z)
        # The kernel reads the weight through B = weight.t()'s strides: the weight itself is
        # passed (the same pointer), except for a row-major copy (fp32 on the CUDA cores).
        gemm = build_plan(p, epi, "best", config, options, b2d=_weight_t)
        return LinearPlan(m, n, save_z, gemm)

    return cached("linear.plan", key, build)


def _weight_t(w: torch.Tensor) -> torch.Tensor:
    return w.t()


def linear_fwd(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    activation: str,
    save_z: bool,
    config: MatmulConfig | None = None,
    options: GemmOptions = GEMM_OPTIONS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``act(x @ weight^T + bias) + residual`` for 2-D ``x``; returns ``(y, z)``.

    ``z`` is the pre-activation ``x @ weight^T + bias`` in x's dtype when ``save_z``, else
    empty.
    """
    plan = linear_plan(x, weight, bias, residual, activation, save_z, config, options)
    return plan.run(x, weight, bias, residual)
