"""Elementwise family: accuracy through the check engine, bad inputs, layouts, autograd, compile."""

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tritonkit
from tritonkit.ops._core.bias_act import bias_act_bwd, bias_act_fwd
from tritonkit.ops._core.layout import LAYOUT_COPIES, cdiv
from tritonkit.ops._core.math import ACTIVATIONS, GELU_Q16_COEFFS
from tritonkit.ops._core.pointwise import bias_act_fwd_kernel
from tritonkit.ops._core.pointwise_config import (
    POINTWISE,
    ColumnSumConfig,
    PointwiseConfig,
    RowSumConfig,
    row_sum_launch,
)
from tritonkit.ops._core.reduce import PARTIAL_SUMS, PartialSumConfig

from _checks import assert_spec_passes, compile_backend, saved_tensors

OPS = ["relu", "gelu", "gelu_tanh", "silu", "add", "bias_act", "swiglu", "geglu"]


@pytest.mark.slow
@pytest.mark.parametrize("name", OPS)
def test_check_engine_passes(name, device):
    """Every shape x dtype x params: random, non-contiguous, NaN/inf, gradients, empty."""
    assert_spec_passes(name, device)


# ---- bad inputs: clear errors naming the argument ------------------------------------------


def test_integer_dtype_is_a_type_error(device):
    x = torch.arange(6, device=device)
    with pytest.raises(TypeError, match=r"tritonkit.gelu: x must have dtype .* got int64"):
        tritonkit.gelu(x)


def test_non_tensor_is_a_type_error():
    with pytest.raises(TypeError, match=r"x must be a torch\.Tensor, got list"):
        tritonkit.relu([1.0, 2.0])


def test_mismatched_dtypes_are_a_type_error(device):
    x = torch.randn(4, 8, device=device)
    y = torch.randn(4, 8, device=device, dtype=torch.float16)
    with pytest.raises(
        TypeError, match=r"y must have the same dtype as x \(float32\), got float16"
    ):
        tritonkit.add(x, y)
    with pytest.raises(TypeError, match="up must have the same dtype as gate"):
        tritonkit.swiglu(x, y)


def test_different_devices_are_a_value_error(device):
    x = torch.randn(4, 8, device=device)
    other = torch.empty(4, 8, device="meta")
    with pytest.raises(ValueError, match=r"y must be on the same device as x"):
        tritonkit.add(x, other)
    with pytest.raises(ValueError, match=r"bias must be on the same device as x"):
        tritonkit.bias_act(x, torch.empty(8, device="meta"))


def test_mismatched_shapes_are_a_value_error(device):
    gate = torch.randn(4, 8, device=device)
    with pytest.raises(ValueError, match=r"up must have the same shape as gate \(\(4, 8\)\)"):
        tritonkit.swiglu(gate, torch.randn(4, 9, device=device))
    with pytest.raises(ValueError, match="x and y must be broadcastable"):
        tritonkit.add(gate, torch.randn(3, 8, device=device))


