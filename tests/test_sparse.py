"""Sparse family: formats (validation, conversions, memory), SpMV / SpMM on both load-balancing
paths, SDDMM, BSR x dense, autograd, torch.compile, RCM against scipy, generators."""

import contextlib
import gc
import warnings

import numpy as np
import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import tritonkit.sparse as sp
from tritonkit.harness.spec import Unavailable, get_spec
from tritonkit.ops._core.plan import PLANS
from tritonkit.ops.sparse import ROWS, SPLIT, SpmmConfig, SpmvConfig, formats, operand, strategy
from tritonkit.ops.sparse.formats import quiet_sparse
from tritonkit.ops.sparse.spmm import spmm_fwd
from tritonkit.ops.sparse.spmv import spmv_fwd

from _checks import assert_spec_passes, compile_backend

scipy_sparse = pytest.importorskip("scipy.sparse")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# fp32 accumulation, one rounding to the output dtype (plus the rounding of products' inputs).
TOL = {torch.float32: (1e-4, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (2e-2, 1e-2)}


def _dense(a: sp.CSR) -> torch.Tensor:
    return a.to_dense().double()


def _close(out, ref, dtype):
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=rtol)


def _skewed(device, dtype=torch.float32, index_dtype=torch.int64, seed=0):
    """Pareto rows plus a few empty rows at the start, in the middle and at the end."""
    a = sp.generate.powerlaw(
        150, 90, 5, dtype=dtype, index_dtype=index_dtype, device=device, seed=seed
    )
    d = a.to_dense()
    d[:3] = 0
    d[70:75] = 0
    d[-4:] = 0
    d[40] = torch.randn(90, device=device).to(dtype)  # a full row
    return sp.CSR.from_dense(d, index_dtype)


# ---- formats ---------------------------------------------------------------------------------


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", DTYPES)
def test_conversions_round_trip(index_dtype, dtype, device):
    a = sp.generate.uniform(23, 17, 4, dtype=dtype, index_dtype=index_dtype, device=device)
    d = a.to_dense()
    assert a.index_dtype == index_dtype and a.dtype == dtype
    assert torch.equal(sp.CSR.from_torch(a.to_torch()).to_dense(), d)
    assert torch.equal(a.to_coo().to_csr().to_dense(), d)
    assert torch.equal(sp.COO.from_torch(a.to_torch().to_sparse_coo()).to_dense(), d)
    if dtype != torch.bfloat16:  # scipy has no bfloat16
        back = sp.CSR.from_scipy(a.to_scipy(), device=device, dtype=dtype)
        assert torch.equal(back.to_dense(), d)
    bsr = sp.BSR.from_torch(torch.randn(32, 48, device=device).to(dtype), (16, 16))
    assert (
        torch.equal(
            sp.BSR.from_scipy(bsr.to_scipy(), dtype=dtype, device=device).to_dense(), bsr.to_dense()
        )
        or dtype == torch.bfloat16
    )
    assert torch.equal(bsr.to_csr().to_dense(), bsr.to_dense())


def test_memory_usage_counts_indices_and_values(device):
    a = sp.generate.uniform(10, 10, 3, index_dtype=torch.int32, device=device)
    assert a.memory_usage() == 11 * 4 + a.nnz * (4 + 4)
    c = a.to_coo()
    assert c.memory_usage() == a.nnz * (4 + 4 + 4)
    b = sp.generate.block(64, 64, (16, 32), 0.5, dtype=torch.float16, device=device)
    assert b.memory_usage() == 5 * 4 + b.nnz_blocks * (4 + 16 * 32 * 2)


def test_empty_matrices(device):
    for shape in [(0, 0), (0, 5), (5, 0), (4, 6)]:
        crow = torch.zeros(shape[0] + 1, dtype=torch.int32, device=device)
        empty_i = torch.zeros(0, dtype=torch.int32, device=device)
        a = sp.CSR(crow, empty_i, torch.zeros(0, device=device), shape)
        x = torch.randn(shape[1], device=device)
        assert torch.equal(sp.spmv(a, x), torch.zeros(shape[0], device=device))
        b = torch.randn(shape[1], 3, device=device)
        assert torch.equal(sp.spmm(a, b), torch.zeros(shape[0], 3, device=device))


