"""conv2d: forward and backward against a float64 F.conv2d (strides, padding modes, dilation,
groups and depthwise, odd sizes, NCHW / channels_last / strided views, fp32 / fp16 / bf16),
the fused epilogues, output layouts, bad input raising PyTorch's errors, BN folding and the
model converter, torch.compile, and the spec through the check engine."""

import os
import subprocess
import sys
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

import tritonkit
import tritonkit.nn as tnn
from tritonkit.harness.spec import get_spec
from tritonkit.nn.conv import FusedBlock
from tritonkit.ops.conv import GemmConfig, WgradConfig
from tritonkit.ops.conv import plan as plan_module
from tritonkit.ops.conv.plan import bias_grad, conv_forward, conv_wgrad

from _checks import assert_spec_passes, compile_backend

ACTS = {None: lambda t: t, "relu": F.relu, "gelu": F.gelu, "silu": F.silu}
# A unit in the last place of the output (unit-variance outputs), and an atol above fp32
# accumulation error; gradients pass through a rounded dz (see specs/conv.py).
TOL = {torch.float32: (2e-5, 1e-4), torch.float16: (2e-3, 2e-3), torch.bfloat16: (2e-2, 1.6e-2)}
GRAD_TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-2, 4e-3), torch.bfloat16: (1e-1, 3e-2)}


