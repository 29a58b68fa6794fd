"""Matmul family: accuracy through the check engine, semantics, layouts, variants, TMA and
split-K paths, FP8/INT8, bad inputs, nn.Linear, autograd and torch.compile.

Under the CPU interpreter ``tl.dot`` on bfloat16 operands is wrong (fp16 and fp32 are right):
the kernels upcast bfloat16 operands to fp32 there (``UPCAST``), so every dtype each public
GEMM accepts is checked on the CPU too.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tritonkit import _tuning
from tritonkit.nn.linear import Linear
from tritonkit.ops import matmul as mm
from tritonkit.ops._core.device import interpreter_enabled
from tritonkit.ops._core.gemm import (
    NO_EPILOGUE,
    Epilogue,
    Problem,
    layout_flags,
    matrix,
    size_class,
    tf32_enabled,
)
from tritonkit.ops._core.layout import LAYOUT_COPIES
from tritonkit.ops._core.plan import PLANS
from tritonkit.ops.matmul import (
    GEMM_OPTIONS,
    VARIANTS,
    GemmOptions,
    LinearFunction,
    MatmulConfig,
    int8_matmul,
    linear,
    linear_plan,
    matmul,
    matmul_fwd,
    matmul_plan,
    matmul_problem,
    matmul_variant,
    scaled_matmul,
    scaled_matmul_fwd,
    scaled_matmul_plan,
    split_k_for,
)
from tritonkit.ops.matmul import configs as C
from tritonkit.ops.matmul import plan as P
from tritonkit.ops.matmul.decode import DecodeGemmConfig
from tritonkit.ops.matmul.ieee import fma_copies_b
from tritonkit.ops.matmul.plan import DecodeGemmLaunch, decode_launch
from tritonkit.ops.matmul.splitk import MIN_CHUNK

from _checks import assert_spec_passes, compile_backend, saved_tensors

INTERPRETED = interpreter_enabled()


def _ref(a, b):
    return (a.double() @ b.double()).to(a.dtype)


def _close(out, ref, dtype=None):
    dtype = dtype or out.dtype
    tol = {torch.float32: (1e-5, 1e-4), torch.float16: (1e-3, 1e-3), torch.bfloat16: (8e-3, 1e-2)}
    rtol, atol = tol[dtype]
    torch.testing.assert_close(out.double(), ref.double(), rtol=rtol, atol=atol)


# ---- the check engine ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["matmul", "linear"])
def test_check_engine_passes(name, dtype, device):
    """Every shape x params: random, non-contiguous, NaN/inf, gradients, empty."""
    assert_spec_passes(name, device, dtypes=(dtype,))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["scaled_matmul", "int8_matmul"])
def test_low_precision_specs_pass_the_check_engine(name, device):
    assert_spec_passes(name, device)


# ---- every dtype each public GEMM accepts (issue 31) -----------------------------------------


def _rel(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_every_float_dtype_is_correct_on_every_path(dtype, device):
    """matmul and linear in each dtype they accept, along every path (the variants, split-K,
    TMA under the interpreter), within the dtype's rounding of float64: never garbage. Under
    the CPU interpreter tl.dot on bfloat16 operands gives relative errors near 1e10 unless the
    kernels upcast the operands (UPCAST)."""
    bound = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}[dtype]
    gen = torch.Generator(device=device).manual_seed(31)
    a = torch.randn(67, 144, generator=gen, device=device).to(dtype)
    w = torch.randn(48, 144, generator=gen, device=device).to(dtype)
    bias = torch.randn(48, generator=gen, device=device).to(dtype)
    ref = a.double() @ w.double().t()
    for path in ("best", *VARIANTS):
        assert _rel(matmul_fwd(a, w.t(), path=path), ref) < bound, path
    assert _rel(matmul(a, w.t()), ref) < bound
    split = MatmulConfig.of(16, 32, 32, SPLIT_K=3)
    assert _rel(matmul_fwd(a, w.t(), config=split), ref) < bound
    if INTERPRETED:
        opts = GemmOptions(interpreter_tma=True)
        tma = MatmulConfig.of(32, 32, 16, persistent=True, tma=True)
        assert matmul_plan(a, w.t(), config=tma, options=opts).gemm.use_tma
        assert _rel(matmul_fwd(a, w.t(), config=tma, options=opts), ref) < bound
    want = F.gelu(ref + bias.double())
    assert _rel(linear(a, w, bias, "gelu"), want) < bound


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.int8])
def test_every_low_precision_dtype_is_correct(dtype, out_dtype, device):
    """scaled_matmul (FP8) and int8_matmul in every operand and output dtype they accept."""
    gen = torch.Generator(device=device).manual_seed(31)
    if dtype == torch.int8:
        a = torch.randint(-128, 128, (67, 144), generator=gen, device=device, dtype=dtype)
        b = torch.randint(-128, 128, (48, 144), generator=gen, device=device, dtype=dtype).t()
    else:
        a = torch.randn(67, 144, generator=gen, device=device).to(dtype)
        b = torch.randn(48, 144, generator=gen, device=device).to(dtype).t()
    sa = torch.rand(67, 1, generator=gen, device=device) + 0.5
    sb = torch.rand(1, 48, generator=gen, device=device) + 0.5
    if dtype == torch.int8:
        sa = sa / 4096  # int8 products reach 2**21: within float16's range once dequantised
    ref = (a.double() @ b.double()) * sa.double() * sb.double()
    if dtype == torch.int8:
        out = int8_matmul(a, b, sa, sb, out_dtype=out_dtype)
        assert torch.equal(int8_matmul(a, b), (a.double() @ b.double()).to(torch.int32))
    else:
        out = scaled_matmul(a, b, sa, sb, out_dtype=out_dtype)
    assert out.dtype == out_dtype
    assert _rel(out, ref) < (1e-2 if out_dtype == torch.bfloat16 else 2e-3)


# ---- semantics and layouts (acceptance 5) -------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    "a_shape, b_shape",
    [
        ((1, 1), (1, 1)),
        ((17, 65), (65, 33)),  # K = 65: not a multiple of any BLOCK_K
        ((2, 1, 5, 7), (3, 7, 4)),  # batch broadcast on both sides
        ((5, 7), (3, 7, 4)),  # a 2-D a against a batched b
        ((4, 6, 9), (9, 5)),  # batched a, 2-D b: folded into one GEMM
        ((7,), (7, 5)),
        ((6, 7), (7,)),
        ((7,), (7,)),
        ((2, 3, 4, 5, 6), (3, 1, 6, 2)),  # three batch dimensions
    ],
)
def test_matmul_matches_torch(a_shape, b_shape, dtype, device):
    a = torch.randn(a_shape, device=device).to(dtype)
    b = torch.randn(b_shape, device=device).to(dtype)
    out = matmul(a, b)
    expected = torch.matmul(a, b)
    assert out.shape == expected.shape and out.dtype == dtype and out.is_contiguous()
    _close(out, _ref(a, b))


@pytest.mark.parametrize(
    "layout",
    ["transposed a", "transposed b", "both transposed", "sliced", "strided", "batched transposed"],
)
def test_any_strides_without_copies(layout, device):
    if layout == "transposed a":
        a, b = torch.randn(70, 40, device=device).t(), torch.randn(70, 50, device=device)
    elif layout == "transposed b":
        a, b = torch.randn(40, 70, device=device), torch.randn(50, 70, device=device).t()
    elif layout == "both transposed":
        a, b = torch.randn(70, 40, device=device).t(), torch.randn(50, 70, device=device).t()
    elif layout == "sliced":
        a = torch.randn(50, 90, device=device)[5:45, 3:73]
        b = torch.randn(80, 60, device=device)[:70, 10:]
    elif layout == "strided":
        a = torch.randn(40, 140, device=device)[:, ::2]
        b = torch.randn(70, 100, device=device)[:, ::2]
    else:
        a = torch.randn(3, 70, 40, device=device).transpose(1, 2)
        b = torch.randn(3, 50, 70, device=device).transpose(1, 2)
    LAYOUT_COPIES.reset()
    out = matmul(a, b)
    assert LAYOUT_COPIES.reset() == 0
    _close(out, _ref(a, b))


def test_batch_dimensions_beyond_two_strides_are_copied_and_counted(device):
    # batch strides (120, 360, 30): no two of the three dimensions merge
    a = torch.randn(2, 3, 4, 5, 6, device=device).permute(1, 0, 2, 3, 4)
    b = torch.randn(6, 2, device=device).expand(3, 1, 4, 6, 2)
    LAYOUT_COPIES.reset()
    out = matmul(a, b)
    assert LAYOUT_COPIES.reset() > 0
    _close(out, _ref(a, b))


def test_empty_shapes(device):
    a, b = torch.randn(4, 0, device=device), torch.randn(0, 3, device=device)
    out = matmul(a, b)  # K = 0: a sum of nothing
    assert out.shape == (4, 3) and torch.equal(out, torch.zeros(4, 3, device=device))
    assert matmul(torch.randn(0, 5, device=device), torch.randn(5, 3, device=device)).shape == (
        0,
        3,
    )
    assert matmul(torch.randn(2, 0, 5, device=device), torch.randn(5, 3, device=device)).shape == (
        2,
        0,
        3,
    )
    x, w = torch.randn(3, 0, device=device), torch.randn(4, 0, device=device)
    bias, r = torch.randn(4, device=device), torch.randn(3, 4, device=device)
    out = linear(x, w, bias, "silu", r)  # K = 0: the epilogue still applies
    torch.testing.assert_close(out, F.silu(bias).expand(3, 4) + r)


def test_tf32_follows_pytorch_settings():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert not tf32_enabled()
        assert C.operand_class(torch.float32) == "ieee"
        torch.set_float32_matmul_precision("high")
        assert tf32_enabled()
        assert C.operand_class(torch.float32) == "tf32"
    finally:
        torch.set_float32_matmul_precision(before)


def test_fp32_k_major_b_is_copied_row_major_for_the_cuda_cores(device):
    """IEEE fp32 with a K-major B (w.t(), F.linear's weight) copies B row-major from
    GemmOptions.fma_copy_min_mnk on, counted; results match float64; nothing else is copied."""
    opts = GemmOptions(fma_copy_min_mnk=1)
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        a, w = torch.randn(37, 72, device=device), torch.randn(48, 72, device=device)
        bias = torch.randn(48, device=device)
        plan = lambda a, b: matmul_problem(a, b, torch.float32)[0]  # noqa: E731
        assert fma_copies_b(plan(a, w.t()), opts)
        assert fma_copies_b(plan(a[:, :64], w[:, :64].t()), opts)  # a sliced weight: stride 72
        assert not fma_copies_b(plan(a, w.t().contiguous()), opts)  # already row-major
        assert not fma_copies_b(plan(a.half(), w.half().t()), opts)  # tensor cores
        assert not fma_copies_b(plan(a[None].expand(2, 37, 72), w.t()), opts)  # a batch
        assert matmul_plan(a, w.t(), options=opts).gemm.copies == (None, "rows")
        LAYOUT_COPIES.reset()
        _close(matmul_fwd(a, w.t(), options=opts), _ref(a, w.t()))
        sliced = matmul_fwd(a[:, :64], w[:, :64].t(), options=opts)
        _close(sliced, _ref(a[:, :64], w[:, :64].t()))
        ref = F.silu(F.linear(a.double(), w.double(), bias.double()))
        _close(LinearFunction.apply(a, w, bias, None, "silu", opts), ref)
        assert LAYOUT_COPIES.reset() == 3
        _close(matmul_fwd(a, w.t().contiguous(), options=opts), _ref(a, w.t()))
        assert LAYOUT_COPIES.reset() == 0
        torch.set_float32_matmul_precision("high")  # TF32: wgmma reads K-major B as it is
        assert not fma_copies_b(plan(a, w.t()), opts)
    finally:
        torch.set_float32_matmul_precision(before)
    # Below the threshold (the default, 512^3) nothing is copied.
    assert GEMM_OPTIONS.fma_copy_min_mnk > 37 * 48 * 72
    assert not fma_copies_b(matmul_problem(a, w.t(), torch.float32)[0])


# ---- variants, TMA, split-K, configs ------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_variants_agree_with_torch(variant, dtype, device):
    a = torch.randn(37, 70, device=device).to(dtype)
    b = torch.randn(70, 45, device=device).to(dtype)
    _close(matmul_variant(a, b, variant), _ref(a, b))
    batched = torch.randn(2, 9, 70, device=device).to(dtype)
    _close(matmul_variant(batched, b, variant), _ref(batched, b))


def test_naive_variant_in_bfloat16(device):
    """The CUDA-core v0 has no tl.dot, so bf16 runs even under the interpreter."""
    a = torch.randn(37, 70, device=device).to(torch.bfloat16)
    b = torch.randn(70, 45, device=device).to(torch.bfloat16)
    _close(matmul_variant(a, b, "naive"), _ref(a, b))


# Compiles the matmul kernel for sm_90 without a GPU through experiments/ptxas_report.py (which
# unsets TRITON_INTERPRET before importing triton) and prints whether its PTX has tensor-core
# MMAs. A fresh process: this one decorated the kernels for the interpreter.
_PTX_PROBE = """
import sys
sys.path.insert(0, sys.argv[3])
from ptxas_report import compile_case
from tritonkit.ops.matmul import configs
from tritonkit.ops.matmul.tiled import matmul_tile_kernel

cfg = getattr(configs, sys.argv[1])
unused = ("ws_ptr", "a_desc", "b_desc", "c_desc", "scale_a_ptr", "scale_b_ptr", "bias_ptr",
          "res_ptr", "z_ptr")
flags = dict.fromkeys(unused)
flags.update(
    USE_TMA=False, DEVICE_DESC=False, A_T=False, B_T=False, EPILOGUE_SUBTILE=False, SPLIT_K=1,
    DOT=cfg.dot, INPUT_PRECISION="ieee" if cfg.dot else None, MAX_IMPRECISE=None,
    PROMOTE_BLOCKS=1, UPCAST=False, ACC_INT=False, EVEN_K=True, INT64=False, FLOAT_OUT=True,
    SCALE_A=False, SCALE_B=False, HAS_BIAS=False, ACT=0, HAS_RES=False, STORE_Z=False,
    BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M,
)
ptrs = dict.fromkeys(("a_ptr", "b_ptr", "c_ptr"), "*" + sys.argv[2])
kernel = compile_case(matmul_tile_kernel, ptrs, flags, cfg.num_warps)
print("mma" in kernel.asm["ptx"])
"""


def _has_mma(config_name: str, dtype: str) -> bool:
    bench = Path(__file__).parents[1] / "experiments"
    run = subprocess.run(
        [sys.executable, "-c", _PTX_PROBE, config_name, dtype, str(bench)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.split()[-1] == "True"


@pytest.mark.slow
def test_naive_variant_compiles_to_cuda_core_fmas():
    """Triton's combine pass rewrites sum(a[:, :, None] * b[None, :, :], 1) into tl.dot, which
    made the fp32 v0 a tf32 tensor-core kernel on the GPU (errors of 1e-2). Compiled for sm_90
    offline: the naive step has no MMA; the tiled step, the control, has one."""
    assert not _has_mma("NAIVE", "fp32")
    assert _has_mma("TILED", "fp16")


def test_variants_share_one_kernel():
    """The evolution is one kernel at different constexprs, each step adding one idea."""
    assert not C.NAIVE.dot and C.TILED.dot
    assert (C.TILED.BLOCK_M, C.TILED.BLOCK_N, C.TILED.BLOCK_K) == (
        C.PIPELINED.BLOCK_M,
        C.PIPELINED.BLOCK_N,
        C.PIPELINED.BLOCK_K,
    )
    assert C.TILED.num_stages == 1 < C.PIPELINED.num_stages
    tuned = C.candidates("autotuned", "16bit", tma=False, m=4096, split=1)
    persistent = C.candidates("persistent", "16bit", tma=True, m=4096, split=1)
    assert all(c.GROUP_M > 1 and not c.persistent for c in tuned)
    assert all(c.persistent and c.tma for c in persistent)


@pytest.fixture(params=["device", "host"], ids=["device descriptors", "host descriptors"])
def tma_in_interpreter(request):
    """Options that take the TMA path under the interpreter, with each place descriptors are
    made (both run on the GPU as they do here)."""
    if not INTERPRETED:
        pytest.skip("forces the TMA path under the interpreter")
    return GemmOptions(interpreter_tma=True, descriptors=request.param)


@pytest.mark.parametrize("a_t", [False, True], ids=["a row-major", "a col-major"])
@pytest.mark.parametrize("b_t", [False, True], ids=["b row-major", "b col-major"])
@pytest.mark.parametrize(
    "config",
    [
        MatmulConfig.of(32, 32, 16, GROUP_M=2, persistent=True, tma=True),
        MatmulConfig.of(32, 64, 16, tma=True, subtile=True),
        MatmulConfig.of(16, 32, 32, persistent=True, tma=True, SPLIT_K=2),
    ],
    ids=["persistent", "subtile", "split-k"],
)
def test_tma_path_every_layout(config, a_t, b_t, tma_in_interpreter, device):
    a = torch.randn(40, 72, device=device).half()
    b = torch.randn(72, 48, device=device).half()
    a_in = a.t().contiguous().t() if a_t else a
    b_in = b.t().contiguous().t() if b_t else b
    opts = tma_in_interpreter
    p, _, _ = matmul_problem(a_in, b_in, torch.float16)
    assert P.tma_ok(p, opts) and layout_flags(p) == (a_t, b_t)
    assert matmul_plan(a_in, b_in, config=config, options=opts).gemm.use_tma
    _close(matmul_fwd(a_in, b_in, config=config, options=opts), _ref(a, b))


def test_tma_falls_back_where_it_cannot_read(tma_in_interpreter, device):
    opts = tma_in_interpreter
    a = torch.randn(40, 65, device=device).half()  # 130-byte rows: not 16-byte aligned
    b = torch.randn(65, 48, device=device).half()
    problem = lambda a, b, dtype: matmul_problem(a, b, dtype)[0]  # noqa: E731
    assert not P.tma_ok(problem(a, b, torch.float16), opts)
    config = MatmulConfig.of(32, 32, 16, persistent=True, tma=True)
    assert not matmul_plan(a, b, config=config, options=opts).gemm.use_tma
    _close(matmul_fwd(a, b, config=config, options=opts), _ref(a, b))
    # 8-bit and fp32 operands must be K-major for wgmma: a transposed fp32 b goes through TMA,
    # a row-major one takes the pointer path.
    af, bf = torch.randn(40, 64, device=device), torch.randn(48, 64, device=device)
    assert P.tma_ok(problem(af, bf.t(), torch.float32), opts)
    assert not P.tma_ok(problem(af, bf.t().contiguous(), torch.float32), opts)
    # batches and tiny problems take the pointer path too
    assert not P.tma_ok(problem(a[None].expand(2, 40, 65), b, torch.float16), opts)


def test_split_k_heuristic():
    sms = 132
    # Skinny: few output tiles, long K: split until one wave of programs.
    assert split_k_for(16, 4096, 4096, sms=sms) == 4
    assert split_k_for(64, 1024, 65536, sms=sms) == 16
    assert split_k_for(1, 1, 8192, sms=sms) == 8
    # Enough tiles, short K, or a batch: no split.
    assert split_k_for(8192, 8192, 8192, sms=sms) == 1
    assert split_k_for(16, 4096, 1024, sms=sms) == 1
    assert split_k_for(16, 4096, 4096, n_batch=8, sms=sms) == 1
    assert split_k_for(0, 4096, 4096, sms=sms) == 1
    # Each split keeps at least _SPLITK_MIN_CHUNK of K.
    for m, n, k in [(16, 512, 3000), (32, 256, 2048), (8, 128, 100000)]:
        split = split_k_for(m, n, k, sms=sms)
        assert split == 1 or k // split >= MIN_CHUNK


def test_split_k_is_chosen_for_skinny_shapes_and_correct(device):
    # the schedule of an H200, on any device; 16 rows without the decode kernel
    opts = GemmOptions(sms=132, decode_max_m=0)
    a = torch.randn(16, 4096, device=device)
    b = torch.randn(4096, 64, device=device)
    assert (
        matmul_plan(a, b, options=opts).gemm.config.SPLIT_K
        == split_k_for(16, 64, 4096, sms=132)
        > 1
    )
    # float32 over K = 4096: an element whose products cancel (a small result of large partial
    # sums) can miss a fixed absolute bound; the bound is the GEMM's own, a few ulps of
    # sum |a||b| (a split's tile lost or added would be off by the tile's partial sum, ~10)
    out = matmul_fwd(a, b, options=opts).double()
    bound = 2.0**-20 * (a.abs().double() @ b.abs().double())
    assert ((out - a.double() @ b.double()).abs() <= bound).all()
    # the epilogue runs once, in the reduction pass
    x, w = torch.randn(3, 16, 2048, device=device), torch.randn(24, 2048, device=device) / 45
    bias, r = torch.randn(24, device=device), torch.randn(3, 16, 24, device=device)
    plan = linear_plan(x.view(48, 2048), w, bias, r.view(48, 24), "gelu", False, options=opts)
    assert plan.gemm.config.SPLIT_K > 1
    out = LinearFunction.apply(x, w, bias, r, "gelu", opts)
    torch.testing.assert_close(out, F.gelu(F.linear(x, w, bias)) + r, rtol=1e-4, atol=1e-4)
    # and with the device's own SM count, through the public function
    out = linear(x, w, bias, "gelu", r)
    torch.testing.assert_close(out, F.gelu(F.linear(x, w, bias)) + r, rtol=1e-4, atol=1e-4)


# ---- decode: at most 16 rows -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_decode_linear_forward_and_backward(dtype, device):
    """Every M from 1 to 16 takes the decode kernel (17 does not), with the whole epilogue,
    odd K and N, x read through its strides; the backward's dX (M rows again) too."""
    # relative L2: a few units in the output's last place (fp32: the accumulation's sqrt(K) ulps)
    tol = {torch.float32: 1e-5, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}[dtype]
    gen = torch.Generator(device=device).manual_seed(3)
    k, n = 300, 45
    w = (torch.randn(n, k, device=device, generator=gen) / k**0.5).to(dtype)
    b = torch.randn(n, device=device, generator=gen).to(dtype)
    for m in (1, 2, 5, 11, 16, 17):
        base = torch.randn(m, 2 * k, device=device, generator=gen).to(dtype)
        x = base[:, ::2]  # every other column: a strided view
        r = torch.randn(m, n, device=device, generator=gen).to(dtype)
        plan = linear_plan(x, w, b, r, "gelu_tanh", False)
        assert isinstance(plan.gemm.launch, DecodeGemmLaunch) == (m <= 16), m
        xg, wg = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        y = linear(xg, wg, b, "gelu_tanh", r)
        x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
        ref = F.gelu(F.linear(x64, w64, b.double()), approximate="tanh") + r.double()
        assert (y.double() - ref).norm() <= tol * ref.norm(), m
        dy = torch.randn(m, n, device=device, generator=gen).to(dtype)
        y.backward(dy)
        ref.backward(dy.double())
        for got, want in ((xg.grad, x64.grad), (wg.grad, w64.grad)):
            # dZ = dY * act'(Z) is rounded to the dtype once more on the way (as in PyTorch)
            assert (got.double() - want).norm() <= 2 * tol * want.norm(), m


def test_decode_split_k_sums_in_order_and_applies_the_epilogue_once(device):
    gen = torch.Generator(device=device).manual_seed(4)
    m, n, k = 3, 50, 1000
    x = torch.randn(m, k, device=device, generator=gen)
    w = torch.randn(n, k, device=device, generator=gen) / k**0.5
    b, r = torch.randn(n, device=device, generator=gen), torch.randn(m, n, device=device)
    ref_z = x.double() @ w.double().t() + b.double()
    ref = F.relu(ref_z) + r.double()
    for split in (1, 2, 3, 7):  # 3 and 7 leave a short last split and a partial K block
        y = torch.full((m, n), float("nan"), device=device)
        z = torch.full((m, n), float("nan"), device=device)
        epi = Epilogue(bias=b, activation="relu", residual=r, z=z)
        p = Problem(matrix(x), matrix(w.t()), matrix(y), m, n, k)
        launch = decode_launch(p, epi, DecodeGemmConfig(BLOCK_N=16, BLOCK_K=64, SPLIT_K=split))
        launch(x, w, y, epi.tensors())
        first = y.clone()
        launch(x, w, y, epi.tensors())  # bound once, launched again: the same bits
        assert torch.equal(y, first)
        _close(z, ref_z)
        _close(y, ref)


@pytest.mark.parametrize("m", [1, 6, 16])
def test_decode_low_precision_products(m, device):
    """At most 16 rows, FP8 and INT8 GEMMs take the decode kernel: INT8 exact in int32, FP8
    products exact and summed in fp32 (more accurate than the FP8 tensor cores)."""
    gen = torch.Generator(device=device).manual_seed(m)
    k, n = 200, 40
    a = torch.randint(-128, 128, (m, k), device=device, generator=gen, dtype=torch.int8)
    b = torch.randint(-128, 128, (n, k), device=device, generator=gen, dtype=torch.int8).t()
    plan = scaled_matmul_plan(a, b, None, None, None, torch.int32)
    assert isinstance(plan.gemm.launch, DecodeGemmLaunch)
    assert torch.equal(int8_matmul(a, b), _int_mm_ref(a, b))
    assert torch.equal(int8_matmul(a, b.contiguous()), _int_mm_ref(a, b))  # row-major b
    sb = torch.rand(1, n, device=device, generator=gen)
    _close(int8_matmul(a, b, scale_b=sb, out_dtype=torch.float32), _int_mm_ref(a, b) * sb)
    for a_dtype, b_dtype in [(torch.float8_e4m3fn,) * 2, (torch.float8_e5m2, torch.float8_e4m3fn)]:
        fa = torch.randn(m, k, device=device, generator=gen).to(a_dtype)
        fb = (torch.randn(n, k, device=device, generator=gen) / 4).to(b_dtype).t()
        sa = torch.rand(m, 1, device=device, generator=gen) + 0.5
        one = torch.tensor(0.5, device=device)
        bias = torch.randn(n, device=device, generator=gen)
        out = scaled_matmul(fa, fb, sa, one, torch.float32, bias)
        expected = (fa.double() @ fb.double()) * sa.double() * 0.5 + bias.double()
        assert (out.double() - expected).norm() <= 1e-6 * expected.norm()


def test_decode_configs():
    sms = 132
    cases = [(1, 8192, 8192, 2, 2), (16, 8192, 8192, 2, 2), (1, 8192, 8192, 2, 1),
             (16, 4096, 14336, 2, 1), (8, 8192, 8192, 1, 1), (4, 1024, 8192, 2, 2),
             (16, 64, 4096, 4, 4), (3, 45, 70, 2, 2)]  # fmt: skip
    for m, n, k, a_bytes, b_bytes in cases:
        cfg = DecodeGemmConfig.heuristic(m, n, k, a_bytes, b_bytes, sms)
        programs = -(-n // cfg.BLOCK_N) * cfg.SPLIT_K
        # bands that keep A's reads at half of B's bytes, K blocks of at most 256 bytes of B,
        # a stage within STAGE_BYTES, a program per SM where K can be split
        assert cfg.BLOCK_N * b_bytes >= min(128 * b_bytes, DecodeGemmConfig.A_READS * m * a_bytes)
        assert 16 <= cfg.BLOCK_N <= 128 and cfg.BLOCK_K >= 32 and cfg.BLOCK_K * b_bytes <= 256
        stage = cfg.smem_bytes(a_bytes, b_bytes) // cfg.num_stages
        assert stage <= DecodeGemmConfig.STAGE_BYTES or cfg.BLOCK_K == 32
        assert cfg.fits(k)
        assert (
            programs >= sms
            or cfg.SPLIT_K == DecodeGemmConfig.MAX_SPLIT
            or (k // (2 * cfg.SPLIT_K) < DecodeGemmConfig.MIN_BLOCKS_PER_SPLIT * cfg.BLOCK_K)
        )
        space = DecodeGemmConfig.space(m, n, k, a_bytes, b_bytes, sms)
        assert space[0] == cfg and len(set(space)) == len(space)
        for c in space + cfg.neighbours(k, b_bytes):
            assert c.fits(k) and DecodeGemmConfig.from_tuning(c.tuning()) == c
            assert _tuning.fits_shared_memory(c.smem_bytes(a_bytes, b_bytes))
    # one token against 8192 x 8192 bf16: 512 bands of 16 columns, no split; 16 tokens: 256
    # bands of 32; 16 tokens against int8 4096 x 14336: 64 bands of 64, K split in 4
    assert DecodeGemmConfig.heuristic(1, 8192, 8192, 2, 2, sms) == DecodeGemmConfig(16, 128, 1)
    assert DecodeGemmConfig.heuristic(16, 8192, 8192, 2, 2, sms) == DecodeGemmConfig(32, 128, 1)
    cfg = DecodeGemmConfig.heuristic(16, 4096, 14336, 2, 1, sms)
    assert (cfg.BLOCK_N, cfg.SPLIT_K) == (64, 4)
    # an N-major B (x @ w, w row-major) is loaded along N: bands of 256-byte rows
    cfg = DecodeGemmConfig.heuristic(1, 8192, 8192, 2, 2, sms, b_kmajor=False)
    assert cfg.BLOCK_N == 128 and cfg.SPLIT_K > 1


def test_decode_can_be_turned_off(device):
    a, w = torch.randn(4, 64, device=device), torch.randn(24, 64, device=device)
    on = linear_plan(a, w, None, None, "none", False)
    off = linear_plan(a, w, None, None, "none", False, options=GemmOptions(decode_max_m=0))
    assert isinstance(on.gemm.launch, DecodeGemmLaunch)
    assert isinstance(off.gemm.launch, P.GemmLaunch)
    forced = linear_plan(a, w, None, None, "none", False, config=MatmulConfig.of(16, 32, 32))
    assert isinstance(forced.gemm.launch, P.GemmLaunch)  # a forced config is the tiled kernel
    _close(off.run(a, w, None, None)[0], on.run(a, w, None, None)[0])


def test_sixty_four_bit_offsets(device):
    """The INT64 path (operands of 2**31 elements or more), forced on small tensors."""
    opts = GemmOptions(int64_above=16)
    a = torch.randn(2, 40, 70, device=device).transpose(1, 2)
    b = torch.randn(40, 30, device=device)
    assert matmul_plan(a, b, options=opts).gemm.int64
    assert not matmul_plan(a, b).gemm.int64
    _close(matmul_fwd(a, b, options=opts), _ref(a, b))
    cfg = MatmulConfig.of(16, 32, 32, SPLIT_K=3)
    _close(matmul_fwd(a[0], b, config=cfg, options=opts), _ref(a[0], b))


def test_configs_round_trip_through_the_tuning_cache():
    for cls in ("16bit", "8bit", "fp8", "tf32", "ieee"):
        for kind in ("autotuned", "persistent", "splitk"):
            for cfg in C.candidates(kind, cls, tma=True, m=24, split=4):
                assert MatmulConfig.from_tuning(cfg.tuning()) == cfg


def test_default_configs_fit_shared_memory():
    """The untimed default (tuning off) and the fixed steps must fit the GPU they run on."""
    from tritonkit import _hardware

    sizes = {torch.float16: (2, 2, 2), torch.int8: (1, 1, 4), torch.float32: (4, 4, 4)}
    try:
        for gpu in ("NVIDIA H100 SXM", "NVIDIA A100 80GB"):
            _hardware.set_active(_hardware.KNOWN[gpu])
            for dtype, elems in sizes.items():
                a = torch.zeros(256, 256, dtype=dtype)
                p, _, _ = matmul_problem(a, a, torch.int32 if dtype == torch.int8 else dtype)
                for kind in ("autotuned", "persistent"):
                    cfg = P.tuned(p, NO_EPILOGUE, kind)
                    assert _tuning.fits_shared_memory(cfg.smem_bytes(*elems)), (gpu, dtype, kind)
                for name in ("tiled", "pipelined"):
                    cfg = C.fixed_config(name, elems[0])
                    assert _tuning.fits_shared_memory(cfg.smem_bytes(*elems)), (gpu, dtype, name)
    finally:
        _hardware.set_active(None)


# ---- linear -------------------------------------------------------------------------------------

_ACT = {
    None: lambda z: z,
    "relu": torch.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
    "silu": F.silu,
}


@pytest.mark.slow
@pytest.mark.parametrize("activation", list(_ACT))
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("with_residual", [True, False])
def test_linear_forward_and_backward(activation, with_bias, with_residual, device):
    x = torch.randn(2, 5, 24, device=device, requires_grad=True)
    w = torch.randn(16, 24, device=device, requires_grad=True)
    bias = torch.randn(16, device=device, requires_grad=True) if with_bias else None
    r = torch.randn(2, 5, 16, device=device, requires_grad=True) if with_residual else None
    out = linear(x, w, bias, activation, r)
    expected = _ACT[activation](F.linear(x, w, bias))
    expected = expected + r if r is not None else expected
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    leaves = [t for t in (x, w, bias, r) if t is not None]
    g = torch.randn_like(out)
    for got, want in zip(
        torch.autograd.grad(out, leaves, g), torch.autograd.grad(expected, leaves, g)
    ):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_linear_saves_the_pre_activation_only_when_the_activation_needs_it(device):
    x = torch.randn(6, 8, device=device, requires_grad=True)
    w = torch.randn(5, 8, device=device, requires_grad=True)
    bias = torch.randn(5, device=device, requires_grad=True)
    _, saved = saved_tensors(lambda: linear(x, w, bias, "gelu_tanh"))
    z = [t for t in saved if t.shape == (6, 5)]
    assert len(z) == 1
    torch.testing.assert_close(z[0], x.detach() @ w.detach().t() + bias.detach())
    _, saved = saved_tensors(lambda: linear(x, w, bias))
    assert not [t for t in saved if t.shape == (6, 5)]
    _, saved = saved_tensors(lambda: linear(x.detach(), w.detach(), bias.detach(), "gelu"))
    assert saved == []


def test_linear_relu_gradient_where_product_and_bias_cancel(device):
    """x @ W^T = 0.25 + 2**-13 rounds to 0.25 in fp16; with a bias of -0.25 the pre-activation
    is 2**-13 > 0. Rebuilding it in the backward from the rounded product and the bias gave 0,
    and relu's gradient 0 instead of 1 (seen as a fresh-seed failure of the check engine)."""
    x = torch.tensor([[1.0, 1.0]], device=device, dtype=torch.float16, requires_grad=True)
    w = torch.tensor([[0.25, 2.0**-13]], device=device, dtype=torch.float16, requires_grad=True)
    b = torch.tensor([-0.25], device=device, dtype=torch.float16, requires_grad=True)
    y = linear(x, w, b, "relu")
    assert y.item() == 2.0**-13
    dx, dw, db = torch.autograd.grad(y, (x, w, b), torch.ones_like(y))
    torch.testing.assert_close(dx, w.detach(), rtol=0, atol=0)
    torch.testing.assert_close(dw, x.detach(), rtol=0, atol=0)
    torch.testing.assert_close(db, torch.ones_like(b), rtol=0, atol=0)


def test_linear_only_requested_gradients(device):
    x = torch.randn(6, 8, device=device)
    w = torch.randn(5, 8, device=device, requires_grad=True)
    bias = torch.randn(5, device=device)
    (gw,) = torch.autograd.grad(linear(x, w, bias, "silu").sum(), w)
    (ref,) = torch.autograd.grad(F.silu(F.linear(x, w, bias)).sum(), w)
    torch.testing.assert_close(gw, ref, rtol=1e-5, atol=1e-5)


def test_nn_linear_loads_a_torch_state_dict(device):
    ref = torch.nn.Linear(24, 10).to(device)
    ours = Linear(24, 10, activation="gelu").to(device)
    ours.load_state_dict(ref.state_dict())
    assert ours.state_dict().keys() == ref.state_dict().keys()
    x = torch.randn(3, 4, 24, device=device)
    torch.testing.assert_close(ours(x), F.gelu(ref(x)), rtol=1e-5, atol=1e-5)
    back = torch.nn.Linear(24, 10).to(device)
    back.load_state_dict(ours.state_dict())  # and the other way
    torch.testing.assert_close(back.weight, ref.weight)
    r = torch.randn(3, 4, 10, device=device)
    torch.testing.assert_close(ours(x, r), F.gelu(ref(x)) + r, rtol=1e-5, atol=1e-5)
    plain = Linear.from_linear(ref)
    assert plain.weight is ref.weight
    torch.testing.assert_close(plain(x), ref(x), rtol=1e-5, atol=1e-5)
    no_bias = Linear(24, 10, bias=False)
    assert no_bias.bias is None and "activation=None" in repr(no_bias)
    assert "activation='gelu'" in repr(ours)
    with pytest.raises(ValueError, match="activation must be one of"):
        Linear(3, 4, activation="tanh")


# ---- FP8 and INT8 -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("a_dtype", mm.FP8_DTYPES)
@pytest.mark.parametrize("b_dtype", mm.FP8_DTYPES)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_scaled_matmul(a_dtype, b_dtype, out_dtype, device):
    a = torch.randn(33, 70, device=device).to(a_dtype)
    b = torch.randn(20, 70, device=device).to(b_dtype).t()
    sa = torch.rand(33, 1, device=device) + 0.5
    sb = torch.rand(1, 20, device=device) / 8 + 0.05
    bias = torch.randn(20, device=device).to(out_dtype)
    out = scaled_matmul(a, b, sa, sb, out_dtype=out_dtype, bias=bias)
    assert out.dtype == out_dtype and out.shape == (33, 20)
    expected = (a.double() @ b.double()) * sa.double() * sb.double() + bias.double()
    _close(out, expected, torch.bfloat16 if out_dtype == torch.bfloat16 else torch.float16)
    # per-tensor scales, any layout
    one = torch.tensor(0.25, device=device)
    out = scaled_matmul(b.t(), a.t(), one, torch.ones(1, 1, device=device), torch.float32)
    expected = (b.t().double() @ a.t().double()) * 0.25
    if device.type == "cuda":
        # Hopper's FP8 tensor cores keep about 14 bits of the running sum within a K block
        # (hence the promotion to fp32 between blocks), so a float32 output is within a few
        # 2^-14 of sum |a b|, not float32's rounding; a wrong element is off by O(sum |a b|).
        bound = 2.0**-10 * (b.t().double().abs() @ a.t().double().abs()) * 0.25
        assert ((out.double() - expected).abs() <= bound).all()
    else:
        _close(out, expected)


def test_int8_matmul_is_exact_and_dequantises(device):
    a = torch.randint(-128, 128, (33, 70), device=device, dtype=torch.int8)
    b = torch.randint(-128, 128, (20, 70), device=device, dtype=torch.int8).t()
    exact = (a.double() @ b.double()).int()  # exact: |sums| < 2^21; CUDA has no int64 mm
    out = int8_matmul(a, b)
    assert out.dtype == torch.int32 and torch.equal(out, exact)
    assert torch.equal(int8_matmul(a, b.contiguous()), exact)  # any layout
    split = scaled_matmul_fwd(
        a, b, None, None, None, torch.int32, MatmulConfig.of(16, 32, 32, SPLIT_K=3)
    )
    assert torch.equal(split, exact)
    sa = torch.rand(33, 1, device=device) / 5000
    sb = torch.rand(1, 20, device=device)
    out = int8_matmul(a, b, sa, sb, out_dtype=torch.bfloat16)
    expected = exact.double() * sa.double() * sb.double()
    _close(out, expected)
    out = int8_matmul(a, b, scale_b=sb, out_dtype=torch.float32)  # a missing scale counts as 1
    _close(out, exact.double() * sb.double())


def _int8(shape, device, seed):
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(-128, 128, shape, generator=gen, device=device, dtype=torch.int8)


def _int_mm_ref(a, b):
    """torch._int_mm's result (exact int32), from a float64 product: exact below 2**53."""
    return (a.double() @ b.double()).to(torch.int32)


@pytest.fixture
def kmajor_route(tma_in_interpreter):
    """Options with TMA under the interpreter and the K-major copy threshold low (and no decode
    kernel, which reads any layout in place: 16 rows stay on the tiled route here)."""
    return GemmOptions(
        interpreter_tma=True,
        kmajor_copy_min_mnk=1,
        descriptors=tma_in_interpreter.descriptors,
        decode_max_m=0,
    )


def _int8_plan(a, b, options, out_dtype=torch.int32):
    return scaled_matmul_plan(a, b, None, None, None, out_dtype, options=options)


@pytest.mark.parametrize("m, n, k", [(33, 40, 64), (129, 24, 48), (16, 16, 16), (70, 20, 160)])
def test_int8_row_major_b_is_copied_k_major_and_exact(m, n, k, kmajor_route, device):
    opts = kmajor_route
    a = _int8((m, k), device, m)
    b = _int8((k, n), device, n)  # row-major: a @ b as a user writes it
    assert mm.kmajor_copies(a, b, options=opts) == (False, True)
    plan = _int8_plan(a, b, opts)
    assert plan.copies == (False, True)
    assert plan.gemm.use_tma and plan.gemm.layout == (False, True)  # a row-major, b K-major
    LAYOUT_COPIES.reset()
    out = scaled_matmul_fwd(a, b, None, None, None, torch.int32, options=opts)
    assert LAYOUT_COPIES.reset() == 1
    assert out.dtype == torch.int32 and torch.equal(out, _int_mm_ref(a, b))
    assert torch.equal(b, _int8((k, n), device, n))  # the input is left as it was
    sa, sb = torch.rand(m, 1, device=device) / 5000, torch.rand(1, n, device=device)
    out = scaled_matmul_fwd(a, b, sa, sb, None, torch.float32, options=opts)
    _close(out, _int_mm_ref(a, b).double() * sa.double() * sb.double())


def test_int8_column_major_a_is_copied_too(kmajor_route, device):
    opts = kmajor_route
    a = _int8((40, 48), device, 1).t().contiguous().t()  # M-major
    b = _int8((32, 48), device, 2).t()  # K-major already
    assert mm.kmajor_copies(a, b, options=opts) == (True, False)
    plan = _int8_plan(a, b, opts)
    assert plan.copies == (True, False)
    assert plan.gemm.use_tma and plan.gemm.layout == (False, True)
    LAYOUT_COPIES.reset()
    out = scaled_matmul_fwd(a, b, None, None, None, torch.int32, options=opts)
    assert LAYOUT_COPIES.reset() == 1
    assert torch.equal(out, _int_mm_ref(a, b))


@pytest.mark.parametrize(
    "m, n, k, why",
    [
        (33, 20, 65, "K not a multiple of 16: the copy's rows would not be 16-byte aligned"),
        (33, 7, 64, "int32 output rows of 28 bytes: TMA cannot store them"),
        (8, 40, 64, "fewer than 16 rows: tiny problems never take the TMA path"),
    ],
)
def test_int8_odd_shapes_keep_the_strided_path(m, n, k, why, kmajor_route, device):
    opts = kmajor_route
    a, b = _int8((m, k), device, 3), _int8((k, n), device, 4)
    assert mm.kmajor_copies(a, b, options=opts) == (False, False), why
    assert not _int8_plan(a, b, opts).gemm.use_tma
    LAYOUT_COPIES.reset()
    out = scaled_matmul_fwd(a, b, None, None, None, torch.int32, options=opts)
    assert LAYOUT_COPIES.reset() == 0
    assert torch.equal(out, _int_mm_ref(a, b))


def test_kmajor_copy_threshold_and_forcing(tma_in_interpreter, device):
    opts = tma_in_interpreter
    a, b = _int8((40, 64), device, 5), _int8((64, 32), device, 6)
    # Below the threshold (the default, 512^3): read in place, no copy.
    assert opts.kmajor_copy_min_mnk == GEMM_OPTIONS.kmajor_copy_min_mnk > 40 * 32 * 64
    assert mm.kmajor_copies(a, b, options=opts) == (False, False)
    LAYOUT_COPIES.reset()
    exact = _int_mm_ref(a, b)
    out = scaled_matmul_fwd(a, b, None, None, None, torch.int32, options=opts)
    assert torch.equal(out, exact) and LAYOUT_COPIES.reset() == 0
    assert torch.equal(int8_matmul(a, b), exact) and LAYOUT_COPIES.reset() == 0
    # kmajor=True forces the copy (sweeps time both routes), kmajor=False forbids it.
    out = scaled_matmul_fwd(a, b, None, None, None, torch.int32, kmajor=True, options=opts)
    assert torch.equal(out, exact) and LAYOUT_COPIES.reset() == 1
    low = GemmOptions(interpreter_tma=True, kmajor_copy_min_mnk=1)
    assert mm.kmajor_copies(a, b, options=low) == (False, True)
    out = scaled_matmul_fwd(a, b, None, None, None, torch.int32, kmajor=False, options=low)
    assert torch.equal(out, exact) and LAYOUT_COPIES.reset() == 0
    # A forced pointer-path config would not read a copy: none is made.
    cfg = MatmulConfig.of(16, 32, 32, SPLIT_K=2)
    out = scaled_matmul_fwd(a, b, None, None, None, torch.int32, config=cfg, options=low)
    assert torch.equal(out, exact) and LAYOUT_COPIES.reset() == 0


def test_kmajor_copy_needs_tma(device):
    """Without TMA (no Hopper GPU; the interpreter by default) nothing is copied."""
    opts = GemmOptions(kmajor_copy_min_mnk=1)
    if device.type == "cuda" and P.tma_device(device, opts):
        pytest.skip("this GPU has TMA")
    a, b = _int8((40, 64), device, 7), _int8((64, 32), device, 8)
    assert mm.kmajor_copies(a, b, options=opts) == (False, False)


def test_fp8_row_major_b_is_copied_k_major(kmajor_route, device):
    opts = kmajor_route
    a = torch.randn(33, 96, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(96, 40, device=device).to(torch.float8_e4m3fn)  # row-major
    sa, sb = torch.tensor(0.5, device=device), torch.rand(1, 40, device=device) + 0.5
    assert mm.kmajor_copies(a, b, torch.bfloat16, options=opts) == (False, True)
    plan = scaled_matmul_plan(a, b, sa, sb, None, torch.float32, options=opts)
    assert plan.copies == (False, True) and plan.gemm.use_tma
    assert plan.gemm.layout == (False, True)
    LAYOUT_COPIES.reset()
    out = scaled_matmul_fwd(a, b, sa, sb, None, torch.float32, options=opts)
    assert LAYOUT_COPIES.reset() == 1
    _close(out, (a.double() @ b.double()) * 0.5 * sb.double())


@pytest.mark.parametrize(
    "promote_k, split", [(mm.PROMOTE_PER_BLOCK, 1), (16, 1), (mm.NEVER_PROMOTE, 1), (64, 1),
                         (96, 1), (96, 2)],
)  # fmt: skip
def test_fp8_promotion_policies_run(promote_k, split, device):
    """Every accumulation-promotion policy compiles and computes the product, including the
    hand promotion every 2 or 3 K blocks with a remainder block, and within a K split (the
    interpreter accumulates exactly: their accuracy is measured on the GPU)."""
    a = torch.randn(33, 230, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(20, 230, device=device).to(torch.float8_e4m3fn).t()
    one = torch.tensor(1.0, device=device)
    cfg = MatmulConfig.of(16, 32, 32, persistent=True, promote_k=promote_k, SPLIT_K=split)
    assert MatmulConfig.from_tuning(cfg.tuning()) == cfg
    out = scaled_matmul_fwd(a, b, one, one, None, torch.float32, config=cfg)
    _close(out, a.double() @ b.double())


def test_fp8_promotion_must_be_a_whole_number_of_blocks(device):
    a = torch.randn(8, 64, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(8, 64, device=device).to(torch.float8_e4m3fn).t()
    one = torch.tensor(1.0, device=device)
    with pytest.raises(
        ValueError, match=r"promote_k must be 0, -1, in \[1, BLOCK_K = 32\] or a multiple of "
        r"BLOCK_K, got 48",
    ):  # fmt: skip
        scaled_matmul_fwd(
            a, b, one, one, None, torch.float32, config=MatmulConfig.of(16, 32, 32, promote_k=48)
        )


def test_fp8_candidates_start_with_the_hand_promotion():
    first = C.candidates("persistent", C.operand_class(torch.float8_e4m3fn), True, 8192, 1)[0]
    assert first.promote_k > first.BLOCK_K and first.promote_k % first.BLOCK_K == 0
    assert C.operand_class(torch.int8) == "8bit"


# ---- bad inputs: clear errors naming the argument ------------------------------------------------


def test_matmul_bad_inputs(device):
    a = torch.randn(4, 5, device=device)
    with pytest.raises(ValueError, match=r"inner dimensions must match: a.shape\[-1\] = 5 but b"):
        matmul(a, torch.randn(6, 3, device=device))
    with pytest.raises(ValueError, match=r"b.shape\[0\] = 4"):
        matmul(a, torch.randn(4, device=device))
    with pytest.raises(ValueError, match="a must have at least 1 dimension, got a 0-d tensor"):
        matmul(torch.tensor(1.0, device=device), a)
    with pytest.raises(ValueError, match="batch dimensions must broadcast"):
        matmul(torch.randn(2, 4, 5, device=device), torch.randn(3, 5, 2, device=device))
    with pytest.raises(
        TypeError, match=r"b must have the same dtype as a \(float32\), got float16"
    ):
        matmul(a, torch.randn(5, 3, device=device).half())
    with pytest.raises(TypeError, match="a must have dtype float32, float16, bfloat16, got int64"):
        matmul(torch.ones(4, 5, dtype=torch.long, device=device), a)
    with pytest.raises(TypeError, match=r"b must be a torch\.Tensor, got list"):
        matmul(a, [1.0])
    with pytest.raises(ValueError, match="b must be on the same device as a"):
        matmul(a, torch.empty(5, 3, device="meta"))
    with pytest.raises(ValueError, match="variant must be one of"):
        matmul_variant(a, a.t(), "fastest")


def test_linear_bad_inputs(device):
    x = torch.randn(3, 8, device=device)
    w = torch.randn(5, 8, device=device)
    with pytest.raises(
        ValueError, match=r"x.shape\[-1\] must equal weight.shape\[1\] \(in_features"
    ):
        linear(torch.randn(3, 7, device=device), w)
    with pytest.raises(ValueError, match="weight must be 2-D"):
        linear(x, torch.randn(8, device=device))
    with pytest.raises(ValueError, match=r"bias must have shape \(out_features,\) = \(5,\), got"):
        linear(x, w, torch.randn(8, device=device))
    with pytest.raises(ValueError, match=r"residual must have the output's shape \(3, 5\)"):
        linear(x, w, residual=torch.randn(3, 8, device=device))
    with pytest.raises(ValueError, match="activation must be one of"):
        linear(x, w, activation="tanh")
    with pytest.raises(TypeError, match="weight must have the same dtype as x"):
        linear(x, w.half())
    with pytest.raises(ValueError, match="x must have at least 1 dimension"):
        linear(torch.tensor(1.0, device=device), w)


def test_low_precision_bad_inputs(device):
    a = torch.randn(4, 8, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(8, 3, device=device).to(torch.float8_e4m3fn)
    one = torch.tensor(1.0, device=device)
    with pytest.raises(TypeError, match=r"a must have dtype float8_e4m3fn, float8_e5m2, got"):
        scaled_matmul(a.float(), b, one, one)
    with pytest.raises(ValueError, match=r"scale_a must have one element .* or shape \(4, 1\)"):
        scaled_matmul(a, b, torch.ones(1, 4, device=device), one)
    with pytest.raises(ValueError, match=r"scale_b must have one element .* or shape \(1, 3\)"):
        scaled_matmul(a, b, one, torch.ones(3, device=device))
    with pytest.raises(TypeError, match="scale_a must have dtype float32, got float16"):
        scaled_matmul(a, b, one.half(), one)
    with pytest.raises(TypeError, match="out_dtype must be one of bfloat16, float16, float32"):
        scaled_matmul(a, b, one, one, out_dtype=torch.int32)
    with pytest.raises(TypeError, match="bias must have dtype bfloat16, got float32"):
        scaled_matmul(a, b, one, one, bias=torch.ones(3, device=device))
    with pytest.raises(ValueError, match="a must be 2-D, got 3-D"):
        scaled_matmul(a[None], b, one, one)
    with pytest.raises(ValueError, match=r"inner dimensions must match: a.shape\[1\] = 8"):
        scaled_matmul(a, b[:5], one, one)
    ai = torch.ones(4, 8, dtype=torch.int8, device=device)
    bi = torch.ones(8, 3, dtype=torch.int8, device=device)
    with pytest.raises(ValueError, match="scale_a and scale_b need a floating out_dtype"):
        int8_matmul(ai, bi, scale_a=one)
    with pytest.raises(TypeError, match="b must have dtype int8, got uint8"):
        int8_matmul(ai, bi.to(torch.uint8))
    with pytest.raises(TypeError, match="out_dtype must be one of int32"):
        int8_matmul(ai, bi, out_dtype=torch.int64)


def test_failed_call_leaves_inputs_untouched(device):
    x = torch.randn(4, 8, device=device, requires_grad=True)
    w = torch.randn(5, 8, device=device, requires_grad=True)
    before = (x.detach().clone(), w.detach().clone())
    with pytest.raises(ValueError):
        linear(x, w, torch.randn(7, device=device))
    with pytest.raises(ValueError):
        matmul(x, w)
    assert torch.equal(x.detach(), before[0]) and torch.equal(w.detach(), before[1])
    assert x.grad is None and w.grad is None


# ---- torch.compile ------------------------------------------------------------------------------

COMPILE_CASES = {
    "matmul": (lambda x, w, b: matmul(x, w.t()) * 2, lambda x, w, b: torch.matmul(x, w.t()) * 2),
    "matmul batched": (
        lambda x, w, b: matmul(x.view(2, 3, 8), w.t()),
        lambda x, w, b: torch.matmul(x.view(2, 3, 8), w.t()),
    ),
    "linear": (
        lambda x, w, b: linear(x, w, b, "gelu_tanh") + 1,
        lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh") + 1,
    ),
}


@pytest.mark.parametrize("name", list(COMPILE_CASES))
def test_compile_fullgraph_traces(name, device):
    """fullgraph=True fails on any graph break: the custom ops and Functions must trace."""
    torch._dynamo.reset()
    fn, ref = COMPILE_CASES[name]
    backend = compile_backend(device)
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    x = torch.randn(6, 8, device=device, requires_grad=True)
    w = torch.randn(5, 8, device=device, requires_grad=True)
    b = torch.randn(5, device=device, requires_grad=True)
    out = compiled(x, w, b)
    expected = ref(x, w, b)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (x, w, b), g, allow_unused=True)
    want = torch.autograd.grad(expected, (x, w, b), g, allow_unused=True)
    for a, e in zip(got, want):
        if e is None:
            assert a is None or not a.any()
        else:
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


def test_compile_traces_low_precision_ops(device):
    torch._dynamo.reset()
    # Small random integers: every product and sum is exact even in Hopper's FP8 tensor-core
    # accumulator (about 14 significant bits, which loses 2**-12 on sums of N(0, 1) values:
    # a GPU run failed the exact comparison by 2.4e-4 at one element of 30).
    a = torch.randint(-4, 5, (6, 8), device=device).float().to(torch.float8_e4m3fn)
    b = torch.randint(-4, 5, (5, 8), device=device).float().to(torch.float8_e4m3fn).t()
    one = torch.tensor(1.0, device=device)
    fn = torch.compile(
        lambda a, b: scaled_matmul(a, b, one, one, torch.float32),
        fullgraph=True,
        backend="aot_eager",
    )
    _close(fn(a, b), a.double() @ b.double())


def test_tuning_key_classes():
    """M and N: multiples of 256 up to 8192 (the tile count decides the best tile there),
    powers of 2 above; sizes of one class share a tuned config."""
    assert [size_class(x) for x in (1, 256, 257, 3000, 3072, 8192)] == [
        256, 256, 512, 3072, 3072, 8192,
    ]  # fmt: skip
    assert [size_class(x) for x in (8193, 11008, 14336, 16385)] == [16384] * 3 + [32768]


def test_chosen_configs_are_remembered_per_problem_and_tuning_setting(
    monkeypatch, tmp_path, device
):
    """plan.tuned asks the tuner once per problem class and setting, then answers from the one
    plan cache (which also keeps the plans); a forced retune is never kept."""
    PLANS.reset()
    asked = []
    real_tune = _tuning.tune

    def tune(*args, **kwargs):
        asked.append(args[1])
        return real_tune(*args, **kwargs)

    monkeypatch.setattr(_tuning, "tune", tune)
    a, b = torch.randn(40, 24, device=device), torch.randn(24, 16, device=device)
    want = a.double() @ b.double()
    for _ in range(2):
        torch.testing.assert_close(mm.matmul(a, b).double(), want, rtol=2e-3, atol=2e-3)
    assert len(asked) == 1
    mm.matmul(torch.randn(41, 24, device=device), b)  # another M: the split-K rule reads it
    assert len(asked) == 2
    monkeypatch.setenv(_tuning.CACHE_ENV, str(tmp_path))  # another cache file
    mm.matmul(a, b)
    assert len(asked) == 3
    monkeypatch.setenv(_tuning.FORCE_ENV, "1")
    mm.matmul(a, b)
    mm.matmul(a, b)
    assert len(asked) == 5
