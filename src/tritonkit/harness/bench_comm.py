"""``tritonkit bench-comm``: algorithm and bus bandwidth of the collectives, as nccl-tests
defines them, NCCL against tritonkit's paths, over message sizes; launched by torchrun::

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \\
        torchrun --standalone --nproc-per-node 2 -m tritonkit bench-comm --out results/

Definitions (nccl-tests' PERFORMANCE.md), with ``size`` the message in bytes and ``t`` the
time of one call (the slowest rank's median):

- ``algbw = size / t``; all-reduce and broadcast: ``size`` is the buffer; all-gather: the
  gathered output; reduce-scatter: the input of every rank's pieces;
- ``busbw = algbw * 2 (n - 1) / n`` for all-reduce, ``(n - 1) / n`` for all-gather and
  reduce-scatter, ``1`` for broadcast;
- the compressed all-reduce's algbw is *effective*: the uncompressed size over its time.

Each size is timed with CUDA events around ``inner`` back-to-back calls (a barrier between
repetitions), the median of the repetitions taken per rank and the maximum over ranks kept.
Without a GPU it runs on gloo (CPU tensors, the Triton interpreter for tritonkit's kernels):
a smoke run of the code path, its numbers meaningless.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
PATHS = ("nccl", "ring", "symm", "compressed")
BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_size(text: str) -> int:
    """'1K', '64M', '1G' or a number of bytes."""
    text = text.strip().upper().removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


def sizes_between(lo: int, hi: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 2
    return out


def show_size(nbytes: int) -> str:
    for unit, mult in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= mult and nbytes % mult == 0:
            return f"{nbytes // mult}{unit}"
    return f"{nbytes}B"


def init_from_env(timeout_s: float = 120.0) -> tuple[int, int, torch.device]:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK): NCCL with one
    GPU per rank where there are GPUs, else gloo on the CPU."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        kw = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kw)
    return rank, world, device


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(
    fn: Callable[[], Any], device: torch.device, reps: int, inner: int, warmup: int = 2
) -> float:
    """Seconds per call: the median over ``reps`` of ``inner`` back-to-back calls (a barrier
    before each repetition), the slowest rank's."""
    for _ in range(warmup):
        fn()
    _sync(device)
    samples = []
    for _ in range(reps):
        dist.barrier()
        _sync(device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3 / inner)
        else:
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            samples.append((time.perf_counter() - t0) / inner)
    med = torch.tensor([statistics.median(samples)], dtype=torch.float64, device=device)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    return float(med.item())


