"""The sparse family's autograd Functions and public functions: ``spmv``, ``spmm``, ``sddmm``,
``bsr_mm``.

Gradients: for y = A x (and C = A B), the gradient of the dense operand is A^T g, a product
with the transpose's structure (``CSR.transpose_structure``: kept on the matrix); the gradient
of the values is g sampled at A's pattern against x (against B: SDDMM). Everything the backward
launches is decided in the forward. torch.autocast casts nothing here: the products run in
the matrix's dtype, and the dense operands must match it.
"""

from __future__ import annotations

import torch

from tritonkit.ops._core.device import sm_count
from tritonkit.ops._core.registry import apply
from tritonkit.ops._core.validate import check_operand, check_tensor
from tritonkit.ops.sparse.bsr import call_bsr_mm
from tritonkit.ops.sparse.config import split_chunk
from tritonkit.ops.sparse.formats import BSR, COO, CSR
from tritonkit.ops.sparse.sddmm import call_sddmm
from tritonkit.ops.sparse.spmm import call_spmm
from tritonkit.ops.sparse.spmv import call_spmv


def as_csr(op: str, a: object) -> CSR:
    """A CSR matrix from a CSR, a COO, or a torch sparse CSR/COO/BSR tensor."""
    if isinstance(a, CSR):
        return a
    if isinstance(a, COO):
        return a.to_csr()
    if isinstance(a, torch.Tensor) and a.layout in (
        torch.sparse_csr,
        torch.sparse_coo,
        torch.sparse_bsr,
    ):
        return CSR.from_torch(a)
    raise TypeError(
        f"{op}: A must be a tritonkit.sparse CSR or COO matrix or a torch sparse tensor, "
        f"got {type(a).__name__}"
        + (f" with layout {a.layout}" if isinstance(a, torch.Tensor) else "")
    )


def _needs_grad(*tensors) -> tuple[bool, ...]:
    on = torch.is_grad_enabled()
    return tuple(on and t.requires_grad for t in tensors)


def _empty_index(a: CSR) -> torch.Tensor:
    return a.crow_indices[:0]


class SpmvFunction(torch.autograd.Function):
    """y = A x with gradients for A's values and for x."""

    @staticmethod
    def forward(
        ctx, val, x, crow, col, bounds, chunk, rows, t_crow, t_col, t_perm, t_bounds, t_chunk
    ):
        y = call_spmv(crow, col, val, x, bounds, chunk)
        ctx.save_for_backward(val, x, col, rows, t_crow, t_col, t_perm, t_bounds)
        ctx.t_chunk = t_chunk
        return y

    @staticmethod
    def backward(ctx, g):
        val, x, col, rows, t_crow, t_col, t_perm, t_bounds = ctx.saved_tensors
        d_val = d_x = None
        if ctx.needs_input_grad[0]:
            d_val = call_sddmm(rows, col, val, g.unsqueeze(1), x.unsqueeze(0), 0.0, 1.0)
        if ctx.needs_input_grad[1]:
            d_x = call_spmv(t_crow, t_col, val[t_perm.long()], g, t_bounds, ctx.t_chunk)
        return d_val, d_x, *(None,) * 10


class SpmmFunction(torch.autograd.Function):
    """C = A B with gradients for A's values (SDDMM) and for B (A^T g)."""

    @staticmethod
    def forward(
        ctx, val, b, crow, col, bounds, chunk, rows, t_crow, t_col, t_perm, t_bounds, t_chunk
    ):
        c = call_spmm(crow, col, val, b, bounds, chunk)
        ctx.save_for_backward(val, b, col, rows, t_crow, t_col, t_perm, t_bounds)
        ctx.t_chunk = t_chunk
        return c

    @staticmethod
    def backward(ctx, g):
        val, b, col, rows, t_crow, t_col, t_perm, t_bounds = ctx.saved_tensors
        d_val = d_b = None
        if ctx.needs_input_grad[0]:
            d_val = call_sddmm(rows, col, val, g, b.t(), 0.0, 1.0)
        if ctx.needs_input_grad[1]:
            d_b = call_spmm(t_crow, t_col, val[t_perm.long()], g, t_bounds, ctx.t_chunk)
        return d_val, d_b, *(None,) * 10


