"""Decode-shape GEMMs (M = 1..16 tokens against one weight), as a generation loop calls them:
torch's bf16 ``nn.Linear`` (cuBLAS) against ``tritonkit.linear``, the weight-only int8 linear
(``Int8Linear(mode="weight_only")``) and ``Float8Linear`` (tensorwise and rowwise), bf16.

For each weight shape (out_features x in_features) and M in (1, 2, 4, 8, 16):

- GPU time: ``triton.testing.do_bench`` median, L2 flushed before each call;
- wall time per call of back-to-back calls: synchronize, N calls, synchronize (what a decode
  loop sees: the host's time per call where it exceeds the GPU's), and the host time of the
  N calls alone (before the last synchronize);
- SQNR (dB) of each output against the float64 product of x and the bf16 weight;
- the kernel config each tritonkit path chose, and replay's recordings and failures.

Wall times are taken twice: with replay (ops/_core/replay.py: a call with metadata seen
before runs from C++; the extension is built, or loaded, before timing) and, in a child
process with ``TRITONKIT_REPLAY=0``, on the Python path alone. The acceptance: every tritonkit
path's wall time at most torch's, at every M, with replay.

    python experiments/gpu_decode.py --out DIR            # GPU: about two minutes
    python experiments/gpu_decode.py --out DIR --autotune 1   # tune every decode key first
    python experiments/gpu_decode.py --out DIR --tiny     # CPU interpreter: small shapes, a
                                                          # run-through (its timings mean nothing)

``--autotune`` sets TRITONKIT_AUTOTUNE for the run (default: as a user's run finds it, "auto":
on a GPU without shipped tables, e.g. an H100, each new decode key is timed on its first call,
up to 10 s each; "0": the heuristic configs, untimed).

Writes DIR/decode.json and DIR/decode.md and prints the table last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

TINY = "--tiny" in sys.argv
if TINY:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

import tritonkit as tk  # noqa: E402
from tritonkit.nn import Float8Linear  # noqa: E402
from tritonkit.nn.quantized import Int8Linear  # noqa: E402
from tritonkit.ops._core import replay  # noqa: E402
from tritonkit.ops.matmul import linear_plan  # noqa: E402
from tritonkit.ops.quant.plan import weight_only_plan  # noqa: E402

MS = (1, 2, 4, 8, 16)
SHAPES = [(8192, 8192), (4096, 14336)]  # (out_features, in_features)
TINY_SHAPES = [(72, 200)]
PATHS = ("torch bf16", "tk.linear", "int8 weight-only", "Float8Linear", "Float8Linear rowwise")


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def wall_us(fn, n: int) -> tuple[float, float]:
    """(wall, host) us per call of n back-to-back calls."""
    for _ in range(10):
        fn()
    _sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    _sync()
    t2 = time.perf_counter()
    return (t2 - t0) / n * 1e6, (t1 - t0) / n * 1e6


def gpu_us(fn) -> float | None:
    if not torch.cuda.is_available():
        return None
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3


def sqnr_db(out: torch.Tensor, ref: torch.Tensor) -> float:
    err = (out.double() - ref).pow(2).sum()
    return float(10 * torch.log10(ref.pow(2).sum() / err.clamp_min(1e-300)))


def layers(n: int, k: int, device: str) -> dict:
    torch.manual_seed(0)
    lin = torch.nn.Linear(k, n, bias=False, device=device, dtype=torch.bfloat16)
    return {
        "lin": lin,
        "wo": Int8Linear.from_float(lin, "weight_only"),
        "f8": Float8Linear.from_float(lin, "tensorwise"),
        "f8r": Float8Linear.from_float(lin, "rowwise"),
    }


def candidates(mods: dict, x: torch.Tensor) -> dict:
    lin, wo, f8, f8r = mods["lin"], mods["wo"], mods["f8"], mods["f8r"]
    w = lin.weight
    return {
        "torch bf16": lambda: lin(x),
        "tk.linear": lambda: tk.linear(x, w),
        "int8 weight-only": lambda: wo(x),
        "Float8Linear": lambda: f8(x),
        "Float8Linear rowwise": lambda: f8r(x),
    }


def configs(mods: dict, x: torch.Tensor) -> dict:
    """The launch config each tritonkit path runs for x (from the plan cache)."""
    lin, wo = mods["lin"], mods["wo"]
    out = {}
    out["tk.linear"] = repr(linear_plan(x, lin.weight, None, None, "none", False).gemm.config)
    plan = weight_only_plan(x, wo.weight_int8, wo.weight_scale, None)
    out["int8 weight-only"] = repr(plan.decode.config if plan.decode else plan.config)
    return out


def run_wall_only(args) -> dict:
    """The child process's work (TRITONKIT_REPLAY=0): wall and host time of every case."""
    device = "cpu" if TINY else "cuda"
    rows = {}
    with torch.no_grad():
        for n, k in TINY_SHAPES if TINY else SHAPES:
            mods = layers(n, k, device)
            for m in MS:
                x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
                for name, fn in candidates(mods, x).items():
                    wall, host = wall_us(fn, args.calls)
                    rows[f"{n}x{k} M={m} {name}"] = {"wall_us": wall, "host_us": host}
    return rows


