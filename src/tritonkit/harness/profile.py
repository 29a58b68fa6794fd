"""``tritonkit profile OP``: why a case sits where it does on the roofline.

Per kernel the case launches, from the compiled kernel (kernel_stats.py: on a GPU the
kernels as compiled there, without one compiled for sm_90 in a child process): registers,
spills, shared memory, warps, programs per SM and theoretical occupancy on sm_90. On a GPU,
measured per kernel, from the first source that works, said with each figure:

1. ``ncu`` (Nsight Compute) where it is on PATH: the case run in a child process under
   ``ncu --metrics ... --csv --profile-from-start off``, only the launches of one call between
   cudaProfilerStart and cudaProfilerStop (not the inputs' creation nor the compiling call),
   and of those only kernels torch.profiler saw the op's own call launch;
2. CUPTI's range profiler through torch.profiler
   (``_ExperimentalConfig(profiler_metrics=..., profiler_measure_per_kernel=True)``);
3. torch.profiler's kernel times only.

The metrics: achieved occupancy (``sm__warps_active.avg.pct_of_peak_sustained_active``), L2
hit rate (``lts__t_sector_hit_rate.pct``), DRAM GB/s (``dram__bytes.sum`` over
``gpu__time_duration.sum``) and SM efficiency (``smsp__cycles_active.avg.pct_of_peak_sustained_
elapsed``: the share of the kernel's time the SMs' schedulers had work). A torch.profiler
trace (chrome format, ``trace.json``), the memory timeline (``memory.json``, torch's
``export_memory_timeline``; where that finds no allocation it can attribute to a tensor, the
output says so and writes no file) and on a GPU the CUDA allocator's history of one call
(``memory_snapshot.pickle``, for pytorch.org/memory_viz, with its allocations and peak) are
written under ``--out``. The case's class (bottleneck.py's rule) comes from its roofline
place (the kernels' GPU time per call), its host time per call and the occupancy (achieved
where measured, else the least theoretical one).
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tritonkit.harness import bottleneck, kernel_stats, roofline
from tritonkit.harness.modes import _mode_callable
from tritonkit.harness.selection import main_dtype
from tritonkit.harness.spec import OpSpec, dtype_name, get_spec, parse_dtype

METRICS = {
    "achieved_occupancy": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "l2_hit_rate": "lts__t_sector_hit_rate.pct",
    "dram_bytes": "dram__bytes.sum",
    "duration_ns": "gpu__time_duration.sum",
    "sm_efficiency": "smsp__cycles_active.avg.pct_of_peak_sustained_elapsed",
}
_PERCENT = ("achieved_occupancy", "l2_hit_rate", "sm_efficiency")
NVTX_RANGE = "tritonkit_profile"


def _figures(raw: dict[str, float]) -> dict[str, float | None]:
    """Occupancy, hit rate and efficiency as fractions, DRAM GB/s, from raw metric values."""
    out: dict[str, float | None] = {}
    for name in _PERCENT:
        v = raw.get(METRICS[name])
        out[name] = v / 100.0 if v is not None else None
    nbytes, ns = raw.get(METRICS["dram_bytes"]), raw.get(METRICS["duration_ns"])
    out["dram_GBps"] = nbytes / ns if nbytes is not None and ns else None
    return out


def case_call(spec: OpSpec, shape: Any, dtype: torch.dtype, mode: str, device: torch.device):
    """The zero-argument call of one case, and its inputs."""
    inputs = spec.make_inputs(shape, dtype, device, 0)
    params = dict(spec.params[0])
    grad_idx = spec.grad_indices(inputs) if mode != "fwd" else []
    return _mode_callable(spec.impl, inputs, params, mode, grad_idx, 0), inputs


# ---- measured sources ----------------------------------------------------------------------


def parse_ncu_csv(text: str) -> list[dict[str, Any]]:
    """Per kernel launch of ``ncu --csv --print-units base``: name and raw metrics."""
    start = text.find('"ID"')
    if start < 0:
        return []
    kernels: dict[str, dict[str, Any]] = {}
    for row in csv.DictReader(io.StringIO(text[start:])):
        launch = kernels.setdefault(row["ID"], {"name": row["Kernel Name"], "raw": {}})
        try:
            value = float(row["Metric Value"].replace(",", ""))
        except ValueError:
            continue
        launch["raw"][row["Metric Name"]] = value
    return list(kernels.values())


def from_ncu(
    op: str, shape: Any, dtype: str, mode: str, timeout_s: float = 240.0
) -> list[dict[str, Any]] | str:
    """Per kernel launch under ncu (the case run once in a child process), or why not."""
    ncu = shutil.which("ncu")
    if ncu is None:
        return "ncu not on PATH"
    child = [sys.executable, "-m", "tritonkit.harness.profile", op, "--dtype", dtype]
    child += ["--mode", mode, "--shape", repr(shape)]
    argv = [ncu, "--csv", "--print-units", "base", "--metrics", ",".join(METRICS.values())]
    # Only the launches between the child's cudaProfilerStart and cudaProfilerStop: the case's
    # one measured call, not the inputs' creation (torch's random and copy kernels) nor the
    # compiling call before it.
    argv += ["--profile-from-start", "off"]
    argv += ["--target-processes", "all", *child]
    try:
        run = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"ncu took over {timeout_s:g} s"
    launches = parse_ncu_csv(run.stdout)
    if run.returncode != 0 or not launches:
        tail = (run.stderr or run.stdout).strip().splitlines()[-3:]
        return f"ncu failed ({run.returncode}): {' '.join(tail)[:300]}"
    return launches


def own_launches(launches: list[dict[str, Any]], names: set[str]) -> list[dict[str, Any]]:
    """The launches of the op's own kernels: those whose name is one torch.profiler saw the
    op's call launch (``names``); all of them where none matches (names spelled otherwise)."""
    own = [m for m in launches if m["name"] in names]
    return own if own else launches


