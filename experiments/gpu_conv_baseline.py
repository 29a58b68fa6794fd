"""cuDNN's figures on the conv layers issue 46 targets (bf16, channels_last): the baselines a
tritonkit conv2d must meet. FLOPs = 2 * N * OH * OW * Cout * KH * KW * Cin / groups."""

import argparse
import json
import math

import torch
import torch.nn.functional as F
from triton.testing import do_bench

# (Cin, Cout, k, stride, H) of torchvision ResNet-50's distinct convolutions at 224x224.
RESNET50 = [
    (3, 64, 7, 2, 224),
    (64, 64, 1, 1, 56),
    (64, 64, 3, 1, 56),
    (64, 256, 1, 1, 56),
    (256, 64, 1, 1, 56),
]
for cin, mid, h in ((256, 128, 56), (512, 256, 28), (1024, 512, 14)):
    out = mid * 4
    RESNET50 += [
        (cin, mid, 1, 1, h),
        (mid, mid, 3, 2, h),
        (mid, out, 1, 1, h // 2),
        (cin, out, 1, 2, h),
        (out, mid, 1, 1, h // 2),
        (mid, mid, 3, 1, h // 2),
    ]
# (C, stride, H) of MobileNetV2's depthwise 3x3 convolutions.
MOBILENET = [
    (32, 1, 112),
    (96, 2, 112),
    (144, 1, 56),
    (144, 2, 56),
    (192, 1, 28),
    (192, 2, 28),
    (384, 1, 14),
    (576, 1, 14),
    (576, 2, 14),
    (960, 1, 7),
]


def conv_case(n, cin, cout, k, stride, h, groups=1):
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(n, cin, h, h, device=dev, dtype=dt).to(memory_format=torch.channels_last)
    w = torch.randn(cout, cin // groups, k, k, device=dev, dtype=dt).to(
        memory_format=torch.channels_last
    ) / math.sqrt(cin // groups * k * k)
    b = torch.randn(cout, device=dev, dtype=dt)
    pad = k // 2
    y = F.conv2d(x, w, None, stride, pad, 1, groups)
    oh = y.shape[-1]
    flops = 2 * n * oh * oh * cout * k * k * cin // groups
    r = {
        "cin": cin,
        "cout": cout,
        "k": k,
        "stride": stride,
        "h": h,
        "groups": groups,
        "flops": flops,
    }
    fwd = do_bench(lambda: F.conv2d(x, w, None, stride, pad, 1, groups), warmup=25, rep=100)
    eager = do_bench(
        lambda: F.relu(F.conv2d(x, w, None, stride, pad, 1, groups) + b.view(1, -1, 1, 1)),
        warmup=25,
        rep=100,
    )
    torch._dynamo.reset()
    comp = torch.compile(lambda: F.relu(F.conv2d(x, w, b, stride, pad, 1, groups)))
    comp()
    compiled = do_bench(comp, warmup=25, rep=100)
    xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
    yg = F.conv2d(xg, wg, None, stride, pad, 1, groups)
    go = torch.randn_like(yg)
    bwd = do_bench(
        lambda: torch.autograd.grad(yg, (xg, wg), go, retain_graph=True), warmup=25, rep=100
    )
    r.update(
        fwd_ms=fwd,
        fwd_tflops=flops / fwd / 1e9,
        bias_relu_eager_ms=eager,
        bias_relu_compile_ms=compiled,
        bwd_ms=bwd,
        bwd_tflops=2 * flops / bwd / 1e9,
    )
    return r


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    a = p.parse_args()
    torch.backends.cudnn.benchmark = True
    rows = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "resnet50_b32": [],
        "mobilenetv2_dw_b32": [],
    }
    for c in RESNET50:
        rows["resnet50_b32"].append(conv_case(32, *c))
        print(rows["resnet50_b32"][-1], flush=True)
    for c, s, h in MOBILENET:
        rows["mobilenetv2_dw_b32"].append(conv_case(32, c, c, 3, s, h, groups=c))
        print(rows["mobilenetv2_dw_b32"][-1], flush=True)
    with open(f"{a.out}/conv_baseline.json", "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
