"""The host-time guard (issue 38): no call of a public function is ever pathologically slow.

    python experiments/gpu_host_guard.py --out DIR          # GPU: about 3-5 minutes
    python experiments/gpu_host_guard.py --out DIR --tiny   # CPU interpreter, a few operators

Every operator the workbench knows (each public function's spec: its first parameter set, its
small shape where it has one, else its first test shape, at its main dtype) is called in these
variants:

- ``fwd``: no input requires a gradient;
- ``fwd(grads)``: every float input requires one, forward only;
- ``fwd+bwd``: every float input requires one, forward and backward;
- ``fwd+bwd[i]``: only input i requires one, forward and backward (each such input).

Each variant is called ``--calls`` times (default 12) back to back; each call's host time (from
the call to its return, the device not synchronized) and wall time (synchronized before and
after) are recorded. A call after the third is flagged when its host time exceeds 1 ms or three
times the median host time of that variant's calls after the third. The whole sweep runs twice,
each in a fresh process: with empty Triton and tritonkit caches (``cold``), then with the caches
it filled (``warm``). ``linear``'s fwd+bwd also reports its wall time per call (median after the
third) cold over warm (acceptance: <= 1.1). ``--scenarios cold --cache DIR`` then ``--scenarios
warm --cache DIR`` split the sweep over two commands; ``--ops`` selects operators.

Writes DIR/host_guard.json and DIR/host_guard.md; prints the flags and a summary table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY_OPS = ("relu", "rms_norm", "softmax", "cross_entropy", "linear", "adam_step")
HOST_LIMIT_MS = 1.0
MEDIAN_FACTOR = 3.0


def _variants(spec, inputs):
    grad_idx = spec.grad_indices(inputs) if spec.backward else []
    out = [("fwd", ())]
    if grad_idx:
        out += [("fwd(grads)", tuple(grad_idx)), ("fwd+bwd", tuple(grad_idx))]
        if len(grad_idx) > 1:
            out += [(f"fwd+bwd[{i}]", (i,)) for i in grad_idx]
    return out


def _flatten(out):
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flatten(o)]
    return []


def child(ops: list[str] | None, calls: int) -> dict:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from tritonkit.harness import selection
    from tritonkit.harness.check import with_own_state
    from tritonkit.harness.spec import all_specs

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    records = []
    for spec in all_specs():
        if ops and spec.name not in ops:
            continue
        if spec.distributed is not None:
            continue
        # The small shape is where the host sets the pace on a GPU; the interpreter (--tiny)
        # takes the test shape, which it computes in a moment.
        gpu = device.type == "cuda"
        shape = spec.shapes.small[0] if spec.shapes.small and gpu else spec.shapes.test[0]
        dtype = selection.main_dtype(spec)
        params = dict(spec.params[0])
        try:
            base = spec.make_inputs(shape, dtype, device, 0)
            variants = _variants(spec, base)
        except Exception as exc:
            records.append({"op": spec.name, "variant": "-", "error": f"inputs: {exc}"[:300]})
            continue
        for label, grads in variants:
            rec = {"op": spec.name, "shape": str(shape), "dtype": str(dtype), "variant": label}
            try:
                inputs = list(with_own_state(spec, base))
                for i, t in enumerate(inputs):
                    if isinstance(t, torch.Tensor) and t.is_floating_point():
                        inputs[i] = t.detach().requires_grad_(i in grads)
                backward = label.startswith("fwd+bwd")
                host, wall = [], []
                for _ in range(calls):
                    sync()
                    t0 = time.perf_counter()
                    out = spec.impl(*inputs, **params)
                    if backward:
                        outs = [o for o in _flatten(out) if o.requires_grad]
                        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
                    t1 = time.perf_counter()
                    sync()
                    t2 = time.perf_counter()
                    host.append((t1 - t0) * 1e3)
                    wall.append((t2 - t0) * 1e3)
                    del out
                    for t in inputs:
                        if isinstance(t, torch.Tensor) and t.grad is not None:
                            t.grad = None
                rec.update(host_ms=host, wall_ms=wall, error=None)
            except Exception as exc:  # recorded; the sweep goes on
                rec["error"] = f"{type(exc).__name__}: {exc}"[:300]
            records.append(rec)
    return {"records": records}


def flags(records: list[dict]) -> list[dict]:
    out = []
    for r in records:
        host = r.get("host_ms") or []
        later = host[3:]
        if not later:
            continue
        median = statistics.median(later)
        for k, ms in enumerate(later, start=4):
            if ms > HOST_LIMIT_MS or ms > MEDIAN_FACTOR * median:
                out.append({"op": r["op"], "variant": r["variant"], "call": k, "host_ms": ms,
                            "median_ms": median})  # fmt: skip
    return out


def run(name: str, dirs: dict, ops: list[str] | None, calls: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **dirs}
    args = [sys.executable, __file__, "--child", "--calls", str(calls)]
    if ops:
        args += ["--ops", ",".join(ops)]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=1500)
    except subprocess.TimeoutExpired:
        return {"scenario": name, "error": "timeout", "records": []}
    if p.returncode != 0:
        return {"scenario": name, "error": p.stderr[-2000:], "records": []}
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    doc.update(scenario=name, seconds=time.perf_counter() - t0)
    doc["flags"] = flags(doc["records"])
    return doc


def _median_after_third(r: dict, key: str) -> float | None:
    xs = (r.get(key) or [])[3:]
    return statistics.median(xs) if xs else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--tiny", action="store_true", help="a few operators, the CPU interpreter")
    ap.add_argument("--ops", help="comma list of operators (default: every spec)")
    ap.add_argument("--calls", type=int, default=12)
    ap.add_argument("--scenarios", default="cold,warm", help="cold, warm or both (default)")
    ap.add_argument(
        "--cache",
        type=Path,
        help="keep the caches here (default: a temporary directory), so that a later run with "
        "--scenarios warm finds what a --scenarios cold run compiled",
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    ops = args.ops.split(",") if args.ops else (list(TINY_OPS) if args.tiny else None)
    if args.tiny and not args.child:
        args.calls = min(args.calls, 4)
    if args.child:
        print(json.dumps(child(ops, args.calls)))
        return
    out = args.out or Path(tempfile.mkdtemp(prefix="host-guard-"))
    out.mkdir(parents=True, exist_ok=True)
    scenarios = [n for n in ("cold", "warm") if n in args.scenarios.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        root = args.cache or Path(tmp)
        dirs = {"TRITON_CACHE_DIR": str(root / "triton"), "TRITONKIT_CACHE_DIR": str(root / "tk")}
        docs = [run(name, dirs, ops, args.calls) for name in scenarios]
    import torch
    import triton

    linear = {}
    for d in docs:
        for r in d["records"]:
            if r["op"] == "linear" and r["variant"] == "fwd+bwd":
                linear[d["scenario"]] = _median_after_third(r, "wall_ms")
    ratio = linear["cold"] / linear["warm"] if linear.get("cold") and linear.get("warm") else None
    result = {
        "fingerprint": {
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "torch": torch.__version__,
            "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M"),
        },
        "thresholds": {"host_ms": HOST_LIMIT_MS, "median_factor": MEDIAN_FACTOR},
        "scenarios": docs,
        "linear_fwd_bwd_wall_cold_over_warm": ratio,
    }
    (out / "host_guard.json").write_text(json.dumps(result, indent=1))
    lines = ["| scenario | op | variant | host ms (median after 3rd) | wall ms | flagged calls |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for d in docs:
        flagged: dict[tuple[str, str], int] = {}
        for f in d.get("flags", []):
            flagged[(f["op"], f["variant"])] = flagged.get((f["op"], f["variant"]), 0) + 1
        for r in d["records"]:
            if r.get("error"):
                lines.append(f"| {d['scenario']} | {r['op']} | {r['variant']} | error: "
                             f"{r['error'][:80]} | | |")  # fmt: skip
                continue
            h, w = _median_after_third(r, "host_ms"), _median_after_third(r, "wall_ms")
            n = flagged.get((r["op"], r["variant"]), 0)
            lines.append(f"| {d['scenario']} | {r['op']} | {r['variant']} | {h:.3f} | {w:.3f} "
                         f"| {n or ''} |")  # fmt: skip
    summary = [
        f"{d['scenario']}: {len(d['records'])} variants, {len(d.get('flags', []))} flagged calls, "
        f"{sum(1 for r in d['records'] if r.get('error'))} errors"
        + (f" ({d['error'][:200]})" if d.get("error") else "")
        for d in docs
    ]
    summary.append(f"linear fwd+bwd wall per call, cold / warm: {ratio}")
    md = "\n".join(lines)
    (out / "host_guard.md").write_text(
        f"# Host-time guard\n\n{json.dumps(result['fingerprint'])}\n\n"
        + "\n".join(f"- {s}" for s in summary)
        + "\n\n"
        + md
        + "\n"
    )
    for d in docs:
        for f in d.get("flags", [])[:40]:
            print(f"FLAG {d['scenario']} {f['op']} {f['variant']} call {f['call']}: "
                  f"{f['host_ms']:.3f} ms (median {f['median_ms']:.3f})")  # fmt: skip
    print("\n".join(summary))


if __name__ == "__main__":
    main()
