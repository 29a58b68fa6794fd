"""Sparse family: formats (validation, conversions, memory), SpMV / SpMM on both load-balancing
paths, SDDMM, BSR x dense, autograd, torch.compile, RCM against scipy, generators."""

import numpy as np
import pytest
import torch

import tritonkit.sparse as sp
from tritonkit.ops.sparse import ROWS, SPLIT, SpmmConfig, SpmvConfig, strategy
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
    with pytest.raises(TypeError, match=r"A must be a tritonkit.sparse CSR or COO"):
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
    [SpmvConfig(ROWS, 4, 8, 0, 4), SpmvConfig(ROWS, 1, 4, 0, 1)]
    + [SpmvConfig(SPLIT, 1, t, c, 4) for t in (4, 32) for c in (3, 16, 40, 1000)],
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
    [SpmmConfig(ROWS, 4, 16, 0, 4)]
    + [SpmmConfig(SPLIT, k, n, c, 4) for k, n in [(4, 16), (8, 32)] for c in (5, 32, 1000)],
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


def test_spmm_under_torch_compile(device):
    a = _skewed(device, seed=9)
    a.transpose_structure()  # the analysis (one sync) outside the compiled region
    vals = a.values.detach().clone().requires_grad_()
    b = torch.randn(a.shape[1], 16, device=device, requires_grad=True)

    def f(v, b):
        return sp.spmm(a.with_values(v), b).square().sum()

    compiled = torch.compile(f, fullgraph=True, backend=compile_backend(device))
    loss = compiled(vals, b)
    gv, gb = torch.autograd.grad(loss, (vals, b))
    v2, b2 = vals.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    ref = f(v2, b2)
    rv, rb = torch.autograd.grad(ref, (v2, b2))
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(gv, rv)
    torch.testing.assert_close(gb, rb)


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
