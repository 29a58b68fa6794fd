"""The workbench says why (issue 48): RSD-driven repeats, constant edge inputs, timing skipped
after a failed check, energy from NVML (a fake library), static kernel metrics for sm_90,
the bottleneck class, leak and long-run checks, multi-objective tuning, regress over shared
cases and the trend; and no import cycle inside the harness (issue 45)."""

import ast
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tritonkit.cli import main
from tritonkit.harness import (
    bottleneck,
    energy,
    kernel_stats,
    regress,
    report,
    soak,
    timing,
    trend,
    tune_multi,
)
from tritonkit.harness.check import CONSTANTS, check_spec, inject_constant
from tritonkit.harness.spec import get_spec, select

from _synthetic import synthetic_record, synthetic_results

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "src" / "tritonkit" / "harness"
GPU = torch.cuda.is_available()
# The leak check: 1,000 calls of forward + backward on a GPU (seed 000). Under the interpreter
# every call runs each kernel program by program (tens of seconds for 1,000 calls of the
# cheapest operator), so CI runs the same check at the smallest test shape, forward only, with
# two warm-up calls and two measured ones: it still catches a cache or a Python reference that
# grows per call, which is how a leak shows on the CPU.
LEAK_CALLS, LEAK_MODE, LEAK_WARMUP = (1000, None, 3) if GPU else (2, "fwd", 2)


# ---- statistics -----------------------------------------------------------------------------


def test_summarize_gives_std_and_rsd():
    s = timing.summarize([1.0, 2.0, 3.0, 4.0])
    assert s.std == pytest.approx(torch.tensor([1.0, 2.0, 3.0, 4.0]).std().item())  # host: stats
    assert s.rsd == pytest.approx(s.std / 2.5)
    assert timing.summarize([2.0]).rsd == 0.0


def _batches(draws):
    it = iter(draws)
    return lambda: {"a": list(next(it))}


def test_repeats_continue_until_the_rsd_target():
    noisy = [1.0, 1.5, 0.6, 1.4, 0.7] * 4  # RSD about 35%
    steady = [1.0, 1.01, 0.99, 1.0, 1.02] * 40
    repeats = {}
    got = timing.until_stable(_batches([noisy, steady, steady, steady]), 0.05, 1e9, 10**6, repeats)
    # The noisy batch's samples are kept; enough steady ones bring the RSD under 5%.
    assert repeats["a"]["rsd_met"] and repeats["a"]["batches"] >= 2
    assert timing.rsd_of(got["a"]) <= 0.05
    assert len(got["a"]) == len(noisy) + (repeats["a"]["batches"] - 1) * len(steady)


def test_repeats_stop_at_the_wall_clock_cap():
    """Samples whose sum never reaches the GPU-time cap (tiny kernels) and whose RSD never
    drops: the wall-clock cap ends the loop (each batch here takes 4 s of a fake clock)."""
    now = [0.0]

    def batch():
        now[0] += 4.0
        return {"a": [0.001, 0.002, 0.0005, 0.003]}

    repeats = {}
    got = timing.until_stable(
        batch, 0.05, cap_ms=1e9, max_total=10**9, repeats=repeats, wall_s=10.0,
        clock=lambda: now[0],
    )  # fmt: skip
    assert repeats["a"]["batches"] == 4 and not repeats["a"]["rsd_met"] and len(got["a"]) == 16


def test_repeats_stop_at_the_time_cap_and_say_the_target_was_missed():
    noisy = [1.0, 1.6, 0.5, 1.5, 0.6] * 4
    repeats = {}
    timing.until_stable(_batches([noisy] * 10), 0.05, cap_ms=30.0, max_total=10**6, repeats=repeats)
    # Each further batch adds 20 ms of samples: the cap of 30 ms stops after two of them.
    assert repeats["a"] == {
        "batches": 3,
        "rsd": pytest.approx(repeats["a"]["rsd"]),
        "rsd_met": False,
    }
    one = {}
    timing.until_stable(_batches([noisy]), None, 1e9, 10**6, one)
    assert one["a"]["batches"] == 1 and one["a"]["rsd_met"]


def test_a_timing_whose_rsd_never_drops_ends_at_the_wall_cap_and_the_report_says_so():
    """The repeats' wall-clock cap with a fake clock (a batch takes 3 s, its RSD stays about
    35%): the loop ends once 10 s have passed, and the report's row flags the missed target."""
    now = [0.0]
    noisy = [1.0, 1.5, 0.6, 1.4, 0.7] * 4

    def batch():
        now[0] += 3.0
        return {"tritonkit": list(noisy)}

    repeats = {}
    timing.until_stable(
        batch, 0.05, cap_ms=1e12, max_total=10**9, repeats=repeats, wall_s=10.0,
        clock=lambda: now[0],
    )  # fmt: skip
    got = repeats["tritonkit"]
    assert got["batches"] == 5 and got["rsd_met"] is False and now[0] == 15.0
    rec = synthetic_record()
    rec["candidates"]["tritonkit"].update(got)
    md = report.render_markdown(synthetic_results([rec]))
    assert f"missed the target after {got['batches']} batches" in md and "⚑" in md


