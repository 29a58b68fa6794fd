"""Issue 48 on one GPU: the workbench says why (profile, leaks, long runs, energy, Pareto tuning).

    PYTHONPATH=src python experiments/gpu_why.py --out DIR          # one H100, about 6 minutes
    PYTHONPATH=src python experiments/gpu_why.py --out DIR --smoke  # CPU interpreter, tiny

Steps, each timed and each result written as it comes (``why.json``, ``why.md`` under --out),
in the order 1, 5, 4, 3, 2, 6 (what the issue's acceptance needs first):

1. ``tritonkit profile`` (harness/profile.py) on rms_norm, matmul and attention at a bench
   shape: per kernel the static metrics (registers, spills, shared memory, theoretical
   occupancy, compiled for sm_90) and the measured ones (achieved occupancy, L2 hit rate,
   DRAM GB/s = dram__bytes / gpu__time_duration, SM efficiency) with the source that gave
   them (ncu, CUPTI range profiler, or torch.profiler's kernel times only), the class
   (harness/bottleneck.py's rule), a chrome trace and a memory timeline per case.
2. The leak check (harness/soak.py) for every operator of the main job's selection (its main
   dtype, its check shape), forward + backward where it has one, ``--leak-calls`` calls (1,000).
3. The long-run check on two operators (rms_norm, softmax) at a bench shape, ``--long-run-s``
   seconds each: last third's ms per call over the first third's, against 3 x noise.
4. Energy per call (harness/energy.py: NVML's energy counter or power samples over
   ``--energy-s`` seconds of back-to-back calls) for rms_norm, softmax and matmul: watts,
   uJ per call, GB/s per W = bytes / 1e9 / J per call (GFLOP/s per W likewise, for matmul).
5. The multi-objective tuner (harness/tune_multi.py) on matmul and attention: the Pareto set
   over (latency, peak memory), the weighted choice (tune_multi.WEIGHTS: ms 1.0, peak_bytes
   0.02) and how much slower than the fastest it is: 100 x (chosen ms / fastest ms - 1).
6. ``tritonkit bench rms_norm matmul --energy 0.5 --kernels`` (the main job's report with the
   RSD, energy, class and kernels columns) under --out/bench, and ``tritonkit bench rms_norm
   --sweep`` (size against % of the roofline, sweep_rms_norm.png) under --out/sweep.

No step starts after ``--budget-s`` (default 330 s in all), and a running one is interrupted
when the budget runs out (the bench runs in a child process, killed at its share of it); each
says so in why.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tritonkit.harness import energy, profile, soak, tune_multi
from tritonkit.harness.selection import check_shape, main_dtype
from tritonkit.harness.spec import get_spec, select

GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if GPU else "cpu")


class OutOfTime(Exception):
    """A step ran past the run's time budget."""


def _out_of_time(signum: int, frame: Any) -> None:
    raise OutOfTime("the step ran past --budget-s")


class Run:
    """Results as they come, rewritten after every step (a killed run keeps what it had)."""

    def __init__(self, out: Path, budget_s: float) -> None:
        self.out, self.budget_s, self.t0 = out, budget_s, time.perf_counter()
        self.doc: dict[str, Any] = {
            "gpu": torch.cuda.get_device_name() if GPU else "none (CPU interpreter, smoke)",
            "torch": torch.__version__,
            "steps": {},
        }

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.t0)

    def step(self, name: str, fn, *args, **kwargs) -> Any:
        if self.left() <= 0:
            self.doc["steps"][name] = {"skipped": "past the time budget"}
            self.save()
            return None
        t0 = time.perf_counter()
        # The budget is a wall-clock limit on each step too: Python-level loops are interrupted
        # (a call blocked inside CUDA ends at its next return to Python).
        signal.signal(signal.SIGALRM, _out_of_time)
        signal.alarm(max(5, int(self.left())))
        try:
            got = fn(*args, **kwargs)
        except Exception as exc:  # one step's failure must not lose the others
            got = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(-3)}
        finally:
            signal.alarm(0)
        got = got if isinstance(got, dict) else {"result": got}
        got["seconds"] = round(time.perf_counter() - t0, 1)
        self.doc["steps"][name] = got
        print(f"[{time.perf_counter() - self.t0:6.0f}s] {name}: {got['seconds']} s", flush=True)
        self.save()
        return got

    def save(self) -> None:
        (self.out / "why.json").write_text(json.dumps(self.doc, indent=1, default=str))
        (self.out / "why.md").write_text(markdown(self.doc))


