"""Sweep the launch configs of the softmax, norm and cross-entropy families on the GPU.

Times each kernel at the issue's bench shapes under candidate configs (interleaved with torch
eager and torch.compile, L2 flushed), prints the best config per case with its share of the
copy bandwidth, and writes every row to JSON. The defaults live in one place per family
(module constants of ``ops/softmax.py`` and ``ops/norm.py``; cross-entropy: sweep_ce.py); this
script sets those constants per candidate, so the candidates are exactly what a config change
would give. bf16 only; about two and a half minutes on an H200.

    python experiments/sweep_norms.py --out sweep_norms.json [--no-compile] [--only softmax,norm]

Bytes are the fewest each pass must move: softmax fwd 2 tensors, bwd 3; norm fwd 2 tensors
plus the weight (and bias), bwd 3 tensors plus weight and weight gradient (and bias gradient);
cross-entropy fwd+grad reads the logits and writes their gradient (2 tensors).
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Callable

import torch
import torch.nn.functional as F

from tritonkit.harness.device import fingerprint
from tritonkit.harness.timing import summarize, time_interleaved
from tritonkit.ops import norm as N
from tritonkit.ops import softmax as S

ROW_SHAPES = [(16384, 4096), (4096, 65536)]
DTYPE = torch.bfloat16
DEVICE = "cuda"


def _gbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _time(fns: dict[str, Callable[[], object]]) -> dict[str, float]:
    samples = time_interleaved(fns, rep_ms=60, min_samples=15, max_samples=60)
    return {k: summarize(v).median for k, v in samples.items()}


def _configured(module, consts: dict, fn: Callable[[], object]) -> Callable[[], object]:
    """fn with the module's config constants set to ``consts`` for the call (read at launch)."""

    def run():
        for k, v in consts.items():
            setattr(module, k, v)
        return fn()

    return run


def _label(consts: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in consts.items())


def _grid(**axes) -> list[dict]:
    keys = list(axes)
    return [dict(zip(keys, vals)) for vals in itertools.product(*(axes[k] for k in keys))]


class Sweep:
    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.copy_gbps: dict[str, float] = {}

    def run(
        self,
        case: str,
        shape: tuple,
        nbytes: int,
        module,
        configs: list[dict],
        ours: Callable[[], object],
        baselines: dict[str, Callable[[], object]],
    ) -> None:
        defaults = {k: getattr(module, k) for k in configs[0]}
        fns = {_label(c): _configured(module, c, ours) for c in configs}
        fns.update({f"[{k}]": v for k, v in baselines.items()})
        try:
            for name, fn in list(fns.items()):  # compile; a candidate that fails is reported
                try:
                    fn()
                except Exception as exc:
                    del fns[name]
                    error = f"{type(exc).__name__}: {exc}"[:200]
                    self.rows.append(
                        {"case": case, "shape": str(shape), "config": name, "error": error}
                    )
            times = _time(fns)
        finally:
            for k, v in defaults.items():
                setattr(module, k, v)
        for name, ms in times.items():
            self.rows.append(
                {
                    "dtype": str(DTYPE),
                    "case": case,
                    "shape": str(shape),
                    "config": name,
                    "default": name == _label(defaults),
                    "ms": ms,
                    "GBps": _gbps(nbytes, ms),
                    "pct_copy": 100 * _gbps(nbytes, ms) / self.copy_gbps[str(shape)],
                }
            )

    def copy(self, shape: tuple, x: torch.Tensor) -> None:
        out = torch.empty_like(x)
        ms = _time({"copy": lambda: out.copy_(x)})["copy"]
        self.copy_gbps[str(shape)] = _gbps(2 * _nbytes(x), ms)


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False)


def sweep_softmax(sw: Sweep, shape: tuple, use_compile: bool) -> None:
    x = torch.randn(shape, device=DEVICE, dtype=DTYPE)
    dy = torch.randn_like(x)
    y = torch.softmax(x, -1)
    n = _nbytes(x)
    if shape[-1] <= S.MAX_FUSED_COLS:
        configs = _grid(ELEMS_PER_THREAD=[32, 16, 8], TILE_ELEMS=[4096, 8192])
    else:  # looped: elements per thread and programs per SM, the same pair for both passes
        # (each pass reads its own constants), so each pass's default is among the candidates
        configs = [
            {**c, "LOOP_ELEMS_PER_THREAD_BWD": c["LOOP_ELEMS_PER_THREAD_FWD"],
             "LOOP_PROGRAMS_PER_SM_BWD": c["LOOP_PROGRAMS_PER_SM_FWD"]}
            for c in _grid(
                LOOP_BLOCK_N=[16384],
                LOOP_ELEMS_PER_THREAD_FWD=[16, 32],
                LOOP_PROGRAMS_PER_SM_FWD=[2, 4],
                LOOP_PREFETCH_FWD=[False],
                LOOP_PREFETCH_BWD=[True],
            )
        ]  # fmt: skip
    fwd_base = {"torch": lambda: torch.softmax(x, -1)}
    if use_compile:
        compiled = _compiled(lambda t: torch.softmax(t, -1))
        fwd_base["torch.compile"] = lambda: compiled(x)
    sw.run("softmax fwd", shape, 2 * n, S, configs, lambda: S.softmax_fwd(x, 1, False), fwd_base)
    bwd_base = {"torch": lambda: torch._softmax_backward_data(dy, y, -1, DTYPE)}
    sw.run(
        "softmax bwd", shape, 3 * n, S, configs, lambda: S.softmax_bwd(dy, y, 1, False), bwd_base
    )


