"""The row families (norms, softmax, cross-entropy) on the GPU after their restructuring into
packages with cached plans (issues 29, 30, 31): correctness at the bench shapes, GPU, host and
wall time per call against torch eager, and the cross-entropy target check.

    PYTHONPATH=src python3 experiments/gpu_rows.py [--quick]

1. Correctness, bf16, at every spec bench shape of layer_norm, rms_norm, add_layer_norm,
   add_rms_norm, softmax, log_softmax and cross_entropy, forward and backward: the largest
   error relative to the float64 reference's largest value, ours and PyTorch's own bf16 one;
   a case passes when ours is within 2x PyTorch's plus two bf16 steps (2**-7: a gradient is
   rounded once itself and computed from an output rounded once). The specs' own tolerances
   are ``tritonkit check NAME`` at the test shapes.
2. Timing, per call, bf16, forward and forward + backward, at (64, 3000) and at the bench
   shapes, tritonkit and torch eager in the same run:
   - gpu_us: the GPU time, the host kept ahead (torch.cuda._sleep before each call), L2
     flushed before each call; median over samples;
   - host_us: the host time of one call while the GPU sleeps (nothing blocks the host);
   - wall_us: back-to-back calls, one synchronize, divided by the calls (what a loop sees).
3. cross_entropy with a target out of range on CUDA stops with a device-side assert (run in a
   subprocess: a trapped context is dead); ignore_index targets do not trip it; the row
   kernel carrying the assert still takes the direct launch path.

Writes every figure to $OUT/rows.json when OUT is set; prints a table last. About 3-5 minutes
on an H100/H200. ``--dry`` runs the correctness part at small shapes on the CPU interpreter
(no timing, no CUDA check): a check of the script itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import tritonkit as tk

DT = torch.bfloat16
DEVICE = "cuda"
SMALL = (64, 3000)
NORM_SHAPES = [(16384, 4096), (4096, 65536)]
SOFTMAX_SHAPES = [(16384, 4096), (4096, 65536), (1335, 50257)]
CE_SHAPES = [(8192, 128256), (8192, 50257)]
CYCLES_PER_US = 1500  # torch.cuda._sleep cycles per microsecond, about (H100/H200 clocks)


# ---- operators: (ours, eager) over the same inputs -----------------------------------------


def _inputs(name, shape, requires_grad=False):
    gen = torch.Generator(device=DEVICE).manual_seed(0)

    def randn(*s):
        return torch.randn(s, generator=gen, device=DEVICE, dtype=DT)

    c = shape[-1]
    if name in ("layer_norm", "add_layer_norm"):
        xs = [randn(*shape)] + ([randn(*shape)] if name.startswith("add") else [])
        xs += [randn(c), randn(c)]
    elif name in ("rms_norm", "add_rms_norm"):
        xs = [randn(*shape)] + ([randn(*shape)] if name.startswith("add") else []) + [randn(c)]
    elif name in ("softmax", "log_softmax"):
        xs = [randn(*shape)]
    else:  # cross_entropy: logits, targets (every fourth row ignored)
        t = torch.randint(0, c, (shape[0],), generator=gen, device=DEVICE)
        t[3::4] = -100
        return [randn(*shape).requires_grad_(requires_grad), t]
    return [t.requires_grad_(requires_grad) for t in xs]


def _ops(name):
    """(ours, eager): callables over the inputs returning one tensor (the first output)."""
    if name == "layer_norm":
        return (
            lambda x, w, b: tk.layer_norm(x, x.shape[-1:], w, b),
            lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b),
        )
    if name == "rms_norm":
        return (
            lambda x, w: tk.rms_norm(x, x.shape[-1:], w),
            lambda x, w: F.rms_norm(x, x.shape[-1:], w),
        )
    if name == "add_layer_norm":
        return (
            lambda x, r, w, b: tk.add_layer_norm(x, r, w, b)[0],
            lambda x, r, w, b: F.layer_norm(x + r, x.shape[-1:], w, b),
        )
    if name == "add_rms_norm":
        return (
            lambda x, r, w: tk.add_rms_norm(x, r, w)[0],
            lambda x, r, w: F.rms_norm(x + r, x.shape[-1:], w),
        )
    if name == "softmax":
        return (lambda x: tk.softmax(x, -1), lambda x: torch.softmax(x, -1))
    if name == "log_softmax":
        return (lambda x: tk.log_softmax(x, -1), lambda x: torch.log_softmax(x, -1))
    return (
        lambda x, t: tk.cross_entropy(x, t),
        lambda x, t: F.cross_entropy(x, t),
    )


def _leaves(inputs):
    return [t for t in inputs if t.is_floating_point() and t.requires_grad]


# ---- correctness ----------------------------------------------------------------------------


def _run(fn, inputs, g):
    out = fn(*inputs)
    grads = torch.autograd.grad(out, _leaves(inputs), g.to(out.dtype) if g is not None else None)
    return [out.detach(), *grads]


def _error(got, ref):
    return ((got.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def check(name, shape):
    ours, eager = _ops(name)
    inputs = _inputs(name, shape, requires_grad=True)
    wide = [t.detach().double().requires_grad_() if t.is_floating_point() else t for t in inputs]
    ref_out = eager(*wide)
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    g = None if ref_out.dim() == 0 else torch.randn(ref_out.shape, generator=gen, device=DEVICE)
    ref_grads = torch.autograd.grad(ref_out, _leaves(wide), g.double() if g is not None else None)
    refs = [ref_out.detach(), *ref_grads]
    del wide, ref_out
    row = {"op": name, "shape": list(shape), "dtype": str(DT), "outputs": []}
    ok = True
    for label, got, same in zip(
        ["out"] + [f"grad{i}" for i in range(len(refs) - 1)],
        _run(ours, inputs, g),
        _run(eager, inputs, g),
    ):
        ref = refs[len(row["outputs"])]
        e_ours, e_torch = _error(got, ref), _error(same, ref)
        passed = e_ours <= 2 * e_torch + 2.0**-7
        ok &= passed
        row["outputs"].append(
            {"output": label, "err": e_ours, "torch_err": e_torch, "passed": passed}
        )
    row["passed"] = ok
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return row


# ---- timing ---------------------------------------------------------------------------------


def _flush_buffer():
    return torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")


def time_case(fn, rounds, calls, flush):
    """(gpu_us, host_us, wall_us) per call of fn, medians over rounds."""
    fn()
    torch.cuda.synchronize()
    host = []
    for _ in range(5):  # the host time of one call, the GPU asleep
        torch.cuda._sleep(CYCLES_PER_US * 2000)
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
    host_us = statistics.median(host)
    sleep = int(CYCLES_PER_US * (20 + 1.5 * host_us))
    gpu = []
    for _ in range(rounds * 4):
        flush.zero_()
        torch.cuda._sleep(sleep)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        gpu.append(start.elapsed_time(end) * 1e3)
    wall = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(gpu), host_us, statistics.median(wall)


def timings(name, shape, rounds, flush):
    ours, eager = _ops(name)
    rows = []
    big = shape[0] * shape[1] >= 1 << 24
    calls = 20 if big else 200
    for mode in ("fwd", "fwd+bwd"):
        inputs = _inputs(name, shape, requires_grad=mode == "fwd+bwd")
        leaves = _leaves(inputs)
        for impl, fn in (("tritonkit", ours), ("eager", eager)):
            if mode == "fwd":

                def run(fn=fn, inputs=inputs):
                    return fn(*inputs)

            else:
                out = fn(*inputs)
                g = torch.ones_like(out) if out.dim() else None

                def run(fn=fn, g=g, inputs=inputs, leaves=leaves):
                    return torch.autograd.grad(fn(*inputs), leaves, g)

            gpu, host, wall = time_case(run, rounds, calls, flush)
            rows.append(
                {"op": name, "shape": list(shape), "mode": mode, "impl": impl,
                 "gpu_us": gpu, "host_us": host, "wall_us": wall}
            )  # fmt: skip
        del inputs, leaves
        torch.cuda.empty_cache()
    return rows


# ---- cross_entropy's target check ------------------------------------------------------------

_CE_CODE = """
import torch, tritonkit
from tritonkit.ops.cross_entropy.kernels_forward import ce_rows_kernel
x = torch.randn(8, 50, device="cuda", dtype=torch.bfloat16, requires_grad=True)
t = torch.tensor([0, 49, -100, 3, 4, 5, 6, 7], device="cuda")
for _ in range(3):
    tritonkit.cross_entropy(x, t).backward()
