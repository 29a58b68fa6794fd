"""Quantization family: quantize/dequantize bit for bit against the float64 reference of the
same rounding (every format, granularity and kernel path), layouts, special values, bad inputs,
recipes (delayed scaling against TransformerEngine's documented semantics), choosers, metrics
against numpy, the quantized linear layers, convert/calibrate, torch.compile and quant-report.

Under the CPU interpreter ``tl.dot`` on bfloat16 operands is wrong, so the GEMM layers run in
float32 and float16 here (bf16 on the GPU: experiments/gpu_quant.py).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import tritonkit
from tritonkit.nn import Float8Linear, Int8Linear
from tritonkit.ops._core.device import interpreter_enabled
from tritonkit.ops.quant.config import FORMATS, get_format
from tritonkit.quant import (
    DelayedScaling,
    EMAScaling,
    GroupScaler,
    PerChannelScaler,
    calibrate,
    choose_bits,
    choose_format,
    choose_group_size,
    convert,
    dequantize,
    percentiles,
    quantize,
    sqnr_db,
)
from tritonkit.quant import reference as R
from tritonkit.quant.metrics import clip_mask, error_stats

from _checks import assert_spec_passes, compile_backend

INTERPRETED = interpreter_enabled()
E4, E5, I8 = torch.float8_e4m3fn, torch.float8_e5m2, torch.int8
DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# (target dtype, bits, symmetric)
FORMAT_CASES = [(E4, 8, True), (E5, 8, True), (I8, 8, True), (I8, 8, False), (I8, 4, True),
                (I8, 4, False), (I8, 6, True), (I8, 5, False)]  # fmt: skip


def _randn(shape, dtype, device, seed, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * scale
    x *= torch.exp(torch.randn(shape, generator=g, dtype=torch.float64))  # a few large values
    return x.to(dtype).to(device)


def _bits(t):
    """The bytes of t, row-major (NaN compares equal to the same NaN)."""
    return t.cpu().reshape(-1).contiguous().view(torch.uint8)


def _assert_exact(x, q, pow2=False, given_scale=None):
    """Codes, scales, zero points and the dequantized tensor equal the reference bit for bit."""
    fmt = FORMATS[q.format]
    codes, scale, zp = R.quantize(x.cpu(), fmt, q.block, pow2, given_scale=given_scale)
    expect = R.pack_int4(codes) if fmt.packed else codes
    assert torch.equal(_bits(q.data), _bits(expect)), f"{q.format} codes differ at {q.block}"
    assert torch.equal(q.scale.cpu(), scale), f"{q.format} scales differ"
    if zp is not None:
        assert torch.equal(q.zero_point.cpu(), zp)
    else:
        assert q.zero_point is None
    for dtype in (torch.float32, x.dtype):
        out = dequantize(q, dtype).cpu()
        ref = R.dequantize(codes, scale, zp, q.block, dtype)
        nan = torch.isnan(ref)
        assert torch.equal(torch.isnan(out), nan)  # NaN payloads aside, bit for bit
        assert torch.equal(_bits(out.masked_fill(nan, 0)), _bits(ref.masked_fill(nan, 0)))


# ---- bit-exact round trips: every format x granularity x path ----------------------------------

GRANULARITY_CASES = [
    ((37, 96), "tensor", {}),
    ((37, 96), "row", {}),
    ((37, 96), "column", {}),  # one pass: a column fits a program
    ((37, 96), "group", {"group_size": 32}),
    ((36, 10), "group", {"group_size": 12, "dim": 0}),
    ((5, 6, 8), "group", {"group_size": 3, "dim": 1}),  # groups along a middle dim
    ((5, 6, 8), "row", {}),
    ((5, 6, 8), "column", {}),
    ((1030, 12), "column", {}),  # two passes: the column spans more than one program
    ((2, 16400), "row", {}),  # two passes: a row longer than one program holds
]


# 4-bit codes are packed along the last dimension: no groups along another one.
ROUND_TRIPS = [
    (f, c) for f in FORMAT_CASES for c in GRANULARITY_CASES if f[1] != 4 or "dim" not in c[2]
]


@pytest.mark.slow  # every format x granularity: the full tier
@pytest.mark.parametrize(
    ("fmt", "case"),
    ROUND_TRIPS,
    ids=[f"{f[0]}-{f[1]}-{f[2]}-{c[0]}-{c[1]}-{c[2]}" for f, c in ROUND_TRIPS],
)
def test_round_trip_is_exact(fmt, case, device):
    dtype, bits, symmetric = fmt
    shape, gran, kw = case
    x = _randn(shape, torch.bfloat16, device, seed=hash((shape, gran)) % 1000)
    q = quantize(x, dtype, gran, bits=bits, symmetric=symmetric, **kw)
    _assert_exact(x, q)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gran", ["tensor", "row", "column"])
def test_input_dtypes_and_pow2_scales(dtype, gran, device):
    x = _randn((19, 40), dtype, device, seed=3)
    for fmt in (E4, E5, I8):
        _assert_exact(x, quantize(x, fmt, gran))
    q = quantize(x, E4, gran, pow2_scale=True)
    _assert_exact(x, q, pow2=True)
    assert torch.equal(torch.frexp(q.scale)[0].abs(), torch.full_like(q.scale, 0.5))


@pytest.mark.parametrize("layout", ["slice", "transpose", "stride2"])
def test_strided_inputs(layout, device):
    base = _randn((40, 66), torch.float16, device, seed=5)
    x = {"slice": base[:, :64], "transpose": base.t(), "stride2": base[::2, ::2]}[layout]
    for gran, kw in [("tensor", {}), ("row", {}), ("column", {}), ("group", {"group_size": 4})]:
        if gran == "group" and x.shape[-1] % 4:
            continue
        _assert_exact(x, quantize(x, E4, gran, **kw))
        _assert_exact(x, quantize(x, I8, gran, symmetric=False, **kw))


@pytest.mark.parametrize("gran", ["tensor", "row", "column"])
@pytest.mark.parametrize("layout", ["col", "both"])
def test_column_major_and_dual_layouts(gran, layout, device):
    x = _randn((33, 48), torch.bfloat16, device, seed=7)
    q = quantize(x, E4, gran, layout=layout)
    _assert_exact(x, q)
    if layout == "col":
        assert q.data.t().is_contiguous()
    else:
        assert q.data.is_contiguous() and q.data_t.is_contiguous()
        assert torch.equal(q.data_t.view(torch.uint8), q.data.t().view(torch.uint8))


def test_channel_groups_block(device):
    """A scale per 8 channels shared by every row (GroupScaler's granularity)."""
    x = _randn((50, 32), torch.float32, device, seed=9)
    q = quantize(x, E4, block=(50, 8))
    assert q.scale.shape == (1, 4)
    _assert_exact(x, q)


def test_zero_dim_and_empty(device):
    x = torch.tensor(2.5, device=device)
    q = quantize(x, I8)
    assert q.data.shape == () and q.scale.shape == ()
    _assert_exact(x, q)
    for shape, gran in [((0, 8), "row"), ((0, 8), "column"), ((0, 8), "tensor"), ((4, 0), "row")]:
        x = torch.empty(shape, device=device)
        q = quantize(x, E4, gran)
        fmt = FORMATS[q.format]
        _, scale, _ = R.quantize(x.cpu(), fmt, q.block)
        assert q.data.shape == shape and torch.equal(q.scale.cpu(), scale)
        assert dequantize(q).shape == shape
    q = quantize(torch.empty(0, 6, device=device), I8, "column", symmetric=False)
    assert torch.equal(q.zero_point.cpu(), torch.full((1, 6), -128, dtype=torch.int32))


def test_special_values(device):
    """+-inf saturates (and sets no scale), NaN stays NaN in float8 and is 0 in int8."""
    x = _randn((6, 16), torch.float32, device, seed=11)
    x[0, 1], x[1, 2], x[2, 3] = float("inf"), float("-inf"), float("nan")
    for fmt, kw in [(E4, {}), (E5, {}), (I8, {}), (I8, {"symmetric": False})]:
        for gran in ("tensor", "row", "column"):
            q = quantize(x, fmt, gran, **kw)
            _assert_exact(x, q)
            d = dequantize(q, torch.float32)
            assert torch.isfinite(q.scale).all()
            assert d[0, 1] > 0 and d[1, 2] < 0
            assert torch.isnan(d[2, 3]) if fmt != I8 else torch.isfinite(d[2, 3])
    with pytest.raises(ValueError, match="NaN or inf"):
        quantize(x, E4, check_finite=True)


@pytest.mark.skipif(not INTERPRETED, reason="the interpreter's own float8 cast")
def test_interpreter_fp8_cast_is_emulated(device):
    """The interpreter's float32 -> float8 cast rounds half up and truncates subnormals (a Triton
    interpreter limitation): the kernels round in float32 first, which it converts exactly."""
    import triton
    import triton.language as tl

    @triton.jit
    def cast(x_ptr, y_ptr, N: tl.constexpr):
        o = tl.arange(0, N)
        tl.store(y_ptr + o, tl.load(x_ptr + o).to(tl.float8e4nv))

    x = torch.tensor([0.0019, 3.375, 2.5625, 3.4] * 4, device=device)  # subnormal, round-half
    raw = torch.empty(16, dtype=E4, device=device)
    cast[(1,)](x, raw, N=16)
    torch_cast = x.to(E4)
    assert not torch.equal(raw.view(torch.uint8), torch_cast.view(torch.uint8))
    q = quantize(x, E4, scale=torch.ones((), device=device))  # x * 1, cast by the kernel
    assert torch.equal(q.data.view(torch.uint8), torch_cast.view(torch.uint8))


def test_static_scale(device):
    x = _randn((24, 40), torch.bfloat16, device, seed=13)
    for gran, shape in [("tensor", (1, 1)), ("row", (24, 1)), ("column", (1, 40))]:
        s = torch.rand(shape, device=device) * 0.05 + 0.01
        q = quantize(x, E4, gran, scale=s, return_amax=True)
        _assert_exact(x, q, given_scale=s.cpu())
        amax = R.scales(x.cpu(), get_format(E4), q.block)[3].float()
        assert torch.equal(q.amax.cpu(), amax)
        assert torch.equal(q.scale, s)


def test_bad_inputs(device):
    x = torch.randn(6, 10, device=device)
    with pytest.raises(ValueError, match="group_size 4 must divide"):
        quantize(x, I8, "group", group_size=4)
    with pytest.raises(TypeError, match="dtype must be one of int8"):
        quantize(x, torch.float16)
    with pytest.raises(TypeError, match="x must have dtype"):
        quantize(x.to(torch.int32), I8)
    with pytest.raises(ValueError, match="granularity must be one of"):
        quantize(x, I8, "channel")
    with pytest.raises(ValueError, match="float8 formats are 8-bit"):
        quantize(x, E4, bits=4)
    with pytest.raises(ValueError, match="bits must be one of"):
        quantize(x, I8, bits=3)
    with pytest.raises(ValueError, match="4-bit codes are packed"):
        quantize(torch.randn(6, 9, device=device), I8, "row", bits=4)
    with pytest.raises(ValueError, match="layout 'both' needs a 2-D x"):
        quantize(torch.randn(2, 3, 4, device=device), E4, layout="both")
    with pytest.raises(ValueError, match="scale must have shape"):
        quantize(x, E4, "row", scale=torch.ones(1, 10, device=device))
    with pytest.raises(ValueError, match="a given scale is for symmetric"):
        quantize(x, I8, "row", symmetric=False, scale=torch.ones(6, 1, device=device))
    with pytest.raises(ValueError, match="block must have one entry"):
        quantize(x, E4, block=(6,))
    with pytest.raises(ValueError, match="must be >= 1 and divide"):
        quantize(x, E4, block=(4, 10))
    with pytest.raises(ValueError, match="supported are"):
        quantize(x, E4, block=(2, 5))
    with pytest.raises(TypeError, match="q must be a QuantizedTensor"):
        dequantize(x)


@pytest.mark.slow  # the fast tier: one check per public function in test_public_api
@pytest.mark.parametrize(
    "dtype",
    [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.slow),
     pytest.param(torch.float32, marks=pytest.mark.slow)],
)  # fmt: skip
@pytest.mark.parametrize("name", ["quantize", "quantize_dequantize"])
def test_check_engine_passes(name, dtype, device):
    """The quantize specs through the check engine: layouts, NaN/inf, empty, fresh seeds."""
    assert_spec_passes(name, device, dtypes=(dtype,))


