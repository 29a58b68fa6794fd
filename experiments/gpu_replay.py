"""Replay on the GPU: every operator's replayed calls against its Python path, and host time.

A. For every spec, dtype and a few shapes (test shapes and the first bench shape): outputs and
   gradients of the third call (replayed from C++) bitwise against the Python path's; which
   keys could not be recorded, and why.
B. Host time per call at (64, 3000) bf16 (benchmarks/host_overhead.py's cases) with replay,
   without it (the direct launch path), torch and Liger; matmul at 256^3 and 4096^3.
C. Wall time per call of back-to-back forward+backward calls at bench shapes.

    PYTHONPATH=src python3 experiments/gpu_replay.py      # $OUT/replay.json
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import host_overhead as H

import tritonkit.functional as T
from tritonkit.harness.check import _flatten
from tritonkit.harness.spec import all_specs, dtype_name
from tritonkit.ops._core import registry, replay

OUT = Path(os.environ.get("OUT", "/tmp/out"))
OUT.mkdir(parents=True, exist_ok=True)


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> tuple[bool, float]:
    if len(a) != len(b):
        return False, float("inf")
    worst = 0.0
    ok = True
    for x, y in zip(a, b):
        if x.shape != y.shape or x.dtype != y.dtype or x.stride() != y.stride():
            return False, float("inf")
        if not torch.equal(x, y):
            ok = False
            if x.is_floating_point():
                worst = max(worst, (x.double() - y.double()).abs().nan_to_num(0).max().item())
            else:
                worst = float("inf")
    return ok, worst


def _run(spec, inputs, params, grad: bool):
    if not grad:
        return [t.detach().clone() for t in _flatten(spec.impl(*inputs, **params))]
    idx = spec.grad_indices(inputs)
    leaves = [t.detach().requires_grad_() if i in idx else t for i, t in enumerate(inputs)]
    outs = _flatten(spec.impl(*leaves, **params))
    gen = torch.Generator(device="cuda").manual_seed(5)
    gs = [torch.randn(o.shape, generator=gen, device="cuda", dtype=o.dtype) for o in outs]
    pairs = [(o, g) for o, g in zip(outs, gs) if o.requires_grad]
    wrt = [leaves[i] for i in idx]
    grads = torch.autograd.grad([p[0] for p in pairs], wrt, [p[1] for p in pairs])
    return [o.detach().clone() for o in outs] + [g.clone() for g in grads]


def check_all() -> list[dict]:
    rows = []
    for spec in all_specs():
        for dtype in spec.dtypes:
            shapes = list(spec.shapes.test[:3]) + list(spec.shapes.bench[:1])
            for shape in shapes:
                for grad in (False, True) if spec.backward else (False,):
                    row = {"op": spec.name, "dtype": dtype_name(dtype), "shape": str(shape)}
                    row["grad"] = grad
                    try:
                        inputs = spec.make_inputs(shape, dtype, torch.device("cuda"), 1)
                        params = dict(spec.params[0])
                        registry._REPLAY = False
                        want = _run(spec, inputs, params, grad)
                        registry._REPLAY = True
                        replay.reset()
                        got = [_run(spec, inputs, params, grad) for _ in range(3)][-1]
                        row["replays"] = replay.STATS.replays
                        row["failures"] = dict(replay.STATS.failures)
                        row["bitwise"], row["max_abs_diff"] = _same(want, got)
                    except Exception as exc:
                        row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                        row["trace"] = traceback.format_exc()[-1500:]
                    rows.append(row)
                    if not row.get("bitwise") or row.get("error"):
                        print("MISMATCH" if "error" not in row else "ERROR", row, flush=True)
    registry._REPLAY = True
    return rows


def _us_per_call(fn, calls):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e6


def host_table(rounds=7, calls=300) -> list[dict]:
    rows = []
    cases = H._cases()
    a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    big = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    cases["matmul bf16 256^3"] = {
        "tritonkit": lambda: T.matmul(a, a),
        "torch": lambda: torch.matmul(a, a),
    }
    cases["matmul bf16 4096^3"] = {
        "tritonkit": lambda: T.matmul(big, big),
        "torch": lambda: torch.matmul(big, big),
    }
    for name, fns in cases.items():
        fns = {k: v for k, v in fns.items() if k != "tritonkit, op dispatch"}
        who = ["replay", "no replay", *[k for k in fns if k != "tritonkit"]]

        def pick(w, fns=fns):
            return fns["tritonkit"] if w in ("replay", "no replay") else fns[w]

        for w in who:
            registry._REPLAY = w != "no replay"
            for _ in range(5):
                pick(w)()
        samples = {w: [] for w in who}
        n = 50 if "4096" in name else calls
        for _ in range(rounds):
            for w in who:
                registry._REPLAY = w != "no replay"
                samples[w].append(_us_per_call(pick(w), n))
        registry._REPLAY = True
        row = {"case": name, "us": {k: statistics.median(v) for k, v in samples.items()}}
        rows.append(row)
        print(f"{name:40s}", "  ".join(f"{k} {v:7.1f}" for k, v in row["us"].items()), flush=True)
    return rows


def wall_bench() -> list[dict]:
    """Back-to-back forward+backward at bench shapes: wall us per call."""
    rows = []
    x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.zeros(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    n = (4096,)
    L = H._liger()
    cases = {
        "rms_norm (16384, 4096) fwd+bwd": {
            "tritonkit": lambda: T.rms_norm(x, n, w).backward(dy),
            "torch": lambda: torch.nn.functional.rms_norm(x, n, w).backward(dy),
            "liger": L and (lambda: L.liger_rms_norm(x, w, 1e-6, 0.0, "llama", False).backward(dy)),
        },
        "layer_norm (16384, 4096) fwd+bwd": {
            "tritonkit": lambda: T.layer_norm(x, n, w, b).backward(dy),
            "torch": lambda: torch.nn.functional.layer_norm(x, n, w, b).backward(dy),
            "liger": L and (lambda: L.liger_layer_norm(x, w, b, 1e-5).backward(dy)),
        },
        "softmax (16384, 4096) fwd+bwd": {
            "tritonkit": lambda: T.softmax(x, -1).backward(dy),
            "torch": lambda: torch.softmax(x, -1).backward(dy),
        },
        "gelu (16384, 4096) fwd+bwd": {
            "tritonkit": lambda: T.gelu(x).backward(dy),
            "torch": lambda: torch.nn.functional.gelu(x).backward(dy),
        },
    }
    for name, fns in cases.items():
        fns = {k: v for k, v in fns.items() if v}
        for f in fns.values():
            for _ in range(5):
                f()
        samples = {k: [] for k in fns}
        for _ in range(5):
            for k, f in fns.items():
                samples[k].append(_us_per_call(f, 30))
        row = {"case": name, "wall_us": {k: statistics.median(v) for k, v in samples.items()}}
        rows.append(row)
        print(f"{name:40s}", "  ".join(f"{k} {v:7.1f}" for k, v in row["wall_us"].items()))
    return rows


def main() -> None:
    t0 = time.time()
    print(torch.cuda.get_device_name(), flush=True)
    ext = replay.extension(wait=True)
    print("replay module:", ext, replay.STATS.disabled, f"{time.time() - t0:.1f}s", flush=True)
    doc = {"gpu": torch.cuda.get_device_name()}
    doc["host"] = host_table()
    doc["wall"] = wall_bench()
    doc["check"] = check_all()
    (OUT / "replay.json").write_text(json.dumps(doc, indent=1, default=str))
    bad = [r for r in doc["check"] if not r.get("bitwise")]
    none = [r for r in doc["check"] if r.get("bitwise") and not r.get("replays")]
    print(
        f"checked {len(doc['check'])} cases: {len(bad)} mismatches/errors, {len(none)} not replayed"
    )
    reasons: dict[str, int] = {}
    for r in doc["check"]:
        for why, c in r.get("failures", {}).items():
            reasons[f"{r['op']}: {why}"] = reasons.get(f"{r['op']}: {why}", 0) + c
    for why, c in sorted(reasons.items()):
        print(f"  not replayed {c}x  {why}")


if __name__ == "__main__":
    main()
