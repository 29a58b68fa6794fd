"""GPU checks and timings of tritonkit's optimizers (issue 33), one run for every comparison.

    PYTHONPATH=src python3 experiments/gpu_optim.py [--quick]
    python3 experiments/gpu_optim.py --plot OUT/optim.json   # the loss-curve PNG, anywhere

Sections (each result also lands in $OUT/optim.json when OUT is set):

1. correctness on the GPU: AdamW / Adam (options) vs torch.optim over 20 steps of a small
   model (relative L2 error of the parameters), 16-bit parameters with master weights,
   non-finite gradients (raise / skip leave every bit), state_dict both ways, a CUDA-graph
   capture of a capturable step, Muon vs torch.optim.Muon (one step on identical gradients,
   20 steps of a small model), Newton-Schulz against PyTorch's bfloat16 and float64.
2. Acceptance 1: AdamW step on one 100M-element fp32 parameter, 24 x (4096 x 1024), and a
   Llama-3.2-1B-like list (147 tensors, 1.24B parameters): GPU time per step (CUDA events,
   back-to-back steps) against torch AdamW fused=True and foreach=True; GB/s at 28 B per
   parameter against a measured copy's GB/s; wall time per step in a loop (host included),
   with persistent gradients and with gradients reallocated every step; host time per call.
   tritonkit runs with nonfinite="propagate" (PyTorch's semantics, like for like), "skip" and
   "raise" (the default: a gradient read and a host sync per step). A ChunkConfig sweep first.
3. Acceptance 2: Muon on 8 x (4096 x 4096) fp32 against torch.optim.Muon, over a sweep of
   Newton-Schulz configs (tiles, the fused or tritonkit.matmul product).
4. Acceptance 4: a small transformer LM on synthetic text (an order-2 Markov source whose
   entropy is the loss floor), a few hundred steps with torch AdamW, tritonkit AdamW,
   torch Muon + AdamW and tritonkit MuonW; loss curves to $OUT/optim_loss.png (matplotlib
   if importable; else re-plot from the JSON with --plot).

Prints a table last. About 5 minutes on an H100.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

RESULTS: dict = {"checks": {}, "adamw": [], "adamw_sweep": [], "muon": [], "train": {}}
DEV = "cuda"
START = time.time()
DRY = False  # --dry-run: every section on the CPU under the Triton interpreter, tiny sizes


def dim(n: int) -> int:
    """A size: as given on the GPU; divided by 64 (at most 4096) in a dry run."""
    return min(4096, max(4, n // 64)) if DRY else n


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def log(*args) -> None:
    print(*args, flush=True)


def section(name: str):
    def wrap(fn):
        def run(*a, **k):
            log(f"\n== {name}")
            t0 = time.time()
            try:
                fn(*a, **k)
            except Exception as exc:  # one failing section must not hide the others
                RESULTS.setdefault("errors", {})[name] = traceback.format_exc()
                log(f"!! {name} failed: {type(exc).__name__}: {exc}")
                traceback.print_exc()
            log(f"   ({time.time() - t0:.0f} s)")

        return run

    return wrap


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def check(name: str, value: float, bound: float) -> None:
    ok = value <= bound
    RESULTS["checks"][name] = {"value": value, "bound": bound, "passed": ok}
    log(f"   {'ok  ' if ok else 'FAIL'} {name}: {value:.3g} (bound {bound:g})")


# ---- 1. correctness ----------------------------------------------------------------------


def mlp(seed=1, dtype=torch.float32):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256),
        torch.nn.GELU(),
        torch.nn.Linear(256, 128, bias=False),
        torch.nn.GELU(),
        torch.nn.Linear(128, 10),
    ).to(DEV, dtype)


def train(pairs, steps, seed=0):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(32, 64, device=DEV, generator=gen)
        for model, opts in pairs:
            for o in opts:
                o.zero_grad()
            model(x.to(next(model.parameters()).dtype)).float().square().mean().backward()
            for o in opts:
                o.step()


@section("correctness")
def correctness():
    from torch.optim._muon import _zeropower_via_newtonschulz

    import tritonkit.optim as tko
    from tritonkit.optim.functional import newton_schulz

    cases = [
        ("AdamW", {}),
        ("AdamW", {"weight_decay": 0.1, "amsgrad": True}),
        ("Adam", {"weight_decay": 0.05, "maximize": True}),
        ("Adam", {"betas": (0.6, 0.5)}),
    ]
    for cls, kw in cases:
        ours, ref = mlp(), mlp()
        o = getattr(tko, cls)(ours.parameters(), lr=1e-3, **kw)
        r = getattr(torch.optim, cls)(ref.parameters(), lr=1e-3, foreach=False, **kw)
        train([(ours, [o]), (ref, [r])], 20)
        err = max(rel(p, q) for p, q in zip(ours.parameters(), ref.parameters()))
        check(f"{cls} {kw} vs torch single-tensor, 20 steps", err, 1e-6)
    ours, ref = mlp(), mlp()
    o = tko.AdamW(ours.parameters(), lr=1e-3)
    r = torch.optim.AdamW(ref.parameters(), lr=1e-3, fused=True)
    train([(ours, [o]), (ref, [r])], 20)
    err = max(rel(p, q) for p, q in zip(ours.parameters(), ref.parameters()))
    check("AdamW vs torch fused=True, 20 steps", err, 1e-6)

    # 16-bit parameters with master weights follow float32 AdamW on the same gradients.
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(dim(4096), 1000, device=DEV).bfloat16())
    q = torch.nn.Parameter(p.detach().float())
    o = tko.AdamW([p], lr=1e-3, master_weights=True)
    r = torch.optim.AdamW([q], lr=1e-3, foreach=False)
    for _ in range(10):
        g = torch.randn(p.shape, device=DEV).bfloat16()
        p.grad, q.grad = g, g.float()
        o.step()
        r.step()
    check("bf16 master weights vs fp32 AdamW, 10 steps", rel(o.state[p]["master_param"], q), 1e-6)
    check("bf16 param == bf16(master)", rel(p, o.state[p]["master_param"].bfloat16()), 0.0)

    # Non-finite gradients: raise and skip leave every bit.
    for mode in ("raise", "skip"):
        model = mlp()
        o = tko.AdamW(model.parameters(), lr=1e-3, nonfinite=mode)
        train([(model, [o])], 2)
        before = [p.detach().clone() for p in model.parameters()]
        state = copy.deepcopy(o.state_dict()["state"])
        o.zero_grad()
        model(torch.randn(8, 64, device=DEV)).square().mean().backward()
        model[2].weight.grad[1, 1] = float("nan")
        raised = False
        try:
            o.step()
        except tko.NonFiniteGradError:
            raised = True
        same = all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
        now = o.state_dict()["state"]
        same &= all(torch.equal(now[i][k], v) for i, s in state.items() for k, v in s.items())
        check(
            f"nonfinite={mode}: raised={raised}, unchanged",
            float(not same or raised != (mode == "raise")),
            0.0,
        )

    # state_dict: tritonkit -> torch -> tritonkit, bit-identical next step.
    model = mlp()
    o = tko.AdamW(model.parameters(), lr=1e-3, amsgrad=True)
    train([(model, [o])], 5)
    tm, bm = copy.deepcopy(model), copy.deepcopy(model)
    t = torch.optim.AdamW(tm.parameters(), lr=1e-3, amsgrad=True, foreach=False)
    t.load_state_dict(copy.deepcopy(o.state_dict()))
    b = tko.AdamW(bm.parameters(), lr=1e-3, amsgrad=True)
    b.load_state_dict(copy.deepcopy(t.state_dict()))
    train([(model, [o]), (tm, [t]), (bm, [b])], 1, seed=3)
    check(
        "state_dict round trip via torch: next step bit-identical",
        max(rel(p, q) for p, q in zip(model.parameters(), bm.parameters())),
        0.0,
    )
    check(
        "state_dict into torch: next step vs ours",
        max(rel(q, p) for p, q in zip(model.parameters(), tm.parameters())),
        1e-6,
    )

    # CUDA graph: a capturable step (tensor lr) captured once, replayed.
    try:
        if DRY:
            raise RuntimeError("no CUDA graphs in a dry run")
        model = mlp()
        ref = copy.deepcopy(model)
        lr = torch.tensor(1e-3, device=DEV)
        o = tko.AdamW(model.parameters(), lr=lr, capturable=True, nonfinite="skip")
        r = torch.optim.AdamW(ref.parameters(), lr=1e-3, foreach=False)
        x = torch.randn(32, 64, device=DEV)
        for m, opt in ((model, o), (ref, r)):
            m(x).square().mean().backward()
            opt.step()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            o.step()
        for _ in range(3):
            graph.replay()
            r.step()
        torch.cuda.synchronize()
        check(
            "CUDA graph replay of a capturable step vs torch",
            max(rel(p, q) for p, q in zip(model.parameters(), ref.parameters())),
            1e-6,
        )
    except Exception as exc:
        RESULTS["checks"]["cuda graph"] = {"error": repr(exc), "passed": False}
        log(f"   FAIL cuda graph: {exc!r}")

    # Muon: one step on identical gradients, then 20 steps of a model.
    torch.manual_seed(0)
    worst = 0.0
    for shape in (
        (dim(1024), dim(4096)),
        (dim(4096), dim(1024)),
        (dim(2048), dim(2048)),
        (300, 700),
    ):
        p = torch.nn.Parameter(torch.randn(shape, device=DEV) * 0.02)
        q = torch.nn.Parameter(p.detach().clone())
        o, r = tko.Muon([p], lr=2e-2), torch.optim.Muon([q], lr=2e-2)
        g = torch.randn(shape, device=DEV)
        p.grad, q.grad = g, g.clone()
        o.step()
        r.step()
        unit = 2e-2 * math.sqrt(max(1, shape[0] / shape[1])) * 2**-8
        worst = max(worst, (p - q).abs().max().item() / unit)
    check("Muon one step vs torch.optim.Muon, in bf16 half-units of the update", worst, 2.0)
    ours, ref = mlp(), mlp()
    mats = [p for p in ours.parameters() if p.dim() == 2]
    rmats = [p for p in ref.parameters() if p.dim() == 2]
    o, r = tko.Muon(mats, lr=5e-3), torch.optim.Muon(rmats, lr=5e-3)
    train([(ours, [o]), (ref, [r])], 20)
    check("Muon vs torch.optim.Muon, 20 steps", max(rel(p, q) for p, q in zip(mats, rmats)), 1e-2)

    from tritonkit.ops.optim.config import NSConfig, default_ns_config

    for shape in ((8, dim(1024), dim(4096)), (4, dim(4096), dim(1024)), (2, dim(2048), dim(2048))):
        g = torch.randn(shape, device=DEV)
        ref16 = torch.stack(
            [_zeropower_via_newtonschulz(x, (3.4445, -4.7750, 2.0315), 5, 1e-7) for x in g]
        ).float()
        ref64 = torch.stack([_ns64(x) for x in g]).float()
        # (tritonkit.matmul on bfloat16 needs the GPU: the interpreter's bf16 dot is wrong)
        for product in ("fused",) if DRY else ("fused", "matmul"):
            for tma in (False, True):
                cfg = NSConfig(product=product, tma=tma)
                if DRY:
                    cfg = dataclasses.replace(default_ns_config(), product=product, tma=tma)
                out = newton_schulz(g, config=cfg).float()
                name = f"NS {shape} {product}{' tma' if tma else ''}"
                check(f"{name} vs torch bf16 (rel L2)", rel(out, ref16), 1e-2)
                e_ours, e_torch = rel(out, ref64), rel(ref16, ref64)
                check(f"{name} error vs float64 / torch's", e_ours / e_torch, 1.5)


def _ns64(g):
    x = g.double()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=1e-7)
    a, b, c = 3.4445, -4.7750, 2.0315
    for _ in range(5):
        A = x @ x.T
        x = a * x + (b * A + c * A @ A) @ x
    return x.T if tall else x


# ---- timing helpers ----------------------------------------------------------------------


def gpu_ms(fn, iters=20, warmup=3, repeats=5) -> float:
    """Median over repeats of the mean GPU time per call of back-to-back calls."""
    for _ in range(1 if DRY else warmup):
        fn()
    sync()
    if DRY:  # timings mean nothing here: one call, to run the code
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return statistics.median(times)


def wall_and_host_ms(fn, iters=20, warmup=3) -> tuple[float, float]:
    """(wall time per call of a loop with one sync at the end, host time inside the call)."""
    for _ in range(1 if DRY else warmup):
        fn()
    sync()
    iters = 1 if DRY else iters
    host = 0.0
    t0 = time.perf_counter()
    for _ in range(iters):
        h = time.perf_counter()
        fn()
        host += time.perf_counter() - h
    sync()
    return (time.perf_counter() - t0) / iters * 1e3, host / iters * 1e3


def copy_gbps() -> float:
    src = torch.empty(dim(2**28), device=DEV)  # 1 GiB
    dst = torch.empty_like(src)
    ms = gpu_ms(lambda: dst.copy_(src), iters=10)
    return 2 * 4 * src.numel() / (ms * 1e-3) / 1e9


def llama_1b_shapes():
    d, ff, kv, vocab, layers = dim(2048), dim(8192), dim(512), dim(128256), 2 if DRY else 16
    shapes = [(vocab, d)]
    for _ in range(layers):
        shapes += [(d,), (d, d), (kv, d), (kv, d), (d, d), (d,), (ff, d), (ff, d), (d, ff)]
    return [*shapes, (d,), (vocab, d)]


# ---- 2. AdamW timings -----------------------------------------------------------------------


@section("adamw")
def adamw(quick: bool):
    import tritonkit.optim as tko
    from tritonkit.ops.optim.config import ChunkConfig

    bw = copy_gbps()
    RESULTS["copy_gbps"] = bw
    log(f"   copy bandwidth {bw:.0f} GB/s (1 GiB fp32, read + write)")

    def make(shapes):
        params = [torch.nn.Parameter(torch.randn(s, device=DEV) * 0.02) for s in shapes]
        grads = [[torch.randn(s, device=DEV) * 1e-3 for s in shapes] for _ in range(2)]
        for p, g in zip(params, grads[0]):
            p.grad = g
        return params, grads

    # Sweep of the chunk config on the 100M-element parameter.
    params, grads = make([(dim(100_000_000),)])
    n = params[0].numel()
    for block in (1024, 2048) if DRY else (1024, 2048, 4096, 8192):
        for warps in (4, 8):
            o = tko.AdamW(params, lr=1e-3, nonfinite="propagate", chunks=ChunkConfig(block, warps))
            ms = gpu_ms(o.step)
            gbps = 28 * n / ms / 1e6
            RESULTS["adamw_sweep"].append(
                {"block": block, "num_warps": warps, "ms": ms, "gbps": gbps}
            )
            log(f"   sweep block={block} warps={warps}: {ms:.3f} ms, {gbps:.0f} GB/s")
            del o
    best = min(RESULTS["adamw_sweep"], key=lambda r: r["ms"])
    chunks = ChunkConfig(best["block"], best["num_warps"])
    RESULTS["adamw_chunks"] = {"block": chunks.block, "num_warps": chunks.num_warps}
    del params, grads
    torch.cuda.empty_cache() if DEV == "cuda" else None

    cases = [
        ("1 x 100M", [(dim(100_000_000),)]),
        ("24 x 4096x1024", [(dim(4096), dim(1024))] * 24),
        ("Llama-1B (147 tensors)", llama_1b_shapes()),
    ]
    for name, shapes in cases:
        RESULTS["adamw"].append(_adamw_case(name, shapes, chunks))
        torch.cuda.empty_cache() if DEV == "cuda" else None


def _adamw_case(name, shapes, chunks):
    import tritonkit.optim as tko

    params = [torch.nn.Parameter(torch.randn(s, device=DEV) * 0.02) for s in shapes]
    grads = [[torch.randn(s, device=DEV) * 1e-3 for s in shapes] for _ in range(2)]
    for p, g in zip(params, grads[0]):
        p.grad = g
    n = sum(p.numel() for p in params)
    row = {"case": name, "n_tensors": len(shapes), "params": n}
    makers = {
        "tritonkit propagate": lambda: tko.AdamW(params, nonfinite="propagate", chunks=chunks),
        "tritonkit skip": lambda: tko.AdamW(params, nonfinite="skip", chunks=chunks),
        "tritonkit raise": lambda: tko.AdamW(params, chunks=chunks),
        "torch fused": lambda: torch.optim.AdamW(params, fused=True),
        "torch foreach": lambda: torch.optim.AdamW(params, foreach=True),
    }
    for label, make in makers.items():
        o = make()
        ms = gpu_ms(o.step)
        wall, host = wall_and_host_ms(o.step)
        flip = [0]

        def fresh_grads(o=o, flip=flip):  # zero_grad(set_to_none) + backward: new tensors
            flip[0] ^= 1
            for p, g in zip(params, grads[flip[0]]):
                p.grad = g
            o.step()

        wall_fresh, host_fresh = wall_and_host_ms(fresh_grads)
        gbps = 28 * n / ms / 1e6
        row[label] = {
            "gpu_ms": ms,
            "gbps": gbps,
            "wall_ms": wall,
            "host_ms": host,
            "wall_fresh_ms": wall_fresh,
            "host_fresh_ms": host_fresh,
        }
        log(
            f"   {name:24s} {label:20s} gpu {ms:8.3f} ms  {gbps:6.0f} GB/s  wall {wall:8.3f} ms "
            f"(fresh grads {wall_fresh:8.3f})  host {host * 1e3:7.1f} us "
            f"(fresh {host_fresh * 1e3:7.1f})"
        )
        del o  # its state goes with it
    return row


# ---- 3. Muon timings ------------------------------------------------------------------------


@section("muon")
def muon(quick: bool):
    import tritonkit.optim as tko
    from tritonkit.ops.optim.config import NSConfig

    torch.manual_seed(0)
    params = [
        torch.nn.Parameter(torch.randn(dim(4096), dim(4096), device=DEV) * 0.02) for _ in range(8)
    ]
    for p in params:
        p.grad = torch.randn_like(p)
    flops_torch = 8 * 5 * 3 * 2 * dim(4096) ** 3
    ref = torch.optim.Muon(params, lr=1e-3)
    t_ms = gpu_ms(ref.step, iters=5, repeats=3)
    RESULTS["muon"].append(
        {"impl": "torch.optim.Muon", "ms": t_ms, "tflops_torch_count": flops_torch / t_ms / 1e9}
    )
    log(
        f"   torch.optim.Muon: {t_ms:.2f} ms "
        f"({flops_torch / t_ms / 1e9:.0f} TFLOP/s of its 2+2+2 products)"
    )
    configs = [
        NSConfig(),
        NSConfig(tma=True),
        NSConfig(block_n=256),
        NSConfig(tma=True, block_n=256),
        NSConfig(tma=True, num_stages=4),
        NSConfig(num_warps=4, num_stages=4),
        NSConfig(product="matmul"),
        NSConfig(product="matmul", tma=True),
    ]
    for cfg in configs[:2] if DRY else configs[:3] if quick else configs:
        if time.time() - START > 330:  # keep the whole run under 8 minutes
            log(f"   skipped {cfg} (time)")
            continue
        try:
            o = tko.Muon(params, lr=1e-3, nonfinite="propagate", ns_config=cfg)
            ms = gpu_ms(o.step, iters=5, repeats=3)
            wall, host = wall_and_host_ms(o.step, iters=5)
            RESULTS["muon"].append(
                {
                    "impl": "tritonkit",
                    "config": cfg.__dict__,
                    "ms": ms,
                    "wall_ms": wall,
                    "host_ms": host,
                    "speedup": t_ms / ms,
                }
            )
            log(
                f"   tritonkit {cfg}: {ms:.2f} ms ({t_ms / ms:.2f}x torch), "
                f"wall {wall:.2f} ms, host {host * 1e3:.0f} us"
            )
            for p in params:
                o.state.pop(p, None)
        except Exception as exc:
            RESULTS["muon"].append(
                {"impl": "tritonkit", "config": cfg.__dict__, "error": repr(exc)}
            )
            log(f"   tritonkit {cfg}: {exc!r}")


# ---- 4. training run ------------------------------------------------------------------------


class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d, bias=False)
        self.proj = torch.nn.Linear(d, d, bias=False)
        self.up = torch.nn.Linear(d, 4 * d, bias=False)
        self.down = torch.nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x))))


class TinyLM(torch.nn.Module):
    def __init__(self, vocab=32, d=256, heads=4, layers=4, ctx=128):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.zeros(ctx, d))
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d)
        self.lm_head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.emb(idx) + self.pos[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.lm_head(self.ln(x))


def markov_source(vocab=32, seed=0):
    """An order-2 Markov chain: each (a, b) context allows 4 next tokens with fixed odds.
    Returns (sample(batch, length), entropy per token in nats: the loss floor)."""
    gen = torch.Generator().manual_seed(seed)
    nxt = torch.randint(0, vocab, (vocab, vocab, 4), generator=gen)
    probs = torch.tensor([0.55, 0.25, 0.15, 0.05])
    entropy = -(probs * probs.log()).sum().item()
    nxt, probs = nxt.to(DEV), probs.to(DEV)

    def sample(batch, length, g):
        out = torch.empty(batch, length, dtype=torch.long, device=DEV)
        out[:, :2] = torch.randint(0, vocab, (batch, 2), device=DEV, generator=g)
        for i in range(2, length):
            choice = torch.multinomial(probs.expand(batch, 4), 1, generator=g).squeeze(1)
            out[:, i] = nxt[out[:, i - 2], out[:, i - 1], choice]
        return out

    return sample, entropy


@section("training run")
def training(quick: bool):
    import tritonkit.optim as tko

    steps = 3 if DRY else 150 if quick else 400
    sample, floor = markov_source()
    RESULTS["train"]["entropy_floor"] = floor
    gen = torch.Generator(device=DEV).manual_seed(1)
    data = [
        sample(4 if DRY else 32, 17 if DRY else 129, gen) for _ in range(2 if DRY else 64)
    ]  # 64 batches, reused (epochs)

    def run(label, make_opts):
        torch.manual_seed(0)
        model = (TinyLM(d=32, layers=1) if DRY else TinyLM()).to(DEV)
        opts = make_opts(model)
        sched = [
            torch.optim.lr_scheduler.LambdaLR(o, lambda s: min(1.0, (s + 1) / 30)) for o in opts
        ]
        losses = []
        t0 = time.time()
        for step in range(steps):
            batch = data[step % len(data)]
            with torch.autocast(DEV, dtype=torch.bfloat16):
                logits = model(batch[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                logits.float().flatten(0, 1), batch[:, 1:].flatten()
            )
            for o in opts:
                o.zero_grad()
            loss.backward()
            for o in opts:
                o.step()
            for s in sched:
                s.step()
            losses.append(loss.item())
        RESULTS["train"][label] = {"losses": losses, "seconds": time.time() - t0}
        log(
            f"   {label:28s} final loss (mean of last 20) {statistics.mean(losses[-20:]):.4f} "
            f"(floor {floor:.4f}), {time.time() - t0:.1f} s"
        )

    def muon_split(model):
        hidden = [p for n, p in model.named_parameters() if p.dim() == 2 and n.startswith("blocks")]
        rest = [
            p for n, p in model.named_parameters() if not (p.dim() == 2 and n.startswith("blocks"))
        ]
        return hidden, rest

    run(
        "torch AdamW (fused)",
        lambda m: [torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.1, fused=True)],
    )
    run("tritonkit AdamW", lambda m: [tko.AdamW(m.parameters(), lr=3e-3, weight_decay=0.1)])
    run(
        "torch Muon + AdamW",
        lambda m: [
            torch.optim.Muon(
                muon_split(m)[0], lr=3e-3, weight_decay=0.1, adjust_lr_fn="match_rms_adamw"
            ),
            torch.optim.AdamW(muon_split(m)[1], lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95)),
        ],
    )
    run(
        "tritonkit MuonW",
        # The same split as torch's run (the learned positions are a 2-D parameter outside
        # the blocks, which muon_param_groups would give to Muon).
        lambda m: [
            tko.MuonW(
                [
                    {"params": muon_split(m)[0], "use_muon": True},
                    {"params": muon_split(m)[1], "use_muon": False},
                ],
                lr=3e-3,
                weight_decay=0.1,
            )
        ],
    )
    plot(RESULTS, os.environ.get("OUT"))


def plot(results: dict, out_dir: str | None) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("   matplotlib missing: re-plot later with --plot optim.json")
        return
    train = results["train"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, styl in (
        ("torch AdamW (fused)", ("tab:blue", "-")),
        ("tritonkit AdamW", ("tab:orange", "--")),
        ("torch Muon + AdamW", ("tab:green", "-")),
        ("tritonkit MuonW", ("tab:red", "--")),
    ):
        if label in train:
            losses = train[label]["losses"]
            smooth = [statistics.mean(losses[max(0, i - 9) : i + 1]) for i in range(len(losses))]
            ax.plot(smooth, label=label, color=styl[0], linestyle=styl[1])
    ax.axhline(train["entropy_floor"], color="gray", linewidth=0.8, label="entropy of the source")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (10-step mean)")
    ax.set_ylim(train["entropy_floor"] - 0.1, 4.5)
    ax.set_title("Tiny transformer LM on an order-2 Markov source: tritonkit vs torch optimizers")
    ax.legend()
    fig.tight_layout()
    path = Path(out_dir or ".") / "optim_loss.png"
    fig.savefig(path, dpi=120)
    log(f"   loss curves -> {path}")


# ---- summary ---------------------------------------------------------------------------------


def summary() -> None:
    log("\n== summary")
    checks = RESULTS["checks"]
    failed = [k for k, v in checks.items() if not v.get("passed")]
    log(
        f"checks: {len(checks) - len(failed)}/{len(checks)} passed"
        + (f"; FAILED: {failed}" if failed else "")
    )
    bw = RESULTS.get("copy_gbps")
    if RESULTS["adamw"]:
        log(f"copy bandwidth: {bw:.0f} GB/s; chunks: {RESULTS.get('adamw_chunks')}")
        log(
            "| case | impl | GPU ms/step | GB/s @28B | % copy | vs fused (GPU) | wall ms "
            "| vs fused (wall) | wall, fresh grads | host us |"
        )
        log("|---|---|---|---|---|---|---|---|---|---|")
        for row in RESULTS["adamw"]:
            fused = row["torch fused"]
            for label in (
                "tritonkit propagate",
                "tritonkit skip",
                "tritonkit raise",
                "torch fused",
                "torch foreach",
            ):
                r = row[label]
                log(
                    f"| {row['case']} | {label} | {r['gpu_ms']:.3f} | {r['gbps']:.0f} | "
                    f"{100 * r['gbps'] / bw:.0f}% | {fused['gpu_ms'] / r['gpu_ms']:.2f}x | "
                    f"{r['wall_ms']:.3f} | {fused['wall_ms'] / r['wall_ms']:.2f}x | "
                    f"{r['wall_fresh_ms']:.3f} | {r['host_ms'] * 1e3:.0f} |"
                )
    if RESULTS["muon"]:
        log("| Muon 8 x 4096^2 | ms/step | speedup vs torch.optim.Muon |")
        log("|---|---|---|")
        for r in RESULTS["muon"]:
            if "ms" in r:
                name = r["impl"] + (f" {r['config']}" if "config" in r else "")
                log(f"| {name} | {r['ms']:.2f} | {r.get('speedup', 1.0):.2f}x |")
    if RESULTS["train"]:
        floor = RESULTS["train"].get("entropy_floor", float("nan"))
        log(f"| training run (floor {floor:.4f}) | final loss (last 20 mean) |")
        log("|---|---|")
        for k, v in RESULTS["train"].items():
            if isinstance(v, dict):
                log(f"| {k} | {statistics.mean(v['losses'][-20:]):.4f} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer configs and steps")
    parser.add_argument("--plot", help="re-plot the loss curves from a saved optim.json")
    parser.add_argument("--only", default="correctness,adamw,muon,training")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="run every section on the CPU under the Triton interpreter at tiny sizes "
        "(checks the script, measures nothing)",
    )
    args = parser.parse_args()
    if args.dry_run:
        global DEV, DRY
        DEV, DRY = "cpu", True
        os.environ["TRITON_INTERPRET"] = "1"
    if args.plot:
        results = json.loads(Path(args.plot).read_text())
        plot(results, str(Path(args.plot).parent))
        return
    if not DRY and not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU (or --dry-run)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from tritonkit.harness.device import fingerprint

    RESULTS["fingerprint"] = fingerprint()
    t0 = time.time()
    only = set(args.only.split(","))
    if "correctness" in only:
        correctness()
    if "adamw" in only:
        adamw(args.quick)
    if "muon" in only:
        muon(args.quick)
    if "training" in only:
        training(args.quick)
    RESULTS["seconds"] = time.time() - t0
    out = os.environ.get("OUT")
    if out:
        Path(out, "optim.json").write_text(json.dumps(RESULTS, indent=1, default=str))
    summary()
    log(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