# torch.compile traces the public functions: the chunk (host state: the device's SMs) is a
# constant to it, evaluated once while tracing, from the matrix's Python attributes alone.
@torch.compiler.assume_constant_result
def _chunk(op: str, n_rows: int, nnz: int, max_row: int, device: torch.device) -> int:
    return split_chunk(op, n_rows, nnz, max_row, sm_count(device))


def _bounds(a: CSR, chunk: int) -> torch.Tensor:
    return a.partition(chunk) if chunk else _empty_index(a)


def _backward_structure(a: CSR, need_val: bool, need_dense: bool, n: int | None):
    """(rows, t_crow, t_col, t_perm, t_bounds, t_chunk): what the backward reads, decided
    now; empty where no gradient will be asked for."""
    empty = _empty_index(a)
    rows = a.row_indices() if need_val else empty
    if not need_dense:
        return rows, empty, empty, empty, empty, 0
    t_crow, t_col, t_perm, t_max = a.transpose_structure()
    k = a.shape[1]
    chunk = _chunk("spmv" if n is None else "spmm", k, a.nnz, t_max, a.device)
    return rows, t_crow, t_col, t_perm, _bounds(a.t(), chunk), chunk


def spmv(A, x: torch.Tensor) -> torch.Tensor:
    """Sparse matrix times dense vector, ``y = A @ x``, with autograd for A's values and x.

    Rows are balanced by the rule in docs/sparse.md: a program per group of rows when the
    longest row is near the mean, an nnz-split otherwise; the result is deterministic.

    Args:
        A: ``tritonkit.sparse.CSR`` or ``COO`` (or a torch sparse CSR/COO/BSR tensor) of shape
            ``(M, K)`` with float32, float16 or bfloat16 values on a CUDA device.
        x: ``(K,)`` dense vector of A's dtype, any stride.

    Returns:
        ``(M,)`` in A's dtype (float32 accumulation).
    """
    op = "tritonkit.sparse.spmv"
    a = as_csr(op, A)
    check_tensor(op, "A.values", a.values)
    check_operand(op, "x", x, "A.values", a.values, shape=(a.shape[1],), shape_name="(K,)")
    chunk = _chunk("spmv", a.shape[0], a.nnz, a.max_row_length, a.device)
    need_val, need_x = _needs_grad(a.values, x)
    back = _backward_structure(a, need_val, need_x, None)
    return apply(
        SpmvFunction,
        a.values,
        x,
        a.crow_indices,
        a.col_indices,
        _bounds(a, chunk),
        chunk,
        *back,
    )


def spmm(A, B: torch.Tensor, *, transpose_a: bool = False) -> torch.Tensor:
    """Sparse matrix times dense matrix, ``C = A @ B`` (``A.T @ B`` with ``transpose_a``), as
    ``torch.sparse.mm``, with autograd for A's values and B.

    Args:
        A: ``tritonkit.sparse.CSR`` or ``COO`` (or a torch sparse tensor) of shape ``(M, K)``,
            float32, float16 or bfloat16 values on a CUDA device.
        B: ``(K, N)`` dense (``(M, N)`` with ``transpose_a``) of A's dtype, any strides.
        transpose_a: multiply by A's transpose (its structure is computed once and kept on A).

    Returns:
        ``(M, N)`` (``(K, N)`` with ``transpose_a``), contiguous, in A's dtype.
    """
    op = "tritonkit.sparse.spmm"
    a = as_csr(op, A)
    check_tensor(op, "A.values", a.values)
    if transpose_a:
        a = a.t()
    check_tensor(op, "B", B)
    if B.dim() != 2:
        raise ValueError(f"{op}: B must be 2-D, got shape {tuple(B.shape)}")
    check_operand(
        op, "B", B, "A.values", a.values, shape=(a.shape[1], B.shape[1]), shape_name="(K, N)"
    )
    chunk = _chunk("spmm", a.shape[0], a.nnz, a.max_row_length, a.device)
    need_val, need_b = _needs_grad(a.values, B)
    back = _backward_structure(a, need_val, need_b, B.shape[1])
    return apply(
        SpmmFunction,
        a.values,
        B,
        a.crow_indices,
        a.col_indices,
        _bounds(a, chunk),
        chunk,
        *back,
    )