def parse_cupti_trace(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """Per kernel of a torch.profiler trace taken with profiler_metrics: the events whose args
    hold any of METRICS (kineto writes CUPTI range-profiler values there)."""
    launches = []
    for ev in trace.get("traceEvents", []):
        args = ev.get("args") or {}
        raw = {m: float(args[m]) for m in METRICS.values() if isinstance(args.get(m), (int, float))}
        if raw:
            launches.append({"name": ev.get("name", "?"), "raw": raw})
    return launches


def from_cupti(call: Callable[[], Any], out: Path) -> list[dict[str, Any]] | str:
    """Per kernel launch of one call under CUPTI's range profiler, or why not."""
    try:
        from torch.profiler import ProfilerActivity, _ExperimentalConfig, profile

        config = _ExperimentalConfig(
            profiler_metrics=list(METRICS.values()), profiler_measure_per_kernel=True
        )
        with profile(activities=[ProfilerActivity.CUDA], experimental_config=config) as prof:
            call()
            torch.cuda.synchronize()
        path = out / "cupti_trace.json"
        prof.export_chrome_trace(str(path))
        launches = parse_cupti_trace(json.loads(path.read_text()))
    except Exception as exc:  # no CUPTI profiler API, counters not permitted, ...
        return f"CUPTI range profiler failed: {type(exc).__name__}: {str(exc)[:200]}"
    return launches or "CUPTI range profiler gave no metrics"


def trace(
    call: Callable[[], Any], out: Path, device: torch.device, calls: int | None = None
) -> dict[str, Any]:
    """torch.profiler over ``calls`` calls: the chrome trace, the memory timeline, and kernel
    times (device events, us per call) by name."""
    from torch.profiler import ProfilerActivity, profile

    calls = calls or (3 if device.type == "cuda" else 1)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    got: dict[str, Any] = {"files": {}}
    with profile(activities=acts, record_shapes=True, profile_memory=True, with_stack=True) as p:
        for _ in range(calls):
            call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    path = out / "trace.json"
    p.export_chrome_trace(str(path))
    got["files"]["trace"] = str(path)
    where = f"cuda:{torch.cuda.current_device()}" if device.type == "cuda" else "cpu"
    try:
        mem = out / "memory.json"
        # The device with its index ("cuda:0"): the exporter matches it to the events'
        # devices, and a bare "cuda" matches none (an empty timeline).
        with warnings.catch_warnings():  # deprecated in favour of CUDA snapshots (CPU too here)
            warnings.simplefilter("ignore", FutureWarning)
            p.export_memory_timeline(str(mem), device=where)
        times = json.loads(mem.read_text())[0]
        if times:
            got["files"]["memory_timeline"] = str(mem)
        else:
            mem.unlink()
            got["memory_timeline"] = (
                f"torch's export_memory_timeline found no allocation on {where} that it could "
                "attribute to a tensor (an empty timeline, not written)"
            )
    except Exception as exc:  # torch's exporter needs CUDA events on some versions
        got["memory_timeline"] = f"not exported: {type(exc).__name__}: {str(exc)[:200]}"
    if device.type == "cuda":
        snap = memory_snapshot(call, out, device)
        got["files"].update(snap.pop("files", {}))
        got.update(snap)
    times: dict[str, float] = {}
    # Kernel times on a GPU only: under the interpreter the trace holds every program's tensor
    # ops (tens of MB), whose averages take minutes and time nothing of a GPU.
    for e in p.key_averages() if device.type == "cuda" else ():
        us = getattr(e, "self_device_time_total", 0.0) or 0.0
        if us > 0 and e.device_type == torch.autograd.DeviceType.CUDA:
            times[e.key] = times.get(e.key, 0.0) + us / calls
    got["kernel_us"] = times
    return got


def memory_snapshot(call: Callable[[], Any], out: Path, device: torch.device) -> dict[str, Any]:
    """The CUDA caching allocator's history over one call (what torch recommends in place of
    export_memory_timeline): ``memory_snapshot.pickle`` (open it at pytorch.org/memory_viz),
    the allocations it made and its peak above what was allocated before it."""
    import pickle

    mem = torch.cuda.memory
    got: dict[str, Any] = {}
    try:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        mem._record_memory_history(max_entries=100_000)
        try:
            call()
            torch.cuda.synchronize(device)
            snap = mem._snapshot()
        finally:
            mem._record_memory_history(enabled=None)
        path = out / "memory_snapshot.pickle"
        path.write_bytes(pickle.dumps(snap))
        events = [e for trace in snap.get("device_traces", []) for e in trace]
        got["files"] = {"memory_snapshot": str(path)}
        got["memory"] = {
            "allocations": sum(e.get("action") == "alloc" for e in events),
            "peak_bytes": torch.cuda.max_memory_allocated(device) - before,
        }
    except Exception as exc:  # an allocator without history (another backend, an old torch)
        got["memory"] = {"error": f"no snapshot: {type(exc).__name__}: {str(exc)[:200]}"}
    return got


def _host_us(call: Callable[[], Any], device: torch.device, n: int = 20) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    us = (time.perf_counter() - t0) / n * 1e6
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return us


def _match(kernels: list[dict[str, Any]], measured: list[dict[str, Any]], source: str) -> None:
    """Put measured figures on the static kernels whose name they contain (one launch each)."""
    for m in measured:
        figures = _figures(m["raw"])
        for k in kernels:
            if k["name"] in m["name"] and "measured_by" not in k:
                k.update(figures)
                k["measured_by"] = source
                break
        else:
            kernels.append({"name": m["name"], **figures, "measured_by": source})


def profile_case(
    op: str,
    shape: Any = None,
    dtype: str | None = None,
    mode: str = "fwd",
    out: Path | str = "tritonkit-profile",
    static: bool = True,
    sources: tuple[str, ...] = ("ncu", "cupti", "torch.profiler"),
    ncu_timeout_s: float = 240.0,
) -> dict[str, Any]:
    """Static and (on a GPU) measured metrics of one case, its class, and the exported files.

    Args:
        op: the operator.
        shape: a bench shape (None: the spec's first).
        dtype: a dtype name (None: the operator's main dtype).
        mode: "fwd", "bwd" or "fwd+bwd".
        out: where trace.json, memory.json and profile.json go.
        static: also compile the kernels for sm_90 and read ptxas's report (a child process).
        sources: the measured sources to try, in order.
        ncu_timeout_s: the ncu child's time limit (then the next source is tried).
    """
    spec = get_spec(op)
    dt = parse_dtype(dtype) if dtype else main_dtype(spec)
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    if shape is None:
        shape = spec.shapes.bench[0] if gpu else spec.shapes.test[-1]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"op": op, "shape": str(shape), "dtype": dtype_name(dt), "mode": mode}
    result["device"] = torch.cuda.get_device_name() if gpu else "cpu (Triton interpreter)"
    call, inputs = case_call(spec, shape, dt, mode, device)
    call()  # compile before any measurement
    stat: dict[str, Any] = {}
    if gpu:  # the kernels as compiled on this GPU: no child process, no compile
        stat = kernel_stats.gpu_metrics(call)
    elif static:  # without a GPU: compiled for sm_90 in a child process
        stat = kernel_stats.static_metrics(op, shape, dtype_name(dt), mode)
        stat["source"] = "ptxas -v, sm_90a (compiled without a GPU)"
    kernels = [dict(k, static_source=stat["source"]) for k in stat.get("kernels", [])]
    if stat.get("error"):
        result["static_error"] = stat["error"]
    traced = trace(call, out, device)
    result["files"] = traced["files"]
    for key in ("memory_timeline", "memory"):
        if key in traced:
            result[key] = traced[key]
    result["kernel_us"] = traced["kernel_us"]
    result["tried"] = {}
    if gpu:
        for source in sources:
            if source == "ncu":
                got = from_ncu(op, shape, dtype_name(dt), mode, ncu_timeout_s)
                if not isinstance(got, str):  # torch's kernels (if any got in) left out
                    got = own_launches(got, set(traced["kernel_us"]))
            elif source == "cupti":
                got = from_cupti(call, out)
            else:
                got = []
            if isinstance(got, str):
                result["tried"][source] = got
                continue
            _match(kernels, got, source)
            result["measured_by"] = source
            break
    else:
        result["tried"]["gpu"] = "no GPU: static metrics only; interpreter times mean nothing"
    result["kernels"] = kernels
    if gpu:
        params = dict(spec.params[0])
        gpu_ms = sum(traced["kernel_us"].values()) / 1e3
        from tritonkit import _hardware

        prof = _hardware.active() or _hardware.match(torch.cuda.get_device_name())
        point = None
        if prof is not None and gpu_ms > 0:
            flops = spec.flops(inputs, mode, **params)
            nbytes = spec.bytes(inputs, mode, **params)
            point = roofline.place_on(
                prof, flops, nbytes, gpu_ms, roofline.peak_key(spec.compute, dt)
            )
        occ = [k["achieved_occupancy"] for k in kernels if k.get("achieved_occupancy")]
        occ = occ or [k["occupancy"] for k in kernels if k.get("occupancy")]
        result["gpu_us"] = gpu_ms * 1e3
        result["host_us"] = _host_us(call, device)
        result["pct_of_roofline"] = point.pct_of_roofline if point else None
        result["bound"], result["bound_why"] = bottleneck.classify(
            pct_of_roofline=result["pct_of_roofline"],
            roof_term=point.bottleneck if point else None,
            gpu_us=gpu_ms * 1e3,
            host_us=result["host_us"],
            occupancy=min(occ) if occ else None,
        )
    (out / "profile.json").write_text(json.dumps(result, indent=1, default=str))
    return result


