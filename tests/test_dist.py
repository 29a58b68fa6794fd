"""tritonkit.dist: every collective against torch.distributed's result on spawned gloo ranks
(world size 2 and 4, many cases per spawn: a spawn costs seconds), the compressed all-reduce
within its documented bound, error feedback keeping the accumulated error bounded, the DDP
hook's training and bytes, a dead or absent rank failing the others within the timeout, the
debug mode naming the rank that differs; the symmetric-memory kernels' arithmetic and barrier
under the interpreter (local tensors stand for the peers' buffers), and on GPUs where there
are enough of them."""

import json
import os
import tempfile
import time

import pytest
import torch
import triton
import triton.language as tl

from _dist_ranks import _collectives_rank, _fault_rank
from tritonkit.ops._core import native_launch
from tritonkit.ops._core.layout import cdiv
from tritonkit.ops.collectives.kernels import epoch_barrier

from _checks import DEVICE, assert_spec_passes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _spawn(fn, world: int, *args, timeout_s: float = 240.0) -> list[dict]:
    """Run ``fn(rank, world, store, out_dir, *args)`` on ``world`` spawned ranks; each writes
    rank{r}.json. A rank that raises fails the test with its traceback; a hang is killed."""
    tmp = tempfile.mkdtemp(prefix="tk-dist-test-")
    ctx = torch.multiprocessing.start_processes(
        fn, args=(world, os.path.join(tmp, "store"), tmp, *args), nprocs=world, join=False,
        start_method="spawn",
    )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"ranks still running after {timeout_s} s")
    out = []
    for r in range(world):
        path = os.path.join(tmp, f"rank{r}.json")
        out.append(json.load(open(path)) if os.path.exists(path) else {})  # noqa: SIM115
    return out


def _native_module():
    """The C launch module (built with the C compiler Triton uses); a machine without one
    skips."""
    import shutil

    if not (os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")):
        pytest.skip("no C compiler")
    mod = native_launch.module()
    assert mod is not None, "the native launch module did not build"
    return mod


def _needs_ranks(world: int):
    """On CUDA one GPU per rank (NCCL); on the CPU, gloo."""
    short = torch.cuda.is_available() and torch.cuda.device_count() < world
    return pytest.mark.skipif(short, reason=f"needs {world} GPUs (one per rank)")


@pytest.mark.parametrize(
    "world",
    [pytest.param(w, marks=_needs_ranks(w)) for w in (2, 4)]
    + [pytest.param(8, marks=[_needs_ranks(8), pytest.mark.slow])],  # a node of 8 GPUs
)
def test_collectives_match_torch_distributed(world):
    """World 2 also trains a small model with DDP and the int8 hook (error feedback): a loss
    within 1% of uncompressed training after the same steps, with >= 3.5x fewer bytes."""
    ranks = _spawn(_collectives_rank, world)
    assert all(r.get("ok") for r in ranks)
    if world == 2:
        plain, int8 = ranks[0]["ddp"]["plain"], ranks[0]["ddp"]["int8"]
        assert plain["loss"] < 3.0  # it learned (ln 48 = 3.87 at the start)
        assert abs(int8["loss"] - plain["loss"]) <= 0.01 * plain["loss"]
        assert plain["sent"] == plain["uncompressed"]
        assert plain["sent"] >= 3.5 * int8["sent"]


@pytest.mark.interpreter  # gloo's failure modes; NCCL's watchdog aborts the process instead
def test_dead_or_absent_rank_fails_the_others_within_the_timeout():
    res = _spawn(_fault_rank, 3, timeout_s=90)
    assert "did not complete within 2 s" in res[0]["absent"] and res[0]["absent_s"] < 2.0 + 3.0
    for r in (0, 1):
        assert res[r]["dead"].startswith("tritonkit.dist.ring_all_reduce: rank"), res[r]
        assert res[r]["dead_s"] < 3.0 + 3.0


# ---- the symmetric-memory kernels under the interpreter --------------------------------------


@triton.jit
def _barrier_kernel(pad_table, epoch, RANK: tl.constexpr, WORLD: tl.constexpr, WP2: tl.constexpr):
    epoch_barrier(pad_table, tl.program_id(0), epoch, RANK, WORLD, WP2)


def _tables(tensors):
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device=DEVICE)


