"""Soft-target (class-probability) cross-entropy at (8192, 128256) bf16, forward + backward:
tritonkit against PyTorch eager (``F.cross_entropy`` with a probability target) and
torch.compile, in one run: time (triton.testing.do_bench, median, L2 flushed) and peak memory
above the inputs (``torch.cuda.max_memory_allocated`` after a reset), then the answer against
PyTorch in float32.

    python experiments/gpu_soft_ce.py --out DIR          # GPU: a few minutes
    python experiments/gpu_soft_ce.py --out DIR --tiny   # CPU interpreter, (16, 3000): the
                                                         # code paths only, timings mean nothing

Acceptance (issue 44): tritonkit >= 1.5x torch eager, and no N x C float32 buffer: the peak
above the inputs is the bf16 gradient (N x C x 2 bytes) plus the few per-row and per-segment
floats, not N x C x 4 bytes more. The floor: reading logits and target twice (forward and
backward) and writing the gradient, 5 x N x C x 2 bytes, at the GPU's copy bandwidth.

Also times the class-probability segments (``CrossEntropyConfig.soft_seg`` x
``soft_seg_warps``) around the default, for the default's choice.

Writes DIR/gpu_soft_ce.json and DIR/gpu_soft_ce.md; prints the table last.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

MIB = 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tiny", action="store_true", help="CPU interpreter, a small shape")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--no-sweep", action="store_true", help="skip the soft_seg sweep")
    args = ap.parse_args()
    if args.tiny:  # read when the kernels are decorated: before tritonkit is imported
        os.environ["TRITON_INTERPRET"] = "1"
    from tritonkit.ops.cross_entropy import CROSS_ENTROPY, cross_entropy_loss

    device = "cpu" if args.tiny else "cuda"
    n, c = (16, 3000) if args.tiny else (8192, 128256)
    gen = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(n, c, device=device, generator=gen).to(torch.bfloat16)
    logits.requires_grad_()
    # A teacher's distribution: peaked enough that the loss and gradient are not uniform.
    target = torch.softmax(2 * torch.randn(n, c, device=device, generator=gen), -1)
    target = target.to(torch.bfloat16)
    out: dict = {
        "gpu": "interpreter (CPU)" if args.tiny else torch.cuda.get_device_name(),
        "shape": [n, c],
        "dtype": "bfloat16 logits, bfloat16 target (no target gradient)",
        "timing": "interpreter: meaningless" if args.tiny else "do_bench median, ms",
        "floor_bytes": 5 * n * c * 2,
        "fp32_nxc_MiB": n * c * 4 / MIB,
        "grad_MiB": n * c * 2 / MIB,
    }

    def ours(config=None):
        return lambda x, t: cross_entropy_loss(x, t, None, -100, "mean", 0.0, config)

    candidates = {"tritonkit": ours(), "torch eager": F.cross_entropy}
    if not args.tiny and not args.no_compile:
        candidates["torch.compile"] = torch.compile(F.cross_entropy, dynamic=False)
    rows: dict = {}
    for name, fn in candidates.items():
        try:
            rows[name] = measure(fn, logits, target, args.tiny)
        except Exception as exc:  # one failure (an OOM, a compile error) is recorded
            rows[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        logits.grad = None
        if not args.tiny:
            torch.cuda.empty_cache()
    out["rows"] = rows
    out["check"] = check(ours(), logits, target)
    if not args.no_sweep:
        sweep = {}
        for seg in (4096, 8192, 16384):
            for warps in (4, 8, 16):
                cfg = dataclasses.replace(CROSS_ENTROPY, soft_seg=seg, soft_seg_warps=warps)
                key = f"soft_seg={seg} warps={warps}"
                try:
                    sweep[key] = measure(ours(cfg), logits, target, args.tiny, memory=False)
                except Exception as exc:
                    sweep[key] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                logits.grad = None
                if args.tiny:
                    break
            if args.tiny:
                break
        out["sweep"] = sweep
    tk, eager = rows.get("tritonkit", {}), rows.get("torch eager", {})
    if "peak_extra_MiB" in tk and "fwd+bwd_ms" in eager:
        out["speedup_vs_eager"] = eager["fwd+bwd_ms"] / tk["fwd+bwd_ms"]
        out["peak_beyond_grad_MiB"] = tk["peak_extra_MiB"] - out["grad_MiB"]
        out["acceptance"] = {
            ">= 1.5x torch eager": out["speedup_vs_eager"] >= 1.5,
            "no N x C float32 buffer": tk["peak_extra_MiB"] < out["grad_MiB"] + out["fp32_nxc_MiB"],
        }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_soft_ce.json").write_text(json.dumps(out, indent=1))
    table = markdown(out)
    (args.out / "gpu_soft_ce.md").write_text(table)
    print(table)


def measure(fn, logits, target, tiny: bool, memory: bool = True) -> dict:
    """Forward, and forward + backward (loss.backward(), the gradient dropped after each), in
    ms; and the peak memory above the inputs of one forward + backward."""

    def fwd():
        with torch.no_grad():
            fn(logits, target)

    def step():
        fn(logits, target).backward()
        logits.grad = None

    step()  # compile, tune, build plans
    res = {}
    if tiny:
        for name, f in (("fwd_ms", fwd), ("fwd+bwd_ms", step)):
            t0 = time.perf_counter()
            f()
            res[name] = (time.perf_counter() - t0) * 1e3
        return res
    from triton.testing import do_bench

    torch.cuda.synchronize()
    if memory:
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        res["peak_extra_MiB"] = (torch.cuda.max_memory_allocated() - base) / MIB
    res["fwd_ms"] = do_bench(fwd, warmup=25, rep=200, return_mode="median")
    res["fwd+bwd_ms"] = do_bench(step, warmup=25, rep=200, return_mode="median")
    return res


def check(fn, logits, target) -> dict:
    """tritonkit's loss and gradient against F.cross_entropy in float32 on the same values, and
    PyTorch's own bf16 error beside them (row chunks: no N x C float32 tensor lives beyond
    one chunk's)."""
    x = logits.detach().requires_grad_()
    loss = fn(x, target)
    (grad,) = torch.autograd.grad(loss, x)
    xe = logits.detach().requires_grad_()
    eager = F.cross_entropy(xe, target)
    (grad_eager,) = torch.autograd.grad(eager, xe)
    n = x.shape[0]
    loss32 = 0.0
    err = {"tritonkit": [0.0, 0.0], "torch eager": [0.0, 0.0]}  # max abs, sum of squares
    ref_sq = 0.0
    chunk = 1024
    for i in range(0, n, chunk):
        xc = logits.detach()[i : i + chunk].float().requires_grad_()
        part = F.cross_entropy(xc, target[i : i + chunk].float(), reduction="sum")
        (gc,) = torch.autograd.grad(part, xc)
        gc = gc / n  # the mean over all rows
        loss32 += part.item()
        ref_sq += gc.square().sum().item()
        for name, g in (("tritonkit", grad), ("torch eager", grad_eager)):
            d = g[i : i + chunk].float() - gc
            err[name][0] = max(err[name][0], d.abs().max().item())
            err[name][1] += d.square().sum().item()
    loss32 /= n
    res = {"loss_fp32": loss32}
    for name, value in (("tritonkit", loss), ("torch eager", eager)):
        res[name] = {
            "loss": value.item(),
            "loss_rel_err": abs(value.item() - loss32) / abs(loss32),
            "grad_max_abs_err": err[name][0],
            "grad_rel_l2": (err[name][1] / ref_sq) ** 0.5,
            "grad_dtype": str((grad if name == "tritonkit" else grad_eager).dtype),
        }
    # The loss is bf16 (PyTorch's promotion of two bf16 inputs): one rounding, 2**-8 relative;
    # the gradient within twice PyTorch's own error, or one bf16 rounding.
    ours, torch_bf16 = res["tritonkit"], res["torch eager"]
    res["passed"] = ours["loss_rel_err"] <= max(2 * torch_bf16["loss_rel_err"], 2**-8) and ours[
        "grad_rel_l2"
    ] <= max(2 * torch_bf16["grad_rel_l2"], 2**-8)
    return res


