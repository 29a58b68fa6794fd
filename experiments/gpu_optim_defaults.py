"""Optimizer defaults against PyTorch, side by side in one run (issues 38 and 43).

    python experiments/gpu_optim_defaults.py --out DIR          # GPU: about 2 minutes
    python experiments/gpu_optim_defaults.py --out DIR --ship   # and write the shipped table
    python experiments/gpu_optim_defaults.py --out DIR --tiny   # CPU interpreter, tiny sizes
    python experiments/gpu_optim_defaults.py --ship-from DIR/optim_defaults.json  # table only

1. Muon on 8 x (4096 x 4096) fp32 parameters: ``tritonkit.optim.Muon`` at its defaults (every
   argument left out) against ``torch.optim.Muon`` (target: >= 1.4x), then a sweep of the
   Newton-Schulz configs (``NSConfig``, the candidates ``NS_CANDIDATES`` a table may name) and
   the elementwise chunk configs, at the default ``nonfinite`` and at ``"propagate"``.
2. AdamW on one 100M-element fp32 parameter, on a Llama-3.2-1B-like list (147 tensors, 1.24B
   parameters) and on GPT-2 small's list in bf16 (148 tensors, as a patched bf16 model trains):
   ``tritonkit.optim.AdamW`` at its defaults against ``torch.optim.AdamW(fused=True)`` (target:
   >= 1.0x), each ``nonfinite`` mode, and a ``ChunkConfig`` sweep (``CHUNK_CANDIDATES``).

``--ship`` (or ``--ship-from`` an earlier run's JSON) writes the winners as this GPU's shipped
table, ``src/tritonkit/tuned/<gpu>/optim.json``: per dtype, the chunk config with the lowest
mean time relative to each case's fastest (over every AdamW case and mode of that dtype); per
Muon shape, the fastest Newton-Schulz config at the default ``nonfinite``. The optimizers read
it when ``chunks`` / ``ns_config`` are left out.

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


def params_of(shapes, seed: int = 0, dtype=torch.float32) -> list[torch.nn.Parameter]:
    g = torch.Generator(device=DEV).manual_seed(seed)
    ps = []
    for s in shapes:
        p = torch.nn.Parameter((torch.randn(s, generator=g, device=DEV) * 0.02).to(dtype))
        p.grad = (torch.randn(s, generator=g, device=DEV) * 1e-3).to(dtype)
        ps.append(p)
    return ps


def llama_1b_shapes():
    d, ff, kv, vocab, layers = dim(2048), dim(8192), dim(512), dim(128256), 2 if TINY else 16
    shapes = [(vocab, d)]
    for _ in range(layers):
        shapes += [(d,), (d, d), (kv, d), (kv, d), (d, d), (d,), (ff, d), (ff, d), (d, ff)]
    return [*shapes, (d,), (vocab, d)]


MUON_SHAPE = (8, 4096, 4096)  # (matrices, rows, cols)


def muon() -> None:
    import tritonkit.optim as tko
    from tritonkit.ops.optim.config import NS_CANDIDATES, ChunkConfig, choose_ns_config

    n, rows, cols = MUON_SHAPE
    params = params_of([(dim(rows), dim(cols))] * n)
    chosen = choose_ns_config(n, dim(rows), dim(cols), torch.device(DEV))
    base = measure("muon", "torch.optim.Muon", lambda: torch.optim.Muon(params, lr=1e-3).step)
    ref = base.get("ms")
    measure("muon", "tritonkit Muon, defaults", lambda: tko.Muon(params).step, ref,
            default=True, config=dataclasses.asdict(chosen), shape=MUON_SHAPE)  # fmt: skip
    configs = list(NS_CANDIDATES) if not TINY else [chosen]
    for cfg in configs:
        # the default nonfinite for every config; "propagate" (no gradient check) for the first
        for nonfinite in ("skip", "propagate") if cfg == configs[0] else ("skip",):
            measure(
                "muon",
                f"tritonkit Muon {nonfinite} {cfg}",
                lambda cfg=cfg, nf=nonfinite: tko.Muon(params, ns_config=cfg, nonfinite=nf).step,
                ref,
                config=dataclasses.asdict(cfg),
                nonfinite=nonfinite,
                shape=MUON_SHAPE,
            )
    measure("muon", "tritonkit Muon raise (the opt-in sync)",
            lambda: tko.Muon(params, nonfinite="raise").step, ref, nonfinite="raise")  # fmt: skip
    for block, warps in [(1024, 4), (2048, 4), (4096, 8)] if not TINY else []:
        chunks = ChunkConfig(block, warps)
        measure("muon", f"tritonkit Muon chunks {chunks}",
                lambda c=chunks: tko.Muon(params, chunks=c).step, ref,
                chunks=dataclasses.asdict(chunks))  # fmt: skip


def gpt2_shapes():
    """GPT-2 small's parameters (148 tensors; the LM head is tied to the embedding)."""
    d, vocab, layers = dim(768), dim(50257), 2 if TINY else 12
    shapes = [(vocab, d), (dim(1024), d)]
    for _ in range(layers):
        shapes += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,)]
        shapes += [(d, 4 * d), (4 * d,), (4 * d, d), (d,)]
    return [*shapes, (d,), (d,)]


