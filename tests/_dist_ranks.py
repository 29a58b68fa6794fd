"""What the spawned ranks of tests/test_dist.py run (a module of its own: each spawned process
imports it, and it imports only torch, pytest and tritonkit.dist, not the workbench, so that a
rank starts in a second or two)."""

import datetime
import json
import os
import time

import pytest
import torch
import torch.distributed as dist

# Where the ranks run: one GPU each with NCCL where there are GPUs, else the CPU with gloo (the
# same choice as _checks.DEVICE).
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


_RANK_DEVICE = [DEVICE]


def _dev() -> torch.device:
    return _RANK_DEVICE[0]


def _init(rank, world, store, timeout_s=60.0):
    if DEVICE.type == "cuda":
        torch.cuda.set_device(rank)
        _RANK_DEVICE[0] = torch.device("cuda", rank)
    dist.init_process_group(
        "nccl" if DEVICE.type == "cuda" else "gloo", init_method=f"file://{store}", rank=rank,
        world_size=world, timeout=datetime.timedelta(seconds=timeout_s),
    )  # fmt: skip


def _ints(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)  # host: CPU generator, same draws on any device
    return torch.randint(-6, 7, shape, generator=g).to(_dev(), dtype)  # host: CPU generator


def _block_amax(x: torch.Tensor, block: int) -> torch.Tensor:
    flat = x.detach().double().abs().reshape(-1)
    flat = torch.nn.functional.pad(flat, (0, (-flat.numel()) % block))
    return flat.view(-1, block).amax(1)


# ---- collectives on world 2 and 4 -------------------------------------------------------------


