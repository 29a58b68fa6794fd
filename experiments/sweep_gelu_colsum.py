"""Time exact GELU's 16-bit Phi and the column sum of add's broadcast gradient on the GPU.

(a) gelu    tritonkit.gelu(x) forward, x (16384, 8192) bf16 and fp16, with the old Phi
            (gelu_parts; ``PointwiseConfig(gelu_phi16=False)``) and the new one
            (gelu_q16), beside F.gelu eager, torch.compile(F.gelu) and two copies of x
            (torch.clone, tritonkit.copy). bytes = 2 * numel * elem_size (read x, write y);
            "% copy" = GB/s over torch.clone's GB/s in the same group. Accuracy of each
            against float64 gelu: max |out - gelu64(x)| on x, and ulps from gelu64 rounded to
            the dtype on x and on every finite 16-bit input (65536 bit patterns).
(b) colsum  the bias gradient of add(x, y), y (8192,) broadcast over x (16384, 8192): the
            column sum of grad, bf16 (fp32 for reference), by elementwise.bias_act_bwd with
            each ColumnSumConfig candidate in a ``PointwiseConfig`` passed to the call,
            beside grad.sum(0) eager, torch.compile(lambda g: g.sum(0)) and
            torch.clone(grad). bytes = numel * elem_size (grad read once; the fp32 partial rows,
            splits x 8192 x 4 bytes, are not counted). "% copy" = GB/s over the clone's GB/s.
            Each result is compared with the float64 sum; the first pass's registers, spills,
            shared memory and the programs per SM they allow are reported beside the programs
            launched.

Timing: tritonkit.harness.timing.time_interleaved: CUDA events, L2 flushed before every
sample, the candidates of a group interleaved round by round, median of 20-60 samples. Every
candidate is called once first (compilation) inside a try: one that fails is recorded with
its error and left out of the group. Groups run in the order gelu bf16, colsum bf16, gelu fp16,
colsum fp32; ``--budget-s`` (default 120) skips a group whose estimated cost (compile times as
observed so far) would end past it, and a candidate that would start past it. All four groups
take about two minutes on an H200, most of it compiling (each torch.compile baseline 5-20 s).

    PYTHONPATH=src python experiments/sweep_gelu_colsum.py [--budget-s 120] [--out PATH]
    PYTHONPATH=src python experiments/sweep_gelu_colsum.py --dry   # tiny shapes, CPU interpreter

Writes ``$OUT/sweep_gelu_colsum.json`` when ``$OUT`` is set (or ``--out``); the summary table
prints last. ``--dry`` runs every code path on the CPU (interpreter, aot_eager) with
meaningless times: a smoke test of the script, not a measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import time
import traceback
from collections.abc import Callable

import torch
import torch.nn.functional as F

SHAPE = (16384, 8192)
DRY_SHAPE = (64, 1536)
T0 = time.monotonic()

# First-call costs used to decide whether a group fits the budget; replaced by the observed
# means as the run goes.
COMPILE_COST_S = {"triton": 2.0, "torch.compile": 20.0}


def _elapsed() -> float:
    return time.monotonic() - T0


# ---- candidates ----------------------------------------------------------------------------


def column_sum_candidates(elem_size: int) -> list:
    """ColumnSumConfig candidates for the plain column sum, the current default first: tiles of
    (rows, columns) at some warps, in some row splits (torch.compile's own split reduction for
    this shape: 8 x 64 tiles, 4 warps, 16 splits)."""
    from tritonkit.ops._core.pointwise_config import POINTWISE, ColumnSumConfig
    from tritonkit.ops._core.reduce import PartialSumConfig

    C = ColumnSumConfig
    default = POINTWISE.column_sums(elem_size)
    cands = [
        C(block_m=8, block_n=64, warps=4, splits=16),
        C(block_m=8, block_n=64, warps=4, splits=16, evict=""),
        C(block_m=4, block_n=64, warps=4, splits=16),
        C(block_m=16, block_n=64, warps=4, splits=16),
        C(block_m=8, block_n=32, warps=4, splits=16),
        C(block_m=8, block_n=128, warps=4, splits=16),
        C(block_m=8, block_n=64, warps=8, splits=16),
        C(block_m=8, block_n=64, warps=4, splits=8),
        C(block_m=8, block_n=64, warps=4, splits=32),
        C(block_m=8, block_n=64, warps=4, splits=16, final=PartialSumConfig(64, 64, max_rows=16)),
    ]
    return [default] + [c for c in cands if c != default]


def _label(cfg) -> str:
    s = f"r{cfg.block_m} c{cfg.block_n} w{cfg.warps} s{cfg.splits}"
    if cfg.evict != "evict_first":
        s += " keep"
    f = cfg.final
    return s + f" f{f.max_rows}x{f.min_block_n}-{f.max_block_n}w{f.min_warps}-{f.max_warps}"


# ---- measurement helpers --------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _first_call(fn: Callable[[], object], device: torch.device) -> tuple[object, float]:
    t = time.perf_counter()
    out = fn()
    _sync(device)
    return out, time.perf_counter() - t


def _time(fns: dict[str, Callable[[], object]], device: torch.device) -> dict[str, dict]:
    """Median (and spread) of each candidate, interleaved; a CPU stand-in under --dry."""
    if device.type == "cuda":
        from tritonkit.harness.timing import summarize, time_interleaved

        samples = time_interleaved(fns, rep_ms=60, min_samples=20, max_samples=60)
        return {
            k: {"ms": summarize(v).median, "spread": summarize(v).spread}
            for k, v in samples.items()
        }
    out = {}
    for name, fn in fns.items():
        ts = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t) * 1e3)
        out[name] = {"ms": statistics.median(ts), "spread": 0.0}
    return out


def _gbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9


def _ordinal(t: torch.Tensor) -> torch.Tensor:
    """16-bit floats as integers in the order of their values (ulps apart = integers apart)."""
    i = t.view(torch.int16).to(torch.int32)
    return torch.where(i < 0, -(i & 0x7FFF), i)


def _gelu64(x: torch.Tensor) -> torch.Tensor:
    xd = x.double()
    return 0.5 * xd * torch.erfc(-xd / math.sqrt(2.0))


def _ulp_stats(out: torch.Tensor, ref64: torch.Tensor) -> dict:
    """Against float64 gelu: max |out - ref|, and ulps from ref rounded to out's dtype."""
    fin = torch.isfinite(ref64) & torch.isfinite(out)
    d = (_ordinal(out[fin]) - _ordinal(ref64[fin].to(out.dtype))).abs()
    return {
        "max_abs_err": (out[fin].double() - ref64[fin]).abs().max().item(),
        "max_ulp": int(d.max().item()),
        "frac_1ulp": (d == 1).double().mean().item(),
        "n_over_1ulp": int((d > 1).sum().item()),
        "nonfinite_mismatch": int((torch.isfinite(out) != torch.isfinite(ref64)).sum().item()),
    }


