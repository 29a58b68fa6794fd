# ruff: noqa: E501, B023 (long table rows; lambdas timed where they are made)
"""GPU checks and timings of tritonkit.dist (issue 47; issue 49 runs it at 8 GPUs), one torchrun
launch of under 5 minutes on a machine of 2 (or 4, 8) GPUs:

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONPATH=src \\
        torchrun --standalone --nproc-per-node 2 experiments/gpu_dist.py --out $OUT --budget-s 210

or world sizes 2 and 4 in turn on a machine of 4 (GPUs 0,1 then 0-3; results in $OUT/w2,
$OUT/w4 and $OUT/summary.md, under ``--budget-s`` in all):

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONPATH=src \\
        python experiments/gpu_dist.py --worlds 2,4 --out $OUT --budget-s 420

    PYTHONPATH=src python experiments/gpu_dist.py --smoke --worlds 2,4 --out /tmp/dist  # CPU, gloo

Without torchrun's environment (and without ``--worlds``) the script spawns ``--world``
processes itself (file store).
``--smoke`` runs every section on CPU tensors with gloo and the Triton interpreter at tiny
sizes: a test of the script, its numbers meaningless.

Sections in order of value (each guarded: an error is recorded and the run goes on; all ranks
skip alike once ``--budget-s`` is spent; results written after each), results in $OUT/dist_w{N}.json and .md:

1. correct: every collective against NCCL's (torch.distributed's) result: all_reduce (nccl,
   ring, symm, auto; SUM, AVG, MAX), broadcast, all_gather, reduce_scatter exactly on
   integer-valued inputs; compressed int8 within its bound; the fused all-reduce + residual +
   RMSNorm against the gathered sum (float32, rank order, rounded once) then
   tritonkit.add_rms_norm, and within rounding of float64.
2. latency: symm all-reduce (ours; one-shot and two-shot forced) vs NCCL vs PyTorch's
   torch.ops.symm_mem.one_shot_all_reduce, bf16, 1 KB - 1 MB (and up to 4 MB for the
   crossover); writes tuned/<gpu>/collectives.json (the crossover row) under $OUT.
3. fused: all-reduce + residual + RMSNorm, hidden 4096 and 8192, tokens 1-64, fused vs NCCL
   all_reduce then tritonkit.add_rms_norm.
4. compressed: effective algbw (uncompressed bytes / time) of the int8 all-reduce vs NCCL's
   algbw at 256 MB (bf16 and fp32 inputs).
5. agmm: all_gather_matmul (the gather overlapped with the own rows' product) against NCCL's
   all_gather_into_tensor then tritonkit.matmul, the matmul alone and PyTorch's
   fused_all_gather_matmul, bf16.
6. kernels: GB/s of the compression kernels on one GPU (bytes each reads and writes / time)
   against torch's clone (2 x bytes / time) of a tensor of the same size.
7. bench_comm: `tritonkit bench-comm`'s table and plot, 1 KB - 1 GB (every other size
   when time is short).
8. ddp: a small language model (embedding, 2 MLP blocks, vocab 512) trained 60 steps with the
   int8 hook (error feedback) and uncompressed: final loss and bytes counted by the hook.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

SMOKE = "--smoke" in sys.argv
if SMOKE or not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch.distributed as dist  # noqa: E402

from tritonkit import dist as td  # noqa: E402
from tritonkit.harness import bench_comm as bc  # noqa: E402

BUDGET_S = 230.0  # --budget-s
T0 = time.perf_counter()
RESULTS: dict = {"sections": {}, "errors": {}}


def log(rank: int, *msg) -> None:
    if rank == 0:
        print(f"[{time.perf_counter() - T0:6.1f}s]", *msg, flush=True)


def agree_stop(device, share: float) -> bool:
    """True on every rank when rank 0 sees less than ``share`` of the budget left."""
    left = BUDGET_S - (time.perf_counter() - T0)
    flag = torch.tensor([1.0 if left < share else 0.0], device=device)
    dist.broadcast(flag, 0)
    return bool(flag.item())


SYMM = {"ok": False}  # the probe's verdict: symmetric-memory sections run only when it passed


def probe_symm(rank, world, device) -> dict:
    """Two symm all-reduces of 1K integers (the first compiles): equal to NCCL's and quick, on
    every rank, or the symmetric-memory parts are skipped (a broken barrier would spin ~10 s a
    call)."""
    out = {"ok": False}
    if device.type == "cuda":
        try:
            x = ints((1024,), torch.bfloat16, device, rank)
            ref = x.clone()
            dist.all_reduce(ref)
            for _ in range(2):
                y = x.clone()
                t = time.perf_counter()
                td.symm_all_reduce(y)
                torch.cuda.synchronize()
                out["seconds"] = time.perf_counter() - t
            out["equal"] = bool(torch.equal(y, ref))
            out["ok"] = out["equal"] and out["seconds"] < 1.0
        except Exception as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"[:300]
    flag = torch.tensor([1.0 if out["ok"] else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    out["ok"] = bool(flag.item())
    SYMM["ok"] = out["ok"]
    if not out["ok"]:  # every rank alike: no symmetric-memory path from here on (auto: NCCL)
        os.environ["TRITONKIT_DIST_SYMM"] = "0"
    return out


def ints(shape, dtype, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(-8, 9, shape, generator=g).to(dtype=dtype, device=device)


# ----------------------------------------------------------------------------------------------


def sec_correct(rank, world, device, smoke):
    out = {}
    dtypes = [torch.float32] if smoke else [torch.float32, torch.bfloat16]
    shapes = [(7,), (3, 129)] if smoke else [(7,), (3, 129), (1 << 20,)]
    algos = ["nccl", "ring"] + (["symm", "auto"] if SYMM["ok"] else [])
    for dtype in dtypes:
        for shape in shapes:
            x = ints(shape, dtype, device, 1 + rank)
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX):
                ref = x.clone()
                dist.all_reduce(ref, op)
                for algo in algos:
                    if algo in ("symm", "auto") and op == dist.ReduceOp.MAX:
                        continue
                    y = x.clone()
                    td.all_reduce(y, op, algorithm=algo, timeout=60)
                    key = f"all_reduce/{algo}/{op}/{tuple(shape)}/{dtype}"
                    # AVG of integers: a division both sides round alike only where exact
                    tol = 0.0 if op != dist.ReduceOp.AVG else float(torch.finfo(dtype).eps) * 16
                    out[key] = bool(
                        ((y.float() - ref.float()).abs() <= tol * ref.float().abs()).all()
                    )
            # broadcast / all_gather / reduce_scatter through tritonkit.dist against torch's
            b = x.clone()
            td.broadcast(b, 0, timeout=60)
            bref = x.clone()
            dist.broadcast(bref, 0)
            out[f"broadcast/{tuple(shape)}/{dtype}"] = bool(torch.equal(b, bref))
            got = [torch.empty_like(x) for _ in range(world)]
            exp = [torch.empty_like(x) for _ in range(world)]
            td.all_gather(got, x, timeout=60)
            dist.all_gather(exp, x)
            out[f"all_gather/{tuple(shape)}/{dtype}"] = all(
                torch.equal(a, e) for a, e in zip(got, exp)
            )
            pieces = [ints(shape, dtype, device, 100 * rank + i) for i in range(world)]
            o1, o2 = torch.empty_like(x), torch.empty_like(x)
            td.reduce_scatter(o1, pieces, timeout=60)
            dist.reduce_scatter(o2, [p.clone() for p in pieces])
            out[f"reduce_scatter/{tuple(shape)}/{dtype}"] = bool(torch.equal(o1, o2))
    if SYMM["ok"]:
        # Four calls of one key with fresh inputs: the first through Triton's launcher, the
        # rest from C (native_launch; its launch count recorded), alternating the halves.
        from tritonkit.ops._core.plan import PLANS

        for dtype in dtypes:
            for n in (7, 4099) if smoke else (7, 4099, 1 << 20):
                ok = True
                for call in range(4):
                    x = ints((n,), dtype, device, 10 * call + rank)
                    ref = x.clone()
                    dist.all_reduce(ref)
                    td.symm_all_reduce(x)
                    ok = ok and bool(torch.equal(x, ref))
                key = ("collectives.symm", None, n, dtype, x.device, dist.ReduceOp.SUM)
                native = getattr(getattr(PLANS.peek(key, None), "launch", None), "native", None)
                out[f"symm_repeated/{n}/{dtype}"] = ok
                out[f"symm_repeated/{n}/{dtype}/native_runs"] = getattr(native, "runs", 0)
    # compressed: within its documented bound (per block: (sum_r amax_r + amax_sum) / 254)
    n = 5000 if smoke else 1 << 22
    g = torch.Generator(device="cpu").manual_seed(7 + rank)
    x = torch.randn(n, generator=g).to(device)
    ref = x.double()
    dist.all_reduce(ref)
    pad = (-n) % 256
    amax = torch.nn.functional.pad(x.abs().double(), (0, pad)).view(-1, 256).amax(1)
    dist.all_reduce(amax)
    bound = (amax * (2 + 1 / 254) / 254).repeat_interleave(256)[:n] * 1.0001 + 1e-6
    outs = {}
    for algo in ("auto", "nccl"):  # auto: symmetric memory on GPUs (NCCL group), else nccl
        y = x.clone()
        td.compressed_all_reduce(y, block=256, timeout=60, algorithm=algo)
        err = (y.double() - ref).abs()
        out[f"compressed/int8/{algo}/within_bound"] = bool((err <= bound).all())
        out[f"compressed/int8/{algo}/max_err_over_bound"] = float((err / bound).max())
        outs[algo] = y
    # the same arithmetic on both transports: the same bits
    out["compressed/int8/auto_equals_nccl"] = bool(torch.equal(outs["auto"], outs["nccl"]))
    same = outs["auto"].clone()
    dist.broadcast(same, 0)
    out["compressed/int8/ranks_agree"] = bool(torch.equal(same, outs["auto"]))
    # with error feedback, averaged (the DDP hook's call), three calls in a row (the plan's fast
    # path, both halves of the buffers): outputs and residuals equal the all-to-all path's
    for m in (1000, 5003) if smoke else (1000, 262144, 1 << 22):
        for rdt in (torch.float32, torch.bfloat16):
            xs = torch.randn(m, generator=g).to(device, rdt)  # a residual of its dtype
            state = {a: torch.zeros(td.residual_size(m, world), device=device, dtype=rdt)
                     for a in ("auto", "nccl")}  # fmt: skip
            ok = True
            for _ in range(3):
                ys = {}
                for algo in ("auto", "nccl"):
                    ys[algo] = xs.clone()
                    td.compressed_all_reduce(ys[algo], dist.ReduceOp.AVG, residual=state[algo],
                                             timeout=60, algorithm=algo)  # fmt: skip
                ok &= bool(torch.equal(ys["auto"], ys["nccl"]))
                ok &= bool(torch.equal(state["auto"], state["nccl"]))
                ok &= bool(torch.isfinite(ys["auto"]).all())
                xs = ys["nccl"]
            out[f"compressed/int8/avg_ef/{m}/{str(rdt)[6:]}/auto_equals_nccl"] = ok
    # fused all-reduce + residual + RMSNorm
    fused_ok = SYMM["ok"] or device.type != "cuda"  # a failed probe: the kernel is not run
    for hidden in ((64,) if smoke else (4096, 8192)) if fused_ok else ():
        dt = torch.float32 if smoke else torch.bfloat16
        xx = torch.randn(5, hidden, generator=g).to(device, dt)
        res = torch.randn(5, hidden, generator=g).to(device, dt)
        w = torch.randn(hidden, generator=g).to(device, dt)
        y, h = td.fused_all_reduce_add_rms_norm(xx, res, w, 1e-6, timeout=60)
        from tritonkit.ops.collectives.plan import add_rms_norm_reference

        parts = [torch.empty_like(xx) for _ in range(world)]
        dist.all_gather(parts, xx)
        nccl = xx.clone()
        dist.all_reduce(nccl)
        if device.type == "cuda":
            # The kernel's rounding: the ranks' terms summed in float32 in rank order, rounded
            # once to x's dtype. NCCL's bf16 ring rounds every hop's partial sum, so from 3
            # ranks on its bits differ (a third of the elements by an ulp of the sum at 4):
            # the exact check is against the gathered sum, NCCL's is shown as information.
            r = torch.zeros_like(xx, dtype=torch.float32)
            for part in parts:
                r += part.float()
            reduced = r.to(dt)
        else:  # no symmetric memory: the fallback is torch's all_reduce then the same formula
            reduced = nccl
        y_ref, h_ref = add_rms_norm_reference(reduced, res, w, 1e-6)
        tol = 2.0**-7 if dt == torch.bfloat16 else 1e-5
        out[f"fused_norm/{hidden}/h_equal"] = bool(torch.equal(h, h_ref))
        out[f"fused_norm/{hidden}/y_close"] = bool(
            torch.allclose(y.float(), y_ref.float(), rtol=tol, atol=tol)
        )
        # Against float64: h within its roundings (the float32 partial sums', at most
        # sum|x_p| each; the sum's to dt; h's), whichever reduction order made it.
        h64 = sum(part.double() for part in parts) + res.double()
        mag = sum(part.double().abs() for part in parts)
        bound = float(torch.finfo(dt).eps) * (world * mag + h64.abs())
        out[f"fused_norm/{hidden}/h_within_rounding_of_float64"] = bool(
            ((h.double() - h64).abs() <= bound).all()
        )
        _, h_nccl = add_rms_norm_reference(nccl, res, w, 1e-6)
        # information only: 0 at 2 ranks, an ulp or so of the sum in places beyond
        out[f"fused_norm/{hidden}/h_max_abs_diff_vs_nccl"] = float(
            (h.float() - h_nccl.float()).abs().max()
        )
    out["all_passed"] = all(v for k, v in out.items() if isinstance(v, bool))
    return out


def host_us(fn, device, calls=1000):
    """Host microseconds per call, ``calls`` queued without a sync (the GPU runs behind), the
    slowest rank's."""
    dist.barrier()
    bc._sync(device)
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    host = torch.tensor([(time.perf_counter() - t) / calls * 1e6], device=device)
    bc._sync(device)
    dist.all_reduce(host, op=dist.ReduceOp.MAX)
    return float(host.item())