torch.cuda.synchronize()
print("direct launches of the row kernel:", ce_rows_kernel.stats["direct"])
t[1] = {bad}
loss = tritonkit.cross_entropy(x, t)
torch.cuda.synchronize()
print("NOT STOPPED", loss.item())
"""


def check_targets():
    out = {}
    for bad in (50, -1, 1000):
        run = subprocess.run(
            [sys.executable, "-c", _CE_CODE.replace("{bad}", str(bad))],
            capture_output=True,
            text=True,
            timeout=300,
        )
        stopped = run.returncode != 0 and "device-side assert" in run.stderr
        direct = [l for l in run.stdout.splitlines() if l.startswith("direct launches")]
        out[str(bad)] = {
            "stopped_by_device_assert": stopped,
            "good_calls_ran": bool(direct),
            "direct": direct[0] if direct else None,
            "returncode": run.returncode,
            "stderr_tail": run.stderr[-600:],
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="(64, 3000) and one bench shape per op")
    p.add_argument("--dry", action="store_true", help="correctness only, small, CPU interpreter")
    args = p.parse_args()
    global DEVICE, NORM_SHAPES, SOFTMAX_SHAPES, CE_SHAPES
    if args.dry:  # read when the kernels are defined, on first use of a tritonkit function
        os.environ["TRITON_INTERPRET"] = "1"
        DEVICE = "cpu"
        NORM_SHAPES, SOFTMAX_SHAPES, CE_SHAPES = [(3, 70)], [(3, 70), (2, 33)], [(5, 41)]
    torch.manual_seed(0)
    result = {
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (dry)",
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
    }
    cases = [(n, s) for n in ("layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm")
             for s in NORM_SHAPES]  # fmt: skip
    cases += [(n, s) for n in ("softmax", "log_softmax") for s in SOFTMAX_SHAPES]
    cases += [("cross_entropy", s) for s in CE_SHAPES]
    if args.quick:  # the first bench shape of each op
        first: dict = {}
        for n, s in cases:
            first.setdefault(n, (n, s))
        cases = list(first.values())
    t0 = time.time()
    result["checks"] = [check(n, s) for n, s in cases]
    print(f"checks: {time.time() - t0:.0f} s", flush=True)
    if args.dry:
        for row in result["checks"]:
            print(row["op"], row["shape"], row["passed"], row["outputs"])
        return
    flush = _flush_buffer()
    result["timings"] = []
    names = dict.fromkeys(n for n, _ in cases)
    for n in names:
        result["timings"] += timings(n, SMALL, 5, flush)
    for n, s in cases:
        result["timings"] += timings(n, s, 3, flush)
    print(f"timings: {time.time() - t0:.0f} s", flush=True)
    result["targets"] = check_targets()
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "rows.json"), "w") as f:
            json.dump(result, f, indent=1)

    print(f"\n{result['device']}, torch {result['torch']}, triton {result['triton']}, bf16")
    print("\ncorrectness (largest error / largest |ref|, ours vs PyTorch's own bf16):")
    for row in result["checks"]:
        errs = " ".join(
            f"{o['output']} {o['err']:.1e}/{o['torch_err']:.1e}" for o in row["outputs"]
        )
        verdict = "ok  " if row["passed"] else "FAIL"
        print(f"  {verdict} {row['op']:15s} {row['shape']!s:16s} {errs}")
    print("\nper call, us: tritonkit gpu / host / wall | eager gpu / host / wall | wall ratio")
    t = result["timings"]
    for ours in (r for r in t if r["impl"] == "tritonkit"):
        ref = next(
            r for r in t
            if r["impl"] == "eager" and (r["op"], r["shape"], r["mode"])
            == (ours["op"], ours["shape"], ours["mode"])
        )  # fmt: skip
        flag = " host>gpu" if ours["host_us"] > ours["gpu_us"] else ""
        print(
            f"  {ours['op']:15s} {ours['shape']!s:16s} {ours['mode']:8s}"
            f" {ours['gpu_us']:8.1f} {ours['host_us']:7.1f} {ours['wall_us']:8.1f} |"
            f" {ref['gpu_us']:8.1f} {ref['host_us']:7.1f} {ref['wall_us']:8.1f} |"
            f" {ref['wall_us'] / ours['wall_us']:5.2f}x{flag}"
        )
    print("\ncross_entropy, target out of range on CUDA:")
    for bad, r in result["targets"].items():
        print(
            f"  target {bad}: stopped by device assert {r['stopped_by_device_assert']},"
            f" good calls ran {r['good_calls_ran']} ({r['direct']})"
        )


if __name__ == "__main__":
    main()
