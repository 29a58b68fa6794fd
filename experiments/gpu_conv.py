"""Issue 46 on the GPU: tritonkit.conv2d against cuDNN on ResNet-50 and MobileNetV2 layers.

bf16, channels_last (input and weight), batch 32 unless said:

(a) forward of every distinct ResNet-50 conv layer: ours vs cuDNN (``F.conv2d``), ms and
    TFLOP/s, ratio = cuDNN ms / ours ms (> 1: ours faster), geometric mean of the ratios;
(b) conv + bias + relu (+ residual where ResNet-50 adds one: the blocks' last 1x1) fused in
    our kernel vs cuDNN's conv followed by eager bias/add/relu, and vs torch.compile of the
    same function (dynamic shapes: one compile per epilogue kind);
(c) backward (dgrad + wgrad, ``torch.autograd.grad`` of x and w) vs cuDNN's, geomean;
(d) MobileNetV2's depthwise 3x3 layers, forward, vs cuDNN;
(e) ResNet-50 (written below, torchvision's architecture) inference, eval, random weights,
    batch 64: tritonkit.nn.convert_conv2d (BN folded, relu and residual fused) vs eager cuDNN
    (unfused BN) and eager cuDNN with the same folded weights; images/s and the output's max
    |difference| and relative L2 error against eager;
(f) peak memory of each forward above inputs + weights + output (ours and cuDNN's);
(g) seed 001's versions (the spec's variants: direct, im2col, Winograd F(2x2, 3x3), the pointer
    implicit GEMM) on the 3x3 stride-1 layers beside the default path and cuDNN, GPU time.

FLOPs = 2 * N * OH * OW * Cout * KH * KW * Cin / groups (forward); backward counts 2x that
(dgrad and wgrad, each the forward's FLOPs). TFLOP/s = FLOPs / (ms * 1e9). Timing:
``triton.testing.do_bench`` (L2 flushed between reps, median).

``--tune``: per layer, the forward, dgrad, wgrad and depthwise candidates of
``ops/conv/config.py`` are compiled in parallel (``tritonkit.warmup``: a thread pool),
timed, and the winners written as a shipped table ``DIR/conv.json`` (copy it to
``src/tritonkit/tuned/<gpu>/conv.json``) and into this run's tuning cache, so (a)-(e) use them.

    PYTHONPATH=src python experiments/gpu_conv.py --out DIR [--tune] [--smoke]

``--smoke``: the whole code path on the CPU under Triton's interpreter at toy sizes (numbers
meaningless). Writes DIR/conv.json (with --tune), DIR/results.json and DIR/results.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

T0 = time.monotonic()
GPU = torch.cuda.is_available() and not SMOKE
DEVICE = "cuda" if GPU else "cpu"
DTYPE = torch.bfloat16 if GPU else torch.float32
CL = torch.channels_last

# (Cin, Cout, k, stride, H, residual) of torchvision ResNet-50's distinct convolutions at
# 224 x 224: the stem, stage 1, then per later stage the first block's 1x1 reduce, strided
# 3x3, 1x1 expand (+ identity), strided 1x1 downsample, and the other blocks' 1x1 reduce and
# 3x3. Stage 1's downsample (64 -> 256 1x1 at 56) is the same layer as its expand.
RESNET50 = [
    (3, 64, 7, 2, 224, False),
    (64, 64, 1, 1, 56, False),
    (64, 64, 3, 1, 56, False),
    (64, 256, 1, 1, 56, True),
    (256, 64, 1, 1, 56, False),
]
for _cin, _mid, _h in ((256, 128, 56), (512, 256, 28), (1024, 512, 14)):
    RESNET50 += [
        (_cin, _mid, 1, 1, _h, False),
        (_mid, _mid, 3, 2, _h, False),
        (_mid, _mid * 4, 1, 1, _h // 2, True),
        (_cin, _mid * 4, 1, 2, _h, False),
        (_mid * 4, _mid, 1, 1, _h // 2, False),
        (_mid, _mid, 3, 1, _h // 2, False),
    ]
# (C, stride, H) of MobileNetV2's depthwise 3x3 convolutions (224 x 224 input).
MOBILENET = [
    (32, 1, 112), (96, 2, 112), (144, 1, 56), (144, 2, 56), (192, 1, 28), (192, 2, 28),
    (384, 1, 14), (576, 1, 14), (576, 2, 14), (960, 1, 7),
]  # fmt: skip

if SMOKE:  # toy sizes: channels / 16 (at least 3), spatial / 16
    RESNET50 = [
        (max(3, a // 16), max(3, b // 16), k, s, max(k, h // 16), r)
        for a, b, k, s, h, r in RESNET50[:6]
    ]
    MOBILENET = [(max(4, c // 16), s, max(3, h // 16)) for c, s, h in MOBILENET[:2]]
BATCH = 32 if GPU else 2
E2E_BATCH = 64 if GPU else 1
E2E_SIZE = 224 if GPU else 32


def _bench(fn) -> float:
    """Median ms (do_bench on the GPU; one call on the CPU, where timings mean nothing)."""
    if not GPU:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    import triton.testing

    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def _bench_gpu(fn) -> float | None:
    """Median GPU ms of ``fn`` replayed from a CUDA graph: the kernels' time without the host's
    (None where the calls cannot be captured). Beside ``_bench``'s wall time, it shows which
    rows the host bounds."""
    if not GPU:
        return _bench(fn)
    import triton.testing

    try:
        return triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median")
    except Exception:
        return None


def _host_us(fn, calls: int = 60) -> float:
    """Median host time of one call, us: from the call to its return (launches are
    asynchronous, so this is what the host spends enqueueing), the queue drained every few
    calls so that a slow GPU never makes the host wait. Beside the GPU time it says which of
    the two sets a row's wall time."""
    if not GPU:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    fn()
    torch.cuda.synchronize()
    times = []
    for i in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        if i % 8 == 7:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    times.sort()
    return times[len(times) // 2] * 1e6


def _out_of_time() -> bool:
    return BUDGET[0] is not None and time.monotonic() - T0 > BUDGET[0]


BUDGET: list[float | None] = [None]  # seconds since start after which nothing new starts


def _layer(cin, cout, k, stride, h, groups=1, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    x = (
        torch.randn(BATCH, cin, h, h, device=DEVICE, generator=g)
        .to(DTYPE)
        .contiguous(memory_format=CL)
    )
    w = torch.randn(cout, cin // groups, k, k, device=DEVICE, generator=g)
    w = (w / math.sqrt(cin // groups * k * k)).to(DTYPE).contiguous(memory_format=CL)
    b = torch.randn(cout, device=DEVICE, generator=g).to(DTYPE)
    return x, w, b, k // 2


def _flops(x, w, y, groups=1) -> int:
    n, cin = x.shape[:2]
    cout, _, kh, kw = w.shape
    return 2 * n * y.shape[2] * y.shape[3] * cout * kh * kw * cin // groups


def _geomean(xs):
    xs = [v for v in xs if v and v > 0]
    return math.exp(sum(math.log(v) for v in xs) / len(xs)) if xs else None


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _warm(fn):
    """Compile every kernel ``fn``'s calls launch, in parallel (tritonkit.warmup: the calls run
    with nothing launched); compiles would otherwise dominate the run, one after another."""
    if not GPU:
        return None
    import tritonkit

    report = tritonkit.warmup(fn)
    return str(report)


# ---- tuning ----------------------------------------------------------------------------------


def _jobs(layers, dw_layers):
    """(kind, layer index, config dict) for every candidate worth timing."""
    from tritonkit.ops.conv.config import DepthwiseConfig, GemmConfig, WgradConfig
    from tritonkit.ops.conv.plan import choose_path, problem

    jobs = []
    for i, (cin, cout, k, s, h, _) in enumerate(layers):
        pad = k // 2
        p = problem((BATCH, cin, h, h), (cout, cin, k, k), [s, s], [pad] * 4, [1, 1], 1, DTYPE)
        x, w, _, _ = _layer(cin, cout, k, s, h, seed=i)
        kind = choose_path(p, x, w)  # the kernel the layer's layouts take (its tuning key)
        cands = GemmConfig.candidates(p, p.c_g, p.k_g)
        # The first three, and a tile 256 channels wide where Cout reaches it: a 1x1 layer's
        # short reduction makes it a memory-bound GEMM that wants x read once per pixel.
        # The TMA kernel: every candidate (its winners on an H200 spread over five tiles).
        keep = cands if kind == "tma" else cands[:3] + [c for c in cands[3:] if c.BLOCK_N >= 256]
        for c in keep:
            jobs.append((kind, i, c.tuning().to_dict()))
        for c in GemmConfig.candidates(p._replace(oh=p.h, ow=p.w), p.k_g, p.c_g)[:2]:
            jobs.append(("dgrad", i, c.tuning().to_dict()))
        for c in WgradConfig.candidates(p)[:2]:
            jobs.append(("wgrad", i, c.tuning().to_dict()))
    for i, (c, s, h) in enumerate(dw_layers):
        p = problem((BATCH, c, h, h), (c, 1, 3, 3), [s, s], [1] * 4, [1, 1], c, DTYPE)
        for cfg in DepthwiseConfig.candidates(p):  # all: a depthwise run takes microseconds
            jobs.append(("depthwise", i, cfg.tuning().to_dict()))
    return jobs


def _run_job(job, layers, dw_layers, time_it=True):
    """Run one candidate once (compiles it); returns its GPU ms, or None if it failed."""
    from tritonkit import _tuning
    from tritonkit.ops.conv.config import DepthwiseConfig, GemmConfig, WgradConfig
    from tritonkit.ops.conv.plan import conv_dgrad, conv_forward, conv_wgrad

    kind, i, cfg = job
    cfg = _tuning.Config.from_dict(cfg)
    if kind == "depthwise":
        c, s, h = dw_layers[i]
        x, w, _, _ = _layer(c, c, 3, s, h, groups=c, seed=i)
        conf = DepthwiseConfig.from_tuning(cfg)
        fn = lambda: conv_forward(x, w, None, None, [s, s], [1] * 4, [1, 1], c, "none", conf)  # noqa: E731
    else:
        cin, cout, k, s, h, _ = layers[i]
        x, w, _, pad = _layer(cin, cout, k, s, h, seed=i)
        geo = ([s, s], [pad] * 4, [1, 1], 1)
        y = F.conv2d(x, w, None, s, pad)
        dy = torch.randn_like(y)
        if kind in ("fwd", "tma", "1x1", "rows"):
            conf = GemmConfig.from_tuning(cfg)
            fn = lambda: conv_forward(x, w, None, None, *geo, "none", conf)  # noqa: E731
        elif kind == "dgrad":
            conf = GemmConfig.from_tuning(cfg)
            fn = lambda: conv_dgrad(dy, w, list(x.shape), *geo, conf)  # noqa: E731
        else:
            conf = WgradConfig.from_tuning(cfg)
            fn = lambda: conv_wgrad(dy, x, list(w.shape), *geo, conf)  # noqa: E731
    try:
        fn()
        if not time_it:
            return None
        ms = _bench_gpu(fn)  # GPU time: the host's time per call would hide the kernels'
        return ms if ms is not None else _bench(fn)
    except Exception as exc:  # a config that does not compile or fit: not a candidate
        return f"failed: {type(exc).__name__}: {str(exc)[:200]}"


def _run_job_compile_only(job, layers, dw_layers):
    return _run_job(job, layers, dw_layers, time_it=False)


def tune(out_dir, layers, dw_layers, budget_s):
    """Time every candidate per layer and kind; store the winners (tuning cache + table)."""
    from tritonkit import _tuning
    from tritonkit.ops._core.plan import PLANS
    from tritonkit.ops.conv.plan import problem

    jobs = _jobs(layers, dw_layers)
    t = time.monotonic()
    _warm(lambda: [_run_job_compile_only(j, layers, dw_layers) for j in jobs])
    compile_s = time.monotonic() - t
    times = {}
    for job in jobs:
        if time.monotonic() - T0 > budget_s:
            break
        times[(job[0], job[1], json.dumps(job[2], sort_keys=True))] = _run_job(
            job, layers, dw_layers
        )
    best = {}
    for (kind, i, cfg), ms in times.items():
        if isinstance(ms, float) and (best.get((kind, i)) is None or ms < best[(kind, i)][1]):
            best[(kind, i)] = (cfg, ms)
    entries, log = {}, []
    for (kind, i), (cfg, ms) in sorted(best.items()):
        if kind == "depthwise":
            c, s, h = dw_layers[i]
            p = problem((BATCH, c, h, h), (c, 1, 3, 3), [s, s], [1] * 4, [1, 1], c, DTYPE)
        else:
            cin, cout, k, s, h, _ = layers[i]
            p = problem(
                (BATCH, cin, h, h), (cout, cin, k, k), [s, s], [k // 2] * 4, [1, 1], 1, DTYPE
            )
        config = _tuning.Config.from_dict(json.loads(cfg))
        key = p.key(kind)
        tried = [
            (_tuning.Config.from_dict(json.loads(c)), m if isinstance(m, float) else None)
            for (kk, ii, c), m in times.items()
            if (kk, ii) == (kind, i)
        ]
        _tuning.store(f"conv_{kind}", key, config, tried)
        entries[_tuning._entry_key(f"conv_{kind}", key)] = {"config": config.to_dict()}
        log.append({"kind": kind, "layer": i, "key": key, "best": config.to_dict(), "ms": ms,
                    "tried": [[c.to_dict(), m] for c, m in tried]})  # fmt: skip
    import triton

    gpu = torch.cuda.get_device_name() if GPU else "cpu"
    doc = {
        "schema": _tuning.SCHEMA, "gpu": gpu, "triton": triton.__version__, "family": "conv",
        "tuned": time.strftime("%Y-%m-%d"), "entries": dict(sorted(entries.items())),
    }  # fmt: skip
    with open(os.path.join(out_dir, "conv.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    PLANS.reset()  # the launches choose again, from the cache just written
    failed = sum(1 for v in times.values() if not isinstance(v, float))
    return {"jobs": len(jobs), "timed": len(times), "failed": failed, "compile_s": compile_s,
            "seconds": time.monotonic() - t, "log": log}  # fmt: skip


# ---- (a)-(d): layers -------------------------------------------------------------------------


def layers_forward(layers):
    import tritonkit

    _warm(
        lambda: [
            tritonkit.conv2d(*_layer(*L[:5], seed=i)[:2], None, L[3], L[2] // 2)
            for i, L in enumerate(layers)
        ]
    )
    rows = []
    for i, (cin, cout, k, s, h, _) in enumerate(layers):
        if _out_of_time():
            rows.append({"layer": "(rest skipped: out of time budget)"})
            break
        x, w, _, pad = _layer(cin, cout, k, s, h, seed=i)
        ref = F.conv2d(
            x.double() if not GPU else x.float(), w.double() if not GPU else w.float(), None, s, pad
        )
        y = tritonkit.conv2d(x, w, None, s, pad)
        err = _rel(y, ref)
        ours = _bench(lambda: tritonkit.conv2d(x, w, None, s, pad))  # noqa: B023
        cudnn = _bench(lambda: F.conv2d(x, w, None, s, pad))  # noqa: B023
        ours_gpu = _bench_gpu(lambda: tritonkit.conv2d(x, w, None, s, pad))  # noqa: B023
        cudnn_gpu = _bench_gpu(lambda: F.conv2d(x, w, None, s, pad))  # noqa: B023
        fl = _flops(x, w, y)
        rows.append({
            "layer": f"{cin}->{cout} k{k} s{s} @{h}", "ours_ms": ours, "cudnn_ms": cudnn,
            "ours_gpu_ms": ours_gpu, "cudnn_gpu_ms": cudnn_gpu,
            "ours_host_us": _host_us(lambda: tritonkit.conv2d(x, w, None, s, pad)),  # noqa: B023
            "cudnn_host_us": _host_us(lambda: F.conv2d(x, w, None, s, pad)),  # noqa: B023
            "ratio_gpu": cudnn_gpu / ours_gpu if ours_gpu and cudnn_gpu else None,
            "ours_tflops": fl / ours / 1e9, "cudnn_tflops": fl / cudnn / 1e9,
            "ratio": cudnn / ours, "rel_err": err,
            "out_stride_ok": y.stride() == F.conv2d(x, w, None, s, pad).stride(),
        })  # fmt: skip
    return rows


def layers_fused(layers):
    import tritonkit

    def eager(x, w, b, s, pad, r):
        y = F.conv2d(x, w, None, s, pad) + b.view(1, -1, 1, 1)
        if r is not None:
            y = y + r
        return F.relu(y)

    torch._dynamo.config.cache_size_limit = 64
    compiled = torch.compile(eager, dynamic=True)
    cases = []
    for i, (cin, cout, k, s, h, res) in enumerate(layers):
        x, w, b, pad = _layer(cin, cout, k, s, h, seed=i)
        y0 = F.conv2d(x, w, None, s, pad)
        r = torch.randn_like(y0) if res else None
        cases.append((x, w, b, s, pad, r))
    _warm(lambda: [tritonkit.conv2d(*c[:5], residual=c[5], activation="relu") for c in cases])
    rows = []
    for (cin, cout, k, s, h, res), (x, w, b, _, pad, r) in zip(layers, cases, strict=True):
        if _out_of_time():
            rows.append({"layer": "(rest skipped: out of time budget)"})
            break
        ours_fn = lambda: tritonkit.conv2d(x, w, b, s, pad, residual=r, activation="relu")  # noqa: E731,B023
        err = _rel(
            ours_fn(),
            eager(x.float(), w.float(), b.float(), s, pad, None if r is None else r.float()),
        )
        t = time.monotonic()
        compiled(x, w, b, s, pad, r)
        compile_s = time.monotonic() - t
        ours = _bench(ours_fn)
        ea = _bench(lambda: eager(x, w, b, s, pad, r))  # noqa: B023
        co = _bench(lambda: compiled(x, w, b, s, pad, r))  # noqa: B023
        ours_gpu = _bench_gpu(ours_fn)
        eager_gpu = _bench_gpu(lambda: eager(x, w, b, s, pad, r))  # noqa: B023
        rows.append({
            "layer": f"{cin}->{cout} k{k} s{s} @{h}" + (" +res" if res else ""), "ours_ms": ours,
            "eager_ms": ea, "compile_ms": co, "vs_eager": ea / ours, "vs_compile": co / ours,
            "ours_gpu_ms": ours_gpu, "eager_gpu_ms": eager_gpu,
            "vs_eager_gpu": eager_gpu / ours_gpu if ours_gpu and eager_gpu else None,
            "rel_err": err, "compile_s": compile_s,
        })  # fmt: skip
    return rows


def layers_backward(layers):
    import tritonkit
    from tritonkit.ops.conv.plan import conv_dgrad, conv_wgrad

    def step(i, L):
        x, w, _, pad = _layer(*L[:5], seed=i)
        xo, wo = x.detach().requires_grad_(L[0] > 3), w.detach().requires_grad_()
        y = tritonkit.conv2d(xo, wo, None, L[3], pad)
        return torch.autograd.grad(y, (xo, wo) if L[0] > 3 else (wo,), torch.ones_like(y))

    _warm(lambda: [step(i, L) for i, L in enumerate(layers)])
    rows = []
    for i, (cin, cout, k, s, h, _) in enumerate(layers):
        if _out_of_time():
            rows.append({"layer": "(rest skipped: out of time budget)"})
            break
        x, w, _, pad = _layer(cin, cout, k, s, h, seed=i)
        # The stem's input is the image: nothing asks for its gradient (dw only, both sides).
        dx = cin > 3
        xo, wo = x.detach().requires_grad_(dx), w.detach().requires_grad_()
        xc, wc = x.detach().requires_grad_(dx), w.detach().requires_grad_()
        yo = tritonkit.conv2d(xo, wo, None, s, pad)
        yc = F.conv2d(xc, wc, None, s, pad)
        go = torch.randn_like(yc)
        wrt_o, wrt_c = ((xo, wo), (xc, wc)) if dx else ((wo,), (wc,))
        g_ours = torch.autograd.grad(yo, wrt_o, go, retain_graph=True)
        g_ref = torch.autograd.grad(yc, wrt_c, go, retain_graph=True)
        ours_fn = lambda: torch.autograd.grad(yo, wrt_o, go, retain_graph=True)  # noqa: E731,B023
        cudnn_fn = lambda: torch.autograd.grad(yc, wrt_c, go, retain_graph=True)  # noqa: E731,B023
        ours, cudnn = _bench(ours_fn), _bench(cudnn_fn)
        geo = ([s, s], [pad] * 4, [1, 1], 1)

        def kernels(dx=dx, go=go, w=w, x=x, geo=geo):
            if dx:
                conv_dgrad(go, w, list(x.shape), *geo)
            conv_wgrad(go, x, list(w.shape), *geo)

        ours_gpu = _bench_gpu(kernels)

        # A training step's forward + backward: a new graph per call, as a model runs it
        # (replayable from C++ where the replay module is built; the rows above reuse one
        # graph, whose backward runs the Python path every time).
        def train_step(conv, xi, wi, s=s, pad=pad, dx=dx, go=go):
            y = conv(xi, wi, None, s, pad)
            return torch.autograd.grad(y, (xi, wi) if dx else (wi,), go)

        ours_step = _bench(lambda: train_step(tritonkit.conv2d, xo, wo))  # noqa: B023
        cudnn_step = _bench(lambda: train_step(F.conv2d, xc, wc))  # noqa: B023
        fl = (2 if dx else 1) * _flops(x, w, yc)
        rows.append({
            "layer": f"{cin}->{cout} k{k} s{s} @{h}" + ("" if dx else " (dw only)"),
            "ours_ms": ours, "cudnn_ms": cudnn, "ours_gpu_ms": ours_gpu,
            "ours_host_us": _host_us(ours_fn), "cudnn_host_us": _host_us(cudnn_fn),
            "ours_tflops": fl / ours / 1e9, "cudnn_tflops": fl / cudnn / 1e9, "ratio": cudnn / ours,
            "ours_step_ms": ours_step, "cudnn_step_ms": cudnn_step,
            "step_ratio": cudnn_step / ours_step,
            "dx_rel_vs_cudnn": _rel(g_ours[0], g_ref[0]) if dx else None,
            "dw_rel_vs_cudnn": _rel(g_ours[-1], g_ref[-1]),
        })  # fmt: skip
    return rows


def layers_depthwise(dw_layers):
    import tritonkit

    def one(i, c, s, h):
        x, w, _, _ = _layer(c, c, 3, s, h, groups=c, seed=i)
        return tritonkit.conv2d(x, w, None, s, 1, 1, c)

    _warm(lambda: [one(i, *L) for i, L in enumerate(dw_layers)])
    rows = []
    for i, (c, s, h) in enumerate(dw_layers):
        if _out_of_time():
            rows.append({"layer": "(rest skipped: out of time budget)"})
            break
        x, w, _, _ = _layer(c, c, 3, s, h, groups=c, seed=i)
        y = tritonkit.conv2d(x, w, None, s, 1, 1, c)
        err = _rel(y, F.conv2d(x.float(), w.float(), None, s, 1, 1, c))
        ours = _bench(lambda: tritonkit.conv2d(x, w, None, s, 1, 1, c))  # noqa: B023
        cudnn = _bench(lambda: F.conv2d(x, w, None, s, 1, 1, c))  # noqa: B023
        ours_gpu = _bench_gpu(lambda: tritonkit.conv2d(x, w, None, s, 1, 1, c))  # noqa: B023
        cudnn_gpu = _bench_gpu(lambda: F.conv2d(x, w, None, s, 1, 1, c))  # noqa: B023
        fl = _flops(x, w, y, c)
        nbytes = (x.numel() + w.numel() + y.numel()) * x.element_size()
        rows.append({
            "layer": f"dw{c} s{s} @{h}", "ours_ms": ours, "cudnn_ms": cudnn, "ratio": cudnn / ours,
            "ours_gpu_ms": ours_gpu, "cudnn_gpu_ms": cudnn_gpu,
            "ratio_gpu": cudnn_gpu / ours_gpu if ours_gpu and cudnn_gpu else None,
            "ours_GBps": nbytes / ours / 1e6, "cudnn_GBps": nbytes / cudnn / 1e6, "rel_err": err,
            "flops": fl,
        })  # fmt: skip
    return rows


def layers_variants(layers):
    """(g) Seed 001's evolution on the 3x3 stride-1 layers, GPU time: the spec's variants
    (direct, im2col, Winograd F(2x2, 3x3), the pointer implicit GEMM) beside the default path
    and cuDNN, each with bias + relu; ratio = cuDNN / variant."""
    from tritonkit.harness.spec import get_spec

    variants = get_spec("conv2d").variants
    rows = []
    for i, (cin, cout, k, s, h, _) in enumerate(layers):
        if k != 3 or s != 1 or _out_of_time():
            continue
        x, w, b, pad = _layer(cin, cout, k, s, h, seed=i)
        ref = F.relu(F.conv2d(x, w, b, 1, pad))
        row = {"layer": f"{cin}->{cout} k3 s1 @{h}"}
        row["cudnn_gpu_ms"] = _bench_gpu(
            lambda x=x, w=w, b=b, pad=pad: F.relu(F.conv2d(x, w, b, 1, pad))
        )
        for name, fn in variants.items():
            call = lambda fn=fn, x=x, w=w, b=b, pad=pad: fn(x, w, b, padding=pad, activation="relu")  # noqa: E731
            try:
                row[f"{name}_rel"] = _rel(call(), ref)
                ms = _bench_gpu(call)
                row[f"{name}_gpu_ms"] = ms
                row[f"{name}_ratio"] = row["cudnn_gpu_ms"] / ms if ms else None
            except Exception as exc:  # a variant that cannot run this layer: said, not fatal
                row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:200]
        rows.append(row)
    return rows


def peak_memory(layers):
    """Bytes allocated during one forward beyond its output (x and w exist before)."""
    import tritonkit

    rows = []
    if not GPU:
        return rows
    for i, (cin, cout, k, s, h, _) in enumerate(layers):
        x, w, _, pad = _layer(cin, cout, k, s, h, seed=i)
        out = {}
        for name, fn in (("ours", tritonkit.conv2d), ("cudnn", F.conv2d)):
            fn(x, w, None, s, pad)  # warm: compiles and cuDNN's plan outside the measure
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            y = fn(x, w, None, s, pad)
            torch.cuda.synchronize()
            out[name] = torch.cuda.max_memory_allocated() - base - y.numel() * y.element_size()
            del y
        rows.append({"layer": f"{cin}->{cout} k{k} s{s} @{h}", "ours_extra_bytes": out["ours"],
                     "cudnn_extra_bytes": out["cudnn"]})  # fmt: skip
    return rows


# ---- (e): ResNet-50 --------------------------------------------------------------------------


class Bottleneck(nn.Module):
    """torchvision's Bottleneck (v1.5: the stride on the 3x3), same attribute names."""

    expansion = 4

    def __init__(self, cin, mid, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, mid, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(mid)
        self.conv2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(mid)
        self.conv3 = nn.Conv2d(mid, mid * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(mid * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


class ResNet50(nn.Module):
    def __init__(self, width=64, classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin, layers = width, []
        for i, blocks in enumerate((3, 4, 6, 3)):
            mid = width * 2**i
            stride = 1 if i == 0 else 2
            down = nn.Sequential(
                nn.Conv2d(cin, mid * 4, 1, stride, bias=False), nn.BatchNorm2d(mid * 4)
            )
            stage = [Bottleneck(cin, mid, stride, down)]
            stage += [Bottleneck(mid * 4, mid) for _ in range(blocks - 1)]
            layers.append(nn.Sequential(*stage))
            cin = mid * 4
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _randomize_bn(model):
    g = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
            m.weight.data.copy_(torch.rand(n, generator=g) * 0.5 + 0.5)
            m.bias.data.copy_(torch.randn(n, generator=g) * 0.1)


def resnet50_e2e():
    import copy

    import tritonkit.nn as tnn

    torch.manual_seed(0)
    width = 64 if GPU else 8
    base = ResNet50(width, 1000 if GPU else 10)
    _randomize_bn(base)
    base = base.eval().to(DEVICE, DTYPE).to(memory_format=CL)
    ours = tnn.convert_conv2d(copy.deepcopy(base))
    folded = copy.deepcopy(ours)  # the same folded weights through cuDNN: swap convs back
    for m in folded.modules():
        if isinstance(m, tnn.Conv2d):
            m.forward = _cudnn_forward.__get__(m)
    x = (
        torch.randn(E2E_BATCH, 3, E2E_SIZE, E2E_SIZE, device=DEVICE)
        .to(DTYPE)
        .contiguous(memory_format=CL)
    )
    with torch.no_grad():
        warm = _warm(lambda: ours(x))
        ref = base(x)
        out = ours(x)
        out_f = folded(x)
        t_eager = _bench(lambda: base(x))
        t_folded = _bench(lambda: folded(x))
        t_ours = _bench(lambda: ours(x))
    return {
        "batch": E2E_BATCH, "eager_ms": t_eager, "eager_folded_ms": t_folded, "ours_ms": t_ours,
        "eager_img_s": E2E_BATCH / t_eager * 1e3, "eager_folded_img_s": E2E_BATCH / t_folded * 1e3,
        "ours_img_s": E2E_BATCH / t_ours * 1e3, "speedup_vs_eager": t_eager / t_ours,
        "speedup_vs_eager_folded": t_folded / t_ours,
        "max_abs_diff_vs_eager": (out.float() - ref.float()).abs().max().item(),
        "rel_l2_vs_eager": _rel(out, ref), "rel_l2_folded_cudnn_vs_eager": _rel(out_f, ref),
        "top1_agree": (out.argmax(1) == ref.argmax(1)).float().mean().item(), "warmup": warm,
    }  # fmt: skip


def _cudnn_forward(self, x, residual=None):
    """A fused tritonkit Conv2d's computation through cuDNN and eager ops (the baseline)."""
    y = F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
    if residual is not None:
        y = y + residual
    return F.relu(y) if self.activation == "relu" else y


def _replay_ready(replay, wait_s: float) -> dict:
    """Wait (at most ``wait_s``) for the replay module: with it a warm call runs from C++;
    without it every call takes the Python path."""
    t = time.monotonic()
    while GPU and replay.extension() is None and not replay.STATS.disabled:
        if time.monotonic() - t > wait_s:
            break
        time.sleep(0.5)
    return {"ready": replay.extension() is not None, "waited_s": time.monotonic() - t,
            "disabled": replay.STATS.disabled}  # fmt: skip


def _replay_stats(replay) -> dict:
    return {"recordings": replay.STATS.recordings, "replays": replay.STATS.replays,
            "failures": dict(replay.STATS.failures)}  # fmt: skip


# ---- report ----------------------------------------------------------------------------------


def _table(rows, cols):
    if not rows:
        return "(none)\n"
    head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    body = ""
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c)
            cells.append(f"{v:.4g}" if isinstance(v, float) else str(v))
        body += "| " + " | ".join(cells) + " |\n"
    return head + body


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "out-conv"))
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--tune", action="store_true")
    ap.add_argument("--budget-s", type=float, default=180.0,
                    help="no section or layer starts after this many seconds")  # fmt: skip
    ap.add_argument("--only", default="tune,replay,a,c,b,d,e,f,g,replay_stats",
                    help="comma list of sections")  # fmt: skip
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.environ.setdefault("TRITONKIT_CACHE_DIR", os.path.join(args.out, "tuning-cache"))
    only = set(args.only.split(","))
    torch.backends.cudnn.allow_tf32 = False  # float32 references exact (our runs are bf16)
    res = {
        "gpu": torch.cuda.get_device_name() if GPU else "cpu (interpreter smoke test)",
        "torch": torch.__version__, "dtype": str(DTYPE), "batch": BATCH, "layout": "channels_last",
        "formulas": {
            "flops": "2 * N * OH * OW * Cout * KH * KW * Cin / groups (backward: 2x)",
            "tflops": "flops / (ms * 1e9)", "ratio": "cudnn_ms / ours_ms (> 1: ours faster)",
            "timing": "triton.testing.do_bench median, L2 flushed",
        },
    }  # fmt: skip
    import triton

    res["triton"] = triton.__version__
    BUDGET[0] = args.budget_s
    from tritonkit.ops._core import replay

    replay.extension()  # starts building the C++ replay module on a thread (see _replay_ready)
    tune_s = args.budget_s * 0.3
    sections = [
        ("tune", lambda: tune(args.out, RESNET50, MOBILENET, tune_s) if args.tune else None),
        ("replay", lambda: _replay_ready(replay, 45.0)),
        ("a", lambda: layers_forward(RESNET50)),
        ("c", lambda: layers_backward(RESNET50)),
        ("b", lambda: layers_fused(RESNET50)),
        ("d", lambda: layers_depthwise(MOBILENET)),
        ("e", resnet50_e2e),
        ("f", lambda: peak_memory(RESNET50)),
        ("g", lambda: layers_variants(RESNET50)),
        ("replay_stats", lambda: _replay_stats(replay)),
    ]
    for name, fn in sections:
        if name not in only:
            continue
        if _out_of_time() and name != "replay_stats":
            res[name] = {"skipped": "out of time budget"}
            continue
        t = time.monotonic()
        try:
            res[name] = fn()
        except Exception:
            res[name] = {"error": traceback.format_exc()}
            print(f"section {name} failed:\n{res[name]['error']}", file=sys.stderr)
        res[f"{name}_seconds"] = time.monotonic() - t
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(res, f, indent=1, default=str)
    for key, ratio in (
        ("a", "ratio"), ("a", "ratio_gpu"), ("b", "vs_eager"), ("b", "vs_eager_gpu"),
        ("b", "vs_compile"), ("c", "ratio"), ("c", "step_ratio"), ("d", "ratio"),
        ("d", "ratio_gpu"),
    ):  # fmt: skip
        if isinstance(res.get(key), list):
            res[f"{key}_geomean_{ratio}"] = _geomean([r.get(ratio) for r in res[key]])
    res["total_seconds"] = time.monotonic() - T0
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)

    def rows(name):
        return res.get(name) if isinstance(res.get(name), list) else []

    def g(name):
        v = res.get(f"{name}")
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    md = f"# conv2d vs cuDNN on {res['gpu']} ({DTYPE}, channels_last, batch {BATCH})\n\n"
    md += "Formulas: " + "; ".join(f"{k} = {v}" for k, v in res["formulas"].items()) + "\n"
    md += "Wall: do_bench of eager calls (host included); GPU: CUDA-graph replay (kernels only); "
    md += "host_us: median time for one call to return (enqueue), queue drained every 8 calls.\n"
    md += "\n## replay\n\n" + json.dumps([res.get("replay"), res.get("replay_stats")]) + "\n"
    md += f"\n## (a) forward, geomean ratio {g('a_geomean_ratio')} wall, "
    md += f"{g('a_geomean_ratio_gpu')} GPU\n\n"
    md += _table(rows("a"), ["layer", "ours_ms", "cudnn_ms", "ratio", "ours_gpu_ms",
                             "cudnn_gpu_ms", "ratio_gpu", "ours_host_us", "cudnn_host_us",
                             "ours_tflops", "cudnn_tflops", "rel_err"])  # fmt: skip
    md += f"\n## (c) backward (dgrad + wgrad), geomean ratio {g('c_geomean_ratio')} wall; "
    md += f"train step (fwd + bwd, new graph per call) {g('c_geomean_step_ratio')}\n\n"
    md += _table(rows("c"), ["layer", "ours_ms", "cudnn_ms", "ratio", "ours_gpu_ms",
                             "ours_host_us", "cudnn_host_us", "ours_step_ms", "cudnn_step_ms",
                             "step_ratio", "ours_tflops", "dx_rel_vs_cudnn",
                             "dw_rel_vs_cudnn"])  # fmt: skip
    md += f"\n## (b) conv+bias+relu(+res), geomean vs eager {g('b_geomean_vs_eager')} wall, "
    md += f"{g('b_geomean_vs_eager_gpu')} GPU; vs compile {g('b_geomean_vs_compile')} wall\n\n"
    md += _table(rows("b"), ["layer", "ours_ms", "eager_ms", "compile_ms", "vs_eager",
                             "vs_compile", "ours_gpu_ms", "eager_gpu_ms", "vs_eager_gpu",
                             "rel_err"])  # fmt: skip
    md += f"\n## (d) depthwise 3x3 (MobileNetV2), geomean ratio {g('d_geomean_ratio')} wall, "
    md += f"{g('d_geomean_ratio_gpu')} GPU\n\n"
    md += _table(rows("d"), ["layer", "ours_ms", "cudnn_ms", "ratio", "ours_gpu_ms",
                             "cudnn_gpu_ms", "ratio_gpu", "ours_GBps", "cudnn_GBps",
                             "rel_err"])  # fmt: skip
    md += (
        "\n## (e) ResNet-50 inference\n\n```\n"
        + json.dumps(res.get("e"), indent=1, default=str)
        + "\n```\n"
    )
    md += "\n## (f) peak memory beyond inputs + weights + output (bytes)\n\n"
    md += _table(
        res.get("f") if isinstance(res.get("f"), list) else [],
        ["layer", "ours_extra_bytes", "cudnn_extra_bytes"],
    )
    md += "\n## (g) seed 001's versions on the 3x3 stride-1 layers, GPU ms (ratio: cuDNN / it)\n\n"
    names = ["direct", "im2col", "winograd", "implicit_gemm_pointer", "implicit_gemm"]
    md += _table(
        rows("g"),
        ["layer", "cudnn_gpu_ms"] + [f"{n}_{c}" for n in names for c in ("gpu_ms", "ratio")],
    )
    if isinstance(res.get("tune"), dict):
        t = res["tune"]
        md += (
            f"\n## tuning\n\n{t.get('jobs')} candidates, {t.get('timed')} timed, "
            f"{t.get('failed')} failed, compile {t.get('compile_s', 0):.0f} s, "
            f"total {t.get('seconds', 0):.0f} s; winners in conv.json\n"
        )
    for name, _ in sections:
        if isinstance(res.get(name), dict) and "error" in res[name]:
            md += f"\n## section {name} FAILED\n\n```\n{res[name]['error']}\n```\n"
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(md)
    print(md)
    print(f"total {res['total_seconds']:.0f} s")


if __name__ == "__main__":
    main()
