"""Sweep the matmul family on the GPU against cuBLAS: the acceptance run of issue 5.

1. The evolution (naive -> tiled -> pipelined -> autotuned -> persistent, then tritonkit's
   default path) at 4096^3 and 8192^3 in bf16 and fp16, and the default path on the LLM
   shapes (M = 8192; N, K in {4096, 11008, 14336}) in bf16, each timed interleaved with
   torch.matmul: TFLOP/s, % of cuBLAS, gain over the previous version.
2. ``linear`` + bias + GELU(tanh), bf16, 8192 x 4096 -> 4096: forward and forward + backward
   against eager PyTorch (F.linear, then F.gelu).
3. FP8 e4m3 8192^3 against torch._scaled_mm (per-tensor and per-row scales) and INT8 8192^3
   against torch._int_mm.
4. Relative L2 errors against float64: bf16/fp16 (K = 8192), TF32, FP8, INT8, fused linear;
   tritonkit's beside PyTorch's own.

Autotuning starts from an empty cache (a fresh temporary directory unless ``--cache-dir`` is
given), so the first call of each path includes its compilation and tuning: the "first call"
column and ``tuning`` in the JSON say what that cost. Formulas: a GEMM does 2*M*N*K FLOPs
(INT8: operations); linear's forward + backward does three GEMMs, 6*M*N*K. Everything goes to
``--out`` (JSON); the acceptance summary is printed last. About 4-6 minutes on an H200.

    python experiments/sweep_matmul.py --out matmul_sweep.json [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
import traceback
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

# H200, torch 2.11 (same run): the anchors, printed beside the measured baselines.
ANCHORS_H200 = {
    "bf16 4096": 726,
    "bf16 8192": 679,
    "fp16 4096": 758,
    "fp16 8192": 670,
    "fp8 8192": 1250,
    "int8 8192": 128,
}
LLM_SIZES = (4096, 11008, 14336)


def _tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


def _first_call(fn: Callable[[], object]) -> float:
    """Seconds of the first call: compilation and autotuning included."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def _time(fns: dict[str, Callable[[], object]]) -> dict[str, float]:
    from tritonkit.harness.timing import summarize, time_interleaved

    samples = time_interleaved(fns, rep_ms=150, min_samples=15, max_samples=60)
    return {k: summarize(v).median for k, v in samples.items()}


def _randn(shape, dtype, scale=1.0):
    return (torch.randn(shape, device="cuda") * scale).to(dtype)


def _rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


