"""Sparse matrix formats: CSR, COO and BSR (block CSR), validated on construction.

A matrix holds index tensors (int32 or int64, both of one dtype) and a values tensor (float32,
float16 or bfloat16). Construction checks the structure on the device and synchronizes once
(``check=False`` skips the data checks, not the metadata ones); the same pass measures the
longest row, which the kernels' load-balancing rule needs. What a kernel derives from the
structure alone (the nnz partition of a split launch, row indices, the transpose) is computed
on the device the first time it is asked for and kept on the matrix, as cuSPARSE keeps its
analysis buffer.

That analysis is kept per structure, not per object: a CSR built again from the same index
tensors (``CSR(crow, col, new_values, shape)`` in a loop, as a graph network passes new edge
weights each step) finds the analysis, and the validation verdict, of the first. It is keyed
on the index tensors' identity and checked against their data pointers, strides and version
counters (an in-place write to them is seen), held in the one plan cache (``PLANS``), and
dropped when an index tensor is collected (``derived``).
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch

from tritonkit.ops._core.plan import PLANS
from tritonkit.ops._core.validate import FLOAT_DTYPES

INDEX_DTYPES = (torch.int32, torch.int64)

# PyTorch warns once per process when a sparse compressed tensor is first made ("Sparse CSR
# tensor support is in beta state", CSC, BSR and BSC alike); a conversion tritonkit makes for
# its user is not the user's use of that beta feature.
_BETA_WARNING = r"Sparse (CSR|CSC|BSR|BSC) tensor support is in beta"


def quiet_sparse(make: Callable[..., torch.Tensor], *args: Any, **kwargs: Any) -> torch.Tensor:
    """``make(*args, **kwargs)`` (a torch sparse constructor or conversion) without PyTorch's
    "Sparse CSR (CSC, BSR, BSC) tensor support is in beta" warning; no other warning hidden."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_BETA_WARNING, category=UserWarning)
        return make(*args, **kwargs)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_shape(cls: str, shape) -> tuple[int, int]:
    if not isinstance(shape, (tuple, list, torch.Size)) or len(shape) != 2:
        raise ValueError(f"tritonkit.sparse.{cls}: shape must be (rows, cols), got {shape!r}")
    rows, cols = (int(s) for s in shape)
    if rows < 0 or cols < 0:
        raise ValueError(f"tritonkit.sparse.{cls}: shape must be non-negative, got {shape!r}")
    return rows, cols


def _check_indices(cls: str, **tensors: torch.Tensor) -> torch.dtype:
    dtype = None
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"tritonkit.sparse.{cls}: {name} must be a torch.Tensor, got {type(t).__name__}"
            )
        if t.dtype not in INDEX_DTYPES:
            raise TypeError(
                f"tritonkit.sparse.{cls}: {name} must have dtype int32 or int64, "
                f"got {_name(t.dtype)}"
            )
        if t.dim() != 1:
            raise ValueError(
                f"tritonkit.sparse.{cls}: {name} must be 1-D, got shape {tuple(t.shape)}"
            )
        if dtype is None:
            dtype, first = t.dtype, name
        elif t.dtype != dtype:
            raise TypeError(
                f"tritonkit.sparse.{cls}: {name} must have the dtype of {first} "
                f"({_name(dtype)}), got {_name(t.dtype)}"
            )
    return dtype


def _check_values(cls: str, values: torch.Tensor, dim: int, device: torch.device) -> None:
    if not isinstance(values, torch.Tensor):
        raise TypeError(
            f"tritonkit.sparse.{cls}: values must be a torch.Tensor, got {type(values).__name__}"
        )
    if values.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"tritonkit.sparse.{cls}: values must have dtype float32, float16 or bfloat16, "
            f"got {_name(values.dtype)}"
        )
    if values.dim() != dim:
        raise ValueError(
            f"tritonkit.sparse.{cls}: values must be {dim}-D, got shape {tuple(values.shape)}"
        )
    if values.device != device:
        raise ValueError(
            f"tritonkit.sparse.{cls}: values must be on the indices' device ({device}), "
            f"got {values.device}"
        )


def _tracing() -> bool:
    return torch.compiler.is_compiling()