def do_profile(op: str, out: Path, smoke: bool) -> dict[str, Any]:
    spec = get_spec(op)
    shape = spec.shapes.test[-1] if smoke else spec.shapes.bench[0]
    result = profile.profile_case(op, shape, None, "fwd", out / f"profile-{op}", static=True)
    result["text"] = profile.render(result)
    print(result["text"], flush=True)
    return result


def do_leaks(calls: int, smoke: bool, run: Run) -> dict[str, Any]:
    rows = []
    specs = [s for s in select(None) if s.distributed is None]
    if smoke:
        specs = [s for s in specs if s.name in ("rms_norm", "softmax", "gelu")]
    for spec in specs:
        if run.left() <= 0:
            rows.append({"op": spec.name, "skipped": "past the time budget"})
            continue
        dtype = main_dtype(spec)
        t0 = time.perf_counter()
        r = soak.leak_check(spec, calls=calls, shape=check_shape(spec, dtype), dtype=dtype)
        rows.append(
            {
                "op": spec.name,
                "shape": r.shape,
                "dtype": r.dtype,
                "passed": r.passed,
                "grew_bytes": r.max_abs,
                "how": r.params,
                "detail": r.detail,
                "seconds": round(time.perf_counter() - t0, 2),
            }
        )
    done = [r for r in rows if "passed" in r]
    return {
        "rows": rows,
        "passed": sum(r["passed"] for r in done),
        "checked": len(done),
        "not_run": len(rows) - len(done),
        "formula": "grew = max(memory_allocated after - before, live tensor bytes after - "
        f"before) over {calls} calls after {soak.LEAK_WARMUP} warm-up calls; pass: grew <= "
        f"{soak.LEAK_SLACK} bytes",
    }


def do_long_run(ops: list[str], seconds: float, smoke: bool) -> dict[str, Any]:
    rows = []
    for op in ops:
        spec = get_spec(op)
        shape = spec.shapes.test[-1] if smoke else spec.shapes.bench[0]
        r = soak.stability_check(spec, seconds=seconds, windows=30 if not smoke else 6, shape=shape)
        rows.append(
            {
                "op": op,
                "shape": r.shape,
                "dtype": r.dtype,
                "passed": r.passed,
                "change": r.max_abs,
                "how": r.params,
                "detail": r.detail,
            }
        )
    return {
        "rows": rows,
        "formula": "change = median(ms per call, last third of windows) / median(first third) "
        "- 1; noise = 1.4826 x median(|successive window differences|) / sqrt(2) / median; "
        f"pass: change <= max(3 x noise, {soak.DECAY_FLOOR})",
    }


class _FakeNvml:
    """For --smoke only: a board drawing 300 W (no NVML on the CPU)."""

    has_counter = False

    def power_w(self) -> float:
        return 300.0