def _print_rows(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print(
        f"{'version':>20} {'ms':>9} {'TFLOP/s':>8} {'% cuBLAS':>9} {'gain':>6} {'first call':>11}"
    )
    for r in rows:
        gain = f"{r['gain']:.2f}x" if r.get("gain") else "—"
        print(
            f"{r['version']:>20} {r['ms']:9.3f} {r['TFLOPs']:8.1f} {r['pct_cublas']:8.1f}% "
            f"{gain:>6} {r['first_call_s']:10.1f}s"
        )


# ---- 1. the evolution, and the LLM shapes --------------------------------------------------------


def evolution(dtypes, sizes) -> list[dict]:
    from tritonkit.ops import matmul as mm

    cases = []
    for dtype in dtypes:
        for size in sizes:
            a, b = _randn((size, size), dtype), _randn((size, size), dtype)
            fns = {"torch": partial(torch.matmul, a, b)}
            for v in mm.VARIANTS:
                if v == "naive" and size > 4096:  # CUDA cores: seconds per call at 8192^3
                    continue
                fns[v] = partial(mm.matmul_variant, a, b, v)
            fns["tritonkit"] = partial(mm.matmul, a, b)
            first = {k: _first_call(f) for k, f in fns.items()}
            ms = _time(fns)
            flops = 2 * size**3
            rows, previous = [], None
            for name in fns:
                row = {
                    "version": name,
                    "ms": ms[name],
                    "TFLOPs": _tflops(flops, ms[name]),
                    "pct_cublas": 100 * ms["torch"] / ms[name],
                    "gain": previous / ms[name] if previous and name != "torch" else None,
                    "first_call_s": first[name],
                }
                if name != "torch":
                    previous = ms[name]
                rows.append(row)
            name = f"{str(dtype).removeprefix('torch.')} {size}^3"
            _print_rows(f"evolution, {name}", rows)
            cases.append({"case": name, "rows": rows})
            del a, b
            torch.cuda.empty_cache()
    return cases


def llm_shapes(quick: bool) -> list[dict]:
    from tritonkit.ops import matmul as mm

    sizes = LLM_SIZES[::2] if quick else LLM_SIZES
    rows = []
    for n in sizes:
        for k in sizes:
            m = 8192
            a, b = _randn((m, k), torch.bfloat16), _randn((k, n), torch.bfloat16)
            fns = {"torch": partial(torch.matmul, a, b), "tritonkit": partial(mm.matmul, a, b)}
            first = _first_call(fns["tritonkit"])
            ms = _time(fns)
            flops = 2 * m * n * k
            row = {
                "shape": (m, n, k),
                "ms": ms["tritonkit"],
                "torch_ms": ms["torch"],
                "TFLOPs": _tflops(flops, ms["tritonkit"]),
                "torch_TFLOPs": _tflops(flops, ms["torch"]),
                "pct_cublas": 100 * ms["torch"] / ms["tritonkit"],
                "first_call_s": first,
            }
            print(
                f"  LLM bf16 M={m} N={n:>5} K={k:>5}: {row['TFLOPs']:6.1f} TFLOP/s, "
                f"cuBLAS {row['torch_TFLOPs']:6.1f} -> {row['pct_cublas']:5.1f}% "
                f"(first call {first:.1f}s)"
            )
            rows.append(row)
            del a, b
            torch.cuda.empty_cache()
    return rows


# ---- 2. fused linear ---------------------------------------------------------------------------


def fused_linear() -> list[dict]:
    from tritonkit.ops.matmul import linear

    m, n, k = 8192, 4096, 4096
    x = _randn((m, k), torch.bfloat16)
    w = _randn((n, k), torch.bfloat16, 1 / math.sqrt(k))
    b = _randn((n,), torch.bfloat16)
    g = _randn((m, n), torch.bfloat16)

    def eager(x, w, b):
        return F.gelu(F.linear(x, w, b), approximate="tanh")

    def ours(x, w, b):
        return linear(x, w, b, "gelu_tanh")

    leaves = [t.detach().requires_grad_() for t in (x, w, b)]
    fwd = {"torch": partial(eager, x, w, b), "tritonkit": partial(ours, x, w, b)}
    both = {
        "torch": lambda: torch.autograd.grad(eager(*leaves), leaves, g),
        "tritonkit": lambda: torch.autograd.grad(ours(*leaves), leaves, g),
    }
    rows = []
    for mode, fns, flops in (("fwd", fwd, 2 * m * n * k), ("fwd+bwd", both, 6 * m * n * k)):
        first = _first_call(fns["tritonkit"])
        ms = _time(fns)
        row = {
            "mode": mode,
            "ms": ms["tritonkit"],
            "torch_ms": ms["torch"],
            "TFLOPs": _tflops(flops, ms["tritonkit"]),
            "speedup": ms["torch"] / ms["tritonkit"],
            "first_call_s": first,
        }
        print(
            f"  linear+bias+gelu_tanh bf16 {m}x{k}->{n} {mode}: {row['ms']:.3f} ms vs eager "
            f"{row['torch_ms']:.3f} ms -> {row['speedup']:.2f}x (first call {first:.1f}s)"
        )
        rows.append(row)
    return rows


# ---- 3. FP8 and INT8 -----------------------------------------------------------------------------


def low_precision() -> list[dict]:
    from tritonkit.ops.matmul import int8_matmul, scaled_matmul

    size = 8192
    flops = 2 * size**3
    rows = []
    a = _randn((size, size), torch.float8_e4m3fn)
    b = _randn((size, size), torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
    scales = {
        "per-tensor": (torch.tensor(1.0, device="cuda"), torch.tensor(1.0, device="cuda")),
        "per-row": (
            torch.rand(size, 1, device="cuda") + 0.5,
            torch.rand(1, size, device="cuda") + 0.5,
        ),
    }
    for name, (sa, sb) in scales.items():
        fns = {
            "torch": partial(
                torch._scaled_mm, a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16
            ),
            "tritonkit": partial(scaled_matmul, a, b, sa, sb, torch.bfloat16),
        }
        first = _first_call(fns["tritonkit"])
        ms = _time(fns)
        row = {
            "case": f"fp8 e4m3 {size}^3 {name}",
            "TFLOPs": _tflops(flops, ms["tritonkit"]),
            "torch_TFLOPs": _tflops(flops, ms["torch"]),
            "ratio": ms["torch"] / ms["tritonkit"],
            "first_call_s": first,
        }
        rows.append(row)
    del a, b
    ai = torch.randint(-128, 128, (size, size), device="cuda", dtype=torch.int8)
    bi = torch.randint(-128, 128, (size, size), device="cuda", dtype=torch.int8).t()
    fns = {"torch": partial(torch._int_mm, ai, bi), "tritonkit": partial(int8_matmul, ai, bi)}
    first = _first_call(fns["tritonkit"])
    ms = _time(fns)
    rows.append(
        {
            "case": f"int8 {size}^3 -> int32",
            "TFLOPs": _tflops(flops, ms["tritonkit"]),
            "torch_TFLOPs": _tflops(flops, ms["torch"]),
            "ratio": ms["torch"] / ms["tritonkit"],
            "first_call_s": first,
        }
    )
    for r in rows:
        print(
            f"  {r['case']}: {r['TFLOPs']:7.1f} TOP/s vs torch {r['torch_TFLOPs']:7.1f} -> "
            f"{r['ratio']:.2f}x (first call {r['first_call_s']:.1f}s)"
        )
    return rows


# ---- 4. accuracy ---------------------------------------------------------------------------------


def accuracy() -> list[dict]:
    from tritonkit.ops import matmul as mm
    from tritonkit.ops.matmul.configs import candidates

    rows = []
    m, n, k = 4096, 4096, 8192

    def add(case, ours, theirs, ref, bound=None, ratio_bound=None):
        row = {"case": case, "ours": _rel_l2(ours, ref), "torch": _rel_l2(theirs, ref)}
        row["ratio"] = row["ours"] / row["torch"] if row["torch"] else None
        row["bound"], row["ratio_bound"] = bound, ratio_bound
        rows.append(row)
        print(f"  rel L2 {case}: tritonkit {row['ours']:.2e}, torch {row['torch']:.2e}")

    for dtype in (torch.bfloat16, torch.float16):
        a, b = _randn((m, k), dtype), _randn((k, n), dtype)
        ref = a.double() @ b.double()
        add(f"{dtype} K={k}", mm.matmul(a, b), torch.matmul(a, b), ref, bound=1e-2)
    # TF32: PyTorch's switch turns it on for both; the first tuning candidate (the error does
    # not depend on the tile) spares a tuning run.
    a, b = _randn((m, k), torch.float32), _randn((k, n), torch.float32)
    ref = a.double() @ b.double()
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        cfg = candidates("persistent", "tf32", True, m, 1)[0]
        add(f"tf32 K={k}", mm.matmul_fwd(a, b, config=cfg), torch.matmul(a, b), ref, bound=2e-3)
    finally:
        torch.set_float32_matmul_precision(before)
    a8 = _randn((m, k), torch.float8_e4m3fn)
    b8 = _randn((n, k), torch.float8_e4m3fn).t()
    sa = torch.rand(m, 1, device="cuda") + 0.5
    sb = (torch.rand(1, n, device="cuda") + 0.5) / math.sqrt(k)
    ref = (a8.double() @ b8.double()) * sa.double() * sb.double()
    ours = mm.scaled_matmul(a8, b8, sa, sb, torch.bfloat16)
    theirs = torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    add(f"fp8 e4m3 per-row K={k}", ours, theirs, ref, ratio_bound=1.5)
    ai = torch.randint(-128, 128, (m, k), device="cuda", dtype=torch.int8)
    bi = torch.randint(-128, 128, (n, k), device="cuda", dtype=torch.int8).t()
    exact = torch._int_mm(ai, bi)
    same = torch.equal(mm.int8_matmul(ai, bi), exact)
    rows.append({"case": "int8 -> int32 equals torch._int_mm", "ours": 0.0 if same else 1.0})
    print(f"  int8 -> int32 equal to torch._int_mm: {same}")
    sa, sb = sa / 5000, sb / 74
    ref = exact.double() * sa.double() * sb.double()
    ours = mm.int8_matmul(ai, bi, sa, sb, out_dtype=torch.bfloat16)
    add(
        f"int8 dequant bf16 K={k}", ours, (exact.float() * sa * sb).bfloat16(), ref, ratio_bound=1.5
    )
    x, w, bias = (
        _randn((m, k), torch.bfloat16),
        _randn((n, k), torch.bfloat16, k**-0.5),
        _randn((n,), torch.bfloat16),
    )
    ref = F.gelu(F.linear(x.double(), w.double(), bias.double()), approximate="tanh")
    eager = F.gelu(F.linear(x, w, bias), approximate="tanh")
    add("linear+gelu_tanh bf16", mm.linear(x, w, bias, "gelu_tanh"), eager, ref, bound=1e-2)
    return rows


# ---- summary -------------------------------------------------------------------------------------


def _summary(res: dict) -> list[tuple[str, str, str, bool | None]]:
    lines = []
    for case in res.get("evolution", []):
        default = next(r for r in case["rows"] if r["version"] == "tritonkit")
        pct = default["pct_cublas"]
        lines.append((f"matmul {case['case']}", f"{pct:.1f}% of cuBLAS", ">= 95%", pct >= 95))
    llm = res.get("llm", [])
    if llm:
        geo = math.exp(sum(math.log(r["pct_cublas"]) for r in llm) / len(llm))
        lines.append(
            (f"LLM shapes ({len(llm)}), geomean", f"{geo:.1f}% of cuBLAS", ">= 95%", geo >= 95)
        )
    targets = {"fwd": 1.15, "fwd+bwd": 1.05}
    for r in res.get("linear", []):
        t = targets[r["mode"]]
        lines.append(
            (
                f"linear gelu_tanh {r['mode']}",
                f"{r['speedup']:.2f}x eager",
                f">= {t}x",
                r["speedup"] >= t,
            )
        )
    for r in res.get("low_precision", []):
        if r["case"].startswith("fp8"):
            pct = 100 * r["ratio"]
            lines.append((r["case"], f"{pct:.1f}% of _scaled_mm", ">= 90%", pct >= 90))
        else:
            lines.append((r["case"], f"{r['ratio']:.2f}x _int_mm", ">= 4x", r["ratio"] >= 4))
    for r in res.get("accuracy", []):
        if r.get("bound") is not None:
            lines.append(
                (
                    f"rel L2 {r['case']}",
                    f"{r['ours']:.2e}",
                    f"<= {r['bound']:g}",
                    r["ours"] <= r["bound"],
                )
            )
        elif r.get("ratio_bound") is not None and r.get("ratio") is not None:
            ok = r["ratio"] <= r["ratio_bound"]
            lines.append(
                (f"rel L2 {r['case']}", f"{r['ratio']:.2f}x torch's", f"<= {r['ratio_bound']}x", ok)
            )
        elif "torch" not in r:
            lines.append((r["case"], "yes" if r["ours"] == 0 else "no", "exact", r["ours"] == 0))
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="matmul_sweep.json")
    p.add_argument("--quick", action="store_true", help="4096^3 only, 4 LLM shapes")
    p.add_argument("--cache-dir", help="autotune cache to use (default: a fresh temporary one)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("sweep_matmul: needs a CUDA GPU")
    from tritonkit import _tuning

    os.environ[_tuning.CACHE_ENV] = args.cache_dir or tempfile.mkdtemp(prefix="tritonkit-tune-")
    from tritonkit.harness.device import fingerprint

    t0 = time.perf_counter()
    res: dict = {"fingerprint": fingerprint(), "anchors_h200": ANCHORS_H200, "errors": {}}
    sections = {
        "evolution": lambda: evolution(
            (torch.bfloat16, torch.float16), (4096,) if args.quick else (4096, 8192)
        ),
        "llm": lambda: llm_shapes(args.quick),
        "linear": fused_linear,
        "low_precision": low_precision,
        "accuracy": accuracy,
    }
    for name, run in sections.items():
        print(f"\n== {name} ({time.perf_counter() - t0:.0f}s)", flush=True)
        try:
            res[name] = run()
        except Exception:  # a failing section is reported; the others still run
            res["errors"][name] = traceback.format_exc()
            print(res["errors"][name])
        torch.cuda.empty_cache()
    res["tuning"] = [
        {
            "kernel": t.kernel,
            "key": t.key,
            "seconds": t.seconds,
            "tried": [[str(c), ms] for c, ms in t.tried],
            "best": str(t.best),
        }
        for t in _tuning.STATS.log
    ]
    res["wall_s"] = time.perf_counter() - t0
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1, default=str)

    tuning_s = sum(t["seconds"] for t in res["tuning"])
    n_tunings = len(res["tuning"])
    print(f"\n== acceptance (wall {res['wall_s']:.0f}s; {n_tunings} tunings, {tuning_s:.0f}s)")
    for case, got, target, ok in _summary(res):
        mark = "PASS" if ok else ("FAIL" if ok is not None else "")
        print(f"{case:>40}  {got:>22}  {target:>10}  {mark}")
    for name in res["errors"]:
        print(f"{name:>40}  section failed (traceback in {args.out})")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
