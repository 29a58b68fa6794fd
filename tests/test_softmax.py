"""Softmax family: accuracy through the check engine, any dim, looped rows, modules, compile."""

import dataclasses

import pytest
import torch

from tritonkit.harness.check import check_spec, fresh_seed
from tritonkit.harness.spec import get_spec
from tritonkit.nn.softmax import LogSoftmax, Softmax
from tritonkit.ops._core.layout import LAYOUT_COPIES
from tritonkit.ops.softmax import SOFTMAX, log_softmax, softmax, softmax_along
from tritonkit.ops.softmax.config import ROW_BWD_MAX_COLS, ROW_BWD_MAX_COLS_FP32
from tritonkit.ops.softmax.kernels_aligned import (
    softmax_bwd_aligned_kernel,
    softmax_fwd_aligned_kernel,
)
from tritonkit.ops.softmax.kernels_row_backward import softmax_bwd_row_kernel

from _checks import assert_spec_passes, compile_backend

# Masked lanes of a looped chunk are -inf: the interpreter's NumPy warns about their maxima.
pytestmark = pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning")

OPS = {"softmax": (softmax, torch.softmax), "log_softmax": (log_softmax, torch.log_softmax)}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(OPS))
def test_check_engine_passes(name, device):
    """Every shape x dtype x dim: random, non-contiguous, NaN/inf, gradients, empty."""
    assert_spec_passes(name, device)


def assert_passes_with(config, name, device, **kwargs):
    """The check engine on ``name``'s spec, its operator run under ``config``."""
    log = name == "log_softmax"
    spec = dataclasses.replace(
        get_spec(name), impl=lambda x, dim=-1: softmax_along(x, dim, log, config)
    )
    seed = fresh_seed()
    results = check_spec(spec, device=device, seed=seed, **kwargs)
    failed = [r for r in results if not r.passed and not r.skipped]
    report = "\n".join(f"{r.params} {r.shape} {r.dtype} {r.case}: {r.detail}" for r in failed[:10])
    assert results and not failed, f"{name} (base seed {seed}): {len(failed)} failed\n{report}"


class _Count:
    """Counts the launches of kernels (their launch counters) while active."""

    def __init__(self, *kernels):
        self.kernels = kernels

    def __enter__(self):
        self.before = [sum(k.stats.values()) for k in self.kernels]
        return self

    def __exit__(self, *exc):
        self.launches = [sum(k.stats.values()) - b for k, b in zip(self.kernels, self.before)]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("block_n", [None, 16], ids=["one-chunk", "chunks-of-16"])
def test_row_backward_passes_the_check_engine(name, block_n, device):
    """16-bit rows (and fp32 softmax rows) take the backward of one program per row, the
    width a compile-time constant (RowBackwardConfig), lowered so that the test shapes take
    it: in one chunk, or in chunks of 16 with a partial last one."""
    row = dataclasses.replace(SOFTMAX.row_backward, min_cols=1, min_cols_log=1, chunk=block_n)
    config = dataclasses.replace(SOFTMAX, row_backward=row)
    with _Count(softmax_bwd_row_kernel) as spy:
        assert_passes_with(
            config,
            name,
            device,
            dtypes=[torch.bfloat16, torch.float16, torch.float32],
            cases=("random", "specials", "grad", "grad-transpose"),
        )
    assert spy.launches[0] > 0