def sec_latency(rank, world, device, smoke):
    if not SYMM["ok"]:
        return {"skipped": "symmetric memory unavailable or its probe failed"}
    import torch.distributed._symmetric_memory as symm_mem

    from tritonkit.ops.collectives import plan
    from tritonkit.ops.collectives.config import SymmConfig

    rows = []
    group_name = dist.group.WORLD.group_name
    sizes = bc.sizes_between(1 << 10, 4 << 20)  # 1K-1M asked; to 4M for the crossover
    for nbytes in sizes:
        n = nbytes // 2
        x = torch.ones(n, dtype=torch.bfloat16, device=device)
        ws = plan.workspace(None, device, torch.bfloat16, n)
        row = {"bytes": nbytes}
        inner, reps = (20, 15) if nbytes <= (1 << 20) else (5, 5)
        row["nccl_us"] = bc.time_call(lambda: dist.all_reduce(x), device, reps, inner) * 1e6
        row["ours_us"] = bc.time_call(lambda: td.symm_all_reduce(x), device, reps, inner) * 1e6
        auto = lambda: td.all_reduce(x, algorithm="auto")  # noqa: E731 (what a user calls)
        row["auto_us"] = bc.time_call(auto, device, reps, inner) * 1e6
        for name, one in (("one_shot_us", True), ("two_shot_us", False)):
            cfg = SymmConfig.heuristic(nbytes, world, 0 if not one else 1 << 62)
            row[name] = (
                bc.time_call(lambda: plan.symm_launch(x, x, ws, cfg, 1.0), device, reps, inner)
                * 1e6
            )
        if nbytes <= (64 << 10):  # host time per call, queued without a sync
            row["ours_host_us"] = host_us(lambda: td.symm_all_reduce(x), device)
        if nbytes <= (1 << 20):
            try:
                buf = symm_mem.empty(n, dtype=torch.bfloat16, device=device)
                symm_mem.rendezvous(buf, group_name)
                buf.fill_(1)
                fn = lambda: torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", group_name)  # noqa: E731
                row["torch_one_shot_us"] = bc.time_call(fn, device, reps, inner) * 1e6
                if nbytes <= (64 << 10):
                    row["torch_one_shot_host_us"] = host_us(fn, device)
            except Exception as exc:  # PyTorch's op may be missing or refuse
                row["torch_one_shot_error"] = f"{type(exc).__name__}: {exc}"[:200]
        rows.append(row)
        log(
            rank,
            f"latency {bc.show_size(nbytes)}: "
            + ", ".join(f"{k}={v:.1f}" for k, v in row.items() if k.endswith("_us")),
        )
    # The crossover: the largest size up to which ours beats NCCL at every size; the one-shot's
    # limit: the largest size where the one-shot beats the two-shot.
    max_bytes = 0
    for r in rows:
        if r["ours_us"] < r["nccl_us"]:
            max_bytes = r["bytes"]
        else:
            break
    one_max = max([r["bytes"] for r in rows if r["one_shot_us"] <= r["two_shot_us"]] or [0])
    if rank == 0 and max_bytes:
        write_crossover(world, max_bytes, one_max)
    return {"rows": rows, "crossover_bytes": max_bytes, "one_shot_max_bytes": one_max}


