"""Where the host time of an eager rms_norm forward + backward goes, against Liger-Kernel.

benchmarks/host_overhead.py measured rms_norm forward + backward at (64, 3000) bf16 at 589 us of
host time per call against Liger's 326 and PyTorch's 98, with the forward alone at 72 (Liger
63). This splits the difference into parts timed the same way (N back-to-back calls, one
synchronize, median over interleaved rounds):

- our forward with and without inputs that need a gradient (the autograd.Function's cost);
- our backward launcher called directly from the main thread (no autograd engine);
- forward + backward through the autograd engine, ours, Liger's and PyTorch's;
- an autograd.Function that does nothing, forward + backward (the engine's own cost for a
  Python Function whose backward runs on the CUDA device thread);
- Triton launches of empty kernels with 4 and 30 arguments (the launcher's cost per argument);
- three CUDA allocations (the caching allocator's cost);

and profiles the direct backward with cProfile.

    python experiments/host_breakdown.py [--out DIR] [--rounds 9] [--calls 200]

Needs a CUDA GPU; Liger-Kernel is optional. Writes DIR/host-breakdown.txt.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
import types
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import tritonkit.functional as T
from tritonkit.ops import norm as N

ROWS, COLS = 64, 3000


@triton.jit
def _empty4(a, b, n, BLOCK: tl.constexpr):
    pass


@triton.jit
def _empty30(
    a, b, c, d, e, f, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14,
    C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr, C4: tl.constexpr, C5: tl.constexpr,
    C6: tl.constexpr, C7: tl.constexpr, C8: tl.constexpr, C9: tl.constexpr, C10: tl.constexpr,
):  # fmt: skip
    pass


class _Null(torch.autograd.Function):
    """Forward and backward that launch nothing: what the engine costs a Python Function."""

    @staticmethod
    def forward(ctx, a):
        return a.view_as(a)

    @staticmethod
    def backward(ctx, g):
        return g


def _cases() -> dict[str, Callable[[], object]]:
    dev = "cuda"
    x = torch.randn(ROWS, COLS, device=dev, dtype=torch.bfloat16)
    w = torch.randn(COLS, device=dev, dtype=torch.bfloat16)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    dy = torch.randn_like(x)
    eps = N._rms_eps(None)
    _, _, mean, rstd = N.call_norm(x, None, w, None, 1, eps, True)
    # What NormFunction's ctx holds for the backward (dx and dw wanted, no bias).
    ctx = types.SimpleNamespace(
        needs_input_grad=(True, True, False),
        weight_index=1,
        has_bias=False,
        n_dims=1,
        rms=True,
        param_dtype=N._param_dtype(x, w, None),
    )
    ints = [COLS, 1, ROWS, COLS, 1, 7, COLS, 1, 1, 1, ROWS, COLS, 1, 5]
    consts = {f"C{i}": i for i in range(1, 11)}
    cases = {
        "ours fwd": lambda: T.rms_norm(x, (COLS,), w),
        "ours fwd, inputs need grad": lambda: T.rms_norm(xg, (COLS,), wg),
        "ours fwd+bwd": lambda: T.rms_norm(xg, (COLS,), wg).backward(dy),
        "ours bwd launcher, direct": lambda: N._backward(ctx, dy, None, x, w, mean, rstd),
        "torch fwd+bwd": lambda: F.rms_norm(xg, (COLS,), wg).backward(dy),
        "null Function fwd+bwd": lambda: _Null.apply(xg).backward(dy),
        "empty kernel, 4 args": lambda: _empty4[(1,)](x, w, COLS, BLOCK=16),
        "empty kernel, 30 args": lambda: _empty30[(1,)](x, w, x, w, x, w, *ints, **consts),
        "3 allocations": lambda: (
            torch.empty_like(x),
            torch.empty(ROWS, COLS, device=dev),
            torch.empty(COLS, device=dev),
        ),
    }
    try:
        from liger_kernel.transformers import functional as L
    except ImportError:
        return cases
    cases["liger fwd"] = lambda: L.liger_rms_norm(x, w, 1e-6)
    cases["liger fwd+bwd"] = lambda: L.liger_rms_norm(xg, wg, 1e-6).backward(dy)
    return cases


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--calls", type=int, default=200)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("host_breakdown.py needs a CUDA GPU: host time on the CPU means nothing")
    cases = _cases()
    for fn in cases.values():  # compile, warm the allocator and the launchers
        for _ in range(30):
            fn()
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(args.calls):
                fn()
            torch.cuda.synchronize()
            times[name].append((time.perf_counter() - start) / args.calls * 1e6)
    lines = [f"Host time per call, ({ROWS}, {COLS}) bf16, {torch.cuda.get_device_name()}"]
    lines += [
        f"{name:>28}: median {statistics.median(v):7.1f} us, min {min(v):7.1f}"
        for name, v in times.items()
    ]
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(300):
        cases["ours bwd launcher, direct"]()
    profile.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
    report = "\n".join(lines) + "\n\ncProfile, 300 direct backward calls:\n" + text.getvalue()
    path = Path(args.out) / "host-breakdown.txt"
    path.write_text(report)
    print("\n".join(lines))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
