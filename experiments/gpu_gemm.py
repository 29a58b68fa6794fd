"""GPU check of the matmul family after its restructuring (issues 29, 30, 31): correctness, GPU
time and host time per call, for both places TMA descriptors are made.

Cases (bf16):
- matmul and linear (no epilogue) at 256^3, 4096^3 and (M, N, K) = (8192, 4096, 4096);
- linear + bias + gelu_tanh, forward and backward (``torch.autograd.grad`` of x, w, b), at the
  same shapes;
- gelu, bias_act (gelu) and swiglu at (64, 3000), forward and forward+backward.

Implementations: torch (eager); tritonkit's public function (default ``GemmOptions``:
descriptors made on the device); and, for the GEMMs, the autograd Function with
``GemmOptions(descriptors="device")`` and ``GemmOptions(descriptors="host")`` (the same
entry for both, so the two differ only in where the TMA descriptors are made).

Per case and implementation, in microseconds per call:
- host: N back-to-back calls with no synchronization inside, timed on the CPU (the GPU queue
  never fills at these N, so this is the Python and launch cost a call adds);
- wall: the same N calls and one synchronize, divided by N (what a loop sees);
- gpu: N calls queued behind a sleeping kernel (the host kept ahead), timed with CUDA events:
  GPU time alone, back to back, L2 warm;
- bench: ``triton.testing.do_bench`` median (L2 flushed, host not kept ahead).
Medians over rounds. Correctness: relative L2 error of each output (and gradient) against
float64 on the same inputs, beside torch's own bf16 error (ratio = ours / torch's); the device
and host descriptor variants are also compared with each other (max |difference|; the kernels
differ only in where descriptors come from, so 0 is expected).

    PYTHONPATH=src python3 experiments/gpu_gemm.py [--quick] [--budget-s 540]

Writes everything to $OUT/gemm.json when OUT is set; prints a table last. First calls tune
each GEMM class (nothing is cached on a fresh machine): a few minutes; a case that would start
after ``--budget-s`` is skipped and listed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F
import triton
import triton.testing

import tritonkit
from tritonkit.ops.matmul import (
    GemmOptions,
    LinearFunction,
    MatmulFunction,
    linear_plan,
    matmul_plan,
)
from tritonkit.ops.matmul.persistent import matmul_persistent_kernel
from tritonkit.ops.matmul.tiled import matmul_tile_kernel

T0 = time.monotonic()
DEVICE = "cuda"
DTYPE = torch.bfloat16
OPTIONS = {
    "device desc": GemmOptions(descriptors="device"),
    "host desc": GemmOptions(descriptors="host"),
}
GEMM_SHAPES = [(256, 256, 256), (4096, 4096, 4096), (8192, 4096, 4096)]
ROW_SHAPE = (64, 3000)


# ---- timers -----------------------------------------------------------------------------------


def _calls_for(fn) -> int:
    """Calls per round: enough to time, few enough that queued GPU work stays under ~50 ms."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    once = time.perf_counter() - t
    return max(5, min(100, int(0.05 / max(once, 1e-6))))


def host_us(fn, calls: int, rounds: int = 7) -> float:
    out = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(out)


def wall_us(fn, calls: int, rounds: int = 7) -> float:
    out = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(out)


def gpu_us(fn, calls: int, host: float, rounds: int = 7) -> float:
    """GPU time per call with the host kept ahead: a sleep kernel long enough to cover the
    host's enqueueing of ``calls`` calls runs first."""
    cycles = int(max(1e6, 2.0 * host * calls * 2e3))  # ~2 GHz: 2x the host time, in cycles
    out = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        torch.cuda._sleep(cycles)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) / calls * 1e3)
    return statistics.median(out)