def write_crossover(world: int, max_bytes: int, one_max: int) -> None:
    """$OUT/tuned/<gpu>/collectives.json in the shipped-table schema (merge it into
    src/tritonkit/tuned/<gpu>/ to ship the measured crossover)."""
    import triton

    from tritonkit import _tuning

    gpu = torch.cuda.get_device_name()
    path = OUT / "tuned" / _tuning._slug(gpu) / "collectives.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = json.loads(path.read_text())["entries"] if path.exists() else {}
    key = _tuning._entry_key("collectives.symm", {"world_size": world, "dtype": "bfloat16"})
    cfg = _tuning.Config({"max_bytes": max_bytes, "one_shot_max_bytes": one_max}, 8, 1)
    entries[key] = {"config": cfg.to_dict()}
    doc = {"schema": _tuning.SCHEMA, "gpu": gpu, "triton": triton.__version__, "family": "collectives",
           "tuned": time.strftime("%Y-%m-%d"), "entries": dict(sorted(entries.items()))}  # fmt: skip
    path.write_text(json.dumps(doc, indent=1) + "\n")


def sec_fused(rank, world, device, smoke):
    if not SYMM["ok"]:
        return {"skipped": "symmetric memory unavailable or its probe failed"}
    import tritonkit

    rows = []
    for hidden in (4096, 8192):
        for tokens in (1, 2, 4, 8, 16, 32, 64):
            x = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16)
            res = torch.randn_like(x)
            w = torch.randn(hidden, device=device, dtype=torch.bfloat16)

            def unfused():
                y = x.clone()
                dist.all_reduce(y)
                return tritonkit.add_rms_norm(y, res, w, 1e-6)

            fused = lambda: td.fused_all_reduce_add_rms_norm(x, res, w, 1e-6)  # noqa: E731
            t_u = bc.time_call(unfused, device, 15, 10) * 1e6
            t_f = bc.time_call(fused, device, 15, 10) * 1e6
            rows.append({"hidden": hidden, "tokens": tokens, "nccl_plus_add_rms_norm_us": t_u,
                         "fused_us": t_f, "speedup": t_u / t_f})  # fmt: skip
            log(rank, f"fused H={hidden} T={tokens}: unfused {t_u:.1f} us, fused {t_f:.1f} us")
    return {"rows": rows}


