"""What users would pick instead, measured before the work on the open issues starts.

    python experiments/gpu_baselines.py --out DIR     # GPU: about a minute

1. Soft-target cross-entropy (class probabilities) at (8192, 128256) bf16, forward + backward:
   torch eager's time and peak memory (the class-probability issue's baseline).
2. Decode-shape GEMMs, 8192 x 8192 bf16 weights, M = 1, 4, 16: wall time per call of
   back-to-back calls (host included) and GPU time, of torch's bf16 linear, tritonkit.linear,
   the weight-only int8 linear and Float8Linear.
3. cuDNN conv2d (bf16, channels_last, batch 32) on the distinct 3x3 and 1x1 layers of
   ResNet-50 and a MobileNetV2 depthwise layer: forward time and TFLOP/s.

Writes DIR/baselines.json and prints a table per section.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from triton.testing import do_bench

DEV = "cuda"
OUT: dict = {}


def wall_us(fn, n: int = 200) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def soft_ce() -> None:
    n, c = 8192, 128256
    torch.manual_seed(0)
    logits = torch.randn(n, c, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    target = torch.softmax(torch.randn(n, c, device=DEV, dtype=torch.bfloat16), -1)

    def step():
        F.cross_entropy(logits, target).backward()
        logits.grad = None

    step()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    peak = torch.cuda.max_memory_allocated() - base
    ms = do_bench(step, warmup=25, rep=200, return_mode="median")
    OUT["soft_ce"] = {"torch_ms": ms, "torch_peak_extra_MiB": peak / 2**20}
    print(f"soft CE (8192, 128256) bf16 fwd+bwd: torch {ms:.3f} ms, peak +{peak / 2**20:.0f} MiB")


def decode() -> None:
    import tritonkit as tk
    from tritonkit.nn import Float8Linear
    from tritonkit.nn.quantized import Int8Linear

    torch.manual_seed(0)
    lin = torch.nn.Linear(8192, 8192, bias=False, device=DEV, dtype=torch.bfloat16)
    wo = Int8Linear.from_float(lin, "weight_only")
    f8 = Float8Linear(8192, 8192, bias=False, device=DEV, dtype=torch.bfloat16)
    rows = {}
    with torch.no_grad():
        for m in (1, 4, 16):
            x = torch.randn(m, 8192, device=DEV, dtype=torch.bfloat16)
            cands = {
                "torch bf16": lambda x=x: lin(x),
                "tk.linear": lambda x=x: tk.linear(x, lin.weight),
                "int8 weight-only": lambda x=x: wo(x),
                "Float8Linear": lambda x=x: f8(x),
            }
            for name, fn in cands.items():
                try:
                    rows[f"M={m} {name}"] = {
                        "gpu_us": do_bench(fn, rep=100, return_mode="median") * 1e3,
                        "wall_us": wall_us(fn),
                    }
                except Exception as exc:  # one failure is recorded, the rest run
                    rows[f"M={m} {name}"] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
    OUT["decode"] = rows
    for k, v in rows.items():
        cell = v.get("error") or f"gpu {v['gpu_us']:7.1f} us  wall {v['wall_us']:7.1f} us"
        print(f"{k:28s} {cell}")


# (C_in, C_out, H, stride, kernel, groups) of ResNet-50's distinct 3x3 and some 1x1 layers,
# and MobileNetV2's depthwise 3x3.
LAYERS = [
    (64, 64, 56, 1, 3, 1),
    (128, 128, 28, 1, 3, 1),
    (256, 256, 14, 1, 3, 1),
    (512, 512, 7, 1, 3, 1),
    (128, 128, 56, 2, 3, 1),
    (64, 256, 56, 1, 1, 1),
    (256, 64, 56, 1, 1, 1),
    (1024, 256, 14, 1, 1, 1),
    (3, 64, 224, 2, 7, 1),
    (144, 144, 56, 1, 3, 144),
    (384, 384, 14, 1, 3, 384),
]


def conv() -> None:
    rows = {}
    for cin, cout, h, s, k, g in LAYERS:
        x = torch.randn(32, cin, h, h, device=DEV, dtype=torch.bfloat16).to(
            memory_format=torch.channels_last
        )
        w = torch.randn(cout, cin // g, k, k, device=DEV, dtype=torch.bfloat16).to(
            memory_format=torch.channels_last
        )
        pad = k // 2
        y = F.conv2d(x, w, stride=s, padding=pad, groups=g)
        flops = 2 * y.numel() * (cin // g) * k * k

        def call(x=x, w=w, s=s, pad=pad, g=g):
            return F.conv2d(x, w, stride=s, padding=pad, groups=g)

        ms = do_bench(call, rep=100, return_mode="median")
        key = f"{cin}->{cout} {h}x{h} s{s} k{k} g{g}"
        rows[key] = {"ms": ms, "TFLOPs": flops / ms / 1e9}
        print(f"conv {key:32s} {ms * 1e3:8.1f} us {flops / ms / 1e9:7.1f} TFLOP/s")
    OUT["conv_cudnn"] = rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    OUT["gpu"] = torch.cuda.get_device_name()
    for fn in (soft_ce, decode, conv):
        try:
            fn()
        except Exception as exc:
            OUT[fn.__name__ + "_error"] = f"{type(exc).__name__}: {exc}"
            print(fn.__name__, "failed:", exc)
        torch.cuda.empty_cache()
    (args.out / "baselines.json").write_text(json.dumps(OUT, indent=1))


if __name__ == "__main__":
    main()