def render(result: dict[str, Any]) -> str:
    """The profile as text: one line per kernel, the sources, the class and the files."""
    lines = [
        f"{result['op']} {result['shape']} {result['dtype']} {result['mode']} on {result['device']}"
    ]
    for k in result.get("kernels", []):
        parts = [k["name"]]
        if k.get("registers") is not None:
            spills = (
                f"local {k['local_bytes']} B"
                if "local_bytes" in k
                else f"spills {k.get('spill_stores', 0)}/{k.get('spill_loads', 0)} B"
            )
            parts.append(
                f"{k['registers']} regs, {spills}, smem {k.get('shared', 0)} B, "
                f"{k.get('num_warps')} warps, theoretical occupancy "
                f"{100 * k['occupancy']:.0f}% ({k.get('occupancy_limit')})"
            )
        if k.get("error"):
            parts.append(f"compile failed: {k['error'][:120]}")
        measured = [
            f"achieved occupancy {100 * k['achieved_occupancy']:.0f}%"
            if k.get("achieved_occupancy") is not None
            else None,
            f"L2 hit {100 * k['l2_hit_rate']:.0f}%" if k.get("l2_hit_rate") is not None else None,
            f"DRAM {k['dram_GBps']:.0f} GB/s" if k.get("dram_GBps") is not None else None,
            f"SM efficiency {100 * k['sm_efficiency']:.0f}%"
            if k.get("sm_efficiency") is not None
            else None,
        ]
        measured = [m for m in measured if m]
        if measured:
            parts.append(", ".join(measured) + f" [{k['measured_by']}]")
        lines.append("  " + " | ".join(parts))
    for source, why in result.get("tried", {}).items():
        lines.append(f"  ({source}: {why})")
    if result.get("kernel_us"):
        top = sorted(result["kernel_us"].items(), key=lambda kv: -kv[1])[:6]
        lines.append(
            "  kernel times [torch.profiler]: "
            + "; ".join(f"{n[:40]} {us:.1f} us" for n, us in top)
        )
    if result.get("bound"):
        lines.append(
            f"  class: {result['bound']} ({result['bound_why']}); "
            f"{_pct(result['pct_of_roofline'])} of the roofline, GPU {result['gpu_us']:.1f} us, "
            f"host {result['host_us']:.1f} us per call"
        )
    if result.get("memory_timeline"):
        lines.append(f"  memory timeline: {result['memory_timeline']}")
    mem = result.get("memory") or {}
    if "peak_bytes" in mem:
        lines.append(
            f"  memory of one call [CUDA allocator history]: {mem['allocations']} allocations, "
            f"peak {mem['peak_bytes'] / 2**20:.3g} MiB above the start"
        )
    elif mem.get("error"):
        lines.append(f"  memory: {mem['error']}")
    for name, path in result.get("files", {}).items():
        lines.append(f"  {name}: {path}")
    return "\n".join(lines)


def _pct(x: float | None) -> str:
    return f"{x:.0f}%" if x is not None else "—"


def _child(argv: list[str]) -> None:
    """Under ncu: run one case (compiled first, then the one call ncu measures)."""
    import argparse
    import ast

    p = argparse.ArgumentParser()
    p.add_argument("op")
    p.add_argument("--shape")
    p.add_argument("--dtype")
    p.add_argument("--mode", default="fwd")
    a = p.parse_args(argv)
    spec = get_spec(a.op)
    device = torch.device("cuda")
    call, _ = case_call(spec, ast.literal_eval(a.shape), parse_dtype(a.dtype), a.mode, device)
    call()  # compiles and tunes outside the range ncu measures
    torch.cuda.synchronize()
    torch.cuda.profiler.start()  # ncu --profile-from-start off: only what follows, to stop()
    torch.cuda.nvtx.range_push(NVTX_RANGE)
    call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    os.environ.setdefault("TRITONKIT_PROFILE_CHILD", "1")
    _child(sys.argv[1:])