def sweep_norm(sw: Sweep, shape: tuple, use_compile: bool, bwd: bool = True) -> None:
    if shape[-1] > N.MAX_FUSED_COLS:  # looped forward, two-kernel backward
        # Elements per thread: LayerNorm's looped chunks take ELEMS_PER_THREAD, RMSNorm's
        # LOOP_ELEMS_PER_THREAD_RMS; both set alike here.
        # Each knob set alike for both norms (ops/norm.py: the plain name is LayerNorm's).
        fwd_configs = [
            {**c, "LOOP_ELEMS_PER_THREAD_RMS": c["ELEMS_PER_THREAD"],
             "LOOP_PROGRAMS_PER_SM_RMS": c["LOOP_PROGRAMS_PER_SM"],
             "LOOP_PREFETCH_RMS": c["LOOP_PREFETCH"], "LOOP_STATS_LN": c["LOOP_STATS_RMS"],
             "LOOP_ROWS_LN": c["LOOP_ROWS_RMS"]}
            for c in _grid(
                ELEMS_PER_THREAD=[16, 32],
                LOOP_PROGRAMS_PER_SM=[2, 4],
                LOOP_PREFETCH=[True, False],
                LOOP_STATS_RMS=[1, 0],
                LOOP_ROWS_RMS=[1, 2],
                LOOP_EVICT=[True, False],
            )
        ]  # fmt: skip
    else:
        # Programs per SM 0: one row tile per program (Liger's launch), no prefetch.
        fwd_configs = [
            {"FUSED_ELEMS_PER_THREAD": e, "FWD_PROGRAMS_PER_SM": p, "FWD_PROGRAMS_PER_SM_RMS": p,
             "FWD_PREFETCH": p > 0}
            for e, p in [(16, 0), (32, 0), (8, 0), (32, 8), (16, 8)]
        ]  # fmt: skip
    # The backward's register use (ptxas, sm_90a, 4096 columns: 164-217 at 8 warps, 91-126 at
    # 16, 48-64 at 32) leaves one program of 8-32 warps per SM: prefetching the next row
    # tile is what keeps bytes in flight. Both paths run this kernel (wide rows per column block).
    # Tiles of two rows (BWD_TILE_ELEMS 8192) double the bytes each load brings; their partial
    # sums reduced per tile (BWD_REDUCE_ROWS 2) keep one row of accumulators.
    bwd_configs = _grid(
        BWD_ELEMS_PER_THREAD=[16] if shape[-1] <= 4096 else [16, 8],
        BWD_PROGRAMS_PER_SM=[1, 2],
        BWD_PREFETCH=[True],
        BWD_TILE_ELEMS=[8192, 4096] if shape[-1] <= 4096 else [8192],
        BWD_REDUCE_ROWS=[0, 2] if shape[-1] <= 4096 else [0],
    )
    for c in bwd_configs:  # RMSNorm and LayerNorm read their own constants; sweep both alike
        c["BWD_PROGRAMS_PER_SM_LN"] = c["BWD_PROGRAMS_PER_SM"]
        c["BWD_REDUCE_ROWS_LN"] = c["BWD_REDUCE_ROWS"]
    if shape[-1] > N.MAX_FUSED_COLS:
        bwd_configs = [{**c, "WIDE_BWD_PROGRAMS_PER_SM": c.pop("BWD_PROGRAMS_PER_SM")}
                       for c in bwd_configs]  # fmt: skip
    for rms in (True, False):
        _sweep_one_norm(sw, shape, rms, fwd_configs, bwd_configs if bwd else [], use_compile)
        torch.cuda.empty_cache()


def _liger_norm(rms: bool):
    """Liger-Kernel's RMSNorm / LayerNorm as fn(x, w, b, eps), or None when not installed."""
    from tritonkit.harness.spec import Unavailable
    from tritonkit.specs import norm as specs

    try:
        if rms:
            run = specs._liger_rms_norm()
            return lambda x, w, b, eps: run(x, w, eps)
        run = specs._liger_layer_norm()
        return lambda x, w, b, eps: run(x, w, b, eps)
    except Unavailable:
        return None