def markdown(out: dict) -> str:
    n, c = out["shape"]
    lines = [
        f"## Soft-target cross-entropy ({n}, {c}), {out['dtype']}: {out['gpu']}",
        "",
        f"Timing: {out['timing']}. Peak: above the inputs, one forward + backward "
        f"(the bf16 gradient alone is {out['grad_MiB']:.0f} MiB; an N x C float32 buffer "
        f"{out['fp32_nxc_MiB']:.0f} MiB).",
        "",
        "| what | fwd ms | fwd+bwd ms | peak above inputs, MiB |",
        "|---|---|---|---|",
    ]
    for name, r in out["rows"].items():
        if "error" in r:
            lines.append(f"| {name} | {r['error']} | | |")
            continue
        peak = f"{r['peak_extra_MiB']:.0f}" if "peak_extra_MiB" in r else "-"
        lines.append(f"| {name} | {r['fwd_ms']:.3f} | {r['fwd+bwd_ms']:.3f} | {peak} |")
    for name, r in out.get("sweep", {}).items():
        if "error" in r:
            lines.append(f"| tritonkit {name} | {r['error']} | | |")
        else:
            lines.append(f"| tritonkit {name} | {r['fwd_ms']:.3f} | {r['fwd+bwd_ms']:.3f} | |")
    chk = out["check"]
    lines += [
        "",
        f"Check against F.cross_entropy in float32 (loss {chk['loss_fp32']:.6f}): "
        + "; ".join(
            f"{k} loss rel err {chk[k]['loss_rel_err']:.2e}, grad rel L2 "
            f"{chk[k]['grad_rel_l2']:.2e}, max abs {chk[k]['grad_max_abs_err']:.2e}"
            for k in ("tritonkit", "torch eager")
        )
        + f". Passed: {chk['passed']}.",
    ]
    if "speedup_vs_eager" in out:
        floor_ms = out["floor_bytes"] / 3.0e12 * 1e3
        lines += [
            "",
            f"tritonkit vs torch eager: {out['speedup_vs_eager']:.2f}x; peak beyond the "
            f"gradient {out['peak_beyond_grad_MiB']:.0f} MiB; floor at 3 TB/s "
            f"{floor_ms:.2f} ms. Acceptance: "
            + ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in out["acceptance"].items()),
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