def test_slow_candidates_are_timed_apart_and_loops_are_capped():
    # A 301 ms naive version beside 0.2 ms ones: a few samples of its own, no repeats.
    assert timing.split_slow({"naive": 301.0, "tiled": 0.35, "tritonkit": 0.18}) == (
        ["naive"],
        ["tiled", "tritonkit"],
    )
    # All slow: timed together as usual (nothing else to compare against).
    assert timing.split_slow({"a": 80.0, "b": 90.0}) == ([], ["a", "b"])
    # The back-to-back loops: about round_ms of calls, at least min_calls, except where
    # min_calls of a slow candidate would take over 10 x round_ms (one 301 ms call per round).
    assert timing.loop_calls(0.1, 30.0, 10, 300) == 300
    assert timing.loop_calls(5.0, 30.0, 10, 300) == 10
    assert timing.loop_calls(301.0, 30.0, 10, 300) == 1


def test_the_estimate_counts_repeats_energy_and_kernels():
    from tritonkit.cli import build_parser
    from tritonkit.harness import selection
    from tritonkit.harness.cli_why import cost_options

    spec = get_spec("matmul")
    plain = selection.mode_seconds(spec, True, True)
    args = build_parser().parse_args(["bench", "matmul", "--energy", "0.5", "--kernels"])
    opts = cost_options(args)
    assert opts == {"rsd": True, "energy_s": 0.5, "kernels": True, "compile_modes": ()}
    full = selection.mode_seconds(spec, True, True, **opts)
    candidates = 1 + len(spec.variants) + len(spec.baselines)
    extra = candidates * (0.5 + selection.GPU_ENERGY_EXTRA_S)
    extra += selection.GPU_RSD_S + selection.GPU_KERNELS_S
    assert full == pytest.approx(plain + extra)
    no_rsd = build_parser().parse_args(["bench", "matmul", "--rsd", "0"])
    assert selection.mode_seconds(spec, True, True, **cost_options(no_rsd)) == plain


def test_static_metrics_are_cached_per_case_and_time_capped(monkeypatch):
    calls = []

    def fake_run(argv, **kw):
        calls.append(kw["timeout"])
        raise subprocess.TimeoutExpired(argv, kw["timeout"])

    monkeypatch.setattr(kernel_stats.subprocess, "run", fake_run)
    monkeypatch.setattr(kernel_stats, "_STATIC_CACHE", {})
    got = kernel_stats.static_metrics("relu", (8, 8), "float32", "fwd", timeout_s=7.0)
    assert got["kernels"] == [] and "took over 7 s" in got["error"]
    kernel_stats.static_metrics("relu", (8, 8), "float32", "fwd", timeout_s=7.0)
    assert calls == [7.0]  # the second ask is the first's answer