def test_row_backward_routing(device):
    """The row backward takes 16-bit rows of min_cols (log_softmax: min_cols_log) to
    ROW_BWD_MAX_COLS contiguous columns, and fp32 softmax rows up to ROW_BWD_MAX_COLS_FP32;
    transposed rows keep the other paths (rows off 16 bytes: test_aligned_walk_routing)."""

    def takes(n, dtype=torch.bfloat16, transpose=False, op=softmax):
        with _Count(softmax_bwd_row_kernel) as spy:
            x = (
                torch.randn(n, 2, device=device).t()
                if transpose
                else torch.randn(2, n, device=device)
            )
            x = x.to(dtype).requires_grad_()
            y = op(x, -1)
            torch.autograd.grad(y, x, torch.randn_like(y))
        return spy.launches[0] > 0

    c = SOFTMAX.row_backward
    assert takes(c.min_cols) and takes(ROW_BWD_MAX_COLS)
    assert not takes(c.min_cols - 1) and not takes(ROW_BWD_MAX_COLS + 1)
    fp32 = torch.float32
    assert takes(c.min_cols, fp32) and takes(ROW_BWD_MAX_COLS_FP32, fp32)
    assert not takes(c.min_cols - 4, fp32)
    assert not takes(ROW_BWD_MAX_COLS_FP32 + 4, fp32)
    assert not takes(c.min_cols, fp32, op=log_softmax)
    assert not takes(c.min_cols, transpose=True)
    low_log = -(-c.min_cols_log // 8) * 8  # whole 16-byte rows: odd ones are aligned-walked
    assert not takes(low_log - 8, op=log_softmax)
    assert takes(low_log, op=log_softmax)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("block_n", [None, 8], ids=["one-chunk", "chunks-of-8"])
def test_aligned_walk_passes_the_check_engine(name, block_n, device):
    """Rows that do not start on 16 bytes take the aligned-walk kernels (aligned), lowered so
    that the odd test widths take them: the body in one chunk, or in chunks of 8 with a partial
    last one, and the edge elements before and after it."""
    aligned = dataclasses.replace(SOFTMAX.aligned, min_cols_fwd=1, min_cols_bwd=1, chunk=block_n)
    config = dataclasses.replace(SOFTMAX, aligned=aligned)
    with _Count(softmax_fwd_aligned_kernel, softmax_bwd_aligned_kernel) as spy:
        assert_passes_with(
            config, name, device, cases=("random", "specials", "grad", "grad-transpose")
        )
    assert spy.launches[0] > 0 and spy.launches[1] > 0


@pytest.mark.slow
def test_aligned_walk_routing(device):
    """Odd rows of AlignedConfig.min_cols_fwd (backward: _bwd) columns or more take the aligned
    walk, with the same results as PyTorch; aligned rows, an input whose base pointer is off 16
    bytes, and an input whose rows start at other offsets than the output's keep the other
    paths."""

    def takes(x, op=softmax, ref=torch.softmax):
        with _Count(softmax_fwd_aligned_kernel, softmax_bwd_aligned_kernel) as spy:
            x = x.detach().requires_grad_()
            y = op(x, -1)
            dy = torch.randn_like(y)
            (dx,) = torch.autograd.grad(y, x, dy)
        x64 = x.detach().double().requires_grad_()
        y64 = ref(x64, -1)
        (dx64,) = torch.autograd.grad(y64, x64, dy.double())
        tol = 2e-2 if x.dtype == torch.bfloat16 else 1e-5
        torch.testing.assert_close(y.double(), y64, atol=tol, rtol=tol)
        torch.testing.assert_close(dx.double(), dx64, atol=tol, rtol=tol)
        return spy.launches[0] > 0, spy.launches[1] > 0

    wide = SOFTMAX.aligned.min_cols_fwd | 1  # odd
    mid = SOFTMAX.aligned.min_cols_bwd | 1
    bf16 = {"device": device, "dtype": torch.bfloat16}
    assert takes(torch.randn(3, wide, **bf16)) == (True, True)
    assert takes(torch.randn(3, wide, **bf16), log_softmax, torch.log_softmax) == (True, True)
    assert takes(torch.randn(3, wide, device=device)) == (True, True)  # float32
    assert takes(torch.randn(3, mid, **bf16)) == (False, True)
    assert takes(torch.randn(3, wide - 1 + 8, **bf16)) == (False, False)  # a multiple of 8
    off = torch.randn(3 * wide + 1, **bf16)[1:].view(3, wide)  # 2 bytes past 16
    assert takes(off)[0] is False  # (its backward sees only new, aligned tensors)
    padded = torch.randn(3, wide + 7, **bf16)[:, :wide]  # rows at 16 bytes, y's are not
    assert takes(padded)[0] is False


@pytest.fixture(
    params=[(True, False), (False, False), (True, True), (False, True)],
    ids=["prefetch", "no-prefetch", "prefetch-chunk-max", "chunk-max"],
)
def looped(request):
    """A config whose rows wider than 32 columns take the looped (online) path, in chunks of
    16, with and without loading the next chunk ahead, the forward's first sweep per lane or
    per chunk."""
    prefetch, chunk_max = request.param
    looped = dataclasses.replace(
        SOFTMAX.looped,
        prefetch_fwd=prefetch,
        prefetch_bwd=prefetch,
        chunk_max=chunk_max,
        evict_fwd=chunk_max,  # the hints' code path (no-ops here)
    )
    return dataclasses.replace(
        SOFTMAX,
        looped=looped,
        max_fused_cols=32,
        loop_block_n=16,
        tile_elems=64,
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", list(OPS))
def test_looped_path_passes_the_check_engine(name, device, looped):
    """Rows of 70 loop over five chunks (the last one partial) along dim -1; along dim 0, three
    columns of 64 adjacent rows loop one column at a time."""
    assert_passes_with(
        looped,
        name,
        device,
        shapes=[(3, 70)],
        dtypes=[torch.float32, torch.bfloat16],
        cases=("random", "transpose", "specials", "grad"),
    )


def _grads_match(ours_fn, ref_fn, x, rtol=1e-5, atol=1e-6):
    xa = x.detach().clone().requires_grad_()
    xd = x.detach().double().requires_grad_()
    out, ref = ours_fn(xa), ref_fn(xd)
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol)
    g = torch.randn(out.shape, device=x.device)
    (ga,) = torch.autograd.grad(out, xa, g)
    (gd,) = torch.autograd.grad(ref, xd, g.double())
    torch.testing.assert_close(ga.double(), gd, rtol=rtol, atol=atol)


# ---- any dim, through strides ------------------------------------------------------------------


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("dim", [1, -2, 0])
def test_non_last_dim_without_a_copy(name, dim, device):
    ours, ref = OPS[name]
    x = torch.randn(3, 17, 5, 4, device=device)
    LAYOUT_COPIES.reset()
    _grads_match(lambda t: ours(t, dim), lambda t: ref(t, dim), x)
    assert LAYOUT_COPIES.reset() == 0


@pytest.mark.parametrize("name", list(OPS))
def test_permuted_and_sliced_inputs_without_a_copy(name, device):
    ours, ref = OPS[name]
    base = torch.randn(6, 40, 9, device=device)
    for x, dim in ((base.permute(2, 0, 1), 1), (base[:, 3:30, ::2], -1), (base.transpose(0, 2), 0)):
        LAYOUT_COPIES.reset()
        _grads_match(lambda t, d=dim: ours(t, d), lambda t, d=dim: ref(t, d), x)
        assert LAYOUT_COPIES.reset() == 0


def test_layout_with_no_strided_view_is_copied_and_counted(device):
    # Three row dims whose strides cannot merge into two axes.
    x = torch.randn(4, 6, 5, 8, device=device).permute(1, 3, 0, 2)[:, ::2, :, ::2]
    LAYOUT_COPIES.reset()
    out = softmax(x, 2)
    assert LAYOUT_COPIES.reset() == 1
    torch.testing.assert_close(out, torch.softmax(x, 2), rtol=1e-5, atol=1e-6)


def test_dense_input_keeps_its_strides(device):
    x = torch.randn(24, 10, device=device).t()
    assert softmax(x, 0).stride() == x.stride()


@pytest.mark.slow
def test_looped_non_last_dim(device, looped):
    x = torch.randn(70, 3, 6, device=device)  # 70 along the reduced dim 0, adjacent rows
    _grads_match(lambda t: softmax_along(t, 0, False, looped), lambda t: torch.softmax(t, 0), x)
    _grads_match(lambda t: softmax_along(t, 0, True, looped), lambda t: torch.log_softmax(t, 0), x)


# ---- semantics and properties ------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 37), (37, 1), (1, 1)])
def test_one_row_and_one_column(shape, device):
    x = torch.randn(shape, device=device)
    for dim in (0, 1):
        _grads_match(lambda t, d=dim: softmax(t, d), lambda t, d=dim: torch.softmax(t, d), x)
        _grads_match(
            lambda t, d=dim: log_softmax(t, d), lambda t, d=dim: torch.log_softmax(t, d), x
        )


def test_zero_dim_and_one_dim(device):
    x = torch.tensor(3.0, device=device)
    assert softmax(x, 0).item() == 1.0 and log_softmax(x, -1).item() == 0.0
    y = torch.randn(9, device=device)
    torch.testing.assert_close(softmax(y), torch.softmax(y, 0), rtol=1e-5, atol=1e-6)


def test_rows_sum_to_one_and_shift_invariance(device):
    x = torch.randn(7, 300, device=device) * 30  # large logits: no overflow after the max
    y = softmax(x)
    torch.testing.assert_close(y.sum(-1), torch.ones(7, device=device))
    torch.testing.assert_close(softmax(x + 1000.0), y, rtol=1e-4, atol=1e-6)
    half = softmax(x.half())
    assert torch.isfinite(half).all()


def test_masked_rows_with_minus_inf(device):
    x = torch.randn(4, 10, device=device)
    x[:, 5:] = float("-inf")
    x[3] = float("-inf")  # a fully masked row is NaN, as in PyTorch
    torch.testing.assert_close(softmax(x), torch.softmax(x, -1), equal_nan=True)
    torch.testing.assert_close(log_softmax(x), torch.log_softmax(x, -1), equal_nan=True)


# ---- dtype= ----------------------------------------------------------------------------------

# (x's dtype, dtype=): 16-bit logits to float32 probabilities first (the common use), then
# down, across, and the no-op.
DTYPE_CASES = [
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.float32),
    (torch.float32, torch.bfloat16),
    (torch.float32, torch.float16),
    (torch.float16, torch.bfloat16),
    (torch.float32, torch.float32),
]


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("x_dtype, dtype", DTYPE_CASES, ids=str)
@pytest.mark.parametrize("dim", [-1, 1])
def test_dtype_casts_the_input_first(name, x_dtype, dtype, dim, device):
    """As torch's ``dtype=``: x is cast to dtype before the op (the result is the op of
    ``x.to(dtype)``, bit for bit), the output is in dtype and x's gradient in x's dtype. Against
    the float64 formula on the cast input, within two units in the last place of the coarser
    dtype: of each probability (log-probability, whose magnitude is its lse's, at least 1), and
    of the largest gradient entry (the gradient's entries cancel)."""
    ours, ref = OPS[name]
    g = torch.Generator(device=device).manual_seed(0)
    x = (torch.randn(5, 37, 3, generator=g, device=device) * 4).to(x_dtype).requires_grad_()
    y = ours(x, dim, dtype=dtype)
    assert y.dtype == ref(x, dim, dtype=dtype).dtype == dtype and y.shape == x.shape
    assert torch.equal(y, ours(x.detach().to(dtype), dim))
    x64 = x.detach().to(dtype).double().requires_grad_()
    y64 = ref(x64, dim)
    dy = torch.randn(y.shape, generator=g, device=device).to(dtype)
    (dx,) = torch.autograd.grad(y, x, dy)
    (dx64,) = torch.autograd.grad(y64, x64, dy.double())
    assert dx.dtype == x_dtype and dx.shape == x.shape
    eps = max(torch.finfo(x_dtype).eps, torch.finfo(dtype).eps)
    tol = 2 * max(eps, 2.0**-20)  # float32: 1e-6, a little above its rounding of the sums
    # probabilities below dtype's normal range are rounded in its subnormal spacing
    subnormal = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps
    atol = tol if name == "log_softmax" else subnormal
    torch.testing.assert_close(y.double(), y64, rtol=tol, atol=atol)
    atol = tol * dx64.abs().max().item()
    torch.testing.assert_close(dx.double(), dx64, rtol=tol, atol=atol)


