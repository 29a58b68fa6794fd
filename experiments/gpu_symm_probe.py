# ruff: noqa: E731, B023 (lambdas timed where they are made)
"""Where the symmetric-memory paths spend their time (issue 47), on 2 GPUs:

1. NVLink bandwidth of a Triton kernel that reads a peer's symmetric buffer into local memory
   (pull) or writes local memory into the peer's buffer (push), 64 MB per rank, both ranks at
   once (as in an all-reduce), swept over programs, tile bytes, warps and the load's cache
   modifier; a local copy by the same kernel for reference.
2. Small messages: the GPU duration of a barrier-only kernel (1, 64 programs) and of the
   one-shot kernels (ours and PyTorch's) from the profiler; host and GPU time per call of the
   public ``symm_all_reduce`` and of PyTorch's one-shot at 1, 16, 64 KB; an empty Triton
   launch and a torch ``add_`` for the host's speed.
3. The compressed all-reduce at 256 MB bf16, its kernel in one launch and in three (one
   phase each), without error feedback and with a bfloat16 and a float32 residual, for launch
   shapes that differ in elements per program, warps and programs; the public call; NCCL's
   all-reduce of the same tensor.
4. (``--sections shapes``) The small-message all-reduce's tile, warps and programs: the time
   per call of each shape's cached launch.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONPATH=src \\
        torchrun --standalone --nproc-per-node 2 experiments/gpu_symm_probe.py --out $OUT

    PYTHONPATH=src python experiments/gpu_symm_probe.py --smoke   # CPU interpreter: the kernels run
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tritonkit.ops.collectives.kernels import epoch_barrier  # noqa: E402


@triton.jit
def _peer_copy(table, local, n, PEER: tl.constexpr, BLOCK: tl.constexpr, CACHE: tl.constexpr,
               PUSH: tl.constexpr):  # fmt: skip
    """n int32 (a multiple of BLOCK): pull peer PEER's buffer into ``local``, or push
    ``local`` into it."""
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    addr = tl.load(table.to(tl.pointer_type(tl.uint64)) + PEER)
    peer = tl.multiple_of(addr.to(tl.pointer_type(tl.int32)), 16)
    for base in range(pid * BLOCK, n, step):
        offs = tl.multiple_of(base, BLOCK) + tl.arange(0, BLOCK)
        if PUSH:
            tl.store(peer + offs, tl.load(local + offs))
        else:
            tl.store(local + offs, tl.load(peer + offs, cache_modifier=CACHE))


@triton.jit
def _barrier_only(pad_table, epoch, RANK: tl.constexpr, WORLD: tl.constexpr, WP2: tl.constexpr):
    epoch_barrier(pad_table, tl.program_id(0), epoch, RANK, WORLD, WP2)


@triton.jit
def _empty(x):
    pass


def gpu_time(fn, reps=7, inner=10):
    """Seconds per call: the harness's timing (``bench_comm.time_call``: the median over
    ``reps`` of ``inner`` back-to-back calls between CUDA events, the slowest rank's)."""
    from tritonkit.harness import bench_comm as bc

    return bc.time_call(fn, torch.device("cuda", torch.cuda.current_device()), reps, inner)


def sec_bandwidth(rank, world, device, ws, out):
    nbytes = 64 << 20
    n = nbytes // 4
    local = torch.empty(n, dtype=torch.int32, device=device)
    peer = (rank + 1) % world
    rows = []
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    for push in (False, True):
        for cache in ("", ".cv", ".cg") if not push else ("",):
            for block in (1024, 4096):
                for warps in (4, 8):
                    for per_sm in (1, 2, 4, 8):
                        programs = sms * per_sm
                        fn = lambda: _peer_copy[(programs,)](
                            ws.buf_table,
                            local,
                            n,
                            PEER=peer,
                            BLOCK=block,
                            CACHE=cache,
                            PUSH=push,
                            num_warps=warps,
                        )
                        t = gpu_time(fn)
                        rows.append(
                            {
                                "push": push,
                                "cache": cache,
                                "block_bytes": 4 * block,
                                "warps": warps,
                                "programs": programs,
                                "GBs": nbytes / t / 1e9,
                            }
                        )
    for block, warps in ((4096, 8),):
        fn = lambda: _peer_copy[(sms * 4,)](
            ws.buf_table, local, n, PEER=rank, BLOCK=block, CACHE="", PUSH=False, num_warps=warps
        )
        t = gpu_time(fn)
        rows.append(
            {
                "local_copy": True,
                "block_bytes": 4 * block,
                "warps": warps,
                "programs": sms * 4,
                "GBs": nbytes / t / 1e9,
            }
        )
    rows.sort(key=lambda r: -r["GBs"])
    out["bandwidth"] = {
        "formula": "GB/s = 64 MB moved per rank / time (both ranks at once)",
        "rows": rows,
    }
    if rank == 0:
        for r in rows[:12]:
            print("bw", r, flush=True)


