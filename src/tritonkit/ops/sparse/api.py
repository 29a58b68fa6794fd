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
from tritonkit.ops.sparse.formats import BSR, CSR
from tritonkit.ops.sparse.operand import as_bsr, as_csr
from tritonkit.ops.sparse.sddmm import call_sddmm
from tritonkit.ops.sparse.spmm import call_spmm
from tritonkit.ops.sparse.spmv import call_spmv


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


def _spmm_backward(ctx, g):
    """(d_val, d_b) of C = A B: g sampled at A's pattern against B (SDDMM), and A^T g."""
    val, b, col, rows, t_crow, t_col, t_perm, t_bounds = ctx.saved_tensors
    d_val = d_b = None
    if ctx.needs_input_grad[0]:
        d_val = call_sddmm(rows, col, val, g, b.t(), 0.0, 1.0)
    if ctx.needs_input_grad[1]:
        d_b = call_spmm(t_crow, t_col, val[t_perm.long()], g, t_bounds, ctx.t_chunk)
    return d_val, d_b


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
        return *_spmm_backward(ctx, g), *(None,) * 10


class BsrSpmmFunction(torch.autograd.Function):
    """C = A B for a BSR matrix: the forward on the tensor cores (``bsr_mm``), the gradients
    as SpmmFunction's over the blocks' element-wise CSR structure (``BSR.expanded``), whose
    values ``val`` are the blocks' gathered (the gather carries the gradient to the blocks)."""

    @staticmethod
    def forward(
        ctx,
        val,
        b,
        b_crow,
        b_col,
        b_values,
        m,
        col,
        rows,
        t_crow,
        t_col,
        t_perm,
        t_bounds,
        t_chunk,
    ):
        c = call_bsr_mm(b_crow, b_col, b_values, b, m)
        ctx.save_for_backward(val, b, col, rows, t_crow, t_col, t_perm, t_bounds)
        ctx.t_chunk = t_chunk
        return c

    @staticmethod
    def backward(ctx, g):
        return *_spmm_backward(ctx, g), *(None,) * 11


# torch.compile traces the public functions: the chunk (host state: the device's SMs) is a
# constant to it, evaluated once while tracing, from the matrix's Python attributes alone.
@torch.compiler.assume_constant_result
def _chunk(op: str, n_rows: int, nnz: int, max_row: int, device: torch.device) -> int:
    return split_chunk(op, n_rows, nnz, max_row, sm_count(device))


def _bounds(a: CSR, chunk: int) -> torch.Tensor:
    return a.partition(chunk) if chunk else _empty_index(a)


def _backward_structure(a: CSR, need_val: bool, need_dense: bool, n: int | None):
    """(rows, t_crow, t_col, t_perm, t_bounds, t_chunk): what the backward reads, decided
    now; empty where no gradient will be asked for. Each empty tensor is a slice of its own:
    Dynamo refuses an autograd.Function given one tensor as two of its inputs."""
    rows = a.row_indices() if need_val else _empty_index(a)
    if not need_dense:
        return rows, *(_empty_index(a) for _ in range(4)), 0
    t_crow, t_col, t_perm, t_max = a.transpose_structure()
    k = a.shape[1]
    chunk = _chunk("spmv" if n is None else "spmm", k, a.nnz, t_max, a.device)
    return rows, t_crow, t_col, t_perm, _bounds(a.transposed_structure()[0], chunk), chunk


