"""Host (CPU) time per call of small tritonkit ops, against PyTorch and Liger-Kernel.

At small shapes a call's time is its host time: the Python around the kernel and Triton's
launcher. This times N back-to-back calls and one synchronize, so that the GPU's few
microseconds per kernel hide behind the host's work, in rounds that interleave the
candidates (tritonkit; tritonkit with every call through its custom op and autograd.Function,
as before eager calls skipped them; PyTorch; Liger-Kernel when importable), and reports the
median over rounds of each candidate's us per call. A block of three ops (rms_norm, softmax,
gelu) is also timed eager, under torch.compile, and under torch.compile's CUDA graphs
(mode="reduce-overhead").

    python benchmarks/host_overhead.py --out benchmarks/results/host-overhead-nvidia-h200.json \
        [--commit SHA] [--rounds 7] [--calls 300]

Writes the JSON (with the environment fingerprint) and a Markdown table beside it (.md).
Needs a CUDA GPU; about a minute on an H200.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

import tritonkit.functional as T
from tritonkit.harness.device import fingerprint
from tritonkit.ops._core import registry

ROWS, COLS = 64, 3000
DTYPE = torch.bfloat16
CANDIDATES = ("tritonkit", "tritonkit, op dispatch", "torch", "liger")


def _liger():
    try:
        from liger_kernel.transformers import functional as L
    except ImportError:
        return None
    return L


def _cases() -> dict[str, dict[str, Callable[[], object]]]:
    dev = "cuda"
    x = torch.randn(ROWS, COLS, device=dev, dtype=DTYPE)
    w, b = (torch.randn(COLS, device=dev, dtype=DTYPE) for _ in range(2))
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
    dy = torch.randn_like(x)
    target = torch.randint(0, COLS, (ROWS,), device=dev)
    a16, b16 = x.half(), x[:64].t().half()
    eps = torch.finfo(torch.float32).eps
    n = (COLS,)
    L = _liger()

    def liger_rms(t, weight):
        return L.liger_rms_norm(t, weight, eps, 0.0, "llama", False)

    cases = {
        "rms_norm fwd": {
            "tritonkit": lambda: T.rms_norm(x, n, w),
            "torch": lambda: F.rms_norm(x, n, w, eps),
            "liger": L and (lambda: liger_rms(x, w)),
        },
        "rms_norm fwd+bwd": {
            "tritonkit": lambda: T.rms_norm(xg, n, wg).backward(dy),
            "torch": lambda: F.rms_norm(xg, n, wg, eps).backward(dy),
            "liger": L and (lambda: liger_rms(xg, wg).backward(dy)),
        },
        "layer_norm fwd": {
            "tritonkit": lambda: T.layer_norm(x, n, w, b),
            "torch": lambda: F.layer_norm(x, n, w, b),
            "liger": L and (lambda: L.liger_layer_norm(x, w, b, 1e-5)),
        },
        "layer_norm fwd+bwd": {
            "tritonkit": lambda: T.layer_norm(xg, n, wg, bg).backward(dy),
            "torch": lambda: F.layer_norm(xg, n, wg, bg).backward(dy),
            "liger": L and (lambda: L.liger_layer_norm(xg, wg, bg, 1e-5).backward(dy)),
        },
        "softmax fwd": {
            "tritonkit": lambda: T.softmax(x, -1),
            "torch": lambda: torch.softmax(x, -1),
            "liger": L and (lambda: L.liger_softmax(x)),
        },
        "gelu fwd": {"tritonkit": lambda: T.gelu(x), "torch": lambda: F.gelu(x)},
        "gelu fwd+bwd": {
            "tritonkit": lambda: T.gelu(xg).backward(dy),
            "torch": lambda: F.gelu(xg).backward(dy),
        },
        "swiglu fwd": {
            "tritonkit": lambda: T.swiglu(x, x),
            "torch": lambda: F.silu(x) * x,
            "liger": L and (lambda: L.liger_swiglu(x, x)),
        },
        "cross_entropy fwd": {
            "tritonkit": lambda: T.cross_entropy(x, target),
            "torch": lambda: F.cross_entropy(x, target),
            "liger": L and (lambda: L.liger_cross_entropy(x, target)),
        },
        "cross_entropy fwd+bwd": {
            "tritonkit": lambda: T.cross_entropy(xg, target).backward(),
            "torch": lambda: F.cross_entropy(xg, target).backward(),
            "liger": L and (lambda: L.liger_cross_entropy(xg, target).backward()),
        },
        "matmul fp16 (64, 3000) @ (3000, 64)": {
            "tritonkit": lambda: T.matmul(a16, b16),
            "torch": lambda: torch.matmul(a16, b16),
        },
    }
    for fns in cases.values():
        fns["tritonkit, op dispatch"] = _through_dispatch(fns["tritonkit"])
    return {name: {k: f for k, f in fns.items() if f} for name, fns in cases.items()}


def _through_dispatch(fn: Callable[[], object]) -> Callable[[], object]:
    """fn with every tritonkit call through its custom op and autograd.Function."""

    def run():
        plain = registry._plain_eager
        registry._plain_eager = lambda: False
        try:
            return fn()
        finally:
            registry._plain_eager = plain

    return run


def _us_per_call(fn: Callable[[], object], calls: int) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e6


def _time_cases(cases, rounds: int, calls: int) -> list[dict]:
    rows = []
    for name, fns in cases.items():
        for fn in fns.values():
            for _ in range(20):
                fn()
        samples: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(rounds):
            for who, fn in fns.items():
                samples[who].append(_us_per_call(fn, calls))
        row = {"case": name, "us": {k: statistics.median(v) for k, v in samples.items()}}
        row["samples_us"] = samples
        rows.append(row)
        print(json.dumps(row["us"]), name, flush=True)
    return rows


class _Block(torch.nn.Module):
    def __init__(self, ours: bool):
        super().__init__()
        self.ours = ours
        self.weight = torch.nn.Parameter(torch.randn(COLS, device="cuda", dtype=DTYPE))

    def forward(self, x):
        if self.ours:
            return T.gelu(T.softmax(T.rms_norm(x, (COLS,), self.weight), -1))
        return F.gelu(torch.softmax(F.rms_norm(x, (COLS,), self.weight), -1))


def _time_blocks(rounds: int, calls: int) -> list[dict]:
    x = torch.randn(ROWS, COLS, device="cuda", dtype=DTYPE)
    rows = []
    for mode in ("eager", "default", "reduce-overhead"):
        row = {"case": f"block rms_norm, softmax, gelu: {mode}", "us": {}, "max_abs_diff": {}}
        for ours in (True, False):
            block = _Block(ours)
            torch._dynamo.reset()
            fn = block if mode == "eager" else torch.compile(block, mode=mode, fullgraph=True)
            with torch.no_grad():
                want = block(x)
                for _ in range(20):
                    got = fn(x)
                who = "tritonkit" if ours else "torch"
                row["max_abs_diff"][who] = (got.float() - want.float()).abs().max().item()
                call = functools.partial(fn, x)
                row["us"][who] = statistics.median(_us_per_call(call, calls) for _ in range(rounds))
        rows.append(row)
        print(json.dumps(row["us"]), row["case"], flush=True)
    return rows


def _markdown(rows: list[dict]) -> str:
    lines = [
        "| us per call, median of rounds | " + " | ".join(CANDIDATES) + " |",
        "|---" * (len(CANDIDATES) + 1) + "|",
    ]
    for row in rows:
        cells = [f"{row['us'][k]:.1f}" if k in row["us"] else "-" for k in CANDIDATES]
        lines.append(f"| {row['case']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--commit", help="the tree's commit, where the run's .git is stale")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("host_overhead.py needs a CUDA GPU")
    env = fingerprint()
    if args.commit:
        env["git_commit"] = args.commit
    rows = _time_cases(_cases(), args.rounds, args.calls)
    rows += _time_blocks(args.rounds, args.calls)
    doc = {
        "environment": env,
        "shape": [ROWS, COLS],
        "dtype": str(DTYPE),
        "method": f"{args.calls} calls then one synchronize, per round; median of "
        f"{args.rounds} interleaved rounds",
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    table = _markdown(rows)
    args.out.with_suffix(".md").write_text(
        f"Host time per call, ({ROWS}, {COLS}) {DTYPE}, {env.get('gpu')}, torch {env['torch']}, "
        f"triton {env['triton']}, commit {env.get('git_commit')}, {env['date']}.\n\n" + table
    )
    print(table)


if __name__ == "__main__":
    main()
