"""Issue 48 on one GPU: the workbench says why (profile, leaks, long runs, energy, Pareto tuning).

    PYTHONPATH=src python experiments/gpu_why.py --out DIR          # one H100, under 6 minutes
    PYTHONPATH=src python experiments/gpu_why.py --out DIR --smoke  # CPU interpreter, tiny

Steps, each timed and each result written as it comes (``why.json``, ``why.md`` under --out),
in the order 1, 4, 2, 3, 5, 6 (the acceptance's steps first):

1. ``tritonkit profile`` (harness/profile.py) on rms_norm, matmul and attention at a bench
   shape: per kernel the figures of the kernel as compiled on the GPU (registers, local
   memory, shared memory, theoretical occupancy on sm_90) and the measured ones (achieved
   occupancy, L2 hit rate, DRAM GB/s = dram__bytes / gpu__time_duration, SM efficiency) with
   the source that gave them (ncu over the op's one call only, CUPTI range profiler, or
   torch.profiler's kernel times), the class (harness/bottleneck.py's rule), a chrome trace,
   the memory timeline (or why it is empty) and the allocator's history of one call.
2. ``tritonkit bench rms_norm matmul attention --energy 0.5 --kernels`` in a child process
   (the main job's code path and report: RSD, energy and kernels columns, the class in
   % roofline) under --out/bench, killed at its share of the budget.
3. The leak check (harness/soak.py) for every operator of the main job's selection (its main
   dtype, its check shape), forward + backward where it has one, ``--leak-calls`` calls.
4. The multi-objective tuner (harness/tune_multi.py), per op a joint space whose configs
   differ in peak memory: matmul at a skinny (64, 512, 32768), split-K factors 1-16 (each
   split > 1 allocates a split x M x N fp32 workspace per call) beside the persistent tiles;
   attention's split-KV decoding (1 query, 16,384 keys, GQA 32/8 heads), key splits 1-32
   (each allocates batch x heads x splits x (head_dim + 1) fp32 partials); and the plain
   spaces at the bench shapes (4096^3 matmul, attention's forward). Reported: the Pareto set
   over (latency, peak memory), the weighted choice (tune_multi.WEIGHTS, peak memory weighed
   against what the process holds) and 100 x (chosen ms / fastest ms - 1).
5. Energy per call (harness/energy.py, NVML) for rms_norm, softmax and matmul.
6. The long-run check on rms_norm and softmax, ``--long-run-s`` seconds each.

No step starts after ``--budget-s`` (default 335 s in all; the process's start and imports
come on top, about 15 s), each has a cap of its own (``CAPS``), and a running one is
interrupted at its cap (the bench and ncu run in child processes with time limits); each says
so in why.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
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

    def cap(self, seconds: float) -> float:
        """What a step capped at ``seconds`` may take now: its cap or what is left, less."""
        return max(1.0, min(seconds, self.left()))

    def step(self, name: str, fn, *args, cap_s: float = 1e9, **kwargs) -> Any:
        if self.left() <= 1:
            self.doc["steps"][name] = {"skipped": "past the time budget"}
            self.save()
            return None
        t0 = time.perf_counter()
        # The budget is a wall-clock limit on each step too: Python-level loops are interrupted
        # (a call blocked inside CUDA ends at its next return to Python).
        signal.signal(signal.SIGALRM, _out_of_time)
        signal.alarm(max(2, int(self.cap(cap_s))))
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


# Each step's cap in seconds (and the whole run's --budget-s over them).
CAPS = {"profile": 45, "tune": 60, "bench": 130, "leak": 75, "energy": 15, "long": 25}


def do_profile(op: str, out: Path, smoke: bool, run: Run) -> dict[str, Any]:
    spec = get_spec(op)
    shape = spec.shapes.test[-1] if smoke else spec.shapes.bench[0]
    ncu_s = max(5.0, run.cap(CAPS["profile"]) - 15)  # the torch.profiler part before it
    result = profile.profile_case(
        op, shape, None, "fwd", out / f"profile-{op}", static=True, ncu_timeout_s=ncu_s
    )
    result["text"] = profile.render(result)
    print(result["text"], flush=True)
    return result


def do_leaks(calls: int, smoke: bool, run: Run) -> dict[str, Any]:
    rows = []
    specs = [s for s in select(None) if s.distributed is None]
    if smoke:
        specs = [s for s in specs if s.name in ("rms_norm", "softmax", "gelu")]
    end = time.perf_counter() + run.cap(CAPS["leak"])
    for spec in specs:
        if time.perf_counter() >= end:
            rows.append({"op": spec.name, "skipped": "past the step's time cap"})
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


def do_tune(op: str, smoke: bool, run: Run) -> dict[str, Any]:
    """The joint space whose configs differ in peak memory first (acceptance 3), then the
    plain space at the bench shape while the step's cap allows."""
    if smoke:
        fake_ms = {32: 1.0, 64: 0.8, 128: 0.7, 256: 0.69}
        fake_peak = {32: 0, 64: 1 << 20, 128: 2 << 20, 256: 4 << 20}
        last = []
        space = _fake_space()
        space.run = last.append

        def peak(fn):
            fn()
            return fake_peak[last[-1].params["BLOCK"]]

        got = tune_multi.explore(
            space,
            timer=lambda r, c: fake_ms[c.params["BLOCK"]],
            peak=peak,
            history={},
            resident=64 << 20,
        )
        got["note"] = "smoke: a fake space (nothing is tuned under the interpreter)"
        out = {"spaces": [got]}
        try:  # the joint spaces' code paths (under the interpreter nothing is captured)
            out["joint"] = str(_joint_space(op, smoke=True).key)
        except ValueError as exc:
            out["joint"] = str(exc)
        return _acceptance(out)
    end = time.perf_counter() + run.cap(CAPS["tune"])
    out: dict[str, Any] = {"spaces": []}
    joint = _joint_space(op)
    # Measuring stops with time to spare before the step's cap (what was measured is kept).
    seconds = end - time.perf_counter() - 10
    got = tune_multi.explore(joint, large=64, seconds=seconds)
    out["spaces"].append(got | {"shape": joint.key["shape"]})
    if time.perf_counter() < end - 15:  # the plain space at the bench shape, if time allows
        spec = get_spec(op)
        shape = spec.shapes.bench[0]
        call, _ = profile.case_call(spec, shape, main_dtype(spec), "fwd", DEVICE)
        spaces = tune_multi.capture(call)
        if spaces:  # the op's main kernel (attention: the forward)
            seconds = end - time.perf_counter() - 5
            got = tune_multi.explore(spaces[0], seconds=seconds)
            out["spaces"].append(got | {"shape": str(shape)})
    else:
        out["plain"] = "left out: the step's time cap"
    return _acceptance(out)


