# ruff: noqa: E501, E731, B023 (long table rows; lambdas timed where they are made)
"""Where the symmetric-memory paths spend their time (issue 47), on 2 GPUs:

1. NVLink bandwidth of a Triton kernel that reads a peer's symmetric buffer into local memory
   (pull) or writes local memory into the peer's buffer (push), 64 MB per rank, both ranks at
   once (as in an all-reduce), swept over programs, tile bytes, warps and the load's cache
   modifier; a local copy by the same kernel for reference.
2. The barrier alone: one epoch barrier per call (1, 16, 64 programs), an empty kernel, and the
   host time per call of the public ``symm_all_reduce`` at 1 KB against its GPU time.
3. The compressed all-reduce at 256 MB bf16: GPU time of each of its three kernels (quantize,
   reduce the shard, gather), with and without error feedback, for launch shapes that differ
   in elements per program and warps.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONPATH=src \\
        torchrun --standalone --nproc-per-node 2 experiments/gpu_symm_probe.py --out $OUT

    PYTHONPATH=src python experiments/gpu_symm_probe.py --smoke   # CPU interpreter: the kernels run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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


def gpu_time(fn, reps=7, inner=10, sync=True):
    """Median seconds per call over ``reps`` runs of ``inner`` back-to-back calls."""
    import torch.distributed as dist

    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        if sync:
            dist.barrier()
            torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / 1e3 / inner)
    return statistics.median(ts)


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


def sec_barrier(rank, world, device, ws, out):
    import torch.distributed as dist

    from tritonkit import dist as td

    wp2 = 1 << (world - 1).bit_length()
    res = {}
    for programs in (1, 16, 64):
        programs = min(programs, ws.max_programs)

        def fn():
            epoch, _ = ws.advance(1)
            _barrier_only[(programs,)](
                ws.pad_table, epoch, RANK=rank, WORLD=world, WP2=wp2, num_warps=4
            )

        res[f"barrier_{programs}_us"] = gpu_time(fn, reps=9, inner=50) * 1e6
    x = torch.empty(1, device=device)
    res["empty_kernel_us"] = gpu_time(lambda: _empty[(1,)](x), reps=9, inner=50) * 1e6
    for nbytes in (1 << 10, 16 << 10, 64 << 10):
        y = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=device)
        res[f"public_{nbytes >> 10}KB_gpu_us"] = (
            gpu_time(lambda: td.symm_all_reduce(y), reps=9, inner=50) * 1e6
        )
        # Host time per call: 2,000 calls queued without a sync (the GPU runs behind).
        dist.barrier()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(2000):
            td.symm_all_reduce(y)
        host = time.perf_counter() - t
        torch.cuda.synchronize()
        res[f"public_{nbytes >> 10}KB_host_us"] = host / 2000 * 1e6
        res[f"public_{nbytes >> 10}KB_wall_us"] = (time.perf_counter() - t) / 2000 * 1e6
    out["barrier"] = res
    if rank == 0:
        print("barrier", json.dumps(res, indent=1), flush=True)


def sec_compressed(rank, world, device, out):
    from tritonkit.ops._core.device import interpreter_enabled
    from tritonkit.ops._core.layout import cdiv, next_power_of_2
    from tritonkit.ops.collectives import kernels as K
    from tritonkit.ops.collectives import plan
    from tritonkit.ops.collectives.config import CompressConfig
    from tritonkit.ops.quant.formats import get_format

    nbytes = 256 << 20
    n = nbytes // 2
    x = torch.randn(n, dtype=torch.bfloat16, device=device)
    rows = []
    for block_elems, warps in ((4096, 4), (8192, 8), (16384, 8), (4096, 8)):
        cfg = CompressConfig(block=256, block_elems=block_elems, num_warps=warps)
        lay = plan.CompressedLayout.of(n, world, cfg, align=16)
        nb, red_off = plan.symm_compress_layout(lay)
        ws = plan.workspace(None, device, torch.uint8, nb)
        for ef in (False, True):
            wres = torch.zeros(lay.padded, device=device) if ef else None
            sres = torch.zeros(lay.shard, device=device) if ef else None
            qmax = get_format(torch.int8).qmax
            bpp = cfg.blocks_per_program
            programs = max(1, min(cdiv(lay.blocks_per_shard, bpp), ws.max_programs))
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            ts = []
            for it in range(6):
                import torch.distributed as dist

                dist.barrier()
                torch.cuda.synchronize()
                epoch, half = ws.advance(2)
                region = ws.buffer[half : half + world * lay.chunk_bytes].view(
                    world, lay.chunk_bytes
                )
                ev[0].record()
                plan.quantize_chunks(x, wres, region, lay, cfg)
                ev[1].record()
                K._symm_reduce_shard_kernel[(programs,)](
                    ws.buf_table,
                    ws.pad_table,
                    sres,
                    lay.blocks_per_shard,
                    lay.chunk_bytes,
                    red_off,
                    1.0,
                    epoch,
                    half // 16,
                    RANK=rank,
                    WORLD=world,
                    WP2=next_power_of_2(world),
                    QMAX=qmax,
                    B=lay.block,
                    BLOCK_G=bpp,
                    HAS_RES=ef,
                    EMULATE=interpreter_enabled(),
                    BARRIER=True,
                    num_warps=warps,
                )
                ev[2].record()
                K._symm_gather_dequant_kernel[(programs,)](
                    x,
                    ws.buf_table,
                    ws.pad_table,
                    n,
                    lay.blocks_per_shard,
                    red_off,
                    plan._next_epoch(epoch),
                    half // 16,
                    RANK=rank,
                    WORLD=world,
                    WP2=next_power_of_2(world),
                    B=lay.block,
                    BLOCK_G=bpp,
                    BARRIER=True,
                    num_warps=warps,
                )
                ev[3].record()
                ev[3].synchronize()
                if it:
                    ts.append([ev[i].elapsed_time(ev[i + 1]) * 1e3 for i in range(3)])
            med = [statistics.median(t[i] for t in ts) for i in range(3)]
            rows.append(
                {
                    "block_elems": block_elems,
                    "warps": warps,
                    "programs": programs,
                    "ef": ef,
                    "quantize_us": med[0],
                    "reduce_us": med[1],
                    "gather_us": med[2],
                    "total_us": sum(med),
                    "effective_algbw_GBs": nbytes / sum(med) / 1e3,
                }
            )
            if rank == 0:
                print("compressed", rows[-1], flush=True)
    out["compressed"] = {"max_programs": ws.max_programs, "rows": rows}


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