def sec_agmm(rank, world, device, smoke):
    """all_gather_matmul (the copy engines' gather overlapped with the own rows' product)
    against NCCL's all_gather_into_tensor then tritonkit.matmul, the matmul of the gathered
    rows alone (what full overlap would reach) and PyTorch's fused_all_gather_matmul."""
    import tritonkit

    shapes = (
        [(4, 64, 32)] if smoke else [(1024, 8192, 8192), (2048, 8192, 8192), (4096, 4096, 16384)]
    )
    dt = torch.float32 if smoke else torch.bfloat16
    rows = []
    for m, k, n in shapes:
        g = torch.Generator(device="cpu").manual_seed(rank)
        a = torch.randn(m, k, generator=g).to(device, dt)
        b = (torch.randn(k, n, generator=torch.Generator().manual_seed(3)) / k**0.5).to(device, dt)
        gathered = torch.empty(world * m, k, device=device, dtype=dt)

        def nccl_then_matmul():
            dist.all_gather_into_tensor(gathered, a)
            return tritonkit.matmul(gathered, b)

        ref = nccl_then_matmul()
        got = td.all_gather_matmul(a, b)
        err = float((got.float() - ref.float()).norm() / ref.float().norm())
        reps, inner = (2, 1) if smoke else (5, 3)
        row = {"m_shard": m, "k": k, "n": n, "world": world, "rel_l2_vs_nccl_path": err}
        row["ours_us"] = bc.time_call(lambda: td.all_gather_matmul(a, b), device, reps, inner) * 1e6
        row["nccl_then_matmul_us"] = bc.time_call(nccl_then_matmul, device, reps, inner) * 1e6
        row["matmul_alone_us"] = (
            bc.time_call(lambda: tritonkit.matmul(gathered, b), device, reps, inner) * 1e6
        )
        row["all_gather_alone_us"] = (
            bc.time_call(lambda: dist.all_gather_into_tensor(gathered, a), device, reps, inner)
            * 1e6
        )
        if device.type == "cuda":
            try:
                import torch.distributed._symmetric_memory as symm_mem

                name = dist.group.WORLD.group_name
                sa = symm_mem.empty(m, k, dtype=dt, device=device)
                symm_mem.rendezvous(sa, name)
                sa.copy_(a)
                fn = lambda: torch.ops.symm_mem.fused_all_gather_matmul(sa, [b], 0, name)  # noqa: E731
                row["torch_fused_us"] = bc.time_call(fn, device, reps, inner) * 1e6
            except Exception as exc:  # PyTorch's op may be missing or refuse
                row["torch_fused_error"] = f"{type(exc).__name__}: {exc}"[:200]
        row["speedup_vs_nccl_then_matmul"] = row["nccl_then_matmul_us"] / row["ours_us"]
        rows.append(row)
        log(
            rank,
            "agmm "
            + ", ".join(
                f"{k_}={v:.3g}" if isinstance(v, float) else f"{k_}={v}" for k_, v in row.items()
            ),
        )
    return {
        "rows": rows,
        "formula": "time per call; speedup = NCCL all_gather_into_tensor + tritonkit.matmul over ours",
    }


