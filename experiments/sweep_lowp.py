"""Sweep the low-precision GEMMs on the GPU: FP8 launch configs and promotion, INT8 layouts.

1. INT8 8192^3 with b row-major (``a @ b`` as a user writes it; the issue's anchor is
   ``torch._int_mm`` there): tritonkit's default (K-major copy of b, then the TMA path; the
   copy is in the time), the same with b read in place (pointer loop), the copy alone, and
   tritonkit with b K-major; ``torch._int_mm`` with b row-major and K-major. Exactness against
   ``torch._int_mm``.
2. FP8 e4m3 8192^3, per-tensor scales, bf16 output, b column-major (``torch._scaled_mm``'s
   layout). Stage 1: tiles 128x256x128, 128x128x128, 256x128x128, 128x256x64, 8 warps,
   3/4/5 stages (a half-tile epilogue where the output tile would not fit otherwise; configs
   over the shared memory are skipped), persistent TMA, the current promotion (fp32 once
   per BLOCK_K). Stage 2, each tile at its best stage count: the other policies of
   ``tl.dot``'s ``max_num_imprecise_acc`` (never promote: Triton's sm_90 default; promote
   every 64 or 32 K elements) and the promotion by hand every 8, 16 or 32 K blocks (128x128
   tiles; ``MatmulConfig.promote_k`` above BLOCK_K), one program per tile instead of
   persistent (TMA), warp specialization for the two best, the pointer path (no TMA) for the
   best. Each stage is
   timed in one interleaved group with ``torch._scaled_mm`` (and its ``use_fast_accum=True``;
   stage 1 also with tritonkit's current default, autotuned), so each ratio is two figures
   from the same run.
3. INT8 crossover of the K-major copy: squares 512..4096, copy forced vs b read in place, to
   check ``GemmOptions.kmajor_copy_min_mnk`` (ops/matmul/configs.py).

Errors: relative L2 against a float64 product of the same fp8 inputs and scales, ``rel L2``;
and ``acc L2``, the same against the float64 product rounded to bf16, which removes the
output's own rounding and leaves the accumulation error the promotion policy controls. The
acceptance: FP8 >= 0.90x ``torch._scaled_mm`` with rel L2 <= 1.5x its own; INT8 >= 4x
``torch._int_mm`` with b row-major.

Timing (tritonkit.harness.timing): CUDA events, warm-up, L2 flushed before every sample,
candidates interleaved, the median of >= 20 samples. A GEMM does 2*M*N*K FLOPs (INT8:
operations); the copy moves 2*K*N bytes. The autotune cache is a fresh temporary directory
unless ``--cache-dir`` is given, so tritonkit's default path tunes as on a new machine. About
two to three minutes on an H200 (compilation dominates); ``--budget-s`` skips what would run
past it. Writes ``$OUT/sweep_lowp.json`` when ``$OUT`` is set (or ``--out``); the summary
table is printed last.

    PYTHONPATH=src python experiments/sweep_lowp.py [--out sweep_lowp.json] [--budget-s 150]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import tempfile
import time
import traceback
from collections.abc import Callable
from functools import partial

import torch

DEVICE = "cuda"
SIZE = 8192
TILES = [(128, 256, 128), (128, 128, 128), (256, 128, 128), (128, 256, 64)]
STAGES = (3, 4, 5)
WARPS = 8
GROUP_M = 8
CROSSOVER_SIZES = (512, 1024, 2048, 4096)
T0 = time.perf_counter()


def _elapsed() -> float:
    return time.perf_counter() - T0


def _tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


def _time(fns: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Median ms of each candidate, interleaved; rep_ms small so that min_samples (20) rules."""
    from tritonkit.harness.timing import summarize, time_interleaved

    samples = time_interleaved(fns, rep_ms=20, min_samples=20, max_samples=40)
    return {k: summarize(v).median for k, v in samples.items()}