def _case(device, n, c, h, w, k, kh, kw, groups, dtype=torch.float32, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=g, device=device)
    fan = c // groups * kh * kw
    wt = torch.randn(k, c // groups, kh, kw, generator=g, device=device) / fan**0.5
    b = torch.randn(k, generator=g, device=device)
    return x.to(dtype), wt.to(dtype), b.to(dtype)


def _layout(t, layout):
    if layout == "channels_last":
        return t.contiguous(memory_format=torch.channels_last)
    if layout == "strided":  # a non-contiguous view: every other column of a wider tensor
        wide = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
        wide[..., ::2] = t
        return wide[..., ::2]
    return t


def _close(out, ref, dtype, grad=False):
    atol, rtol = (GRAD_TOL if grad else TOL)[dtype]
    torch.testing.assert_close(out.double(), ref.double(), atol=atol, rtol=rtol)


# (n, c, h, w, k, kh, kw, groups, stride, padding, dilation)
GEOMETRIES = [
    (2, 5, 9, 7, 6, 3, 3, 1, 1, 1, 1),  # odd sizes, 3x3
    (2, 8, 9, 7, 6, 3, 3, 2, 2, 1, 1),  # groups, stride 2
    (1, 4, 6, 7, 8, 3, 3, 4, 1, 2, 2),  # depthwise, multiplier 2, dilation 2
    (3, 20, 5, 6, 33, 1, 1, 1, 1, 0, 1),  # 1x1 stride 1: the plain GEMM path
    (1, 3, 9, 8, 8, 5, 5, 1, 2, 2, 1),  # a stem: 5x5 stride 2 on 3 channels ("rows" path)
    (2, 6, 8, 7, 5, 2, 3, 1, (2, 1), (1, 0), (1, 2)),  # tuples, even window
    (2, 4, 8, 8, 6, 1, 1, 1, 2, 0, 1),  # 1x1 stride 2 (ResNet's downsample)
    (7, 8, 2, 2, 8, 3, 3, 8, 1, 1, 1),  # depthwise on 2x2 planes: a tile holds 4 images
]
# Every geometry in channels_last (the fast path); NCHW and a strided view on a few.
CASES = (
    [(g, "channels_last") for g in GEOMETRIES]
    + [(GEOMETRIES[i], "nchw") for i in (0, 3, 5)]
    + [(GEOMETRIES[i], "strided") for i in (0, 5)]
)


@pytest.mark.parametrize(
    ("geometry", "layout"),
    CASES,
    ids=lambda v: v if isinstance(v, str) else "x".join(map(str, v[:8])),
)
def test_forward_and_backward_against_float64(device, geometry, layout):
    n, c, h, w, k, kh, kw, groups, stride, padding, dilation = geometry
    x, wt, b = _case(device, n, c, h, w, k, kh, kw, groups, seed=hash(geometry) % 1000)
    x = _layout(x, layout).requires_grad_(True)
    wt = wt.requires_grad_(True)
    b = b.requires_grad_(True)
    out = tritonkit.conv2d(x, wt, b, stride, padding, dilation, groups)
    xd, wd, bd = (t.detach().double().requires_grad_(True) for t in (x, wt, b))
    ref = F.conv2d(xd, wd, bd, stride, padding, dilation, groups)
    _close(out, ref, torch.float32)
    assert out.stride() == F.conv2d(x.detach(), wt.detach(), b.detach(), stride, padding,
                                    dilation, groups).stride()  # fmt: skip
    dy = torch.randn(ref.shape, device=device, dtype=torch.float64)
    grads = torch.autograd.grad(out, (x, wt, b), dy.float())
    ref_grads = torch.autograd.grad(ref, (xd, wd, bd), dy)
    for got, want in zip(grads, ref_grads, strict=True):
        _close(got, want, torch.float32, grad=True)


@pytest.mark.parametrize("wanted", ["x", "weight", "bias"])
def test_backward_computes_only_the_gradients_asked_for(device, wanted):
    """A backward launches only the gradients' kernels that autograd asks for (a stem's input
    is an image: no dgrad), and each of them is right; the residual's gradient is dz."""
    x, wt, b = _case(device, 2, 3, 9, 8, 8, 5, 5, 1, seed=3)
    x = _layout(x, "channels_last").requires_grad_(wanted == "x")
    wt = _layout(wt, "channels_last").requires_grad_(wanted == "weight")
    b = b.requires_grad_(wanted == "bias")
    r = torch.randn(2, 8, 5, 4, device=device).contiguous(memory_format=torch.channels_last)
    r.requires_grad_(True)
    calls = []
    runs = {n: getattr(plan_module, n) for n in ("_run_dgrad", "_run_wgrad", "_run_bias_grad")}

    def counted(name):
        def run(*args):
            calls.append(name)
            return runs[name](*args)

        return run

    with mock.patch.multiple(plan_module, **{n: counted(n) for n in runs}):
        out = tritonkit.conv2d(x, wt, b, 2, 2, residual=r, activation="relu")
        dy = torch.randn_like(out)
        got, dres = torch.autograd.grad(out, ({"x": x, "weight": wt, "bias": b}[wanted], r), dy)
    assert calls == [{"x": "_run_dgrad", "weight": "_run_wgrad", "bias": "_run_bias_grad"}[wanted]]
    xd, wd, bd, rd = (t.detach().double().requires_grad_(True) for t in (x, wt, b, r))
    ref = F.relu(F.conv2d(xd, wd, bd, 2, 2) + rd)
    want = torch.autograd.grad(ref, ({"x": xd, "weight": wd, "bias": bd}[wanted], rd), dy.double())
    _close(got, want[0], torch.float32, grad=True)
    _close(dres, want[1], torch.float32, grad=True)


@pytest.mark.parametrize(
    ("dtype", "geometry"),
    [
        (torch.float16, GEOMETRIES[1]),
        (torch.bfloat16, GEOMETRIES[1]),
        (torch.bfloat16, GEOMETRIES[3]),
    ],
    ids=str,
)
def test_half_precision_forward_and_backward(device, dtype, geometry):
    """bf16 GEMMs run their dot in fp32 under the interpreter (its bf16 tl.dot is wrong), the
    same kernel code otherwise."""
    n, c, h, w, k, kh, kw, groups, stride, padding, dilation = geometry
    x, wt, b = _case(device, n, c, h, w, k, kh, kw, groups, dtype, seed=3)
    x = _layout(x, "channels_last").requires_grad_(True)
    wt, b = wt.requires_grad_(True), b.requires_grad_(True)
    out = tritonkit.conv2d(x, wt, b, stride, padding, dilation, groups, activation="relu")
    assert out.dtype == dtype
    xd, wd, bd = (t.detach().double().requires_grad_(True) for t in (x, wt, b))
    ref = F.relu(F.conv2d(xd, wd, bd, stride, padding, dilation, groups))
    _close(out, ref, dtype)
    dy = torch.randn(ref.shape, device=device, dtype=torch.float64)
    grads = torch.autograd.grad(out, (x, wt, b), dy.to(dtype))
    # The reference's dz is masked where our rounded output is 0: relu's derivative is read
    # from the output, as PyTorch's own 16-bit relu backward reads it.
    mask = (out.detach() > 0).double()
    ref_grads = torch.autograd.grad(ref, (xd, wd, bd), dy.to(dtype).double() * mask)
    for got, want in zip(grads, ref_grads, strict=True):
        _close(got, want, dtype, grad=True)


@pytest.mark.parametrize(
    ("activation", "geometry"),
    [("relu", GEOMETRIES[0]), ("gelu", GEOMETRIES[0]), ("silu", GEOMETRIES[3]),
     (None, GEOMETRIES[3]), ("relu", GEOMETRIES[2]), ("silu", GEOMETRIES[4])],
    ids=str,
)  # fmt: skip
def test_fused_epilogue_bias_residual_activation(device, activation, geometry):
    """act(conv + bias + residual) in the kernel, with gradients for all four inputs."""
    n, c, h, w, k, kh, kw, groups, stride, padding, dilation = geometry
    x, wt, b = _case(device, n, c, h, w, k, kh, kw, groups, seed=7)
    xd, wd, bd = (t.double().requires_grad_(True) for t in (x, wt, b))
    z = F.conv2d(xd, wd, bd, stride, padding, dilation, groups)
    res = torch.randn(z.shape, device=device, dtype=torch.float64)
    resd = res.clone().requires_grad_(True)
    ref = ACTS[activation](z + resd)
    ins = [t.detach().float().requires_grad_(True) for t in (x, wt, b, res)]
    out = tritonkit.conv2d(ins[0], ins[1], ins[2], stride, padding, dilation, groups,
                           residual=ins[3], activation=activation)  # fmt: skip
    _close(out, ref, torch.float32)
    dy = torch.randn(ref.shape, device=device, dtype=torch.float64)
    grads = torch.autograd.grad(out, ins, dy.float())
    ref_grads = torch.autograd.grad(ref, (xd, wd, bd, resd), dy)
    for got, want in zip(grads, ref_grads, strict=True):
        _close(got, want, torch.float32, grad=True)


@pytest.mark.parametrize("padding", ["same", "valid", 0, (2, 1)])
def test_padding_modes_and_unbatched_input(device, padding):
    x, wt, b = _case(device, 1, 4, 7, 6, 5, 4, 3, 1, seed=11)  # an even window: "same" pads
    out = tritonkit.conv2d(x[0], wt, b, 1, padding, (1, 2))  # asymmetrically, as torch does
    ref = F.conv2d(x[0].double(), wt.double(), b.double(), 1, padding, (1, 2))
    assert out.shape == ref.shape
    _close(out, ref, torch.float32)


def test_weight_layout_decides_the_output_layout(device):
    x, wt, b = _case(device, 2, 4, 6, 6, 8, 3, 3, 1)
    w_cl = wt.contiguous(memory_format=torch.channels_last)
    for xx, ww in ((x, w_cl), (x.contiguous(memory_format=torch.channels_last), wt)):
        assert (
            tritonkit.conv2d(xx, ww, b, padding=1).stride()
            == F.conv2d(xx, ww, b, padding=1).stride()
        )


def test_empty_batch_and_tiles_config(device):
    x, wt, b = _case(device, 0, 4, 5, 5, 6, 3, 3, 1)
    x = x.requires_grad_(True)
    wt = wt.requires_grad_(True)
    out = tritonkit.conv2d(x, wt, b, padding=1)
    assert out.shape == (0, 6, 5, 5)
    dx, dw = torch.autograd.grad(out, (x, wt), torch.ones_like(out))
    assert dx.shape == x.shape and torch.equal(dw, torch.zeros_like(dw))
    # A config given explicitly steers the launcher (the tuning search does this).
    x, wt, b = _case(device, 2, 20, 6, 5, 24, 3, 3, 1)
    for cfg in (GemmConfig(16, 16, 16, 1, 4, 1), GemmConfig(64, 32, 32, 4, 4, 2)):
        got = conv_forward(x, wt, b, None, [1, 1], [1, 1, 1, 1], [1, 1], 1, "relu", cfg)
        _close(got, F.relu(F.conv2d(x.double(), wt.double(), b.double(), padding=1)), torch.float32)


# (n, c, h, w, k, kh, kw, stride, padding, dilation), dense channels_last operands that the
# TMA kernels read (Hopper; the interpreter runs them too).
TMA_GEOMETRIES = [
    (2, 16, 9, 7, 24, 3, 3, 1, 1, 1),  # odd planes: tiles past the bottom and right edges
    (3, 32, 10, 12, 40, 3, 3, 2, 1, 1),  # stride 2 through the phase view
    (2, 16, 8, 8, 16, 3, 3, 1, 2, 2),  # dilation 2
    (2, 32, 14, 14, 16, 1, 1, 2, 0, 1),  # 1x1 stride 2 (a downsample)
    (1, 8, 5, 5, 8, 5, 5, 1, 2, 1),  # fewer channels than a K block: zeros past C
    (3, 16, 6, 6, 24, 3, 3, 2, 1, 1),  # stride 2, pad 1: window row -1 is padding
    (1, 64, 4, 4, 16, 3, 3, 1, 1, 1),  # one tile: its reduction split over programs
]
# The 1x1 stride-1 paths: pointers, TMA loads, the matmul family's GEMM.
POINTWISE_PATHS = ["1x1", "1x1-tma", "1x1-gemm"]


def _cl(t):
    return t.contiguous(memory_format=torch.channels_last)


def _has_tma(device) -> bool:
    """TMA descriptors: Hopper or later on CUDA; the interpreter runs them too."""
    device = torch.device(device)
    return device.type != "cuda" or torch.cuda.get_device_capability(device)[0] >= 9


@pytest.mark.parametrize("geometry", TMA_GEOMETRIES, ids=lambda v: "x".join(map(str, v)))
@pytest.mark.parametrize("path", ["tma", "fwd"])
def test_forward_paths_against_float64(device, geometry, path):
    """The TMA implicit GEMM and the pointer one on the same calls: act(conv + bias +
    residual), the residual added before the activation, outputs poisoned first."""
    if path == "tma" and not _has_tma(device):
        pytest.skip("TMA descriptors need Hopper or later")
    n, c, h, w, k, kh, kw, stride, pad, dil = geometry
    x, wt, b = _case(device, n, c, h, w, k, kh, kw, 1, seed=sum(geometry))
    z = F.conv2d(x.double(), wt.double(), b.double(), stride, pad, dil)
    res = torch.randn(z.shape, device=device)
    ref = F.relu(z + res.double())
    x, wt, res = _cl(x), _cl(wt), _cl(res)
    with mock.patch.object(torch, "empty", _poisoned(torch.empty)):
        out = conv_forward(x, wt, b, res, [stride] * 2, [pad] * 4, [dil] * 2, 1, "relu", None,
                           path)  # fmt: skip
    _close(out, ref, torch.float32)
    assert out.is_contiguous(memory_format=torch.channels_last)


def _poisoned(empty):
    def fill(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    return fill


@pytest.mark.parametrize("path", POINTWISE_PATHS)
@pytest.mark.parametrize("activation", ["relu", "silu"])
@pytest.mark.parametrize("res_layout", ["channels_last", "nchw"])
def test_pointwise_paths_add_the_residual_before_the_activation(
    device, path, activation, res_layout
):
    """A dense channels_last residual is read by descriptor on the TMA path, an NCHW one by
    pointers; 105 pixels: the last tile runs past the edge."""
    if path == "1x1-tma" and not _has_tma(device):
        pytest.skip("TMA descriptors need Hopper or later")
    if path == "1x1-gemm" and res_layout == "nchw":
        pytest.skip("the GEMM path takes a row-major (M, K) residual only")
    x, wt, b = _case(device, 3, 32, 5, 7, 48, 1, 1, 1, seed=5)
    z = F.conv2d(x.double(), wt.double(), b.double())
    res = torch.randn(z.shape, device=device)
    ref = ACTS[activation](z + res.double())
    x, wt = _cl(x), _cl(wt)
    res = _cl(res) if res_layout == "channels_last" else res
    with mock.patch.object(torch, "empty", _poisoned(torch.empty)):
        out = conv_forward(x, wt, b, res, [1, 1], [0] * 4, [1, 1], 1, activation, None, path)
    _close(out, ref, torch.float32)
    plain = conv_forward(x, wt, None, None, [1, 1], [0] * 4, [1, 1], 1, "none", None, path)
    _close(plain, F.conv2d(x.double(), wt.double()), torch.float32)


def test_pointwise_gemm_path_prepares_operands_as_the_gemm_plan_says(device):
    """An fp32 IEEE GEMM copies its K-major B row-major first (matmul's fma_copies_b): the
    1x1-gemm path passes its operands through that copy on every call."""
    import dataclasses

    from tritonkit.ops._core.layout import LAYOUT_COPIES

    x, wt, b = _case(device, 2, 32, 4, 5, 24, 1, 1, 1, seed=9)
    x, wt = _cl(x), _cl(wt)
    options = dataclasses.replace(plan_module.GEMM_OPTIONS, fma_copy_min_mnk=1)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # an IEEE GEMM, on a GPU too
    try:
        with mock.patch.object(plan_module, "GEMM_OPTIONS", options):
            before = LAYOUT_COPIES.count
            out = conv_forward(x, wt, b, None, [1, 1], [0] * 4, [1, 1], 1, "none", None, "1x1-gemm")
            assert LAYOUT_COPIES.count > before  # the row-major copy was made
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    _close(out, F.conv2d(x.double(), wt.double(), b.double()), torch.float32)


def test_tma_path_is_the_default_and_a_forced_path_that_cannot_run_raises(device):
    x, wt, b = _case(device, 2, 16, 8, 8, 16, 3, 3, 1)
    p = plan_module.problem(x.shape, wt.shape, [1, 1], [1] * 4, [1, 1], 1, x.dtype)
    assert plan_module.choose_path(p, _cl(x), _cl(wt)) == ("tma" if _has_tma(device) else "fwd")
    assert plan_module.choose_path(p, x, wt) == "fwd"  # NCHW: read where it lies
    p1 = plan_module.problem(x.shape, (8, 16, 1, 1), [1, 1], [0] * 4, [1, 1], 1, x.dtype)
    assert plan_module.choose_path(p1, _cl(x), _cl(wt[:8, :, :1, :1])) == "1x1"
    res = _cl(torch.randn(2, 8, 8, 8, device=device))  # a residual to add: the TMA epilogue
    want = "1x1-tma" if _has_tma(device) else "1x1"
    assert plan_module.choose_path(p1, _cl(x), _cl(wt[:8, :, :1, :1]), res) == want
    assert plan_module.choose_path(p1, _cl(x), _cl(wt[:8, :, :1, :1]), res.contiguous()) == "1x1"
    with pytest.raises(ValueError, match="path 'tma' cannot run"):
        conv_forward(x, wt, b, None, [1, 1], [1] * 4, [1, 1], 1, "none", None, "tma")


# Records the launches of the TMA forward (one tile per layer and a split one) and of the 1x1
# GEMM path (the matmul family's kernel, the residual before the activation), then compiles
# each for sm_90 as the CUDA backend would (the interpreter runs none of Triton's compiler).
_SM90_SCRIPT = """
import torch
from tritonkit.harness import kernel_stats as ks
from tritonkit.ops.conv.plan import conv_forward, winograd
launches, binders = {}, {}
def on_launch(fn, args, meta, grid):
    launch = ks.Launch(fn, args, meta, binders)
    launches.setdefault(launch.key(), launch)
cl = torch.channels_last
def t(*shape):
    return torch.randn(*shape, dtype=torch.bfloat16).contiguous(memory_format=cl)
with ks.as_on_gpu(), ks.recording(on_launch):
    for n, c, h, s in ((32, 64, 28, 1), (2, 64, 14, 2), (4, 512, 7, 1)):
        x, w, r = t(n, c, h, h), t(64, c, 3, 3), t(n, 64, h // s, h // s)
        conv_forward(x, w, None, r, [s, s], [1] * 4, [1, 1], 1, "relu", None, "tma")
    x, w, r = t(8, 64, 14, 14), t(128, 64, 1, 1), t(8, 128, 14, 14)
    conv_forward(x, w, torch.randn(128, dtype=torch.bfloat16), r, [1, 1], [0] * 4, [1, 1], 1,
                 "relu", None, "1x1-gemm")
    for res in (r, r.contiguous()):  # the epilogue by descriptor, and by pointers (NCHW)
        conv_forward(x, w, None, res, [1, 1], [0] * 4, [1, 1], 1, "relu", None, "1x1-tma")
    winograd(t(2, 64, 14, 14), t(64, 64, 3, 3), None, [1] * 4, "relu")
for key, launch in launches.items():
    launch.compile()
    print("compiled", key.split(" | ")[0])
"""


def test_tma_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITONKIT_AUTOTUNE="0", CUDA_VISIBLE_DEVICES="")
    run = subprocess.run(
        [sys.executable, "-c", _SM90_SCRIPT], capture_output=True, text=True, env=env, timeout=900
    )
    assert run.returncode == 0, run.stderr[-3000:]
    names = {line.split()[1] for line in run.stdout.splitlines() if line.startswith("compiled")}
    assert {"conv_fwd_tma_kernel", "split_epilogue_kernel", "winograd_input_kernel",
            "winograd_weight_kernel", "winograd_output_kernel",
            "conv1x1_tma_kernel"} <= names, run.stdout  # fmt: skip
    assert any(n.startswith("matmul") for n in names), run.stdout


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_wgrad_split_reduction_and_bias_grad(device, layout):
    """wgrad split over programs (each split's fp32 partial sums in a slab of their own, added
    in order and rounded once; the slabs are an unfilled allocation, here poisoned with NaN)
    gives the float64 gradient, in both layouts; so does the split bias sum."""
    x, wt, _ = _case(device, 3, 6, 7, 9, 10, 3, 3, 1, seed=13)
    x = _layout(x, layout)
    dy = torch.randn(3, 10, 4, 5, device=device)
    dy = _layout(dy, layout)
    xd = x.double().requires_grad_(True)
    wd = wt.double().requires_grad_(True)
    ref = F.conv2d(xd, wd, None, 2, 1)
    (dw_ref,) = torch.autograd.grad(ref, wd, dy.double())
    geo = ([2, 2], [1, 1, 1, 1], [1, 1], 1)
    empty = torch.empty

    def poisoned(*args, **kwargs):  # what an unfilled allocation may hold
        t = empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    with mock.patch.object(plan_module.torch, "empty", poisoned):
        for split in (1, 3, 7):  # 7: more splits than the 60 pixels have BLOCK_K steps
            dw = conv_wgrad(dy, x, list(wt.shape), *geo, WgradConfig(16, 16, 16, split, 4, 1))
            assert dw.dtype == x.dtype
            _close(dw, dw_ref, torch.float32, grad=True)
        _close(bias_grad(dy), dy.double().sum((0, 2, 3)), torch.float32, grad=True)
        big = _layout(torch.randn(2, 5, 16, 17, device=device), layout)  # 544 pixels: 2 splits
        _close(bias_grad(big), big.double().sum((0, 2, 3)), torch.float32, grad=True)


def test_bad_input_raises_torchs_errors(device):
    x, wt, _ = _case(device, 1, 4, 5, 5, 6, 3, 3, 1)
    cases = [
        ((x, torch.randn(6, 3, 3, 3, device=device)), {}, "expected input"),  # channels
        ((x, torch.randn(6, 2, 3, 3, device=device)), {"groups": 4}, "divisible by 4"),
        ((x[:, :, :2, :2], wt), {}, "Kernel size can't be greater"),
        ((x[0, 0], wt), {}, "3D \\(unbatched\\) or 4D"),
        ((x, wt[0]), {}, "weight must be 4-D"),
        ((x, wt), {"stride": 0}, "non-positive stride"),
        ((x, wt), {"padding": -1}, "negative padding"),
        ((x, wt), {"stride": 2, "padding": "same"}, "strided convolutions"),
        ((x, wt, torch.randn(5, device=device)), {}, "bias to be 1-dimensional with 6"),
        ((x, wt), {"stride": (1, 1, 1)}, "single integer value or a list of 2"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(RuntimeError, match=message):
            F.conv2d(*args, **kwargs) if message.startswith("non") else None
            tritonkit.conv2d(*args, **kwargs)
        with pytest.raises(ValueError, match=message):  # also a ValueError, as tritonkit's
            tritonkit.conv2d(*args, **kwargs)
    with pytest.raises(TypeError, match="weight must have x's dtype"):
        tritonkit.conv2d(x, wt.half())
    with pytest.raises(TypeError, match=r"x must be a torch\.Tensor"):
        tritonkit.conv2d([1.0], wt)
    with pytest.raises(ValueError, match="Invalid padding string"):
        tritonkit.conv2d(x, wt, padding="full")
    with pytest.raises(ValueError, match="activation must be one of"):
        tritonkit.conv2d(x, wt, activation="tanh")
    with pytest.raises(ValueError, match="residual must have the output's shape"):
        tritonkit.conv2d(x, wt, residual=torch.randn(1, 6, 5, 5, device=device))


def test_fuse_conv_bn_matches_eval_mode(device):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(5, 7, 3, padding=1, bias=True).to(device)
    bn = torch.nn.BatchNorm2d(7).to(device)
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2.0)
    bn.weight.data.uniform_(0.5, 1.5)
    bn.bias.data.uniform_(-0.5, 0.5)
    conv.eval()
    bn.eval()
    x = torch.randn(2, 5, 6, 7, device=device)
    fused = tnn.fuse_conv_bn(conv, bn, "relu")
    assert isinstance(fused, tnn.Conv2d) and isinstance(fused, torch.nn.Conv2d)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), F.relu(bn(conv(x))), atol=1e-5, rtol=1e-5)


