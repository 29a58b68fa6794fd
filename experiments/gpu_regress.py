"""GPU time of every operator's kernels at its bench shapes, for comparing two trees in one
session (the tree is whatever ``tritonkit`` imports: PYTHONPATH=<tree>/src).

    PYTHONPATH=oldtree/src python3 experiments/gpu_regress.py old.json
    PYTHONPATH=src python3 experiments/gpu_regress.py new.json --against old.json

Times tritonkit's own function only (no baselines), forward and backward, each case's median
of interleaved samples with the L2 flushed (harness/timing.py), and with --against prints the
cases more than 5% slower than the other tree's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from tritonkit.harness.spec import all_specs, dtype_name
from tritonkit.harness.timing import summarize, time_interleaved


def _callable(spec, inputs, params, mode):
    if mode == "fwd":
        return lambda: spec.impl(*inputs, **params)
    idx = spec.grad_indices(inputs)
    leaves = [t.detach().requires_grad_() if i in idx else t for i, t in enumerate(inputs)]
    out = spec.impl(*leaves, **params)
    outs = list(out) if isinstance(out, tuple) else [out]
    outs = [o for o in outs if o.requires_grad]
    grads = [torch.randn_like(o) for o in outs]
    wrt = [leaves[i] for i in idx]
    return lambda: torch.autograd.grad(outs, wrt, grads, retain_graph=True)


def main() -> None:
    out_path = Path(sys.argv[1])
    against = Path(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--against" else None
    rows = {}
    for spec in all_specs():
        params = dict(spec.params[0])
        for shape in spec.shapes.bench:
            for dtype in spec.bench_dtypes:
                if dtype not in spec.dtypes:
                    continue
                try:
                    inputs = spec.make_inputs(shape, dtype, torch.device("cuda"), 0)
                except Exception as exc:  # a shape one tree's spec does not make
                    print("skip", spec.name, shape, exc)
                    continue
                for mode in ("fwd", "bwd") if spec.backward else ("fwd",):
                    key = f"{spec.name} {shape} {dtype_name(dtype)} {mode}"
                    try:
                        fn = _callable(spec, inputs, params, mode)
                        ms = summarize(time_interleaved({"t": fn}, rep_ms=100)["t"]).median
                    except Exception as exc:
                        print("fail", key, type(exc).__name__, str(exc)[:200])
                        continue
                    rows[key] = ms
                    print(f"{key:60s} {ms:.4f} ms", flush=True)
                del inputs
                torch.cuda.empty_cache()
    out_path.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "ms": rows}, indent=1))
    if against:
        old = json.loads(against.read_text())["ms"]
        worse = [(k, old[k], v, v / old[k]) for k, v in rows.items() if k in old]
        slower = [w for w in worse if w[3] > 1.05]
        print(f"\n{len(worse)} cases in both trees; {len(slower)} more than 5% slower:")
        for k, o, n, r in sorted(slower, key=lambda w: -w[3]):
            print(f"  {k}: {o:.4f} -> {n:.4f} ms ({r:.3f}x)")
        ratios = sorted(w[3] for w in worse)
        if ratios:
            print(f"new/old median {ratios[len(ratios) // 2]:.3f}, max {ratios[-1]:.3f}")


if __name__ == "__main__":
    main()
