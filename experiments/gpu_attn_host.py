# ruff: noqa: E501 (table rows)
"""Host cost of tritonkit.attention against its kernels' GPU time and SDPA, per call, on a GPU:

    PYTHONPATH=src python3 experiments/gpu_attn_host.py --out /tmp/attn-host    # < 90 s on an H100
    PYTHONPATH=src python3 experiments/gpu_attn_host.py --smoke --out /tmp/x     # CPU: the script runs
    PYTHONPATH=src python3 experiments/gpu_attn_host.py --cpu-host   # CPU: Python path, stub launches

For bf16 (B, H, L, D) in (16, 16, 1024, 64), (1, 16, 4096, 128), (4, 32, 512, 64), causal and
not, forward and forward+backward (``torch.autograd.grad`` of O with a fixed dO, so no .grad
accumulates), four implementations: ``tk-python`` (tritonkit with replay suspended: the Python
path every call takes until the replay extension is built, and wherever replay does not
apply), ``tk`` (tritonkit as a long run sees it, measured last, once the replay extension whose
build starts with the run is there: keys seen twice replay from C++), ``sdpa`` (F.scaled_dot_product_attention), and, forward only,
``tk-launch``: the forward plan's bound kernel launch alone on preallocated outputs (Bound's
checks and Triton's C launcher: the floor of the Python path's launch). Per call, over N
back-to-back calls after warm-up:

- host = (host time to enqueue N calls) / N, measured while the GPU is held by a
  ``torch.cuda._sleep`` issued first, so no launch waits for the GPU (checked: the sleep must
  still be running when the N calls are queued, else the run is repeated with a longer one);
- gpu = elapsed(event before, event after the same N queued calls) / N: the kernels run back
  to back with no host gap, so this is the GPU's own time per call (launch gaps included);
- wall = (synchronize to synchronize) / N of N plain back-to-back calls: what a loop sees,
  max(host, gpu) when the queue keeps up;
- bound: "host" where host > gpu (the GPU idles between calls), else "gpu".

The tuning setting is "0" (heuristic or shipped tiles, no timing) unless --tune: this measures
the host path, not the tile search. Writes ``attn_host.json`` and ``attn_host.md`` under --out
and prints the table last. --smoke: tiny shapes under the CPU interpreter, wall only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

GPU = __import__("torch").cuda.is_available()
if not GPU:
    os.environ["TRITON_INTERPRET"] = "1"

SHAPES = [(16, 16, 1024, 64), (1, 16, 4096, 128), (4, 32, 512, 64)]
SMOKE_SHAPES = [(1, 2, 32, 16)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("attn-host-out"))
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, CPU interpreter, wall only")
    ap.add_argument("--iters", type=int, default=50, help="calls per measurement (N)")
    ap.add_argument("--tune", action="store_true", help="keep the tuning setting as it is")
    ap.add_argument(
        "--cpu-host", action="store_true", help="CPU: the Python path's cost with stub launches"
    )
    args = ap.parse_args()
    if args.cpu_host:
        return cpu_host()
    if not args.tune:
        os.environ.setdefault("TRITONKIT_AUTOTUNE", "0")

    import torch
    import torch.nn.functional as F

    import tritonkit
    from tritonkit.ops._core import replay

    smoke = args.smoke or not GPU
    dev = "cuda" if GPU else "cpu"
    n = 3 if smoke else args.iters
    shapes = SMOKE_SHAPES if smoke else SHAPES
    t_start = time.perf_counter()

    if GPU:
        replay.extension()  # starts the build (in a process of its own); phase 2 waits for it

    def sync() -> None:
        if GPU:
            torch.cuda.synchronize()

    def measure(fn) -> dict:
        for _ in range(3):  # warm: compile, plan, record (replay's second call), replay
            fn()
        sync()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        wall = (time.perf_counter() - t) / n * 1e6
        if not GPU:
            return {"wall_us": wall, "host_us": None, "gpu_us": None}
        cycles = 20_000_000
        for _ in range(6):
            start, end, slept = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            torch.cuda._sleep(cycles)
            slept.record()
            start.record()
            t = time.perf_counter()
            for _ in range(n):
                fn()
            host = (time.perf_counter() - t) / n * 1e6
            still_asleep = not slept.query()
            end.record()
            torch.cuda.synchronize()
            if still_asleep:
                return {
                    "wall_us": wall,
                    "host_us": host,
                    "gpu_us": start.elapsed_time(end) / n * 1e3,
                }
            cycles *= 4
        return {"wall_us": wall, "host_us": host, "gpu_us": None}

    def launch_only(q, k, v, causal):
        """The bound launch of the forward plan of (q, k, v, causal), on outputs of its own."""
        from tritonkit.ops._core.plan import PLANS
        from tritonkit.ops.attention.forward import ForwardPlan

        for full, plan in PLANS.items():
            key = full[0][1]
            if type(plan) is ForwardPlan and key[0] == q.shape and key[15] is causal:
                o = torch.empty_strided(plan.o_shape, plan.o_stride, dtype=plan.dtype, device=dev)
                lse = torch.empty(plan.lse_shape, dtype=torch.float32, device=dev)
                if plan.run is None:
                    return None
                return lambda: plan.run(q, k, v, o, lse, q, q, q, q)
        return None

    rows = []

    def record(shape, causal, impl, mode, r) -> None:
        host, gpu = r["host_us"], r["gpu_us"]
        bound = None if host is None or gpu is None else ("host" if host > gpu else "gpu")
        rows.append({"shape": list(shape), "causal": causal, "impl": impl, "mode": mode, **r,
                     "bound": bound})  # fmt: skip
        print(json.dumps(rows[-1]), file=sys.stderr)

    inputs = {}
    for shape in shapes:
        q, k, v = (torch.randn(shape, device=dev, dtype=torch.bfloat16) for _ in range(3))
        grads = tuple(t.clone().requires_grad_() for t in (q, k, v))
        inputs[shape] = (q, k, v, grads, torch.randn_like(q))

    def call(attn, shape, causal, mode):
        q, k, v, grads, do = inputs[shape]
        if mode == "fwd":

            def fn():
                with torch.no_grad():
                    return attn(q, k, v, is_causal=causal)
        else:

            def fn():
                o = attn(*grads, is_causal=causal)
                return torch.autograd.grad(o, grads, do)

        return fn

    cases = [(s, c, m) for s in shapes for c in (False, True) for m in ("fwd", "fwd+bwd")]
    # Phase 1, while the replay extension builds: the Python path, its launch alone, SDPA.
    for shape, causal, mode in cases:
        with replay.suspended():
            record(
                shape,
                causal,
                "tk-python",
                mode,
                measure(call(tritonkit.attention, shape, causal, mode)),
            )
            launch = launch_only(*inputs[shape][:3], causal) if mode == "fwd" else None
        if launch is not None:
            record(shape, causal, "tk-launch", mode, measure(launch))
        sdpa = F.scaled_dot_product_attention
        record(shape, causal, "sdpa", mode, measure(call(sdpa, shape, causal, mode)))
    # Phase 2: tritonkit as a long run sees it (replay from the second call of a key on).
    replay_state = "not waited for (smoke)"
    if GPU:
        replay.extension(wait=True)
        replay_state = replay.STATS.disabled or "built"
    for shape, causal, mode in cases:
        record(shape, causal, "tk", mode, measure(call(tritonkit.attention, shape, causal, mode)))
    order = {"tk-python": 0, "tk-launch": 1, "tk": 2, "sdpa": 3}
    rows.sort(
        key=lambda r: (shapes.index(tuple(r["shape"])), r["causal"], r["mode"], order[r["impl"]])
    )
    elapsed = time.perf_counter() - t_start

    def f(x) -> str:
        return "-" if x is None else f"{x:.1f}"

    sdpa_wall = {
        (tuple(r["shape"]), r["causal"], r["mode"]): r["wall_us"]
        for r in rows
        if r["impl"] == "sdpa"
    }
    lines = [
        f"# tritonkit.attention host cost ({torch.cuda.get_device_name() if GPU else 'CPU interpreter, smoke'}, bf16, N = {n})",
        "",
        "host = host time to enqueue N calls / N (GPU held by torch.cuda._sleep); "
        "gpu = elapsed(event, event) over the same N queued calls / N; "
        "wall = sync-to-sync time of N back-to-back calls / N; "
        "wall/sdpa = wall / SDPA's wall for the same row; bound = host if host > gpu.",
        f"Replay extension: {replay_state}. Replays counted: {replay.STATS.replays}, "
        f"recordings {replay.STATS.recordings}, failures {dict(replay.STATS.failures)}.",
        "",
        "| B,H,L,D | causal | mode | impl | host us | gpu us | wall us | wall/sdpa | bound |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ref = sdpa_wall.get((tuple(r["shape"]), r["causal"], r["mode"]))
        ratio = None if not ref else r["wall_us"] / ref
        lines.append(
            f"| {','.join(map(str, r['shape']))} | {r['causal']} | {r['mode']} | {r['impl']} | "
            f"{f(r['host_us'])} | {f(r['gpu_us'])} | {f(r['wall_us'])} | "
            f"{'-' if ratio is None else f'{ratio:.2f}'} | {r['bound'] or '-'} |"
        )
    lines.append("")
    lines.append(f"Run time {elapsed:.1f} s.")
    table = "\n".join(lines)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "attn_host.json").write_text(
        json.dumps({"rows": rows, "n": n, "replay": replay_state, "seconds": elapsed}, indent=1)
    )
    (args.out / "attn_host.md").write_text(table + "\n")
    print(table)
    return 0


def cpu_host() -> int:
    """The Python path's host time per call on a machine without a GPU: every launch of the
    attention kernels runs Triton's binder for an sm_90 target (as on an H100) and the direct
    path up to the C launcher, which is a no-op; the config lookup is the GPU's (tuning "off":
    the heuristic tile). CPU time (time.process_time, so other processes on the machine count
    less), the least of 7 runs, at (16, 16, 64, 64) bf16: the Python path does not depend on
    the size, CPU allocations do. Compare two commits by running this on each."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    import tritonkit
    from tritonkit.ops._core import internals
    from tritonkit.ops.attention import backward, forward
    from tritonkit.ops.attention import config as attention_config

    class StubEntry:  # launch.py's _Entry with a launcher that launches nothing
        coop = pdl = False
        function = 0
        metadata = (4, 1, 0)

        def launch(self, *args) -> None:
            pass

        def global_scratch(self, *args) -> None:
            return None

    stub = StubEntry()

    class Entries(dict):  # every specialization compiled already
        def get(self, key, default=None):
            return stub

    backend = make_backend(GPUTarget("cuda", 90, 32))
    kernels = [forward._attn_fwd_kernel, backward._attn_bwd_dq_kernel]
    kernels.append(backward._attn_bwd_dkdv_kernel)
    for k in kernels:
        k._interpret = False
        jit = triton.runtime.jit.JITFunction(k.fn.fn, **k.fn.kwargs)
        binder = create_function_from_signature(jit.signature, jit.params, backend)
        k._devices[0] = (binder, Entries())
        k.fn.pre_run_hooks = []
    torch.cuda.current_device = lambda: 0
    internals.cuda_raw_stream = lambda device: 0
    attention_config.interpreter_enabled = lambda: False
    forward.interpreter_enabled = lambda: False

    def bench(fn, n: int) -> float:
        for _ in range(20):
            fn()
        best = float("inf")
        for _ in range(7):
            t = time.process_time()
            for _ in range(n):
                fn()
            best = min(best, (time.process_time() - t) / n * 1e6)
        return best

    q = torch.randn(16, 16, 64, 64, dtype=torch.bfloat16)
    grads = tuple(q.clone().requires_grad_() for _ in range(3))
    do = torch.ones_like(q)
    for causal in (False, True):
        fwd = bench(lambda c=causal: tritonkit.attention(q, q, q, is_causal=c), 500)
        both = bench(
            lambda c=causal: torch.autograd.grad(
                tritonkit.attention(*grads, is_causal=c), grads, do
            ),
            200,
        )
        print(f"causal={causal}: forward {fwd:.1f} us/call, forward+backward {both:.1f} us/call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