def _crow(values, device):
    return torch.tensor(values, dtype=torch.int64, device=device)


@pytest.mark.parametrize(
    "crow, col, shape, match",
    [
        ([0, 2, 3], [1, 0, 2], (2, 3), r"sorted within each row; row 0 is not"),
        ([0, 2, 3], [0, 3, 1], (2, 3), r"col_indices must lie in \[0, 3\), got 3 at position 1"),
        ([0, 2, 3], [0, -1, 1], (2, 3), r"must lie in \[0, 3\), got -1"),
        ([0, 2, 1, 3], [0, 1, 2], (3, 3), r"must not decrease"),
        ([1, 2, 3], [0, 1, 2], (2, 3), r"start at 0 and end at nnz = 3, got 1 and 3"),
        ([0, 2], [0, 1], (2, 3), r"crow_indices must have 3 entries"),
    ],
)
def test_malformed_csr_raises(crow, col, shape, match, device):
    col_t = _crow(col, device)
    with pytest.raises(ValueError, match=match):
        sp.CSR(_crow(crow, device), col_t, torch.randn(len(col), device=device), shape)


def test_bad_metadata_raises(device):
    crow, col = _crow([0, 1], device), _crow([0], device)
    with pytest.raises(TypeError, match=r"values must have dtype float32, float16 or bfloat16"):
        sp.CSR(crow, col, torch.ones(1, dtype=torch.int64, device=device), (1, 1))
    with pytest.raises(TypeError, match=r"col_indices must have the dtype of crow_indices"):
        sp.CSR(crow, col.int(), torch.ones(1, device=device), (1, 1))
    with pytest.raises(TypeError, match=r"crow_indices must have dtype int32 or int64"):
        sp.CSR(crow.float(), col, torch.ones(1, device=device), (1, 1))
    with pytest.raises(ValueError, match=r"values must have nnz = 1 entries"):
        sp.CSR(crow, col, torch.ones(2, device=device), (1, 1))
    with pytest.raises(ValueError, match=r"sorted by row, then column"):
        sp.COO(_crow([1, 0], device), _crow([0, 0], device), torch.ones(2, device=device), (2, 2))
    with pytest.raises(ValueError, match=r"block rows must be a power of 2 in 16..128, got 8"):
        sp.BSR(crow, col, torch.ones(1, 8, 8, device=device), (8, 8))


def test_mismatched_operands_raise(device):
    a = sp.generate.uniform(6, 5, 2, device=device)
    with pytest.raises(ValueError, match=r"x must have shape \(K,\) = \(5,\), got \(4,\)"):
        sp.spmv(a, torch.randn(4, device=device))
    with pytest.raises(TypeError, match=r"x must have the same dtype as A.values"):
        sp.spmv(a, torch.randn(5, device=device, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"B must have shape \(K, N\) = \(5, 3\), got \(6, 3\)"):
        sp.spmm(a, torch.randn(6, 3, device=device))
    with pytest.raises(ValueError, match=r"mat1 \(M, K\) @ mat2 \(K, N\) must match"):
        sp.sddmm(a, torch.randn(6, 3, device=device), torch.randn(3, 4, device=device))
    with pytest.raises(TypeError, match=r"A must be a tritonkit.sparse CSR, COO or BSR"):
        sp.spmv(torch.randn(6, 5, device=device), torch.randn(5, device=device))


# ---- kernels ---------------------------------------------------------------------------------


def test_strategy_rule():
    assert strategy(1000, 50_000, 60, 64) == ROWS  # even rows
    assert strategy(1000, 50_000, 5000, 64) == SPLIT  # one row 100x the mean
    assert strategy(1000, 2000, 100, 64) == ROWS  # skewed, but the longest row is short


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["uniform", "skewed"])
def test_spmv_matches_dense(kind, dtype, device):
    if kind == "uniform":
        a = sp.generate.uniform(129, 77, 9, dtype=dtype, device=device, seed=3)
    else:
        a = _skewed(device, dtype)
    x = torch.randn(a.shape[1], device=device).to(dtype)
    _close(sp.spmv(a, x), _dense(a) @ x.double(), dtype)


