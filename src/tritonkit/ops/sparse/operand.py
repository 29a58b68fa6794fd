"""The sparse operand of a product, from any format: tritonkit's CSR, COO and BSR, and torch's
sparse tensors of every layout ``torch.sparse.mm`` takes (sparse_coo, sparse_csr, sparse_csc,
sparse_bsr; sparse_bsc too).

A torch sparse tensor passed again and again is converted once: what its index tensors say
(the CSR structure, its analysis, and the permutation from its storage order to CSR order) is
kept in the plan cache under the tensor's identity, checked on every call against the index
tensors' data pointers and version counters (an in-place write to them is seen, a new tensor
is a new entry) and dropped when the tensor is collected (``formats.derived``). The values
are read at every call: a write to them is always seen, and a call costs at most one gather
of the values (none for sparse_csr and coalesced sparse_coo).

Gradients: a tensor that requires grad gets one in its own layout where PyTorch can hold it
(sparse_coo, sparse_csr, as with ``torch.sparse.mm``); tritonkit's formats get theirs on their
values tensor, of every format.
"""

from __future__ import annotations

import torch

from tritonkit.ops.sparse.formats import (
    BSR,
    COO,
    CSR,
    derived,
    element_structure,
    fingerprint,
    quiet_sparse,
)

TORCH_LAYOUTS = (
    torch.sparse_coo,
    torch.sparse_csr,
    torch.sparse_csc,
    torch.sparse_bsr,
    torch.sparse_bsc,
)
_COMPRESSED_ROWS = (torch.sparse_csr, torch.sparse_bsr)
_GRAD_LAYOUTS = (torch.sparse_coo, torch.sparse_csr)


def _layout(t: torch.Tensor) -> str:
    return str(t.layout).removeprefix("torch.")


def _bsr_blocks_ok(blocksize: tuple[int, int]) -> bool:
    return all(16 <= b <= 128 and not b & (b - 1) for b in blocksize)


class _StoredValues(torch.autograd.Function):
    """The stored values of a sparse_coo (coalesced or not) or sparse_csr tensor, with the
    gradient going back to the tensor in its own layout, as torch.sparse.mm gives it.
    ``values()`` refuses an uncoalesced COO tensor, and its backward makes a CSR gradient with
    PyTorch's beta warning; this one is quiet."""

    @staticmethod
    def forward(ctx, a):
        # The indices, not a.detach(): that would make another sparse tensor (and a warning).
        ctx.index, ctx.shape, ctx.layout = _index_tensors(a), a.shape, a.layout
        if a.layout == torch.sparse_coo:
            ctx.coalesced = a.is_coalesced()
            return a._values().detach()
        return a.values().detach()

    @staticmethod
    def backward(ctx, g):
        if ctx.layout == torch.sparse_coo:
            grad = torch.sparse_coo_tensor(ctx.index[0], g, ctx.shape, check_invariants=False)
            if ctx.coalesced:
                return grad._coalesced_(True)
            # Repeated entries share one gradient, the dense one at their place; a coalesced
            # gradient holds it once, as torch.sparse.mm's does (coalescing adds repeats up).
            grad = grad.coalesce()
            ones = torch.ones_like(g)
            times = torch.sparse_coo_tensor(ctx.index[0], ones, ctx.shape, check_invariants=False)
            times = times.coalesce().values()
            return torch.sparse_coo_tensor(
                grad.indices(),
                grad.values() / times,
                ctx.shape,
                is_coalesced=True,
                check_invariants=False,
            )
        return quiet_sparse(
            torch.sparse_csr_tensor, *ctx.index, g, ctx.shape, check_invariants=False
        )


def _index_tensors(a: torch.Tensor) -> tuple[torch.Tensor, ...]:
    if a.layout == torch.sparse_coo:
        return (a._indices(),)
    if a.layout in _COMPRESSED_ROWS:
        return a.crow_indices(), a.col_indices()
    return a.ccol_indices(), a.row_indices()


