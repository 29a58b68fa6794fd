"""Two GPU-only test failures, looked at directly (H100, triton 3.6):

1. test_warmup: after ``tritonkit.warmup(step)`` a leaf's ``.grad`` is a tensor of zeros on
   the GPU (None under the interpreter): which leaves the warmup saw, and what it restored.
2. test_quant's Float8Linear tensorwise backward with float32 gradients: dX far off. The FP8
   GEMM dX = dY(e5m2) @ W(e4m3) alone, by output dtype, operand format and layout.

    python experiments/gpu_diag.py            # GPU; --cpu runs it under the interpreter
"""

import os
import sys

if "--cpu" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch

import tritonkit
from tritonkit import _warmup
from tritonkit.functional import scaled_matmul
from tritonkit.ops.quant.linear import E4M3, E5M2, _q

dev = "cpu" if "--cpu" in sys.argv else "cuda"

x = torch.randn(6, 40, device=dev, requires_grad=True)
w = torch.randn(40, device=dev, requires_grad=True)
seen, real_leaves = [], _warmup._leaves


def spy(roots):
    leaves = real_leaves(roots)
    seen.append([(tuple(t.shape), t is x or t is w) for t in leaves])
    return leaves


_warmup._leaves = spy
real_backward = torch.autograd.backward
rep = tritonkit.warmup(lambda: tritonkit.rms_norm(x, (40,), w).sum().backward())
print("warmup:", rep.kernels, "kernels;", rep.already, "already; leaves seen", seen)
print("x.grad", None if x.grad is None else tuple(x.grad.shape), "w.grad", w.grad is None)
print("backward restored", torch.autograd.backward is real_backward)


def deq(codes, scale):
    return codes.float() * scale.float()


for dtype in (torch.float32, torch.float16):
    torch.manual_seed(0)
    wt_full = torch.randn(40, 48, device=dev, dtype=dtype)
    dy = torch.randn(21, 40, device=dev, dtype=dtype)
    wd, wt, ws = _q(wt_full, E4M3, [40, 48], False, "both")
    gd, gt, gs = _q(dy, E5M2, [21, 40], False, "both")
    print(dtype, "wd", tuple(wd.shape), wd.stride(), "wt", tuple(wt.shape), wt.stride())
    print("  wt holds wd^T:", torch.equal(wt.float(), wd.t().float()))
    ref = deq(gd, gs) @ deq(wt.t(), ws)
    for name, a, b in (
        ("e5m2 @ wt.t()", gd, wt.t()),
        ("e5m2 @ wt.t() contiguous", gd, wt.t().contiguous()),
        ("e5m2 @ wd (row-major)", gd, wd),
    ):
        for out in (dtype, torch.float32, torch.bfloat16):
            y = scaled_matmul(a, b, gs, ws, out).float()
            err = (y - ref).abs().max().item()
            zero = int((y == 0).all(0).sum())
            print(f"  {name:28s} out {out!s:15s} max err {err:.3g}  all-zero columns {zero}")
    g4, _, g4s = _q(dy, E4M3, [21, 40], False, "row")
    y = scaled_matmul(g4, wt.t(), g4s, ws, dtype).float()
    print("  e4m3 @ wt.t() max err", (y - deq(g4, g4s) @ deq(wt.t(), ws)).abs().max().item())
