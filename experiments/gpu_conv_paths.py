"""Issue 46, iteration: each conv2d forward path on every ResNet-50 layer, a sweep of tiles
per path, against cuDNN, in GPU time (CUDA-graph replay) and host time per call.

Paths (``ops/conv/plan.FORWARD_PATHS``): ``fwd`` (the pointer implicit GEMM), ``tma`` (the TMA
implicit GEMM, stride 1 and 2), and for 1x1 stride-1 layers ``1x1-tma`` and ``1x1-gemm`` (the
matmul family's persistent GEMM, its own tuner timing its candidates). bf16, channels_last,
batch 32; the epilogue ``relu(conv + bias (+ residual))`` as the network runs it, and the plain
conv. Every path's output is compared with cuDNN's (relative L2), so a GPU-only fault shows.

Writes DIR/paths.json and DIR/paths.md.

    PYTHONPATH=src python experiments/gpu_conv_paths.py --out DIR [--smoke] [--layers 0,3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("TRITONKIT_AUTOTUNE", "1")  # the 1x1-gemm path's own tuner times

import gpu_conv as G  # noqa: E402  (experiments/ is on the path: run as a script)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)
SWEEP = [
    (128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 64, 64, 4, 4), (128, 256, 64, 8, 3),
    (64, 128, 64, 4, 4), (64, 64, 64, 4, 4), (256, 128, 64, 8, 3), (128, 128, 64, 4, 3),
    (64, 256, 64, 8, 3), (128, 64, 64, 4, 3),
]  # fmt: skip
if SMOKE:
    SWEEP = [(32, 16, 16, 4, 1)]


# The 1x1 stride-1 layers' paths (--paths-1x1): the pointer and TMA GEMMs, the matmul
# family's GEMM, and the TMA implicit GEMM at window 1.
PATHS_1X1 = ["1x1", "1x1-tma", "1x1-gemm", "tma"]


def _configs(cout: int):
    from tritonkit.ops.conv.config import GemmConfig

    return [
        GemmConfig(bm, bn, bk, 8, w, s) for bm, bn, bk, w, s in SWEEP if bn <= max(64, 2 * cout)
    ]


def _paths(p) -> list[str]:
    if p.pointwise:
        return [v for v in PATHS_1X1 if v != "none"]
    if p.c < 16:
        return ["rows", "fwd"]
    return ["fwd", "tma"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "out-conv-paths"))
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--layers", default="", help="comma-separated indices (default: all)")
    ap.add_argument("--budget-s", type=float, default=500.0)
    ap.add_argument("--paths-1x1", default=",".join(PATHS_1X1))
    args = ap.parse_args()
    PATHS_1X1[:] = args.paths_1x1.split(",")
    os.makedirs(args.out, exist_ok=True)
    from tritonkit.ops.conv.plan import conv_forward, problem

    layers = list(enumerate(G.RESNET50))
    if args.layers:
        keep = {int(i) for i in args.layers.split(",")}
        layers = [(i, L) for i, L in layers if i in keep]
    jobs = []  # (layer index, path, config or None, fused)
    cases = {}
    for i, (cin, cout, k, s, h, res) in layers:
        x, w, b, pad = G._layer(cin, cout, k, s, h, seed=i)
        p = problem(x.shape, w.shape, [s, s], [pad] * 4, [1, 1], 1, x.dtype)
        y = F.conv2d(x, w, b, s, pad)
        r = torch.randn_like(y) if res else None
        cases[i] = (x, w, b, r, [s, s], [pad] * 4, p)
        for path in _paths(p):
            cfgs = [None] if path == "1x1-gemm" else _configs(cout)
            jobs += [(i, path, cfg) for cfg in cfgs]

    def call(job, fused):
        i, path, cfg = job
        x, w, b, r, s, pad, _ = cases[i]
        if fused:
            return conv_forward(x, w, b, r, s, pad, [1, 1], 1, "relu", cfg, path)
        return conv_forward(x, w, None, None, s, pad, [1, 1], 1, "none", cfg, path)

    t0 = time.monotonic()
    warm = G._warm(lambda: [call(j, f) for j in jobs for f in (False, True)])
    compile_s = time.monotonic() - t0
    rows = []
    for job in jobs:
        if time.monotonic() - G.T0 > args.budget_s:
            break
        i, path, cfg = job
        values = None if cfg is None else [*cfg.tuning().params.values(), cfg.num_warps,
                                           cfg.num_stages]  # fmt: skip
        row = {"layer": i, "path": path, "config": values}
        try:
            out = call(job, False)
            ref = F.conv2d(*cases[i][:2], None, cases[i][4], cases[i][5][0])
            row["rel"] = G._rel(out, ref)
            row["gpu_ms"] = G._bench_gpu(lambda job=job: call(job, False))
            row["fused_gpu_ms"] = G._bench_gpu(lambda job=job: call(job, True))
        except Exception as exc:  # a tile that does not compile or fit: recorded, not fatal
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            row["traceback"] = traceback.format_exc()[-3000:]
        rows.append(row)
    base = {}
    for i, (cin, cout, k, s, h, _) in layers:
        x, w, b, r, st, pad, p = cases[i]

        def cudnn(x=x, w=w, st=st, pad=pad):
            return F.conv2d(x, w, None, st, pad[0])

        def cudnn_fused(x=x, w=w, b=b, r=r, st=st, pad=pad):
            y = F.conv2d(x, w, b, st, pad[0])
            return F.relu(y + r if r is not None else y)

        base[i] = {
            "gpu_ms": G._bench_gpu(cudnn), "fused_gpu_ms": G._bench_gpu(cudnn_fused),
            "host_us": G._host_us(cudnn), "flops": G._flops(x, w, cudnn()),
            "shape": f"{cin}->{cout} k{k} s{s} @{h}", "m": p.m,
        }  # fmt: skip
        best = {}
        for row in rows:
            if row["layer"] == i and row.get("gpu_ms"):
                cur = best.get(row["path"])
                if cur is None or row["gpu_ms"] < cur["gpu_ms"]:
                    best[row["path"]] = row
        for path, row in best.items():  # host time of the best tile of each path
            job = (i, path, None if row["config"] is None else _cfg(row["config"]))
            row["host_us"] = G._host_us(lambda job=job: call(job, False))
        base[i]["best"] = best
    doc = {"gpu": torch.cuda.get_device_name() if G.GPU else "cpu (interpreter)",
           "torch": torch.__version__, "triton": triton.__version__, "compile_s": compile_s,
           "warm": warm,
           "layers": base, "rows": rows}  # fmt: skip
    with open(os.path.join(args.out, "paths.json"), "w") as f:
        json.dump(doc, f, indent=1, default=str)
    md = render(doc)
    with open(os.path.join(args.out, "paths.md"), "w") as f:
        f.write(md)
    print(md)
    print(f"total {time.monotonic() - G.T0:.0f} s, compile {compile_s:.0f} s")


def _f(v, spec: str) -> str:
    """A figure, or "-" where the GPU gave none (a timing that could not be captured)."""
    return "-" if v is None else format(v, spec)


def render(doc: dict) -> str:
    """paths.md from paths.json's document (tests/test_experiments.py renders the recorded
    GPU runs with it)."""
    lines = [
        f"# conv2d forward paths vs cuDNN, {doc['gpu']} (bf16, channels_last, batch 32)",
        "",
        "GPU ms: CUDA-graph replay; ratio = cuDNN / ours (> 1: ours faster). fused: relu(conv +"
        " bias (+ residual)) against cuDNN's conv then eager bias, add, relu.",
        "",
        "| layer | cuDNN ms | path | best tile | ms | ratio | fused ms | fused ratio | host us |"
        " cuDNN host us | rel |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = []
    for b in doc["layers"].values():
        best_ratio = None
        for path, row in sorted(b["best"].items()):
            ours, fused = row.get("gpu_ms"), row.get("fused_gpu_ms")
            ratio = b["gpu_ms"] / ours if b.get("gpu_ms") and ours else None
            fr = b["fused_gpu_ms"] / fused if b.get("fused_gpu_ms") and fused else None
            if ratio is not None:
                best_ratio = max(best_ratio or 0.0, ratio)
            lines.append(
                f"| {b['shape']} | {_f(b.get('gpu_ms'), '.4f')} | {path} | {row['config']} | "
                f"{_f(ours, '.4f')} | {_f(ratio, '.3f')} | {_f(fused, '.4f')} | "
                f"{_f(fr, '.3f')} | {_f(row.get('host_us'), '.1f')} | "
                f"{_f(b.get('host_us'), '.1f')} | {_f(row.get('rel'), '.2e')} |"
            )
        ratios.append(best_ratio)
    gm = G._geomean(ratios)
    lines += ["", f"Geomean of the best path's GPU ratio: {gm:.3f}" if gm else ""]
    errors = [r for r in doc["rows"] if "error" in r]
    lines += ["", f"{len(errors)} tiles failed to run"] + [
        f"- layer {r['layer']} {r['path']} {r['config']}: {r['error'][:160]}" for r in errors[:20]
    ]
    return "\n".join(lines) + "\n"


def _cfg(values):
    from tritonkit.ops.conv.config import GemmConfig

    bm, bn, bk, gm, w, s = values
    return GemmConfig(bm, bn, bk, gm, w, s)


if __name__ == "__main__":
    main()