def _build(a: torch.Tensor, index: tuple[torch.Tensor, ...]):
    """(CSR structure, perm or None) or a BSR structure, from a torch tensor's indices."""
    shape, dtype, layout = (int(a.shape[0]), int(a.shape[1])), a.dtype, a.layout
    if layout == torch.sparse_coo:
        idx = index[0]
        return element_structure(idx[0], idx[1], (1, 1), a.is_coalesced(), shape, idx.dtype, dtype)
    compressed, plain = index
    # Nothing kept may hold a.values(): that alias is a view of a, and would keep it alive.
    block = (1, 1)
    if layout in (torch.sparse_bsr, torch.sparse_bsc):
        block = tuple(a.values().shape[1:])
    if layout == torch.sparse_csr:
        return CSR._structure(compressed, plain, shape, dtype), None
    if layout == torch.sparse_bsr and _bsr_blocks_ok(block):
        return BSR._structure(compressed, plain, block, shape, dtype)
    # Column-compressed (csc, bsc) or blocks tritonkit's BSR does not take: the stored
    # entries' coordinates, sorted into CSR order once.
    n_outer = shape[0] // block[0] if layout == torch.sparse_bsr else shape[1] // block[1]
    counts = compressed[1:] - compressed[:-1]
    outer = torch.repeat_interleave(
        torch.arange(n_outer, device=compressed.device), counts, output_size=plain.numel()
    )
    rows, cols = (outer, plain) if layout == torch.sparse_bsr else (plain, outer)
    return element_structure(rows, cols, block, False, shape, plain.dtype, dtype)


def _torch_values(op: str, a: torch.Tensor) -> torch.Tensor:
    """The stored values of ``a`` (flattened), differentiable where PyTorch can hold a's
    gradient."""
    grad = a.requires_grad and torch.is_grad_enabled()
    if grad and a.layout not in _GRAD_LAYOUTS:
        raise ValueError(
            f"{op}: A is a torch {_layout(a)} tensor that requires grad; PyTorch holds "
            "gradients of sparse_coo and sparse_csr tensors only (as torch.sparse.mm): pass "
            "A.detach(), or a tritonkit.sparse matrix whose values require grad"
        )
    if grad:
        return _StoredValues.apply(a)
    return a._values() if a.layout == torch.sparse_coo else a.values()


def _check_torch(op: str, a: torch.Tensor) -> None:
    if a.dim() != 2 or a.dense_dim() != 0:
        raise ValueError(
            f"{op}: A must be a 2-D torch sparse tensor of scalar values, got shape "
            f"{tuple(a.shape)} with {a.dense_dim()} dense dimension(s)"
        )


def _torch_structure(op: str, a: torch.Tensor):
    """The kept structure of a torch sparse tensor: (CSR, perm) or a BSR."""
    _check_torch(op, a)
    index = _index_tensors(a)

    def state() -> tuple:
        fp = (a.layout, tuple(a.shape), a.dtype, *map(fingerprint, index))
        if a.layout == torch.sparse_coo:
            return (*fp, a.is_coalesced())
        if a.layout in (torch.sparse_bsr, torch.sparse_bsc):
            return (*fp, tuple(a.values().shape[1:]))
        return fp

    return derived("torch", (a,), state, lambda: _build(a, index))


def as_csr(op: str, a: object) -> CSR:
    """A CSR matrix (its structure kept, its values this call's) from any sparse format."""
    if isinstance(a, CSR):
        return a
    if isinstance(a, (COO, BSR)):
        return a.to_csr()
    if isinstance(a, torch.Tensor) and a.layout in TORCH_LAYOUTS:
        kept = _torch_structure(op, a)
        values = _torch_values(op, a)
        if isinstance(kept, BSR):
            return kept.with_values(values).to_csr()
        struct, perm = kept
        flat = values.reshape(-1)
        return struct._with(flat if perm is None else flat[perm])
    raise TypeError(
        f"{op}: A must be a tritonkit.sparse CSR, COO or BSR matrix or a torch sparse tensor "
        f"(sparse_coo, sparse_csr, sparse_csc, sparse_bsr or sparse_bsc), got "
        f"{type(a).__name__}" + (f" with layout {a.layout}" if isinstance(a, torch.Tensor) else "")
    )


def as_bsr(op: str, a: object) -> BSR | None:
    """A BSR matrix where ``a`` is one tritonkit's block kernel takes (a tritonkit BSR, or a
    torch sparse_bsr tensor with blocks of 16..128, powers of 2), else None."""
    if isinstance(a, BSR):
        return a
    if isinstance(a, torch.Tensor) and a.layout == torch.sparse_bsr:
        kept = _torch_structure(op, a)
        if isinstance(kept, BSR):
            return kept.with_values(_torch_values(op, a))
    return None