def _first_call(fn: Callable[[], object]) -> tuple[object, float]:
    """The first call's output and seconds (compilation and autotuning included)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def _label(cfg) -> str:
    from tritonkit.ops import matmul as mm

    promote = {mm.PROMOTE_PER_BLOCK: "blockK", mm.NEVER_PROMOTE: "never"}.get(
        cfg.promote_k, str(cfg.promote_k)
    )
    extra = ("+sub" if cfg.subtile else "") + ("+ws" if cfg.warp_specialize else "")
    sched = ("pers" if cfg.persistent else "tile") + ("" if cfg.tma else " ptr")
    return (
        f"{cfg.BLOCK_M}x{cfg.BLOCK_N}x{cfg.BLOCK_K} s{cfg.num_stages} {sched}{extra} "
        f"promote={promote}"
    )


# ---- 1. INT8, b row-major ------------------------------------------------------------------------


def int8_layouts() -> dict:
    from tritonkit.ops import matmul as mm
    from tritonkit.ops.memory import transpose_fwd

    n = SIZE
    flops = 2 * n**3
    a = torch.randint(-128, 128, (n, n), device=DEVICE, dtype=torch.int8)
    b_row = torch.randint(-128, 128, (n, n), device=DEVICE, dtype=torch.int8)
    b_col = b_row.t().contiguous().t()  # the same values, K-major

    def ours(b, kmajor=None):
        return mm.scaled_matmul_fwd(a, b, None, None, None, torch.int32, kmajor=kmajor)

    fns = {
        "ours b row-major (default)": partial(ours, b_row),
        "ours b row-major, in place": partial(ours, b_row, False),
        "ours b K-major": partial(ours, b_col),
        "_int_mm b row-major": partial(torch._int_mm, a, b_row),
        "_int_mm b K-major": partial(torch._int_mm, a, b_col),
        "copy only (transpose of b)": partial(transpose_fwd, b_row),
    }
    first = {}
    for name, fn in fns.items():
        _, first[name] = _first_call(fn)
    exact = torch._int_mm(a, b_col)
    equal = {
        "row-major default": torch.equal(ours(b_row), exact),
        "row-major in place": torch.equal(ours(b_row, False), exact),
        "K-major": torch.equal(ours(b_col), exact),
    }
    ms = _time(fns)
    anchor, fast = ms["_int_mm b row-major"], ms["_int_mm b K-major"]
    rows = []
    for name, t in ms.items():
        copy = name.startswith("copy")
        rows.append(
            {
                "case": f"int8 {n}^3 {name}",
                "ms": t,
                "TOPs": None if copy else _tflops(flops, t),
                "GBps": 2 * n * n / (t * 1e-3) / 1e9 if copy else None,
                "x_int_mm_row_major": None if copy else anchor / t,
                "x_int_mm_k_major": None if copy else fast / t,
                "first_call_s": first[name],
            }
        )
    return {
        "route_row_major": mm.kmajor_copies(a, b_row),
        "route_k_major": mm.kmajor_copies(a, b_col),
        "copy_min_mnk": mm.GEMM_OPTIONS.kmajor_copy_min_mnk,
        "equal_to_int_mm": equal,
        "rows": rows,
    }


# ---- 2. FP8 configs and promotion ----------------------------------------------------------------


class _Fp8Case:
    """Inputs, the float64 reference and the torch baselines of the FP8 8192^3 case."""

    def __init__(self) -> None:
        n = SIZE
        gen = torch.Generator(device=DEVICE).manual_seed(0)
        self.a = torch.randn((n, n), device=DEVICE, generator=gen).to(torch.float8_e4m3fn)
        # column-major b, as torch._scaled_mm requires; and the same values row-major
        self.b = torch.randn((n, n), device=DEVICE, generator=gen).to(torch.float8_e4m3fn).t()
        self.b_row = self.b.contiguous()
        self.sa = torch.tensor(1.0 / math.sqrt(n), device=DEVICE)  # unit-variance outputs
        self.sb = torch.tensor(1.0, device=DEVICE)
        ref = self.a.double() @ self.b.double()
        ref *= self.sa.double() * self.sb.double()
        self.ref = ref
        self.ref_norm = ref.norm().item()
        self.ref_bf16 = ref.to(torch.bfloat16)
        self.flops = 2 * n**3

    def torch_fns(self) -> dict[str, Callable[[], object]]:
        mm = partial(
            torch._scaled_mm, self.a, self.b, scale_a=self.sa, scale_b=self.sb,
            out_dtype=torch.bfloat16,
        )  # fmt: skip
        return {
            "torch._scaled_mm": mm,
            "torch._scaled_mm fast_accum": partial(mm, use_fast_accum=True),
        }

    def errors(self, out: torch.Tensor) -> dict[str, float]:
        d = out.double()
        rel = (d - self.ref).norm().item() / self.ref_norm
        acc = (d - self.ref_bf16.double()).norm().item() / self.ref_norm
        return {"rel_l2": rel, "acc_l2": acc}


def _fits(cfg) -> bool:
    from tritonkit import _tuning

    return _tuning.fits_shared_memory(cfg.smem_bytes(1, 1, 2))


def _flat(cfg) -> dict:
    """A config's fields with its schedule's flat (``MatmulConfig.of`` builds it back)."""
    fields = dataclasses.asdict(cfg)
    return {**fields, **fields.pop("schedule")}


def _stage1_configs(tiles=TILES, stage_counts=STAGES) -> list:
    """Every tile x stage count that fits, persistent TMA, fp32 promotion once per BLOCK_K."""
    from tritonkit.ops.matmul import MatmulConfig

    out = []
    for (bm, bn, bk), stages in ((t, s) for t in tiles for s in stage_counts):
        cfg = MatmulConfig.of(
            bm, bn, bk, GROUP_M=GROUP_M, num_warps=WARPS, num_stages=stages,
            persistent=True, tma=True,
        )  # fmt: skip
        if not _fits(cfg):
            cfg = cfg.replace(subtile=True)  # half the output staging tile
        if _fits(cfg):
            out.append(cfg)
    return out


def _stage2_configs(ranked: list) -> list:
    """Variations of each tile's best stage count, most telling first (the budget may cut the
    tail): no promotion; promotion every 64 / 32 K elements, or by hand every 8 / 16 / 32 K
    blocks (128 x 128 tiles); one program per tile (TMA); warp specialization for the two
    best; the pointer path (no TMA) for the best."""
    from tritonkit.ops import matmul as mm

    per_tile: dict[tuple[int, int, int], object] = {}
    for cfg in ranked:
        per_tile.setdefault((cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K), cfg)
    best = list(per_tile.values())
    out = [c.replace(promote_k=mm.NEVER_PROMOTE) for c in best]
    out += [c.replace(promote_k=p) for p in (128, 64, 32) for c in best if p < c.BLOCK_K]
    # promotion by hand every 8-32 K blocks: two fp32 tiles per thread, which fit at 128 x 128
    # with 8 warps only (larger tiles spill)
    out += [
        c.replace(promote_k=blocks * c.BLOCK_K)
        for blocks in (8, 16, 32)
        for c in best
        if c.BLOCK_M * c.BLOCK_N <= 128 * 128 and c.num_warps == 8
    ]
    out += [c.replace(persistent=False) for c in best]
    for cfg in best[:2]:
        ws = cfg.replace(warp_specialize=True, subtile=False)
        out.append(ws if _fits(ws) else ws.replace(subtile=True))
    out += [c.replace(tma=False, subtile=False) for c in best[:1]]
    return out


def _fp8_group(case: _Fp8Case, configs: list, budget_s: float, include_default: bool) -> list:
    """Compile (first call) each config within the budget, check its error, time the group."""
    from tritonkit.ops import matmul as mm

    def ours(cfg):
        return mm.scaled_matmul_fwd(
            case.a, case.b, case.sa, case.sb, None, torch.bfloat16, config=cfg
        )

    fns = dict(case.torch_fns())
    info: dict[str, dict] = {}
    for name, fn in fns.items():
        out, _ = _first_call(fn)
        info[name] = {"config": None, **case.errors(out)}
        del out
    if include_default:
        # autotunes (fresh cache): the current default's choice; then with b row-major, where
        # the default copies b K-major first (same tuned kernel)
        for name, b in (
            ("tritonkit default (autotuned)", case.b),
            ("tritonkit default, b row-major", case.b_row),
        ):
            fn = partial(mm.scaled_matmul, case.a, b, case.sa, case.sb, torch.bfloat16)
            out, secs = _first_call(fn)
            fns[name] = fn
            info[name] = {"config": None, "first_call_s": secs, **case.errors(out)}
            del out
    rows = []
    for cfg in configs:
        name = _label(cfg)
        if _elapsed() > budget_s:
            rows.append({"case": name, "config": _flat(cfg), "skipped": "budget"})
            continue
        try:
            out, secs = _first_call(partial(ours, cfg))
        except Exception as exc:  # out of resources, a compiler error: reported, not fatal
            why = f"{type(exc).__name__}: {exc}"[:300]
            rows.append({"case": name, "config": _flat(cfg), "skipped": why})
            continue
        fns[name] = partial(ours, cfg)
        info[name] = {"config": _flat(cfg), "first_call_s": secs, **case.errors(out)}
        del out
    ms = _time(fns)
    base = ms["torch._scaled_mm"]
    torch_rel = info["torch._scaled_mm"]["rel_l2"]
    for name, t in ms.items():
        row = {"case": name, "ms": t, "TFLOPs": _tflops(case.flops, t), "x_scaled_mm": base / t}
        row.update(info[name])
        row["err_vs_torch"] = row["rel_l2"] / torch_rel if torch_rel else None
        rows.append(row)
    return rows


def fp8_configs(budget_s: float, tiles=TILES, stage_counts=STAGES) -> dict:
    case = _Fp8Case()
    configs = _stage1_configs(tiles, stage_counts)
    stage1 = _fp8_group(case, configs, budget_s, include_default=True)
    from tritonkit.ops.matmul import MatmulConfig

    ranked = sorted((r for r in stage1 if r.get("config") and "ms" in r), key=lambda r: r["ms"])
    best = [MatmulConfig.of(**r["config"]) for r in ranked]
    # the stage-1 winner again, so that stage 2's ratios have it in the same run
    stage2 = _fp8_group(case, best[:1] + _stage2_configs(best), budget_s, include_default=False)
    return {"stage1": stage1, "stage2": stage2}


# ---- 3. INT8 crossover of the K-major copy -------------------------------------------------------


def int8_crossover(budget_s: float) -> list[dict]:
    from tritonkit.ops import matmul as mm

    rows = []
    for n in CROSSOVER_SIZES:
        if _elapsed() > budget_s:
            rows.append({"size": n, "skipped": "budget"})
            continue
        a = torch.randint(-128, 128, (n, n), device=DEVICE, dtype=torch.int8)
        b = torch.randint(-128, 128, (n, n), device=DEVICE, dtype=torch.int8)

        def ours(kmajor, a=a, b=b):
            return mm.scaled_matmul_fwd(a, b, None, None, None, torch.int32, kmajor=kmajor)

        fns = {
            "copy": partial(ours, True),
            "in place": partial(ours, False),
            "default": partial(ours, None),
            "_int_mm": partial(torch._int_mm, a, b),
        }
        for fn in fns.values():
            _first_call(fn)
        ms = _time(fns)
        rows.append(
            {
                "size": n,
                "mnk": n**3,
                "default_copies": mm.kmajor_copies(a, b)[1],
                **{f"{k}_ms": v for k, v in ms.items()},
                "copy_speedup": ms["in place"] / ms["copy"],
            }
        )
    return rows


# ---- summary -------------------------------------------------------------------------------------


def _fp8_rows(res: dict) -> list[dict]:
    rows = []
    for stage in ("stage1", "stage2"):
        rows += [dict(r, stage=stage) for r in res.get("fp8", {}).get(stage, []) if "ms" in r]
    return rows


def _decisions(res: dict) -> list[str]:
    lines = []
    rows = _fp8_rows(res)
    if rows:
        ours = [r for r in rows if r.get("config")]
        accurate = [r for r in ours if r["err_vs_torch"] is not None and r["err_vs_torch"] <= 1.5]
        named = {r["case"]: r for r in rows if not r.get("config")}
        default = named.get("tritonkit default (autotuned)")
        if default:
            lines.append(
                f"FP8 current default: {default['x_scaled_mm']:.3f}x _scaled_mm, rel L2 "
                f"{default['err_vs_torch']:.2f}x torch's"
            )
        row_major = named.get("tritonkit default, b row-major")
        if row_major:
            lines.append(
                f"FP8 b row-major (K-major copy included): {row_major['x_scaled_mm']:.3f}x "
                "_scaled_mm with b column-major"
            )
        if accurate:
            top = max(accurate, key=lambda r: r["x_scaled_mm"])
            verdict = "meets" if top["x_scaled_mm"] >= 0.90 else "misses"
            lines.append(
                f"FP8 fastest with rel L2 <= 1.5x torch's: {top['case']} ({top['stage']}): "
                f"{top['TFLOPs']:.0f} TFLOP/s = {top['x_scaled_mm']:.3f}x _scaled_mm, "
                f"{verdict} >= 0.90x; error {top['err_vs_torch']:.2f}x torch's"
            )
            if default and top["x_scaled_mm"] > 1.02 * default["x_scaled_mm"]:
                lines.append(
                    "  -> make it FP8's default: first candidate of _TILES['fp8'] in "
                    "ops/matmul.py, with its promote_k"
                )
            else:
                lines.append("  -> keep the current default")
        fastest = max(ours, key=lambda r: r["x_scaled_mm"], default=None)
        if fastest and fastest not in accurate:
            lines.append(
                f"FP8 fastest at any accuracy: {fastest['case']}: {fastest['x_scaled_mm']:.3f}x, "
                f"error {fastest['err_vs_torch']:.2f}x torch's (fails the 1.5x bound)"
            )
    int8 = res.get("int8", {})
    by_case = {r["case"].split("^3 ", 1)[1]: r for r in int8.get("rows", [])}
    if "ours b row-major (default)" in by_case:
        r = by_case["ours b row-major (default)"]
        verdict = "meets" if r["x_int_mm_row_major"] >= 4 else "misses"
        lines.append(
            f"INT8 b row-major: {r['TOPs']:.0f} TOP/s (copy included, route "
            f"{int8.get('route_row_major')}) = {r['x_int_mm_row_major']:.2f}x _int_mm row-major, "
            f"{verdict} >= 4x"
        )
    cross = [r for r in res.get("crossover", []) if "copy_ms" in r]
    if cross:
        wins = [r["size"] for r in cross if r["copy_speedup"] > 1.0]
        current = round(int8.get("copy_min_mnk", 1024**3) ** (1 / 3))
        first = min(wins) if wins else None
        lines.append(
            f"INT8 K-major copy beats in place from {first}^3 on (current threshold {current}^3); "
            + ", ".join(f"{r['size']}: {r['copy_speedup']:.2f}x" for r in cross)
        )
    return lines


def _print_table(res: dict) -> None:
    print(f"\n== summary (wall {res['wall_s']:.0f}s)")
    int8 = res.get("int8", {})
    if int8:
        print(
            f"{'INT8 ' + str(SIZE) + '^3':<44} {'ms':>8} {'TOP/s':>9} {'x _int_mm rm':>12} "
            f"{'x _int_mm K':>11}"
        )
        for r in int8["rows"]:
            rate = f"{r['TOPs']:9.0f}" if r["TOPs"] else f"{r['GBps']:4.0f} GB/s"
            ratio = (
                f"{r['x_int_mm_row_major']:12.2f} {r['x_int_mm_k_major']:11.2f}"
                if r["x_int_mm_row_major"]
                else ""
            )
            print(f"{r['case'].split('^3 ', 1)[1]:<44} {r['ms']:8.3f} {rate:>9} {ratio}")
        print(f"  equal to _int_mm: {int8['equal_to_int_mm']}")
    rows = _fp8_rows(res)
    if rows:
        print(
            f"\n{'FP8 e4m3 ' + str(SIZE) + '^3, bf16 out':<44} {'stage':>6} {'ms':>7} "
            f"{'TFLOP/s':>8} {'x scaled':>8} {'rel L2':>9} {'acc L2':>9} {'err x':>6}"
        )
        for r in sorted(rows, key=lambda r: r["ms"]):
            err = f"{r['err_vs_torch']:6.2f}" if r["err_vs_torch"] is not None else "     —"
            print(
                f"{r['case']:<44} {r['stage']:>6} {r['ms']:7.3f} {r['TFLOPs']:8.0f} "
                f"{r['x_scaled_mm']:8.3f} {r['rel_l2']:9.2e} {r['acc_l2']:9.2e} {err}"
            )
        skipped = [r for s in ("stage1", "stage2") for r in res["fp8"].get(s, []) if "skipped" in r]
        for r in skipped:
            print(f"  skipped {r['case']}: {r['skipped'][:120]}")
    cross = res.get("crossover", [])
    if cross:
        print(f"\n{'INT8 crossover (b row-major)':<30} {'copy':>8} {'in place':>9} {'default':>8} "
              f"{'_int_mm':>8}  ms")  # fmt: skip
        for r in cross:
            if "copy_ms" not in r:
                print(f"{r['size']:>6}^3  skipped: {r['skipped']}")
                continue
            print(
                f"{str(r['size']) + '^3':<30} {r['copy_ms']:8.3f} {r['in place_ms']:9.3f} "
                f"{r['default_ms']:8.3f} {r['_int_mm_ms']:8.3f}"
            )
    print("\n== decisions")
    for line in _decisions(res):
        print(line)
    for name in res["errors"]:
        print(f"section {name} failed (traceback in the JSON)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    out_dir = os.environ.get("OUT")
    p.add_argument("--out", default=os.path.join(out_dir, "sweep_lowp.json") if out_dir else None)
    p.add_argument("--budget-s", type=float, default=150.0, help="skip what would start later")
    p.add_argument("--cache-dir", help="autotune cache to use (default: a fresh temporary one)")
    p.add_argument("--sections", default="int8,fp8,crossover", help="comma-separated subset")
    p.add_argument(
        "--tiles",
        help="FP8 stage-1 tiles as MxNxK,... (default: "
        + ",".join("x".join(map(str, t)) for t in TILES)
        + "); e.g. BLOCK_K = 256 promotes every 256 K elements",
    )
    p.add_argument("--stages", help="FP8 stage-1 stage counts, e.g. 2,3 (default: 3,4,5)")
    args = p.parse_args()
    tiles = [tuple(map(int, t.split("x"))) for t in args.tiles.split(",")] if args.tiles else TILES
    stage_counts = tuple(map(int, args.stages.split(","))) if args.stages else STAGES
    if not torch.cuda.is_available():
        raise SystemExit("sweep_lowp: needs a CUDA GPU")
    from tritonkit import _tuning

    os.environ[_tuning.CACHE_ENV] = args.cache_dir or tempfile.mkdtemp(prefix="tritonkit-tune-")
    from tritonkit.harness.device import fingerprint

    res: dict = {"fingerprint": fingerprint(), "errors": {}}
    sections = {
        "int8": int8_layouts,
        "fp8": lambda: fp8_configs(args.budget_s, tiles, stage_counts),
        "crossover": lambda: int8_crossover(args.budget_s),
    }
    wanted = set(args.sections.split(","))
    for name, run in sections.items():
        if name not in wanted:
            continue
        print(f"== {name} ({_elapsed():.0f}s)", flush=True)
        try:
            res[name] = run()
        except Exception:  # a failing section is reported; the others still run
            res["errors"][name] = traceback.format_exc()
            print(res["errors"][name], flush=True)
        torch.cuda.empty_cache()
    res["tuning"] = [
        {"kernel": t.kernel, "key": t.key, "seconds": t.seconds, "best": str(t.best)}
        for t in _tuning.STATS.log
    ]
    res["wall_s"] = _elapsed()
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1, default=str)
    _print_table(res)
    if args.out:
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