def sec_compressed(rank, world, device, smoke):
    """Effective algbw (uncompressed bytes / time) at 256 MB: the int8 all-reduce on symmetric
    memory (with and without error feedback) and on torch.distributed's all-to-all +
    all-gather, against NCCL's all-reduce."""
    nbytes = (64 << 10) if smoke else (256 << 20)
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        n = nbytes // torch.tensor([], dtype=dtype).element_size()
        x = torch.randn(n, device=device, dtype=dtype)
        # Back-to-back calls (3 between events), as a training step's buckets go: one call
        # alone would also count the host's time to its first launch.
        reps, inner = (2, 1) if smoke else (5, 3)
        t_n = bc.time_call(lambda: dist.all_reduce(x), device, reps, inner)
        row = {"dtype": str(dtype), "bytes": nbytes, "nccl_algbw_GBs": nbytes / t_n / 1e9}
        res = torch.zeros(td.residual_size(n, world), device=device)
        y = x.clone()
        variants = [("symm_ef", "auto", res), ("symm_no_ef", "auto", None), ("a2a_ef", "nccl", res)]
        if dtype != torch.float32:  # error feedback kept in the input's dtype: fewer bytes
            variants.append(("symm_ef_lowres", "auto", res.to(dtype)))
        for name, algo, r in variants:
            t_c = bc.time_call(
                lambda: td.compressed_all_reduce(y, residual=r, algorithm=algo), device, reps, inner
            )
            row[f"{name}_effective_algbw_GBs"] = nbytes / t_c / 1e9
            row[f"{name}_speedup"] = t_n / t_c
        rows.append(row)
        log(rank, "compressed " + ", ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                                            for k, v in row.items()))  # fmt: skip
    lay = td_layout(nbytes // 2, world)
    return {
        "rows": rows,
        "formula": "algbw = uncompressed bytes / time",
        "bytes_per_rank": "compressed: 2 (world - 1) shard (1 + 4 / block), shard = numel / "
        "world in whole blocks (stored into the peers' buffers on symmetric memory, sent on "
        "the a2a path); NCCL ring: 2 (world - 1) / world * numel * element_size",
        "bf16_256MB_bytes_per_rank": {
            "compressed": lay.wire_bytes(),
            "nccl_ring": 2 * (world - 1) * nbytes // world,
        },
    }


def td_layout(numel, world):
    from tritonkit.ops.collectives import plan
    from tritonkit.ops.collectives.config import CompressConfig

    return plan.CompressedLayout.of(numel, world, CompressConfig.heuristic(numel))


def sec_kernels(rank, world, device, smoke):
    """One GPU (rank 0 only times; others wait at the next barrier)."""
    from tritonkit.ops._core.device import interpreter_enabled
    from tritonkit.ops._core.layout import cdiv
    from tritonkit.ops.collectives import kernels as K
    from tritonkit.ops.collectives import plan
    from tritonkit.ops.collectives.config import CompressConfig
    from tritonkit.ops.quant.config import get_format

    if rank != 0:
        return {}
    n = (1 << 14) if smoke else (1 << 26)
    cfg = CompressConfig.heuristic(n)
    fmt = get_format(torch.int8)
    qmeta = {"QMAX": fmt.qmax, "IS_FLOAT": False, "MANT": 0, "EMIN": 0}
    lay = plan.CompressedLayout.of(n, world, cfg)
    x = torch.randn(n, device=device)
    res = torch.zeros(lay.padded, device=device)
    send = torch.empty((world, lay.chunk_bytes), dtype=torch.uint8, device=device)
    sq, ss = plan._views(send, lay, torch.int8)
    bpp = cfg.blocks_per_program
    nb = world * lay.blocks_per_shard
    em = interpreter_enabled()

    def quant():
        K._ef_quantize_kernel[(cdiv(nb, bpp),)](
            x, res, sq, ss, n, nb, lay.blocks_per_shard, sq.stride(0), ss.stride(0), **qmeta,
            B=lay.block, BLOCK_G=bpp, HAS_RES=True, EMULATE=em, num_warps=cfg.num_warps)  # fmt: skip

    mine = torch.empty(lay.chunk_bytes, dtype=torch.uint8, device=device)
    mq, ms = plan._views(mine, lay, torch.int8)
    sres = torch.zeros(lay.shard, device=device)

    reduce_bpp, reduce_warps = cfg.reduce_launch  # the plan's launch shape

    def dar():
        K._dequant_acc_requant_kernel[(cdiv(lay.blocks_per_shard, reduce_bpp),)](
            sq, ss, mq, ms, sres, lay.blocks_per_shard, sq.stride(0), ss.stride(0), 1.0,
            WORLD=world, **qmeta, B=lay.block, BLOCK_G=reduce_bpp, HAS_RES=True, EMULATE=em,
            num_warps=reduce_warps)  # fmt: skip

    def timed(fn, reps=20):
        for _ in range(3):
            fn()
        if device.type != "cuda":
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
        ts = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) / 1e3)
        return statistics.median(ts)

    bytes_q = (
        4 * n + 4 * lay.padded + 4 * lay.padded + lay.padded + 4 * nb
    )  # x, res r/w, codes, scales
    bytes_d = lay.padded + 4 * nb + 4 * lay.shard * 2 + lay.shard + 4 * lay.blocks_per_shard
    t_q, t_d = timed(quant), timed(dar)
    rows = {}
    for name, t, nbytes in (("ef_quantize", t_q, bytes_q), ("dequant_acc_requant", t_d, bytes_d)):
        src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device)
        t_c = timed(lambda: src.clone())
        rows[name] = {
            "bytes": nbytes,
            "GBs": nbytes / t / 1e9,
            "clone_GBs": 2 * (nbytes // 2) / t_c / 1e9,
        }
        rows[name]["fraction_of_copy"] = rows[name]["GBs"] / rows[name]["clone_GBs"]
        log(
            rank,
            f"kernel {name}: {rows[name]['GBs']:.0f} GB/s, clone {rows[name]['clone_GBs']:.0f} GB/s",
        )
    # The dequantize-accumulate-requantize kernel's launch shapes (the heuristic's is above).
    sweep = []
    for block_elems in (2048, 4096, 8192):
        for warps in (2, 4, 8):
            g_per = max(1, block_elems // lay.block)

            def dar_shape():
                K._dequant_acc_requant_kernel[(cdiv(lay.blocks_per_shard, g_per),)](
                    sq, ss, mq, ms, sres, lay.blocks_per_shard, sq.stride(0), ss.stride(0), 1.0,
                    WORLD=world, **qmeta, B=lay.block, BLOCK_G=g_per, HAS_RES=True, EMULATE=em,
                    num_warps=warps)  # fmt: skip

            t = timed(dar_shape)
            sweep.append({"block_elems": block_elems, "num_warps": warps, "GBs": bytes_d / t / 1e9,
                          "fraction_of_copy": bytes_d / t / 1e9 / rows["dequant_acc_requant"]["clone_GBs"]})  # fmt: skip
    log(rank, f"dequant_acc_requant shapes: {max(r['fraction_of_copy'] for r in sweep):.3f} best")
    return {
        "rows": rows,
        "dequant_acc_requant_shapes": sweep,
        "config": {
            "block_elems": cfg.block_elems,
            "num_warps": cfg.num_warps,
            "reduce_blocks_per_program": reduce_bpp,
            "reduce_num_warps": reduce_warps,
        },
        "formula": "GB/s = bytes read + written / time; clone: 2 x bytes / time",
    }


def sec_bench_comm(rank, world, device, smoke):
    hi = (64 << 10) if smoke else (1 << 30)
    left = BUDGET_S - (time.perf_counter() - T0) - 12  # leave the ddp section its share
    sizes = bc.sizes_between(1 << 10, hi)
    sizes = sizes if left > 150 else sizes[::2]  # 1K, 4K, ..., 1G when time is short
    paths = [p for p in bc.PATHS if p != "symm" or SYMM["ok"]]
    rows = bc.bench_comm(
        sizes, paths=paths, device=device, reps=2 if smoke else 3, budget_s=max(5.0, left)
    )
    if rank == 0:
        bc.write(rows, OUT, device)
    return {"rows": rows}


def sec_ddp(rank, world, device, smoke):
    steps = 6 if smoke else 60
    out = {}
    for name, dtype in (("uncompressed", None), ("int8", torch.int8), ("int8_a2a", torch.int8)):
        # int8_a2a: the same hook on torch.distributed's exchanges (symmetric memory off)
        os.environ["TRITONKIT_DIST_SYMM"] = "0" if name == "int8_a2a" else "1"
        try:
            loss, state = train_lm(device, steps, dtype, small=smoke)
        finally:
            os.environ["TRITONKIT_DIST_SYMM"] = "1" if SYMM["ok"] else "0"
        out[name] = {"final_loss": loss, "bytes_sent": state.bytes_sent,
                     "bytes_uncompressed": state.bytes_uncompressed}  # fmt: skip
    out["loss_rel_diff"] = (
        abs(out["int8"]["final_loss"] - out["uncompressed"]["final_loss"])
        / out["uncompressed"]["final_loss"]
    )
    out["bytes_ratio"] = out["uncompressed"]["bytes_sent"] / max(1, out["int8"]["bytes_sent"])
    log(rank, f"ddp: loss diff {out['loss_rel_diff']:.4f}, bytes ratio {out['bytes_ratio']:.2f}")
    return out


def train_lm(device, steps, dtype, small=False):
    """A small language model on a fixed synthetic corpus (a noisy bigram process), DDP."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    vocab, dim = (64, 32) if small else (512, 256)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Embedding(vocab, dim),
        torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim),
        torch.nn.Linear(dim, vocab),
    ).to(device)  # fmt: skip
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=1)
    state = td.CompressionState(dtype=dtype)
    ddp.register_comm_hook(state, td.compressed_allreduce_hook)
    opt = torch.optim.Adam(ddp.parameters(), lr=3e-3)
    g = torch.Generator(device="cpu").manual_seed(1 + dist.get_rank())
    nxt = torch.randint(0, vocab, (vocab,), generator=torch.Generator().manual_seed(5))
    loss = torch.tensor(0.0)
    for _ in range(steps):
        cur = torch.randint(0, vocab, (256,), generator=g)
        noise = torch.rand(256, generator=g) < 0.1
        tgt = torch.where(noise, torch.randint(0, vocab, (256,), generator=g), nxt[cur])
        loss = torch.nn.functional.cross_entropy(ddp(cur.to(device)), tgt.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
    final = loss.detach().clone()
    dist.all_reduce(final)
    return float(final.item()) / dist.get_world_size(), state


# By value, and the least a section needs left to start (ddp last, bench_comm trimmed to fit).
SECTIONS = [
    ("correct", sec_correct, 20),
    ("latency", sec_latency, 25),
    ("fused", sec_fused, 20),
    ("compressed", sec_compressed, 15),
    ("agmm", sec_agmm, 15),
    ("kernels", sec_kernels, 10),
    ("bench_comm", sec_bench_comm, 20),
    ("ddp", sec_ddp, 10),
]


def write_results(rank: int, world: int, device) -> None:
    if rank != 0:
        return
    RESULTS["machine"] = bc.machine_name(device)
    RESULTS["world"] = world
    RESULTS["torch"] = torch.__version__
    RESULTS["elapsed_s"] = time.perf_counter() - T0
    (OUT / f"dist_w{world}.json").write_text(json.dumps(RESULTS, indent=1, default=str) + "\n")
    lines = [f"# tritonkit.dist on {RESULTS['machine']}, world size {world}", ""]
    for name, res in RESULTS["sections"].items():
        lines.append(f"## {name}")
        lines.append("```")
        lines.append(json.dumps(res, indent=1, default=str)[:6000])
        lines.append("```")
    for name, err in RESULTS["errors"].items():
        lines.append(f"## {name}: ERROR\n```\n{err}\n```")
    (OUT / f"dist_w{world}.md").write_text("\n".join(lines) + "\n")


def main_rank(args) -> None:
    global BUDGET_S
    BUDGET_S = args.budget_s
    rank, world, device = bc.init_from_env(timeout_s=90.0)
    log(rank, f"world {world} on {bc.machine_name(device)}; torch {torch.__version__}")
    only = set(args.sections.split(",")) if args.sections else None
    RESULTS["symm_probe"] = probe_symm(rank, world, device)
    log(rank, f"symm probe: {RESULTS['symm_probe']}")
    for name, fn, share in SECTIONS:
        if only and name not in only:
            continue
        if agree_stop(device, share):
            RESULTS["sections"][name] = {"skipped": "time budget"}
            write_results(rank, world, device)
            continue
        t = time.perf_counter()
        try:
            RESULTS["sections"][name] = fn(rank, world, device, args.smoke)
        except Exception:  # recorded; the run goes on
            RESULTS["errors"][name] = traceback.format_exc()[-3000:]
            log(rank, f"{name}: ERROR\n{RESULTS['errors'][name]}")
        dist.barrier()
        log(rank, f"section {name}: {time.perf_counter() - t:.1f} s")
        write_results(rank, world, device)
    dist.barrier()
    dist.destroy_process_group()


def _spawned(rank: int, world: int, store: str, argv: list[str]) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": os.environ.get("MASTER_PORT", "29531")})  # fmt: skip
    args = parse(argv)
    global OUT
    OUT = Path(args.out)
    dist.init_process_group(
        "nccl" if torch.cuda.is_available() and not args.smoke else "gloo",
        init_method=f"file://{store}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=90),
    )  # fmt: skip
    if torch.cuda.is_available() and not args.smoke:
        torch.cuda.set_device(rank)
    main_rank(args)


def drive(args) -> int:
    """``--worlds 2,4``: one torchrun per world size in turn (world w on GPUs 0..w-1), each
    with its share of ``--budget-s`` and a hard timeout, results under $OUT/w{w}; then a
    summary of all of them ($OUT/summary.md, printed last)."""
    import subprocess

    worlds = [int(w) for w in args.worlds.split(",") if w]
    share = args.budget_s / len(worlds)
    gpus = torch.cuda.device_count() if not args.smoke else 0
    for w in worlds:
        out = OUT / f"w{w}"
        out.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        if gpus:
            if gpus < w:
                print(f"world {w}: skipped, {gpus} GPUs", flush=True)
                continue
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(w))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={w}", __file__, "--out", str(out),
               "--budget-s", str(max(30.0, share - 25.0))]  # fmt: skip
        cmd += ["--smoke"] if args.smoke else []
        cmd += ["--sections", args.sections] if args.sections else []
        t = time.perf_counter()
        with open(out / "log.txt", "w") as f:
            # A session of its own: on a timeout the ranks go with torchrun (no orphan left
            # spinning on GPUs 0 and 1 while the next world size runs).
            proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
            try:
                rc = proc.wait(timeout=share + 15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
                rc = "timeout"
        print(f"world {w}: rc {rc} in {time.perf_counter() - t:.0f} s (log {out / 'log.txt'})")
        for line in (out / "log.txt").read_text(errors="replace").splitlines():
            if line.startswith("[") or "Error" in line or "error" in line[:40]:
                print("   ", line[:300], flush=True)
    text = summary(worlds)
    (OUT / "summary.md").write_text(text)
    print(text, flush=True)
    return 0


def summary(worlds) -> str:
    """The headline numbers of every world size's results, as markdown."""
    lines = []
    for w in worlds:
        path = OUT / f"w{w}" / f"dist_w{w}.json"
        if not path.exists():
            lines.append(f"## world {w}: no results\n")
            continue
        res = json.loads(path.read_text())
        sec = res.get("sections", {})
        lines.append(f"## {res.get('machine')}, world {w} ({res.get('elapsed_s', 0):.0f} s)")
        corr = sec.get("correct", {})
        lines.append(f"correct: all_passed={corr.get('all_passed')}; errors: "
                     f"{sorted(res.get('errors', {})) or 'none'}")  # fmt: skip
        lat = sec.get("latency", {}).get("rows", [])
        if lat:
            lines += ["", "| bytes | ours (public) us | one-shot us | two-shot us | torch one_shot us"
                      " | NCCL us | NCCL / ours | torch / ours | host us: ours, torch | auto us |",
                      "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
            nan = float("nan")
            for r in lat:
                t1 = r.get("torch_one_shot_us", nan)
                host = (
                    f"{r.get('ours_host_us', nan):.1f}, {r.get('torch_one_shot_host_us', nan):.1f}"
                )
                lines.append(f"| {bc.show_size(r['bytes'])} | {r['ours_us']:.1f} | "
                             f"{r['one_shot_us']:.1f} | {r['two_shot_us']:.1f} | {t1:.1f} | "
                             f"{r['nccl_us']:.1f} | {r['nccl_us'] / r['ours_us']:.2f} | "
                             f"{t1 / r['ours_us']:.2f} | {host} | {r.get('auto_us', nan):.1f} |")  # fmt: skip
        fused = sec.get("fused", {}).get("rows", [])
        if fused:
            lines += ["", "| hidden | tokens | NCCL + add_rms_norm us | fused us | speedup |",
                      "|---|---|---|---|---|"]  # fmt: skip
            for r in fused:
                lines.append(f"| {r['hidden']} | {r['tokens']} | {r['nccl_plus_add_rms_norm_us']:.1f}"
                             f" | {r['fused_us']:.1f} | {r['speedup']:.2f} |")  # fmt: skip
        comp = sec.get("compressed", {}).get("rows", [])
        if comp:
            lines += ["", "| dtype | NCCL GB/s | symm+EF GB/s (x NCCL) | symm no EF | a2a+EF "
                      "| symm+EF, residual in input dtype |", "|---|---|---|---|---|---|"]  # fmt: skip
            for r in comp:
                cells = [f"{r[k + '_effective_algbw_GBs']:.1f} ({r[k + '_speedup']:.2f})"
                         if k + "_speedup" in r else "-"
                         for k in ("symm_ef", "symm_no_ef", "a2a_ef", "symm_ef_lowres")]  # fmt: skip
                lines.append(
                    f"| {r['dtype']} | {r['nccl_algbw_GBs']:.1f} | " + " | ".join(cells) + " |"
                )
        lines.append("")
    return "\n".join(lines) + "\n"


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "dist-results"))
    p.add_argument("--smoke", action="store_true", help="CPU, gloo, interpreter, tiny sizes")
    p.add_argument("--world", type=int, default=2, help="processes to spawn without torchrun")
    p.add_argument("--budget-s", type=float, default=230.0, help="wall seconds for all sections")
    p.add_argument(
        "--worlds", default="", help="e.g. 2,4: one torchrun per world size (a driver run)"
    )
    p.add_argument(
        "--sections",
        default="",
        help="comma-separated subset of " + ",".join(s[0] for s in SECTIONS),
    )
    return p.parse_args(argv)


OUT = Path("dist-results")

if __name__ == "__main__":
    ARGS = parse(sys.argv[1:])
    OUT = Path(ARGS.out)
    OUT.mkdir(parents=True, exist_ok=True)
    if ARGS.worlds and "RANK" not in os.environ:
        sys.exit(drive(ARGS))
    if "RANK" in os.environ:  # torchrun
        main_rank(ARGS)
    else:
        store = os.path.join(tempfile.mkdtemp(prefix="tritonkit-dist-"), "store")
        torch.multiprocessing.start_processes(
            _spawned,
            args=(ARGS.world, store, sys.argv[1:]),
            nprocs=ARGS.world,
            start_method="spawn",
        )