def spmv(A, x: torch.Tensor) -> torch.Tensor:
    """Sparse matrix times dense vector, ``y = A @ x``, with autograd for A's values and x.

    Rows are balanced by the rule in docs/sparse.md: a program per group of rows when the
    longest row is near the mean, an nnz-split otherwise; the result is deterministic.

    Args:
        A: ``(M, K)``, float32, float16 or bfloat16 values on a CUDA device: a
            ``tritonkit.sparse.CSR``, ``COO`` or ``BSR`` (gradients for its values), or a torch
            sparse tensor of any layout ``torch.sparse.mm`` takes (sparse_coo, sparse_csr,
            sparse_csc, sparse_bsr; sparse_bsc too), converted once and kept for the next
            calls (docs/sparse.md; gradients for sparse_coo and sparse_csr tensors).
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
        A: ``(M, K)``, float32, float16 or bfloat16 values on a CUDA device: a
            ``tritonkit.sparse.CSR``, ``COO`` or ``BSR`` (gradients for its values), or a torch
            sparse tensor of any layout ``torch.sparse.mm`` takes (sparse_coo, sparse_csr,
            sparse_csc, sparse_bsr; sparse_bsc too), converted once and kept for the next
            calls (docs/sparse.md; gradients for sparse_coo and sparse_csr tensors). A BSR
            with blocks of 16..128 (powers of 2) runs on the tensor cores (``bsr_mm``).
        B: ``(K, N)`` dense (``(M, N)`` with ``transpose_a``) of A's dtype, any strides.
        transpose_a: multiply by A's transpose (its structure is computed once and kept on A).

    Returns:
        ``(M, N)`` (``(K, N)`` with ``transpose_a``), contiguous, in A's dtype.
    """
    op = "tritonkit.sparse.spmm"
    bsr = None if transpose_a else as_bsr(op, A)
    if bsr is not None:
        return _bsr_spmm(op, bsr, B)
    a = as_csr(op, A)
    check_tensor(op, "A.values", a.values)
    if transpose_a:
        a = a.t()
    _check_dense_b(op, B, a.values, a.shape[1])
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


def _check_dense_b(op: str, B: torch.Tensor, values: torch.Tensor, k: int) -> None:
    check_tensor(op, "B", B)
    if B.dim() != 2:
        raise ValueError(f"{op}: B must be 2-D, got shape {tuple(B.shape)}")
    check_operand(op, "B", B, "A.values", values, shape=(k, B.shape[1]), shape_name="(K, N)")


def _bsr_spmm(op: str, a: BSR, B: torch.Tensor) -> torch.Tensor:
    """spmm of a BSR matrix: bsr_mm's kernel forward; with a gradient to come, the backward
    of its element-wise CSR structure (decided now, as every backward here)."""
    check_tensor(op, "A.values", a.values)
    _check_dense_b(op, B, a.values, a.shape[1])
    need_val, need_b = _needs_grad(a.values, B)
    if not (need_val or need_b):
        return call_bsr_mm(a.crow_indices, a.col_indices, a.values, B, a.shape[0])
    csr = a.to_csr()
    back = _backward_structure(csr, need_val, need_b, B.shape[1])
    return apply(
        BsrSpmmFunction,
        csr.values,
        B,
        a.crow_indices,
        a.col_indices,
        a.values.detach(),
        a.shape[0],
        csr.col_indices,
        *back,
    )


def sddmm(
    A, mat1: torch.Tensor, mat2: torch.Tensor, *, beta: float = 1.0, alpha: float = 1.0
) -> CSR:
    """Sampled dense-dense product, as ``torch.sparse.sampled_addmm``:
    ``beta * A + alpha * (mat1 @ mat2)`` at A's pattern only.

    Args:
        A: ``(M, N)``: the pattern and the values scaled by ``beta`` (not read when ``beta``
            is 0); any format ``spmm`` takes (a BSR's pattern: every element of its blocks).
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
        A: ``tritonkit.sparse.BSR`` (or a torch sparse_bsr tensor, converted once and kept) of
            shape ``(M, K)`` with blocks of 16..128 rows and columns (powers of 2), float32,
            float16 or bfloat16. No autograd here: ``spmm`` runs this kernel with gradients.
        B: ``(K, N)`` dense of A's dtype, any strides.

    Returns:
        ``(M, N)`` contiguous, in A's dtype (float32 accumulation; float32 blocks use TF32
        only where PyTorch's own float32 products may).
    """
    op = "tritonkit.sparse.bsr_mm"
    a = as_bsr(op, A)
    if a is None:
        if isinstance(A, torch.Tensor) and A.layout == torch.sparse_bsr:
            A = BSR.from_torch(A)  # raises: its blocks are not ones the kernel takes
        layout = f" with layout {A.layout}" if isinstance(A, torch.Tensor) else ""
        raise TypeError(
            f"{op}: A must be a tritonkit.sparse.BSR matrix or a torch sparse_bsr tensor, got "
            f"{type(A).__name__}{layout}"
        )
    check_tensor(op, "A.values", a.values)
    _check_dense_b(op, B, a.values, a.shape[1])
    return call_bsr_mm(a.crow_indices, a.col_indices, a.values, B, a.shape[0])