class _Bottleneck(torch.nn.Module):
    """torchvision's Bottleneck, by its attribute names."""

    def __init__(self, cin, mid, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, mid, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(mid)
        self.conv2 = torch.nn.Conv2d(mid, mid, 3, stride, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(mid)
        self.conv3 = torch.nn.Conv2d(mid, mid * 4, 1, bias=False)
        self.bn3 = torch.nn.BatchNorm2d(mid * 4)
        self.relu = torch.nn.ReLU()
        self.downsample = torch.nn.Sequential(
            torch.nn.Conv2d(cin, mid * 4, 1, stride, bias=False), torch.nn.BatchNorm2d(mid * 4)
        )

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + self.downsample(x))


def _model(device):
    torch.manual_seed(1)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        _Bottleneck(8, 4, 2), torch.nn.Conv2d(16, 4, 1), torch.nn.SiLU(),
    ).to(device)  # fmt: skip
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    return model


def test_converter_fuses_bn_relu_and_residual_in_eval(device):
    model = _model(device).eval()
    x = torch.randn(2, 3, 9, 8, device=device)
    with torch.no_grad():
        ref = model(x)
        tnn.convert_conv2d(model)
        out = model(x)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert all(isinstance(m, tnn.Conv2d) for m in convs)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    assert model[0].activation == "relu"
    assert isinstance(model[3], FusedBlock) and model[3].convs[-1].activation == "relu"