@pytest.mark.parametrize("name", ["int8_weight_only_linear", "float8_linear"])
def test_check_engine_layers(name, device):
    """Forward (and float8_linear's backward) against the emulated casts in float64."""
    dtype = torch.float32 if INTERPRETED else torch.bfloat16
    assert_spec_passes(name, device, dtypes=(dtype,))


# ---- metrics against numpy -------------------------------------------------------------------


def test_metrics_match_numpy(device):
    x = _randn((64, 50), torch.float32, device, seed=17)
    q = quantize(x, E4, "row")
    x_hat = dequantize(q, torch.float32)
    xn, en = x.double().cpu().numpy(), (x.double() - x_hat.double()).cpu().numpy()
    expect = 10 * np.log10(np.sum(xn**2) / np.sum(en**2))
    assert abs(float(sqnr_db(x, x_hat)) - expect) <= 1e-6 * abs(expect)
    got = percentiles((x - x_hat).abs()).cpu().numpy()
    np.testing.assert_allclose(got, np.percentile(np.abs(en), [50, 90, 99]), rtol=1e-6, atol=0)
    stats = error_stats(x, q, x_hat)
    assert stats["clip_ratio"] == 0.0 and stats["nonfinite"] == 0
    assert stats["amax_max"] == float(x.abs().max())
    s = torch.full((64, 1), float(q.scale.median()), device=device)  # half the rows clip
    qs = quantize(x, E4, "row", scale=s)
    v = (x.double() / s.double()).abs().cpu().numpy()
    assert float(clip_mask(x, qs).double().mean()) == pytest.approx(np.mean(v >= 464), abs=1e-12)