def fingerprint(t: torch.Tensor) -> tuple:
    """What says that a tensor still holds what it held, without reading it: its memory, its
    layout and its version counter (bumped by every in-place write, through views too)."""
    return (t.data_ptr(), t._version, tuple(t.shape), t.stride(), t.dtype, t.device)


class _Derived:
    """An entry of ``derived``: the owners' fingerprint and what was built from them; ``data``
    is dropped when an owner is collected (and the entry leaves the plan cache)."""

    __slots__ = ("__weakref__", "data", "fingerprint")

    def __init__(self, fingerprint: tuple, data: Any) -> None:
        self.fingerprint, self.data = fingerprint, data

    def drop(self) -> None:
        self.data = None


def _forget(key: tuple, entry: _Derived) -> None:
    """An owner of ``entry`` was collected: its data goes, and its key with it."""
    entry.drop()
    if PLANS.peek(key, None) is entry:
        PLANS.discard(key, None)


def derived(what: str, owners: tuple, state: Callable[[], tuple], build: Callable[[], Any]) -> Any:
    """``build()``'s result for these owner objects as ``state()`` (their fingerprints) says
    they are now, from the plan cache: built once per owner and content, weakly held.

    The key is the owners' identity; their state is compared on every lookup (a changed owner
    is built again, never served stale), and the entry is dropped when any owner is collected
    (``weakref.finalize``), so it lives no longer than they do. ``build()`` must not keep a
    reference to an owner itself (an alias such as ``t.detach()`` is fine), or it would keep
    the owner alive. While torch.compile traces, nothing is read or kept: the trace builds.
    """
    if _tracing():
        return build()
    fp = state()
    key = ("sparse." + what, *map(id, owners))
    entry = PLANS.peek(key, None)
    if entry is not None:
        if entry.data is not None and entry.fingerprint == fp:
            return entry.data
        entry.drop()
    data = build()
    entry = _Derived(fp, data)
    for owner in owners:
        weakref.finalize(owner, _forget, key, entry)
    PLANS.put(key, None, entry)
    return data