def test_the_kernels_a_call_launches_are_read_from_triton_s_launcher(monkeypatch):
    """On the CPU with Triton's launcher replaced by a stub: inside ``through_triton`` every
    launch takes it (a launch hook is set, the replay is off) and each compiled kernel is
    recorded with its programs; everything is put back after. Then the figures of a kernel
    as the driver reports them (n_regs, n_spills in 4-byte words, metadata.shared)."""
    import types

    import triton
    from triton.runtime.jit import JITFunction

    from tritonkit.ops._core import registry

    compiled = types.SimpleNamespace(
        name="k", n_regs=128, n_spills=6, metadata=types.SimpleNamespace(
            shared=100 * 1024, num_warps=4, num_stages=3), _init_handles=lambda: None,
    )  # fmt: skip
    monkeypatch.setattr(JITFunction, "run", lambda self, *a, grid, warmup, **kw: compiled)
    chain = triton.knobs.runtime.launch_enter_hook
    replay, hooks = registry._REPLAY, list(chain.calls)
    fn = types.SimpleNamespace(arg_names=["x", "n", "BLOCK"])
    found = {}
    with kernel_stats.through_triton(found):
        assert chain.calls and registry._REPLAY is False
        JITFunction.run(fn, 1, 1000, grid=lambda m: (m["n"] // m["BLOCK"],), warmup=False, BLOCK=8)
        JITFunction.run(fn, 1, 1000, grid=(3,), warmup=True)  # a compile, not a launch
    assert list(found.values()) == [(compiled, 125)]
    assert chain.calls == hooks and registry._REPLAY is replay
    got = kernel_stats.compiled_metrics(compiled, 125)
    assert got["registers"] == 128 and got["local_bytes"] == 24 and got["shared"] == 100 * 1024
    # 128 registers x 4 warps: 4 programs by registers; 100 KiB + 1 KiB: 2 by shared memory.
    assert got["programs_per_sm"] == 2 and got["occupancy_limit"] == "shared memory"
    assert got["waves"] == pytest.approx(125 / (2 * kernel_stats.H100_SMS))


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="reads the kernels as compiled on a GPU")
def test_gpu_metrics_read_the_compiled_kernels(device):
    from tritonkit.harness.profile import case_call

    spec = get_spec("rms_norm")
    call, _ = case_call(spec, (4096, 4096), torch.bfloat16, "fwd", device)
    call()
    got = kernel_stats.gpu_metrics(call)
    [k] = got["kernels"]
    assert k["name"].startswith("norm_fwd") and 0 < k["registers"] <= 255
    assert 0 < k["occupancy"] <= 1 and k["local_bytes"] >= 0 and k["num_warps"] >= 1


# Recorded on an H100 by the main job (`tritonkit bench`): 70 records without the new fields.
RECORDED = ROOT / "benchmarks/results/nvidia-h100/session-2026-11-27/main-job-results.json"


def _with_new_fields(doc):
    """The recorded document with the fields the new code writes, as it writes them: RSD and
    repeats, energy, a slow version timed apart, the kernels read on the GPU, one record
    whose NVML was missing and one whose kernels could not be read."""
    for i, r in enumerate(doc["bench"]):
        for c in r["candidates"].values():
            if "median" not in c:
                continue
            c.update(batches=1 + i % 3, rsd=0.01 + 0.03 * (i % 3), rsd_met=i % 7 != 3)
            c.update(watts=500.0 + i, joules_per_call=1e-4 * (1 + i % 5))
            c.update(energy_source="energy counter", GFLOPs_per_W=None, GBps_per_W=3.2)
        if r.get("note"):
            continue
        if i % 11 == 5:
            r["energy"] = "not measured: NVML not available: libnvidia-ml.so.1"
        if i % 13 == 6:
            r["kernels"] = [{"name": "k", "error": "OutOfResources: shared memory"}]
        else:
            r["kernels"] = [
                {"name": f"{r['op']}_kernel", "programs": 4096, "num_stages": 3,
                 "registers": 64, "local_bytes": 16 * (i % 2), "shared": 32768, "num_warps": 4,
                 "programs_per_sm": 6, "occupancy": 0.375, "occupancy_limit": "shared memory",
                 "waves": 5.2},
            ]  # fmt: skip
            r["kernels_source"] = "the compiled kernels on this GPU (CUDA driver attributes)"
    return doc


def test_report_from_recorded_gpu_data_with_the_new_columns(tmp_path):
    """The main job's report (results.json, report.md, plots) written from a GPU document
    with every new field, then read back and rendered again: no crash on GPU-only fields."""
    doc = _with_new_fields(json.loads(RECORDED.read_text()))
    doc["bench"].insert(0, _slow_version_record())
    written = report.write_report(doc, tmp_path)
    assert (tmp_path / "report.md") in written and (tmp_path / "results.json") in written
    md = (tmp_path / "report.md").read_text()
    assert "| RSD | energy | kernels (sm_90) |" in md
    assert "_kernel: 64 reg, local 16 B, occ 38%" in md
    assert "k: OutOfResources: shared memory" in md
    assert "missed the target" in md and "`energy`: NVML" in md
    # The slow version: in the versions table, no ⚑ (it is not repeated to a target).
    assert "| naive | 301 |" in md
    again = report.load_json(tmp_path / "results.json")
    assert report.render_markdown(again) == report.render_markdown(doc)


def _slow_version_record():
    rec = synthetic_record(op="matmul", ours_ms=0.183, base_ms=0.175)
    rec.update(family="matmul", flops=2 * 4096**3, shape="(4096, 4096, 4096)")
    rec["candidates"]["tritonkit"].update(TFLOPs=750.0, bottleneck="compute", rsd=0.004,
                                          rsd_met=True, batches=1)  # fmt: skip
    rec["candidates"]["naive"] = {
        "kind": "variant", "median": 301.0, "TFLOPs": 0.457, "bottleneck": "compute",
        "rsd": 0.002, "rsd_met": None, "batches": 1, "slow": "3 samples (over 50 ms per call)",
        "samples_ms": [301.0, 301.2, 300.9],
    }  # fmt: skip
    rec["candidates"] = {"naive": rec["candidates"].pop("naive"), **rec["candidates"]}
    return rec


def test_report_carries_rsd_energy_and_kernels_and_flags_a_missed_target():
    rec = synthetic_record()
    ours = rec["candidates"]["tritonkit"]
    ours.update(rsd=0.083, rsd_met=False, batches=10, std=0.0083, bound="latency")
    ours.update(watts=412.0, joules_per_call=2.1e-4, GBps_per_W=2.56, GFLOPs_per_W=None)
    rec["kernels"] = [
        {
            "name": "relu_kernel",
            "registers": 40,
            "occupancy": 0.75,
            "achieved_occupancy": 0.61,
            "l2_hit_rate": 0.12,
            "dram_GBps": 3000.0,
        }
    ]
    md = report.render_markdown(synthetic_results([rec]))
    assert "| RSD | energy | kernels (sm_90) |" in md
    assert "8.3% ⚑" in md and "412 W; 210 uJ; 2.56 GB/s/W" in md
    assert "relu_kernel: 40 reg, occ 75% (achieved 61%), L2 hit 12%, DRAM 3,000 GB/s" in md
    assert "RSD 8.3% missed the target after 10 batches" in md
    assert "(latency)" in md and "`RSD`: standard deviation over mean" in md
    # A document without the new fields renders without their columns.
    assert "RSD" not in report.render_markdown(synthetic_results([synthetic_record()]))


def test_untimed_case_is_said_in_the_report():
    from tritonkit.harness.bench_cases import _untimed

    spec = get_spec("rms_norm")
    correct = {"passed": False, "rel_l2": 0.5, "detail": "output 0: 3 elements out of bound"}
    rec = _untimed(spec, (64, 64), torch.bfloat16, "fwd", {}, correct, correct["detail"])
    md = report.render_markdown(synthetic_results([synthetic_record(), rec]))
    assert "not timed: the check at this shape failed (output 0: 3 elements out of bound)" in md


# ---- constant edge inputs -------------------------------------------------------------------


def test_inject_constant_fills_float_inputs_only_where_the_dtype_holds_the_value():
    x, idx = torch.randn(3, 4), torch.arange(3)  # host: inputs are filled wherever they live
    got = inject_constant((x, idx), 65000.0)
    assert torch.all(got[0] == 65000.0) and got[1] is idx
    assert inject_constant((x.to(torch.float8_e4m3fn), idx), 65000.0) is None  # max 448
    assert inject_constant((idx,), 1.0) is None
    assert CONSTANTS == (0.0, 1.0, 1e-7, 65000.0)


def _min_shape(spec):
    return [spec.shapes.test[0]]


@pytest.mark.parametrize("name", sorted(s.name for s in select(None) if s.distributed is None))
def test_constant_edge_inputs_for_every_op(name, device):
    """zeros, ones, 1e-7 and 65000 (where the dtype holds it) give PyTorch's answer, NaN and
    infinities included, for every operator at its smallest test shape in its first dtype."""
    spec = get_spec(name)
    dtype = next(d for d in spec.dtypes if d not in spec.interpreter_skip or GPU)
    results = check_spec(
        spec, dtypes=[dtype], shapes=_min_shape(spec), device=device, seed=0, cases=("constants",)
    )
    bad = [f"{r.shape} {r.dtype}: {r.detail}" for r in results if not r.passed and not r.skipped]
    assert results and not bad, bad


def test_constant_case_fails_an_operator_wrong_on_zeros(device):
    spec = get_spec("softmax")

    def wrong_on_zeros(x, *args, **kwargs):
        out = spec.impl(x, *args, **kwargs)
        return out + 1e-2 if not x.any() else out

    broken = dataclasses.replace(spec, impl=wrong_on_zeros)
    results = check_spec(
        broken,
        dtypes=[torch.float32],
        shapes=[(5, 33)],
        device=device,
        seed=0,
        cases=("constants",),
    )
    assert results and all(
        not r.passed and r.detail.startswith("all inputs 0:") for r in results
    ), [r.detail for r in results]


# ---- energy with a fake NVML ----------------------------------------------------------------


class FakeLib:
    """The NVML functions energy.py calls, writing through the byref pointers they get."""

    def __init__(self, counter=True, watts=250.0):
        self.counter, self.watts, self.mj, self.inits = counter, watts, 10_000, 0

    def nvmlInit_v2(self):
        self.inits += 1
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, index, handle):
        handle._obj.value = 1234
        return 0

    def nvmlDeviceGetHandleByPciBusId_v2(self, bus, handle):
        return 0 if bus.startswith(b"0000") else 999

    def nvmlDeviceGetPowerUsage(self, handle, mw):
        mw._obj.value = int(self.watts * 1e3)
        return 0

    def nvmlDeviceGetTotalEnergyConsumption(self, handle, mj):
        if not self.counter:
            return 3  # NVML_ERROR_NOT_SUPPORTED
        self.mj += 500  # 0.5 J between reads
        mj._obj.value = self.mj
        return 0