# ---- recipes ---------------------------------------------------------------------------------


def _te_delayed(amaxes, length, algo, margin, fp8_max):
    """TransformerEngine's DelayedScaling from its documented semantics (delayed_scaling.cu):
    the scale used for each step, in float32."""
    history = np.zeros(length, dtype=np.float32)
    scale = np.float32(1.0)
    used = []
    for a in amaxes:
        used.append(scale)
        history[0] = a
        amax = history.max() if algo == "max" else history[0]
        history = np.roll(history, -1)
        history[0] = 0
        sf = np.float32(fp8_max * 2.0**-margin) / np.float32(amax)
        scale = sf if np.isfinite(amax) and amax > 0 else scale
    return used


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize(("length", "margin"), [(1, 0), (4, 0), (16, 1)])
def test_delayed_scaling_matches_transformer_engine(algo, length, margin, device):
    amaxes = [1.0, 2.0, 0.5, 300.0, 0.0, 4.0, 0.25, 8.0, 1.0, 3.0]
    recipe = DelayedScaling(E4, amax_history_len=length, amax_compute_algo=algo, margin=margin)
    expect = _te_delayed(amaxes, length, algo, margin, 448.0)
    for a, s in zip(amaxes, expect):
        x = torch.zeros(7, 12, device=device)
        x[3, 5] = a
        used = recipe.scale.clone() if recipe.scale is not None else torch.ones(1)
        assert float(used) == float(s)
        q = recipe(x)
        assert torch.equal(q.scale.reshape(-1).cpu(), (1.0 / used.cpu()).float())
    assert torch.equal(recipe.scale_inv, 1.0 / recipe.scale)


