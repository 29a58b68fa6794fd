"""Sweep the segment size and warps of the cross-entropy kernels at (8192, 128256) bf16.

For each candidate (``seg`` x ``seg_warps`` of ``CrossEntropyConfig``, passed to the call, so a
candidate is exactly what a change of the default would give) this times, interleaved with
torch eager and torch.compile in the same run:

    (a) fwd:      the loss without a gradient          bytes = logits (one read)
    (b) fwd+bwd:  loss.backward() (grad_output 1.0)    bytes = 2 x logits (read + gradient write)

The byte formulas count the full logits although a quarter of the rows are ignored and never
read (the kernels read 0.75 of them once in (a), twice in (b)): GB/s here is "logits-equivalent"
bandwidth, comparable across candidates and baselines. Timing: CUDA events, warm-up, a 256 MiB
buffer written between reps to flush L2, candidates interleaved rep by rep, median of REPS.
Every candidate's loss and gradient are compared with float32 eager, next to eager bf16's own
error, so a wrong config shows. Meant to take under two minutes on an H200, most of it
compiling.

    PYTHONPATH=src python experiments/sweep_ce.py            # writes $OUT/sweep_ce.json if OUT
    PYTHONPATH=src python experiments/sweep_ce.py --dry      # tiny shape, CPU interpreter
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton

SHAPE = (8192, 128256)
DTYPE = torch.bfloat16
IGNORE = -100
SEGS = (4096, 8192, 16384, 32768)
WARPS = (4, 8, 16)
# Elements per thread of a full segment: at least one 16-byte bf16 vector, at most what fits
# the gradient kernel's registers in float32 (spilling candidates are not worth timing).
ELEMS_PER_THREAD = (8, 128)
REPS = 25
WARMUP = 3
FLUSH_BYTES = 256 * 2**20


def _configs() -> list[dict]:
    out = []
    for seg in SEGS:
        for warps in WARPS:
            if ELEMS_PER_THREAD[0] <= seg // (32 * warps) <= ELEMS_PER_THREAD[1]:
                out.append({"seg": seg, "seg_warps": warps})
    return out


def _label(cfg: dict) -> str:
    return f"seg={cfg['seg']} w={cfg['seg_warps']}"


def _time(fns: dict[str, Callable[[], object]], device: torch.device, reps: int) -> dict:
    """Median ms per fn: warm-up, then reps rounds, each fn once per round after an L2 flush."""
    for fn in fns.values():
        for _ in range(WARMUP):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    if device.type != "cuda":  # --dry: wall clock, only to exercise the logic
        for _ in range(reps):
            for k, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                samples[k].append((time.perf_counter() - t0) * 1e3)
        return {k: statistics.median(v) for k, v in samples.items()}
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)
    for _ in range(reps):
        events = {}
        for k, fn in fns.items():
            flush.zero_()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            events[k] = (start, end)
        torch.cuda.synchronize()
        for k, (start, end) in events.items():
            samples[k].append(start.elapsed_time(end))
    return {k: statistics.median(v) for k, v in samples.items()}


def _max_err(a: torch.Tensor, ref: torch.Tensor, rows: int = 512) -> float:
    """max |a - ref| in float32, row block by row block (no full float32 copy of a)."""
    if a.dim() < 2:
        return (a.float() - ref).abs().max().item()
    return max(
        (a[i : i + rows].float() - ref[i : i + rows]).abs().max().item()
        for i in range(0, a.shape[0], rows)
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dry", action="store_true", help="tiny shape on the CPU interpreter")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    args = p.parse_args()
    if args.dry:  # read when the kernels are decorated: before tritonkit is imported
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from tritonkit.ops.cross_entropy import CROSS_ENTROPY, cross_entropy_loss

    device = torch.device("cpu" if args.dry else "cuda")
    shape, reps = ((8, 5000), 2) if args.dry else (SHAPE, REPS)
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(shape, generator=gen, device=device).to(DTYPE)
    t = torch.randint(0, shape[1], (shape[0],), generator=gen, device=device)
    t[3::4] = IGNORE  # as specs/cross_entropy.py: every fourth row ignored
    xg = x.clone().requires_grad_()
    logits_bytes = x.numel() * x.element_size()
    configs = _configs()
    defaults = {k: getattr(CROSS_ENTROPY, k) for k in configs[0]}

    def ours(cfg: dict):
        """cross_entropy under the candidate ``cfg`` (fields of the default config)."""
        config = dataclasses.replace(CROSS_ENTROPY, **cfg)
        return lambda x, t: cross_entropy_loss(x, t, None, IGNORE, "mean", 0.0, config)

    def ours_fwd(cfg: dict):
        fn = ours(cfg)
        return lambda: fn(x, t)

    # Reference: eager in float32; eager bf16's own error is printed beside ours.
    xf = x.float().requires_grad_()
    loss_ref = F.cross_entropy(xf, t, ignore_index=IGNORE)
    loss_ref.backward()
    grad_ref, loss_ref = xf.grad, loss_ref.detach()
    del xf

    def fwd_bwd(fn):
        def run():
            xg.grad = None  # else backward accumulates: one more read and write of N x C
            fn(xg, t).backward()
            return xg.grad

        return run

    eager = {"fwd": lambda: F.cross_entropy(x, t), "fwd+bwd": fwd_bwd(F.cross_entropy)}
    base = {"eager": eager}
    if not args.no_compile:
        torch._dynamo.reset()
        backend = "aot_eager" if args.dry else "inductor"
        compiled = torch.compile(F.cross_entropy, dynamic=False, backend=backend)
        base["compile"] = {"fwd": lambda: compiled(x, t), "fwd+bwd": fwd_bwd(compiled)}

    rows = []
    errors = []
    # Accuracy of every candidate (and eager bf16) against float32 eager.
    checks = {_label(c): (ours_fwd(c), fwd_bwd(ours(c))) for c in configs}
    checks["[eager bf16]"] = (eager["fwd"], eager["fwd+bwd"])
    for name, (fwd, both) in checks.items():
        try:
            grad = both()
            loss = fwd()
        except Exception as exc:  # a candidate that fails to compile is reported, not fatal
            errors.append({"config": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
            continue
        errors.append(
            {
                "config": name,
                "loss_abs_err": abs(loss.float().item() - loss_ref.item()),
                "grad_max_abs_err": _max_err(grad, grad_ref),
                "grad_max_abs_ref": grad_ref.abs().max().item(),
            }
        )
    failed = {e["config"] for e in errors if "error" in e}
    good = [c for c in configs if _label(c) not in failed]
    del grad_ref
    xg.grad = None

    for mode, nbytes in (("fwd", logits_bytes), ("fwd+bwd", 2 * logits_bytes)):
        fns = {_label(c): ours_fwd(c) if mode == "fwd" else fwd_bwd(ours(c)) for c in good}
        fns.update({f"[{b}]": fn[mode] for b, fn in base.items()})
        times = _time(fns, device, reps)
        for name, ms in times.items():
            row = {"mode": mode, "config": name, "ms": ms, "GBps": nbytes / ms / 1e6}
            for b in base:
                row[f"vs_{b}"] = times[f"[{b}]"] / ms
            rows.append(row)
        xg.grad = None

    _print(rows, errors, list(base))
    out = os.environ.get("OUT")
    if out:
        info = {
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (dry)",
            "torch": torch.__version__,
            "triton": triton.__version__,
            "shape": list(shape),
            "dtype": str(DTYPE),
            "ignored_rows": "every fourth (t[3::4] = -100)",
            "bytes": {"fwd": "logits", "fwd+bwd": "2 x logits"},
            "reps": reps,
            "defaults": defaults,
        }
        path = os.path.join(out, "sweep_ce.json")
        with open(path, "w") as f:
            json.dump({"info": info, "rows": rows, "accuracy": errors}, f, indent=1)
        print(f"wrote {path}")


def _print(rows: list[dict], errors: list[dict], bases: list[str]) -> None:
    head = f"{'mode':8} {'config':18} {'ms':>8} {'GB/s':>7}" + "".join(
        f" {'x' + b:>9}" for b in bases
    )
    print(head)
    for r in sorted(rows, key=lambda r: (r["mode"], r["ms"])):
        vs = "".join(f" {r[f'vs_{b}']:9.2f}" for b in bases)
        print(f"{r['mode']:8} {r['config']:18} {r['ms']:8.3f} {r['GBps']:7.0f}{vs}")
    cols = f"{'|loss err|':>10} {'max|grad err|':>13} {'max|grad|':>10}"
    print(f"\n{'accuracy vs float32 eager':26} {cols}")
    for e in errors:
        if "error" in e:
            print(f"{e['config']:26} FAILED {e['error']}")
        else:
            print(
                f"{e['config']:26} {e['loss_abs_err']:10.2e} {e['grad_max_abs_err']:13.2e}"
                f" {e['grad_max_abs_ref']:10.2e}"
            )


if __name__ == "__main__":
    main()