def _acceptance(out: dict[str, Any]) -> dict[str, Any]:
    """Acceptance 3 per op: a Pareto set in which a config trades latency for peak memory,
    and the weighted choice within 3% of the fastest (in that set's space)."""
    trading = [sp for sp in out["spaces"] if sp.get("trades_memory")]
    out["acceptance_3"] = bool(trading) and all(
        sp["chosen_vs_fastest_pct"] <= 3.0 for sp in trading
    )
    return out


def _joint_space(op: str, smoke: bool = False) -> tune_multi.Space:
    """The op's space whose configs differ in peak memory (tiny problems for --smoke)."""
    if op == "matmul":
        return _matmul_split_space(**({"shape": (6, 45, 300)} if smoke else {}))
    if op == "attention":
        tiny = {"batch": 1, "heads": 2, "kv_heads": 1, "keys": 40, "head_dim": 16}
        return _decode_split_space(**(tiny if smoke else {}))
    raise ValueError(f"no joint space for {op}")


def _with_global(module: Any, name: str, value: Any, fn: Callable[[], Any]) -> Any:
    """``fn()`` with ``module.name`` replaced by ``value`` (put back after)."""
    real = getattr(module, name)
    setattr(module, name, value)
    try:
        return fn()
    finally:
        setattr(module, name, real)


def _matmul_split_space(shape=(64, 512, 32768), splits=(1, 2, 4, 8, 16)) -> tune_multi.Space:
    """A skinny GEMM (8 output tiles of 64 x 64 on 132 SMs, a long K) whose split-K factors
    (1: the persistent kernel, else the tiled kernel plus a reduction, with a split x M x N
    fp32 workspace allocated per call) make one joint space: the factor is forced by replacing
    the launcher's split_k_for while each factor's space is captured."""
    import tritonkit.ops.matmul.plan as matmul_plan

    spec = get_spec("matmul")
    dtype = main_dtype(spec)
    call, _ = profile.case_call(spec, shape, dtype, "fwd", DEVICE)
    spaces = []
    for split in splits:
        got = _with_global(
            matmul_plan, "split_k_for", lambda *a, s=split, **k: s,
            lambda: tune_multi.capture(call),
        )  # fmt: skip
        spaces += [sp for sp in got if sp.kernel == "matmul"][:1]
    joint = tune_multi.merge(spaces)
    joint.key["shape"] = str(shape)
    return joint