def _collectives_rank(rank, world, store, tmp):
    _init(rank, world, store)
    from tritonkit import dist as td

    # The whole matrix at world 2; world 4 (4 processes on the machine's cores) a cut of it.
    full = world == 2
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX]
    ops += [dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT] if full else []
    for dtype in (torch.float32, torch.float16, torch.bfloat16) if full else (torch.bfloat16,):
        for shape in ((7,), (3, 129), (0,)) if full else ((3, 129), (1,)):
            x = _ints(shape, dtype, 10 * rank + len(shape))
            for op in ops:
                if op == dist.ReduceOp.PRODUCT:
                    x = x.clamp(-2, 2)  # products of world factors stay exact
                ref = x.clone()
                dist.all_reduce(ref, op)
                for algo in ("nccl", "ring"):
                    y = x.clone()
                    td.all_reduce(y, op, algorithm=algo, timeout=30)
                    assert torch.equal(y, ref), (algo, op, shape, dtype, y, ref)
    # A non-contiguous view, reduced in place through its own strides.
    base = _ints((8, 6), torch.float32, rank)
    view, ref = base.t(), base.t().contiguous()  # NCCL takes contiguous tensors only
    dist.all_reduce(ref)
    td.ring_all_reduce(view, timeout=30)
    assert torch.equal(view, ref)
    # Random floats: the ring's order of additions, within a float32 bound of float64's sum.
    g = torch.Generator().manual_seed(100 + rank)  # host: CPU generator, same draws on any device
    xf = torch.randn(1000, generator=g).to(_dev())  # host: generator
    exact = xf.double()
    dist.all_reduce(exact)
    absum = xf.double().abs()
    dist.all_reduce(absum)
    y = xf.clone()
    td.ring_all_reduce(y)
    assert ((y.double() - exact).abs() <= world * 2.0**-24 * absum + 1e-30).all()
    # broadcast, all_gather and reduce_scatter: torch's results, through tritonkit.dist.
    x = _ints((5, 3), torch.float32, 7 + rank)
    b, b_ref = x.clone(), x.clone()
    td.broadcast(b, world - 1, timeout=30)
    dist.broadcast(b_ref, world - 1)
    assert torch.equal(b, b_ref)
    got = [torch.full_like(x, float("nan")) for _ in range(world)]
    exp = [torch.empty_like(x) for _ in range(world)]
    td.all_gather(got, x, timeout=30)
    dist.all_gather(exp, x)
    assert all(torch.equal(a, e) for a, e in zip(got, exp))
    pieces = [_ints((4, 3), torch.float32, 50 * rank + i) for i in range(world)]
    o1 = torch.full((4, 3), float("nan"), device=_dev())
    o2 = torch.empty((4, 3), device=_dev())
    td.reduce_scatter(o1, pieces, timeout=30)
    dist.reduce_scatter(o2, [p.clone() for p in pieces])
    assert torch.equal(o1, o2)
    # symm_all_reduce and the fused norm on CPU tensors: NCCL's (here gloo's) path, said once.
    y, ref = x.clone(), x.clone()
    dist.all_reduce(ref)
    if _dev().type == "cpu":
        with pytest.warns(UserWarning, match="symmetric memory needs CUDA"):
            td.symm_all_reduce(y)
    else:
        td.symm_all_reduce(y)
    assert torch.equal(y, ref)
    res, w = _ints((5, 3), torch.float32, 99), _ints((3,), torch.float32, 98)
    out, h = td.fused_all_reduce_add_rms_norm(x, res, w, 1e-6)
    hd = ref.double() + res.double()
    yd = hd * torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    assert torch.equal(h, hd.float())
    torch.testing.assert_close(out.double(), yd, rtol=1e-6, atol=1e-6)
    _compressed_cases(rank, world, td, full)
    # all_gather_matmul: the gathered shards (rank order) times b, within a float32 GEMM's
    # rounding of float64 (on GPUs: the symmetric-memory overlap; here: all_gather, matmul)
    g = torch.Generator().manual_seed(rank)  # host: CPU generator, same draws on any device
    a = torch.randn(3, 40, generator=g).to(_dev())  # host: generator
    g = torch.Generator().manual_seed(77)  # host: CPU generator, the same b on every rank
    bm = torch.randn(40, 6, generator=g).to(_dev())  # host: generator
    shards = [torch.empty_like(a) for _ in range(world)]
    dist.all_gather(shards, a)
    exact = torch.cat(shards).double() @ bm.double()
    for algo in ("auto", "nccl"):
        got = td.all_gather_matmul(a, bm, algorithm=algo, timeout=30)
        assert got.shape == (3 * world, 6)
        torch.testing.assert_close(got.double(), exact, rtol=1e-4, atol=1e-4)
    # Debug mode: the last rank passes another shape; every rank raises, naming it.
    shape = (3, 5) if rank == world - 1 else (3, 4)
    with td.debug(), pytest.raises(ValueError, match=f"rank {world - 1} passed shape \\(3, 5\\)"):
        td.all_reduce(torch.zeros(shape, device=_dev()), timeout=30)
    with td.debug():  # and agreeing ranks pass
        z = torch.ones(3, device=_dev())
        td.all_reduce(z, timeout=30)
        assert torch.equal(z, torch.full_like(z, world))
    # DDP with the int8 hook (world 2 only: one spawn less), checked by the parent.
    ddp = _ddp_train(rank, world) if full else {}
    json.dump({"ok": True, "ddp": ddp}, open(os.path.join(tmp, f"rank{rank}.json"), "w"))  # noqa: SIM115
    dist.destroy_process_group()