def test_recipe_state_round_trip_and_anomalies(device):
    xs = [_randn((8, 16), torch.float32, device, seed=i) for i in range(6)]
    for make in (lambda: EMAScaling(E4), lambda: PerChannelScaler(I8), lambda: GroupScaler(E4, 4),
                 lambda: DelayedScaling(E5, amax_history_len=3)):  # fmt: skip
        a, b = make(), make()
        for x in xs[:3]:
            a(x)
        b.load_state_dict(a.state_dict())
        for x in xs[3:]:
            qa, qb = a(x), b(x)
            assert torch.equal(qa.data.view(torch.uint8), qb.data.view(torch.uint8))
            assert torch.equal(qa.scale, qb.scale)
    r = EMAScaling(E4)
    for i in range(6):
        r(torch.ones(4, 4, device=device) * (1 + 0.01 * i))
        assert not r.anomaly
    r(torch.ones(4, 4, device=device) * 50)
    assert r.anomaly and int(r.monitor.anomalies) == 1


def test_ema_scaling_follows_its_average(device):
    r = EMAScaling(I8, smoothing=0.5, safety_margin=1.0)
    r(torch.full((2, 2), 4.0, device=device))
    q = r(torch.full((2, 2), 2.0, device=device))  # cast with the scale of amax 4
    assert float(q.scale) == pytest.approx(4.0 / 127, rel=1e-6)
    assert float(r.ema_amax) == pytest.approx(3.0)


# ---- choosers --------------------------------------------------------------------------------