def run(args) -> dict:
    device = "cpu" if TINY else "cuda"
    ext = replay.extension(wait=True)  # build or load it now, not inside the timing
    doc: dict = {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (interpreter)",
        "torch": torch.__version__,
        "replay": ext is not None,
        "replay_disabled": replay.STATS.disabled,
        "calls": args.calls,
        "autotune": os.environ.get("TRITONKIT_AUTOTUNE", "auto"),
        "rows": {},
    }
    with torch.no_grad():
        for n, k in TINY_SHAPES if TINY else SHAPES:
            mods = layers(n, k, device)
            w64 = mods["lin"].weight.double()
            for m in MS:
                x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
                ref = x.double() @ w64.t()
                cands = candidates(mods, x)
                for name, fn in cands.items():
                    key = f"{n}x{k} M={m} {name}"
                    try:
                        out = fn()
                        row = {"sqnr_db": sqnr_db(out, ref)}
                        row["gpu_us"] = gpu_us(fn)
                        row["wall_us"], row["host_us"] = wall_us(fn, args.calls)
                    except Exception as exc:  # one failure is recorded, the rest run
                        row = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                    doc["rows"][key] = row
                for name, cfg in configs(mods, x).items():
                    doc["rows"][f"{n}x{k} M={m} {name}"]["config"] = cfg
            del mods
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    doc["replay_stats"] = {
        "recordings": replay.STATS.recordings,
        "failures": dict(replay.STATS.failures),
    }
    return doc


def python_path(args) -> dict:
    """Wall times on the Python path: this script again, in a child with replay off."""
    env = {**os.environ, "TRITONKIT_REPLAY": "0"}
    cmd = [sys.executable, __file__, "--child", "--calls", str(args.calls)]
    if TINY:
        cmd.append("--tiny")
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if res.returncode != 0:
        return {"error": res.stderr[-2000:]}
    return json.loads(res.stdout.strip().splitlines()[-1])


def table(doc: dict) -> str:
    lines = [
        f"Decode GEMMs, bf16, {doc['gpu']} (torch {doc['torch']}); us per call; wall: "
        f"{doc['calls']} back-to-back calls (replay {'on' if doc['replay'] else 'OFF'}; "
        f"python: TRITONKIT_REPLAY=0); autotune {doc['autotune']}; SQNR against float64.",
        "",
        "| weight | M | path | GPU us | wall us | host us | wall us, python | SQNR dB | "
        "<= torch wall |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    py = doc.get("python_path", {})
    for key, row in doc["rows"].items():
        shape, m, name = key.split(" ", 2)
        if "error" in row:
            lines.append(f"| {shape} | {m[2:]} | {name} | error: {row['error'][:80]} | | | | | |")
            continue
        base = doc["rows"].get(f"{shape} {m} torch bf16", {})
        ok = ""
        if name != "torch bf16" and "wall_us" in base:
            ok = "yes" if row["wall_us"] <= base["wall_us"] else "**no**"

        def f(v):
            return "n/a" if v is None else f"{v:.1f}"

        pw = py.get(key, {}).get("wall_us")
        lines.append(
            f"| {shape} | {m[2:]} | {name} | {f(row['gpu_us'])} | {f(row['wall_us'])} | "
            f"{f(row['host_us'])} | {f(pw)} | {row['sqnr_db']:.1f} | {ok} |"
        )
    stats = doc.get("replay_stats", {})
    lines += ["", f"replay: {stats}"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--tiny", action="store_true", help="CPU interpreter, small shapes")
    ap.add_argument("--calls", type=int, default=None, help="back-to-back calls per wall time")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--no-python-path", action="store_true", help="skip the replay-off timing")
    ap.add_argument("--autotune", choices=("0", "1"), help="TRITONKIT_AUTOTUNE for the run")
    args = ap.parse_args()
    if args.autotune is not None:  # read at every call (plan.Env): the child inherits it
        os.environ["TRITONKIT_AUTOTUNE"] = args.autotune
    args.calls = args.calls or (5 if TINY else 300)
    if args.child:
        print(json.dumps(run_wall_only(args)))
        return
    if args.out is None:
        ap.error("--out is required")
    args.out.mkdir(parents=True, exist_ok=True)
    doc = run(args)
    if not args.no_python_path:
        doc["python_path"] = python_path(args)
    (args.out / "decode.json").write_text(json.dumps(doc, indent=1))
    md = table(doc)
    (args.out / "decode.md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