def test_dtype_casts_integer_input(device):
    x = torch.arange(12, device=device).view(3, 4) % 5
    for ours, ref in OPS.values():
        y = ours(x, 1, dtype=torch.float32)
        assert y.dtype == torch.float32
        torch.testing.assert_close(y, ref(x.float(), 1), rtol=1e-6, atol=1e-7)


def test_dtype_under_autocast_is_the_dtype_given(device):
    """Autocast casts softmax to float32 only when no dtype is given, as torch's does."""
    x = torch.randn(4, 9, device=device, dtype=torch.bfloat16)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        for ours, ref in OPS.values():
            assert ours(x, -1, dtype=torch.float16).dtype == torch.float16
            assert ours(x, -1).dtype == ref(x, -1).dtype


def test_bad_dtype_argument_is_reported(device):
    x = torch.randn(3, 4, device=device)
    with pytest.raises(
        TypeError,
        match=r"tritonkit.softmax: dtype must be float32, float16 or bfloat16 or None, "
        r"got float64",
    ):
        softmax(x, 1, dtype=torch.float64)
    with pytest.raises(
        TypeError, match=r"log_softmax: dtype must be a torch.dtype or None, got str"
    ):
        log_softmax(x, 1, dtype="float32")
    with pytest.raises(TypeError, match=r"tritonkit.softmax: x must be real .* got complex64"):
        softmax(torch.randn(3, 4, device=device, dtype=torch.complex64), 1, dtype=torch.float32)