def test_nvml_through_ctypes_with_a_fake_library():
    nvml = energy.Nvml(FakeLib(), index=0)
    assert nvml.handle.value == 1234 and nvml.has_counter
    assert nvml.power_w() == 250.0 and isinstance(nvml.energy_j(), float)
    with pytest.raises(energy.NvmlError, match="nvmlDeviceGetHandleByPciBusId_v2 returned NVML"):
        energy.Nvml(FakeLib(), pci_bus_id="ffff:01:00.0")
    assert not energy.Nvml(FakeLib(counter=False)).has_counter
    with pytest.raises(energy.NvmlError, match="NVML has no nvmlInit_v2"):
        energy.Nvml(object())


def test_energy_per_call_from_the_counter_and_from_power_samples():
    calls = []

    def fn():
        calls.append(1)

    got = energy.measure(fn, 0.05, nvml=energy.Nvml(FakeLib()), sync=lambda: None)
    assert got["source"] == "energy counter" and got["calls"] > 0
    assert got["joules_per_call"] == pytest.approx(0.5 / got["calls"])
    assert got["watts"] == pytest.approx(0.5 / got["seconds"])
    sampled = energy.measure(
        fn, 0.05, nvml=energy.Nvml(FakeLib(counter=False, watts=300.0)), sync=lambda: None
    )
    assert sampled["source"] == "power samples"
    assert sampled["watts"] == pytest.approx(300.0, rel=1e-6)
    assert energy.integrate([(0.0, 100.0), (1.0, 300.0), (3.0, 300.0)]) == 800.0
    eff = energy.per_watt({"flops": 2e9, "bytes": 4e9}, 0.5)
    assert eff == {"GFLOPs_per_W": 4.0, "GBps_per_W": 8.0}


def test_measure_record_adds_energy_to_each_timed_candidate():
    rec = synthetic_record()
    timed = {"tritonkit": (lambda: None, None), "torch": (lambda: None, lambda: None)}
    energy.measure_record(rec, timed, 0.02, nvml=energy.Nvml(FakeLib()), sync=lambda: None)
    for name in timed:
        c = rec["candidates"][name]
        assert c["joules_per_call"] > 0 and c["energy_source"] == "energy counter"
        assert c["GBps_per_W"] == pytest.approx(rec["bytes"] / 1e9 / c["joules_per_call"])


# ---- the bottleneck class -------------------------------------------------------------------


def test_bottleneck_rule():
    c = bottleneck.classify
    assert c(pct_of_roofline=90, roof_term="memory", gpu_us=5, host_us=8)[0] == "launch/host"
    assert c(pct_of_roofline=80, roof_term="compute", gpu_us=500)[0] == "compute"
    assert c(pct_of_roofline=70, roof_term="memory", gpu_us=5)[0] == "memory"
    assert c(pct_of_roofline=20, roof_term="memory", gpu_us=4, occupancy=0.1)[0] == "latency"
    assert c(pct_of_roofline=20, roof_term="memory", gpu_us=400, occupancy=0.1)[0] == "occupancy"
    assert c(pct_of_roofline=20, roof_term="memory", gpu_us=400, occupancy=0.9)[0] == "latency"
    assert set(bottleneck.CLASSES) == {"memory", "compute", "latency", "occupancy", "launch/host"}


