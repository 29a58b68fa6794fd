"""The spec of conv2d: ``F.conv2d`` with a bias, optionally fused with an activation.

A shape is ``(N, C, H, W, K, KH, KW, groups[, channels_last])``: x is (N, C, H, W) and the
weight (K, C / groups, KH, KW), contiguous (the check engine re-lays them out: transposed,
strided, mixed) or, with a trailing 1 (the bench shapes), both channels_last, the fast layout
that cuDNN's baseline gets too.
The parameter sets add stride, padding and dilation; the first ("same" padding, stride 1) is
the one timed, so the bench shapes are the stride-1 convolutions of torchvision's ResNet-50
(batch 32, every distinct one) and MobileNetV2's stride-1 depthwise 3x3 layers;
``experiments/gpu_conv.py`` times the strided ones and the stem too.

Tolerances: the weight carries ``1 / sqrt(C / groups * KH * KW)`` so every output has unit
variance whatever its reduction length (as the matmul specs' B does), and one tolerance per
dtype (a unit in the last place of the output, an atol above fp32 accumulation error) holds
from the test shapes to the bench shapes. PyTorch's baselines run cuDNN on the same
channels_last tensors.
"""

import math

import torch
import torch.nn.functional as F

import tritonkit
from tritonkit.harness.spec import OpSpec, Shapes, Tolerance, register
from tritonkit.ops.conv import conv2d
from tritonkit.ops.conv.function import conv_geometry
from tritonkit.ops.conv.plan import conv_direct, conv_forward, im2col, problem, winograd
from tritonkit.specs._common import generator, nbytes, randn, torch_baselines

FAMILY = "conv"

# float32: PyTorch's default (torch.backends.cudnn.allow_tf32) runs convolutions on TF32
# operands, and conv2d follows it as cuDNN does: an error within 4x PyTorch's own on the same
# inputs passes where the IEEE bound cannot hold (torch_factor).
TOLERANCE = {
    torch.float32: Tolerance(atol=1e-4, rtol=1e-5, torch_factor=4.0),
    torch.float16: Tolerance(atol=1e-3, rtol=2.0**-10),
    torch.bfloat16: Tolerance(atol=8e-3, rtol=2.0**-7),
}
# Gradients reduce over N * OH * OW (wgrad) and pass through a 16-bit dz: see the matmul
# specs' MATMUL_GRAD_TOLERANCE for the reasoning.
GRAD_TOLERANCE = {
    torch.float32: Tolerance(atol=2e-4, rtol=1e-5, torch_factor=4.0),
    torch.float16: Tolerance(atol=1e-2, rtol=2.0**-9),
    torch.bfloat16: Tolerance(atol=8e-2, rtol=2.0**-6),
}