# ---- bad inputs ----------------------------------------------------------------------------


def test_bad_dim_is_reported(device):
    x = torch.randn(3, 4, device=device)
    with pytest.raises(ValueError, match=r"tritonkit.softmax: dim must be in \[-2, 1\].*got 2"):
        softmax(x, 2)
    with pytest.raises(TypeError, match="dim must be an int, got float"):
        log_softmax(x, 1.0)


def test_bad_dtype_is_reported(device):
    with pytest.raises(TypeError, match=r"tritonkit.log_softmax: x must have dtype .* got int64"):
        log_softmax(torch.arange(6, device=device))


# ---- modules and compile -------------------------------------------------------------------


def test_modules_match_torch_nn(device):
    x = torch.randn(2, 5, 7, device=device)
    for ours, ref in ((Softmax(1), torch.nn.Softmax(1)), (LogSoftmax(-1), torch.nn.LogSoftmax(-1))):
        ours.load_state_dict(ref.state_dict())
        torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-6)
        assert repr(ours).endswith(repr(ref).split("(", 1)[1])
    with pytest.warns(UserWarning, match="Implicit dimension choice"):
        out = Softmax()(x)  # dim=None: torch.nn's legacy choice (dim 0 for 3-d input)
    torch.testing.assert_close(out, torch.softmax(x, 0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(OPS))
def test_compile_fullgraph_traces(name, device):
    torch._dynamo.reset()
    ours, ref = OPS[name]
    backend = compile_backend(device)
    compiled = torch.compile(lambda t: ours(t.t(), 0) * 2, fullgraph=True, backend=backend)
    x = torch.randn(6, 10, device=device, requires_grad=True)
    out, expected = compiled(x), ref(x.t(), 0) * 2
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    g = torch.randn_like(out)
    (got,) = torch.autograd.grad(out, x, g)
    (want,) = torch.autograd.grad(expected, x, g)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