def adamw() -> None:
    cases = {
        "100M": ([(dim(100_000_000) if not TINY else 4096,)], torch.float32),
        "llama-1B": (llama_1b_shapes(), torch.float32),
        "gpt2 bf16": (gpt2_shapes(), torch.bfloat16),
    }
    for label, (shapes, dtype) in cases.items():
        adamw_case(f"adamw {label}", params_of(shapes, dtype=dtype), dtype)
        if DEV == "cuda":
            torch.cuda.empty_cache()


def adamw_case(group: str, params: list[torch.nn.Parameter], dtype: torch.dtype) -> None:
    import tritonkit.optim as tko
    from tritonkit.ops.optim.config import CHUNK_CANDIDATES, default_chunks

    fused = DEV == "cuda"
    dt = str(dtype).removeprefix("torch.")
    ref = measure(group, "torch AdamW fused",
                  lambda: torch.optim.AdamW(params, lr=1e-3, fused=fused).step)  # fmt: skip
    measure(group, "torch AdamW foreach",
            lambda: torch.optim.AdamW(params, lr=1e-3, foreach=True).step)  # fmt: skip
    ref_ms = ref.get("ms")
    chosen = default_chunks(torch.device(DEV), dtype)
    measure(group, "tritonkit AdamW, defaults", lambda: tko.AdamW(params, lr=1e-3).step,
            ref_ms, default=True, chunks=dataclasses.asdict(chosen), dtype=dt)  # fmt: skip
    for nonfinite in ("raise", "propagate"):
        measure(group, f"tritonkit AdamW {nonfinite}",
                lambda nf=nonfinite: tko.AdamW(params, lr=1e-3, nonfinite=nf).step, ref_ms,
                nonfinite=nonfinite, dtype=dt)  # fmt: skip
    for chunks in CHUNK_CANDIDATES if not TINY else CHUNK_CANDIDATES[:1]:
        for nonfinite in ("skip", "propagate"):
            measure(group, f"tritonkit AdamW {nonfinite} {chunks}",
                    lambda c=chunks, nf=nonfinite: tko.AdamW(
                        params, lr=1e-3, chunks=c, nonfinite=nf).step,
                    ref_ms, chunks=dataclasses.asdict(chunks), nonfinite=nonfinite,
                    dtype=dt)  # fmt: skip


def best(group: str, nonfinite: str) -> dict | None:
    rows = [r for r in ROWS if r["group"] == group and "ms" in r and r.get("nonfinite") in
            (nonfinite, None) and r["impl"].startswith("tritonkit")]  # fmt: skip
    return min(rows, key=lambda r: r["ms"], default=None)


