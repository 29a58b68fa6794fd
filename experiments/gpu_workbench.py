"""GPU checks of the workbench's OpSpec kinds (docs/DESIGN.md, "Operators that mutate, ...").

On a CUDA machine: the check engine on the demo specs of tests/_workbench_specs.py (in-place
axpy_, integer gather, INT8 quantizer with SQNR), the bench engine on them (mutated inputs
restored before each timed call), the timing loop's ``setup`` hook (the state a candidate
sees before its last call is the initial one), and, with two GPUs or more, the two-rank
all-reduce spec checked and timed on nccl ranks.

    PYTHONPATH=src python3 experiments/gpu_workbench.py      # writes $OUT/workbench.json if OUT
"""

import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from tritonkit.harness import hardware
from tritonkit.harness.bench import bench_spec
from tritonkit.harness.check import check_spec
from tritonkit.harness.timing import time_interleaved

import _workbench_specs as demo


def _check(spec, device="cuda"):
    t0 = time.perf_counter()
    results = check_spec(spec, device=device, seed=1234)
    failed = [r for r in results if not r.passed and not r.skipped]
    skipped = [r for r in results if r.skipped]
    return {
        "spec": spec.name,
        "cases": len(results),
        "failed": [f"{r.shape} {r.dtype} {r.case}: {r.detail[:300]}" for r in failed],
        "skipped": [r.skipped for r in skipped],
        "seconds": round(time.perf_counter() - t0, 1),
    }


def _bench(spec, profile, shapes=None, dtypes=None):
    t0 = time.perf_counter()
    records = bench_spec(spec, profile=profile, modes=("fwd",), shapes=shapes, dtypes=dtypes)
    rows = []
    for r in records:
        ours = r.get("candidates", {}).get("tritonkit", {})
        rows.append(
            {
                "shape": r.get("shape"),
                "dtype": r.get("dtype"),
                "correct": (r.get("correct") or {}).get("passed"),
                "sqnr_db": (r.get("correct") or {}).get("sqnr_db"),
                "median_ms": ours.get("median"),
                "GBps": ours.get("GBps"),
                "speedup": r.get("speedup"),
                "mutates": r.get("mutates"),
                "world_size": r.get("world_size"),
                "note": r.get("note"),
                "skipped": {k: v.get("skipped") for k, v in r.get("candidates", {}).items()},
            }
        )
    return {"spec": spec.name, "records": rows, "seconds": round(time.perf_counter() - t0, 1)}


def _setup_hook():
    """With a setup that restores y, the last timed call of y *= 2 leaves exactly 2 * y0."""
    y0 = torch.randn(1 << 20, device="cuda")
    y = y0.clone()
    time_interleaved({"double": lambda: y.mul_(2.0)}, setup={"double": lambda: y.copy_(y0)})
    restored = bool(torch.equal(y, 2.0 * y0))
    z = y0.clone()
    time_interleaved({"double": lambda: z.mul_(2.0)})
    return {"restored_with_setup": restored, "drifts_without_setup": not torch.equal(z, 2 * y0)}


def main() -> None:
    out: dict = {
        "gpu": torch.cuda.get_device_name(0),
        "gpus": torch.cuda.device_count(),
        "torch": torch.__version__,
    }
    profile = hardware.resolve_profile(None, hardware.measured_ceilings())
    out["setup_hook"] = _setup_hook()
    out["check"] = [_check(s) for s in (demo.AXPY, demo.GATHER_SCALE, demo.QUANT_ROWS)]
    out["bench"] = [
        _bench(demo.AXPY, profile, dtypes=(torch.bfloat16, torch.float32)),
        _bench(demo.GATHER_SCALE, profile),
        _bench(demo.QUANT_ROWS, profile, dtypes=(torch.bfloat16,)),
    ]
    if torch.cuda.device_count() >= 2:
        out["check"].append(_check(demo.ALL_REDUCE))
        out["check"].append(_check(demo.ALL_REDUCE_WRONG))
        out["bench"].append(_bench(demo.ALL_REDUCE, profile, dtypes=(torch.bfloat16,)))
    else:
        out["distributed"] = "skipped: needs 2 GPUs"
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / "workbench.json"
        path.write_text(json.dumps(out, indent=1, default=str))
    print(json.dumps(out["setup_hook"]))
    print(f"{'check':<28} {'cases':>5} {'failed':>6} {'skipped':>7}")
    for c in out["check"]:
        print(f"{c['spec']:<28} {c['cases']:>5} {len(c['failed']):>6} {len(c['skipped']):>7}")
        for f in c["failed"][:3]:
            print("   ", f)
    print(f"{'bench':<28} {'dtype':<9} {'ok':<5} {'ms':>8} {'GB/s':>8}  speedup")
    for b in out["bench"]:
        for r in b["records"]:
            ms = r["median_ms"]
            gbps = r["GBps"]
            print(
                f"{b['spec']:<28} {r['dtype']!s:<9} {r['correct']!s:<5} "
                f"{(f'{ms:.4f}' if ms else '-'):>8} {(f'{gbps:.0f}' if gbps else '-'):>8}  "
                f"{r['speedup'] or r['note']}"
            )


if __name__ == "__main__":
    main()
