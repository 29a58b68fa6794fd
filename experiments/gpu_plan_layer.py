"""The plan layer on the GPU (issue "one plan per call"): host time against the tree before it,
and the answers it must keep.

1. Host time per call of back-to-back calls at (64, 3000) bf16 (rms_norm, layer_norm,
   softmax, gelu, cross_entropy; forward and forward+backward) and wall time per call of
   rms_norm forward+backward at (16384, 4096) bf16, for the tree before the plan layer
   (``--base DIR``, a checkout with its own src/ and benchmarks/) and this tree, each in its
   own process, alternated twice (base, new, base, new); torch eager timed in the same
   processes. Median over rounds.
2. Replay never changes an answer: float32 attention and matmul recorded and replayed with TF32
   off, then called after ``allow_tf32 = True``: their error against float64 must be the TF32
   path's (the Python path's, checked with replay off), not the IEEE one's.
3. ``replay.reset()`` while a replayed call's backward is pending: the backward is right.
4. Two threads calling rms_norm and softmax at once, 200 calls each: every answer right.
5. attention_varlen's backward timed by ``triton.testing.do_bench`` (autograd.grad with
   retain_graph, as the first-hour issue reported an IndexError there).
6. linear(x, w, b, activation="gelu_tanh") forward+backward, x (8192, 4096) bf16, w (4096,
   4096), b requiring grad: wall time per call from an empty tuning cache against a warm one
   (each in a fresh process; the empty one once cost 308 ms a call).
7. rms_norm forward at (64, 3000): host time of a replayed call against a CUDA graph of the
   same call (static buffers) replayed.

    python experiments/gpu_plan_layer.py --base .base --out $OUT     # about 4 minutes
    python experiments/gpu_plan_layer.py --tiny                       # CPU: the driver only
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOST_CASES = [
    "rms_norm fwd",
    "rms_norm fwd+bwd",
    "layer_norm fwd",
    "layer_norm fwd+bwd",
    "softmax fwd",
    "gelu fwd",
    "gelu fwd+bwd",
    "cross_entropy fwd",
    "cross_entropy fwd+bwd",
]


def _env(tree: Path, ext_dir: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree / "src")
    env["TORCH_EXTENSIONS_DIR"] = ext_dir  # each tree builds its own replay extension
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run_worker(tree: Path, what: str, ext_dir: str, extra_env: dict | None = None) -> dict:
    env = _env(tree, ext_dir)
    env.update(extra_env or {})
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", what, "--tree", str(tree)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout)[-3000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- workers (run in a process whose PYTHONPATH is one tree's src/) --------------------------


def _us_per_call(fn, calls: int) -> float:
    import torch

    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e6


def _replay_ready() -> None:
    """Wait for the replay extension, as a loop past its first seconds finds it (the tree
    before the plan layer built it on the calling thread, at a key's second call)."""
    from tritonkit.ops._core import replay

    try:
        replay.extension(wait=True)
    except TypeError:
        replay.extension()


def _worker_host(tree: Path) -> dict:
    import torch
    import torch.nn.functional as F

    _replay_ready()

    sys.path.insert(0, str(tree / "benchmarks"))
    import host_overhead as H

    import tritonkit.functional as T

    cases = H._cases()
    out: dict = {}
    for name in HOST_CASES:
        fns = {k: cases[name][k] for k in ("tritonkit", "torch")}
        for fn in fns.values():
            for _ in range(20):
                fn()
        samples = {k: [] for k in fns}
        for _ in range(5):
            for k, fn in fns.items():
                samples[k].append(_us_per_call(fn, 300))
        out[name] = {k: statistics.median(v) for k, v in samples.items()}
    x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
    eps = torch.finfo(torch.float32).eps
    big = {
        "tritonkit": lambda: T.rms_norm(x, (4096,), w).backward(dy),
        "torch": lambda: F.rms_norm(x, (4096,), w, eps).backward(dy),
    }
    for fn in big.values():
        for _ in range(10):
            fn()
    out["rms_norm fwd+bwd (16384, 4096) wall"] = {
        k: statistics.median(_us_per_call(fn, 50) for _ in range(5)) for k, fn in big.items()
    }
    return out


def _err(got, want) -> float:
    return float((got.double() - want).norm() / want.norm())


def _worker_answers(tree: Path) -> dict:
    import threading

    import torch
    import triton.testing

    import tritonkit
    from tritonkit.ops._core import replay

    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"  # the CPU (interpreter, tiny sizes): checks the script
    _replay_ready()
    L, K, R = (512, 2048, 1000) if cuda else (32, 64, 40)
    out: dict = {}
    torch.manual_seed(0)
    # 2. TF32 after recording with it off
    torch.backends.cuda.matmul.allow_tf32 = False
    q, k, v = (torch.randn(2, 4, L, 64, device=dev) for _ in range(3))
    a, b = torch.randn(2 * L, K, device=dev), torch.randn(K, L, device=dev)
    want_att = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double())
    want_mm = a.double() @ b.double()
    for name, fn, want in (
        ("attention", lambda: tritonkit.attention(q, k, v), want_att),
        ("matmul", lambda: tritonkit.matmul(a, b), want_mm),
    ):
        torch.backends.cuda.matmul.allow_tf32 = False
        ieee = [_err(fn(), want) for _ in range(4)][-1]  # calls 3, 4 replayed
        torch.backends.cuda.matmul.allow_tf32 = True
        after = [_err(fn(), want) for _ in range(4)]
        torch.backends.cuda.matmul.allow_tf32 = False
        out[f"tf32 {name}"] = {"ieee": ieee, "after allow_tf32": after}
    out["replay stats"] = {"recordings": replay.STATS.recordings, "replays": replay.STATS.replays}
    # 3. reset under a pending backward
    x = torch.randn(64, 3 * R, device=dev, requires_grad=True)
    w = torch.randn(3 * R, device=dev, requires_grad=True)
    for _ in range(3):
        tritonkit.rms_norm(x, (3 * R,), w).sum().backward()
    y = tritonkit.rms_norm(x, (3 * R,), w)
    replay.reset()
    import gc

    gc.collect()
    g = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, g)
    xd = x.detach().double().requires_grad_()
    yd = torch.nn.functional.rms_norm(xd, (3 * R,), w.detach().double())
    (dxd,) = torch.autograd.grad(yd, xd, g.double())
    out["reset under pending backward: dx error"] = _err(dx, dxd)
    # 4. two threads
    errors: list[str] = []
    xs = torch.randn(37, R, device=dev)
    ws = torch.randn(R, device=dev)
    want_n = torch.nn.functional.rms_norm(xs.double(), (R,), ws.double())
    want_s = torch.softmax(xs.double(), -1)

    def loop(fn, want, who):
        try:
            for _ in range(200):
                e = _err(fn(), want)
                if e > 1e-5:
                    errors.append(f"{who}: error {e:.2e}")
        except Exception as exc:
            errors.append(f"{who}: {type(exc).__name__}: {exc}")

    threads = (
        []
        if not cuda
        else [  # the interpreter is not thread-safe
            threading.Thread(
                target=loop, args=(lambda: tritonkit.rms_norm(xs, (R,), ws), want_n, "rms")
            ),
            threading.Thread(
                target=loop, args=(lambda: tritonkit.softmax(xs, -1), want_s, "softmax")
            ),
        ]
    )
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["two threads: errors"] = errors[:5]
    # 5. varlen backward under do_bench
    try:
        n = 1024 if cuda else 48
        lens = torch.tensor([0, n // 4, n // 2, n], device=dev, dtype=torch.int32)
        qv, kv, vv = (
            torch.randn(n, 2, 64, device=dev, dtype=torch.bfloat16, requires_grad=True)
            for _ in range(3)
        )
        o = tritonkit.attention_varlen(qv, kv, vv, lens, lens, n // 2, n // 2, causal=True)
        do = torch.randn_like(o)
        grads = lambda: torch.autograd.grad(o, (qv, kv, vv), do, retain_graph=True)  # noqa: E731
        if cuda:
            ms = triton.testing.do_bench(grads, return_mode="median")
        else:
            ms = [grads() for _ in range(3)] and 0.0
        out["varlen backward do_bench ms"] = ms
    except Exception as exc:
        out["varlen backward do_bench ms"] = f"{type(exc).__name__}: {exc}"[:500]
    if not cuda:
        return out
    # 7. replay vs CUDA graph, rms_norm fwd (64, 3000) bf16
    xb = torch.randn(64, 3000, device="cuda", dtype=torch.bfloat16)
    wb = torch.randn(3000, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        tritonkit.rms_norm(xb, (3000,), wb)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tritonkit.rms_norm(xb, (3000,), wb)
    out["host us, rms_norm fwd (64, 3000): replay vs CUDA graph"] = {
        "replay": statistics.median(
            _us_per_call(lambda: tritonkit.rms_norm(xb, (3000,), wb), 300) for _ in range(5)
        ),
        "cuda graph": statistics.median(_us_per_call(graph.replay, 300) for _ in range(5)),
    }
    return out


def _worker_linear(tree: Path) -> dict:
    import torch

    import tritonkit

    x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)

    def step():
        tritonkit.linear(x, w, b, activation="gelu_tanh").backward(dy)

    firsts = []
    for _ in range(3):
        torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        firsts.append(time.perf_counter() - t)
    per_call = [_us_per_call(step, 20) / 1000 for _ in range(5)]
    return {"first three calls s": firsts, "ms per call after": per_call}


# ---- driver ----------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--base", type=Path, help="the tree before the plan layer")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    p.add_argument("--tiny", action="store_true", help="CPU: check the driver, time nothing")
    p.add_argument("--worker", choices=("host", "answers", "linear"))
    p.add_argument("--tree", type=Path)
    p.add_argument("--no-linear", action="store_true", help="skip section 6")
    p.add_argument("--rounds", type=int, default=2, help="processes per tree, alternated")
    args = p.parse_args()
    if args.worker:
        fn = {"host": _worker_host, "answers": _worker_answers, "linear": _worker_linear}
        print(json.dumps(fn[args.worker](args.tree)))
        return
    if args.tiny:  # the answers worker on the CPU, tiny sizes
        print(json.dumps(_run_worker(ROOT, "answers", tempfile.mkdtemp()), indent=1))
        return
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    result: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    ext = {"base": tempfile.mkdtemp(), "new": tempfile.mkdtemp()}
    trees = {"base": args.base.resolve(), "new": ROOT}
    rounds: dict = {"base": [], "new": []}
    for who in ("base", "new") * args.rounds:
        rounds[who].append(_run_worker(trees[who], "host", ext[who]))
        print(who, "host done", flush=True)
    result["host"] = rounds
    result["answers"] = _run_worker(ROOT, "answers", ext["new"])
    print(json.dumps(result["answers"], indent=1), flush=True)
    cache = tempfile.mkdtemp()  # empty for the first process, warm for the second
    for label in () if args.no_linear else ("empty", "warm"):
        key = f"linear {label} tuning cache"
        result[key] = _run_worker(ROOT, "linear", ext["new"], {"TRITONKIT_CACHE_DIR": cache})
        print(label, result[key], flush=True)
    (args.out / "plan_layer.json").write_text(json.dumps(result, indent=1))
    # The table: median of the two rounds per tree.
    lines = ["| case | base us | new us | torch us (new run) |", "|---|---|---|---|"]
    for case in [*HOST_CASES, "rms_norm fwd+bwd (16384, 4096) wall"]:
        cells = []
        for who in ("base", "new"):
            vals = [r[case]["tritonkit"] for r in rounds[who] if case in r]
            cells.append(f"{statistics.median(vals):.1f}" if vals else "err")
        torch_vals = [r[case]["torch"] for r in rounds["new"] if case in r]
        torch_cell = f"{statistics.median(torch_vals):.1f}" if torch_vals else "err"
        lines.append(f"| {case} | {cells[0]} | {cells[1]} | {torch_cell} |")
    table = "\n".join(lines)
    (args.out / "plan_layer.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
