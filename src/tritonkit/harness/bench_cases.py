"""The bench engine in one process (bench.py routes a distributed spec to its ranks, whose
processes run this too): time an operator against its baselines and variants, in one run.

For each bench shape, dtype and mode (fwd, bwd, fwd+bwd) of a spec, the tritonkit function,
its variants and every available baseline are timed interleaved (see timing.py). A record
holds, per candidate, the median time with its percentiles and spread, GB/s and TFLOP/s from
the spec's byte and FLOP formulas, its place on the roofline of the effective hardware profile
(measured ceilings), the peak memory of one call, and tritonkit's speedup over each baseline
(baseline median / ours) with a bootstrap confidence interval and a verdict. Then what a
user's loop sees, for every candidate: host time and wall time per call of back-to-back calls
(timing.time_loops), tritonkit's wall-time speedup over each baseline beside its GPU-time
one, and whether the host, not the GPU, sets its pace. Before timing, the output at the bench
shape is compared with the float64 reference.

Inputs a spec declares mutated get a copy of their own per candidate, restored from the same
values before every timed call (outside the timed region; the back-to-back loops let the calls
mutate them in turn, as a training loop's steps do); a distributed spec is timed on its ranks
(distributed.py), rank 0's records kept.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from tritonkit._hardware import Profile
from tritonkit.harness import bottleneck, energy, kernel_stats, roofline, stats, timing
from tritonkit.harness.check_cases import run_forward, with_own_state
from tritonkit.harness.modes import _mode_callable
from tritonkit.harness.spec import MODES, OpSpec, Unavailable, dtype_name
from tritonkit.harness.timing import peak_memory, summarize, time_interleaved
from tritonkit.ops._core.layout import LAYOUT_COPIES

OURS = "tritonkit"


def _bench_correctness(
    spec: OpSpec, inputs: tuple, params: dict, dtype: torch.dtype
) -> dict[str, Any]:
    """The forward's check at the bench shape, under the case dtype's tolerance (the case's
    dtype, not the first input's: a sparse operator's first input holds its indices)."""
    o = run_forward(spec, inputs, params, spec.tolerance_or_none(dtype), poison=False)
    correct = {
        "passed": o.passed,
        "max_abs": o.max_abs,
        "rel_l2": o.rel_l2,
        "torch_rel_l2": o.torch_rel_l2,
        "detail": o.detail,
    }
    if o.sqnr_db is not None:
        correct.update(sqnr_db=o.sqnr_db, err_p50=o.err_p50, err_p99=o.err_p99)
    return correct


def _restorer(spec: OpSpec, state: tuple, inputs: tuple) -> Callable[[], None]:
    """Puts the initial values back into a candidate's copy of the mutated inputs."""
    pairs = [(state[i], inputs[i]) for i in spec.mutates]

    def restore() -> None:
        for dst, src in pairs:
            dst.copy_(src)

    return restore


