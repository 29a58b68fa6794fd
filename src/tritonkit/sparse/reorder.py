"""Reverse Cuthill-McKee reordering, one BFS level at a time.

The structure of A + A^T is built on A's device (torch); the breadth-first search runs on the
host in numpy, each level expanded at once: the neighbours of the whole frontier gathered in
one indexing, the unvisited ones ordered by (position of their first parent in the frontier,
degree), which is the order the node-by-node Cuthill-McKee queue gives them. Each connected
component is ordered from a node of least degree and from a least-degree node of that search's
last level (George and Liu's pseudo-peripheral step); the narrower order is kept.
"""

from __future__ import annotations

import numpy as np
import torch

from tritonkit.ops.sparse.formats import COO, CSR


def _as_csr(a) -> CSR:
    if isinstance(a, CSR):
        return a
    if isinstance(a, COO):
        return a.to_csr()
    if isinstance(a, torch.Tensor):
        return CSR.from_torch(a)
    raise TypeError(f"tritonkit.sparse.rcm: A must be a CSR or COO matrix, got {type(a).__name__}")


def _symmetric_structure(a: CSR) -> tuple[np.ndarray, np.ndarray]:
    """(indptr, indices) of the pattern of A + A^T without the diagonal, as numpy arrays, each
    row's columns by ascending degree."""
    n = a.shape[0]
    rows = a.row_indices().long()
    cols = a.col_indices.long()
    r = torch.cat([rows, cols])
    c = torch.cat([cols, rows])
    keep = r != c
    key = torch.unique(r[keep] * n + c[keep])  # sorted: by row, then column
    r, c = key // n, key % n
    indptr = torch.zeros(n + 1, dtype=torch.int64, device=key.device)
    torch.cumsum(torch.bincount(r, minlength=n), 0, out=indptr[1:])
    # Each adjacency list by ascending degree (then index): the order CM visits neighbours in.
    degree = indptr[1:] - indptr[:-1]
    c = c[torch.argsort(r * (int(degree.max()) + 1 if n else 1) + degree[c], stable=True)]
    return indptr.cpu().numpy(), c.cpu().numpy()


def _gather(indptr: np.ndarray, degree: np.ndarray, indices: np.ndarray, frontier: np.ndarray):
    """The neighbours of the frontier's nodes, node after node (each node's own list order)."""
    counts = degree[frontier]
    ends = np.cumsum(counts)
    offsets = np.arange(ends[-1]) + np.repeat(indptr[frontier] - (ends - counts), counts)
    return indices[offsets]


def _cuthill_mckee(indptr, degree, indices, start, visited, scratch, out, pos):
    """Cuthill-McKee from ``start`` over adjacency lists sorted by degree, written to
    ``out[pos:]``; returns the new ``pos`` and the last BFS level.

    A level's unvisited neighbours, gathered node after node of the frontier (each list in
    degree order) and kept at their first occurrence, come in the order of the node-by-node
    Cuthill-McKee queue: by first parent, then degree.
    """
    frontier = np.array([start])
    visited[start] = True
    out[pos] = start
    pos += 1
    while True:
        nb = _gather(indptr, degree, indices, frontier)
        nb = nb[~visited[nb]]
        if nb.size == 0:
            return pos, frontier
        rank = np.arange(nb.size)
        scratch[nb[::-1]] = rank[::-1]  # the last write wins: each node's first occurrence
        nb = nb[scratch[nb] == rank]
        visited[nb] = True
        out[pos : pos + nb.size] = nb
        pos += nb.size
        frontier = nb


def _bandwidth_of(indptr, degree, indices, nodes: np.ndarray, scratch) -> int:
    """The bandwidth of one component laid out in the order ``nodes``."""
    scratch[nodes] = np.arange(nodes.size)
    nb = _gather(indptr, degree, indices, nodes)
    if nb.size == 0:
        return 0
    here = np.repeat(np.arange(nodes.size), degree[nodes])
    return int(np.abs(scratch[nb] - here).max())


