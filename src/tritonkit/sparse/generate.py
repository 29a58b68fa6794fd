"""Random sparse matrices for tests and benchmarks, seeded, built on the target device.

- ``uniform``: every row with about ``nnz_per_row`` columns drawn uniformly (repeats dropped);
- ``powerlaw``: rows of Pareto-distributed lengths, any shape;
- ``rmat``: an R-MAT (Kronecker) graph: power-law rows, a few holding most non-zeros;
- ``banded``: non-zeros within ``half_width`` of the diagonal (FEM-like), optionally thinned;
- ``block``: a BSR matrix whose blocks are present with probability ``block_density``;
- ``shuffle``: a random symmetric permutation of a matrix (what RCM has to undo).

Values are standard normal (never zero) in ``dtype``; indices in ``index_dtype``.
"""

from __future__ import annotations

import torch

from tritonkit.ops.sparse.formats import BSR, CSR


def _gen(device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _from_keys(keys: torch.Tensor, shape, dtype, index_dtype, gen) -> CSR:
    """A CSR matrix from sorted, unique linear indices ``row * cols + col``."""
    n_rows, n_cols = shape
    rows, cols = keys // n_cols, keys % n_cols
    crow = torch.zeros(n_rows + 1, dtype=torch.int64, device=keys.device)
    torch.cumsum(torch.bincount(rows, minlength=n_rows), 0, out=crow[1:])
    values = torch.randn(keys.numel(), generator=gen, device=keys.device).to(dtype)
    return CSR(crow.to(index_dtype), cols.to(index_dtype), values, shape, check=False)


def uniform(
    n_rows: int,
    n_cols: int,
    nnz_per_row: int,
    *,
    dtype: torch.dtype = torch.float32,
    index_dtype: torch.dtype = torch.int32,
    device="cuda",
    seed: int = 0,
) -> CSR:
    """Rows of ``nnz_per_row`` uniform columns each (fewer where two draws collide).

    Args:
        n_rows: rows.
        n_cols: columns.
        nnz_per_row: draws per row.
        dtype: values' dtype.
        index_dtype: int32 or int64.
        device: where to build it.
        seed: the random seed.
    """
    gen = _gen(device, seed)
    k = min(nnz_per_row, n_cols)
    cols = torch.randint(0, max(n_cols, 1), (n_rows, k), generator=gen, device=device)
    cols = cols.sort(dim=1).values
    keep = torch.ones_like(cols, dtype=torch.bool)
    keep[:, 1:] = cols[:, 1:] != cols[:, :-1]
    rows = torch.arange(n_rows, device=device).unsqueeze(1).expand_as(cols)
    keys = (rows * n_cols + cols)[keep]
    return _from_keys(keys, (n_rows, n_cols), dtype, index_dtype, gen)


def powerlaw(
    n_rows: int,
    n_cols: int,
    mean: float,
    *,
    alpha: float = 1.5,
    dtype: torch.dtype = torch.float32,
    index_dtype: torch.dtype = torch.int32,
    device="cuda",
    seed: int = 0,
) -> CSR:
    """Rows of Pareto-distributed lengths (shape ``alpha``, about ``mean`` non-zeros on
    average, at most ``n_cols``), uniform columns: a skewed matrix of any shape.

    Args:
        n_rows: rows.
        n_cols: columns.
        mean: mean row length before repeats are dropped and long rows are cut at n_cols.
        alpha: Pareto shape (smaller: heavier tail).
        dtype: values' dtype.
        index_dtype: int32 or int64.
        device: where to build it.
        seed: the random seed.
    """
    gen = _gen(device, seed)
    u = torch.rand(n_rows, generator=gen, device=device).clamp_min(1e-12)
    lengths = (mean * (alpha - 1) / alpha * u.pow(-1.0 / alpha)).floor().long()
    lengths = lengths.clamp(0, n_cols)
    rows = torch.repeat_interleave(torch.arange(n_rows, device=device), lengths)
    cols = torch.randint(0, max(n_cols, 1), (rows.numel(),), generator=gen, device=device)
    keys = torch.unique(rows * n_cols + cols)
    return _from_keys(keys, (n_rows, n_cols), dtype, index_dtype, gen)


def rmat(
    scale: int,
    nnz: int,
    *,
    a: float = 0.57,
    b: float = 0.19,
    c: float = 0.19,
    permute: bool = True,
    dtype: torch.dtype = torch.float32,
    index_dtype: torch.dtype = torch.int32,
    device="cuda",
    seed: int = 0,
) -> CSR:
    """An R-MAT graph's adjacency matrix (``2**scale`` square) with ``nnz`` distinct non-zeros.

    Each edge picks one quadrant per bit of its row and column with probabilities a, b, c and
    1 - a - b - c (Graph500's 0.57, 0.19, 0.19, 0.05 by default): rows follow a power law.

    Args:
        scale: log2 of the number of rows and columns.
        nnz: distinct non-zeros (edges drawn until there are this many).
        a: probability of the top-left quadrant.
        b: top-right.
        c: bottom-left.
        permute: relabel the vertices at random (as Graph500 does), so that hubs are not all
            at the lowest indices.
        dtype: values' dtype.
        index_dtype: int32 or int64.
        device: where to build it.
        seed: the random seed.
    """
    n = 1 << scale
    if nnz > n * n:
        raise ValueError(f"tritonkit.sparse.generate.rmat: nnz {nnz} exceeds {n} x {n}")
    gen = _gen(device, seed)
    keys = torch.empty(0, dtype=torch.int64, device=device)
    draw = nnz
    for _ in range(20):
        row = torch.zeros(draw, dtype=torch.int64, device=device)
        col = torch.zeros(draw, dtype=torch.int64, device=device)
        for bit in range(scale):
            u = torch.rand(draw, generator=gen, device=device)
            right = ((u >= a) & (u < a + b)) | (u >= a + b + c)
            down = u >= a + b
            row |= down.long() << bit
            col |= right.long() << bit
        keys = torch.unique(torch.cat([keys, row * n + col]))
        if keys.numel() >= nnz:
            break
        draw = max(1024, 2 * (nnz - keys.numel()))
    if keys.numel() > nnz:  # drop a random surplus, keep the order
        pick = torch.randperm(keys.numel(), generator=gen, device=device)[:nnz]
        keys = keys[pick.sort().values]
    if permute:
        relabel = torch.randperm(n, generator=gen, device=device)
        keys = torch.sort(relabel[keys // n] * n + relabel[keys % n]).values
    return _from_keys(keys, (n, n), dtype, index_dtype, gen)


def banded(
    n: int,
    half_width: int,
    *,
    density: float = 1.0,
    dtype: torch.dtype = torch.float32,
    index_dtype: torch.dtype = torch.int32,
    device="cuda",
    seed: int = 0,
) -> CSR:
    """A square band matrix: entries ``|i - j| <= half_width``, each kept with probability
    ``density`` (the diagonal always), symmetric in pattern.

    Args:
        n: rows and columns.
        half_width: the band's half width.
        density: probability of each off-diagonal entry (mirrored, so the pattern is symmetric).
        dtype: values' dtype.
        index_dtype: int32 or int64.
        device: where to build it.
        seed: the random seed.
    """
    gen = _gen(device, seed)
    w = min(half_width, max(n - 1, 0))
    rows = torch.arange(n, device=device).unsqueeze(1)
    offs = torch.arange(1, w + 1, device=device).unsqueeze(0)
    upper = (rows + offs).expand(n, w)
    keep = upper < n
    if density < 1.0:
        keep &= torch.rand((n, w), generator=gen, device=device) < density
    r = rows.expand(n, w)[keep]
    c = upper[keep]
    diag = torch.arange(n, device=device)
    keys = torch.cat([diag * n + diag, r * n + c, c * n + r]).sort().values
    return _from_keys(keys, (n, n), dtype, index_dtype, gen)


def block(
    n_rows: int,
    n_cols: int,
    blocksize: tuple[int, int],
    block_density: float,
    *,
    dtype: torch.dtype = torch.float32,
    index_dtype: torch.dtype = torch.int32,
    device="cuda",
    seed: int = 0,
) -> BSR:
    """A BSR matrix: each block row holds ``round(block_density * block_cols)`` blocks at
    random block columns (at least one), dense normal values inside.

    Args:
        n_rows: rows (a multiple of blocksize[0]).
        n_cols: columns (a multiple of blocksize[1]).
        blocksize: (R, C), powers of 2 in 16..128.
        block_density: fraction of blocks present.
        dtype: values' dtype.
        index_dtype: int32 or int64.
        device: where to build it.
        seed: the random seed.
    """
    r, c = blocksize
    br, bc = n_rows // r, n_cols // c
    gen = _gen(device, seed)
    per_row = max(1, min(bc, round(block_density * bc))) if bc else 0
    scores = torch.rand((br, bc), generator=gen, device=device)
    cols = scores.topk(per_row, dim=1).indices.sort(dim=1).values if per_row else scores[:, :0]
    crow = torch.arange(br + 1, device=device) * per_row
    values = torch.randn((br * per_row, r, c), generator=gen, device=device).to(dtype)
    return BSR(crow.to(index_dtype), cols.reshape(-1).to(index_dtype), values, (n_rows, n_cols))


def shuffle(A: CSR, *, seed: int = 0) -> CSR:
    """``A[p][:, p]`` for a random permutation p: the same graph with scrambled labels.

    Args:
        A: square CSR matrix.
        seed: the random seed.
    """
    from tritonkit.sparse.reorder import permute

    gen = _gen(A.device, seed)
    return permute(A, torch.randperm(A.shape[0], generator=gen, device=A.device))