# (x, y) shapes broadcasting either way: the first three grew the first operand (PyTorch's
# OpInfo samples, which raised "shape '[5, 5]' is invalid for input of size 5"); then one
# operand broadcast along a middle dim, both along several, and the suffix and leading-1 paths.
BROADCASTS = [
    ((5, 1), (5,)),
    ((10, 1, 5), (10, 5)),
    ((10, 1, 5), (1, 10, 5)),
    ((5,), (5, 1)),
    ((4, 5, 6), (4, 1, 6)),
    ((4, 1, 8), (5, 8)),
    ((3, 1, 4), (1, 5, 1)),
    ((2, 1, 3, 1), (4, 1, 7)),
    ((6, 7), (2, 6, 7)),
    ((1, 6, 7), (6, 7)),
    ((0, 1, 3), (0, 10, 3)),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("x_shape, y_shape", BROADCASTS, ids=str)
def test_add_broadcasts_either_way(x_shape, y_shape, dtype, device):
    """torch.add's broadcasting, whichever operand grows: the sum rounded once (within a unit
    in the last place of the float64 sum), each gradient the upstream gradient summed over the
    dims its operand was broadcast over, as torch's autograd sums it."""
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(x_shape, generator=g, device=device).to(dtype).requires_grad_()
    y = torch.randn(y_shape, generator=g, device=device).to(dtype).requires_grad_()
    out = tritonkit.add(x, y)
    ref = x.detach().double() + y.detach().double()
    assert out.shape == ref.shape and out.dtype == dtype
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(out.double(), ref, rtol=eps, atol=0)
    dy = torch.randn(out.shape, generator=g, device=device).to(dtype)
    gx, gy = torch.autograd.grad(out, (x, y), dy)
    x64, y64 = (t.detach().double().requires_grad_() for t in (x, y))
    rx, ry = torch.autograd.grad(x64 + y64, (x64, y64), dy.double())
    for got, want, t in ((gx, rx, x), (gy, ry, y)):
        assert got.shape == t.shape and got.dtype == dtype
        # summed in float32 (in the kernel or by autograd) and rounded once
        torch.testing.assert_close(got.double(), want, rtol=2 * eps, atol=1e-6)


def test_bias_of_wrong_length(device):
    x = torch.randn(4, 8, device=device)
    with pytest.raises(
        ValueError, match=r"bias must have shape \(x.shape\[-1\],\) = \(8,\), got \(7,\)"
    ):
        tritonkit.bias_act(x, torch.randn(7, device=device))
    with pytest.raises(ValueError, match="bias must have shape"):
        tritonkit.bias_act(x, torch.randn(4, 8, device=device))


def test_unknown_activation_and_approximation(device):
    x = torch.randn(4, 8, device=device)
    with pytest.raises(ValueError, match="activation must be one of"):
        tritonkit.bias_act(x, torch.randn(8, device=device), activation="tanh")
    with pytest.raises(ValueError, match="approximate must be one of"):
        tritonkit.gelu(x, approximate="fast")


def test_cpu_tensor_without_interpreter_names_the_fix(monkeypatch):
    # A CPU tensor on every machine, on purpose: it is what is refused (no kernel sees it).
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(
        ValueError, match=r"must be on a CUDA device, got device cpu.*TRITON_INTERPRET"
    ):
        tritonkit.relu(torch.randn(3))


def test_failed_call_leaves_inputs_untouched(device):
    x = torch.randn(4, 8, device=device, requires_grad=True)
    before = x.detach().clone()
    with pytest.raises(ValueError):
        tritonkit.bias_act(x, torch.randn(7, device=device))
    assert torch.equal(x.detach(), before)
    assert x.grad is None


# ---- layouts ---------------------------------------------------------------------------------


def test_chunked_projection_is_read_in_place(device):
    """gate/up = proj.chunk(2, -1) are row-strided views: no copy is made."""
    proj = torch.randn(6, 2 * 40, device=device)
    gate, up = proj.chunk(2, dim=-1)
    assert not gate.is_contiguous()
    LAYOUT_COPIES.reset()
    out = tritonkit.swiglu(gate, up)
    assert LAYOUT_COPIES.reset() == 0
    torch.testing.assert_close(out, F.silu(gate) * up, rtol=1e-5, atol=1e-6)


def test_permuted_input_keeps_pytorch_output_strides(device):
    x = torch.randn(24, 10, device=device).t()
    out = tritonkit.gelu(x)
    assert out.stride() == F.gelu(x).stride()
    torch.testing.assert_close(out, F.gelu(x), rtol=1e-5, atol=1e-6)


def test_strided_input_is_copied_and_counted(device):
    x = torch.randn(5, 16, device=device)[:, ::2]
    LAYOUT_COPIES.reset()
    out = tritonkit.silu(x)
    assert LAYOUT_COPIES.reset() == 1
    torch.testing.assert_close(out, F.silu(x), rtol=1e-5, atol=1e-6)


# ---- semantics ---------------------------------------------------------------------------------


def test_relu_keeps_nan_and_negative_zero(device):
    x = torch.tensor([float("nan"), -0.0, -1.0, 2.0], device=device)
    out = tritonkit.relu(x)
    assert torch.isnan(out[0])
    assert torch.equal(out[1:], torch.relu(x)[1:])


def test_add_broadcast_gradient_has_the_operand_shape(device):
    x = torch.randn(3, 4, 5, device=device, requires_grad=True)
    y = torch.randn(1, 4, 5, device=device, requires_grad=True)
    tritonkit.add(x, y).sum().backward()
    assert y.grad.shape == y.shape
    torch.testing.assert_close(y.grad, torch.full_like(y, 3.0))
    torch.testing.assert_close(x.grad, torch.ones_like(x))


def test_add_alpha_other_than_one_is_a_value_error_naming_it(device):
    # The README's promise: torch.add's alpha is taken, only 1 is computed, anything else refused.
    x = torch.randn(3, 5, device=device)
    torch.testing.assert_close(tritonkit.add(x, x, alpha=1), x + x)
    with pytest.raises(ValueError, match=r"alpha must be 1.*got 2"):
        tritonkit.add(x, x, alpha=2)
    with pytest.raises(TypeError, match="alpha must be a number, got str"):
        tritonkit.add(x, x, alpha="2")


def test_bias_grad_is_deterministic(device):
    x = torch.randn(300, 7, device=device, requires_grad=True)
    b = torch.randn(7, device=device, requires_grad=True)
    g = torch.randn(300, 7, device=device)
    grads = [torch.autograd.grad(tritonkit.bias_act(x, b, "gelu"), b, g)[0] for _ in range(2)]
    assert torch.equal(grads[0], grads[1])


def test_only_requested_gradients(device):
    x = torch.randn(8, 6, device=device)
    b = torch.randn(6, device=device, requires_grad=True)
    (gb,) = torch.autograd.grad(tritonkit.bias_act(x, b, "silu").sum(), b)
    xd, bd = x.double(), b.detach().double().requires_grad_()
    (ref,) = torch.autograd.grad(F.silu(xd + bd).sum(), bd)
    torch.testing.assert_close(gb.double(), ref, rtol=1e-5, atol=1e-5)


# ---- GELU's Phi for 16-bit outputs ------------------------------------------------------------


def _log2_q(u: np.ndarray) -> np.ndarray:
    """log2(0.5 * erfc(u / sqrt 2)) in float64."""
    t = torch.from_numpy(u).double()
    return torch.log2(0.5 * torch.erfc(t / math.sqrt(2.0))).numpy()


@pytest.mark.slow
def test_gelu_q16_coefficients_are_the_documented_fit():
    """GELU_Q16_COEFFS is the float32-rounded minimax fit its comment describes."""
    deg, u_max, points = 9, 13.0, 4001
    u = np.linspace(0.0, u_max, points)
    f = _log2_q(u)
    s = u / u_max  # monomials of u / u_max: a well-conditioned basis for the least squares
    coef = np.zeros(deg + 1)  # coefficients of s**k
    for k in range(deg, -1, -1):  # fit, round the top free coefficient to float32, refit
        basis = s[:, None] ** np.arange(k + 1)
        g = f - (s[:, None] ** np.arange(k + 1, deg + 1)) @ coef[k + 1 :]
        w = np.full(points, 1.0 / points)
        for _ in range(500):  # Lawson: reweighting least squares by the error -> minimax
            c = np.linalg.lstsq(basis * np.sqrt(w)[:, None], g * np.sqrt(w), rcond=None)[0]
            w *= np.abs(basis @ c - g)
            w /= w.sum()
        coef[k] = float(np.float32(c[k] / u_max**k)) * u_max**k
    fitted = coef / u_max ** np.arange(deg + 1)
    np.testing.assert_allclose(fitted, GELU_Q16_COEFFS, rtol=1e-6)
    # The claims of the comment: the error, and q decreasing to 0 beyond the fitted range.
    dense = np.linspace(0.0, u_max, 100001)
    c64 = np.array(GELU_Q16_COEFFS)
    err = np.abs(np.exp2(np.polynomial.polynomial.polyval(dense, c64) - _log2_q(dense)) - 1)
    assert err.max() < 1.9e-5
    assert c64[-1] < 0
    slope = np.polynomial.polynomial.polyroots(np.polynomial.polynomial.polyder(c64))
    assert not any(abs(r.imag) < 1e-9 and r.real > 0 for r in slope)


def _ordinal(t: torch.Tensor) -> torch.Tensor:
    """16-bit floats as integers in the order of their values (ulps apart = integers apart)."""
    i = t.view(torch.int16).to(torch.int32)
    return torch.where(i < 0, -(i & 0x7FFF), i)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gelu_16bit_is_within_one_ulp_for_every_input(dtype, device):
    """Every finite 16-bit x: the PHI16 kernel's float32 value, rounded to nearest (as on the
    GPU), is at most 1 ulp from float64 gelu rounded (PyTorch's float32 formula is not: it
    loses 1 + erf(x / sqrt 2) to cancellation below x = -4, and gives 0 below x = -5.5).

    The one exception, on the GPU only: where Phi(x) is below float32's smallest normal (x below
    about -13), exp2 (ex2.approx.ftz) flushes it to 0 and the output is 0, not the bf16 value
    of magnitude under 1e-36 (fp16 rounds those to 0 anyway)."""
    x = torch.arange(-(2**15), 2**15, dtype=torch.int32, device=device).to(torch.int16)
    x = x.view(dtype)
    keep = torch.isfinite(x)
    if device.type == "cpu" and dtype == torch.bfloat16:
        # The interpreter's bf16 -> fp32 load gets subnormals wrong (a shift on the GPU).
        keep &= (x.float().abs() >= torch.finfo(dtype).tiny) | (x == 0)
    x = x[keep]
    y = torch.empty(x.shape, dtype=torch.float32, device=device)
    n = x.numel()
    # Through the kernel with a float32 output: the interpreter's own bf16 store truncates.
    bias_act_fwd_kernel[(cdiv(n, 1024),)](
        x, x, y, y, 1, n, n, 0, n, 0,  # x, bias, y, mask, rows, cols, strides
        ACT=ACTIVATIONS["gelu"], HAS_BIAS=False, BIAS_IS_ROW=False, STORE_MASK=False,
        PHI16=True, INT64=False, BLOCK_M=1, BLOCK_N=1024,
    )  # fmt: skip
    xd = x.double()
    exact = (0.5 * xd * torch.erfc(-xd / math.sqrt(2.0))).to(dtype)
    ulps = (_ordinal(y.to(dtype)) - _ordinal(exact)).abs()
    wrong = ulps > 1
    if device.type == "cuda":  # exp2 flushes there; the interpreter's does not
        phi = 0.5 * torch.erfc(xd.abs() / math.sqrt(2.0))
        wrong &= ~((phi < 2.0**-126) & (xd < 0) & (y == 0))
    assert not wrong.any(), x[wrong].tolist()
    if dtype == torch.float16:  # the interpreter rounds fp16 stores to nearest as well
        torch.testing.assert_close(tritonkit.gelu(x), y.to(dtype), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gelu_16bit_tail_and_specials(dtype, device):
    x = torch.tensor(
        [-60000.0, -20.0, -5.0, float("-inf"), float("inf"), float("nan")], device=device
    )
    out = tritonkit.gelu(x.to(dtype)).float()
    assert torch.equal(out[:2], torch.zeros(2, device=device))  # -0.0 == 0: q underflows
    assert out[2].item() == pytest.approx(-1.4333e-6, rel=0.05)  # fp16: a subnormal
    assert out[4].item() == float("inf")
    assert torch.isnan(out[3]) and torch.isnan(out[5])  # as float64 F.gelu: -inf * 0


# ---- the bias gradient's column sums -------------------------------------------------------------

ROW_SUM_CONFIGS = [
    RowSumConfig(warps=8, rows=2, programs_per_sm=4),
    RowSumConfig(warps=4, rows=8, programs_per_sm=8),
    RowSumConfig(warps=2, rows=16, programs_per_sm=2, stages=3),
]
SHAPES = [(1, 7), (37, 129), (300, 1000), (3, 11, 2050)]


@pytest.mark.slow
@pytest.mark.parametrize("cfg", ROW_SUM_CONFIGS, ids=lambda c: f"w{c.warps}r{c.rows}")
@pytest.mark.parametrize("shape", SHAPES)
def test_bias_gradient_under_row_sum_configs(cfg, shape, device):
    """bias_act's bias gradient (summed beside dx) under every row-sum config the sweep may
    choose: every row summed once, at odd shapes, fp32 and bf16."""
    config = PointwiseConfig(row_sums_by_size=((2, cfg), (4, cfg)))
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(shape, device=device, dtype=dtype)
        b = torch.randn(shape[-1], device=device, dtype=dtype)
        g = torch.randn(shape, device=device, dtype=dtype)
        # As bias_act's autograd runs it for relu: the forward's bits, then the bias gradient.
        _, bits = bias_act_fwd(x, b, "relu", save_mask=True, config=config)
        _, db = bias_act_bwd(g, None, b, bits, "relu", False, True, config=config)
        on = (x.double() + b.double()) > 0  # relu's mask, ties aside
        ref = (g.double() * on).reshape(-1, shape[-1]).sum(0)
        tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: x + b rounded before the mask
        torch.testing.assert_close(db.double(), ref.to(dtype).double(), rtol=tol, atol=tol)
        if cfg == ROW_SUM_CONFIGS[0]:  # and through the public function, default configs
            b.requires_grad_()
            (db,) = torch.autograd.grad(tritonkit.bias_act(x, b, "relu"), b, g)
            torch.testing.assert_close(db.double(), ref.to(dtype).double(), rtol=tol, atol=tol)


def test_partial_sum_config_fills_the_device():
    # 132 partial rows of 4096 columns (the norms at (16384, 4096)): one step, 128 programs
    assert PARTIAL_SUMS.launch(132, 4096, sms=132) == (256, 32, 4)
    # 16 partial rows of 65536 (the wide norms): columns capped at 128 per program
    assert PARTIAL_SUMS.launch(16, 65536, sms=132) == (16, 128, 2)
    assert PARTIAL_SUMS.launch(1, 5, sms=132) == (1, 32, 2)


@pytest.mark.slow  # partial rows: test_bias_grad_is_deterministic in the fast tier
@pytest.mark.parametrize("shape", [(300, 1000), (37, 129)])
def test_bias_gradient_partial_rows_in_steps(shape, device):
    """The partial rows summed over several row steps and column blocks."""
    config = PointwiseConfig(partial_sums=PartialSumConfig(16, 16, max_rows=2), sms=64)
    x = torch.randn(shape, device=device)
    b = torch.randn(shape[-1], device=device)
    g = torch.randn(shape, device=device)
    _, db = bias_act_bwd(g, x, b, None, "gelu", False, True, config=config)
    xb = (x.double() + b.double()).requires_grad_()
    (ref,) = torch.autograd.grad(F.gelu(xb), xb, g.double())
    torch.testing.assert_close(db.double(), ref.sum(0), rtol=1e-5, atol=1e-5)


COLUMN_SUM_CONFIGS = [
    ColumnSumConfig(block_m=8, block_n=64, warps=4, splits=16),
    ColumnSumConfig(
        block_m=4,
        block_n=32,
        warps=2,
        splits=3,
        evict="",
        final=PartialSumConfig(64, 64, max_rows=2),
    ),
    ColumnSumConfig(
        block_m=16, block_n=128, warps=8, splits=64, final=PartialSumConfig(32, 32, max_rows=32)
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("cfg", COLUMN_SUM_CONFIGS, ids=lambda c: f"r{c.block_m}s{c.splits}")
@pytest.mark.parametrize("shape", SHAPES)
def test_add_broadcast_gradient_under_column_sum_configs(cfg, shape, device):
    """add's broadcast gradient (a plain column sum) under column-sum configs: more splits than
    rows, rows not a multiple of the tile, columns not a multiple of the block; fp32 and bf16."""
    config = PointwiseConfig(column_sums_by_size=((2, cfg), (4, cfg)))
    for dtype in (torch.float32, torch.bfloat16):
        y = torch.randn(shape[-1], device=device, dtype=dtype)
        g = torch.randn(shape, device=device, dtype=dtype)
        # As add's autograd runs it for y broadcast over x: a column sum of the gradient.
        _, dy = bias_act_bwd(g, None, y, None, "none", False, True, config=config)
        ref = g.double().reshape(-1, shape[-1]).sum(0)
        tol = 1e-5 if dtype == torch.float32 else 8e-3  # one rounding of the fp32 sum
        torch.testing.assert_close(dy.double(), ref.to(dtype).double(), rtol=tol, atol=tol)
        if cfg == COLUMN_SUM_CONFIGS[0]:  # and through the public function, default configs
            x = torch.randn(shape, device=device, dtype=dtype)
            y.requires_grad_()
            (dy,) = torch.autograd.grad(tritonkit.add(x, y), y, g)
            torch.testing.assert_close(dy.double(), ref.to(dtype).double(), rtol=tol, atol=tol)


def test_row_sum_launch_fills_an_h200_in_one_wave():
    """bias_act's row-sum configs at (16384, 8192) on 132 SMs: rows in-thread (one 16-byte
    vector of each row per thread), every row in one group, 90-100% of the target programs."""
    n_rows, n_cols = 16384, 8192
    for elem, cfg in POINTWISE.row_sums_by_size:
        tile, rows_per_program, groups = row_sum_launch(n_rows, n_cols, elem, cfg, 132)
        threads = 32 * tile.num_warps
        assert tile.BLOCK_N // threads * elem == 16, elem
        assert (groups - 1) * rows_per_program < n_rows <= groups * rows_per_program
        slots = cfg.programs_per_sm * 132
        assert 0.9 * slots <= groups * (n_cols // tile.BLOCK_N) <= slots, elem


def test_sweep_column_sum_candidates_start_with_the_default():
    """experiments/sweep_gelu_colsum.py's column-sum candidates: the default first, no two alike."""
    path = Path(__file__).parents[1] / "experiments" / "sweep_gelu_colsum.py"
    spec = importlib.util.spec_from_file_location("sweep_gelu_colsum", path)
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    for elem in (2, 4):
        cands = sweep.column_sum_candidates(elem)
        assert cands[0] == POINTWISE.column_sums(elem)
        assert len({sweep._label(c) for c in cands}) == len(cands) == len(set(cands))


# ---- modules ---------------------------------------------------------------------------------


def test_modules_match_torch_nn(device):
    x = torch.randn(5, 33, device=device)
    torch.testing.assert_close(tritonkit.nn.ReLU()(x), torch.nn.ReLU()(x))
    torch.testing.assert_close(
        tritonkit.nn.GELU("tanh")(x), torch.nn.GELU("tanh")(x), rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(tritonkit.nn.SiLU()(x), torch.nn.SiLU()(x), rtol=1e-5, atol=1e-6)
    assert "approximate='tanh'" in repr(tritonkit.nn.GELU("tanh"))


def test_modules_reject_inplace_and_bad_approximation():
    with pytest.raises(ValueError, match="inplace=True is not supported"):
        tritonkit.nn.ReLU(inplace=True)
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        tritonkit.nn.GELU("fast")


# ---- torch.compile -----------------------------------------------------------------------------

COMPILE_CASES = {
    "relu": (lambda x, y: tritonkit.relu(x) * 2, lambda x, y: torch.relu(x) * 2),
    "gelu": (
        lambda x, y: tritonkit.gelu(x, "tanh") + 1,
        lambda x, y: F.gelu(x, approximate="tanh") + 1,
    ),
    "silu": (lambda x, y: tritonkit.silu(x), lambda x, y: F.silu(x)),
    "add": (lambda x, y: tritonkit.add(x, y[0]), lambda x, y: x + y[0]),
    "bias_act": (lambda x, y: tritonkit.bias_act(x, y[0], "gelu"), lambda x, y: F.gelu(x + y[0])),
    "swiglu": (lambda x, y: tritonkit.swiglu(x, y), lambda x, y: F.silu(x) * y),
    "geglu": (lambda x, y: tritonkit.geglu(x, y), lambda x, y: F.gelu(x) * y),
}


@pytest.mark.parametrize("name", list(COMPILE_CASES))
def test_compile_fullgraph_traces(name, device):
    """fullgraph=True fails on any graph break: the custom ops and Functions must trace."""
    torch._dynamo.reset()
    fn, ref = COMPILE_CASES[name]
    backend = compile_backend(device)
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    x = torch.randn(6, 10, device=device, requires_grad=True)
    y = torch.randn(6, 10, device=device, requires_grad=True)
    out = compiled(x, y)
    expected = ref(x, y)
    # The same function, not a second accuracy check (the check engine's): our fp32 erf GELU is
    # within about 1e-6 of PyTorch's in absolute terms, which atol 1e-6 once failed on (geglu).
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (x, y), g, allow_unused=True)
    want = torch.autograd.grad(expected, (x, y), g, allow_unused=True)
    for a, b in zip(got, want):
        if b is None:
            assert a is None or not a.any()
        else:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.compile
def test_compile_with_inductor(device):
    """The default backend (inductor) runs the custom op inside its generated code."""
    torch._dynamo.reset()
    fn = torch.compile(lambda x, b: tritonkit.bias_act(x, b, "silu") * 3, fullgraph=True)
    x = torch.randn(4, 12, device=device)
    b = torch.randn(12, device=device)
    torch.testing.assert_close(fn(x, b), F.silu(x + b) * 3, rtol=1e-5, atol=1e-6)


# ---- relu's one-bit-per-element saved state ------------------------------------------------


@pytest.mark.parametrize("shape", [(5, 17), (64,), (3, 4, 9)])
def test_relu_saves_one_bit_per_element(shape, device):
    x = torch.randn(shape, device=device, dtype=torch.bfloat16, requires_grad=True)
    out, saved = saved_tensors(lambda: tritonkit.relu(x))
    assert len(saved) == 1 and saved[0].dtype == torch.uint8
    rows = x.numel() // shape[-1]
    assert tuple(saved[0].shape) == (rows, -(-shape[-1] // 8))
    (gx,) = torch.autograd.grad(out, x, torch.ones_like(out))
    torch.testing.assert_close(gx, (x > 0).to(x.dtype))


def test_relu_without_grad_saves_nothing(device):
    x = torch.randn(40, device=device)
    _, saved = saved_tensors(lambda: tritonkit.relu(x))
    assert saved == []


def test_relu_backward_drops_nan_gradient_where_input_is_negative(device):
    x = torch.tensor([-1.0, 2.0, -3.0, 4.0], device=device, requires_grad=True)
    g = torch.tensor([float("nan"), 1.0, 5.0, float("nan")], device=device)
    (ours,) = torch.autograd.grad(tritonkit.relu(x), x, g)
    (ref,) = torch.autograd.grad(torch.relu(x), x, g)
    torch.testing.assert_close(ours, ref, equal_nan=True)


def test_bias_relu_gradient_from_bits_with_permuted_upstream_gradient(device):
    x = torch.randn(12, 10, device=device, requires_grad=True)
    b = torch.randn(10, device=device, requires_grad=True)
    g = torch.randn(10, 12, device=device).t()  # dense, but not row-major
    dx, db = torch.autograd.grad(tritonkit.bias_act(x, b, "relu"), (x, b), g)
    rdx, rdb = torch.autograd.grad(torch.relu(x + b), (x, b), g)
    torch.testing.assert_close(dx, rdx)
    torch.testing.assert_close(db, rdb, rtol=1e-5, atol=1e-5)