def test_choose_bits(device):
    x = torch.randn(32, 64, device=device)
    c = choose_bits(x, 40.0, "row")
    assert c.met and c.bits == 8 and c.symmetric  # Gaussian rows need 8 bits for 40 dB
    u = torch.rand(32, 64, device=device)  # all positive: asymmetric codes win
    c = choose_bits(u, 30.0, "row")
    assert c.met and not c.symmetric and c.bits < 8
    assert c.sqnr_db >= 30 and all(s < 30 for b, _, s in c.tried if b < c.bits)
    c = choose_bits(u, 20.0, "row")
    assert c.bits == 4 and c.quantized.data.dtype == torch.uint8  # packed
    assert c.quantized.data.shape == (32, 32)
    c = choose_bits(x, 200.0)
    assert not c.met and c.bits == 8


def test_choose_group_size(device):
    g = torch.Generator().manual_seed(0)
    base = torch.randn(16, 64, generator=g)
    samples = [(base * (1 + 0.3 * i)).to(device) for i in range(4)]
    c = choose_group_size(samples, E4, clip_target=0.01)
    ratios = [c.clip_ratio[k] for k in sorted(c.clip_ratio)]
    assert ratios == sorted(ratios, reverse=True)  # bigger groups clip less here
    assert c.met and c.clip_ratio[c.group_size] <= 0.01
    assert all(c.clip_ratio[k] > 0.01 for k in c.clip_ratio if k < c.group_size)
    c = choose_group_size(samples, E4, clip_target=0.0)
    assert not c.met and c.group_size == 64
    with pytest.raises(ValueError, match="at least 2 samples"):
        choose_group_size(samples[:1])


def test_choose_format(device):
    g = torch.Generator().manual_seed(0)
    narrow = torch.randn(64, 64, generator=g).to(device)
    wide = torch.randn(64, 64, generator=g) * torch.exp(torch.randn(64, 64, generator=g) * 4)
    assert choose_format([narrow]).dtype == E4
    c = choose_format([wide.to(device)])
    assert c.dtype == E5 and c.measured["float8_e4m3fn"]["underflow"] > 0.01


# ---- layers ----------------------------------------------------------------------------------


def _deq(x, dtype, block, pow2=False):
    fmt = get_format(dtype)
    codes, scale, zp = R.quantize(x.detach().cpu(), fmt, block, pow2)
    return R.dequantize(codes, scale, zp, block, torch.float64)


def _rel(a, b):
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm())


def _assert_fp8_gemm(out, a, b, dtype, device, bias=None):
    """``out`` is the FP8 GEMM ``a @ b (+ bias)`` of dequantized operands (float64, on the CPU).

    float32 out: on the interpreter the products (exact) are summed in fp32, so out is within
    float32's accumulation error, far below 1e-6 relative. On a GPU's FP8 tensor cores
    (Hopper) the sum of a K block is kept in an accumulator of about 14 significant bits that
    truncates, between promotions to fp32: each element is then within a few 2**-14 of
    sum_k |a_ik b_kj| (the bound of test_matmul's test_scaled_matmul), where one wrong code
    would cost about 2**-4 |a_ik b_kj| and a wrong scale all of it. float16 out: its rounding,
    2**-11 of each element, dominates.
    """
    ref = a @ b if bias is None else a @ b + bias
    if dtype == torch.float32 and device.type == "cuda":
        bound = 2.0**-10 * (a.abs() @ b.abs())
        assert ((out.detach().double().cpu() - ref).abs() <= bound).all()
    else:
        assert _rel(out, ref) < (1e-6 if dtype == torch.float32 else 2e-3)