@pytest.mark.parametrize(
    "config",
    [SpmvConfig(4, 8, 0, 4), SpmvConfig(1, 4, 0, 1)]
    + [SpmvConfig(1, t, c, 4) for t in (4, 32) for c in (3, 16, 40, 1000)],
    ids=str,
)
def test_spmv_every_path_and_chunk(config, device):
    a = _skewed(device, index_dtype=torch.int32, seed=5)
    x = torch.randn(a.shape[1] * 2, device=device)[::2]  # strided x
    bounds = a.partition(config.chunk) if config.strategy == SPLIT else a.crow_indices[:0]
    y = spmv_fwd(a.crow_indices, a.col_indices, a.values, x, bounds, config.chunk, config)
    _close(y, _dense(a) @ x.double(), torch.float32)
    again = spmv_fwd(a.crow_indices, a.col_indices, a.values, x, bounds, config.chunk, config)
    assert torch.equal(y, again)  # deterministic: no atomics


@pytest.mark.parametrize(
    "config",
    [SpmmConfig(4, 16, 0, 4)]
    + [SpmmConfig(k, n, c, 4) for k, n in [(4, 16), (8, 32)] for c in (5, 32, 1000)],
    ids=str,
)
def test_spmm_every_path_and_chunk(config, device):
    a = _skewed(device, seed=6)
    b = torch.randn(a.shape[1], 37, device=device).t().contiguous().t()  # column-major B
    bounds = a.partition(config.chunk) if config.strategy == SPLIT else a.crow_indices[:0]
    c = spmm_fwd(a.crow_indices, a.col_indices, a.values, b, bounds, config.chunk, config)
    _close(c, _dense(a) @ b.double(), torch.float32)


def test_skewed_matrix_takes_the_split_path(device):
    from tritonkit.ops.sparse.config import split_chunk

    a = _skewed(device)
    even = sp.generate.uniform(150, 90, 5, device=device)
    for op in ("spmv", "spmm"):
        assert split_chunk(op, a.shape[0], a.nnz, a.max_row_length, 4) > 0
        assert split_chunk(op, even.shape[0], even.nnz, even.max_row_length, 4) == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_spmm_and_transpose_match_dense(dtype, device):
    a = sp.generate.powerlaw(61, 45, 6, dtype=dtype, device=device, seed=2)
    b = torch.randn(45, 20, device=device).to(dtype)
    _close(sp.spmm(a, b), _dense(a) @ b.double(), dtype)
    bt = torch.randn(61, 20, device=device).to(dtype)
    _close(sp.spmm(a, bt, transpose_a=True), _dense(a).t() @ bt.double(), dtype)
    _close(sp.spmm(a.to_coo(), b), _dense(a) @ b.double(), dtype)
    _close(sp.spmm(a.to_torch(), b), _dense(a) @ b.double(), dtype)