# ---- static kernel metrics ------------------------------------------------------------------


def test_theoretical_occupancy_on_sm90():
    assert kernel_stats.occupancy_sm90(8, 32, 32) == {
        "programs_per_sm": 8,
        "occupancy": 1.0,
        "occupancy_limit": "warps",
    }
    # 255 registers: a warp takes 8,192 of the SM's 65,536; 4 warps a program -> 2 programs.
    regs = kernel_stats.occupancy_sm90(4, 255, 0)
    assert regs["programs_per_sm"] == 2 and regs["occupancy_limit"] == "registers"
    smem = kernel_stats.occupancy_sm90(4, 32, 100 * 1024)
    assert smem["programs_per_sm"] == 2 and smem["occupancy"] == 8 / 64
    assert smem["occupancy_limit"] == "shared memory"


def test_static_metrics_of_rms_norm_compiled_for_sm90_without_a_gpu():
    got = kernel_stats.static_metrics("rms_norm", (4096, 4096), "bfloat16", "fwd")
    assert "error" not in got, got.get("error")
    [k] = got["kernels"]
    assert "registers" in k, k  # else its compile or ptxas error (a GPU machine gave one)
    assert k["name"].startswith("norm_fwd") and 0 < k["registers"] <= 255
    assert 0 < k["occupancy"] <= 1 and k["programs"] == 4096
    assert k["spill_stores"] == 0


@pytest.mark.slow
def test_static_metrics_for_every_kernel_of_the_main_selection():
    """Acceptance 1 of issue 48: every operator of the main job's selection (its main dtype,
    its first bench shape, forward) compiled for sm_90 here, without a GPU."""
    rows = kernel_stats.selection_metrics()
    names = {s.name for s in select(None) if s.distributed is None}
    assert {r["op"] for r in rows} >= names
    failed = [
        f"{r['op']}: {r.get('error') or [k.get('error') for k in r['kernels']]}"[:300]
        for r in rows
        if r.get("error") or any(k.get("error") for k in r["kernels"])
    ]
    assert not failed, failed
    unfit = set()
    for r in rows:
        for k in r["kernels"]:
            assert 0 < k["registers"] <= 255 and 0 <= k["occupancy"] <= 1, (r["op"], k)
            if k["programs_per_sm"] == 0:
                unfit.add(r["op"])
    assert unfit == set(DOES_NOT_FIT_SM90), unfit


# What the static metrics found: a kernel whose heuristic default (no tuned entry, autotuning
# off) needs more shared memory than an sm_90 block may have, so it cannot launch there.
DOES_NOT_FIT_SM90 = {
    "int8_matmul": "8192^3: matmul_persistent_kernel at 278,552 bytes of shared memory (the "
    "matmul prune's estimate lets it through); tuned or shipped configs fit",
}


# ---- leak and long-run checks ---------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(s.name for s in select(None) if s.distributed is None))
def test_no_memory_leak(name, device):
    """Memory flat over LEAK_CALLS calls at the smallest test shape (see LEAK_CALLS)."""
    spec = get_spec(name)
    dtype = next(d for d in spec.dtypes if d not in spec.interpreter_skip or GPU)
    r = soak.leak_check(
        spec,
        calls=LEAK_CALLS,
        device=device,
        shape=spec.shapes.test[0],
        dtype=dtype,
        mode=LEAK_MODE,
        seed=0,
        warmup=LEAK_WARMUP,
    )
    assert r.passed, r.detail


def test_leak_check_finds_a_leak(device):
    spec = get_spec("softmax")
    kept = []

    def leaky(x, *args, **kwargs):
        out = spec.impl(x, *args, **kwargs)
        kept.append(out.detach().clone())
        return out

    r = soak.leak_check(
        dataclasses.replace(spec, impl=leaky),
        calls=4,
        device=device,
        shape=(64, 128),
        dtype=torch.float32,
        seed=0,
    )
    assert not r.passed and "memory grew" in r.detail and r.max_abs >= 4 * 64 * 128 * 4


def test_long_run_decay_rule():
    spec = get_spec("softmax")
    steady = iter([0.1, 0.1] + [1.0, 1.02, 0.98] * 10)
    r = soak.stability_check(
        spec, seconds=1, windows=30, timer=lambda n: next(steady), seed=0, shape=(4, 8)
    )
    assert r.passed, r.detail
    rising = iter([0.1, 0.1] + [1.0 + 0.01 * i for i in range(30)])
    r = soak.stability_check(
        spec, seconds=1, windows=30, timer=lambda n: next(rising), seed=0, shape=(4, 8)
    )
    assert not r.passed and "slower by" in r.detail


def test_long_run_check_runs_for_seconds(device):
    r = soak.stability_check(
        get_spec("rms_norm"),
        seconds=2.0,
        windows=6,
        device=device,
        shape=(8, 64),
        dtype=torch.float32,
        seed=0,
    )
    assert "windows=6" in r.params and r.skipped is None
    if GPU:
        assert r.passed, r.detail


def test_soak_command(capsys):
    assert main(["soak", "gelu", "--calls", "2", "--shape", "(3, 17)"]) == 0
    out = capsys.readouterr().out
    assert "ok   gelu (3, 17)" in out and "leak" in out


# ---- multi-objective tuning -----------------------------------------------------------------


def _space(n=6, neighbours=False):
    configs = [tune_multi.Config({"BLOCK": 16 * (i + 1)}, 4, 2) for i in range(n)]

    def nb(c):
        b = c.params["BLOCK"]
        return [
            tune_multi.Config({"BLOCK": b + 8}, 4, 2),
            tune_multi.Config({"BLOCK": b - 8}, 4, 2),
        ]

    return tune_multi.Space(
        "toy", {"n": 1}, configs, lambda c: None, neighbours=nb if neighbours else None
    )


