"""Sweep the launch configs of the elementwise and memory families on the GPU.

Times each kernel at its bench shape under every candidate config (interleaved, L2 flushed),
prints GB/s per config and writes everything to JSON. The chosen defaults live in
``ops/_core/pointwise_config.py`` (``POINTWISE``) and ``ops/memory/transpose.py``; this script
is how they were chosen.

    python experiments/sweep_elementwise.py --out sweep.json
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json

import torch

import tritonkit
from tritonkit.harness.device import fingerprint
from tritonkit.harness.timing import summarize, time_interleaved
from tritonkit.ops import elementwise as E
from tritonkit.ops import memory as M
from tritonkit.ops._core.pointwise_config import POINTWISE, PointwiseConfig, RowSumConfig

SHAPE = (16384, 8192)


def _gbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9


def _cases(dtype: torch.dtype, cfg: PointwiseConfig = POINTWISE):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(SHAPE, device="cuda", generator=g).to(dtype)
    u = torch.randn(SHAPE, device="cuda", generator=g).to(dtype)
    dy = torch.randn(SHAPE, device="cuda", generator=g).to(dtype)
    b = torch.randn(SHAPE[-1], device="cuda", generator=g).to(dtype)
    n = x.numel() * x.element_size()
    bits = x.numel() // 8
    fwd = lambda *a: E.bias_act_fwd(*a, config=cfg)  # noqa: E731
    bwd = lambda *a: E.bias_act_bwd(*a, config=cfg)  # noqa: E731
    _, mask = fwd(x, None, "relu", True)
    _, bias_mask = fwd(x, b, "relu", True)
    return {
        "relu fwd": (lambda: fwd(x, None, "relu"), 2 * n),
        "relu fwd+mask": (lambda: fwd(x, None, "relu", True), 2 * n + bits),
        "relu bwd": (lambda: bwd(dy, None, None, mask, "relu", True, False), 2 * n + bits),
        "gelu fwd": (lambda: fwd(x, None, "gelu"), 2 * n),
        "gelu_tanh fwd": (lambda: fwd(x, None, "gelu_tanh"), 2 * n),
        "silu fwd": (lambda: fwd(x, None, "silu"), 2 * n),
        "gelu bwd": (lambda: bwd(dy, x, None, None, "gelu", True, False), 3 * n),
        "swiglu fwd": (lambda: E.glu_fwd(x, u, "silu", cfg), 3 * n),
        "swiglu bwd": (lambda: E.glu_bwd(dy, x, u, "silu", cfg), 5 * n),
        "bias_relu fwd": (lambda: fwd(x, b, "relu"), 2 * n),
        "bias_relu bwd": (lambda: bwd(dy, None, b, bias_mask, "relu", True, True), 2 * n + bits),
        "bias_gelu bwd": (lambda: bwd(dy, x, b, None, "gelu", True, True), 3 * n),
        "add bcast bwd": (lambda: bwd(dy, None, b, None, "none", False, True), n),
    }


def _time(fns: dict) -> dict[str, float]:
    samples = time_interleaved(fns, rep_ms=60, min_samples=20, max_samples=60)
    return {k: summarize(v).median for k, v in samples.items()}


def _row(dtype, case, config, nbytes, ms):
    return {
        "dtype": str(dtype),
        "case": case,
        "config": config,
        "ms": ms,
        "GBps": _gbps(nbytes, ms),
    }


def _sweep(dtype: torch.dtype) -> list[dict]:
    rows = []
    cases = _cases(dtype)
    x = torch.randn(SHAPE, device="cuda").to(dtype)
    n = x.numel() * x.element_size()
    # Baselines of the same run, for scale.
    torch._dynamo.reset()
    compiled_relu = torch.compile(lambda t: torch.relu(t), dynamic=False)
    base = {
        "torch copy_": lambda: torch.empty_like(x).copy_(x),
        "torch relu": lambda: torch.relu(x),
        "torch gelu": lambda: torch.nn.functional.gelu(x),
        "torch silu": lambda: torch.nn.functional.silu(x),
        "torch gelu_tanh": lambda: torch.nn.functional.gelu(x, approximate="tanh"),
        "compile relu": lambda: compiled_relu(x),
    }
    rows += [_row(dtype, k, "-", 2 * n, ms) for k, ms in _time(base).items()]

    flat = ["gelu fwd", "gelu_tanh fwd", "silu fwd", "relu bwd"]
    for tile_bytes, heavy in ((2048, 1), (2048, 2), (4096, 2)):
        cfg = dataclasses.replace(POINTWISE, tile_bytes=tile_bytes, heavy_vectors=heavy)
        these = _cases(dtype, cfg)
        res = _time({k: these[k][0] for k in flat})
        config = f"tile={tile_bytes}B heavy_vectors={heavy}"
        rows += [_row(dtype, k, config, these[k][1], ms) for k, ms in res.items()]

    # add's broadcast gradient is a plain column sum (ColumnSumConfig, sweep_gelu_colsum.py).
    sums = ["bias_relu bwd", "bias_gelu bwd"]
    for warps, rows_, per_sm in itertools.product((4, 8), (2, 4, 8), (4, 8)):
        rs = RowSumConfig(warps=warps, rows=rows_, programs_per_sm=per_sm)
        these = _cases(dtype, dataclasses.replace(POINTWISE, row_sums_by_size=((2, rs), (4, rs))))
        res = _time({k: these[k][0] for k in sums})
        config = f"bwd warps={warps} rows={rows_} programs/SM={per_sm}"
        rows += [_row(dtype, k, config, these[k][1], ms) for k, ms in res.items()]
    res = _time({"bias_relu fwd": cases["bias_relu fwd"][0]})
    rows += [
        _row(dtype, "bias_relu fwd", "default", cases["bias_relu fwd"][1], res["bias_relu fwd"])
    ]

    shapes = [(128, 64, 8), (128, 128, 8), (1, 1024, 4)]
    configs = {f"{m}x{nn} w{w}": M.TransposeConfig(m, nn, w) for m, nn, w in shapes}
    fns = {k: (lambda c=c: M.transpose_fwd(x, c)) for k, c in configs.items()}
    fns["copy"] = lambda: tritonkit.copy(x)
    rows += [_row(dtype, "transpose", k, 2 * n, ms) for k, ms in _time(fns).items()]
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="sweep.json")
    args = p.parse_args()
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        rows += _sweep(dtype)
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump({"fingerprint": fingerprint(), "rows": rows}, f, indent=1)
    best: dict[tuple[str, str], dict] = {}
    for r in rows:
        key = (r["dtype"], r["case"])
        if key not in best or r["GBps"] > best[key]["GBps"]:
            best[key] = r
    print("best config per case (all rows in the JSON):")
    for (dt, case), r in best.items():
        print(f"{dt:>15} {case:>15} {r['config']:>28} {r['GBps']:8.0f} GB/s")


if __name__ == "__main__":
    main()
