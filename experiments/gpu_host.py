"""Where a call's host time goes, and what the direct launch path (ops/_core/launch.py) saves.

1. Every case of benchmarks/host_overhead.py gives bitwise the same outputs (and gradients)
   with the direct path on and off.
2. Host cost of one launch of an empty kernel with 4 and 30 arguments: Triton's launcher
   against the direct path, on the calling thread and inside an autograd backward (the engine's
   device thread).
3. Host time per call at (64, 3000) bf16: direct path, Triton's launcher, torch, Liger.
4. cProfile of rms_norm forward+backward at (64, 3000) and matmul at 4096^3 bf16.
5. matmul 4096^3 bf16: host and wall time per call of back-to-back calls against torch.

    PYTHONPATH=src python3 experiments/gpu_host.py   # writes $OUT/host.json and profiles
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import host_overhead as H

import tritonkit.functional as T
from tritonkit.ops._core import launch

OUT = Path(os.environ.get("OUT", "/tmp/out"))
OUT.mkdir(parents=True, exist_ok=True)


@launch.kernel
def _empty4(a_ptr, b_ptr, n, BLOCK: tl.constexpr):
    pass


@launch.kernel
def _empty30(
    p0, p1, p2, p3, p4, p5, p6, p7, p8, p9,
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9,
    A: tl.constexpr, B: tl.constexpr, C: tl.constexpr, D: tl.constexpr, E: tl.constexpr,
    F: tl.constexpr, G: tl.constexpr, H: tl.constexpr, I: tl.constexpr, J: tl.constexpr,
):  # fmt: skip
    pass


def _launch_costs() -> dict:
    x = torch.empty(1024, device="cuda")
    ptrs = [torch.empty(1024, device="cuda") for _ in range(10)]
    strides = [4096 + 16 * i for i in range(10)]
    meta = dict(zip("ABCDEFGHIJ", [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]))

    def e4(k):
        return lambda: k[(1,)](x, x, 1024, BLOCK=128)

    def e30(k):
        return lambda: k[(1,)](*ptrs, *strides, **meta)

    res = {}
    for name, make, kern in (("empty4", e4, _empty4), ("empty30", e30, _empty30)):
        for direct in (False, True):
            launch.direct_launch(direct)
            fn = make(kern)
            for _ in range(50):
                fn()
            torch.cuda.synchronize()
            rounds = []
            for _ in range(7):
                t = time.perf_counter()
                for _ in range(500):
                    fn()
                rounds.append((time.perf_counter() - t) / 500 * 1e6)
                torch.cuda.synchronize()
            res[f"{name} {'direct' if direct else 'triton'} main thread"] = statistics.median(
                rounds
            )

            class Probe(torch.autograd.Function):
                @staticmethod
                def forward(ctx, t):
                    return t.clone()

                @staticmethod
                def backward(ctx, g, fn=fn):
                    t0 = time.perf_counter()
                    for _ in range(20):
                        fn()
                    Probe.times.append((time.perf_counter() - t0) / 20 * 1e6)
                    return g

            Probe.times = []
            leaf = torch.randn(8, device="cuda", requires_grad=True)
            for _ in range(30):
                Probe.apply(leaf).sum().backward()
            torch.cuda.synchronize()
            res[f"{name} {'direct' if direct else 'triton'} engine thread"] = statistics.median(
                Probe.times[5:]
            )
    launch.direct_launch(True)
    return res


def _outputs(fn):
    out = fn()
    if out is None:
        return []
    return [t.detach().clone() for t in (out if isinstance(out, tuple) else (out,))]


def _bitwise(cases) -> dict:
    res = {}
    for name, fns in cases.items():
        fn = fns["tritonkit"]
        launch.direct_launch(False)
        a = _outputs(fn)
        launch.direct_launch(True)
        fn()  # first call of each specialization goes through Triton
        b = _outputs(fn)
        res[name] = all(torch.equal(x, y) for x, y in zip(a, b)) and len(a) == len(b)
    return res


def _host_table(cases, rounds=7, calls=300) -> list[dict]:
    rows = []
    for name, fns in cases.items():
        fns = {k: v for k, v in fns.items() if k != "tritonkit, op dispatch"}
        variants = {
            "direct": fns["tritonkit"],
            **{k: v for k, v in fns.items() if k != "tritonkit"},
        }
        for fn in variants.values():
            for _ in range(20):
                fn()
        samples = {k: [] for k in ["direct", "triton launcher", *list(variants)[1:]]}
        for _ in range(rounds):
            for who in samples:
                if who == "triton launcher":
                    launch.direct_launch(False)
                    samples[who].append(H._us_per_call(fns["tritonkit"], calls))
                    launch.direct_launch(True)
                else:
                    samples[who].append(H._us_per_call(variants[who], calls))
        row = {"case": name, "us": {k: statistics.median(v) for k, v in samples.items()}}
        rows.append(row)
        print(f"{name:40s}", "  ".join(f"{k} {v:7.1f}" for k, v in row["us"].items()), flush=True)
    return rows


def _profile(fn, calls: int, path: Path) -> str:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
    path.write_text(s.getvalue())
    return s.getvalue()


def _loop(fn, calls):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / calls * 1e6, (t2 - t0) / calls * 1e6


def _matmul_loop() -> dict:
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    res = {}
    for name, fn in (("tritonkit", lambda: T.matmul(a, b)), ("torch", lambda: torch.matmul(a, b))):
        for _ in range(10):
            fn()
        got = [_loop(fn, 100) for _ in range(5)]
        res[name] = {
            "host_us": statistics.median(g[0] for g in got),
            "wall_us": statistics.median(g[1] for g in got),
        }
    small_a, small_b = a[:256, :256].contiguous(), b[:256, :256].contiguous()
    for name, fn in (
        ("tritonkit 256^3", lambda: T.matmul(small_a, small_b)),
        ("torch 256^3", lambda: torch.matmul(small_a, small_b)),
    ):
        for _ in range(10):
            fn()
        got = [_loop(fn, 300) for _ in range(5)]
        res[name] = {
            "host_us": statistics.median(g[0] for g in got),
            "wall_us": statistics.median(g[1] for g in got),
        }
    ref = a.double() @ b.double()
    err = ((T.matmul(a, b).double() - ref).norm() / ref.norm()).item()
    res["rel_l2_err"] = err
    return res


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    doc = {"gpu": torch.cuda.get_device_name()}
    doc["launch_us"] = _launch_costs()
    print(json.dumps(doc["launch_us"], indent=1), flush=True)
    cases = H._cases()
    doc["bitwise_equal"] = _bitwise(cases)
    print("bitwise equal direct vs triton:", doc["bitwise_equal"], flush=True)
    doc["host"] = _host_table(cases)
    x = torch.randn(64, 3000, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(3000, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    _profile(lambda: T.rms_norm(x, (3000,), w).backward(dy), 300, OUT / "prof_rms_fwdbwd.txt")
    _profile(lambda: T.rms_norm(x.detach(), (3000,), w.detach()), 300, OUT / "prof_rms_fwd.txt")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    _profile(lambda: T.matmul(a, a), 100, OUT / "prof_matmul.txt")
    doc["matmul"] = _matmul_loop()
    print(json.dumps(doc["matmul"], indent=1), flush=True)
    (OUT / "host.json").write_text(json.dumps(doc, indent=1))
    stats = {k: v for k, v in launch.__dict__.items() if k == "_DIRECT"}
    print(stats)


if __name__ == "__main__":
    main()
