"""Optimizer defaults against PyTorch, side by side in one run (issue 38, deliver 7).

    python experiments/gpu_optim_defaults.py --out DIR          # GPU: about 4-5 minutes
    python experiments/gpu_optim_defaults.py --out DIR --tiny   # CPU interpreter, tiny sizes

1. Muon on 8 x (4096 x 4096) fp32 parameters: ``tritonkit.optim.Muon`` at its defaults (every
   argument left out) against ``torch.optim.Muon`` (target: >= 1.4x), then a sweep of the
   Newton-Schulz configs (``NSConfig``) and the elementwise chunk configs, at the default
   ``nonfinite`` and at ``"propagate"``, so that the best measured becomes the default.
2. AdamW on one 100M-element fp32 parameter and on a Llama-3.2-1B-like list (147 tensors, 1.24B
   parameters): ``tritonkit.optim.AdamW`` at its defaults against ``torch.optim.AdamW(fused=
   True)`` (target: >= 1.0x), a ``ChunkConfig`` sweep, and each ``nonfinite`` mode.

Every case: GPU time per step (``triton.testing.do_bench``, median) and wall time per step of
back-to-back steps (synchronized around a loop of N steps, divided by N). Parameters and
gradients are the same tensors for every candidate (the steps move the parameters a little;
the times do not depend on the values). Writes DIR/optim_defaults.json and .md; prints the
table and the best configs last. A case that fails is recorded and the run goes on.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

TINY = False
DEV = "cuda" if torch.cuda.is_available() else "cpu"
ROWS: list[dict] = []


def dim(n: int) -> int:
    return max(4, n // 128) if TINY else n


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def gpu_ms(step) -> float:
    if TINY:  # the interpreter: one step, to run the code; the time means nothing
        t0 = time.perf_counter()
        step()
        return (time.perf_counter() - t0) * 1e3
    import triton.testing

    return float(triton.testing.do_bench(step, warmup=25, rep=100, return_mode="median"))


def wall_ms(step, n: int = 20) -> float:
    n = 1 if TINY else n
    step()
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    sync()
    return (time.perf_counter() - t0) / n * 1e3


def measure(group: str, name: str, make, baseline_ms: float | None = None, **extra) -> dict:
    row = {"group": group, "impl": name, **extra}
    try:
        step = make()
        row["ms"] = gpu_ms(step)
        row["wall_ms"] = wall_ms(step)
        if baseline_ms:
            row["speedup"] = baseline_ms / row["ms"]
    except Exception as exc:  # recorded; the run goes on
        row["error"] = f"{type(exc).__name__}: {exc}"[:300]
    ROWS.append(row)
    speed = f" {row['speedup']:.2f}x" if "speedup" in row else ""
    print(f"{group:>10} {name:<60} {row.get('ms', float('nan')):9.3f} ms{speed}"
          f"{'  ' + row['error'] if 'error' in row else ''}", file=sys.stderr)  # fmt: skip
    return row


def params_of(shapes, seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator(device=DEV).manual_seed(seed)
    ps = []
    for s in shapes:
        p = torch.nn.Parameter(torch.randn(s, generator=g, device=DEV) * 0.02)
        p.grad = torch.randn(s, generator=g, device=DEV) * 1e-3
        ps.append(p)
    return ps


def llama_1b_shapes():
    d, ff, kv, vocab, layers = dim(2048), dim(8192), dim(512), dim(128256), 2 if TINY else 16
    shapes = [(vocab, d)]
    for _ in range(layers):
        shapes += [(d,), (d, d), (kv, d), (kv, d), (d, d), (d,), (ff, d), (ff, d), (d, ff)]
    return [*shapes, (d,), (vocab, d)]


def muon() -> None:
    import tritonkit.optim as tko
    from tritonkit.ops.optim.newton_schulz import NSConfig, default_ns_config
    from tritonkit.ops.optim.tables import ChunkConfig

    params = params_of([(dim(4096), dim(4096))] * 8)
    base = measure("muon", "torch.optim.Muon", lambda: torch.optim.Muon(params, lr=1e-3).step)
    ref = base.get("ms")
    measure("muon", "tritonkit Muon, defaults", lambda: tko.Muon(params).step, ref,
            default=True, config=dataclasses.asdict(default_ns_config()))  # fmt: skip
    configs = [
        NSConfig(),
        NSConfig(tma=True),
        NSConfig(block_n=256),
        NSConfig(tma=True, block_n=256),
        NSConfig(tma=True, num_stages=4),
        NSConfig(num_warps=4, num_stages=4),
        NSConfig(block_sym=64),
        NSConfig(block_k=128, num_stages=2),
        NSConfig(product="matmul"),
        NSConfig(product="matmul", tma=True),
    ]
    if TINY:
        configs = [default_ns_config()]
    for cfg in configs:
        # the default nonfinite for every config; "propagate" (no gradient check) for the first
        for nonfinite in ("raise", "propagate") if cfg == configs[0] else ("raise",):
            measure(
                "muon",
                f"tritonkit Muon {nonfinite} {cfg}",
                lambda cfg=cfg, nf=nonfinite: tko.Muon(params, ns_config=cfg, nonfinite=nf).step,
                ref,
                config=dataclasses.asdict(cfg),
                nonfinite=nonfinite,
            )
    for block, warps in [(1024, 4), (4096, 8), (8192, 8)] if not TINY else []:
        chunks = ChunkConfig(block, warps)
        measure("muon", f"tritonkit Muon chunks {chunks}",
                lambda c=chunks: tko.Muon(params, chunks=c).step, ref,
                chunks=dataclasses.asdict(chunks))  # fmt: skip


def adamw() -> None:
    cases = {
        "100M": [(dim(100_000_000) if not TINY else 4096,)],
        "llama-1B": llama_1b_shapes(),
    }
    for label, shapes in cases.items():
        adamw_case(f"adamw {label}", params_of(shapes))
        if DEV == "cuda":
            torch.cuda.empty_cache()


def adamw_case(group: str, params: list[torch.nn.Parameter]) -> None:
    import tritonkit.optim as tko
    from tritonkit.ops.optim.tables import ChunkConfig

    fused = DEV == "cuda"
    ref = measure(group, "torch AdamW fused",
                  lambda: torch.optim.AdamW(params, lr=1e-3, fused=fused).step)  # fmt: skip
    measure(group, "torch AdamW foreach",
            lambda: torch.optim.AdamW(params, lr=1e-3, foreach=True).step)  # fmt: skip
    ref_ms = ref.get("ms")
    measure(group, "tritonkit AdamW, defaults",
            lambda: tko.AdamW(params, lr=1e-3).step, ref_ms, default=True)  # fmt: skip
    for nonfinite in ("skip", "propagate"):
        measure(group, f"tritonkit AdamW {nonfinite}",
                lambda nf=nonfinite: tko.AdamW(params, lr=1e-3, nonfinite=nf).step, ref_ms,
                nonfinite=nonfinite)  # fmt: skip
    sweep = [(1024, 4), (2048, 4), (4096, 4), (4096, 8), (8192, 8), (16384, 8)]
    for block, warps in sweep if not TINY else [(2048, 4)]:
        chunks = ChunkConfig(block, warps)
        for nonfinite in ("raise", "propagate"):
            measure(group, f"tritonkit AdamW {nonfinite} {chunks}",
                    lambda c=chunks, nf=nonfinite: tko.AdamW(
                        params, lr=1e-3, chunks=c, nonfinite=nf).step,
                    ref_ms, chunks=dataclasses.asdict(chunks), nonfinite=nonfinite)  # fmt: skip


def best(group: str, nonfinite: str) -> dict | None:
    rows = [r for r in ROWS if r["group"] == group and "ms" in r and r.get("nonfinite") in
            (nonfinite, None) and r["impl"].startswith("tritonkit")]  # fmt: skip
    return min(rows, key=lambda r: r["ms"], default=None)


def main() -> None:
    global TINY, DEV
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--tiny", action="store_true", help="tiny sizes under the CPU interpreter")
    args = ap.parse_args()
    TINY = args.tiny or not torch.cuda.is_available()
    if TINY and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
        DEV = "cpu"
    import triton

    t0 = time.perf_counter()
    for section in (muon, adamw):
        try:
            section()
        except Exception as exc:  # a whole section that fails is recorded
            ROWS.append({"group": section.__name__, "impl": "-", "error": repr(exc)[:300]})
    fp = {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "seconds": time.perf_counter() - t0,
        "tiny": TINY,
    }
    picks = {
        f"{g} ({nf})": best(g, nf)
        for g in ("muon", "adamw 100M", "adamw llama-1B")
        for nf in ("raise", "propagate")
    }
    lines = ["| group | impl | GPU ms | wall ms | speedup vs torch |", "|---|---|---|---|---|"]
    for r in ROWS:
        if "error" in r:
            lines.append(f"| {r['group']} | {r['impl']} | error: {r['error'][:80]} | | |")
        else:
            sp = f"{r['speedup']:.2f}x" if "speedup" in r else ""
            lines.append(
                f"| {r['group']} | {r['impl']} | {r['ms']:.3f} | {r['wall_ms']:.3f} | {sp} |"
            )
    md = "\n".join(lines)
    summary = [f"best {k}: {v['impl']} ({v.get('speedup', 0):.2f}x)" for k, v in picks.items() if v]
    summary += [f"defaults: {r['group']} {r['impl']}: {r.get('speedup', 0):.2f}x"
                for r in ROWS if r.get("default") and "ms" in r]  # fmt: skip
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        doc = {"fingerprint": fp, "rows": ROWS, "best": picks}
        (args.out / "optim_defaults.json").write_text(json.dumps(doc, indent=1, default=str))
        (args.out / "optim_defaults.md").write_text(
            f"# Optimizer defaults\n\n{json.dumps(fp)}\n\n"
            + "\n".join(f"- {s}" for s in summary) + "\n\n" + md + "\n"
        )  # fmt: skip
    print(md)
    print("\n".join(summary))


if __name__ == "__main__":
    main()