def _ms(run, c):  # latency falls with the block, flattening at 64
    return 1.0 + abs(c.params["BLOCK"] - 64) / 100


def test_pareto_set_and_weighted_choice():
    P = tune_multi.Point
    pts = [
        P("a", {"ms": 1.0, "peak_bytes": 100}),
        P("b", {"ms": 1.2, "peak_bytes": 50}),
        P("c", {"ms": 1.3, "peak_bytes": 60}),
        P("d", {"ms": 0.99, "peak_bytes": 400}),
    ]
    front = tune_multi.pareto_front(pts, ["ms", "peak_bytes"])
    assert [p.config for p in front] == ["a", "b", "d"]
    chosen, scores = tune_multi.weighted_choice(front, {"ms": 1.0, "peak_bytes": 0.05})
    assert chosen.config == "a" and scores[2] > scores[0]
    chosen, _ = tune_multi.weighted_choice(front, {"ms": 1.0, "peak_bytes": 1.0})
    assert chosen.config == "b"


def test_explore_reports_pareto_set_and_the_weighted_choice_within_3_percent():
    space = _space()
    # BLOCK=80 is 0.5% slower than the fastest (64) with half its memory; 48 is dominated.
    ms = {16: 1.48, 32: 1.32, 48: 1.16, 64: 1.0, 80: 1.005, 96: 1.32}
    peaks = {16: 10, 32: 20, 48: 40, 64: 80, 80: 40, 96: 320}
    ran = []
    space.run = ran.append  # the launch: remembers the config it was given

    def peak(fn):  # the peak of the config's first run (which builds its workspace)
        fn()
        return peaks[ran[-1].params["BLOCK"]]

    def timer(run, c):
        assert ran and ran[-1] == c  # the first run came before the timing
        return ms[c.params["BLOCK"]]

    # resident=0: the weights as given (on a GPU the default is what the worker holds)
    got = tune_multi.explore(space, timer=timer, peak=peak, history={}, resident=0.0)
    assert got["objectives"] == ["ms", "peak_bytes"] and got["measured"] == 6
    assert got["fastest"]["config"] == "BLOCK=64 warps=4 stages=2"
    front = sorted(int(p["config"].split()[0].split("=")[1]) for p in got["pareto"])
    assert front == [16, 32, 64, 80] and got["trades_memory"]
    assert got["chosen"]["config"] == "BLOCK=80 warps=4 stages=2"
    assert got["chosen_vs_fastest_pct"] == pytest.approx(0.5)


def test_a_workspace_is_weighed_against_the_memory_the_process_holds():
    """Split-K's case: the fastest configs allocate a workspace of MiBs, the others 64 KiB (a
    descriptor's scratch). Against 64 KiB, 4 MiB is 63 times more (the slow config wins);
    against the 300 MiB the process holds, 1.3% more (the fast one wins; the set trades)."""
    space = _space(n=4)
    ms = {16: 1.30, 32: 1.0, 48: 1.01, 64: 1.25}
    peaks = {16: 64 << 10, 32: 4 << 20, 48: 2 << 20, 64: 64 << 10}
    ran = []
    space.run = ran.append

    def peak(fn):
        fn()
        return peaks[ran[-1].params["BLOCK"]]

    def explore(resident):
        return tune_multi.explore(
            space, timer=lambda run, c: ms[c.params["BLOCK"]], peak=peak, history={},
            resident=resident,
        )  # fmt: skip

    against_none = explore(0.0)
    assert against_none["chosen"]["config"].startswith("BLOCK=64")
    got = explore(300 << 20)
    front = sorted(int(p["config"].split()[0].split("=")[1]) for p in got["pareto"])
    assert front == [32, 48, 64] and got["trades_memory"]
    assert got["chosen"]["config"].startswith("BLOCK=32") and got["chosen_vs_fastest_pct"] == 0
    assert got["resident_bytes"] == 300 << 20


def test_explore_stops_measuring_at_its_time_limit():
    space = _space(n=6)
    clock = iter(range(100))
    got = tune_multi.explore(
        space, timer=lambda run, c: (next(clock), _ms(run, c))[1], peak=lambda fn: 0,
        history={}, seconds=0.0,
    )  # fmt: skip
    # A limit of 0 s: the first config is measured (a choice needs one), the rest are not.
    assert got["measured"] == 1 and got["not_measured"] == 5
    assert got["chosen"] == got["fastest"]


def test_large_space_is_sampled_then_refined_by_neighbours():
    space = _space(n=40, neighbours=True)
    seen = []

    def timer(run, c):
        seen.append(c.params["BLOCK"])
        return _ms(run, c)

    got = tune_multi.explore(space, large=10, sample=5, timer=timer, peak=lambda fn: 0, history={})
    hows = {p["how"] for p in got["points"]}
    assert "sampled" in hows and got["measured"] < 40
    assert got["fastest"]["config"] == "BLOCK=64 warps=4 stages=2"  # found by the walk
    assert "neighbour" in hows or 64 in seen[:6]