def _inputs(shape, dtype, device, seed):
    n, c, h, w, k, kh, kw, groups, *channels_last = shape
    gen = generator(device, seed)
    fmt = torch.channels_last if channels_last and channels_last[0] else torch.contiguous_format
    x = randn((n, c, h, w), dtype, device, gen).contiguous(memory_format=fmt)
    scale = 1.0 / math.sqrt(max(1, c // groups * kh * kw))
    weight = (randn((k, c // groups, kh, kw), torch.float32, device, gen) * scale).to(dtype)
    bias = randn((k,), dtype, device, gen)
    return x, weight.contiguous(memory_format=fmt), bias


_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu}


def _reference(x, weight, bias, stride=1, padding=0, dilation=1, activation=None):
    groups = x.shape[1] // weight.shape[1]
    y = F.conv2d(x, weight, bias, stride, padding, dilation, groups)
    return _ACTIVATIONS[activation](y) if activation else y


def _impl(x, weight, bias, stride=1, padding=0, dilation=1, activation=None):
    groups = x.shape[1] // weight.shape[1]
    return conv2d(x, weight, bias, stride, padding, dilation, groups, activation=activation)


def _direct(x, weight, bias, stride=1, padding=0, dilation=1, activation=None):
    """Seed 001's first version: the loop nest on the CUDA cores (no tensor cores)."""
    groups = x.shape[1] // weight.shape[1]
    s, pad, d = conv_geometry(x, weight, stride, padding, dilation, groups)
    return conv_direct(x, weight, bias, s, pad, d, groups, activation or "none")


def _pointer(x, weight, bias, stride=1, padding=0, dilation=1, activation=None):
    """The implicit GEMM with pointer loads (every tile's addresses and padding masks computed
    by the warps), the path before the TMA one; on a GPU without TMA, the one that runs."""
    groups = x.shape[1] // weight.shape[1]
    s, pad, d = conv_geometry(x, weight, stride, padding, dilation, groups)
    probe = problem(x.shape, weight.shape, s, pad, d, groups, x.dtype)
    path = "depthwise" if probe.depthwise else "1x1" if probe.pointwise else "fwd"
    return conv_forward(x, weight, bias, None, s, pad, d, groups, activation or "none", None, path)


def _winograd(x, weight, bias, stride=1, padding=0, dilation=1, activation=None):
    """Winograd F(2x2, 3x3): input and filter transforms, 16 GEMMs (tritonkit's matmul), the
    output transform with the bias and activation. A 3x3, stride-1, undilated, ungrouped
    convolution only: other cases raise ValueError (shown as not run, not timed)."""
    groups = x.shape[1] // weight.shape[1]
    s, pad, d = conv_geometry(x, weight, stride, padding, dilation, groups)
    if tuple(s) != (1, 1) or tuple(d) != (1, 1) or groups != 1:
        raise ValueError(
            f"winograd: F(2x2, 3x3) runs stride 1, dilation 1, groups 1; got stride {tuple(s)},"
            f" dilation {tuple(d)}, groups {groups}"
        )
    return winograd(x, weight, bias, pad, activation or "none")


def _im2col(x, weight, bias, stride=1, padding=0, dilation=1, activation=None):
    """Seed 001's second version: the patches written to memory as a (pixels, KH*KW*C/g)
    matrix per group (Triton), one tritonkit.matmul per group, then tritonkit.bias_act. The
    weight's reordering to that K order and the output's interleaving of groups are PyTorch
    copies (layout only)."""
    groups = x.shape[1] // weight.shape[1]
    s, pad, d = conv_geometry(x, weight, stride, padding, dilation, groups)
    k, c_g, kh, kw = weight.shape
    cols = im2col(x, tuple(weight.shape), s, pad, d, groups)
    w_mat = weight.reshape(groups, k // groups, c_g, kh, kw).permute(0, 3, 4, 2, 1)
    y = tritonkit.matmul(cols, w_mat.reshape(groups, kh * kw * c_g, k // groups))
    y = y.permute(1, 0, 2).reshape(cols.shape[1], k)
    y = tritonkit.bias_act(y, bias, activation)
    n = x.shape[0]
    oh = (x.shape[2] + pad[0] + pad[1] - d[0] * (kh - 1) - 1) // s[0] + 1
    ow = (x.shape[3] + pad[2] + pad[3] - d[1] * (kw - 1) - 1) // s[1] + 1
    return y.view(n, oh, ow, k).permute(0, 3, 1, 2)


def _out_numel(inputs, params) -> int:
    x, weight, _ = inputs
    n, _, h, w = x.shape
    k, _, kh, kw = weight.shape
    s, d = params.get("stride", 1), params.get("dilation", 1)
    p = params.get("padding", 0)
    if p == "same":
        return n * k * h * w
    p = 0 if p == "valid" else p
    oh = (h + 2 * p - d * (kh - 1) - 1) // s + 1
    ow = (w + 2 * p - d * (kw - 1) - 1) // s + 1
    return n * k * max(0, oh) * max(0, ow)


def _flops(inputs, mode, **params):
    # 2 * N * OH * OW * Cout * KH * KW * Cin / groups; dgrad and wgrad each as many.
    weight = inputs[1]
    per_out = 2 * weight.shape[1] * weight.shape[2] * weight.shape[3]
    fwd = _out_numel(inputs, params) * per_out
    return {"fwd": fwd, "bwd": 2 * fwd, "fwd+bwd": 3 * fwd}[mode]


def _bytes(inputs, mode, **params):
    # fwd: x, weight, bias in, the output out. bwd: dy, x and weight in, dx and dw out.
    x, weight, bias = inputs
    out = _out_numel(inputs, params) * x.element_size()
    fwd = nbytes(x, weight, bias) + out
    bwd = out + 2 * nbytes(x, weight)
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[mode]


def _resnet50_stride1(batch: int = 32) -> list[tuple[int, ...]]:
    """torchvision ResNet-50's distinct stride-1 convolutions (the 7x7 stem and the strided
    3x3 and downsample layers need stride 2: experiments/gpu_conv.py times those)."""
    out = [(batch, 64, 56, 56, 64, 1, 1, 1), (batch, 64, 56, 56, 64, 3, 3, 1),
           (batch, 64, 56, 56, 256, 1, 1, 1), (batch, 256, 56, 56, 64, 1, 1, 1)]  # fmt: skip
    for cin, mid, h in ((256, 128, 56), (512, 256, 28), (1024, 512, 14)):
        out += [(batch, cin, h, h, mid, 1, 1, 1), (batch, mid, h // 2, h // 2, mid * 4, 1, 1, 1),
                (batch, mid * 4, h // 2, h // 2, mid, 1, 1, 1),
                (batch, mid, h // 2, h // 2, mid, 3, 3, 1)]  # fmt: skip
    return [(*shape, 1) for shape in out]


# MobileNetV2's stride-1 depthwise 3x3 layers (batch 32).
_MOBILENET = ((32, 112), (144, 56), (192, 28), (384, 14), (576, 14), (960, 7))
MOBILENET_DEPTHWISE = [(32, c, h, h, c, 3, 3, c, 1) for c, h in _MOBILENET]
# The shape the representative selection times: ResNet-50's stage-2 3x3 (128 -> 128 at 28).
FIRST_BENCH = (32, 128, 28, 28, 128, 3, 3, 1, 1)

register(
    OpSpec(
        name="conv2d",
        family=FAMILY,
        impl=_impl,
        reference=_reference,
        make_inputs=_inputs,
        shapes=Shapes(
            test=[
                (2, 4, 7, 9, 6, 3, 3, 1),  # plain 3x3, odd sizes
                (3, 6, 5, 6, 12, 1, 1, 2),  # grouped 1x1
                (2, 5, 6, 5, 5, 3, 3, 5),  # depthwise
                (1, 5, 8, 7, 7, 2, 3, 1),  # even, non-square window
            ],
            bench=[
                FIRST_BENCH,
                *(s for s in _resnet50_stride1() if s != FIRST_BENCH),
                *MOBILENET_DEPTHWISE,
            ],
            empty=[(0, 4, 5, 5, 6, 3, 3, 1)],
            check=(2, 4, 7, 9, 6, 3, 3, 1),
        ),
        bytes=_bytes,
        flops=_flops,
        dtypes=(torch.float32, torch.float16, torch.bfloat16),
        bench_dtypes=(torch.bfloat16, torch.float32),
        params=(
            {"padding": "same", "activation": "relu"},
            {"stride": 2, "padding": 1},
            {"dilation": 2, "padding": 1, "activation": "silu"},
        ),
        tolerance=TOLERANCE,
        grad_tolerance=GRAD_TOLERANCE,
        baselines=torch_baselines(_reference),
        variants={
            "direct": _direct,
            "im2col": _im2col,
            "winograd": _winograd,
            "implicit_gemm_pointer": _pointer,
            "implicit_gemm": _impl,
        },
        compute="tensor",
        description="F.conv2d (+ bias, + activation) as an implicit GEMM; baselines: cuDNN "
        "(F.conv2d on channels_last) and torch.compile",
    )
)