def _no_values(nnz: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Stand-in values of a structure kept for its analysis: no memory (stride 0); every
    product replaces them (``with_values``)."""
    return torch.zeros((), dtype=dtype, device=device).expand(nnz)


def _alias(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor with t's data that is not t itself (``derived`` must not hold its
    owners)."""
    return t.contiguous().detach()


def _check_compressed(
    cls: str, crow: torch.Tensor, col: torch.Tensor, n_rows: int, n_cols: int, what: str
) -> int:
    """Check a compressed structure on the device (one synchronization) and return its longest
    row: crow starts at 0, ends at nnz and never decreases; columns are in [0, n_cols) and
    sorted within each row (repeats allowed: they add up)."""
    nnz = col.numel()
    if crow.numel() != n_rows + 1:
        raise ValueError(
            f"tritonkit.sparse.{cls}: crow_indices must have {n_rows + 1} entries "
            f"({what} + 1), got {crow.numel()}"
        )
    if _tracing() or crow.device.type == "meta":
        return -1
    lengths = crow[1:] - crow[:-1]
    flags = torch.zeros(6, dtype=torch.int64, device=crow.device)
    flags[0] = crow[0]
    flags[1] = crow[-1]
    if n_rows:
        flags[2] = (lengths < 0).sum()
        flags[3] = lengths.max()
    if nnz:
        flags[4] = ((col < 0) | (col >= n_cols)).sum()
        if nnz > 1:
            # A column may drop only where a new row starts.
            starts = torch.zeros(nnz + 1, dtype=torch.bool, device=col.device)
            starts[crow.clamp(0, nnz).long()] = True
            flags[5] = ((col[1:] < col[:-1]) & ~starts[1:nnz]).sum()
    first, last, decreasing, longest, out_of_range, unsorted = flags.tolist()
    if first != 0 or last != nnz:
        raise ValueError(
            f"tritonkit.sparse.{cls}: crow_indices must start at 0 and end at nnz = {nnz}, "
            f"got {first} and {last}"
        )
    if decreasing:
        row = int(torch.nonzero(lengths < 0)[0])
        raise ValueError(
            f"tritonkit.sparse.{cls}: crow_indices must not decrease; it does after {what} {row}"
        )
    if out_of_range:
        pos = int(torch.nonzero((col < 0) | (col >= n_cols))[0])
        raise ValueError(
            f"tritonkit.sparse.{cls}: col_indices must lie in [0, {n_cols}), "
            f"got {int(col[pos])} at position {pos}"
        )
    if unsorted:
        pos = int(torch.nonzero((col[1:] < col[:-1]) & ~starts[1:nnz])[0]) + 1
        row = int(torch.searchsorted(crow, torch.tensor(pos, device=crow.device), right=True)) - 1
        raise ValueError(
            f"tritonkit.sparse.{cls}: col_indices must be sorted within each {what}; "
            f"{what} {row} is not (position {pos}: {int(col[pos - 1])} then {int(col[pos])})"
        )
    return longest


class _Stored:
    """What the formats share: the tensors that store the matrix (``_STORED``, by attribute
    name), their dtype and device, and the bytes they hold."""

    _STORED: tuple[str, ...] = ()

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    @property
    def device(self) -> torch.device:
        return self.values.device

    def memory_usage(self) -> int:
        """Bytes held by the index and value tensors (not the cached analysis)."""
        return sum(getattr(self, name).nbytes for name in self._STORED)


class CSR(_Stored):
    """A sparse matrix in compressed sparse row form.

    Args:
        crow_indices: ``(rows + 1,)`` int32 or int64: row ``i``'s non-zeros are at
            ``crow_indices[i]:crow_indices[i + 1]``.
        col_indices: ``(nnz,)`` column of each non-zero, sorted within each row, same dtype.
        values: ``(nnz,)`` float32, float16 or bfloat16.
        shape: ``(rows, cols)``.
        check: check the data (one synchronization, the first time these index tensors are
            seen with this content); metadata is always checked.
    """

    _STORED = ("crow_indices", "col_indices", "values")

    def __init__(self, crow_indices, col_indices, values, shape, *, check: bool = True):
        self._setup(crow_indices, col_indices, values, shape)
        self.crow_indices, self.col_indices, self._cache = derived(
            "csr",
            (crow_indices, col_indices),
            lambda: (fingerprint(crow_indices), fingerprint(col_indices), self.shape),
            lambda: (_alias(crow_indices), _alias(col_indices), {}),
        )
        if check:
            self._check()

    @classmethod
    def _structure(cls, crow: torch.Tensor, col: torch.Tensor, shape, dtype, *, check=True):
        """A CSR of this structure with stand-in values (``_no_values``) and an analysis of
        its own: what a conversion keeps; the products take it ``with_values``."""
        out = cls.__new__(cls)
        out._setup(crow, col, _no_values(col.numel(), dtype, crow.device), shape)
        out.crow_indices, out.col_indices, out._cache = crow.contiguous(), col.contiguous(), {}
        if check:
            out._check()
        return out

    def _setup(self, crow_indices, col_indices, values, shape) -> None:
        """The metadata checks, the shape, the values."""
        self.shape = _check_shape("CSR", shape)
        self.index_dtype = _check_indices("CSR", crow_indices=crow_indices, col_indices=col_indices)
        device = crow_indices.device
        if col_indices.device != device:
            raise ValueError(
                "tritonkit.sparse.CSR: col_indices must be on crow_indices' device "
                f"({device}), got {col_indices.device}"
            )
        _check_values("CSR", values, 1, device)
        if values.shape[0] != col_indices.numel():
            raise ValueError(
                f"tritonkit.sparse.CSR: values must have nnz = {col_indices.numel()} entries "
                f"(one per column index), got {values.shape[0]}"
            )
        if crow_indices.numel() != self.shape[0] + 1:
            raise ValueError(
                f"tritonkit.sparse.CSR: crow_indices must have {self.shape[0] + 1} entries "
                f"(row + 1), got {crow_indices.numel()}"
            )
        self.values = values
        # Python values, read as constants where torch.compile traces a call.
        self._nnz, self._device = int(col_indices.numel()), device

    def _check(self) -> None:
        """The data checks (one synchronization), once per structure: they measure the
        longest row too."""
        if self._cache.get("checked"):
            return
        longest = _check_compressed(
            "CSR", self.crow_indices, self.col_indices, *self.shape, what="row"
        )
        if longest >= 0:  # measured (not while tracing)
            self._cache["max_row"] = longest
            self._cache["checked"] = True

    # ---- properties ----
    @property
    def nnz(self) -> int:
        return self._nnz

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def max_row_length(self) -> int:
        """Non-zeros in the longest row (measured by the validation, or now: one sync; kept
        with the structure)."""
        longest = self._cache.get("max_row")
        if longest is None:
            if self.shape[0] == 0:
                longest = 0
            else:
                longest = int((self.crow_indices[1:] - self.crow_indices[:-1]).max())
            if not _tracing():
                self._cache["max_row"] = longest
        return longest

    def __repr__(self) -> str:
        return (
            f"CSR(shape={self.shape}, nnz={self.nnz}, dtype={_name(self.dtype)}, "
            f"index_dtype={_name(self.index_dtype)}, device={self.device})"
        )

    def with_values(self, values: torch.Tensor) -> CSR:
        """The same structure (and its cached analysis) with other values."""
        _check_values("CSR", values, 1, self._device)
        if values.shape[0] != self._nnz:
            raise ValueError(
                f"tritonkit.sparse.CSR: values must have nnz = {self.nnz} entries, "
                f"got {values.shape[0]}"
            )
        return self._with(values)

    def _with(self, values: torch.Tensor) -> CSR:
        out = CSR.__new__(CSR)
        out.shape, out.index_dtype = self.shape, self.index_dtype
        out.crow_indices, out.col_indices, out.values = self.crow_indices, self.col_indices, values
        out._cache, out._nnz, out._device = self._cache, self._nnz, self._device
        return out

    # ---- analysis kept on the matrix ----
    def row_indices(self) -> torch.Tensor:
        """The row of each non-zero (COO rows), in the index dtype; computed once."""
        rows = self._cache.get("rows")
        if rows is None:
            n = self.shape[0]
            counts = self.crow_indices[1:] - self.crow_indices[:-1]
            rows = torch.repeat_interleave(
                torch.arange(n, device=self.device, dtype=self.index_dtype),
                counts,
                output_size=self.nnz,
            )
            if not _tracing():
                self._cache["rows"] = rows
        return rows

    def partition(self, chunk: int) -> torch.Tensor:
        """``bounds`` of a split launch with ``chunk`` non-zeros per program: program ``p``
        owns the rows starting in its chunk, ``bounds[p]:bounds[p + 1]``; the row before
        ``bounds[p]`` is the one whose tail it carries. A device search over the row pointers,
        computed once per chunk size."""
        key = ("partition", chunk)
        bounds = self._cache.get(key)
        if bounds is None:
            n_rows, nnz = self.shape[0], self.nnz
            programs = max(1, -(-nnz // chunk))
            starts = torch.arange(programs + 1, device=self.device, dtype=torch.int64) * chunk
            bounds = torch.searchsorted(self.crow_indices[:n_rows].long(), starts)
            bounds[-1] = n_rows
            bounds = bounds.to(torch.int32 if n_rows < 2**31 else torch.int64)
            if not _tracing():
                self._cache[key] = bounds
        return bounds

    def transpose_structure(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """(crow, col, perm, longest row) of the transpose: its values are ``values[perm]``.
        A stable sort of the columns on the device, computed once (one sync for the longest
        row)."""
        t = self._cache.get("transpose")
        if t is None:
            n_cols = self.shape[1]
            col = self.col_indices.long()
            perm = torch.sort(col, stable=True).indices
            counts = torch.bincount(col, minlength=n_cols)
            crow = torch.zeros(n_cols + 1, dtype=torch.int64, device=self.device)
            torch.cumsum(counts, 0, out=crow[1:])
            longest = int(counts.max()) if n_cols and self.nnz else 0
            t = (
                crow.to(self.index_dtype),
                self.row_indices()[perm],
                perm.to(self.index_dtype),
                longest,
            )
            if not _tracing():
                self._cache["transpose"] = t
        return t

    def transposed_structure(self) -> tuple[CSR, torch.Tensor]:
        """The transpose's structure as a CSR (stand-in values; its own analysis, kept with
        this structure) and the permutation (int64) that gathers its values from these."""
        base = self._cache.get("t")
        if base is None:
            crow, col, perm, longest = self.transpose_structure()
            struct = CSR._structure(
                crow, col, (self.shape[1], self.shape[0]), self.dtype, check=False
            )
            struct._cache["max_row"] = longest
            base = (struct, perm.long())
            if not _tracing():
                self._cache["t"] = base
        return base

    def t(self) -> CSR:
        """The transpose as a CSR matrix (values gathered: differentiable)."""
        struct, perm = self.transposed_structure()
        return struct._with(self.values[perm])

    # ---- conversions ----
    @classmethod
    def from_torch(cls, t: torch.Tensor, *, check: bool = True) -> CSR:
        """From a torch sparse CSR, COO or BSR tensor, or a dense 2-D tensor."""
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tritonkit.sparse.CSR.from_torch: expected a tensor, got {type(t)}")
        if t.dim() != 2:
            raise ValueError(
                f"tritonkit.sparse.CSR.from_torch: expected a 2-D tensor, got {t.dim()}-D"
            )
        if t.layout != torch.sparse_csr:
            if t.layout in (torch.sparse_bsr, torch.sparse_bsc):
                t = t.to_dense()
            t = quiet_sparse(t.to_sparse_csr)
        return cls(t.crow_indices(), t.col_indices(), t.values(), tuple(t.shape), check=check)

    @classmethod
    def from_dense(cls, d: torch.Tensor, index_dtype: torch.dtype = torch.int64) -> CSR:
        """The non-zeros of a dense 2-D tensor."""
        t = quiet_sparse(d.to_sparse_csr)
        return cls(
            t.crow_indices().to(index_dtype),
            t.col_indices().to(index_dtype),
            t.values(),
            tuple(d.shape),
        )

    @classmethod
    def from_scipy(cls, m, *, device=None, dtype: torch.dtype | None = None) -> CSR:
        """From any scipy.sparse matrix or array (converted to CSR and sorted first)."""
        m = m.tocsr()
        m.sort_indices()
        crow = torch.from_numpy(m.indptr.copy())
        col = torch.from_numpy(m.indices.copy()).to(crow.dtype)
        values = torch.from_numpy(m.data.copy())
        values = values.to(dtype or (values.dtype if values.dtype in FLOAT_DTYPES else None))
        if values.dtype not in FLOAT_DTYPES:
            values = values.float()
        return cls(crow.to(device), col.to(device), values.to(device), m.shape)

    def to_torch(self) -> torch.Tensor:
        """A ``torch.sparse_csr_tensor`` sharing these tensors."""
        return quiet_sparse(
            torch.sparse_csr_tensor,
            self.crow_indices,
            self.col_indices,
            self.values,
            self.shape,
            check_invariants=False,
        )

    def to_scipy(self):
        """A ``scipy.sparse.csr_matrix`` (on the host; 16-bit values as float32)."""
        import scipy.sparse

        values = self.values.detach().cpu()
        if values.dtype != torch.float16:
            values = values.float()
        return scipy.sparse.csr_matrix(
            (values.numpy(), self.col_indices.cpu().numpy(), self.crow_indices.cpu().numpy()),
            shape=self.shape,
        )

    def to_dense(self) -> torch.Tensor:
        out = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
        out.index_put_((self.row_indices().long(), self.col_indices.long()), self.values, True)
        return out

    def to_coo(self) -> COO:
        return COO(self.row_indices(), self.col_indices, self.values, self.shape, check=False)

    def to_bsr(self, blocksize: tuple[int, int]) -> BSR:
        """The blocks of ``blocksize`` that hold a non-zero (through a dense copy)."""
        return BSR.from_torch(self.to_dense(), blocksize)


class COO(_Stored):
    """A sparse matrix as (row, column, value) triples sorted by row, then column.

    Args:
        row_indices: ``(nnz,)`` int32 or int64.
        col_indices: ``(nnz,)`` same dtype.
        values: ``(nnz,)`` float32, float16 or bfloat16.
        shape: ``(rows, cols)``.
        check: check the data (one synchronization).
    """

    _STORED = ("row_indices", "col_indices", "values")

    def __init__(self, row_indices, col_indices, values, shape, *, check: bool = True):
        self.shape = _check_shape("COO", shape)
        self.index_dtype = _check_indices("COO", row_indices=row_indices, col_indices=col_indices)
        if row_indices.numel() != col_indices.numel():
            raise ValueError(
                f"tritonkit.sparse.COO: row_indices and col_indices must have one length, got "
                f"{row_indices.numel()} and {col_indices.numel()}"
            )
        _check_values("COO", values, 1, row_indices.device)
        if values.shape[0] != row_indices.numel():
            raise ValueError(
                f"tritonkit.sparse.COO: values must have nnz = {row_indices.numel()} entries, "
                f"got {values.shape[0]}"
            )
        self.row_indices = row_indices.contiguous()
        self.col_indices = col_indices.contiguous()
        self.values = values
        self._cache: dict = {}  # the CSR structure (to_csr)
        if check and not _tracing() and row_indices.numel():
            rows, cols = self.shape
            r, c = self.row_indices, self.col_indices
            bad = torch.stack(
                [
                    ((r < 0) | (r >= rows)).sum(),
                    ((c < 0) | (c >= cols)).sum(),
                    ((r[1:] < r[:-1]) | ((r[1:] == r[:-1]) & (c[1:] < c[:-1]))).sum(),
                ]
            ).tolist()
            if bad[0]:
                raise ValueError(f"tritonkit.sparse.COO: row_indices must lie in [0, {rows})")
            if bad[1]:
                raise ValueError(f"tritonkit.sparse.COO: col_indices must lie in [0, {cols})")
            if bad[2]:
                raise ValueError(
                    "tritonkit.sparse.COO: indices must be sorted by row, then column "
                    "(torch: .coalesce(); scipy: .tocsr().tocoo())"
                )

    @property
    def nnz(self) -> int:
        return self.values.shape[0]

    def __repr__(self) -> str:
        return f"COO(shape={self.shape}, nnz={self.nnz}, dtype={_name(self.dtype)})"

    def to_csr(self) -> CSR:
        """The same matrix in CSR, sharing the values (the row pointers: a bincount and a
        cumsum on the device, and the CSR's checks, done once and kept on this matrix)."""
        struct = self._cache.get("csr")
        if struct is None:
            crow = torch.zeros(self.shape[0] + 1, dtype=self.index_dtype, device=self.device)
            counts = torch.bincount(self.row_indices.long(), minlength=self.shape[0])
            torch.cumsum(counts, 0, out=crow[1:])
            struct = CSR._structure(crow, self.col_indices, self.shape, self.dtype)
            if not _tracing():
                self._cache["csr"] = struct
        return struct.with_values(self.values)

    @classmethod
    def from_torch(cls, t: torch.Tensor) -> COO:
        """From a torch sparse COO tensor (coalesced here) or any other 2-D layout."""
        if t.layout != torch.sparse_coo:
            t = t.to_dense().to_sparse() if t.layout != torch.strided else t.to_sparse()
        t = t.coalesce()
        idx = t.indices()
        return cls(idx[0], idx[1], t.values(), tuple(t.shape))

    def to_torch(self) -> torch.Tensor:
        """A coalesced ``torch.sparse_coo_tensor`` (int64 indices, the values shared)."""
        idx = torch.stack([self.row_indices, self.col_indices]).long()
        return torch.sparse_coo_tensor(
            idx, self.values, self.shape, is_coalesced=True, check_invariants=False
        )

    @classmethod
    def from_scipy(cls, m, *, device=None, dtype: torch.dtype | None = None) -> COO:
        return CSR.from_scipy(m, device=device, dtype=dtype).to_coo()

    def to_scipy(self):
        return self.to_csr().to_scipy().tocoo()

    def to_dense(self) -> torch.Tensor:
        return self.to_csr().to_dense()


class BSR(_Stored):
    """A block-sparse matrix (block CSR): dense ``R x C`` blocks, ``R`` and ``C`` powers of 2
    in 16..128.

    Args:
        crow_indices: ``(rows / R + 1,)`` int32 or int64 block-row pointers.
        col_indices: ``(nnz_blocks,)`` block column of each block, sorted within a block row.
        values: ``(nnz_blocks, R, C)`` float32, float16 or bfloat16.
        shape: ``(rows, cols)``, multiples of ``R`` and ``C``.
        check: check the data (one synchronization).
    """

    _STORED = ("crow_indices", "col_indices", "values")

    def __init__(
        self, crow_indices, col_indices, values, shape, *, check: bool = True, _keep_values=False
    ):
        self.shape = _check_shape("BSR", shape)
        self.index_dtype = _check_indices("BSR", crow_indices=crow_indices, col_indices=col_indices)
        _check_values("BSR", values, 3, crow_indices.device)
        r, c = values.shape[1], values.shape[2]
        for name, b in (("rows", r), ("cols", c)):
            if b < 16 or b > 128 or b & (b - 1):
                raise ValueError(
                    f"tritonkit.sparse.BSR: block {name} must be a power of 2 in 16..128, got {b}"
                )
        if self.shape[0] % r or self.shape[1] % c:
            raise ValueError(
                f"tritonkit.sparse.BSR: shape {self.shape} must be a multiple of the block "
                f"({r}, {c})"
            )
        if values.shape[0] != col_indices.numel():
            raise ValueError(
                f"tritonkit.sparse.BSR: values must have one block per column index "
                f"({col_indices.numel()}), got {values.shape[0]}"
            )
        self.blocksize = (r, c)
        self.crow_indices = crow_indices.contiguous()
        self.col_indices = col_indices.contiguous()
        self.values = values if _keep_values else values.contiguous()
        self._cache: dict = {}  # the element-wise CSR structure (expanded)
        n_brows, n_bcols = self.shape[0] // r, self.shape[1] // c
        if check:
            _check_compressed(
                "BSR", self.crow_indices, self.col_indices, n_brows, n_bcols, "block row"
            )
        elif self.crow_indices.numel() != n_brows + 1:
            raise ValueError(
                f"tritonkit.sparse.BSR: crow_indices must have {n_brows + 1} entries, "
                f"got {self.crow_indices.numel()}"
            )

    @property
    def nnz_blocks(self) -> int:
        return self.col_indices.numel()

    def __repr__(self) -> str:
        return (
            f"BSR(shape={self.shape}, blocksize={self.blocksize}, nnz_blocks={self.nnz_blocks}, "
            f"dtype={_name(self.dtype)})"
        )

    @classmethod
    def _structure(cls, crow: torch.Tensor, col: torch.Tensor, blocksize, shape, dtype) -> BSR:
        """A BSR of this block structure (checked) with stand-in values (stride 0, no memory):
        what a conversion keeps; the products take it ``with_values``."""
        stand_in = torch.zeros((), dtype=dtype, device=crow.device)
        return cls(crow, col, stand_in.expand(col.numel(), *blocksize), shape, _keep_values=True)

    def with_values(self, values: torch.Tensor) -> BSR:
        """The same block structure (and its kept analysis) with other blocks' values."""
        _check_values("BSR", values, 3, self.crow_indices.device)
        if tuple(values.shape) != (self.nnz_blocks, *self.blocksize):
            raise ValueError(
                f"tritonkit.sparse.BSR: values must have shape "
                f"{(self.nnz_blocks, *self.blocksize)}, got {tuple(values.shape)}"
            )
        out = BSR.__new__(BSR)
        out.__dict__.update(self.__dict__)
        out.values = values.contiguous()
        return out

    def expanded(self) -> tuple[CSR, torch.Tensor]:
        """The element-wise CSR structure of these blocks (every stored element a non-zero,
        explicit zeros included; stand-in values) and the permutation (int64) that gathers its
        values from ``values.reshape(-1)``: computed on the device once and kept."""
        out = self._cache.get("csr")
        if out is None:
            n_brows = self.shape[0] // self.blocksize[0]
            counts = self.crow_indices[1:] - self.crow_indices[:-1]
            brow = torch.repeat_interleave(
                torch.arange(n_brows, device=self.device), counts, output_size=self.nnz_blocks
            )
            out = element_structure(
                brow,
                self.col_indices.long(),
                self.blocksize,
                False,
                self.shape,
                self.index_dtype,
                self.dtype,
            )
            if not _tracing():
                self._cache["csr"] = out
        return out

    def to_csr(self) -> CSR:
        """The same matrix in CSR, every stored element a non-zero (explicit zeros of a block
        included, as scipy's ``tocsr``); the values gathered (differentiable)."""
        struct, perm = self.expanded()
        return struct._with(self.values.reshape(-1)[perm])

    @classmethod
    def from_torch(cls, t: torch.Tensor, blocksize: tuple[int, int] | None = None) -> BSR:
        """From a torch sparse BSR tensor, or any 2-D tensor with ``blocksize``."""
        if t.layout != torch.sparse_bsr:
            if blocksize is None:
                raise ValueError("tritonkit.sparse.BSR.from_torch: blocksize is required")
            dense = t if t.layout == torch.strided else t.to_dense()
            t = quiet_sparse(dense.to_sparse_bsr, tuple(blocksize))
        return cls(t.crow_indices(), t.col_indices(), t.values(), tuple(t.shape))

    def to_torch(self) -> torch.Tensor:
        """A ``torch.sparse_bsr_tensor`` sharing these tensors."""
        return quiet_sparse(
            torch.sparse_bsr_tensor,
            self.crow_indices,
            self.col_indices,
            self.values,
            self.shape,
            check_invariants=False,
        )

    @classmethod
    def from_scipy(cls, m, *, device=None, dtype: torch.dtype | None = None) -> BSR:
        """From a scipy.sparse BSR matrix (its blocksize) or any other (converted first)."""
        m = m.tobsr() if m.format != "bsr" else m
        m.sort_indices()
        values = torch.from_numpy(m.data.copy()).to(dtype or torch.float32)
        crow = torch.from_numpy(m.indptr.copy())
        col = torch.from_numpy(m.indices.copy()).to(crow.dtype)
        return cls(crow.to(device), col.to(device), values.to(device), m.shape)

    def to_scipy(self):
        import scipy.sparse

        return scipy.sparse.bsr_matrix(
            (
                self.values.detach().float().cpu().numpy(),
                self.col_indices.cpu().numpy(),
                self.crow_indices.cpu().numpy(),
            ),
            shape=self.shape,
        )

    def to_dense(self) -> torch.Tensor:
        return self.to_torch().to_dense()


def element_structure(
    rows: torch.Tensor,
    cols: torch.Tensor,
    blocksize: tuple[int, int],
    is_sorted: bool,
    shape: tuple[int, int],
    index_dtype: torch.dtype,
    dtype: torch.dtype,
) -> tuple[CSR, torch.Tensor | None]:
    """The CSR structure of stored entries given in storage order, and the permutation (int64,
    or None where storage order is already row-major) that gathers CSR-ordered values from
    the stored ones (flattened).

    Args:
        rows: (n,) row of each stored entry, or block row of each stored block.
        cols: (n,) column, or block column, of each.
        blocksize: (R, C) of the blocks, (1, 1) for entries.
        is_sorted: entries already sorted by row, then column (a CSR, a coalesced COO).
        shape: the matrix's (rows, cols).
        index_dtype: the index dtype of the result.
        dtype: the values' dtype (of the stand-in values).
    """
    r, c = blocksize
    device = rows.device
    if (r, c) != (1, 1):  # each block's R x C entries, in the blocks' row-major storage order
        i = torch.arange(r, device=device).view(1, r, 1)
        j = torch.arange(c, device=device).view(1, 1, c)
        rows = (rows.view(-1, 1, 1) * r + i).expand(-1, r, c).reshape(-1)
        cols = (cols.view(-1, 1, 1) * c + j).expand(-1, r, c).reshape(-1)
    rows, cols = rows.long(), cols.long()
    perm = None
    if not is_sorted:
        perm = torch.sort(rows * max(shape[1], 1) + cols, stable=True).indices
        rows, cols = rows[perm], cols[perm]
    crow = torch.zeros(shape[0] + 1, dtype=torch.int64, device=device)
    torch.cumsum(torch.bincount(rows, minlength=shape[0]), 0, out=crow[1:])
    struct = CSR._structure(crow.to(index_dtype), cols.to(index_dtype), shape, dtype)
    return struct, perm