def _sweep_one_norm(sw, shape, rms, fwd_configs, bwd_configs, use_compile) -> None:
    x = torch.randn(shape, device=DEVICE, dtype=DTYPE)
    dy = torch.randn_like(x)
    c = shape[-1]
    w = torch.randn(c, device=DEVICE, dtype=DTYPE)
    b = None if rms else torch.randn(c, device=DEVICE, dtype=DTYPE)
    n, nw = _nbytes(x), _nbytes(w)
    eps = 1e-6
    name = "rms_norm" if rms else "layer_norm"
    _, _, mean, rstd = N.norm_fwd(x, None, w, b, 1, eps, rms)
    if rms:

        def ref(t):
            return F.rms_norm(t, (c,), w, eps)

        xl, wl = x.detach().requires_grad_(), w.detach().requires_grad_()
        out = F.rms_norm(xl, (c,), wl, eps)
        bwd_base = {"torch": lambda: torch.autograd.grad(out, (xl, wl), dy, retain_graph=True)}
    else:

        def ref(t):
            return F.layer_norm(t, (c,), w, b, eps)

        _, tm, tr = torch.ops.aten.native_layer_norm(x, [c], w, b, eps)
        bwd_base = {
            "torch": lambda: torch.ops.aten.native_layer_norm_backward(
                dy, x, [c], tm, tr, w, b, [True, True, True]
            )
        }
    base = {"torch": lambda: ref(x)}
    if use_compile:
        compiled = _compiled(ref)
        base["torch.compile"] = lambda: compiled(x)
    liger = _liger_norm(rms)
    if liger is not None:
        base["liger"] = lambda: liger(x, w, b, eps)
        xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
        bg = None if rms else b.detach().requires_grad_()
        lo = liger(xg, wg, bg, eps)
        leaves = (xg, wg) if rms else (xg, wg, bg)
        bwd_base["liger"] = lambda: torch.autograd.grad(lo, leaves, dy, retain_graph=True)
    fwd_bytes = 2 * n + nw * (1 if rms else 2)
    bwd_bytes = 3 * n + nw * (2 if rms else 3)
    sw.run(
        f"{name} fwd",
        shape,
        fwd_bytes,
        N,
        fwd_configs,
        lambda: N.norm_fwd(x, None, w, b, 1, eps, rms),
        base,
    )
    if not bwd_configs:
        return
    sw.run(
        f"{name} bwd",
        shape,
        bwd_bytes,
        N,
        bwd_configs,
        lambda: N.norm_bwd(dy, None, x, w, mean, rstd, 1, rms, True, not rms, w.dtype),
        bwd_base,
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="sweep_norms.json")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines")
    p.add_argument("--only", default="softmax,norm", help="comma-separated: softmax,norm")
    p.add_argument("--no-norm-bwd", action="store_true", help="time the norms' forward only")
    p.add_argument("--shapes", help="row shapes as RxC,... (default: 16384x4096,4096x65536)")
    args = p.parse_args()
    shapes = ROW_SHAPES
    if args.shapes:
        shapes = [tuple(map(int, t.split("x"))) for t in args.shapes.split(",")]
    only = set(args.only.split(","))
    use_compile = not args.no_compile
    sw = Sweep()
    for shape in shapes:
        sw.copy(shape, torch.randn(shape, device=DEVICE, dtype=DTYPE))
        if "softmax" in only:
            sweep_softmax(sw, shape, use_compile)
        if "norm" in only:
            sweep_norm(sw, shape, use_compile, bwd=not args.no_norm_bwd)
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump({"fingerprint": fingerprint(), "copy_GBps": sw.copy_gbps, "rows": sw.rows}, f)
    best: dict[tuple[str, str], dict] = {}
    defaults: dict[tuple[str, str], dict] = {}
    for r in sw.rows:
        if "ms" not in r:
            continue
        key = (r["case"], r["shape"])
        if r["default"]:
            defaults[key] = r
        if not r["config"].startswith("[") and (key not in best or r["ms"] < best[key]["ms"]):
            best[key] = r
    print("best config per case (all rows in the JSON); % of copy bandwidth; vs default; peers:")
    for key, r in best.items():
        peers = [
            f"{q['config']} {q['GBps']:.0f}"
            for q in sw.rows
            if "ms" in q and (q["case"], q["shape"]) == key and q["config"].startswith("[")
        ]
        dflt = defaults.get(key)
        print(
            f"{key[0]:>22} {key[1]:>15} {r['GBps']:7.0f} GB/s {r['pct_copy']:5.1f}%  "
            f"(default {dflt['GBps'] if dflt else float('nan'):.0f})  {r['config']}  "
            + ", ".join(peers)
        )


if __name__ == "__main__":
    main()
