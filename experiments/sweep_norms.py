"""Sweep the launch configs of the softmax, norm and cross-entropy families on the GPU.

Times each kernel at the issue's bench shapes under candidate configs (interleaved with torch
eager and torch.compile, L2 flushed), prints the best config per case with its share of the
copy bandwidth, and writes every row to JSON. The defaults live in one place per family
(``SoftmaxConfig`` in ``ops/softmax/config.py``, ``NormConfig`` in ``ops/norm/config.py``, each
a tree of per-path configs whose fields are named here by path, "forward.looped.evict";
cross-entropy: sweep_ce.py); each candidate is the default with some fields replaced, passed
to the call, so the candidates are exactly what a change of the default would give. bf16
only; about two and a half minutes on an H200.

    python experiments/sweep_norms.py --out sweep_norms.json [--no-compile] [--only softmax,norm]

Bytes are the fewest each pass must move: softmax fwd 2 tensors, bwd 3; norm fwd 2 tensors
plus the weight (and bias), bwd 3 tensors plus weight and weight gradient (and bias gradient);
cross-entropy fwd+grad reads the logits and writes their gradient (2 tensors).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
from collections.abc import Callable

import torch
import torch.nn.functional as F

from tritonkit.harness.device import fingerprint
from tritonkit.harness.timing import summarize, time_interleaved
from tritonkit.ops.norm import NORM
from tritonkit.ops.norm import plan as norm_plan
from tritonkit.ops.softmax import SOFTMAX, SoftmaxConfig
from tritonkit.ops.softmax import plan as softmax_plan

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


def _replace(config, fields: dict):
    """``config`` with ``fields`` replaced, each named by its path through the nested configs
    ("forward.looped.evict", "looped.prefetch_fwd")."""
    top, nested = {}, {}
    for name, value in fields.items():
        head, _, rest = name.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            top[head] = value
    for head, sub in nested.items():
        top[head] = _replace(getattr(config, head), sub)
    return dataclasses.replace(config, **top)


def _get(config, name: str):
    for part in name.split("."):
        config = getattr(config, part)
    return config


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
        default,
        configs: list[dict],
        ours: Callable[[object], Callable[[], object]],
        baselines: dict[str, Callable[[], object]],
    ) -> None:
        """Time ``ours(config)`` for each candidate: ``default`` with the fields of one of
        ``configs`` replaced."""
        defaults = {k: _get(default, k) for k in configs[0]}
        fns = {_label(c): ours(_replace(default, c)) for c in configs}
        fns.update({f"[{k}]": v for k, v in baselines.items()})
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
    if shape[-1] <= SOFTMAX.max_fused_cols:  # the configs' own tuning spaces
        configs = [
            {"elems_per_thread": c.elems_per_thread, "tile_elems": c.tile_elems}
            for c in SoftmaxConfig.space()
        ]
    else:  # looped: elements per thread and programs per SM, the same pair for both passes
        # (each pass reads its own fields), so each pass's default is among the candidates
        configs = [
            {"looped.elems_per_thread_fwd": e, "looped.programs_per_sm_fwd": p,
             "looped.elems_per_thread_bwd": e, "looped.programs_per_sm_bwd": p}
            for e, p in itertools.product([16, 32], [2, 4])
        ]  # fmt: skip
    fwd_base = {"torch": lambda: torch.softmax(x, -1)}
    if use_compile:
        compiled = _compiled(lambda t: torch.softmax(t, -1))
        fwd_base["torch.compile"] = lambda: compiled(x)

    def fwd(config):
        plan = softmax_plan.forward_plan(x, 1, False, config)
        return lambda: plan(x)

    def bwd(config):
        plan = softmax_plan.backward_plan(dy, y, 1, False, config)
        return lambda: plan(dy, y)

    sw.run("softmax fwd", shape, 2 * n, SOFTMAX, configs, fwd, fwd_base)
    bwd_base = {"torch": lambda: torch._softmax_backward_data(dy, y, -1, DTYPE)}
    sw.run("softmax bwd", shape, 3 * n, SOFTMAX, configs, bwd, bwd_base)


def sweep_norm(sw: Sweep, shape: tuple, use_compile: bool, bwd: bool = True) -> None:
    if shape[-1] > NORM.tiles.max_fused_cols:  # looped forward, two-kernel backward
        # Each knob set alike for both norms here (each norm reads its own field).
        fwd_configs = [
            {
                "forward.looped.elems_per_thread_ln": c["e"],
                "forward.looped.elems_per_thread_rms": c["e"],
                "forward.looped.programs_per_sm_ln": c["p"],
                "forward.looped.programs_per_sm_rms": c["p"],
                "forward.looped.prefetch_ln": c["prefetch"],
                "forward.looped.prefetch_rms": c["prefetch"],
                "forward.looped_rows.stats_ln": c["stats"],
                "forward.looped_rows.stats_rms": c["stats"],
                "forward.looped_rows.rows_ln": c["rows"],
                "forward.looped_rows.rows_rms": c["rows"],
                "forward.looped.evict": c["evict"],
            }
            for c in _grid(
                e=[16, 32],
                p=[2, 4],
                prefetch=[True, False],
                stats=[1, 0],
                rows=[1, 2],
                evict=[True, False],
            )
        ]
    else:
        # Programs per SM 0: one row tile per program (Liger's launch), no prefetch.
        fwd_configs = [
            {"forward.registers.elems_per_thread": e, "forward.registers.programs_per_sm": p}
            for e, p in [(16, 0), (32, 0), (8, 0), (32, 8), (16, 8)]
        ]  # fmt: skip
    # The backward's register use (ptxas, sm_90a, 4096 columns: 164-217 at 8 warps, 91-126 at
    # 16, 48-64 at 32) leaves one program of 8-32 warps per SM: prefetching the next row
    # tile is what keeps bytes in flight. Both paths run this kernel (wide rows per column block).
    # Tiles of two rows (tile_elems 8192) double the bytes each load brings; their partial
    # sums reduced per tile (reduce_rows 2) keep one row of accumulators.
    bwd_configs = _grid(
        elems_per_thread=[16] if shape[-1] <= 4096 else [16, 8],
        programs_per_sm=[1, 2],
        tile_elems=[8192, 4096] if shape[-1] <= 4096 else [8192],
        reduce_rows_rms=[0, 2] if shape[-1] <= 4096 else [0],
    )
    wide = shape[-1] > NORM.tiles.max_fused_cols
    for i, c in enumerate(bwd_configs):  # each norm reads its own fields; sweep both alike
        per_sm = c.pop("programs_per_sm")
        rows = c.pop("reduce_rows_rms")
        fields = {
            "backward.elems_per_thread": c["elems_per_thread"],
            "backward.registers.tile_elems": c["tile_elems"],
            "backward.registers.reduce_rows_rms": rows,
            "backward.registers.reduce_rows_ln": rows,
        }
        if wide:
            fields["backward.wide.programs_per_sm"] = per_sm
        else:
            fields["backward.registers.programs_per_sm"] = per_sm
        bwd_configs[i] = fields
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
    _, _, mean, rstd = norm_plan.forward_plan(x, None, w, b, 1, eps, rms, None)(x, None, w, b)
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

    def fwd(config):
        plan = norm_plan.forward_plan(x, None, w, b, 1, eps, rms, config)
        return lambda: plan(x, None, w, b)

    def bwd(config):
        plan = norm_plan.backward_plan(
            dy, None, x, w, mean, rstd, 1, rms, True, not rms, w.dtype, config
        )
        return lambda: plan(dy, None, x, w, mean, rstd)

    sw.run(f"{name} fwd", shape, fwd_bytes, NORM, fwd_configs, fwd, base)
    if not bwd_configs:
        return
    sw.run(f"{name} bwd", shape, bwd_bytes, NORM, bwd_configs, bwd, bwd_base)


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
