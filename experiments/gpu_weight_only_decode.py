"""The int8 weight-only linear at decode sizes (issue 45, acceptance 4: the main job found
``int8_weight_only_linear (1, 8192, 8192)`` 25% slower after its decode rows moved to the matmul
family's decode kernel): per shape and M, GPU time of the default plan (the decode kernel up to
16 rows), of the tiled weight-only kernel with each of its tuning candidates (the best kept),
and of bf16 ``F.linear`` on the dequantized weight.

GB/s = (K * N int8 weight bytes + M * K * 2 input + M * N * 2 output) / time; timing:
``triton.testing.do_bench`` (median, L2 flushed). Writes DIR/weight_only_decode.json and .md.

    PYTHONPATH=src python experiments/gpu_weight_only_decode.py --out DIR [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

from tritonkit.ops._core.device import sm_count  # noqa: E402
from tritonkit.ops.quant import plan as Q  # noqa: E402
from tritonkit.ops.quant.config import _candidates  # noqa: E402

SHAPES = [(8192, 8192), (14336, 4096)] if not SMOKE else [(64, 128)]
MS = [1, 4, 16] if not SMOKE else [1, 3]


def bench(fn) -> float:
    if SMOKE:
        fn()
        return float("nan")
    return triton.testing.do_bench(fn, warmup=10, rep=30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out-weight-only")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() and not SMOKE else "cpu"
    dtype = torch.bfloat16
    rows = []
    for n, k in SHAPES:
        g = torch.Generator(device="cpu").manual_seed(n + k)
        w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8).to(device)
        scale = (torch.rand(n, generator=g) / 64 + 1e-3).to(device)
        dense = (w.float() * scale[:, None]).to(dtype)
        for m in MS:
            x = torch.randn(m, k, generator=g).to(device, dtype)
            ref = F.linear(x.float(), w.float() * scale[:, None])
            row = {"n": n, "k": k, "m": m}
            out = Q.weight_only_fwd(x, w, scale, None)
            row["default_rel"] = float((out.float() - ref).norm() / ref.norm())
            row["default_ms"] = bench(lambda: Q.weight_only_fwd(x, w, scale, None))  # noqa: B023
            best = None
            for cfg in _candidates(m, n, k, sm_count(x.device)):
                t = bench(lambda: Q.weight_only_fwd(x, w, scale, None, cfg))  # noqa: B023
                if best is None or t < best[0]:
                    best = (t, cfg)
            row["tiled_best_ms"] = best[0]
            c = best[1]
            row["tiled_best"] = [c.block_m, c.block_n, c.block_k, c.split_k, c.num_warps,
                                 c.num_stages]  # fmt: skip
            out = Q.weight_only_fwd(x, w, scale, None, best[1])
            row["tiled_rel"] = float((out.float() - ref).norm() / ref.norm())
            row["bf16_linear_ms"] = bench(lambda: F.linear(x, dense))  # noqa: B023
            nbytes = k * n + 2 * m * k + 2 * m * n
            for key in ("default", "tiled_best", "bf16_linear"):
                ms = row[f"{key}_ms"]
                row[f"{key}_GBs"] = nbytes / (ms * 1e-3) / 1e9 if ms == ms else None
            rows.append(row)
            print(row, flush=True)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    dev = torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter)"
    doc = {"device": dev, "torch": torch.__version__, "triton": triton.__version__, "rows": rows}
    (out_dir / "weight_only_decode.json").write_text(json.dumps(doc, indent=1))
    (out_dir / "weight_only_decode.md").write_text(render(doc))


def render(doc: dict) -> str:
    """The Markdown table of a run's JSON."""
    lines = [f"# int8 weight-only linear at decode sizes, {doc['device']}", "",
             "| N x K | M | default ms | tiled best ms | tiled best config | bf16 linear ms |"
             " default / tiled |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in doc["rows"]:
        lines.append(
            f"| {r['n']} x {r['k']} | {r['m']} | {r['default_ms']:.4f} | {r['tiled_best_ms']:.4f}"
            f" | {r['tiled_best']} | {r['bf16_linear_ms']:.4f} |"
            f" {r['default_ms'] / r['tiled_best_ms']:.3f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