def _kernel_info(jit_fn, want: dict, num_warps: int) -> dict | None:
    """Registers, spills and shared memory of the compiled variant whose constexprs include
    ``want`` (None where Triton's internals differ or nothing matched, e.g. the interpreter)."""
    try:
        for cache, *_ in jit_fn.device_caches.values():
            for k in cache.values():
                k = k.result() if hasattr(k, "result") else k
                consts = {jit_fn.arg_names[i[0]]: v for i, v in k.src.constants.items()}
                if k.metadata.num_warps != num_warps:
                    continue
                if all(consts.get(n) == v for n, v in want.items()):
                    return {"regs": k.n_regs, "spills": k.n_spills, "shared": k.metadata.shared}
    except Exception:
        return None
    return None


def _programs_that_fit(info: dict | None, warps: int, device: torch.device) -> int | None:
    """Resident first-pass programs per SM by registers, threads, shared memory, blocks."""
    if info is None or device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    regs_sm = getattr(props, "regs_per_multiprocessor", 65536)
    threads_sm = getattr(props, "max_threads_per_multi_processor", 2048)
    smem_sm = getattr(props, "shared_memory_per_multiprocessor", 233472)
    per_warp = math.ceil(max(info["regs"], 1) * 32 / 256) * 256  # allocated per warp, by 256
    fit = min(regs_sm // (per_warp * warps), threads_sm // (32 * warps), 32)
    if info["shared"]:
        fit = min(fit, smem_sm // (info["shared"] + 1024))  # 1 KiB reserved per block
    return fit


# ---- the groups ------------------------------------------------------------------------------


class Run:
    def __init__(self, device: torch.device, budget_s: float, dry: bool) -> None:
        self.device, self.budget_s, self.dry = device, budget_s, dry
        self.shape = DRY_SHAPE if dry else SHAPE
        self.rows: list[dict] = []
        self.skipped: list[dict] = []
        self.first_calls: dict[str, list[float]] = {"triton": [], "torch.compile": []}

    def compiled(self, fn: Callable) -> Callable:
        torch._dynamo.reset()
        return torch.compile(fn, dynamic=False, backend="aot_eager" if self.dry else "inductor")

    def cost(self, kind: str) -> float:
        seen = self.first_calls[kind]
        return statistics.mean(seen) if seen else COMPILE_COST_S[kind]

    def fits_budget(self, group: str, n_triton: int, n_compile: int) -> bool:
        est = n_triton * self.cost("triton") + n_compile * self.cost("torch.compile") + 3.0
        if _elapsed() + est > self.budget_s:
            why = f"budget: {_elapsed():.0f} s + ~{est:.0f} s > {self.budget_s:.0f} s"
            self.skipped.append({"group": group, "why": why})
            print(f"== {group}: skipped ({why})", flush=True)
            return False
        print(f"== {group} ({_elapsed():.0f} s, ~{est:.0f} s)", flush=True)
        return True

    def warm(
        self, group: str, cands: dict[str, tuple[Callable, str]]
    ) -> tuple[dict[str, Callable], dict[str, object]]:
        """First call of each (kind: triton / torch.compile / eager); failures recorded."""
        fns, outs = {}, {}
        for name, (fn, kind) in cands.items():
            if _elapsed() > self.budget_s:
                self.skipped.append({"group": group, "candidate": name, "why": "budget"})
                continue
            try:
                out, secs = _first_call(fn, self.device)
            except Exception as exc:  # a compile error or out of resources: reported, not fatal
                err = f"{type(exc).__name__}: {exc}"[:400]
                self.rows.append({"group": group, "candidate": name, "error": err})
                print(f"   {name}: FAILED {err}", flush=True)
                continue
            if kind in self.first_calls:
                self.first_calls[kind].append(secs)
            fns[name], outs[name] = fn, out
        return fns, outs

    def gelu(self, dtype: torch.dtype) -> None:
        import tritonkit
        from tritonkit.ops import elementwise as E
        from tritonkit.ops._core.pointwise_config import POINTWISE

        group = f"gelu {str(dtype).removeprefix('torch.')}"
        if not self.fits_budget(group, 3, 1):
            return
        gen = torch.Generator(device=self.device).manual_seed(0)
        x = torch.randn(self.shape, generator=gen, device=self.device).to(dtype)
        nbytes = 2 * x.numel() * x.element_size()
        compiled = self.compiled(lambda t: F.gelu(t))

        configs = {p: dataclasses.replace(POINTWISE, gelu_phi16=p) for p in (False, True)}

        def gelu(t: torch.Tensor, phi16: bool) -> torch.Tensor:
            return E.bias_act_fwd(t, None, "gelu", config=configs[phi16])[0]

        def ours(phi16: bool) -> Callable[[], torch.Tensor]:
            return lambda: gelu(x, phi16)

        default = POINTWISE.gelu_phi16
        cands = {
            "tritonkit old Phi": (ours(False), "triton"),
            "tritonkit new Phi": (ours(True), "triton"),
            "F.gelu eager": (lambda: F.gelu(x), "eager"),
            "torch.compile F.gelu": (lambda: compiled(x), "torch.compile"),
            "copy torch.clone": (lambda: torch.clone(x), "eager"),
            "copy tritonkit.copy": (lambda: tritonkit.copy(x), "triton"),
        }
        fns, outs = self.warm(group, cands)
        ref = _gelu64(x)
        acc = {n: _ulp_stats(o, ref) for n, o in outs.items() if not n.startswith("copy")}
        del outs, ref
        # Every finite 16-bit input, through each candidate that does not recompile.
        bits = torch.arange(-(2**15), 2**15, dtype=torch.int32, device=self.device)
        allx = bits.to(torch.int16).view(dtype)
        allx = allx[torch.isfinite(allx)]
        ref_all = _gelu64(allx)
        every = {}
        for name, phi16 in (("tritonkit old Phi", False), ("tritonkit new Phi", True)):
            every[name] = _ulp_stats(gelu(allx, phi16), ref_all)
        every["F.gelu eager"] = _ulp_stats(F.gelu(allx), ref_all)
        times = _time(fns, self.device)
        copy = times.get("copy torch.clone", {}).get("ms")
        for name, t in times.items():
            gb = _gbps(nbytes, t["ms"])
            row = {"group": group, "candidate": name, "bytes": nbytes, **t, "GBps": gb}
            row["pct_copy"] = 100 * gb / _gbps(nbytes, copy) if copy else None
            if "torch.compile F.gelu" in times:
                row["x_compile"] = times["torch.compile F.gelu"]["ms"] / t["ms"]
            row["accuracy"] = acc.get(name)
            row["accuracy_all_16bit"] = every.get(name)
            row["default"] = name == ("tritonkit new Phi" if default else "tritonkit old Phi")
            self.rows.append(row)

    def colsum(self, dtype: torch.dtype) -> None:
        from tritonkit.ops import elementwise as E
        from tritonkit.ops._core.pointwise import colsum_split_kernel
        from tritonkit.ops._core.pointwise_config import POINTWISE

        elem = torch.empty((), dtype=dtype).element_size()
        group = f"colsum {str(dtype).removeprefix('torch.')}"
        cfgs = column_sum_candidates(elem)
        if not self.fits_budget(group, len(cfgs) + 1, 1):
            return
        gen = torch.Generator(device=self.device).manual_seed(0)
        g = torch.randn(self.shape, generator=gen, device=self.device).to(dtype)
        b = torch.randn(self.shape[-1], generator=gen, device=self.device).to(dtype)
        nbytes = g.numel() * g.element_size()
        compiled = self.compiled(lambda t: t.sum(0))
        default = POINTWISE.column_sums(elem)

        def ours(cfg) -> Callable[[], torch.Tensor]:
            config = dataclasses.replace(POINTWISE, column_sums_by_size=((elem, cfg),))
            return lambda: E.bias_act_bwd(g, None, b, None, "none", False, True, config=config)[1]

        cands = {
            "grad.sum(0) eager": (lambda: g.sum(0), "eager"),
            "torch.compile g.sum(0)": (lambda: compiled(g), "torch.compile"),
            "copy torch.clone": (lambda: torch.clone(g), "eager"),
        }
        by_name = {}
        for cfg in cfgs:
            by_name[_label(cfg)] = cfg
            cands[_label(cfg)] = (ours(cfg), "triton")
        fns, outs = self.warm(group, cands)
        ref = g.double().sum(0)
        errs = {n: (o.double() - ref).abs().max().item() for n, o in outs.items() if o.dim() == 1}
        del outs
        times = _time(fns, self.device)
        n_cols = g.shape[1]
        copy = times.get("copy torch.clone", {}).get("ms")
        for name, t in times.items():
            gb = _gbps(nbytes, t["ms"])
            row = {"group": group, "candidate": name, "bytes": nbytes, **t, "GBps": gb}
            if name == "copy torch.clone":
                row.update(bytes=2 * nbytes, GBps=_gbps(2 * nbytes, t["ms"]))  # read and write
            row["pct_copy"] = 100 * row["GBps"] / _gbps(2 * nbytes, copy) if copy else None
            if "torch.compile g.sum(0)" in times:
                row["x_compile"] = times["torch.compile g.sum(0)"]["ms"] / t["ms"]
            row["max_abs_err"] = errs.get(name)
            cfg = by_name.get(name)
            if cfg is not None:
                want = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "EVICT": cfg.evict}
                info = _kernel_info(colsum_split_kernel, want, cfg.warps)
                row.update(
                    config=dataclasses.asdict(cfg),
                    default=cfg == default,
                    programs=cfg.splits * math.ceil(n_cols / cfg.block_n),
                    kernel=info,
                    programs_per_sm_fit=_programs_that_fit(info, cfg.warps, self.device),
                )
            self.rows.append(row)


# ---- output ----------------------------------------------------------------------------------


def _fmt(v, spec: str, width: int) -> str:
    return f"{v:{width}{spec}}" if isinstance(v, (int, float)) else f"{'-':>{width}}"


def print_table(rows: list[dict], skipped: list[dict]) -> None:
    groups = list(dict.fromkeys(r["group"] for r in rows))
    for group in groups:
        timed = sorted(
            (r for r in rows if r["group"] == group and "ms" in r), key=lambda r: r["ms"]
        )
        print(f"\n== {group}")
        head = f"{'candidate':34} {'ms':>8} {'GB/s':>6} {'%copy':>6} {'xcomp':>6}"
        if group.startswith("gelu"):
            print(head + f" {'max|err|':>9} {'ulp>1':>6} {'1ulp%':>6} {'all16:ulp>1':>11}")
        else:
            print(head + f" {'max|err|':>9} {'regs':>5} {'fit':>6} {'progs':>6}")
        for r in timed:
            line = (
                f"{r['candidate'] + (' *' if r.get('default') else ''):34} {r['ms']:8.4f}"
                f" {r['GBps']:6.0f} {_fmt(r.get('pct_copy'), '.1f', 6)}"
                f" {_fmt(r.get('x_compile'), '.3f', 6)}"
            )
            if group.startswith("gelu"):
                a, e = r.get("accuracy") or {}, r.get("accuracy_all_16bit") or {}
                line += (
                    f" {_fmt(a.get('max_abs_err'), '.2e', 9)} {_fmt(a.get('n_over_1ulp'), 'd', 6)}"
                    f" {_fmt(a and 100 * a['frac_1ulp'], '.3f', 6)}"
                    f" {_fmt(e.get('n_over_1ulp'), 'd', 11)}"
                )
            else:
                k = r.get("kernel") or {}
                fit = r.get("programs_per_sm_fit")
                line += (
                    f" {_fmt(r.get('max_abs_err'), '.2e', 9)} {_fmt(k.get('regs'), 'd', 5)}"
                    f" {_fmt(fit, 'd', 6)} {_fmt(r.get('programs'), 'd', 6)}"
                )
            print(line)
        for r in rows:
            if r["group"] == group and "error" in r:
                print(f"{r['candidate']:34} FAILED {r['error'][:100]}")
    for s in skipped:
        print(f"skipped {s['group']} {s.get('candidate', '')}: {s['why']}")
    print("\n(* = current default; %copy: GB/s over torch.clone's in the same group; xcomp:")
    print(" torch.compile's time over this one's; fit: first-pass programs per SM that fit;")
    print(" progs: first-pass programs launched)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    out_dir = os.environ.get("OUT")
    default_out = os.path.join(out_dir, "sweep_gelu_colsum.json") if out_dir else None
    p.add_argument("--out", default=default_out, help="JSON path (default: $OUT/...)")
    p.add_argument("--budget-s", type=float, default=120.0, help="skip what would end later")
    p.add_argument("--dry", action="store_true", help="tiny shapes on the CPU interpreter")
    p.add_argument("--groups", default="gelu-bf16,colsum-bf16,gelu-fp16,colsum-fp32")
    args = p.parse_args()
    if args.dry:  # read when the kernels are decorated: before tritonkit is imported
        os.environ.setdefault("TRITON_INTERPRET", "1")
    elif not torch.cuda.is_available():
        raise SystemExit("sweep_gelu_colsum: needs a CUDA GPU (or --dry)")
    from tritonkit.harness.device import fingerprint

    run = Run(torch.device("cpu" if args.dry else "cuda"), args.budget_s, args.dry)
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    errors = {}
    for item in args.groups.split(","):
        kind, dt = item.split("-")
        try:
            (run.gelu if kind == "gelu" else run.colsum)(dtypes[dt])
        except Exception:  # a failing group is reported; the others still run
            errors[item] = traceback.format_exc()
            print(errors[item], flush=True)
        if run.device.type == "cuda":
            torch.cuda.empty_cache()
    res = {
        "fingerprint": fingerprint(),
        "shape": list(run.shape),
        "budget_s": args.budget_s,
        "wall_s": _elapsed(),
        "first_call_s": run.first_calls,
        "rows": run.rows,
        "skipped": run.skipped,
        "errors": errors,
    }
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1, default=str)
    print_table(run.rows, run.skipped)
    print(f"\nwall {_elapsed():.0f} s" + (f"; wrote {args.out}" if args.out else ""))


if __name__ == "__main__":
    main()