def winners(rows: list[dict]) -> tuple[dict, dict]:
    """({dtype: chunk config dict}, {muon shape: NS config dict}) of a run's rows (see the
    module docstring for the rule)."""
    chunk_rows = [r for r in rows if "ms" in r and "chunks" in r and r["group"].startswith("adamw")
                  and not r.get("default")]  # fmt: skip
    fastest: dict[tuple, float] = {}
    for r in chunk_rows:
        case = (r["group"], r.get("nonfinite"))
        fastest[case] = min(fastest.get(case, float("inf")), r["ms"])
    scores: dict[str, dict[str, list[float]]] = {}
    for r in chunk_rows:
        cfg = json.dumps(r["chunks"], sort_keys=True)
        ratio = r["ms"] / fastest[(r["group"], r.get("nonfinite"))]
        scores.setdefault(r.get("dtype", "float32"), {}).setdefault(cfg, []).append(ratio)
    chunks = {
        dt: json.loads(min(by_cfg, key=lambda c: sum(by_cfg[c]) / len(by_cfg[c])))
        for dt, by_cfg in scores.items()
    }
    ns: dict[tuple, dict] = {}
    ns_rows = [
        r
        for r in rows
        if "ms" in r and r["group"] == "muon" and "config" in r and not r.get("default")
    ]
    # the default nonfinite's rows if this run has them (earlier runs' default was "raise")
    modes = {r.get("nonfinite") for r in ns_rows}
    mode = "skip" if "skip" in modes else "raise"
    for r in ns_rows:
        if r.get("nonfinite") != mode:
            continue
        shape = tuple(r.get("shape", MUON_SHAPE))
        if shape not in ns or r["ms"] < ns[shape]["ms"]:
            ns[shape] = {"ms": r["ms"], "config": r["config"]}
    return chunks, {shape: v["config"] for shape, v in ns.items()}


def _ns_fields(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if k != "group_m"}


def ship(doc: dict) -> Path:
    """Write a run's winners as the shipped table of the GPU it ran on (``optim.json``)."""
    from tritonkit import _hardware, _tuning
    from tritonkit.ops.optim.config import CHUNKS_KERNEL, NS_KERNEL, ChunkConfig, NSConfig, ns_key

    fp = doc["fingerprint"]
    if not fp.get("gpu") or fp.get("tiny"):
        raise SystemExit("--ship: the run must be a full run on a GPU")
    chunks, ns = winners(doc["rows"])
    tunings = [
        _tuning.Tuning(CHUNKS_KERNEL, {"dtype": dt}, ChunkConfig(**cfg).tuning(), [], 0.0)
        for dt, cfg in chunks.items()
    ]
    tunings += [
        # a run recorded while the tile order was a field carries "group_m" (always 8)
        _tuning.Tuning(NS_KERNEL, ns_key(*shape), NSConfig(**_ns_fields(cfg)).tuning(), [], 0.0)
        for shape, cfg in ns.items()
    ]
    # Entry keys hold the hardware profile's name, as on the GPU itself.
    _hardware.set_active(_hardware.match(fp["gpu"]))
    try:
        return _tuning.write_shipped("optim", tunings, (fp["gpu"], fp["triton"]))
    finally:
        _hardware.set_active(None)


def main() -> None:
    global TINY, DEV
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--tiny", action="store_true", help="tiny sizes under the CPU interpreter")
    ap.add_argument("--ship", action="store_true", help="write the winners' shipped table")
    ap.add_argument("--ship-from", type=Path, help="an earlier run's JSON: ship it, run nothing")
    args = ap.parse_args()
    if args.ship_from:
        print(f"shipped table: {ship(json.loads(args.ship_from.read_text()))}")
        return
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
        for g in ("muon", "adamw 100M", "adamw llama-1B", "adamw gpt2 bf16")
        for nf in ("skip", "propagate")
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
    doc = {"fingerprint": fp, "rows": ROWS, "best": picks}
    if args.ship:
        summary.append(f"shipped table: {ship(doc)}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "optim_defaults.json").write_text(json.dumps(doc, indent=1, default=str))
        (args.out / "optim_defaults.md").write_text(
            f"# Optimizer defaults\n\n{json.dumps(fp)}\n\n"
            + "\n".join(f"- {s}" for s in summary) + "\n\n" + md + "\n"
        )  # fmt: skip
    print(md)
    print("\n".join(summary))


if __name__ == "__main__":
    main()