def bench_local(
    spec: OpSpec,
    *,
    profile: Profile,
    modes: Sequence[str] = ("fwd", "bwd"),
    dtypes: Sequence[torch.dtype] | None = None,
    baselines: Sequence[str] | None = None,
    shapes: Sequence[Any] | None = None,
    seed: int = 0,
    on_step: Callable[[str], None] | None = None,
    small: bool = False,
    sampling: Mapping[str, Any] | None = None,
    variants: bool = True,
    compile_modes: Sequence[str] = (),
    energy_s: float = 0.0,
    sweep: bool = False,
    kernels: bool = False,
) -> list[dict[str, Any]]:
    """Benchmark one operator; returns one record per (shape, dtype, mode). ``small`` adds the
    spec's small shapes (where a call's host time, not the GPU's, sets the pace) to the bench
    shapes. ``sampling``: keyword arguments for ``time_interleaved`` (the ranks of a distributed
    run fix the sample count; ``rsd_target`` there sets the repeats' target). ``variants``: also
    time the spec's versions of the kernel. ``compile_modes``: torch.compile modes
    ("max-autotune", "reduce-overhead") timed as further baselines of the spec's eager torch
    one. ``energy_s``: seconds of back-to-back calls per candidate measured by NVML (energy.py;
    0: none). A case whose check at the bench shape fails is not timed: its records say so.
    ``sweep``: the shapes of ``sweep_shapes`` (the records say ``sweep``; the report plots
    size against % of the roofline).
    ``kernels``: each record gets the figures of the kernels tritonkit's call launches, read
    from the kernels as compiled on this GPU (kernel_stats.gpu_metrics: registers, local
    memory, shared memory, theoretical occupancy; one extra call per case)."""
    device = torch.device("cuda", torch.cuda.current_device())
    params = dict(spec.params[0])
    records = []
    if sweep:
        shapes = sweep_shapes(spec)
    elif shapes is None:
        shapes = [*spec.shapes.bench, *(spec.shapes.small if small else ())]
    for shape in shapes:
        for dtype in dtypes or spec.bench_dtypes:
            if dtype not in spec.dtypes:
                continue
            inputs = spec.make_inputs(shape, dtype, device, seed)
            correct = _bench_correctness(spec, inputs, params, dtype)
            if not correct["passed"]:  # a wrong answer's speed means nothing
                why = (correct.get("detail") or "").splitlines()[:1]
                for mode in modes:
                    records.append(
                        _untimed(spec, shape, dtype, mode, params, correct, ": ".join(why))
                    )
                continue
            candidates: dict[str, tuple[str, Callable[..., Any] | None, str | None, bool]] = {
                OURS: ("tritonkit", spec.impl, None, spec.backward)
            }
            for name, variant in spec.variants.items() if variants else ():
                # Variants are versions of the forward kernel, shown side by side in fwd mode.
                candidates[name] = ("variant", variant, None, False)
            for name, baseline in spec.baselines.items():
                if baselines is not None and name not in baselines:
                    continue
                try:
                    candidates[name] = ("baseline", baseline.build(), None, baseline.backward)
                except Unavailable as why:
                    candidates[name] = ("baseline", None, str(why), baseline.backward)
            for cmode in compile_modes:
                candidates[f"torch.compile[{cmode}]"] = compiled_candidate(spec, cmode)
            for mode in modes:
                if on_step:
                    on_step(f"{spec.name} {dtype_name(dtype)} {shape} {mode}")
                record = _bench_case(
                    spec, shape, dtype, mode, inputs, params, candidates, profile, seed, sampling
                )
                if energy_s > 0 and _TIMED:
                    energy.measure_record(record, _TIMED, energy_s)
                if sweep:
                    record["sweep"] = True
                if kernels and OURS in _TIMED:
                    # From the kernels this process compiled and launched: no child process,
                    # no compile (the sm_90 compile without a GPU is for the CPU).
                    try:
                        got = kernel_stats.gpu_metrics(*_TIMED[OURS])
                    except Exception as exc:  # the figures are extra: the timing stands
                        got = {"kernels": [], "error": f"{type(exc).__name__}: {exc}"[:300]}
                    record["kernels"] = got.get("kernels", [])
                    record["kernels_source"] = got.get("source") or got.get("error")
                record["correct"] = correct
                records.append(record)
            del inputs, candidates
            gc.collect()
            torch.cuda.empty_cache()
    return records