def bench_us(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")) * 1e3


def timings(fn) -> dict:
    fn()  # compile, tune, plan
    calls = _calls_for(fn)
    host = host_us(fn, calls)
    return {
        "calls": calls,
        "host_us": host,
        "wall_us": wall_us(fn, calls),
        "gpu_us": gpu_us(fn, calls, host),
        "bench_us": bench_us(fn),
    }


# ---- errors -----------------------------------------------------------------------------------


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def errors(outs, refs, torch_outs) -> dict:
    ours = [rel(o, r) for o, r in zip(outs, refs)]
    theirs = [rel(o, r) for o, r in zip(torch_outs, refs)]
    return {
        "rel_l2": ours,
        "torch_rel_l2": theirs,
        "ratio": [a / b if b else None for a, b in zip(ours, theirs)],
        "finite": all(bool(torch.isfinite(o).all()) for o in outs),
    }


# ---- cases ------------------------------------------------------------------------------------


def _plan_info(plan) -> dict | None:
    gemm = getattr(plan, "gemm", None)
    if gemm is None:
        return None
    cfg = gemm.config
    return {
        "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
        "use_tma": gemm.use_tma,
        "layout": gemm.layout,
        "int64": gemm.int64,
        "copies": gemm.copies,
    }


def gemm_cases(m: int, n: int, k: int) -> list[dict]:
    g = torch.Generator(device=DEVICE).manual_seed(0)
    # Unit-variance outputs whatever K (as the specs draw them).
    a = torch.randn(m, k, device=DEVICE, generator=g).to(DTYPE)
    b = (torch.randn(k, n, device=DEVICE, generator=g) / k**0.5).to(DTYPE)
    w = (torch.randn(n, k, device=DEVICE, generator=g) / k**0.5).to(DTYPE)
    bias = torch.randn(n, device=DEVICE, generator=g).to(DTYPE)
    dy = torch.randn(m, n, device=DEVICE, generator=g).to(DTYPE)
    shape = f"{m}x{n}x{k}"
    rows = []

    # matmul
    ref = [a.double() @ b.double()]
    impls = {
        "torch": lambda: torch.matmul(a, b),
        "tritonkit": lambda: tritonkit.matmul(a, b),
        **{name: (lambda o=o: MatmulFunction.apply(a, b, o)) for name, o in OPTIONS.items()},
    }
    outs = {}
    for name, fn in impls.items():
        outs[name] = fn()
        rows.append({"case": f"matmul {shape}", "impl": name, **timings(fn)})
        rows[-1]["errors"] = errors([outs[name]], ref, [outs["torch"]])
    rows[-1]["device_vs_host_max_abs"] = (
        (outs["device desc"].float() - outs["host desc"].float()).abs().max().item()
    )
    for row in rows:
        if row["impl"] in OPTIONS:
            row["plan"] = _plan_info(matmul_plan(a, b, options=OPTIONS[row["impl"]]))

    # linear, no epilogue
    ref = [a.double() @ w.double().t()]
    impls = {
        "torch": lambda: F.linear(a, w),
        "tritonkit": lambda: tritonkit.linear(a, w),
        **{
            name: (lambda o=o: LinearFunction.apply(a, w, None, None, "none", o))
            for name, o in OPTIONS.items()
        },
    }
    outs = {}
    first = len(rows)
    for name, fn in impls.items():
        outs[name] = fn()
        rows.append({"case": f"linear {shape}", "impl": name, **timings(fn)})
        rows[-1]["errors"] = errors([outs[name]], ref, [outs["torch"]])
        if name in OPTIONS:
            plan = linear_plan(a, w, None, None, "none", False, options=OPTIONS[name])
            rows[-1]["plan"] = _plan_info(plan)
    rows[first + len(impls) - 1]["device_vs_host_max_abs"] = (
        (outs["device desc"].float() - outs["host desc"].float()).abs().max().item()
    )

    # linear + bias + gelu_tanh, forward and backward
    xg, wg, bg = (t.detach().clone().requires_grad_() for t in (a, w, bias))
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (a, w, bias))
    y64 = F.gelu(F.linear(x64, w64, b64), approximate="tanh")
    ref = [y64.detach(), *torch.autograd.grad(y64, (x64, w64, b64), dy.double())]

    def fwd_bwd(forward):
        def run():
            y = forward()
            return (y, *torch.autograd.grad(y, (xg, wg, bg), dy))

        return run

    impls = {
        "torch": fwd_bwd(lambda: F.gelu(F.linear(xg, wg, bg), approximate="tanh")),
        "tritonkit": fwd_bwd(lambda: tritonkit.linear(xg, wg, bg, "gelu_tanh")),
        **{
            name: fwd_bwd(lambda o=o: LinearFunction.apply(xg, wg, bg, None, "gelu_tanh", o))
            for name, o in OPTIONS.items()
        },
    }
    outs = {}
    first = len(rows)
    for name, fn in impls.items():
        outs[name] = [t.detach() for t in fn()]
        rows.append({"case": f"linear+bias+gelu_tanh fwd+bwd {shape}", "impl": name})
        rows[-1].update(timings(fn))
        rows[-1]["errors"] = errors(outs[name], ref, outs["torch"])
    rows[first + len(impls) - 1]["device_vs_host_max_abs"] = max(
        (d.float() - h.float()).abs().max().item()
        for d, h in zip(outs["device desc"], outs["host desc"])
    )
    return rows