def do_energy(ops: list[str], seconds: float, smoke: bool) -> dict[str, Any]:
    import triton.testing

    rows = []
    nvml = _FakeNvml() if smoke else None
    sync = (lambda: None) if smoke else None
    for op in ops:
        spec = get_spec(op)
        shape = spec.shapes.test[-1] if smoke else spec.shapes.bench[0]
        dtype = main_dtype(spec)
        call, inputs = profile.case_call(spec, shape, dtype, "fwd", DEVICE)
        got = energy.measure(call, seconds, nvml=nvml, sync=sync)
        params = dict(spec.params[0])
        record = {"flops": spec.flops(inputs, "fwd", **params)}
        record["bytes"] = spec.bytes(inputs, "fwd", **params)
        ms = float(triton.testing.do_bench(call, return_mode="median")) if GPU else None
        rows.append(
            {
                "op": op,
                "shape": str(shape),
                "dtype": str(dtype).removeprefix("torch."),
                "gpu_ms": ms,
                **got,
                "uJ_per_call": got["joules_per_call"] * 1e6,
                **energy.per_watt(record, got["joules_per_call"]),
            }
        )
    return {
        "rows": rows,
        "formula": "watts = joules / seconds of back-to-back calls (energy counter difference, "
        "else trapezoid-integrated power samples); J per call = joules / calls; GB/s per W = "
        "bytes / 1e9 / J per call; GFLOP/s per W = FLOPs / 1e9 / J per call",
        "nvml": "fake 300 W board (smoke)" if smoke else "libnvidia-ml.so.1 via ctypes",
    }


def _fake_space() -> tune_multi.Space:
    """For --smoke (no tuning under the interpreter): a space of 4 configs whose 'memory'
    grows as its 'latency' falls."""
    configs = [tune_multi.Config({"BLOCK": b}, 4, 2) for b in (32, 64, 128, 256)]
    return tune_multi.Space("smoke", {"n": 1}, configs, lambda c: None)


def do_tune(op: str, smoke: bool) -> dict[str, Any]:
    if smoke:
        fake_ms = {32: 1.0, 64: 0.8, 128: 0.7, 256: 0.69}
        got = tune_multi.explore(
            _fake_space(),
            timer=lambda run, c: fake_ms[c.params["BLOCK"]],
            peak=lambda fn: 0,
            history={},
        ) | {"note": "smoke: a fake space (nothing is tuned under the interpreter)"}
        try:  # the split-K capture's code path (no space under the interpreter: merge refuses)
            _matmul_split_space(get_spec("matmul"), torch.float32, (6, 45, 300))
        except ValueError as exc:
            got["split_space"] = str(exc)
        return got
    spec = get_spec(op)
    shape = spec.shapes.bench[0]
    dtype = main_dtype(spec)
    call, _ = profile.case_call(spec, shape, dtype, "fwd", DEVICE)
    spaces = tune_multi.capture(call)
    if not spaces:
        return {"error": f"{op} {shape}: no tuning space consulted (a fixed config?)"}
    out = {"shape": str(shape), "spaces": []}
    for space in spaces[:1]:  # the op's main kernel (attention: the forward)
        out["spaces"].append(tune_multi.explore(space))
    if op == "matmul":  # a skinny GEMM, split-K factors 1-8 in one space: memory against time
        out["spaces"].append(_matmul_split_space(spec, dtype))
    return out


def _matmul_split_space(spec, dtype, shape=(256, 4096, 8192)) -> dict[str, Any]:
    """The tiles of every split-K factor (1, 2, 4, 8) of a (256, 4096, 8192) GEMM in one joint
    space: a split's workspace (split x M x N float32) is memory a faster config costs. The
    factor is forced by replacing the launcher's split_k_for while each space is captured."""
    import tritonkit.ops.matmul.plan as matmul_plan

    call, _ = profile.case_call(spec, shape, dtype, "fwd", DEVICE)
    real, spaces = matmul_plan.split_k_for, []
    try:
        for split in (1, 2, 4, 8):
            matmul_plan.split_k_for = lambda *a, s=split, **k: s
            spaces += [sp for sp in tune_multi.capture(call) if sp.kernel == "matmul"][:1]
    finally:
        matmul_plan.split_k_for = real
    got = tune_multi.explore(tune_multi.merge(spaces), large=64)
    got["shape"] = str(shape)
    return got