def _decode_split_space(
    batch=4, heads=32, kv_heads=8, keys=16384, head_dim=128, splits=(1, 2, 4, 8, 16, 32)
) -> tune_multi.Space:
    """Split-KV decoding (one query per head, GQA): its tile space times key splits in one
    joint space. A split count is part of each config (SPLITS) and forced while the config
    runs by replacing the launcher's decode_splits; more splits: more programs, and partials
    of batch x heads x splits x (head_dim + 1) fp32 allocated per call."""
    import tritonkit
    import tritonkit.ops.attention.decode as decode

    dtype = torch.bfloat16 if GPU else torch.float32
    q = torch.randn(batch, heads, 1, head_dim, device=DEVICE, dtype=dtype)
    k = torch.randn(batch, kv_heads, keys, head_dim, device=DEVICE, dtype=dtype)
    v = torch.randn_like(k)
    spaces = tune_multi.capture(lambda: tritonkit.attention(q, k, v, enable_gqa=True))
    spaces = [sp for sp in spaces if sp.kernel == "attention_decode"]
    if not spaces:
        raise ValueError(
            "attention_decode: no tuning space consulted (the interpreter's fixed config)"
        )
    base = spaces[0]
    configs = [
        tune_multi.Config({**c.params, "SPLITS": n}, c.num_warps, c.num_stages)
        for n in splits
        for c in base.candidates
    ]

    def run(cfg: tune_multi.Config) -> Any:
        params = {key: val for key, val in cfg.params.items() if key != "SPLITS"}
        plain = tune_multi.Config(params, cfg.num_warps, cfg.num_stages)
        n = int(cfg.params["SPLITS"])
        return _with_global(decode, "decode_splits", lambda *a, **kw: n, lambda: base.run(plain))

    key = {**base.key, "shape": f"q {tuple(q.shape)}, k/v {tuple(k.shape)}"}
    key["joint"] = f"SPLITS: {list(splits)}"
    return tune_multi.Space("attention_decode", key, configs, run)


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
        if "argv" in got:  # the bench
            b = got["bench"]
            lines.append(f"`tritonkit {got['argv']}`: exit {b.get('exit')}")
            if b.get("timed_out_s"):
                lines.append(f"killed after {b['timed_out_s']:.0f} s (the step's cap)")
            lines += [f"    {line}" for line in got.get("estimate", [])]
            lines.append(f"columns in report.md: {got.get('columns')}")
            if got.get("report"):
                lines += ["", "report.md (tail):", "", got["report"][-3000:]]
            elif b.get("stderr"):
                lines += ["", "```", b["stderr"][-1500:], "```"]
        if "acceptance_3" in got:
            lines.append(
                f"- acceptance 3 (a memory trade, choice within 3%): {got['acceptance_3']}"
            )
        for sp in got.get("spaces", [got] if "pareto" in got else []):
            lines.append(
                f"- {sp['kernel']} {sp['key']}: {sp['measured']} of {sp['candidates']} configs "
                f"measured ({sp.get('not_measured', 0)} left out at the time cap); Pareto set "
                f"{len(sp['pareto'])}: "
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
    """The main job (``tritonkit bench``) with RSD, energy and the kernels' figures, in a child
    process killed at the step's cap; its report's tail and what it estimated and took."""
    ops = ["rms_norm"] if smoke else ["rms_norm", "matmul", "attention"]
    argv = ["bench", *ops, "--out", str(out / "bench"), "--force"]
    argv += ["--jobs", "1"] if smoke else ["--energy", "0.5", "--kernels"]
    got = {"argv": " ".join(argv), "bench": _cli(argv, run.cap(CAPS["bench"]) - 2)}
    err = got["bench"].get("stderr") or ""
    got["estimate"] = [line for line in err.splitlines() if "estimated" in line or "about" in line]
    report = out / "bench" / "report.md"
    got["report"] = report.read_text()[-6000:] if report.exists() else None
    if report.exists():
        text = report.read_text()
        got["columns"] = {c: f"| {c} |" in text for c in ("RSD", "energy", "kernels (sm_90)")}
    return got


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny sizes")
    p.add_argument("--leak-calls", type=int, default=1000)
    p.add_argument("--long-run-s", type=float, default=10.0)
    p.add_argument("--energy-s", type=float, default=1.0)
    p.add_argument("--budget-s", type=float, default=335.0)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    smoke = a.smoke or not GPU
    run = Run(out, a.budget_s if not smoke else 1e9)
    run.doc["smoke"] = smoke
    for op in ("rms_norm", "matmul", "attention") if not smoke else ("rms_norm",):
        run.step(f"profile {op}", do_profile, op, out, smoke, run, cap_s=CAPS["profile"])
    for op in ("matmul", "attention"):
        run.step(f"multi-objective tuning {op}", do_tune, op, smoke, run, cap_s=CAPS["tune"])
    run.step("bench with RSD, energy and kernels", do_bench, out, smoke, run, cap_s=CAPS["bench"])
    run.step("leak check", do_leaks, 3 if smoke else a.leak_calls, smoke, run, cap_s=CAPS["leak"])
    energy_s = 0.2 if smoke else a.energy_s
    ops = ["rms_norm", "softmax", "matmul"]
    run.step("energy", do_energy, ops, energy_s, smoke, cap_s=CAPS["energy"])
    long_s = 1.0 if smoke else a.long_run_s
    ops = ["rms_norm", "softmax"]
    run.step("long-run check", do_long_run, ops, long_s, smoke, cap_s=CAPS["long"])
    run.doc["total_s"] = round(time.perf_counter() - run.t0, 1)
    run.save()
    print(f"wrote {out / 'why.json'} and {out / 'why.md'}")


if __name__ == "__main__":
    sys.exit(main())