def test_random_sample_over_a_conditional_space():
    space = {
        "BLOCK_M": [16, 32, 64, 128],
        "BLOCK_K": lambda p: [k for k in (16, 32, 64, 128) if k <= p["BLOCK_M"]],
        "warps": lambda p: [4, 8] if p["BLOCK_M"] >= 64 else [4],
    }
    pts = tune_multi.random_sample(space, 12, seed=1, valid=lambda p: p["BLOCK_K"] != 128)
    assert len(pts) == 12 and len({tuple(sorted(p.items())) for p in pts}) == 12
    for p in pts:
        assert p["BLOCK_K"] <= p["BLOCK_M"] and p["BLOCK_K"] != 128
        assert p["warps"] == 4 or p["BLOCK_M"] >= 64
    assert tune_multi.random_sample(space, 12, seed=1) != tune_multi.random_sample(space, 12, 2)


def test_history_prunes_configs_slow_at_every_earlier_key():
    C = tune_multi.Config
    a, b, c = C({"B": 1}, 4, 2), C({"B": 2}, 4, 2), C({"B": 3}, 4, 2)
    entries = {
        'toy|{"n": 1}': {"tried": [[a.to_dict(), 1.0], [b.to_dict(), 2.0], [c.to_dict(), 1.1]]},
        'toy|{"n": 2}': {"tried": [[a.to_dict(), 2.0], [b.to_dict(), 5.0], [c.to_dict(), 4.0]]},
        'other|{"n": 1}': {"tried": [[b.to_dict(), 1.0]]},
    }
    kept, dropped = tune_multi.history_pruned("toy", [a, b, c], entries)
    assert kept == [a, c] and dropped == [b]  # c was within 1.5x once
    kept, dropped = tune_multi.history_pruned("toy", [b, a], entries)
    assert kept == [b, a]  # the default is never dropped


@pytest.mark.gpu
def test_tuning_spaces_captured_from_matmul():
    import tritonkit

    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    spaces = tune_multi.capture(lambda: tritonkit.matmul(a, a))
    assert spaces and spaces[0].kernel == "matmul" and len(spaces[0].candidates) > 1


# ---- regress over shared cases, and the trend -----------------------------------------------


def test_regress_compares_shared_cases_and_lists_the_rest(tmp_path, capsys):
    old = synthetic_results([synthetic_record(), synthetic_record(op="gelu")])
    new = synthetic_results([synthetic_record(ours_ms=0.3), synthetic_record(op="silu")])
    rows = regress.compare(new, old, 0.1)
    status = {r.case.split()[0]: r.status for r in rows}
    assert status == {"relu": "slower", "silu": "only in new", "gelu": "only in old"}
    text = regress.render(rows, 0.1)
    assert "1 case(s) compared, 2 timed by one run only" in text
    paths = []
    for name, doc in (("new", new), ("old", old)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(doc))
    assert main(["regress", str(paths[0]), "--against", str(paths[1])]) == 1
    assert "only in old" in capsys.readouterr().out


def test_trend_over_three_runs(tmp_path, capsys):
    docs = [
        synthetic_results([synthetic_record(ours_ms=ms), synthetic_record(op="gelu", ours_ms=0.2)])
        for ms in (0.1, 0.12, 0.09)
    ]
    docs[1]["bench"] = docs[1]["bench"][:1]  # gelu not timed in the second run: a gap
    t = trend.build(docs, ["a", "b", "c"])
    relu = next(c for k, c in t["cases"].items() if k.startswith("relu"))
    assert [p["ms"] for p in relu["points"]] == [0.1, 0.12, 0.09]
    gelu = next(c for k, c in t["cases"].items() if k.startswith("gelu"))
    assert gelu["points"][1] is None
    md = trend.render(t)
    assert "| 1.200 | 0.900 |" in md and "| — | 1.000 |" in md
    files = []
    for i, d in enumerate(docs):
        files.append(tmp_path / f"run{i}.json")
        files[-1].write_text(json.dumps(d))
    assert main(["trend", *map(str, files), "--out", str(tmp_path / "t")]) == 0
    assert (tmp_path / "t" / "trend.json").is_file()
    pytest.importorskip("matplotlib")
    assert (tmp_path / "t" / "trend_relu.png").is_file()
    other = synthetic_results(gpu="Other")
    with pytest.raises(regress.Incomparable, match="different GPUs"):
        trend.build([docs[0], other], ["a", "b"])


# ---- the profile command (on the CPU: static metrics skipped, trace exported) -----------------