def kernel_us(fn, calls=60):
    """Mean GPU duration (us) of each CUDA kernel ``fn`` launches, by name, from the profiler."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if total and e.count:
            out[e.key[:60]] = total / e.count
    return out


def host_us(fn, calls=2000):
    """Host microseconds per call, ``calls`` queued without a sync (the GPU runs behind)."""
    import torch.distributed as dist

    dist.barrier()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t) / calls * 1e6
    torch.cuda.synchronize()
    return host


def sec_barrier(rank, world, device, ws, out):
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    from tritonkit import dist as td

    wp2 = 1 << (world - 1).bit_length()
    res = {}
    for programs in (1, 64):
        programs = min(programs, ws.max_programs)

        def fn():
            epoch, _ = ws.advance(1)
            _barrier_only[(programs,)](
                ws.pad_table, epoch, RANK=rank, WORLD=world, WP2=wp2, num_warps=4
            )

        res[f"barrier_{programs}_kernel_us"] = kernel_us(fn)
    x = torch.empty(1, device=device)
    res["empty_kernel_launch_gpu_us"] = gpu_time(lambda: _empty[(1,)](x), reps=9, inner=50) * 1e6
    res["torch_add_host_us"] = host_us(lambda: x.add_(1))
    group_name = dist.group.WORLD.group_name
    for nbytes in (1 << 10, 16 << 10, 64 << 10):
        y = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=device)
        k = f"{nbytes >> 10}KB"
        res[f"public_{k}_gpu_us"] = gpu_time(lambda: td.symm_all_reduce(y), reps=9, inner=50) * 1e6
        res[f"public_{k}_host_us"] = host_us(lambda: td.symm_all_reduce(y))
        res[f"public_{k}_kernels_us"] = kernel_us(lambda: td.symm_all_reduce(y))
        buf = symm_mem.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
        symm_mem.rendezvous(buf, group_name)
        buf.fill_(1)
        fn = lambda: torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", group_name)
        res[f"torch_one_shot_{k}_gpu_us"] = gpu_time(fn, reps=9, inner=50) * 1e6
        res[f"torch_one_shot_{k}_host_us"] = host_us(fn)
        res[f"torch_one_shot_{k}_kernels_us"] = kernel_us(fn)
    out["barrier"] = res
    if rank == 0:
        print("barrier", json.dumps(res, indent=1), flush=True)


def sec_compressed(rank, world, device, out):
    import torch.distributed as dist

    from tritonkit import dist as td
    from tritonkit.ops._core.device import interpreter_enabled
    from tritonkit.ops._core.layout import cdiv, next_power_of_2
    from tritonkit.ops.collectives import kernels as K
    from tritonkit.ops.collectives import plan
    from tritonkit.ops.collectives.config import CompressConfig

    nbytes = 256 << 20
    n = nbytes // 2
    x = torch.randn(n, dtype=torch.bfloat16, device=device)
    t_nccl = gpu_time(lambda: dist.all_reduce(x), reps=5, inner=3)
    rows = [{"nccl_us": t_nccl * 1e6, "nccl_algbw_GBs": nbytes / t_nccl / 1e9}]
    em = interpreter_enabled()
    for block_elems, warps, per_sm in ((4096, 4, 4), (4096, 4, 2), (8192, 8, 2), (2048, 4, 4)):
        cfg = CompressConfig(block=256, block_elems=block_elems, num_warps=warps)
        lay = plan.CompressedLayout.of(n, world, cfg, align=16)
        nb, _ = plan.symm_compress_layout(lay)
        ws = plan.workspace(None, device, torch.uint8, nb)
        bpp = cfg.blocks_per_program
        tiles = cdiv(lay.blocks_per_shard, bpp)
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        programs = max(1, min(tiles, ws.max_programs, per_sm * sms))
        for res_dtype in (None, torch.bfloat16, torch.float32):
            wres = (
                None
                if res_dtype is None
                else torch.zeros(lay.padded, device=device, dtype=res_dtype)
            )
            sres = (
                None
                if res_dtype is None
                else torch.zeros(lay.shard, device=device, dtype=res_dtype)
            )
            row = {
                "block_elems": block_elems,
                "warps": warps,
                "programs": programs,
                "residual": str(res_dtype),
            }
            for mode, phases in (("one_launch", (7,)), ("apart", (1, 2, 4))):

                def call():
                    epoch, half = ws.advance(2)
                    for ph in phases:
                        K._symm_compressed_kernel[(programs,)](
                            x,
                            x,
                            wres,
                            sres,
                            ws.buf_table,
                            ws.pad_table,
                            n,
                            lay.blocks_per_shard,
                            lay.chunk_bytes,
                            1.0,
                            epoch,
                            half // 16,
                            RANK=rank,
                            WORLD=world,
                            WP2=next_power_of_2(world),
                            QMAX=127,
                            B=lay.block,
                            BLOCK_G=bpp,
                            HAS_RES=wres is not None,
                            EMULATE=em,
                            BARRIER=True,
                            PHASES=ph,
                            num_warps=warps,
                        )

                t = gpu_time(call, reps=5, inner=3)
                row[f"{mode}_us"] = t * 1e6
                row[f"{mode}_vs_nccl"] = t_nccl / t
            if rank == 0:
                print("compressed", row, flush=True)
            rows.append(row)
    for res_dtype in (None, torch.bfloat16, torch.float32):
        r = (
            None
            if res_dtype is None
            else torch.zeros(td.residual_size(n, world), device=device, dtype=res_dtype)
        )
        t = gpu_time(lambda: td.compressed_all_reduce(x, residual=r), reps=5, inner=3)
        rows.append(
            {"public": True, "residual": str(res_dtype), "us": t * 1e6, "vs_nccl": t_nccl / t}
        )
        if rank == 0:
            print("compressed", rows[-1], flush=True)
    out["compressed"] = {
        "formula": "vs_nccl = NCCL all-reduce time / ours, 256 MB bf16",
        "rows": rows,
    }


def sec_shapes(rank, world, device, out):
    """The symmetric-memory all-reduce's launch shape for small messages (bf16, 1-256 KB): the
    per-call time of the cached launch (from C after its first call) over the tile, warps and
    the cap on programs; each distinct program count once per tile and warps."""
    from tritonkit.ops._core.layout import cdiv
    from tritonkit.ops.collectives import plan
    from tritonkit.ops.collectives.config import SymmConfig

    rows = []
    for nbytes in (1 << 10, 8 << 10, 32 << 10, 64 << 10, 256 << 10):
        n = nbytes // 2
        x = torch.ones(n, dtype=torch.bfloat16, device=device)
        ws = plan.workspace(None, device, torch.bfloat16, n)
        for block in (256, 1024, 4096, 16384):
            for warps in (1, 4, 8):
                seen = set()
                for cap in (1, 4, 16, 64):
                    programs = max(1, min(cdiv(n, block), cap, ws.max_programs))
                    if programs in seen:
                        continue
                    seen.add(programs)
                    cfg = SymmConfig(one_shot=True, block=block, max_programs=cap, num_warps=warps)
                    run = plan.SymmAllReduce(ws, n, cfg, 1.0)
                    t = gpu_time(lambda: run(x, x), reps=9, inner=20)
                    rows.append({"bytes": nbytes, "block": block, "warps": warps,
                                 "programs": programs, "us": t * 1e6,
                                 "native": bool(run.launch.native)})  # fmt: skip
        best = min((r for r in rows if r["bytes"] == nbytes), key=lambda r: r["us"])
        if rank == 0:
            print("shapes best", best, flush=True)
    out["shapes"] = {"formula": "us per call, back-to-back, slowest rank", "rows": rows}


def smoke() -> None:
    """The kernels under the interpreter on local buffers (no peers, no barrier)."""
    n, block = 4096, 1024
    src = torch.arange(n, dtype=torch.int32)
    table = torch.tensor([src.data_ptr()], dtype=torch.int64)
    dst = torch.zeros(n, dtype=torch.int32)
    _peer_copy[(2,)](table, dst, n, PEER=0, BLOCK=block, CACHE=".cv", PUSH=False)
    assert torch.equal(dst, src)
    dst2 = torch.arange(n, dtype=torch.int32) * 3
    _peer_copy[(3,)](table, dst2, n, PEER=0, BLOCK=block, CACHE="", PUSH=True)
    assert torch.equal(src, dst2)
    print("smoke: ok")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/symm_probe")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--sections", default="bandwidth,barrier,compressed")
    args = ap.parse_args()
    if args.smoke:
        smoke()
        return
    import torch.distributed as dist

    from tritonkit.harness import bench_comm as bc
    from tritonkit.ops.collectives import plan

    rank, world, device = bc.init_from_env(timeout_s=90.0)
    import torch.distributed._symmetric_memory as symm_mem

    out = {
        "device": torch.cuda.get_device_name(device),
        "world": world,
        "torch": torch.__version__,
        "signal_pad_bytes": getattr(symm_mem, "get_signal_pad_size", lambda: None)(),
    }
    ws = plan.workspace(None, device, torch.uint8, 64 << 20)
    out["max_programs"] = ws.max_programs
    for name in args.sections.split(","):
        t = time.perf_counter()
        try:
            if name == "bandwidth":
                sec_bandwidth(rank, world, device, ws, out)
            elif name == "barrier":
                sec_barrier(rank, world, device, ws, out)
            elif name == "compressed":
                sec_compressed(rank, world, device, out)
            elif name == "shapes":
                sec_shapes(rank, world, device, out)
        except Exception as exc:  # recorded; the next section runs
            import traceback

            out.setdefault("errors", {})[name] = traceback.format_exc()[-2000:]
            print(name, "ERROR", exc, flush=True)
        dist.barrier()
        if rank == 0:
            print(f"section {name}: {time.perf_counter() - t:.1f} s", flush=True)
    if rank == 0:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "symm_probe.json").write_text(json.dumps(out, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
