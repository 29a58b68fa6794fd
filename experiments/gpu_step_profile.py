"""Where a training step's GPU time goes, per kernel, with each optimizer: the patched GPT-2
small of gpu_models.py (batch 4 x 2048, bf16) with torch's fused AdamW and with tritonkit's
AdamW at its defaults.

    python experiments/gpu_step_profile.py --out DIR [--config gpt2-2k]   # GPU: about a minute

Each optimizer in a fresh process: 3 warm-up steps, then torch.profiler over 3 steps; the
kernels' total CUDA time per step, largest first (DIR/<variant>.txt), and a diff of the two
(DIR/diff.md): which kernels the second variant adds or slows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def child(variant: str, name: str, out: Path, tiny: bool) -> None:
    sys.path.insert(0, str(ROOT))
    import gpu_models as gm
    import torch
    from torch.profiler import ProfilerActivity, profile

    device = "cpu" if tiny else "cuda"
    cfg = gm.config(name, tiny)
    torch.manual_seed(0)
    model = gm.build(cfg, device)
    model.train()
    gm.apply_variant(model, variant, cfg["family"])
    opt = gm.make_optimizer(model, variant)
    ids = gm.tokens(cfg, model.config.vocab_size, device)
    step = gm.train_step_fn(model, opt, ids)
    for _ in range(3):
        step()
    gm.sync(device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(3):
            step()
        gm.sync(device)
    if not tiny:
        prof.export_chrome_trace(str(out / f"{variant}.trace.json"))
    (out / f"{variant}.host.json").write_text(json.dumps(host_phases(model, opt, ids, device)))
    rows = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", 0) or getattr(e, "cuda_time_total", 0)
        if t and e.device_type.name == "CUDA":
            rows[e.key] = {"us_per_step": t / 3, "calls_per_step": e.count / 3}
    (out / f"{variant}.json").write_text(json.dumps(rows, indent=1))
    top = sorted(rows.items(), key=lambda kv: -kv[1]["us_per_step"])
    lines = [f"{v['us_per_step']:10.1f} us {v['calls_per_step']:6.1f}x  {k[:110]}" for k, v in top]
    total = sum(v["us_per_step"] for v in rows.values())
    (out / f"{variant}.txt").write_text(f"total {total / 1e3:.2f} ms/step\n" + "\n".join(lines))
    print(variant, f"total kernel time {total / 1e3:.2f} ms/step")


def host_phases(model, opt, ids, device: str, steps: int = 10) -> dict:
    """Where a step's host time goes (no sync inside the steps): the host seconds of the
    forward, backward, optimizer step and zero_grad, the wall time per step over ``steps``
    back-to-back steps, the caching allocator's device allocations and frees meanwhile (a
    cudaFree waits for the device), and the synchronizing calls CUDA reports in one step."""
    import time
    import warnings

    import torch

    phases = {"forward": 0.0, "backward": 0.0, "step": 0.0, "zero_grad": 0.0}
    keys = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")
    cuda = device == "cuda"
    before = torch.cuda.memory_stats() if cuda else {}
    if cuda:
        torch.cuda.synchronize()
    t_start = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        t4 = time.perf_counter()
        for k, dt in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            phases[k] += dt
    host_end = time.perf_counter()
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - t_start
    after = torch.cuda.memory_stats() if cuda else {}
    out = {f"host_{k}_ms": v * 1e3 / steps for k, v in phases.items()}
    out["host_total_ms"] = (host_end - t_start) * 1e3 / steps
    out["wall_ms"] = wall * 1e3 / steps
    out["allocator"] = {k: after.get(k, 0) - before.get(k, 0) for k in keys}
    if cuda:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                model(input_ids=ids, labels=ids).loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            finally:
                torch.cuda.set_sync_debug_mode(0)
        out["sync_warnings"] = [str(w.message)[:300] for w in caught][:20]
    print(json.dumps(out))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--config", default="gpt2-2k")
    ap.add_argument("--variants", default="tk,tk_adamw")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child:
        child(args.child, args.config, args.out, args.tiny)
        return
    variants = args.variants.split(",")
    env = {**os.environ, "PYTHONPATH": f"{ROOT.parent / 'src'}:{os.environ.get('PYTHONPATH', '')}"}
    for v in variants:
        cmd = [sys.executable, __file__, "--child", v, "--out", str(args.out)]
        cmd += ["--config", args.config] + (["--tiny"] if args.tiny else [])
        subprocess.run(cmd, env=env, check=False, timeout=600)
    docs = [json.loads((args.out / f"{v}.json").read_text()) for v in variants]
    a, b = docs[0], docs[-1]
    diff = sorted(
        (
            (k, b.get(k, {}).get("us_per_step", 0) - a.get(k, {}).get("us_per_step", 0))
            for k in {*a, *b}
        ),
        key=lambda kv: -abs(kv[1]),
    )
    md = [f"| kernel | {variants[-1]} - {variants[0]}, us/step |", "|---|---|"]
    md += [f"| {k[:100]} | {d:+.1f} |" for k, d in diff[:25]]
    (args.out / "diff.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