@pytest.mark.parametrize("op", ["spmv", "spmm"])
def test_gradients_match_dense(op, device):
    a = _skewed(device, seed=7)
    dense = a.to_dense().double()
    mask = dense != 0
    vals = a.values.detach().clone().requires_grad_()
    shape = (a.shape[1],) if op == "spmv" else (a.shape[1], 13)
    x = torch.randn(shape, device=device, requires_grad=True)
    fn = sp.spmv if op == "spmv" else sp.spmm
    out = fn(a.with_values(vals), x)
    g = torch.randn_like(out)
    out.backward(g)
    d_ref = dense.clone().requires_grad_()
    x_ref = x.detach().double().requires_grad_()
    (d_ref @ x_ref).backward(g.double())
    _close(x.grad, x_ref.grad, torch.float32)
    _close(vals.grad, d_ref.grad[mask], torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sddmm_matches_sampled_addmm(dtype, device):
    a = sp.generate.powerlaw(40, 33, 5, dtype=dtype, device=device, seed=4)
    m1 = torch.randn(40, 70, device=device).to(dtype)
    m2 = torch.randn(33, 70, device=device).to(dtype).t()  # K-major mat2 (a view)
    out = sp.sddmm(a, m1, m2, beta=0.5, alpha=-2.0)
    ref = (
        0.5 * a.values.double()
        + -2.0 * (m1.double() @ m2.double())[a.row_indices().long(), a.col_indices.long()]
    )
    assert torch.equal(out.col_indices, a.col_indices)
    _close(out.values, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("blocksize", [(16, 16), (32, 16), (16, 64)])
def test_bsr_mm_matches_dense(blocksize, dtype, device):
    a = sp.generate.block(96, 128, blocksize, 0.3, dtype=dtype, device=device, seed=1)
    b = torch.randn(128, 50, device=device).to(dtype)
    atol, rtol = {torch.float32: (1e-4, 1e-5)}.get(dtype, TOL[dtype])
    torch.testing.assert_close(
        sp.bsr_mm(a, b).double(), a.to_dense().double() @ b.double(), atol=atol * 10, rtol=rtol
    )


def test_bsr_mm_empty_block_rows_write_zeros(device):
    crow = torch.tensor([0, 0, 1, 1], dtype=torch.int32, device=device)
    col = torch.tensor([1], dtype=torch.int32, device=device)
    a = sp.BSR(crow, col, torch.randn(1, 16, 16, device=device), (48, 32))
    b = torch.randn(32, 8, device=device)
    torch.testing.assert_close(sp.bsr_mm(a, b), a.to_dense() @ b, atol=1e-4, rtol=1e-5)


# ---- every format and torch layout; conversions kept ---------------------------------------


def _pattern(m: int, k: int, device, seed: int) -> torch.Tensor:
    """A dense (m, k) float32 matrix, 30% non-zero, with an empty row and an empty column."""
    # host: one pattern on every device, drawn on the host and moved
    gen = torch.Generator().manual_seed(seed)  # host: as above
    d = torch.randn(m, k, generator=gen)  # host: as above
    d[torch.rand(m, k, generator=gen) > 0.3] = 0  # host: as above
    d[1], d[:, 2] = 0, 0
    return d.to(device)


# Layout name -> (a dense matrix's shape fit for it, its blocks)
TORCH_LAYOUTS = {
    "coo": ((43, 31), None),
    "coo_uncoalesced": ((43, 31), None),
    "csr": ((43, 31), None),
    "csr_int32": ((43, 31), None),
    "csc": ((43, 31), None),
    "bsr_16x16": ((48, 80), (16, 16)),  # blocks bsr_mm's kernel takes
    "bsr_2x3": ((42, 30), (2, 3)),  # blocks it does not: the element-wise CSR path
    "bsc_3x2": ((42, 30), (3, 2)),
}


def _torch_layout(d: torch.Tensor, layout: str) -> torch.Tensor:
    """``d`` as a torch sparse tensor of ``layout``: built on the CPU (not every conversion
    exists on every device), then moved to d's device."""
    cpu, blocks = d.cpu(), TORCH_LAYOUTS[layout][1]
    if layout == "coo":
        t = cpu.to_sparse()
    elif layout == "coo_uncoalesced":  # every entry twice (halves), in reverse order
        c = cpu.to_sparse()
        idx = torch.cat([c.indices(), c.indices()], 1).flip(1)
        val = torch.cat([c.values(), c.values()]).flip(0) / 2
        t = torch.sparse_coo_tensor(idx, val, cpu.shape, check_invariants=True)
        assert not t.is_coalesced()
    elif layout in ("csr", "csr_int32"):
        t = quiet_sparse(cpu.to_sparse_csr)
        if layout == "csr_int32":
            crow, col = t.crow_indices().int(), t.col_indices().int()
            t = quiet_sparse(
                torch.sparse_csr_tensor, crow, col, t.values(), t.shape, check_invariants=True
            )
    elif layout == "csc":
        t = quiet_sparse(cpu.to_sparse_csc)
    elif layout.startswith("bsr"):
        t = quiet_sparse(cpu.to_sparse_bsr, blocks)
    else:
        t = quiet_sparse(cpu.to_sparse_bsc, blocks)
    return quiet_sparse(t.to, d.device)


@pytest.mark.parametrize("layout", list(TORCH_LAYOUTS))
def test_every_torch_layout_matches_torch(layout, device):
    (m, k), _ = TORCH_LAYOUTS[layout]
    d = _pattern(m, k, device, seed=len(layout))
    a = _torch_layout(d, layout)
    b = torch.randn(k, 13, device=device)
    x = torch.randn(k * 2, device=device)[::2]  # strided x
    g = torch.randn(m, 13, device=device)
    ref = d.double() @ b.double()
    _close(sp.spmm(a, b), ref, torch.float32)
    _close(sp.spmv(a, x), d.double() @ x.double(), torch.float32)
    _close(sp.spmm(a, g, transpose_a=True), d.double().t() @ g.double(), torch.float32)
    sampled = sp.sddmm(a, g, b.t(), beta=0.0)  # at every stored entry (repeats: each time)
    stored = sampled.with_values(torch.ones_like(sampled.values)).to_dense().double()
    _close(sampled.to_dense(), (g.double() @ b.double().t()) * stored, torch.float32)
    try:  # and torch's own product, where it has one (none for BSC, nor, on the CPU, for
        # non-square BSR blocks; the float64 product above is the reference either way)
        theirs = quiet_sparse(torch.sparse.mm, a, b)
    except (RuntimeError, NotImplementedError):
        assert device.type == "cuda" or layout in ("bsr_2x3", "bsc_3x2")
    else:
        _close(sp.spmm(a, b), theirs.double(), torch.float32)


def _block_rows(a: sp.BSR) -> torch.Tensor:
    counts = (a.crow_indices[1:] - a.crow_indices[:-1]).long()
    return torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts)


@pytest.mark.parametrize("op", ["spmm", "spmv", "spmm_t"])
@pytest.mark.parametrize("fmt", ["csr", "coo", "bsr"])
def test_every_tritonkit_format_forward_and_backward(fmt, op, device):
    """CSR, COO and BSR (its spmm forward on bsr_mm's kernel, its gradients through the
    element-wise structure) against a float64 dense product's forward and gradients."""
    if fmt == "bsr":
        a = sp.generate.block(48, 80, (16, 16), 0.4, device=device, seed=3)
    else:
        a = sp.generate.powerlaw(43, 31, 5, device=device, seed=3)
        a = a if fmt == "csr" else a.to_coo()
    vals = a.values.detach().clone().requires_grad_()
    if fmt == "coo":
        a_v = sp.COO(a.row_indices, a.col_indices, vals, a.shape)
    else:
        a_v = a.with_values(vals)
    m, k = a.shape
    shape = {"spmm": (k, 13), "spmv": (k,), "spmm_t": (m, 13)}[op]
    x = torch.randn(shape, device=device, requires_grad=True)
    out = sp.spmv(a_v, x) if op == "spmv" else sp.spmm(a_v, x, transpose_a=op == "spmm_t")
    g = torch.randn_like(out)
    got_vals, got_x = torch.autograd.grad(out, (vals, x), g)

    dense = a.to_dense().double().requires_grad_()
    x_ref = x.detach().double().requires_grad_()
    ref = (dense.t() if op == "spmm_t" else dense) @ x_ref
    d_dense, d_x = torch.autograd.grad(ref, (dense, x_ref), g.double())
    _close(out, ref.detach(), torch.float32)
    _close(got_x, d_x, torch.float32)
    if fmt == "bsr":  # each stored block's gradient: its tile of the dense gradient
        r, c = a.blocksize
        tiles = d_dense.view(m // r, r, k // c, c).permute(0, 2, 1, 3)
        want = tiles[_block_rows(a), a.col_indices.long()]
    else:
        rows = a.row_indices if fmt == "coo" else a.row_indices()
        want = d_dense[rows.long(), a.col_indices.long()]
    _close(got_vals, want, torch.float32)


@pytest.mark.parametrize("op", ["spmm", "spmv"])
@pytest.mark.parametrize("layout", ["coo", "coo_uncoalesced", "csr"])
def test_torch_layout_gradients_match_torch_sparse_mm(layout, op, device):
    """A torch sparse tensor that requires grad gets torch.sparse.mm's gradient, in its own
    layout (repeated COO entries: the dense gradient at their place, once)."""
    d = _pattern(43, 31, device, seed=5)
    a, a_ref = (_torch_layout(d, layout).requires_grad_() for _ in range(2))
    x = torch.randn((31, 13) if op == "spmm" else (31,), device=device, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    out = sp.spmm(a, x) if op == "spmm" else sp.spmv(a, x)
    g = torch.randn_like(out)
    got_a, got_x = torch.autograd.grad(out, (a, x), g)
    ref = torch.sparse.mm(a_ref, x_ref if op == "spmm" else x_ref[:, None])
    want_a, want_x = quiet_sparse(torch.autograd.grad, ref, (a_ref, x_ref), g.view(ref.shape))
    assert got_a.layout == want_a.layout
    _close(quiet_sparse(got_a.to_dense), quiet_sparse(want_a.to_dense).double(), torch.float32)
    _close(got_x, want_x.double(), torch.float32)


@pytest.mark.parametrize("layout", ["csc", "bsr_16x16", "bsr_2x3", "bsc_3x2"])
def test_torch_layouts_without_a_gradient_say_so(layout, device):
    (m, k), _ = TORCH_LAYOUTS[layout]
    a = _torch_layout(_pattern(m, k, device, seed=1), layout).requires_grad_()
    b = torch.randn(k, 5, device=device)
    with pytest.raises(ValueError, match=rf"A is a torch sparse_{layout[:3]} tensor that requires"):
        sp.spmm(a, b)
    with torch.no_grad():  # no gradient asked for: fine
        _close(sp.spmm(a, b), a.detach().to_dense().double() @ b.double(), torch.float32)


def _counting(monkeypatch, module, name: str) -> list:
    """Count the calls of ``module.name`` (looked up by its callers at each call)."""
    calls, real = [], getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(name)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("layout", ["coo", "coo_uncoalesced", "csr", "csc", "bsr_16x16", "bsc_3x2"])
def test_torch_sparse_tensor_is_converted_once(layout, device, monkeypatch):
    """Passed again and again, a torch sparse tensor is converted, checked and analysed once;
    its values are read at every call; the kept structure lives no longer than the tensor."""
    builds = _counting(monkeypatch, operand, "_build")
    checks = _counting(monkeypatch, formats, "_check_compressed")
    (m, k), _ = TORCH_LAYOUTS[layout]
    d = _pattern(m, k, device, seed=7)
    a = _torch_layout(d, layout)
    b, x, g = (
        torch.randn(k, 13, device=device),
        torch.randn(k, device=device),
        torch.randn(m, 5, device=device),
    )

    def calls(a):
        return sp.spmm(a, b), sp.spmv(a, x), sp.spmm(a, g, transpose_a=True)

    first = calls(a)
    assert len(builds) == 1
    counted = len(checks)  # the structure's checks (one sync each), made by the first calls
    assert counted >= 1
    for _ in range(2):
        for got, want in zip(calls(a), first, strict=True):
            assert torch.equal(got, want)
    assert (len(builds), len(checks)) == (1, counted)

    # The values are read at every call. A write to them bumps the tensor's version counter,
    # which its index tensors share: the structure is converted again (safe, not free).
    with torch.no_grad():
        (a._values() if a.layout == torch.sparse_coo else a.values()).mul_(2)
    _close(sp.spmm(a, b), 2 * d.double() @ b.double(), torch.float32)
    assert len(builds) == 2

    id_a = id(a)
    entry = PLANS.peek(("sparse.torch", id_a), None)
    assert entry is not None and entry.data is not None
    del a
    gc.collect()
    assert entry.data is None  # dropped with the tensor, and its key
    assert PLANS.peek(("sparse.torch", id_a), None) is None


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_a_changed_torch_structure_is_not_served_stale(layout, device, monkeypatch):
    builds = _counting(monkeypatch, operand, "_build")
    d = _pattern(43, 31, device, seed=8)
    a = _torch_layout(d, layout)
    b = torch.randn(31, 13, device=device)
    _close(sp.spmm(a, b), d.double() @ b.double(), torch.float32)
    # Every entry moved to column 0 in place (repeats add up): the version counter says so.
    cols = a._indices()[1] if layout == "coo" else a.col_indices()
    cols.zero_()
    moved = torch.zeros_like(d, dtype=torch.float64)
    moved[:, 0] = d.double().sum(1)
    _close(sp.spmm(a, b), moved @ b.double(), torch.float32)
    assert len(builds) == 2


def test_csr_from_the_same_index_tensors_is_checked_once(device, monkeypatch):
    """CSR(crow, col, new_values, shape) in a loop (new edge weights each step) checks and
    analyses the structure once; a write to the indices is seen, and a bad one refused."""
    base = _skewed(device, index_dtype=torch.int32, seed=4)
    crow, col = base.crow_indices.clone(), base.col_indices.clone()
    checks = _counting(monkeypatch, formats, "_check_compressed")
    x = torch.randn(base.shape[1], device=device)
    mats = []
    for _ in range(3):
        mats.append(sp.CSR(crow, col, torch.randn(base.nnz, device=device), base.shape))
        _close(sp.spmv(mats[-1], x), _dense(mats[-1]) @ x.double(), torch.float32)
    assert len(checks) == 1
    assert mats[0]._cache is mats[2]._cache  # the partition and the longest row, kept
    col[5] = base.shape[1]  # out of range, in place
    with pytest.raises(
        ValueError, match=r"col_indices must lie in \[0, 90\), got 90 at position 5"
    ):
        sp.CSR(crow, col, torch.randn(base.nnz, device=device), base.shape)
    assert len(checks) == 2


@pytest.mark.parametrize("name", ["spmv", "spmm"])
def test_the_spec_times_what_a_loop_pays(name, device, monkeypatch):
    """The main job's sparse rows time the spec's impl on the same index tensors again and
    again: after the first call, no structure is rebuilt and (on a GPU) nothing synchronizes
    (the longest row and spmv's split partition: kept)."""
    spec = get_spec(name)
    shape = next(s for s in spec.shapes.test if s[-1] == "powerlaw")  # spmv's: split
    inputs = spec.make_inputs(shape, torch.float32, device, 0)
    first = spec.impl(*inputs)
    rebuilt = _counting(monkeypatch, formats, "_alias")
    assert torch.equal(spec.impl(*inputs), first)  # (a second call: replay may record it)
    if device.type == "cuda":
        torch.cuda.set_sync_debug_mode("error")
    try:
        again = spec.impl(*inputs)
    finally:
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode(0)
    assert rebuilt == []
    assert torch.equal(first, again)


def test_no_beta_warning_from_tritonkit(device):
    """PyTorch's "Sparse CSR (CSC, BSR, BSC) tensor support is in beta" warning never comes
    from tritonkit's own conversions (warned every time here, not once per process)."""
    d = _pattern(48, 80, device, seed=2)
    inputs = {name: _torch_layout(d, name) for name in ("csr", "csc", "bsr_16x16")}
    grad_csr = _torch_layout(d, "csr").requires_grad_()
    b = torch.randn(80, 5, device=device)
    torch.set_warn_always(True)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=r"Sparse \w+ tensor support is in beta")
            a = sp.CSR.from_dense(d)
            a.to_torch()
            sp.CSR.from_torch(a.to_torch().to_sparse_coo())
            blocks = sp.BSR.from_torch(d, (16, 16))
            blocks.to_torch()
            blocks.to_csr()
            a.to_bsr((16, 16))
            for t in inputs.values():
                sp.spmm(t, b)
            out = sp.spmm(grad_csr, b)
            torch.autograd.grad(out, grad_csr, torch.ones_like(out))
            for name in ("spmv", "spmm", "sddmm", "bsr_mm"):
                spec = get_spec(name)
                args = spec.make_inputs(spec.shapes.test[-1], torch.float32, device, 0)
                with contextlib.suppress(Unavailable):  # no torch kernel here: nothing made
                    spec.baselines["torch sparse"].build()(*args)
    finally:
        torch.set_warn_always(False)


@pytest.mark.parametrize("b_grad", [True, False])
def test_spmm_under_torch_compile(b_grad, device):
    """spmm traces as one graph (fullgraph) with torch.compile's default backend on a GPU
    (inductor; aot_eager under the interpreter, the same Dynamo and AOTAutograd tracing), its
    kernels as the tritonkit ops, and a second call with new values reuses the graph. Without
    a gradient for B, the unused backward inputs are distinct tensors (Dynamo refuses one
    tensor passed as two inputs of an autograd.Function)."""
    a = _skewed(device, seed=9)
    a.transpose_structure()  # the analysis (one sync) outside the compiled region
    vals = a.values.detach().clone().requires_grad_()
    b = torch.randn(a.shape[1], 16, device=device, requires_grad=b_grad)

    def f(v, b):
        return sp.spmm(a.with_values(v), b).square().sum()

    # Eager references first: they fill the matrix's kept analysis (the partitions), which
    # the compiled graph then reads as it is (a change to it would be a guard failure).
    inputs, refs = [], []
    for step in range(2):  # the second call: new values, the same graph
        v = (vals.detach() * (1 + step)).requires_grad_()
        bb = b.detach().clone().requires_grad_(b_grad)
        ref = f(v, bb)
        refs.append((ref, torch.autograd.grad(ref, (v, bb) if b_grad else (v,))))
        inputs.append(
            (v.detach().clone().requires_grad_(), bb.detach().clone().requires_grad_(b_grad))
        )
    counter = CompileCounterWithBackend(compile_backend(device))
    compiled = torch.compile(f, fullgraph=True, backend=counter)
    for (v, bb), (ref, ref_grads) in zip(inputs, refs, strict=True):
        loss = compiled(v, bb)
        grads = torch.autograd.grad(loss, (v, bb) if b_grad else (v,))
        torch.testing.assert_close(loss, ref)
        for got, want in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(got, want)
    assert counter.frame_count == 1  # one graph, kept for the second call
    targets = {
        str(node.target)
        for gm in counter.graphs
        for module in gm.modules()
        if hasattr(module, "graph")
        for node in module.graph.nodes
    }
    assert "tritonkit.sparse_spmm.default" in targets
    assert "tritonkit.sparse_sddmm.default" in targets


# ---- check engine ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", ["spmv", "spmm", "sddmm", "bsr_mm"])
def test_check_engine_passes(name, device):
    assert_spec_passes(name, device)


# ---- reordering and generators -----------------------------------------------------------------


def _scipy_rcm_bandwidth(a: sp.CSR) -> int:
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    m = a.to_scipy().tocsr()
    p = reverse_cuthill_mckee(m, symmetric_mode=True)
    q = m[p][:, p].tocoo()
    return int(np.abs(q.row - q.col).max())


@pytest.mark.parametrize("half_width, density", [(3, 1.0), (6, 0.5), (12, 0.2)])
def test_rcm_bandwidth_no_worse_than_scipy(half_width, density, device):
    band = sp.generate.banded(3000, half_width, density=density, device=device, seed=1)
    shuffled = sp.generate.shuffle(band, seed=2)
    perm, reordered = sp.rcm(shuffled)
    assert torch.equal(torch.sort(perm).values, torch.arange(3000, device=device))
    assert sp.bandwidth(reordered) <= _scipy_rcm_bandwidth(shuffled)
    assert sp.bandwidth(reordered) < sp.bandwidth(shuffled)
    # The permuted matrix is the shuffled one relabelled: same values where perm sends them.
    d = shuffled.to_dense()
    assert torch.equal(reordered.to_dense(), d[perm][:, perm])


def test_rcm_disconnected_and_isolated_nodes(device):
    d = torch.zeros(9, 9, device=device)
    for i, j in [(0, 5), (5, 2), (3, 7), (7, 8)]:
        d[i, j] = d[j, i] = 1.0
    perm, b = sp.rcm(sp.CSR.from_dense(d))
    assert sorted(perm.tolist()) == list(range(9))
    assert torch.equal(b.to_dense(), d[perm][:, perm])
    assert sp.bandwidth(b) <= 2


def test_generators_are_seeded_and_valid(device):
    for make in (
        lambda s: sp.generate.uniform(50, 40, 6, device=device, seed=s),
        lambda s: sp.generate.powerlaw(50, 40, 6, device=device, seed=s),
        lambda s: sp.generate.rmat(7, 600, device=device, seed=s),
        lambda s: sp.generate.banded(50, 4, density=0.5, device=device, seed=s),
    ):
        a, b, c = make(1), make(1), make(2)
        assert torch.equal(a.to_dense(), b.to_dense())
        assert not torch.equal(a.to_dense(), c.to_dense())
        sp.CSR(a.crow_indices, a.col_indices, a.values, a.shape)  # passes validation
    r = sp.generate.rmat(8, 2000, device=device, seed=3)
    assert r.nnz == 2000
    assert r.max_row_length > 4 * 2000 / 256  # power-law rows
    band = sp.generate.banded(40, 3, device=device)
    assert sp.bandwidth(band) == 3 and band.nnz == 40 + 2 * (3 * 40 - 6)