def _component(indptr, degree, indices, start, visited, scratch, out, pos) -> int:
    """Order the component of ``start`` into ``out[pos:]``; returns the new ``pos``.

    Two Cuthill-McKee orders are tried, the narrower kept: from ``start`` (a node of least
    degree, as the original method and scipy start), and from a least-degree node of that
    search's last level (George and Liu's pseudo-peripheral step), which is usually narrower
    on meshes and bands.
    """
    end, last = _cuthill_mckee(indptr, degree, indices, start, visited, scratch, out, pos)
    other = int(last[np.argmin(degree[last])])
    if other == start or end - pos < 3:
        return end
    first = out[pos:end].copy()
    width = _bandwidth_of(indptr, degree, indices, first, scratch)
    visited[first] = False
    end2, _ = _cuthill_mckee(indptr, degree, indices, other, visited, scratch, out, pos)
    if _bandwidth_of(indptr, degree, indices, out[pos:end2], scratch) > width:
        out[pos:end] = first
    return end


def rcm(A) -> tuple[torch.Tensor, CSR]:
    """Reverse Cuthill-McKee ordering of a square matrix, on the pattern of ``A + A^T``.

    Args:
        A: square ``tritonkit.sparse.CSR`` or ``COO`` (or a torch sparse tensor).

    Returns:
        ``(perm, B)``: ``perm`` (int64, on A's device) lists the old index of each new row and
        column, and ``B = A[perm][:, perm]`` is the permuted matrix (CSR), whose bandwidth is
        usually far smaller than a scrambled A's.
    """
    a = _as_csr(A)
    n = a.shape[0]
    if a.shape[0] != a.shape[1]:
        raise ValueError(f"tritonkit.sparse.rcm: A must be square, got shape {a.shape}")
    indptr, indices = _symmetric_structure(a)
    degree = np.diff(indptr)
    visited = np.zeros(n, dtype=bool)
    scratch = np.empty(n, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    isolated = np.flatnonzero(degree == 0)
    visited[isolated] = True
    pos = 0
    # Components, each from the least-degree node not yet placed (ties as scipy breaks them:
    # numpy's default sort of int32 degrees).
    by_degree = np.argsort(degree.astype(np.int32))
    cursor = 0
    while pos < n - isolated.size:
        while visited[by_degree[cursor]]:
            cursor += 1
        pos = _component(indptr, degree, indices, by_degree[cursor], visited, scratch, out, pos)
    out[pos:] = isolated
    perm = torch.from_numpy(out[::-1].copy()).to(a.device)
    return perm, permute(a, perm)


def permute(A, perm: torch.Tensor) -> CSR:
    """The symmetric permutation ``A[perm][:, perm]`` of a square matrix, as CSR.

    Args:
        A: square ``CSR`` or ``COO``.
        perm: ``(n,)`` permutation: the old index of each new row and column.
    """
    a = _as_csr(A)
    n = a.shape[0]
    if a.shape[0] != a.shape[1] or perm.numel() != n:
        raise ValueError(
            f"tritonkit.sparse.permute: A must be square with one perm entry per row, got "
            f"shape {a.shape} and perm of {perm.numel()}"
        )
    perm = perm.to(a.device).long()
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(n, device=a.device)
    rows = inverse[a.row_indices().long()]
    cols = inverse[a.col_indices.long()]
    order = torch.argsort(rows * n + cols)
    crow = torch.zeros(n + 1, dtype=torch.int64, device=a.device)
    torch.cumsum(torch.bincount(rows, minlength=n), 0, out=crow[1:])
    idx = a.index_dtype
    return CSR(crow.to(idx), cols[order].to(idx), a.values[order], a.shape, check=False)


def bandwidth(A) -> int:
    """The largest ``|row - col|`` over A's non-zeros (0 for an empty matrix).

    Args:
        A: ``CSR`` or ``COO`` matrix (or a torch sparse tensor).
    """
    a = _as_csr(A)
    if a.nnz == 0:
        return 0
    return int((a.row_indices().long() - a.col_indices.long()).abs().max())
