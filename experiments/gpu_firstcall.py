"""Where a first call's seconds go, and whether Triton compiles in parallel in one process.

    python experiments/gpu_firstcall.py --out DIR      # GPU: about a minute

1. ``warm``: a child process fills fresh Triton and tritonkit caches with rms_norm forward +
   backward at (8192, 4096) bf16; a second child, on those warm caches, runs the same first
   call under cProfile. The top functions by cumulative time are written to DIR/warm.txt.
2. ``cold``: the same first call from empty caches under cProfile (DIR/cold.txt).
3. ``parallel``: four distinct GEMM kernel specializations compiled for this GPU, one after
   another, then by four threads, then by four processes (fresh cache each), wall times in
   DIR/parallel.json: whether Triton's compiler releases the GIL.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def first_call() -> None:
    import torch

    import tritonkit as tk

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    n, d = (8192, 4096) if dev == "cuda" else (64, 96)
    x = torch.randn(n, d, device=dev, dtype=dt, requires_grad=True)
    w = torch.ones(d, device=dev, dtype=dt, requires_grad=True)
    tk.rms_norm(x, (d,), w).float().sum().backward()
    if dev == "cuda":
        torch.cuda.synchronize()


def child_profile(out: str) -> None:
    import cProfile
    import pstats

    t0 = time.perf_counter()
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    t_torch = time.perf_counter() - t0
    prof = cProfile.Profile()
    t1 = time.perf_counter()
    prof.enable()
    first_call()
    prof.disable()
    total = time.perf_counter() - t1
    with open(out, "w") as f:
        f.write(f"import torch {t_torch:.3f} s; first rms_norm fwd+bwd {total:.3f} s\n")
        pstats.Stats(prof, stream=f).sort_stats("cumulative").print_stats(45)
        pstats.Stats(prof, stream=f).sort_stats("tottime").print_stats(25)
    print(f"{out}: first call {total:.3f} s")


def run_child(args: list[str], env: dict) -> None:
    subprocess.run([sys.executable, __file__, *args], env=env, check=False, timeout=300)


# ---- compile parallelism ------------------------------------------------------------------------

GEMM = """
import triton, triton.language as tl

@triton.jit
def mm(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
       BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid = tl.program_id(0)
    nb = tl.cdiv(N, BN)
    rm = (pid // nb) * BM + tl.arange(0, BM)
    rn = (pid % nb) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), tl.float32)
    for k in range(0, K, BK):
        x = tl.load(a + rm[:, None] * sam + (k + rk)[None, :] * sak)
        y = tl.load(b + (k + rk)[:, None] * sbk + rn[None, :] * sbn)
        acc += tl.dot(x, y)
    tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(tl.bfloat16))
"""

CONFIGS = [(128, 128, 64), (128, 256, 64), (64, 128, 64), (256, 128, 64)]


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def compile_one(cfg) -> float:
    import importlib.util

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    spec = importlib.util.spec_from_file_location("gemm_src", os.environ["GEMM_FILE"])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sig = {k: "i32" for k in ("M", "N", "K", "sam", "sak", "sbk", "sbn", "scm", "scn")}
    sig = {"a": "*bf16", "b": "*bf16", "c": "*bf16", **sig}
    sig.update(BM="constexpr", BN="constexpr", BK="constexpr")
    bm, bn, bk = cfg
    src = ASTSource(mod.mm, sig, constexprs={"BM": bm, "BN": bn, "BK": bk})
    # Without a GPU: compile for Hopper anyway (ptxas runs on the CPU).
    target = None if _has_gpu() else GPUTarget("cuda", 90, 32)
    t = time.perf_counter()
    triton.compile(src, target=target, options={"num_warps": 8, "num_stages": 3})
    return time.perf_counter() - t


def parallel(out: Path) -> dict:
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

    gemm = out / "gemm_src.py"
    gemm.write_text(GEMM)
    os.environ["GEMM_FILE"] = str(gemm)
    res = {}
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
    compile_one((32, 32, 32))  # imports and the driver's first use stay out of the figures
    for mode in ("serial", "threads", "processes"):
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
        cfgs = CONFIGS  # the same four, each mode on an empty cache
        t = time.perf_counter()
        if mode == "serial":
            each = [compile_one(c) for c in cfgs]
        else:
            pool = ThreadPoolExecutor if mode == "threads" else ProcessPoolExecutor
            with pool(4) as ex:
                each = list(ex.map(compile_one, cfgs))
        res[mode] = {"wall_s": time.perf_counter() - t, "each_s": each}
        print(mode, res[mode])
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--profile", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.profile:
        child_profile(args.profile)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}"}
    env["TRITON_CACHE_DIR"], env["TRITONKIT_CACHE_DIR"] = tempfile.mkdtemp(), tempfile.mkdtemp()
    run_child(["--profile", str(args.out / "cold.txt")], env)
    run_child(["--profile", str(args.out / "warm.txt")], env)
    (args.out / "parallel.json").write_text(json.dumps(parallel(args.out), indent=1))


if __name__ == "__main__":
    main()
