# ruff: noqa: B023, E501 (calls timed where they are made; table rows)
"""What the cu_seqlens asserts of attention_varlen's forward cost on the GPU, and that they
stop bad input (issue 31), in one run of a few minutes:

    PYTHONPATH=src python3 experiments/gpu_varlen_asserts.py    # OUT=dir: $OUT/varlen_asserts.json

1. stops: each bad cu_seqlens case of tests/test_attention.py (BAD_CU_SEQLENS) in a subprocess
   of its own: a device-side assert naming the argument, after a good call ran.
2. cost: the varlen forward with the asserts compiled in (debug=True, as launch_forward
   launches it on CUDA) against the same kernel and tile without them (the launch's debug
   options dropped): GPU time (triton.testing.do_bench, median) and wall time per call of
   back-to-back calls (host included), and the compiled kernels' registers and spills.

Without a GPU it runs at toy sizes under the interpreter (a smoke test; its numbers mean
nothing).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

GPU = __import__("torch").cuda.is_available()
if not GPU:
    os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("TRITONKIT_CACHE_DIR", tempfile.mkdtemp(prefix="tritonkit-varlen-"))

import torch  # noqa: E402
import triton  # noqa: E402

import tritonkit  # noqa: E402
from tritonkit.ops.attention import forward  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from test_attention import _CU_CODE, BAD_CU_SEQLENS  # noqa: E402

DEV = "cuda" if GPU else "cpu"
R: dict = {"device": torch.cuda.get_device_name() if GPU else "cpu (interpreter)"}


def stops() -> list[dict]:
    out = []
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", _CU_CODE.format(cu_q=cu_q, cu_k=cu_k, max_q=max_q)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for cu_q, cu_k, max_q, _ in BAD_CU_SEQLENS
    ]
    for run, (cu_q, cu_k, max_q, message) in zip(runs, BAD_CU_SEQLENS):
        text = run.communicate(timeout=300)[0]
        lines = [ln.strip() for ln in text.splitlines() if "attention_varlen:" in ln]
        out.append({
            "case": f"cu_q={cu_q} cu_k={cu_k} max_seqlen_q={max_q}",
            "expected": message,
            "good_call_ran": "good call ran" in text,
            "stopped": run.returncode != 0 and "NOT STOPPED" not in text,
            "device_side_assert": "device-side assert" in text,
            "names_argument": f"attention_varlen: {message.split()[0]} must" in text,
            "assert_lines": lines[:3],
            "tail": text[-800:],
        })  # fmt: skip
    return out


class _NoAsserts:
    """forward._attn_fwd_kernel with the launch's debug options dropped (asserts compiled out)."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **meta):
            meta.pop("debug", None)
            meta.pop("sanitize_overflow", None)
            return launch(*args, **meta)

        return run

    def __getattr__(self, name):
        return getattr(self.kernel, name)


def _inputs(n_seqs: int, length: int, heads: int, d: int, dtype: torch.dtype):
    g = torch.Generator(device=DEV).manual_seed(0)
    lens = torch.randint(length // 2, length + 1, (n_seqs,), generator=g, device=DEV)
    cu = torch.zeros(n_seqs + 1, dtype=torch.int32, device=DEV)
    cu[1:] = lens.cumsum(0)
    total = int(cu[-1])
    q, k, v = (torch.randn(total, heads, d, device=DEV, generator=g).to(dtype) for _ in range(3))
    return q, k, v, cu, int(lens.max())


def _wall_us(fn, calls: int) -> float:
    for _ in range(3):
        fn()
    if GPU:
        torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        if GPU:
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / calls * 1e6)
    return best


def cost() -> list[dict]:
    shapes = [  # (sequences, longest, heads, head dim, causal)
        (16, 2048, 16, 128, True),
        (16, 2048, 16, 128, False),
        (256, 128, 16, 64, True),  # many short sequences: many short programs
        (4, 64, 8, 64, False),  # host-bound
    ]
    if not GPU:
        shapes = [(2, 16, 2, 16, True)]
    rows = []
    original = forward._attn_fwd_kernel
    for n, length, heads, d, causal in shapes:
        q, k, v, cu, longest = _inputs(
            n, length, heads, d, torch.bfloat16 if GPU else torch.float16
        )

        def call():
            with torch.no_grad():
                return tritonkit.attention_varlen(q, k, v, cu, cu, longest, longest, causal=causal)

        row = {
            "shape": f"{n} seqs <= {length}, H={heads}, D={d}, causal={causal}",
            "tokens": q.shape[0],
        }
        outs = {}
        for name, kernel in (("asserts", original), ("none", _NoAsserts(original))):
            forward._attn_fwd_kernel = kernel
            try:
                outs[name] = call()
                bench = triton.testing.do_bench if GPU else lambda f, **_: _wall_us(f, 1) / 1e3
                row[f"gpu_ms_{name}"] = float(bench(call, warmup=25, rep=200, return_mode="median"))
                row[f"wall_us_{name}"] = _wall_us(call, 200 if GPU else 2)
            finally:
                forward._attn_fwd_kernel = original
        row["same_output"] = bool(torch.equal(outs["asserts"], outs["none"]))
        rows.append(row)
    return rows


def kernels() -> list[dict]:
    out = []
    if not GPU:
        return out
    for cache in forward._attn_fwd_kernel.fn.device_caches.values():
        for compiled in cache[0].values():
            getattr(compiled, "run", None)  # loads the module: registers and spills are known
            out.append({
                "debug": bool(compiled.metadata.debug),
                "num_warps": compiled.metadata.num_warps,
                "num_stages": compiled.metadata.num_stages,
                "n_regs": getattr(compiled, "n_regs", None),
                "n_spills": getattr(compiled, "n_spills", None),
            })  # fmt: skip
    return out


def main() -> None:
    R["stops"] = stops() if GPU else "skipped (no GPU)"
    R["cost"] = cost()
    R["kernels"] = kernels()
    if os.environ.get("OUT"):
        os.makedirs(os.environ["OUT"], exist_ok=True)
        with open(os.path.join(os.environ["OUT"], "varlen_asserts.json"), "w") as f:
            json.dump(R, f, indent=1, default=str)
    print(f"\n{R['device']}")
    if GPU:
        print("\nbad cu_seqlens: stopped / device-side assert / names the argument")
        for s in R["stops"]:
            print(
                f"  {s['case']:<48} {s['stopped']!s:<6} {s['device_side_assert']!s:<6} {s['names_argument']!s:<6} {s['assert_lines'][:1]}"
            )
    print("\nvarlen forward, asserts vs none: GPU ms (median) | wall us per call | same output")
    for r in R["cost"]:
        print(
            f"  {r['shape']:<44} {r['gpu_ms_asserts']:.4f} vs {r['gpu_ms_none']:.4f} | {r['wall_us_asserts']:.1f} vs {r['wall_us_none']:.1f} | {r['same_output']}"
        )
    for kk in R["kernels"]:
        print(
            f"  kernel debug={kk['debug']} warps={kk['num_warps']} stages={kk['num_stages']} regs={kk['n_regs']} spills={kk['n_spills']}"
        )


if __name__ == "__main__":
    main()