def _compressed_cases(rank, world, td, full):
    g = torch.Generator().manual_seed(200 + rank)  # host: CPU generator, same draws on any device
    n, block = 1000, 64
    x = (torch.randn(n, generator=g) * torch.linspace(0.1, 5.0, n)).to(_dev())  # host: generator
    exact = x.double()
    dist.all_reduce(exact)
    amax = _block_amax(x, block)
    dist.all_reduce(amax)  # sum over ranks of each block's amax
    formats = ((torch.int8, 254.0), (torch.float8_e4m3fn, 16.0)) if full else ((torch.int8, 254.0),)
    for dtype, denom in formats:
        y = torch.full_like(x, float("nan"))
        y.copy_(x)
        sent = td.compressed_all_reduce(y, dtype=dtype, block=block, timeout=30)
        # The documented bound: (sum_r amax_r + amax_sum) / denom, with
        # amax_sum <= sum_r amax_r (1 + 1/denom).
        bound = (amax * (2 + 1 / denom) / denom).repeat_interleave(block)[:n] * (1 + 1e-6)
        err = (y.double() - exact).abs()
        assert (err <= bound).all(), (dtype, (err / bound).max())
        assert err.max() > 0  # it did compress
        every = [torch.empty_like(y) for _ in range(world)]
        dist.all_gather(every, y)
        assert all(torch.equal(e, y) for e in every)  # every rank got the same values
        per_rank = (n + world - 1) // world
        shard = (per_rank + block - 1) // block * block
        assert sent == 2 * (world - 1) * (shard + 4 * shard // block)
    # AVG: the sum's values over world.
    y = x.clone()
    td.compressed_all_reduce(y, dist.ReduceOp.AVG, block=block)
    assert ((y.double() - exact / world).abs() <= bound / world * (1 + 1e-6)).all()
    if not full:
        return
    # Error feedback: the same input 8 steps; the accumulated error stays within one step's
    # bound with it, and grows with the steps without it.
    res = torch.zeros(td.residual_size(n, world, block), device=_dev())
    acc_ef = torch.zeros(n, dtype=torch.float64, device=_dev())
    acc_no = torch.zeros(n, dtype=torch.float64, device=_dev())
    for _ in range(8):
        y = x.clone()
        td.compressed_all_reduce(y, block=block, residual=res)
        acc_ef += y.double() - exact
        y = x.clone()
        td.compressed_all_reduce(y, block=block)
        acc_no += y.double() - exact
    one_step = (amax * (2 + 1 / 254) / 254).repeat_interleave(block)[:n]
    assert (acc_ef.abs() <= one_step * 1.01).all()
    assert acc_no.abs().max() > 3 * acc_ef.abs().max()
    with pytest.raises(ValueError, match="residual must be a contiguous float32 tensor"):
        td.compressed_all_reduce(x.clone(), residual=torch.zeros(3, device=_dev()))
    with pytest.raises(TypeError, match="dtype must be int8 or float8_e4m3fn"):
        td.compressed_all_reduce(x.clone(), dtype=torch.float16)
    with pytest.raises(ValueError, match="op must be SUM or AVG"):
        td.compressed_all_reduce(x.clone(), dist.ReduceOp.MAX)


# ---- DDP with the int8 hook ------------------------------------------------------------------


def _ddp_train(rank, world):
    """A small next-token model trained 12 steps with DDP, uncompressed and with the int8 hook:
    the final loss (averaged over ranks) and the bytes each hook counted."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from tritonkit import dist as td

    results = {}
    for name, dtype in (("plain", None), ("int8", torch.int8)):
        torch.manual_seed(0)
        vocab, dim = 48, 24
        model = torch.nn.Sequential(
            torch.nn.Embedding(vocab, dim), torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
            torch.nn.Linear(4 * dim, vocab),
        ).to(_dev())  # fmt: skip
        ddp = DDP(model, device_ids=[_dev().index] if _dev().type == "cuda" else None)
        state = td.register_compression(ddp, td.CompressionState(dtype=dtype))
        opt = torch.optim.Adam(ddp.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(1 + rank)  # host: CPU generator, same draws on any device
        bigram = torch.Generator().manual_seed(3)  # host: CPU generator, same draws anywhere
        nxt = torch.randint(0, vocab, (vocab,), generator=bigram)  # host: CPU generator
        for _ in range(12):
            cur = torch.randint(0, vocab, (128,), generator=g)  # host: CPU generator
            loss = torch.nn.functional.cross_entropy(ddp(cur.to(_dev())), nxt[cur].to(_dev()))
            opt.zero_grad()
            loss.backward()
            opt.step()
        final = loss.detach().clone()
        dist.all_reduce(final)
        results[name] = {"loss": final.item() / world, "sent": state.bytes_sent,
                         "uncompressed": state.bytes_uncompressed}  # fmt: skip
    return results


def _fault_rank(rank, world, store, tmp):
    _init(rank, world, store, timeout_s=8.0)
    from tritonkit import dist as td

    g01 = dist.new_group([0, 1])
    dist.barrier()
    if rank == 2:
        os._exit(0)  # dies before the collective
    out = {}
    x = torch.ones(4, device=_dev())
    if rank == 0:  # rank 1 never arrives in g01's collective
        t = time.monotonic()
        try:
            td.all_reduce(x, group=g01, timeout=2.0)
            out["absent"] = "no error"
        except td.CollectiveError as exc:
            out["absent"] = str(exc)
        out["absent_s"] = time.monotonic() - t
    t = time.monotonic()
    try:  # rank 2 is dead
        td.ring_all_reduce(x, timeout=datetime.timedelta(seconds=3))
        out["dead"] = "no error"
    except td.CollectiveError as exc:
        out["dead"] = str(exc)
    out["dead_s"] = time.monotonic() - t
    json.dump(out, open(os.path.join(tmp, f"rank{rank}.json"), "w"))  # noqa: SIM115
    os._exit(0)  # the group is broken: no orderly teardown