@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_float8_linear_forward_backward(scaling, dtype, device):
    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 40, device=device, dtype=dtype)
    f = Float8Linear.from_float(lin, scaling)
    x = torch.randn(3, 7, 48, device=device, dtype=dtype, requires_grad=True)
    y = f(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    x2, w, d2 = x.detach().reshape(21, 48), lin.weight.detach(), dy.reshape(21, 40)
    m, k, n = 21, 48, 40
    if scaling == "tensorwise":
        xh, wh = _deq(x2, E4, (m, k)), _deq(w, E4, (n, k))
        gh = gx = _deq(d2, E5, (m, n))
        gw, wx, xw = gh.t(), wh, xh
    else:
        xh, wh = _deq(x2, E4, (1, k), True), _deq(w, E4, (1, k), True)
        gx, wx = _deq(d2, E4, (1, n), True), _deq(w, E4, (n, 1), True)
        gw, xw = _deq(d2, E4, (m, 1), True).t(), _deq(x2, E4, (m, 1), True)
    bias = lin.bias.detach().double().cpu()
    _assert_fp8_gemm(y.reshape(m, n), xh, wh.t(), dtype, device, bias)
    _assert_fp8_gemm(x.grad.reshape(m, k), gx, wx, dtype, device)
    _assert_fp8_gemm(lin.weight.grad, gw, xw, dtype, device)
    assert _rel(lin.bias.grad, d2.double().sum(0)) < (1e-6 if dtype == torch.float32 else 2e-3)
    assert y.dtype == dtype and lin.weight.grad.dtype == dtype


@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise"])
def test_float8_linear_inference_keeps_the_weight_codes(scaling, device, monkeypatch):
    """Without gradients the weight is cast once and its codes kept; an in-place update (an
    optimizer step), another weight tensor or train()/eval() cast it again. The output is the
    forward's with gradients, bit for bit."""
    import tritonkit.nn.quantized as nq

    casts = []
    real = nq.float8_weight

    def counting(w, s):
        casts.append(s)
        return real(w, s)

    monkeypatch.setattr(nq, "float8_weight", counting)  # counts the casts, changes nothing
    torch.manual_seed(5)
    f = Float8Linear(70, 33, device=device, scaling=scaling)
    x = torch.randn(3, 70, device=device)
    opt = torch.optim.SGD(f.parameters(), lr=0.5)
    for step in range(2):
        y_grad = f(x)  # with gradients: the training forward, which casts the weight itself
        assert len(casts) == step
        with torch.no_grad():
            y1, y2 = f(x), f(x)
        assert len(casts) == step + 1  # cast once for both calls
        assert torch.equal(y1, y2) and torch.equal(y1, y_grad.detach())
        y_grad.square().sum().backward()
        opt.step()  # in place: the weight's version moves on
        opt.zero_grad()
    with torch.no_grad():
        f(x)
        assert len(casts) == 3
        f.weight = torch.nn.Parameter(f.weight.detach() * 2)  # another tensor
        y = f(x)
        assert len(casts) == 4
        f.eval()
        assert torch.equal(f(x), y) and len(casts) == 5  # eval() forgot the codes
        f(x)
        assert len(casts) == 5
    expected = _deq(x, E4, (3, 70) if scaling == "tensorwise" else (1, 70), scaling == "rowwise")
    w_hat = _deq(f.weight.detach(), E4, (33, 70) if scaling == "tensorwise" else (1, 70),
                 scaling == "rowwise")  # fmt: skip
    bias = f.bias.detach().double().cpu()
    _assert_fp8_gemm(y, expected, w_hat.t(), torch.float32, device, bias)


def test_float8_linear_compiles(device):
    f = Float8Linear(32, 24, device=device, scaling="rowwise")
    x = torch.randn(10, 32, device=device, requires_grad=True)
    y = f(x)
    compiled = torch.compile(f, fullgraph=True, backend=compile_backend(device))
    yc = compiled(x)
    assert torch.equal(y, yc)
    yc.sum().backward()
    assert x.grad is not None and f.weight.grad is not None


@pytest.mark.parametrize("mode", ["w8a8", "weight_only"])
def test_int8_linear_compiles(mode, device):
    lin = torch.nn.Linear(32, 24, device=device)
    m = Int8Linear.from_float(lin, mode)
    x = torch.randn(5, 32, device=device)
    compiled = torch.compile(m, fullgraph=True, backend=compile_backend(device))
    assert torch.equal(compiled(x), m(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_int8_linear(dtype, device):
    torch.manual_seed(1)
    lin = torch.nn.Linear(64, 48, device=device, dtype=dtype)
    x = torch.randn(2, 5, 64, device=device, dtype=dtype)
    x2 = x.reshape(10, 64)
    w = lin.weight.detach()
    wq = quantize(w, I8, "row")
    tol = 1e-6 if dtype == torch.float32 else 2e-3
    # W8A8: exact int32 products, both scales applied, then the bias.
    m = Int8Linear.from_float(lin, "w8a8")
    xq = quantize(x2, I8, "row")
    exact = xq.data.double().cpu() @ wq.data.double().cpu().t()
    ref = exact * xq.scale.double().cpu() * wq.scale.double().cpu().t()
    ref += lin.bias.detach().double().cpu()
    assert _rel(m(x).reshape(10, 48), ref) < tol
    # weight-only: x against the dequantized weight
    m = Int8Linear.from_float(lin, "weight_only")
    ref = x2.double().cpu() @ _deq(w, I8, (1, 64)).t() + lin.bias.detach().double().cpu()
    assert _rel(m(x).reshape(10, 48), ref) < tol


def test_int8_weight_only_split_k(device):
    """Decode-sized x with K splits summed in a fixed order."""
    from tritonkit.ops.quant.config import WeightOnlyConfig
    from tritonkit.ops.quant.plan import weight_only_fwd

    x = torch.randn(3, 512, device=device)
    w = torch.randint(-127, 128, (72, 512), dtype=torch.int8, device=device)
    s = torch.rand(72, device=device)
    ref = (x.double() @ w.double().t()) * s.double()
    for cfg in (WeightOnlyConfig(16, 32, 64, 1), WeightOnlyConfig(16, 64, 128, 4)):
        assert _rel(weight_only_fwd(x, w, s, None, cfg), ref) < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_int8_weight_only_decode(dtype, device):
    """1 to 17 rows of x (the tiled kernel at every M): against the float64 product with the
    dequantized weight, odd K and N, strided x, a bias, an (N, 1) scale (Int8Linear's buffer),
    through the layer too."""
    from tritonkit.ops.quant.plan import weight_only_fwd

    gen = torch.Generator(device=device).manual_seed(6)
    k, n = 333, 45
    w = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8, device=device)
    s = torch.rand(n, 1, generator=gen, device=device) / (127 * k**0.5)
    b = torch.randn(n, generator=gen, device=device).to(dtype)
    tol = 1e-6 if dtype == torch.float32 else 2e-3
    for m in (1, 2, 7, 16, 17):
        x = torch.randn(m, 2 * k, generator=gen, device=device).to(dtype)[:, 1::2]
        ref = (x.double() @ w.double().t()) * s.double().t() + b.double()
        assert _rel(weight_only_fwd(x, w, s, b), ref) < tol, m
        assert _rel(weight_only_fwd(x, w, s.reshape(-1), b), ref) < tol, m
    lin = torch.nn.Linear(k, n, device=device, dtype=dtype)
    layer = Int8Linear.from_float(lin, "weight_only")
    x = torch.randn(2, 3, k, generator=gen, device=device).to(dtype)
    w_hat = layer.weight_int8.double() * layer.weight_scale.double()
    ref = x.double() @ w_hat.t() + lin.bias.double()
    with torch.no_grad():
        assert _rel(layer(x), ref) < tol
    assert _rel(layer(x), ref) < tol  # grad mode on, nothing requires a gradient


def test_shipped_weight_only_rows_read_as_the_h200_reads_them():
    """The int8 weight-only winners measured on the H200 (tuned/nvidia-h200/quant.json), looked
    up as ``_config`` does there (its profile in the key): each is one of the tiled kernel's
    candidates for the H200's 132 SMs, so the tuner takes it without timing."""
    import triton

    from tritonkit import _hardware, _tuning
    from tritonkit.ops.quant.config import WeightOnlyConfig, _candidates

    machine = ("NVIDIA H200", triton.__version__)
    try:
        _hardware.set_active(_hardware.match(machine[0]))
        for n, k in ((8192, 8192), (14336, 4096)):
            for m in (1, 4, 16):
                key = {"m": m, "n": n, "k": k, "dtype": str(torch.bfloat16)}
                cfg = _tuning.shipped_lookup("int8_weight_only", key, machine=machine)
                assert cfg is not None, (n, k, m)
                assert WeightOnlyConfig.from_tuning(cfg) in _candidates(m, n, k, 132)
            other = {"m": 32, "n": n, "k": k, "dtype": str(torch.bfloat16)}
            assert _tuning.shipped_lookup("int8_weight_only", other, machine=machine) is None
    finally:
        _hardware.set_active(None)


def test_small_tensor_quantize_in_one_pass_matches_two(device):
    """One scale for a small tensor: one launch whose programs each take the amax of the whole
    tensor, bit for bit the two passes' codes, scale and amax (here with many programs)."""
    from tritonkit.ops.quant import config as qconfig
    from tritonkit.ops.quant import kernels_twopass as qk
    from tritonkit.ops.quant import plan as qplan
    from tritonkit.ops.quant.config import SMALL_TENSOR, SmallTensorConfig
    from tritonkit.ops.quant.plan import quantize_tensor_small

    x = _randn((37, 96), torch.bfloat16, device, seed=21)
    x[3, 5], x[7, 1] = float("inf"), float("nan")
    emulate = INTERPRETED
    for dtype in (E4, E5, I8):
        fmt = get_format(dtype)
        for pow2 in (False, True):
            q1 = torch.empty(x.shape, dtype=fmt.storage, device=device)
            s1 = torch.empty((), device=device)
            a1 = torch.empty((), device=device)
            cfg = SmallTensorConfig(block=256, num_warps=4)
            quantize_tensor_small(x, q1, s1, a1, fmt, pow2, emulate, cfg)
            q2 = torch.empty_like(q1)
            s2 = torch.empty((1,), device=device)
            hi = torch.zeros((1,), device=device)
            qplan.amax_pass(x, hi, None, qk.TENSOR, 1, qconfig.ROW_MAJOR_TILES)
            qplan.cast_pass(
                x, q2, None, hi, None, s2, None, None, qk.TENSOR, qk.FROM_AMAX, 1, fmt,
                pow2, emulate, qconfig.ROW_MAJOR_TILES,
            )  # fmt: skip
            assert torch.equal(_bits(q1), _bits(q2)), (dtype, pow2)
            assert torch.equal(s1.reshape(1), s2) and torch.equal(a1.reshape(1), hi)
    # quantize() takes it for a contiguous tensor, the two passes for a strided view
    assert SMALL_TENSOR.takes(x, get_format(E4)) and not SMALL_TENSOR.takes(x.t(), get_format(E4))
    q, qt = quantize(x, E4, "tensor"), quantize(x.t().contiguous().t(), E4, "tensor")
    assert torch.equal(_bits(q.data), _bits(qt.data)) and torch.equal(q.scale, qt.scale)
    _assert_exact(x, q)


def test_convert_and_calibrate(device):
    torch.manual_seed(2)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)
    ).to(device)
    data = [torch.randn(6, 16, device=device) for _ in range(3)]
    ref = model(data[0])
    convert(model, "int8_w8a8", filter=lambda name, m: name != "2")
    assert isinstance(model[0], Int8Linear) and type(model[2]) is torch.nn.Linear
    ranges = calibrate(model, data)
    amax = max(float(d.abs().max()) for d in data)
    assert ranges["0"]["amax"] == pytest.approx(amax)
    assert float(model[0].input_scale) == pytest.approx(amax / 127, rel=1e-6)
    assert _rel(model(data[0]), ref) < 0.05
    model2 = convert(torch.nn.Sequential(torch.nn.Linear(8, 8)).to(device), "float8_rowwise")
    assert isinstance(model2[0], Float8Linear) and model2[0].scaling == "rowwise"
    with pytest.raises(ValueError, match="recipe must be one of"):
        convert(model, "int3")