def _make_call(collective: str, path: str, nbytes: int, dtype: torch.dtype, device, world):
    """The call to time (or None where the path does not apply), and the message size."""
    from tritonkit import dist as td

    elem = torch.tensor([], dtype=dtype).element_size()
    n = max(1, nbytes // elem)
    if collective == "all_reduce":
        x = torch.ones(n, dtype=dtype, device=device)
        calls = {
            "nccl": lambda: dist.all_reduce(x),
            "ring": lambda: td.ring_all_reduce(x),
            "symm": lambda: td.symm_all_reduce(x),
            "compressed": lambda: td.compressed_all_reduce(x),
        }
        if path == "symm" and device.type != "cuda":
            return None
        return calls.get(path)
    if path != "nccl":
        return None
    if collective == "all_gather":  # size: the gathered output
        part = max(1, n // world)
        src = torch.ones(part, dtype=dtype, device=device)
        out = torch.empty(part * world, dtype=dtype, device=device)
        return lambda: dist.all_gather_into_tensor(out, src)
    if collective == "reduce_scatter":  # size: every rank's pieces
        part = max(1, n // world)
        src = torch.ones(part * world, dtype=dtype, device=device)
        out = torch.empty(part, dtype=dtype, device=device)
        return lambda: dist.reduce_scatter_tensor(out, src)
    x = torch.ones(n, dtype=dtype, device=device)
    return lambda: dist.broadcast(x, 0)


def bench_comm(
    sizes: Sequence[int],
    collectives: Sequence[str] = COLLECTIVES,
    paths: Sequence[str] = PATHS,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | None = None,
    reps: int = 5,
    budget_s: float | None = None,
) -> list[dict[str, Any]]:
    """One row per (collective, path, size): time, algbw and busbw in GB/s (1e9 bytes)."""
    world = dist.get_world_size()
    device = device or torch.device("cpu")
    rows: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    for collective in collectives:
        for path in paths:
            for nbytes in sizes:
                over = budget_s is not None and time.perf_counter() - t_start > budget_s
                stop = torch.tensor([1.0 if over else 0.0], device=device)
                dist.broadcast(stop, 0)  # every rank skips alike
                if stop.item():
                    break
                call = _make_call(collective, path, nbytes, dtype, device, world)
                if call is None:
                    break
                inner = 10 if nbytes <= (1 << 20) else (3 if nbytes <= (64 << 20) else 1)
                try:
                    t = time_call(call, device, reps, inner)
                except Exception as exc:  # recorded, the sweep goes on
                    rows.append({"collective": collective, "path": path, "bytes": nbytes,
                                 "error": f"{type(exc).__name__}: {exc}"[:300]})  # fmt: skip
                    break
                algbw = nbytes / t / 1e9
                busbw = algbw * BUS_FACTOR[collective](world)
                rows.append({
                    "collective": collective, "path": path, "bytes": nbytes, "world": world,
                    "dtype": str(dtype).removeprefix("torch."), "time_us": t * 1e6,
                    "algbw_GBs": algbw, "busbw_GBs": busbw,
                })  # fmt: skip
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return rows


def table(rows: Sequence[dict[str, Any]], machine: str) -> str:
    """Markdown: one line per (collective, size), a column per path (time, busbw)."""
    world = next((r["world"] for r in rows if "world" in r), "?")
    paths = [p for p in PATHS if any(r["path"] == p for r in rows)]
    head = "| collective | size | " + " | ".join(f"{p} us | {p} busbw GB/s" for p in paths) + " |"
    lines = [
        f"Collectives on {machine}, world size {world}: time per call (slowest rank's median) "
        "and bus bandwidth, busbw = size / t * (2(n-1)/n all-reduce, (n-1)/n all-gather and "
        "reduce-scatter, 1 broadcast); compressed: effective (uncompressed bytes).",
        "",
        head,
        "|" + " --- |" * (2 + 2 * len(paths)),
    ]
    keys = sorted(
        {(r["collective"], r["bytes"]) for r in rows}, key=lambda k: (COLLECTIVES.index(k[0]), k[1])
    )
    for coll, nbytes in keys:
        cells = []
        for p in paths:
            r = next(
                (r for r in rows if (r["collective"], r["bytes"], r["path"]) == (coll, nbytes, p)),
                None,
            )
            if r is None or "error" in r:
                cells += ["-", "-"]
            else:
                cells += [f"{r['time_us']:.1f}", f"{r['busbw_GBs']:.1f}"]
        lines.append(f"| {coll} | {show_size(nbytes)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[dict[str, Any]], path: Path, machine: str) -> bool:
    """busbw against size, one panel per collective; False when matplotlib does not import."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    colls = [c for c in COLLECTIVES if any(r["collective"] == c for r in rows)]
    fig, axes = plt.subplots(1, len(colls), figsize=(5 * len(colls), 4), squeeze=False)
    for ax, coll in zip(axes[0], colls):
        for p in PATHS:
            pts = [
                r for r in rows if r["collective"] == coll and r["path"] == p and "error" not in r
            ]
            if pts:
                ax.plot(
                    [r["bytes"] for r in pts], [r["busbw_GBs"] for r in pts], marker="o", label=p
                )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(coll)
        ax.legend()
    world = next((r["world"] for r in rows if "world" in r), "?")
    fig.suptitle(f"{machine}, world size {world}: busbw = algbw x nccl-tests' factor")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def machine_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "CPU (gloo, interpreter: numbers meaningless)"


def write(
    rows: Sequence[dict[str, Any]], out: Path, device: torch.device, stem: str = "bench_comm"
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    name = machine_name(device)
    world = dist.get_world_size()
    (out / f"{stem}_w{world}.json").write_text(
        json.dumps({"machine": name, "world": world, "rows": list(rows)}, indent=1) + "\n"
    )
    (out / f"{stem}_w{world}.md").write_text(table(rows, name))
    plot(rows, out / f"{stem}_w{world}.png", name)


def add_parser(sub, parents) -> None:
    """The ``bench-comm`` command's arguments (cli.py calls this)."""
    s = sub.add_parser(
        "bench-comm",
        help="bus bandwidth of the collectives over message sizes, NCCL against tritonkit's "
        "paths (launch with torchrun)",
        parents=parents,
    )
    s.add_argument("--min-size", default="1K", help="smallest message (default: 1K)")
    s.add_argument("--max-size", default="1G", help="largest message (default: 1G)")
    s.add_argument("--collectives", default=",".join(COLLECTIVES), help="comma-separated")
    s.add_argument(
        "--paths", default=",".join(PATHS), help="comma-separated: nccl, ring, symm, compressed"
    )
    s.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    s.add_argument("--reps", type=int, default=5, help="repetitions per size (default: 5)")
    s.add_argument("--out", default="bench-comm", help="directory for the JSON, table and plot")
    s.set_defaults(func=cmd_bench_comm)


def cmd_bench_comm(args) -> int:
    if "RANK" not in os.environ:
        print("tritonkit bench-comm: launch it with torchrun -m tritonkit bench-comm")
        return 2
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    rank, _, device = init_from_env()
    rows = bench_comm(
        sizes_between(parse_size(args.min_size), parse_size(args.max_size)),
        [c for c in args.collectives.split(",") if c],
        [p for p in args.paths.split(",") if p],
        DTYPES[args.dtype],
        device,
        args.reps,
    )
    if rank == 0:
        write(rows, Path(args.out), device)
        print(table(rows, machine_name(device)))
    dist.barrier()
    dist.destroy_process_group()
    return 0