def test_converter_in_training_swaps_only_and_trains(device):
    model = _model(device).train()
    x = torch.randn(2, 3, 9, 8, device=device)
    ref = model(x)
    tnn.convert_conv2d(model)
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    out = model(x)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    out.sum().backward()
    assert model[0].weight.grad is not None
    with pytest.raises(ValueError, match="eval mode"):
        tnn.convert_conv2d(model, fuse=True)


@pytest.mark.parametrize("variant", ["direct", "im2col", "implicit_gemm_pointer", "implicit_gemm"])
def test_workbench_variants(device, variant):
    """The spec's earlier versions of the kernel (timed beside it) compute the same thing."""
    spec = get_spec("conv2d")
    fn = spec.variants[variant]
    for shape in [(2, 4, 7, 9, 6, 3, 3, 1), (2, 5, 6, 5, 5, 3, 3, 5)]:
        x, w, b = spec.make_inputs(shape, torch.float32, device, 21)
        params = {"stride": 2, "padding": 1, "activation": "relu"}
        ref = F.relu(F.conv2d(x.double(), w.double(), b.double(), 2, 1, 1, shape[-1]))
        _close(fn(x, w, b, **params), ref, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_winograd_variant(device, dtype):
    """F(2x2, 3x3) on odd planes (a last tile half outside), with and without padding, against
    float64; a geometry it does not cover raises instead of computing something else."""
    fn = get_spec("conv2d").variants["winograd"]
    for n, c, h, w, k, pad in ((2, 5, 7, 9, 6, 1), (1, 16, 6, 5, 8, 0), (3, 3, 4, 4, 4, 1)):
        x, wt, b = _case(device, n, c, h, w, k, 3, 3, 1, dtype, seed=h * w)
        ref = F.silu(F.conv2d(x.double(), wt.double(), b.double(), 1, pad))
        out = fn(x, wt, b, padding=pad, activation="silu")
        assert out.dtype == dtype and out.stride() == F.conv2d(x, wt, b, 1, pad).stride()
        _close(out, ref, dtype)  # bf16: V and U rounded to bf16, as any GEMM's operands are
    x, wt, b = _case(device, 2, 4, 8, 8, 4, 3, 3, 1)
    with pytest.raises(ValueError, match="stride 1, dilation 1, groups 1"):
        fn(x, wt, b, stride=2, padding=1)


@pytest.mark.compile
@pytest.mark.slow
def test_torch_compile_fullgraph_forward_and_backward(device):
    x, wt, b = _case(device, 2, 4, 7, 6, 6, 3, 3, 1, seed=5)
    res = torch.randn(2, 6, 4, 3, device=device)
    ins = [t.clone().requires_grad_(True) for t in (x, wt, b, res)]

    def fn(x, w, b, r):
        return tritonkit.conv2d(x, w, b, stride=2, padding=1, residual=r, activation="silu")

    compiled = torch.compile(fn, fullgraph=True, backend=compile_backend(device))
    out = compiled(*ins)
    ref_in = [t.double().requires_grad_(True) for t in (x, wt, b, res)]
    ref = F.silu(F.conv2d(ref_in[0], ref_in[1], ref_in[2], 2, 1) + ref_in[3])
    _close(out, ref, torch.float32)
    grads = torch.autograd.grad(out.sum(), ins)
    ref_grads = torch.autograd.grad(ref.sum(), ref_in)
    for got, want in zip(grads, ref_grads, strict=True):
        _close(got, want, torch.float32, grad=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((2, 4, 7, 9, 6, 3, 3, 1), torch.float32), ((2, 5, 6, 5, 5, 3, 3, 5), torch.bfloat16)],
    ids=str,
)
def test_spec_passes(device, shape, dtype):
    """The check engine's layouts, special values, constants, gradients and empty inputs, on
    the plain and the depthwise path (the other test shapes are covered above)."""
    assert_spec_passes(
        "conv2d", device, shapes=[shape], dtypes=[dtype],
        cases=("random", "transpose", "mixed", "specials", "constants", "grad", "replay", "empty"),
    )  # fmt: skip