def test_quantize_compiles(device):
    def fn(x):
        q = quantize(x, E4, "group", group_size=8)
        return dequantize(q, torch.float32), q.scale

    x = torch.randn(6, 16, device=device)
    out, scale = torch.compile(fn, fullgraph=True, backend=compile_backend(device))(x)
    ref_out, ref_scale = fn(x)
    assert torch.equal(out, ref_out) and torch.equal(scale, ref_scale)


# ---- quant-report ----------------------------------------------------------------------------


def test_quant_report(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(tritonkit.__file__).parents[1])}
    trend = tmp_path / "trend.json"
    history = [{"source": "demo-mlp", "recipe": "int8_w8a8", "date": "", "device": "",
                "p99": {"0": 1e-9, "2": 1e9, "4": 1e9}, "output_sqnr_db": 0}]  # fmt: skip
    trend.write_text(json.dumps(history))
    cmd = [sys.executable, "-m", "tritonkit", "quant-report", "--recipe", "int8_w8a8",
           "--out", str(tmp_path / "r"), "--trend", str(trend), "--fail-on-alarm"]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 1, res.stderr[-2000:]  # layer "0" regressed against 1e-9
    doc = json.loads((tmp_path / "r" / "report.json").read_text())
    assert [a.split(":")[0] for a in doc["alarms"]] == ["0"]
    assert {r["layer"] for r in doc["report"]["layers"]} == {"0", "2", "4"}
    assert doc["report"]["output"]["sqnr_db"] > 20
    for f in ("report.md", "sqnr.png", "error.png"):
        assert (tmp_path / "r" / f).stat().st_size > 0
    assert len(json.loads(trend.read_text())) == 2