def sweep_shapes(spec: OpSpec, steps: int = 6) -> list[Any]:
    """Sizes for a shape-sensitivity sweep: the first bench shape with its leading dimension
    divided by 4**k (k = steps - 1 ... 0), then the spec's other bench shapes; where shapes are
    not tuples of integers, the small shapes then the bench shapes."""
    base = spec.shapes.bench[0]
    if isinstance(base, tuple) and base and all(isinstance(d, int) for d in base):
        scaled = [(max(1, base[0] // 4**k), *base[1:]) for k in range(steps - 1, -1, -1)]
        return list(dict.fromkeys([*scaled, *spec.shapes.bench]))
    return list(dict.fromkeys([*spec.shapes.small, *spec.shapes.bench]))


def _untimed(spec, shape, dtype, mode, params, correct, why) -> dict[str, Any]:
    """The record of a case not timed because its check failed."""
    return {
        "op": spec.name,
        "family": spec.family,
        "params": dict(params),
        "shape": str(shape),
        "dtype": dtype_name(dtype),
        "mode": mode,
        "bytes": None,
        "flops": None,
        "candidates": {},
        "speedup": {},
        "note": f"not timed: the check at this shape failed ({why or 'see the accuracy table'})",
        "correct": correct,
        "untimed": "check failed",
    }


def compiled_candidate(spec: OpSpec, cmode: str) -> tuple:
    """A bench candidate: torch.compile of the spec's eager torch baseline in mode ``cmode``
    (a fresh compile per case: dynamo's cache is per code object, see specs/_common.py)."""
    base = spec.baselines.get("torch")
    if base is None:
        return ("baseline", None, "the spec has no eager torch baseline to compile", False)
    try:
        eager = base.build()
    except Unavailable as why:
        return ("baseline", None, str(why), base.backward)
    torch._dynamo.reset()

    def run(*args: Any, **kwargs: Any) -> Any:
        return eager(*args, **kwargs)

    return ("baseline", torch.compile(run, mode=cmode, dynamic=False), None, base.backward)


# The calls the last _bench_case timed, by candidate, with their setup (mutated inputs put
# back): energy.measure_record's loops call them again. Refilled by every case.
_TIMED: dict[str, tuple[Callable[[], Any], Callable[[], None] | None]] = {}


def _bench_case(spec, shape, dtype, mode, inputs, params, candidates, profile, seed, sampling):
    _TIMED.clear()  # a case that times nothing leaves nothing for energy or the kernels
    n_bytes = spec.bytes(inputs, mode, **params)
    n_flops = spec.flops(inputs, mode, **params)
    record: dict[str, Any] = {
        "op": spec.name,
        "family": spec.family,
        "params": {k: v for k, v in params.items()},
        "shape": str(shape),
        "dtype": dtype_name(dtype),
        "mode": mode,
        "bytes": n_bytes,
        "flops": n_flops,
        "candidates": {},
        "speedup": {},
        "note": None,
    }
    if spec.mutates:
        record["mutates"] = list(spec.mutates)
    note = spec.bench_note(shape, mode)
    if note is not None or (mode != "fwd" and not spec.backward):
        record["note"] = note or "no backward pass"
        return record
    grad_idx = spec.grad_indices(inputs)
    runnable: dict[str, Callable[[], Any]] = {}
    setup: dict[str, Callable[[], None]] = {}  # restores each candidate's mutated inputs
    for name, (kind, fn, skipped, has_bwd) in candidates.items():
        entry: dict[str, Any] = {"kind": kind}
        record["candidates"][name] = entry
        if fn is None:
            entry["skipped"] = skipped
            continue
        if mode != "fwd" and not has_bwd:
            entry["skipped"] = "no backward pass"
            continue
        try:
            args = with_own_state(spec, inputs)
            call = _mode_callable(fn, args, params, mode, grad_idx, seed)
            call()  # compile, and fail here rather than in the middle of the timing
            runnable[name] = call
            if spec.mutates:
                setup[name] = _restorer(spec, args, inputs)
        except Exception as exc:  # a candidate that fails is reported, not fatal
            entry["skipped"] = f"{type(exc).__name__}: {exc}"[:300]
    if not runnable:
        record["note"] = "nothing could run"
        return record
    if OURS in runnable:  # inputs tritonkit had to copy for lack of a strided view, per call
        LAYOUT_COPIES.reset()
        if OURS in setup:
            setup[OURS]()
        runnable[OURS]()
        record["layout_copies"] = LAYOUT_COPIES.reset()
    host_us: dict[str, float] = {}
    repeats: dict[str, dict[str, Any]] = {}
    record["l2_flush"] = timing.FLUSH  # how the L2 was emptied before each sample
    samples = time_interleaved(
        runnable, host_times=host_us, setup=setup or None, repeats=repeats, **(sampling or {})
    )
    _TIMED.clear()
    _TIMED.update({name: (fn, setup.get(name)) for name, fn in runnable.items()})
    medians = {name: float(summarize(times).median) for name, times in samples.items()}
    loops = timing.time_loops(runnable, medians)
    for restore in setup.values():
        restore()
    device = torch.device("cuda", torch.cuda.current_device())
    key = roofline.peak_key(spec.compute, dtype)
    record["roofline_peak"] = key
    for name, times in samples.items():
        stats_ = summarize(stats.remove_outliers(times))
        entry = record["candidates"][name]
        entry.update(stats_.as_dict())
        entry.update(repeats.get(name, {}))  # batches, rsd_met: did the repeats reach the target
        entry["host_us"] = loops[name]["host_us"]  # per call, back to back
        entry["wall_us"] = loops[name]["wall_us"]
        entry["loop_calls"] = loops[name]["calls"]
        entry["host_bound"] = loops[name]["host_us"] > 1e3 * stats_.median
        entry["samples_ms"] = [float(f"{t:.5g}") for t in times]
        point = roofline.place_on(profile, n_flops, n_bytes, stats_.median, key)
        entry["GBps"] = point.achieved_GBps
        entry["TFLOPs"] = point.achieved_TFLOPs
        entry["pct_copy_bw"] = 100.0 * point.achieved_GBps / profile.dram_GBps if n_bytes else None
        entry["pct_of_roofline"] = point.pct_of_roofline
        entry["bottleneck"] = point.bottleneck
        entry["intensity"] = point.intensity if n_bytes else None
        # The class with the latency, occupancy and launch/host cases (bottleneck.py's rule);
        # occupancy enters where `tritonkit profile` adds it, not here.
        entry["bound"], entry["bound_why"] = bottleneck.classify_entry(entry)
        if name in setup:
            setup[name]()
        entry["peak_mem_bytes"] = peak_memory(runnable[name], device)
    record["comparison"] = {}
    record["wall_speedup"] = {}
    if OURS in samples:
        ours_wall = record["candidates"][OURS]["wall_us"]
        for name, entry in record["candidates"].items():
            if entry["kind"] == "baseline" and entry.get("wall_us"):
                record["wall_speedup"][name] = entry["wall_us"] / ours_wall
        for name, entry in record["candidates"].items():
            if entry["kind"] == "baseline" and name in samples:
                cmp = stats.compare(samples[OURS], samples[name], seed=seed)
                record["speedup"][name] = cmp.speedup
                record["comparison"][name] = cmp.as_dict()
    return record


def default_modes(mode: str) -> tuple[str, ...]:
    if mode == "all":
        return MODES
    modes = tuple(m.strip() for m in mode.split(","))
    for m in modes:
        if m not in MODES:
            raise ValueError(f"unknown mode {m!r}; expected one of {', '.join(MODES)} or all")
    return modes