def markdown(doc: dict[str, Any]) -> str:
    lines = [f"# Issue 48 on {doc['gpu']}", "", f"torch {doc['torch']}", ""]
    steps = doc["steps"]
    for name, got in steps.items():
        lines += [f"## {name} ({got.get('seconds', '?')} s)", ""]
        if "error" in got or "skipped" in got:
            lines += [f"{got.get('error') or got.get('skipped')}", ""]
            continue
        if "text" in got:
            lines += ["```", got["text"], "```", ""]
        if "formula" in got:
            lines += [f"Formula: {got['formula']}", ""]
        for row in got.get("rows", []):
            lines.append("- " + ", ".join(f"{k}={v}" for k, v in row.items()))
        for sp in got.get("spaces", [got] if "pareto" in got else []):
            lines.append(
                f"- {sp['kernel']} {sp['key']}: {sp['measured']} of {sp['candidates']} configs "
                f"measured; Pareto set {len(sp['pareto'])}: "
                + "; ".join(
                    f"{p['config']} {p['ms']:.4g} ms {p.get('peak_bytes', 0) / 2**20:.3g} MiB"
                    for p in sp["pareto"]
                )
                + f"; weighted choice {sp['chosen']['config']} is "
                f"{sp['chosen_vs_fastest_pct']:.2f}% slower than the fastest "
                f"{sp['fastest']['config']} (100 x (chosen ms / fastest ms - 1)); trades "
                f"memory: {sp['trades_memory']}"
            )
        lines.append("")
    return "\n".join(lines)


def _cli(argv: list[str], timeout_s: float) -> dict[str, Any]:
    """``tritonkit ARGV`` in a child process, killed after ``timeout_s`` (a hang on the GPU must
    not take the rest of the run with it)."""
    import subprocess

    cmd = [sys.executable, "-m", "tritonkit.cli", *argv]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=max(10.0, timeout_s))
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-1500:]
        return {"exit": None, "timed_out_s": timeout_s, "stderr": tail.decode(errors="replace")}
    return {"exit": run.returncode, "stderr": run.stderr[-1500:], "stdout": run.stdout[-1500:]}


def do_bench(out: Path, smoke: bool, run: Run) -> dict[str, Any]:
    argv = ["bench", "rms_norm", "matmul", "--out", str(out / "bench"), "--force"]
    argv += ["--jobs", "1"] if smoke else ["--energy", "0.5", "--kernels"]
    got = {"bench": _cli(argv, run.left() * 0.7)}
    report = out / "bench" / "report.md"
    got["report"] = report.read_text()[-4000:] if report.exists() else None
    # Shape sensitivity (--sweep): rms_norm at seven sizes, size against % of the roofline.
    sweep = out / "sweep"
    argv = ["bench", "rms_norm", "--sweep", "--no-check", "--out", str(sweep), "--force"]
    got["sweep"] = _cli(argv, run.left())
    got["sweep_plots"] = sorted(p.name for p in sweep.glob("sweep_*.png"))
    return got


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny sizes")
    p.add_argument("--leak-calls", type=int, default=1000)
    p.add_argument("--long-run-s", type=float, default=20.0)
    p.add_argument("--energy-s", type=float, default=1.0)
    p.add_argument("--budget-s", type=float, default=330.0)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    smoke = a.smoke or not GPU
    run = Run(out, a.budget_s if not smoke else 1e9)
    run.doc["smoke"] = smoke
    for op in ("rms_norm", "matmul", "attention") if not smoke else ("rms_norm",):
        run.step(f"profile {op}", do_profile, op, out, smoke)
    for op in ("matmul", "attention") if not smoke else ("matmul",):
        run.step(f"multi-objective tuning {op}", do_tune, op, smoke)
    run.step(
        "energy", do_energy, ["rms_norm", "softmax", "matmul"], 0.2 if smoke else a.energy_s, smoke
    )
    run.step(
        "long-run check", do_long_run, ["rms_norm", "softmax"], 1.0 if smoke else a.long_run_s,
        smoke,
    )  # fmt: skip
    run.step("leak check", do_leaks, 3 if smoke else a.leak_calls, smoke, run)
    if not smoke:
        run.step("bench with RSD and energy", do_bench, out, smoke, run)
    print(f"wrote {out / 'why.json'} and {out / 'why.md'}")


if __name__ == "__main__":
    sys.exit(main())