def test_profile_command_writes_a_trace(tmp_path, capsys):
    out = tmp_path / "p"
    argv = ["profile", "rms_norm", "--shape", "(4, 32)", "--no-static", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "rms_norm (4, 32)" in text
    got = json.loads((out / "profile.json").read_text())
    assert Path(got["files"]["trace"]).is_file()
    if not GPU:
        assert "no GPU" in got["tried"]["gpu"]
    # The memory timeline: a file with points, or a sentence saying why there is none.
    if "memory_timeline" in got["files"]:
        assert json.loads(Path(got["files"]["memory_timeline"]).read_text())[0]
    else:
        assert "memory timeline: " in text and got["memory_timeline"]


_NCU_CSV = """==PROF== Connected to process 1
"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"
"0","void at::native::distribution_elementwise_kernel<float>","dram__bytes.sum","byte","100"
"1","void at::vectorized_elementwise_kernel<8, at::bf16_copy>","dram__bytes.sum","byte","200"
"2","norm_fwd_row_kernel","dram__bytes.sum","byte","1,000"
"2","norm_fwd_row_kernel","gpu__time_duration.sum","ns","10"
"""


def test_ncu_profiles_only_the_measured_call_and_the_ops_own_kernels(monkeypatch):
    from tritonkit.harness import profile

    seen = {}

    def fake_run(argv, **kw):
        seen["argv"] = argv
        return subprocess.CompletedProcess(argv, 0, stdout=_NCU_CSV, stderr="")

    monkeypatch.setattr(profile.shutil, "which", lambda name: "/usr/bin/ncu")
    monkeypatch.setattr(profile.subprocess, "run", fake_run)
    got = profile.from_ncu("rms_norm", (64, 64), "bfloat16", "fwd")
    argv = seen["argv"]
    assert argv[argv.index("--profile-from-start") + 1] == "off"
    assert len(got) == 3  # what ncu printed, torch's kernels among them (inputs' creation)
    own = profile.own_launches(got, {"norm_fwd_row_kernel"})
    assert [k["name"] for k in own] == ["norm_fwd_row_kernel"]
    assert profile._figures(own[0]["raw"])["dram_GBps"] == 100.0
    # Names torch.profiler spelled otherwise: nothing is dropped rather than everything.
    assert profile.own_launches(got, {"other"}) == got


def test_bench_options_parse():
    from tritonkit.cli import build_parser
    from tritonkit.harness.cli_why import bench_options

    args = build_parser().parse_args(
        [
            "bench",
            "--rsd",
            "3%",
            "--energy",
            "0.5",
            "--compile-modes",
            "max-autotune,reduce-overhead",
        ]
    )
    got = bench_options(args)
    assert got["sampling"] == {"rsd_target": pytest.approx(0.03)} and got["energy_s"] == 0.5
    assert got["compile_modes"] == ("max-autotune", "reduce-overhead")
    assert main(["bench", "--compile-modes", "fast"]) == 2


# ---- no import cycle inside the harness (issue 45) -------------------------------------------


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """(module-level, function-level) tritonkit.harness modules imported by ``path``."""
    top, inner = set(), set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "tritonkit.harness":
                names = [f"tritonkit.harness.{a.name}" for a in node.names]
            elif node.module.startswith("tritonkit.harness."):
                names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("tritonkit.harness.")]
        names = [n.removeprefix("tritonkit.harness.") for n in names]
        (top if node in tree.body else inner).update(names)
    return top, inner


def test_no_import_cycle_inside_the_harness():
    graph, inner = {}, {}
    for path in HARNESS.glob("*.py"):
        graph[path.stem], inner[path.stem] = _imports(path)

    def reach(start):
        seen, stack = set(), [start]
        while stack:
            for n in graph.get(stack.pop(), ()):
                if n not in seen:
                    seen.add(n)
                    stack.append(n)
        return seen

    cycles = [m for m in graph if m in reach(m)]
    assert not cycles, f"module-level import cycles through {cycles}"
    # No function-level import left to break a cycle: none imports a module that reaches back.
    hidden = [(m, n) for m, ns in inner.items() for n in ns if m in reach(n) | {n}]
    assert not hidden, hidden
    assert "check" not in graph["bench_cases"] and "distributed" not in graph["check_cases"]


def test_static_metrics_child_refuses_the_interpreter():
    run = subprocess.run(
        [sys.executable, "-m", "tritonkit.harness.kernel_stats", "rms_norm"],
        capture_output=True,
        text=True,
        env={"TRITON_INTERPRET": "1", "PATH": "/usr/bin"},
    )
    assert run.returncode != 0
    assert "TRITON_INTERPRET=1 is set" in run.stderr or run.stderr


# ---- shape sensitivity and torch.compile's modes --------------------------------------------


def test_sweep_shapes_and_plot(tmp_path):
    from tritonkit.harness import plots
    from tritonkit.harness.bench_cases import sweep_shapes

    shapes = sweep_shapes(get_spec("rms_norm"))
    assert shapes[0] == (16, 4096) and shapes[5] == (16384, 4096) and len(shapes) == 7
    recs = []
    for rows, pct in ((16, 3.0), (1024, 40.0), (16384, 88.0)):
        r = synthetic_record(shape=f"({rows}, 4096)")
        r.update(bytes=rows * 4096 * 4, sweep=True)
        r["candidates"]["tritonkit"]["pct_of_roofline"] = pct
        recs.append(r)
    pytest.importorskip("matplotlib")
    [path] = plots.plot_sweeps(synthetic_results(recs), tmp_path)
    assert path.name == "sweep_relu.png" and path.stat().st_size > 0
    assert plots.plot_sweeps(synthetic_results(), tmp_path) == []  # no sweep records


def test_compile_modes_are_baselines_built_from_eager_torch():
    from tritonkit.harness.bench_cases import compiled_candidate

    kind, fn, skipped, backward = compiled_candidate(get_spec("softmax"), "reduce-overhead")
    assert kind == "baseline" and callable(fn) and skipped is None and backward
    no_torch = dataclasses.replace(get_spec("softmax"), baselines={})
    assert compiled_candidate(no_torch, "max-autotune")[2].startswith("the spec has no eager")


def test_merged_spaces_run_each_config_by_its_own_launcher():
    C = tune_multi.Config
    ran = []
    one = tune_multi.Space("mm", {"m": 8, "split": 1}, [C({"S": 1}, 4, 2)], lambda c: ran.append(1))
    four = tune_multi.Space(
        "mm", {"m": 8, "split": 4}, [C({"S": 4}, 4, 2), C({"S": 1}, 4, 2)], lambda c: ran.append(4)
    )
    joint = tune_multi.merge([one, four])
    assert joint.candidates == [C({"S": 1}, 4, 2), C({"S": 4}, 4, 2)]  # the first space's first
    assert joint.key == {"m": 8, "joint": "split: ['1', '4']"}
    joint.run(C({"S": 4}, 4, 2))
    joint.run(C({"S": 1}, 4, 2))
    assert ran == [4, 1]