def sddmm(
    A, mat1: torch.Tensor, mat2: torch.Tensor, *, beta: float = 1.0, alpha: float = 1.0
) -> CSR:
    """Sampled dense-dense product, as ``torch.sparse.sampled_addmm``:
    ``beta * A + alpha * (mat1 @ mat2)`` at A's pattern only.

    Args:
        A: ``tritonkit.sparse.CSR`` or ``COO`` (or a torch sparse tensor) of shape ``(M, N)``:
            the pattern and the values scaled by ``beta`` (not read when ``beta`` is 0).
        mat1: ``(M, K)`` dense of A's dtype, any strides.
        mat2: ``(K, N)`` dense of A's dtype, any strides.
        beta: scale of A's values.
        alpha: scale of the product.

    Returns:
        A CSR matrix with A's structure and the new values.
    """
    op = "tritonkit.sparse.sddmm"
    a = as_csr(op, A)
    check_tensor(op, "A.values", a.values)
    check_operand(op, "mat1", mat1, "A.values", a.values)
    check_operand(op, "mat2", mat2, "A.values", a.values)
    if mat1.dim() != 2 or mat2.dim() != 2:
        raise ValueError(
            f"{op}: mat1 and mat2 must be 2-D, got shapes {tuple(mat1.shape)} and "
            f"{tuple(mat2.shape)}"
        )
    m, n = a.shape
    if mat1.shape[0] != m or mat2.shape[1] != n or mat1.shape[1] != mat2.shape[0]:
        raise ValueError(
            f"{op}: mat1 (M, K) @ mat2 (K, N) must match A's shape (M, N) = {a.shape}, got "
            f"mat1 {tuple(mat1.shape)} and mat2 {tuple(mat2.shape)}"
        )
    values = call_sddmm(
        a.row_indices(), a.col_indices, a.values, mat1, mat2, float(beta), float(alpha)
    )
    return a.with_values(values)


def bsr_mm(A, B: torch.Tensor) -> torch.Tensor:
    """Block-sparse matrix times dense matrix on the tensor cores, ``C = A @ B``.

    Args:
        A: ``tritonkit.sparse.BSR`` (or a torch sparse BSR tensor) of shape ``(M, K)`` with
            blocks of 16..128 rows and columns, float32, float16 or bfloat16.
        B: ``(K, N)`` dense of A's dtype, any strides.

    Returns:
        ``(M, N)`` contiguous, in A's dtype (float32 accumulation; float32 blocks use TF32
        only where PyTorch's own float32 products may).
    """
    op = "tritonkit.sparse.bsr_mm"
    if isinstance(A, torch.Tensor) and A.layout == torch.sparse_bsr:
        A = BSR.from_torch(A)
    if not isinstance(A, BSR):
        raise TypeError(f"{op}: A must be a tritonkit.sparse.BSR matrix, got {type(A).__name__}")
    check_tensor(op, "A.values", A.values)
    check_tensor(op, "B", B)
    if B.dim() != 2:
        raise ValueError(f"{op}: B must be 2-D, got shape {tuple(B.shape)}")
    check_operand(
        op, "B", B, "A.values", A.values, shape=(A.shape[1], B.shape[1]), shape_name="(K, N)"
    )
    return call_bsr_mm(A.crow_indices, A.col_indices, A.values, B, A.shape[0])