def row_cases() -> list[dict]:
    g = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(ROW_SHAPE, device=DEVICE, generator=g).to(DTYPE)
    u = torch.randn(ROW_SHAPE, device=DEVICE, generator=g).to(DTYPE)
    bias = torch.randn(ROW_SHAPE[-1], device=DEVICE, generator=g).to(DTYPE)
    dy = torch.randn(ROW_SHAPE, device=DEVICE, generator=g).to(DTYPE)
    xg, ug, bg = (t.clone().requires_grad_() for t in (x, u, bias))
    shape = "x".join(map(str, ROW_SHAPE))
    cases = {
        f"gelu fwd {shape}": {
            "torch": lambda: F.gelu(x),
            "tritonkit": lambda: tritonkit.gelu(x),
        },
        f"bias_act gelu fwd {shape}": {
            "torch": lambda: F.gelu(x + bias),
            "tritonkit": lambda: tritonkit.bias_act(x, bias, "gelu"),
        },
        f"swiglu fwd {shape}": {
            "torch": lambda: F.silu(x) * u,
            "tritonkit": lambda: tritonkit.swiglu(x, u),
        },
        f"gelu fwd+bwd {shape}": {
            "torch": lambda: torch.autograd.grad(F.gelu(xg), xg, dy),
            "tritonkit": lambda: torch.autograd.grad(tritonkit.gelu(xg), xg, dy),
        },
        f"bias_act gelu fwd+bwd {shape}": {
            "torch": lambda: torch.autograd.grad(F.gelu(xg + bg), (xg, bg), dy),
            "tritonkit": lambda: torch.autograd.grad(
                tritonkit.bias_act(xg, bg, "gelu"), (xg, bg), dy
            ),
        },
        f"swiglu fwd+bwd {shape}": {
            "torch": lambda: torch.autograd.grad(F.silu(xg) * ug, (xg, ug), dy),
            "tritonkit": lambda: torch.autograd.grad(tritonkit.swiglu(xg, ug), (xg, ug), dy),
        },
    }
    rows = []
    for case, impls in cases.items():
        for name, fn in impls.items():
            rows.append({"case": case, "impl": name, **timings(fn)})
    return rows


# ---- main -------------------------------------------------------------------------------------


def _fmt(v, spec=".1f") -> str:
    return "-" if v is None else format(v, spec)


def table(rows: list[dict]) -> str:
    head = (
        f"{'case':44} {'impl':12} {'host us':>9} {'wall us':>9} {'gpu us':>9} {'bench us':>9}"
        f" {'x torch wall':>12} {'rel err':>9} {'x torch err':>11}"
    )
    lines = [head, "-" * len(head)]
    torch_wall = {r["case"]: r["wall_us"] for r in rows if r["impl"] == "torch" and "wall_us" in r}
    for r in rows:
        if "error" in r:
            lines.append(f"{r['case']:44} {r['impl']:12} ERROR {r['error'][:80]}")
            continue
        err = r.get("errors") or {}
        rel_err = max(err["rel_l2"]) if err else None
        ratio = max((x for x in err.get("ratio", []) if x is not None), default=None)
        speed = torch_wall.get(r["case"], 0) / r["wall_us"] if r["impl"] != "torch" else None
        lines.append(
            f"{r['case']:44} {r['impl']:12} {_fmt(r['host_us']):>9} {_fmt(r['wall_us']):>9}"
            f" {_fmt(r['gpu_us']):>9} {_fmt(r['bench_us']):>9} {_fmt(speed, '.2f'):>12}"
            f" {_fmt(rel_err, '.2e'):>9} {_fmt(ratio, '.2f'):>11}"
        )
        if "device_vs_host_max_abs" in r:
            lines.append(f"{'':44} device vs host descriptors: max |diff| "
                         f"{r['device_vs_host_max_abs']:.3g}")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="256^3 and the row ops only")
    p.add_argument("--budget-s", type=float, default=540.0, help="skip cases starting later")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    shapes = GEMM_SHAPES[:1] if args.quick else GEMM_SHAPES
    rows, skipped, failures = [], [], []
    plans = [("row ops", row_cases)] + [
        (f"gemm {m}x{n}x{k}", (lambda m=m, n=n, k=k: gemm_cases(m, n, k))) for m, n, k in shapes
    ]
    for name, run in plans:
        if time.monotonic() - T0 > args.budget_s:
            skipped.append(name)
            continue
        try:
            rows += run()
        except Exception as exc:  # record and go on: the other cases still say something
            failures.append({"group": name, "error": repr(exc), "trace": traceback.format_exc()})
            rows.append({"case": name, "impl": "-", "error": repr(exc)})
        torch.cuda.empty_cache()
    stats = {
        k.__name__: dict(k.stats) for k in (matmul_persistent_kernel, matmul_tile_kernel)
    }  # fmt: skip
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "seconds": time.monotonic() - T0,
        "rows": rows,
        "skipped": skipped,
        "failures": failures,
        "launch_stats": stats,
    }
    out_dir = os.environ.get("OUT")
    if out_dir:
        with open(os.path.join(out_dir, "gemm.json"), "w") as f:
            json.dump(result, f, indent=1, default=str)
    for fail in failures:
        print(fail["trace"], file=sys.stderr)
    print(f"device {result['device']}, torch {result['torch']}, triton {result['triton']}")
    print(f"launches by path: {stats}")
    if skipped:
        print(f"skipped (time budget): {skipped}")
    print(table(rows))


if __name__ == "__main__":
    main()