@pytest.mark.parametrize("world,rank", [(2, 1), (3, 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_symm_kernels_arithmetic_on_local_buffers(world, rank, dtype):
    """The peers' buffers are local tensors in the pointer table (the barrier off); the call
    uses the buffers' second half (``buf_off``) and must leave the first untouched."""
    from tritonkit.ops.collectives import kernels as K

    g = torch.Generator(device=DEVICE).manual_seed(world + rank)
    n, block, half = 333, 32, 400
    pads = _tables([torch.zeros(64 * world, dtype=torch.int32, device=DEVICE)] * world)
    x = torch.randn(n, generator=g, device=DEVICE).to(dtype)
    wp2 = 1 << (world - 1).bit_length()
    for kern in (K._one_shot_kernel, K._two_shot_kernel):
        bufs = [torch.randn(2 * half, generator=g, device=DEVICE).to(dtype) for _ in range(world)]
        first = [b[:half].clone() for b in bufs]
        # The kernel's order: ranks 0..world-1 (its own term: x) summed in float32.
        acc = torch.zeros(n, device=DEVICE)
        for p in range(world):
            acc += (x if p == rank else bufs[p][half : half + n]).float()
        full = (acc * 0.5).to(dtype)
        out = torch.full_like(x, float("nan"))
        kern[(3,)](
            x, out, _tables(bufs), pads, n, 0.5, 7, half // 16, RANK=rank, WORLD=world, WP2=wp2,
            BLOCK=block, BARRIER=False,
        )  # fmt: skip
        if kern is K._one_shot_kernel:
            expect = full
        else:  # reduces its part of each span; the rest is its own buffer (peers pushed nothing)
            expect = x.clone()
            idx = torch.arange(n, device=DEVICE)
            mine = (idx % (world * block)) // block == rank
            expect[mine] = full[mine]
            for b in bufs:  # the reduced part pushed into every peer's buffer
                assert torch.equal(b[half : half + n][mine], full[mine])
        assert torch.equal(out, expect)
        if kern is K._one_shot_kernel:
            assert torch.equal(bufs[rank][half : half + n], x)
        assert all(torch.equal(b[:half], f) for b, f in zip(bufs, first))


def test_fused_norm_kernel_on_local_buffers():
    from tritonkit.ops.collectives import kernels as K
    from tritonkit.ops.collectives.plan import add_rms_norm_reference

    world, rank, rows, hidden = 2, 0, 5, 96
    g = torch.Generator(device=DEVICE).manual_seed(1)
    bufs = [torch.randn(2 * rows * hidden, generator=g, device=DEVICE) for _ in range(world)]
    x = torch.randn(rows, hidden, generator=g, device=DEVICE)
    res = torch.randn(rows, hidden, generator=g, device=DEVICE)
    w = torch.randn(hidden, generator=g, device=DEVICE)
    out, res_out = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    pads = _tables([torch.zeros(64 * world, dtype=torch.int32, device=DEVICE)] * world)
    K._all_reduce_add_rms_norm_kernel[(2,)](
        x, res, w, out, res_out, _tables(bufs), pads, rows, hidden, 1e-6, 3, rows * hidden // 16,
        RANK=rank, WORLD=world, WP2=2, BLOCK_H=128, HAS_WEIGHT=True, BARRIER=False,
    )  # fmt: skip
    reduced = x + bufs[1][rows * hidden :].view(rows, hidden)
    y_ref, h_ref = add_rms_norm_reference(reduced, res, w, 1e-6)
    torch.testing.assert_close(res_out, h_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out, y_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.interpreter
def test_epoch_barrier_signals_every_peer_and_passes_on_later_epochs():
    """Rank 1 of 3 at epoch 5: its peers' signals already in its pad (one at epoch 5, one
    already at 6: a later barrier also counts); it writes 5 into its slot of every peer's pad
    and returns (a missed signal would spin to the limit: the test would time out)."""
    world, rank, epoch = 3, 1, 5
    pads = [torch.zeros(4 * world, dtype=torch.int32, device=DEVICE) for _ in range(world)]
    for b in range(2):
        pads[rank][b * world + 0] = epoch
        pads[rank][b * world + 2] = epoch + 1
    before = pads[rank].clone()
    _barrier_kernel[(2,)](_tables(pads), epoch, RANK=rank, WORLD=world, WP2=4)
    for p in range(world):
        for b in range(2):
            assert pads[p][b * world + rank] == (0 if p == rank else epoch)
    assert torch.equal(pads[rank], before)  # its own pad only read: nothing reset


def _fake_workspace(world, rank, numel, dtype):
    """A SymmWorkspace whose peers' buffers and pads are local tensors (the peers' signals for
    the first calls already set), and the tensors that stand behind it."""
    from tritonkit.ops.collectives import plan

    bufs = [torch.zeros(2 * numel, dtype=dtype, device=DEVICE) for _ in range(world)]
    pads = [torch.zeros(64 * world, dtype=torch.int32, device=DEVICE) for _ in range(world)]
    pads[rank].fill_(100)  # every peer already past barrier 100
    ws = plan.SymmWorkspace.__new__(plan.SymmWorkspace)
    ws.numel, ws.rank, ws.world, ws.max_programs = numel, rank, world, 64
    ws.resident_programs = 4 * 4  # the interpreter's stand-in SMs, 4 programs each
    ws.buf_table, ws.pad_table = _tables(bufs), _tables(pads)
    ws.counter = native_launch.counter(numel)
    return ws, bufs, pads


@pytest.mark.interpreter
def test_symm_all_reduce_cached_path_runs_the_kernel_without_the_setup():
    """The public function's cached path: a plan made once for the key; later calls neither
    check availability nor look anything up, alternate the buffers' halves and advance the
    epoch (written into the peer's pad by the barrier)."""
    from tritonkit import dist as td
    from tritonkit.ops._core.plan import PLANS
    from tritonkit.ops.collectives import plan
    from tritonkit.ops.collectives.config import SymmConfig

    world, rank, n = 2, 0, 100
    ws, bufs, pads = _fake_workspace(world, rank, 128, torch.float32)
    run = plan.SymmAllReduce(ws, n, SymmConfig(block=32, max_programs=2, num_warps=1), 1.0)
    key = ("collectives.symm", None, n, torch.float32, torch.empty(0, device=DEVICE).device,
           td.ReduceOp.SUM)  # fmt: skip
    PLANS.put(key, None, run)  # keyed without the Env snapshot
    try:
        g = torch.Generator(device=DEVICE).manual_seed(3)
        bufs[1].copy_(torch.randint(-8, 9, (256,), generator=g, device=DEVICE).float())

        def no_setup(*a, **k):
            raise AssertionError("the cached path ran the setup")

        orig = plan.symm_unavailable
        plan.symm_unavailable = no_setup
        try:
            for call in range(3):
                x = torch.randint(-8, 9, (n,), generator=g, device=DEVICE).float()
                half = (call % 2) * 128
                expect = x + bufs[1][half : half + n]
                td.symm_all_reduce(x)
                assert torch.equal(x, expect)
                assert torch.equal(bufs[0][half : half + n], x - bufs[1][half : half + n])
                assert pads[1][0 * world + rank] == call + 1  # program 0's signal, this epoch
                assert pads[1][1 * world + rank] == call + 1
        finally:
            plan.symm_unavailable = orig
        assert (ws.epoch, ws.calls) == (3, 3)
        if DEVICE.type == "cuda" and native_launch.module() is not None:
            # The first call through Triton's launcher, the next two from C.
            assert run.launch.native is not None and run.launch.native.runs == 2
    finally:
        PLANS.discard(key, None)


@pytest.mark.interpreter
def test_fused_norm_cached_launch_alternates_halves():
    """The fused all-reduce + add + RMSNorm through its cached launch (barrier on, the peer's
    signals preset): two calls, each summing the peer's half of its call."""
    from tritonkit.ops.collectives import plan

    world, rank, rows, hidden = 2, 1, 3, 48
    ws, bufs, pads = _fake_workspace(world, rank, 256, torch.float32)
    g = torch.Generator(device=DEVICE).manual_seed(5)
    bufs[0].copy_(torch.randn(512, generator=g, device=DEVICE))
    w = torch.randn(hidden, generator=g, device=DEVICE)
    for call in range(2):
        x = torch.randn(rows, hidden, generator=g, device=DEVICE)
        res = torch.randn(rows, hidden, generator=g, device=DEVICE)
        y, h = plan.fused_norm_launch(x, res, w, 1e-6, ws)
        half = call * 256
        peer = bufs[0][half : half + rows * hidden].view(rows, hidden)
        y_ref, h_ref = plan.add_rms_norm_reference(peer + x, res, w, 1e-6)
        torch.testing.assert_close(h, h_ref, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
        assert pads[0][rank] == call + 1  # program 0's signal in the peer's pad
    assert (ws.epoch, ws.calls) == (2, 2)


@pytest.mark.interpreter
@pytest.mark.parametrize("world,rank", [(4, 2), (3, 0), (4, 0)])
@pytest.mark.parametrize(
    "rows,hidden,programs,dtype",
    [(1, 64, 64, torch.float32), (3, 128, 2, torch.float32), (8, 64, 3, torch.float32),
     (8, 128, 64, torch.bfloat16), (3, 64, 2, torch.bfloat16)],
)  # fmt: skip
def test_fused_norm_cached_launch_beyond_two_ranks(world, rank, rows, hidden, programs, dtype):
    """The fused kernel at world sizes above 2, through the cached launch (barrier on, the
    peers' signals preset), more rows than programs or not, two calls (both halves): h is the
    sum over every rank plus the residual, y its RMSNorm, against float64; in bfloat16 h is
    bit for bit the ranks' float32 sum in rank order rounded once (what gpu_dist checks on
    GPUs: NCCL's bf16 ring rounds after every hop, so it differs from 3 ranks on). The peers'
    buffers are read, never written; the own half holds x; every program signals every peer."""
    from tritonkit.ops.collectives import plan

    numel = 1024
    ws, bufs, pads = _fake_workspace(world, rank, numel, dtype)
    ws.max_programs = programs
    g = torch.Generator(device=DEVICE).manual_seed(10 * world + rank + rows)
    for p in range(world):
        if p != rank:
            bufs[p].copy_(torch.randn(2 * numel, generator=g, device=DEVICE).to(dtype))
    peers_before = [b.clone() for b in bufs]
    w = torch.randn(hidden, generator=g, device=DEVICE).to(dtype)
    for call in range(2):
        x = torch.randn(rows, hidden, generator=g, device=DEVICE).to(dtype)
        res = torch.randn(rows, hidden, generator=g, device=DEVICE).to(dtype)
        y, h = plan.fused_norm_launch(x, res, w, 1e-6, ws)
        half = call * numel
        parts = [x if p == rank else bufs[p][half : half + rows * hidden].view(rows, hidden)
                 for p in range(world)]  # fmt: skip
        h64 = sum(part.double() for part in parts) + res.double()
        y64 = h64 * torch.rsqrt(h64.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
        if dtype == torch.float32:
            torch.testing.assert_close(h.double(), h64, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(y.double(), y64, rtol=1e-4, atol=1e-4)
        else:
            acc = torch.zeros(rows, hidden, device=DEVICE)
            for part in parts:
                acc += part.float()
            y_ref, h_ref = plan.add_rms_norm_reference(acc.to(dtype), res, w, 1e-6)
            assert torch.equal(h, h_ref)
            torch.testing.assert_close(y.float(), y_ref.float(), rtol=2**-7, atol=2**-7)
            eps = torch.finfo(dtype).eps  # two roundings: the sum's and h's
            assert ((h.double() - h64).abs() <= eps * (acc.abs().double() + h64.abs())).all()
        assert torch.equal(bufs[rank][half : half + rows * hidden].view(rows, hidden), x)
        for p in range(world):
            if p != rank:
                assert torch.equal(bufs[p], peers_before[p])
                for b in range(min(rows, programs)):
                    assert pads[p][b * world + rank] == call + 1
    assert (ws.epoch, ws.calls) == (2, 2)


@pytest.mark.parametrize("kind", ["python", "c"])
def test_symm_workspace_epochs_wrap_as_int32(kind):
    """The Python counter and the C one (what native launches advance) agree."""
    from tritonkit.ops.collectives import plan

    make = native_launch.PyCounter if kind == "python" else _native_module().Counter
    ws = plan.SymmWorkspace.__new__(plan.SymmWorkspace)
    ws.counter = make(10, (1 << 31) - 2, 0)
    assert ws.advance(2) == ((1 << 31) - 1, 0)  # barriers 2^31 - 1 and 2^31
    assert ws.advance(1) == (-(1 << 31) + 1, 10)  # 2^31 + 1, as the int32 the pads hold
    ws.counter.epoch = (1 << 32) - 1
    assert ws.advance(1) == (0, 0)  # 2^32 wraps to 0
    assert (ws.epoch, ws.calls) == (0, 3)


def test_native_launch_packs_each_call_as_the_c_launcher_does(monkeypatch):
    """The C launch of a symmetric-memory kernel, its driver replaced by a recorder: each call
    passes the tensors' data pointers, the fixed arguments in their widths (tables, ints, float
    bits), the shared counter's epoch and half offset in 16s, null scratch pointers; a tensor
    of another alignment, or another count of tensors, is refused with the counter untouched."""
    import struct
    from types import SimpleNamespace

    from tritonkit.ops._core import internals

    mod = _native_module()
    monkeypatch.setattr(internals, "triton_driver_is_cuda", lambda: True)
    monkeypatch.setattr(internals, "cuda_raw_stream", lambda device: 0)
    monkeypatch.setattr(mod, "current_context", lambda: 77)
    # (x_ptr, out_ptr, buf_table, pad_table, n, alpha, epoch, buf_off, RANK, BLOCK)
    types = ("*fp32", "*fp32", "*i64", "*i64", "i32", "fp32", "i32", "i64", "constexpr",
             "constexpr")  # fmt: skip
    entry = SimpleNamespace(function=0xABC, block=128, shared=1024, scratch=0, coop=False,
                            pdl=False, types=types)  # fmt: skip
    x, out = torch.randn(100), torch.empty(100)  # host: the driver is a recorder here
    counter = mod.Counter(64)
    values = [x, out, 0x1000, 0x2000, 100, 0.5, 0, 0, 1, 256]
    launch = native_launch.make(entry, (3,), values, (0, 1), (x, out), (6, 7), counter, 2, 0)
    assert launch is not None
    seen = []
    mod.set_test_launcher(lambda *a: seen.append(a))
    try:
        for _ in range(3):
            assert launch.run((x, out)) is True
        odd = torch.empty(101)[1:]  # host: 4 bytes past an aligned start
        assert launch.run((odd, out)) is False
        assert launch.run((x,)) is False
    finally:
        mod.set_test_launcher(None)
    assert (counter.epoch, counter.calls, launch.runs) == (6, 3, 3)
    alpha = struct.unpack("<I", struct.pack("<f", 0.5))[0]
    for call, (epoch, half) in enumerate([(1, 0), (3, 64), (5, 0)]):
        cells = [x.data_ptr(), out.data_ptr(), 0x1000, 0x2000, 100, alpha, epoch, half // 16, 0, 0]
        assert seen[call] == (0xABC, (3, 1, 1), 128, 1024, cells)
    # What the C launch does not pack: Triton's launcher keeps those.
    assert native_launch.make(entry, (3,), values, (0, 1), (x, out), (6, 7),
                              native_launch.PyCounter(64), 2, 0) is None  # fmt: skip
    scratch = SimpleNamespace(**{**vars(entry), "scratch": 256})
    made = native_launch.make(scratch, (3,), values, (0, 1), (x, out), (6, 7), counter, 2, 0)
    assert made is None


def test_all_reduce_auto_remembers_a_symmetric_memory_choice(monkeypatch):
    """algorithm="auto": the first call of a key chooses (and runs) the symmetric-memory path,
    later calls launch its plan at once; a changed TRITONKIT_DIST_SYMM is another key; a choice
    of NCCL is remembered as well."""
    from types import SimpleNamespace

    from tritonkit.ops._core.internals import environ_get
    from tritonkit.ops._core.plan import PLANS
    from tritonkit.ops.collectives import function as F

    x = torch.ones(10)  # host: the paths it chooses are stand-ins
    launched, calls = [], []

    class Launch:
        def fast(self, tensors):
            launched.append(tensors[0])
            return True

    run = SimpleNamespace(launch=Launch())
    symm_key = ("collectives.symm", None, 10, x.dtype, x.device, F.ReduceOp.SUM)

    def auto_key():
        return ("collectives.auto", *symm_key[1:], environ_get("TRITONKIT_DIST_SYMM"))

    monkeypatch.setattr(F, "_auto_algorithm", lambda *a: calls.append("choose") or "symm")
    monkeypatch.setattr(
        F, "symm_all_reduce", lambda *a, **k: calls.append("symm") or PLANS.put(symm_key, None, run)
    )
    keys = [auto_key()]
    try:
        F.all_reduce(x, algorithm="auto")
        F.all_reduce(x, algorithm="auto")
        assert calls == ["choose", "symm"] and len(launched) == 1
        monkeypatch.setenv("TRITONKIT_DIST_SYMM", "0")
        keys.append(auto_key())
        F.all_reduce(x, algorithm="auto")
        assert calls == ["choose", "symm", "choose", "symm"]
        # A choice of NCCL is remembered too: the next call goes to it without choosing.
        monkeypatch.setattr(F, "_auto_algorithm", lambda *a: calls.append("choose") or "nccl")
        monkeypatch.setattr(F, "_run", lambda what, *a: calls.append(what))
        x = torch.ones(11)  # host: as above
        keys.append(symm_key)
        symm_key = ("collectives.symm", None, 11, x.dtype, x.device, F.ReduceOp.SUM)
        keys.append(auto_key())
        calls.clear()
        F.all_reduce(x, algorithm="auto")
        F.all_reduce(x, algorithm="auto")
        assert calls == ["choose", "all_reduce", "all_reduce"]
    finally:
        for k in (symm_key, *keys):
            PLANS.discard(k, None)


@pytest.mark.interpreter
def test_cached_launch_takes_the_native_launch_where_it_applies():
    """A cached launch whose C launch refuses a call runs it through Triton's launcher with the
    same counter; one that accepts launches nothing else."""
    from tritonkit.ops.collectives import plan
    from tritonkit.ops.collectives.config import SymmConfig

    class Native:
        def __init__(self, accept):
            self.accept, self.calls = accept, 0

        def run(self, tensors):
            self.calls += 1
            if self.accept:
                ws.advance(1)  # what the C launch does to the shared counter
            return self.accept

    ws, bufs, _ = _fake_workspace(2, 0, 128, torch.float32)
    run = plan.SymmAllReduce(ws, 100, SymmConfig(block=32, max_programs=2, num_warps=1), 1.0)
    bufs[1].fill_(1.0)
    x = torch.zeros(100, device=DEVICE)
    run.launch.native = Native(accept=True)
    run(x, x)
    assert torch.equal(x, torch.zeros(100, device=DEVICE))  # nothing ran but the stand-in
    run.launch.native = Native(accept=False)
    run(x, x)  # the second call: the second half, which the peer filled too
    assert run.launch.native.calls == 1 and torch.equal(x, torch.ones(100, device=DEVICE))
    assert (ws.epoch, ws.calls) == (2, 2)


@pytest.mark.parametrize(
    "world,res_dtype", [(2, torch.float32), (3, torch.float32), (2, torch.bfloat16)]
)
def test_symm_compressed_kernels_match_the_exchange_path(world, res_dtype):
    """The compressed all-reduce on symmetric memory, its ranks simulated in turn on local
    buffers (barriers off), phase by phase: the chunks each rank pushes, the reduced shard
    and the requantization residual, and the output of every rank equal the all-to-all /
    all-gather path's kernels on the same data, bit for bit; every rank gets the same output."""
    from tritonkit.ops.collectives import kernels as K
    from tritonkit.ops.collectives import plan
    from tritonkit.ops.collectives.config import CompressConfig
    from tritonkit.ops.quant.plan import dequantize_2d

    g = torch.Generator(device=DEVICE).manual_seed(world)
    n, cfg = 1000, CompressConfig(block=64, block_elems=128)
    lay = plan.CompressedLayout.of(n, world, cfg, align=16)
    assert lay.chunk_bytes % 16 == 0 and lay.chunk_bytes >= lay.payload_bytes
    nbytes, red_off = plan.symm_compress_layout(lay)
    # The call uses the buffers' second half (buf_off): the first must stay untouched.
    half = cdiv(nbytes, 16) * 16
    fulls = [torch.zeros(2 * half, dtype=torch.uint8, device=DEVICE) for _ in range(world)]
    bufs = [f[half:] for f in fulls]
    table = _tables(fulls)
    xs = [torch.randn(n, generator=g, device=DEVICE) * (1 + r) for r in range(world)]
    # One error-feedback state per rank, as the public function takes it: the quantization's
    # residual, then the requantization's.
    res = [(torch.randn(lay.padded + lay.shard, generator=g, device=DEVICE) * 0.01).to(res_dtype)
           for _ in range(world)]  # fmt: skip
    wres = [r[: lay.padded] for r in res]
    sres = [r[lay.padded :] for r in res]
    wres_ref = [r.clone() for r in wres]
    sres_ref = [r.clone() for r in sres]
    exact = (sum(xs) + sum(w[:n].float() for w in wres)) / world  # before the updates
    bpp, alpha, qmax = cfg.blocks_per_program, 1.0 / world, 127
    tiles = cdiv(lay.blocks_per_shard, bpp)
    sent = []

    def phase(r, bit, x=None, out=None):  # one phase of rank r's kernel (the barriers off)
        K._symm_compressed_kernel[(2,)](
            x, out, res[r], table, table, n, lay.blocks_per_shard, lay.chunk_bytes,
            alpha, 1, half // 16, RANK=r, WORLD=world, WP2=4, QMAX=qmax, B=lay.block,
            BLOCK_G=bpp, HAS_RES=True, EMULATE=True, BARRIER=False, PHASES=bit,
        )  # fmt: skip

    for r in range(world):
        phase(r, 1, x=xs[r])
        wire = torch.full((world, lay.chunk_bytes), 0x55, dtype=torch.uint8, device=DEVICE)
        plan.quantize_chunks(xs[r], wres_ref[r], wire, lay, cfg)
        assert torch.equal(wres[r], wres_ref[r])
        sent.append(wire)
    pay = lay.payload_bytes  # the padding is neither written nor read
    for c in range(world):  # rank c's incoming slot r holds rank r's chunk c
        for r in range(world):
            got = bufs[c][r * lay.chunk_bytes : r * lay.chunk_bytes + pay]
            assert torch.equal(got, sent[r][c, :pay]), (c, r)
    for r in range(world):
        phase(r, 2)
        # the exchange path: rank r receives chunk r of every rank
        recv = torch.stack([sent[s][r] for s in range(world)])
        mine = torch.full((lay.chunk_bytes,), 0x55, dtype=torch.uint8, device=DEVICE)
        rq, rs = plan._views(recv, lay, torch.int8)
        mq, ms = plan._views(mine, lay, torch.int8)
        K._dequant_acc_requant_kernel[(tiles,)](
            rq, rs, mq, ms, sres_ref[r], lay.blocks_per_shard, rq.stride(0), rs.stride(0), alpha,
            WORLD=world, QMAX=qmax, IS_FLOAT=False, MANT=0, EMIN=0, B=lay.block, BLOCK_G=bpp,
            HAS_RES=True, EMULATE=True,
        )  # fmt: skip
        slot = red_off + r * lay.chunk_bytes
        for c in range(world):  # pushed into every rank's reduced slot r
            assert torch.equal(bufs[c][slot : slot + pay], mine[:pay]), (r, c)
        assert torch.equal(sres[r], sres_ref[r])
    gathered = bufs[0][red_off:].view(world, lay.chunk_bytes)
    gq, gs = plan._views(gathered, lay, torch.int8)
    ref = torch.empty((world, lay.shard), device=DEVICE)
    dequantize_2d(gq, gs, None, ref, 1, lay.block, False, stride_sr=gs.stride(0))
    for r in range(world):
        out = torch.full((n,), float("nan"), device=DEVICE)
        phase(r, 4, out=out)
        assert torch.equal(out, ref.view(-1)[:n])
    assert (ref.view(-1)[:n] - exact).abs().max() < 0.1
    assert all(not f[:half].any() for f in fulls)


@pytest.mark.parametrize("has_res", [False, True])
def test_symm_compressed_one_launch_in_place(has_res):
    """All three phases in one launch (one rank: its barriers have no peer to wait for), the
    output written over the input, two calls in a row through the cached plan: the second
    uses the other half of the buffer, and both equal the exchange path's arithmetic (at one
    rank: quantize, dequantize-requantize, dequantize)."""
    from tritonkit.ops.collectives import plan
    from tritonkit.ops.collectives.config import CompressConfig

    n, cfg = 700, CompressConfig(block=64, block_elems=128)
    lay = plan.CompressedLayout.of(n, 1, cfg, align=16)
    nbytes, _ = plan.symm_compress_layout(lay)
    half = cdiv(nbytes, 16) * 16
    ws, _, pads = _fake_workspace(1, 0, half, torch.uint8)
    pads[0].zero_()
    run = plan.CompressedSymm(ws, n, cfg, has_res, average=False)
    g = torch.Generator(device=DEVICE).manual_seed(5)
    for call in range(2):
        x = torch.randn(n, generator=g, device=DEVICE).to(torch.bfloat16)
        res = torch.randn(lay.padded + lay.shard, generator=g, device=DEVICE) * 0.01
        res = res if has_res else None
        # the reference: the exchange path's kernels on one rank
        wire = torch.empty((1, lay.chunk_bytes), dtype=torch.uint8, device=DEVICE)
        wres_ref = None if res is None else res[: lay.padded].clone()
        sres_ref = None if res is None else res[lay.padded :].clone()
        plan.quantize_chunks(x, wres_ref, wire, lay, cfg)
        expect = _exchange_reference(wire, lay, cfg, sres_ref, n)
        sent = run(x, x, res)
        assert sent == lay.wire_bytes()
        assert torch.equal(x, expect.to(torch.bfloat16)), call
        if has_res:
            assert torch.equal(res, torch.cat([wres_ref, sres_ref]))
        assert ws.calls == call + 1


def test_compressed_all_reduce_cached_path_runs_one_launch_without_the_setup():
    """The public function's cached path for the compressed all-reduce: a call whose key
    (shape, dtypes, op, codes, block, algorithm, residual's dtype and size) has a plan runs its
    one launch with no check of availability or arguments, and updates the residual."""
    from tritonkit import dist as td
    from tritonkit.ops._core.plan import PLANS, current_env
    from tritonkit.ops.collectives import plan
    from tritonkit.ops.collectives.config import CompressConfig

    n, cfg = 300, CompressConfig(block=64, block_elems=128)
    lay = plan.CompressedLayout.of(n, 1, cfg, align=16)
    nbytes, _ = plan.symm_compress_layout(lay)
    ws, _, pads = _fake_workspace(1, 0, cdiv(nbytes, 16) * 16, torch.uint8)
    pads[0].zero_()
    run = plan.CompressedSymm(ws, n, cfg, True, average=False)
    res = torch.zeros(lay.padded + lay.shard, device=DEVICE)
    key = ("collectives.compressed", None, n, torch.float32, res.device,
           td.ReduceOp.SUM, torch.int8, None, "auto", (res.dtype, res.numel()))  # fmt: skip
    PLANS.put(key, current_env(), run)

    def no_setup(*a, **k):
        raise AssertionError("the cached path ran the setup")

    orig = plan.symm_unavailable, plan.CompressedLayout.of
    plan.symm_unavailable = plan.CompressedLayout.of = no_setup
    try:
        g = torch.Generator(device=DEVICE).manual_seed(9)
        for call in range(2):
            x = torch.randn(n, generator=g, device=DEVICE)
            wire = torch.empty((1, lay.chunk_bytes), dtype=torch.uint8, device=DEVICE)
            ref_res = res.clone()
            plan.quantize_chunks(x, ref_res[: lay.padded], wire, lay, cfg)
            expect = _exchange_reference(wire, lay, cfg, ref_res[lay.padded :], n)
            sent = td.compressed_all_reduce(x, residual=res)
            assert sent == lay.wire_bytes() and torch.equal(x, expect), call
            assert torch.equal(res, ref_res) and res.abs().max() > 0
        assert (ws.epoch, ws.calls) == (4, 2)
    finally:
        plan.symm_unavailable, plan.CompressedLayout.of = orig
        PLANS.discard(key, current_env())


def test_symm_compressed_half_offset_past_int32():
    """A workspace half of 2 GB (a 1 GB message's compressed buffers): the call in the second
    half adds 2^31 bytes to the buffer's address, which an int32 offset would wrap to a
    negative one (found on 2 x H200 after a 1 GB benchmark: NaN in the next training run). The
    table holds the address 2^31 bytes before a real buffer, so only a 64-bit offset lands."""
    from tritonkit.ops.collectives import plan
    from tritonkit.ops.collectives.config import CompressConfig

    n, cfg = 300, CompressConfig(block=64, block_elems=128)
    lay = plan.CompressedLayout.of(n, 1, cfg, align=16)
    nbytes, _ = plan.symm_compress_layout(lay)
    ws, bufs, pads = _fake_workspace(1, 0, cdiv(nbytes, 16) * 16, torch.uint8)
    pads[0].zero_()
    ws.numel = ws.counter.numel = 1 << 31  # this call: the second half, 2^31 bytes in
    ws.counter.calls = 1
    ws.buf_table = _tables([bufs[0]]) - (1 << 31)
    run = plan.CompressedSymm(ws, n, cfg, False, average=False)
    x = torch.randn(n, generator=torch.Generator(device=DEVICE).manual_seed(2), device=DEVICE)
    wire = torch.empty((1, lay.chunk_bytes), dtype=torch.uint8, device=DEVICE)
    plan.quantize_chunks(x, None, wire, lay, cfg)
    expect = _exchange_reference(wire, lay, cfg, None, n)
    run(x, x, None)
    assert torch.equal(x, expect)
    assert bufs[0][: lay.payload_bytes].equal(wire[0, : lay.payload_bytes])  # slot 0, landed


def _exchange_reference(wire, lay, cfg, sres, n):
    """One rank's exchange path after its quantization: dequantize-accumulate-requantize the
    chunk, dequantize the result (float32)."""
    from tritonkit.ops.collectives import kernels as K
    from tritonkit.ops.collectives import plan
    from tritonkit.ops.quant.plan import dequantize_2d

    rq, rs = plan._views(wire, lay, torch.int8)
    mine = torch.empty((1, lay.chunk_bytes), dtype=torch.uint8, device=DEVICE)
    mq, ms = plan._views(mine, lay, torch.int8)
    bpp = cfg.blocks_per_program
    K._dequant_acc_requant_kernel[(cdiv(lay.blocks_per_shard, bpp),)](
        rq, rs, mq, ms, sres, lay.blocks_per_shard, rq.stride(0), rs.stride(0), 1.0, WORLD=1,
        QMAX=127, IS_FLOAT=False, MANT=0, EMIN=0, B=lay.block, BLOCK_G=bpp,
        HAS_RES=sres is not None, EMULATE=True,
    )  # fmt: skip
    out = torch.empty((1, lay.shard), device=DEVICE)
    dequantize_2d(mq, ms, None, out, 1, lay.block, False, stride_sr=ms.stride(0))
    return out.view(-1)[:n]


_COMPILE_SM90 = r"""
import json, os, sys
os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tritonkit.ops.collectives import kernels as K

SCALARS = {"buf_table": "i64", "pad_table": "i64", "n": "i32", "alpha": "fp32", "epoch": "i32",
           "buf_off": "i32", "n_rows": "i32", "H": "i32", "eps": "fp32", "blocks_per_shard": "i32",
           "chunk_bytes": "i32", "red_off": "i32"}
ALIGNED = ("n", "H", "blocks_per_shard", "chunk_bytes", "red_off")  # as launches specialize them
out = {}
for name, consts in json.loads(sys.argv[1]).items():
    fn = getattr(K, name.split("@")[0]).fn  # "name@tag": one kernel compiled more ways
    sig, attrs = {}, {}
    for i, arg in enumerate(fn.arg_names):
        if arg in consts:
            sig[arg] = "constexpr"
        else:
            sig[arg] = SCALARS.get(arg, "*fp32" if arg == "res_ptr" else "*bf16")
            if sig[arg].startswith("*") or arg in ALIGNED:
                attrs[(i,)] = [["tt.divisibility", 16]]
    c = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    out[name] = c.asm["ptx"]
print(json.dumps(out))
"""


@pytest.mark.interpreter  # a GPU run compiles and runs them for real
def test_symm_kernels_compile_for_sm90_with_vector_loads_and_one_acquire_reader():
    """Every symmetric-memory kernel compiles for sm_90 (without a GPU: Triton's compiler and
    ptxas); its peer loads and stores are 16-byte vectors (a pointer read from a table is
    otherwise assumed unaligned: bytes one at a time), and the barrier's waits are scalar
    acquire reads (their value reaches every thread) while its signals are exchanges."""
    import subprocess
    import sys

    base = {"RANK": 0, "WORLD": 2, "WP2": 2, "BARRIER": True}
    kernels = {
        "_one_shot_kernel": {**base, "BLOCK": 1024},
        "_two_shot_kernel": {**base, "BLOCK": 1024},
        "_all_reduce_add_rms_norm_kernel": {**base, "BLOCK_H": 4096, "HAS_WEIGHT": True},
        # beyond 2 ranks: 4, and 3 (a barrier wider than the world)
        "_all_reduce_add_rms_norm_kernel@w4": {
            **base,
            "RANK": 2,
            "WORLD": 4,
            "WP2": 4,
            "BLOCK_H": 8192,
            "HAS_WEIGHT": True,
        },
        "_all_reduce_add_rms_norm_kernel@w3": {
            **base,
            "RANK": 1,
            "WORLD": 3,
            "WP2": 4,
            "BLOCK_H": 4096,
            "HAS_WEIGHT": False,
        },
        "_symm_compressed_kernel@push": {
            **base,
            "QMAX": 127,
            "B": 256,
            "BLOCK_G": 16,
            "HAS_RES": True,
            "EMULATE": False,
            "PHASES": 7,
        },
    }
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.join(ROOT, "src")
    run = subprocess.run(
        [sys.executable, "-c", _COMPILE_SM90, json.dumps(kernels)], env=env,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if run.returncode != 0 and "ptxas" in run.stderr.lower() and "not found" in run.stderr:
        pytest.skip("no ptxas")
    assert run.returncode == 0, run.stderr[-3000:]
    ptx = json.loads(run.stdout.strip().splitlines()[-1])
    for name, text in ptx.items():
        scalar = [ln for ln in text.splitlines() if "ld.global.b16" in ln or "ld.global.b8" in ln]
        assert not scalar, (name, scalar[:3])
        assert "ld.global.v4.b32" in text or "ld.global.cg.v4.b32" in text, name
        if "push" in name:  # its stores into the peers' buffers: 16-byte vectors too
            assert "st.global.v4.b32" in text, name
        if kernels[name].get("BARRIER"):
            assert "atom.global.sys.release.exch.b32" in text, name
            assert "ld.global.sys.acquire.b32" in text, name


def test_quant_eps_agrees_with_core():
    from tritonkit.ops._core.quant_codes import EPS
    from tritonkit.ops.quant.config import EPS as FORMAT_EPS

    assert EPS == FORMAT_EPS


def test_shipped_crossover_rows_read_as_a_gpu_reads_them():
    """The symmetric-memory crossover measured on the GPUs (tuned/<gpu>/collectives.json),
    looked up as ``symm_crossover`` does on that GPU (its profile in the key): H200 and H100
    at worlds 2 and 4; other worlds and dtypes have no row (NCCL)."""
    import triton

    from tritonkit import _hardware, _tuning
    from tritonkit.ops.collectives.config import SYMM_TABLE_KERNEL

    h100 = "NVIDIA H100 80GB HBM3"
    rows = {("NVIDIA H200", 2): (4 << 20, 4 << 20), ("NVIDIA H200", 4): (4 << 20, 512 << 10),
            (h100, 2): (4 << 20, 4 << 20), (h100, 4): (4 << 20, 1 << 20)}  # fmt: skip
    try:
        for (gpu, world), want in rows.items():
            _hardware.set_active(_hardware.match(gpu))
            machine = (gpu, triton.__version__)
            key = {"world_size": world, "dtype": "bfloat16"}
            cfg = _tuning.shipped_lookup(SYMM_TABLE_KERNEL, key, machine=machine)
            assert (cfg.params["max_bytes"], cfg.params["one_shot_max_bytes"]) == want, gpu
            other = {"world_size": 8, "dtype": "bfloat16"}
            assert _tuning.shipped_lookup(SYMM_TABLE_KERNEL, other, machine=machine) is None
    finally:
        _hardware.set_active(None)


def test_bad_input_names_the_argument():
    from tritonkit import dist as td

    with pytest.raises(TypeError, match="ring_all_reduce: tensor must have dtype"):
        td.ring_all_reduce(torch.zeros(3, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="all_reduce: algorithm must be one of"):
        td.all_reduce(torch.zeros(3, device=DEVICE), algorithm="tree")
    with pytest.raises(ValueError, match="async_op=True needs algorithm='nccl'"):
        td.all_reduce(torch.zeros(3, device=DEVICE), async_op=True, algorithm="ring")
    a = torch.zeros(4, 8, device=DEVICE)
    with pytest.raises(TypeError, match="all_gather_matmul: b must be a tensor of a's dtype"):
        td.all_gather_matmul(a, torch.zeros(8, 2, dtype=torch.float16, device=DEVICE))
    with pytest.raises(ValueError, match=r"a must be \(m, k\) and b \(k, n\), got \(4, 8\)"):
        td.all_gather_matmul(a, torch.zeros(7, 2, device=DEVICE))
    with pytest.raises(TypeError, match=r"all_gather_matmul: a must (be|have dtype)"):
        td.all_gather_matmul(a.int(), a)


@pytest.mark.slow
def test_ring_spec_passes_on_two_ranks():
    assert_spec_passes("ring_all_reduce", DEVICE)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (one per rank)")
def test_symm_spec_passes_on_two_gpus():
    assert_spec_passes("symm_all_reduce", DEVICE)


def test_bench_comm_sizes_bus_factors_and_table():
    from tritonkit.harness import bench_comm as bc

    assert (bc.parse_size("1K"), bc.parse_size("64MB"), bc.parse_size("1G")) == (
        1 << 10,
        64 << 20,
        1 << 30,
    )
    assert bc.sizes_between(1 << 10, 1 << 12) == [1024, 2048, 4096]
    # nccl-tests' factors: 2(n-1)/n all-reduce, (n-1)/n all-gather / reduce-scatter, 1 broadcast
    assert bc.BUS_FACTOR["all_reduce"](8) == 1.75 and bc.BUS_FACTOR["all_gather"](4) == 0.75
    assert bc.BUS_FACTOR["reduce_scatter"](2) == 0.5 and bc.BUS_FACTOR["broadcast"](8) == 1.0
    row = {"collective": "all_reduce", "path": "nccl", "bytes": 1 << 20, "world": 2,
           "time_us": 10.0, "algbw_GBs": 104.8576, "busbw_GBs": 104.8576}  # fmt: skip
    md = bc.table([row, {**row, "path": "ring", "time_us": 20.0, "busbw_GBs": 52.4}], "GPU X")
    assert "| all_reduce | 1M | 10.0 | 104.9 | 20.0 | 52.4 |" in md and "GPU X, world size 2" in md
