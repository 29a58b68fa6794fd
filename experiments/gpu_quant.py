"""GPU checks and timings of the quantization family (issue 34's acceptance), in one run:

1. quantize kernels on bf16 (16384, 8192) to float8 e4m3 and int8, per row, per group of 128
   and per tensor (amax pass included): GB/s of the bytes they must move against the measured
   copy bandwidth, and against torch.compile's and torchao's equivalents (when importable);
   bit-exact codes and scales against the float64 reference first;
2. Float8Linear in a Llama MLP block (4096 -> 14336 -> 4096, SwiGLU, 16K tokens), forward +
   backward, tensorwise and rowwise, against bf16 nn.Linear and torchao's Float8Linear;
   a small byte-level language model trained in bf16 and with Float8Linear (loss curves);
3. Int8Linear W8A8 at (8192, 8192, 8192) including the activation quantization against bf16
   nn.Linear, with the output SQNR; weight-only int8 at M = 1..16 against bf16.

Run: PYTHONPATH=src python3 experiments/gpu_quant.py  (writes $OUT/quant.json and
$OUT/quant_loss.png when OUT is set; the table is printed last). Sections that fail are
reported and the others still run. QUANT_PYTEST=1 also runs tests/test_quant.py on the GPU;
QUANT_LM_STEPS sets the LM's steps (400).
"""

from __future__ import annotations

import json
import math
import os
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.testing

import tritonkit
from tritonkit.nn import Float8Linear, Int8Linear
from tritonkit.ops.quant.config import get_format
from tritonkit.quant import dequantize, quantize, sqnr_db
from tritonkit.quant import reference as R

DEV = "cuda"
OUT = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
RESULTS: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
ROWS: list[tuple[str, str, str]] = []  # (section, what, figure) for the table
T0 = time.time()


def bench(fn, rep=100) -> float:
    """Median ms (triton's do_bench: warm-up, L2 flush)."""
    return float(triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median"))


def row(section, what, figure):
    ROWS.append((section, what, figure))
    print(f"[{time.time() - T0:6.1f}s] {section}: {what}: {figure}", flush=True)


def section(name):
    def wrap(fn):
        def run():
            try:
                fn()
            except Exception as exc:  # report and go on
                RESULTS.setdefault("errors", {})[name] = traceback.format_exc(limit=6)
                row(name, "FAILED", f"{type(exc).__name__}: {str(exc)[:120]}")
            torch.cuda.empty_cache()

        return run

    return wrap


# ---- 0. bit-exact on the GPU ---------------------------------------------------------------


@section("exact")
def exact():
    g = torch.Generator(device=DEV).manual_seed(0)
    x = torch.randn(1152, 4096, device=DEV, generator=g, dtype=torch.float32)  # 9 x 128 rows
    x = (x * torch.exp(torch.randn(x.shape, device=DEV, generator=g))).to(torch.bfloat16)
    x[0, 0], x[1, 1], x[2, 2] = float("inf"), float("-inf"), float("nan")
    cases = [
        (torch.float8_e4m3fn, "row", {}), (torch.float8_e5m2, "row", {}),
        (torch.int8, "row", {}), (torch.int8, "row", {"symmetric": False}),
        (torch.float8_e4m3fn, "group", {"group_size": 128}),
        (torch.int8, "group", {"group_size": 128}),
        (torch.float8_e4m3fn, "tensor", {}), (torch.int8, "tensor", {}),
        (torch.float8_e4m3fn, "column", {}), (torch.int8, "column", {"symmetric": False}),
        (torch.int8, "group", {"group_size": 32, "bits": 4}),
        (torch.float8_e4m3fn, "tensor", {"layout": "both"}),
        (torch.float8_e4m3fn, "column", {"layout": "col", "pow2_scale": True}),
        (torch.float8_e4m3fn, "group", {"group_size": 128, "dim": 0}),
    ]  # fmt: skip
    bad = []
    for dtype, gran, kw in cases:
        q = quantize(x, dtype, gran, **kw)
        fmt = get_format(dtype, kw.get("bits", 8), kw.get("symmetric", True))
        codes, scale, zp = R.quantize(x.cpu(), fmt, q.block, kw.get("pow2_scale", False))
        expect = R.pack_int4(codes) if fmt.packed else codes
        ok = torch.equal(q.data.cpu().contiguous().view(torch.uint8).flatten(),
                         expect.contiguous().view(torch.uint8).flatten())  # fmt: skip
        ok &= torch.equal(q.scale.cpu(), scale)
        if zp is not None:
            ok &= torch.equal(q.zero_point.cpu(), zp)
        if q.data_t is not None:
            ok &= torch.equal(q.data_t.cpu().view(torch.uint8), q.data.t().cpu().view(torch.uint8))
        out = dequantize(q, torch.bfloat16).cpu()
        ref = R.dequantize(codes, scale, zp, q.block, torch.bfloat16)
        nan = torch.isnan(ref)
        ok &= torch.equal(torch.isnan(out), nan)
        ok &= torch.equal(
            out.masked_fill(nan, 0).view(torch.int16), ref.masked_fill(nan, 0).view(torch.int16)
        )
        if not ok:
            bad.append(f"{q.format} {gran} {kw}")
    RESULTS["exact_failures"] = bad
    row(
        "exact",
        f"{len(cases)} quantize/dequantize cases bit for bit",
        "all exact" if not bad else f"FAIL {bad}",
    )


# ---- 1. quantize bandwidth -----------------------------------------------------------------


def _torch_quant(x, dtype, gran):
    fmt = get_format(dtype)
    xf = x.float()
    if gran == "row":
        a = xf.abs().amax(-1, keepdim=True)
    elif gran == "group":
        a = xf.view(x.shape[0], -1, 128).abs().amax(-1, keepdim=True)
        xf = xf.view(x.shape[0], -1, 128)
    else:
        a = xf.abs().amax()
    qs = fmt.qmax / a.clamp(min=1e-12)
    v = (xf * qs).clamp(fmt.qmin, fmt.qmax)
    codes = v.to(dtype) if fmt.is_float else v.round().to(torch.int8)
    return codes.view(x.shape), 1 / qs


def _torchao_quant(dtype, gran):
    """torchao's equivalent where it exists in this install, else None."""
    try:
        if dtype == torch.float8_e4m3fn:
            from torchao.float8.config import ScalingGranularity
            from torchao.float8.float8_utils import tensor_to_scale, to_fp8_saturated

            if gran == "group":
                return None
            g = ScalingGranularity.AXISWISE if gran == "row" else ScalingGranularity.TENSORWISE

            def run(x):
                s = tensor_to_scale(x, dtype, scaling_granularity=g, axiswise_dim=-1)
                return to_fp8_saturated(x.float() * s, dtype), s

            return run
        from torchao.quantization.quant_primitives import (
            MappingType,  # fmt: skip
            choose_qparams_affine,
            quantize_affine,
        )

        def run(x):
            block = {"row": (1, x.shape[1]), "group": (1, 128), "tensor": tuple(x.shape)}[gran]
            s, z = choose_qparams_affine(x, MappingType.SYMMETRIC, block, torch.int8)
            return quantize_affine(x, block, s, z, torch.int8)

        return run
    except Exception:
        return None


@section("bandwidth")
def bandwidth():
    m, n = 16384, 8192
    x = torch.randn(m, n, device=DEV, dtype=torch.bfloat16)
    copy_ms = bench(lambda: x.clone())
    copy_gbs = 2 * x.numel() * 2 / copy_ms / 1e6
    RESULTS["copy_GBps"] = copy_gbs
    row("A1", "copy bandwidth (torch clone, bf16 16384x8192)", f"{copy_gbs:.0f} GB/s")
    out = {}
    for dtype in (torch.float8_e4m3fn, torch.int8):
        for gran, kw in (("row", {}), ("group", {"group_size": 128}), ("tensor", {})):
            scales = {"row": m, "group": m * n // 128, "tensor": 1}[gran]
            reads = 2 if gran == "tensor" else 1
            nbytes = reads * 2 * x.numel() + x.numel() + 4 * scales
            ms = bench(lambda dtype=dtype, gran=gran, kw=kw: quantize(x, dtype, gran, **kw))
            comp = torch.compile(lambda t, dtype=dtype, gran=gran: _torch_quant(t, dtype, gran))
            comp(x)
            cms = bench(lambda comp=comp: comp(x))
            ao = _torchao_quant(dtype, gran)
            ams = None
            if ao is not None:
                try:
                    ao(x)
                    ams = bench(lambda ao=ao: ao(x))
                except Exception:
                    ams = None
            gbs = nbytes / ms / 1e6
            name = f"{str(dtype).removeprefix('torch.')} {gran}"
            out[name] = {"ms": ms, "GBps": gbs, "pct_copy": gbs / copy_gbs, "compile_ms": cms,
                         "torchao_ms": ams}  # fmt: skip
            fig = f"{gbs:.0f} GB/s = {100 * gbs / copy_gbs:.0f}% of copy; {cms / ms:.2f}x compile"
            fig += f"; {ams / ms:.2f}x torchao" if ams else "; torchao n/a"
            row("A1", f"quantize {name} (incl. amax)", fig)
    RESULTS["bandwidth"] = out


# ---- 2. Float8Linear MLP block and LM training ----------------------------------------------


class MLP(torch.nn.Module):
    def __init__(self, d=4096, h=14336, cls=torch.nn.Linear, **kw):
        super().__init__()
        self.w1 = cls(d, h, bias=False, device=DEV, dtype=torch.bfloat16, **kw)
        self.w3 = cls(d, h, bias=False, device=DEV, dtype=torch.bfloat16, **kw)
        self.w2 = cls(h, d, bias=False, device=DEV, dtype=torch.bfloat16, **kw)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


@section("mlp")
def mlp():
    torch.manual_seed(0)
    x = torch.randn(16384, 4096, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(16384, 4096, device=DEV, dtype=torch.bfloat16)
    ref = MLP()
    variants = {"bf16 nn.Linear": ref}
    for scaling in ("tensorwise", "rowwise"):
        m = MLP()
        m.load_state_dict(ref.state_dict())
        for name in ("w1", "w2", "w3"):
            setattr(m, name, Float8Linear.from_float(getattr(m, name), scaling))
        variants[f"tritonkit Float8Linear {scaling}"] = m
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        for recipe in ("tensorwise", "rowwise"):
            m = MLP()
            m.load_state_dict(ref.state_dict())
            convert_to_float8_training(m, config=Float8LinearConfig.from_recipe_name(recipe))
            variants[f"torchao Float8Linear {recipe}"] = m
    except Exception as exc:
        row("A2", "torchao", f"not importable/usable: {type(exc).__name__}")

    def step(m):
        x.grad = None
        for p in m.parameters():
            p.grad = None
        m(x).backward(dy)

    with torch.no_grad():
        y_ref = ref(x).float()
    times = {}
    for name, m in variants.items():
        with torch.no_grad():
            err = float(sqnr_db(y_ref, m(x).float())) if m is not ref else math.inf
        step(m)
        times[name] = bench(lambda m=m: step(m), rep=50)
        row("A2", f"MLP fwd+bwd {name}", f"{times[name]:.2f} ms (output SQNR {err:.1f} dB vs bf16)")
    base = times["bf16 nn.Linear"]
    for name, t in times.items():
        if name != "bf16 nn.Linear":
            row("A2", f"speedup {name} vs bf16", f"{base / t:.2f}x")
    for s in ("tensorwise", "rowwise"):
        ao = times.get(f"torchao Float8Linear {s}")
        if ao:
            row(
                "A2",
                f"speedup tritonkit vs torchao {s}",
                f"{ao / times[f'tritonkit Float8Linear {s}']:.2f}x",
            )
    RESULTS["mlp_ms"] = times


def _corpus(n_bytes=8 << 20) -> torch.Tensor:
    """Bytes of the Python sources of the torch package: a deterministic local text corpus."""
    root = Path(torch.__file__).parent
    chunks, total = [], 0
    for p in sorted(root.rglob("*.py")):
        b = p.read_bytes()
        chunks.append(b)
        total += len(b)
        if total >= n_bytes:
            break
    return torch.frombuffer(bytearray(b"".join(chunks)[:n_bytes]), dtype=torch.uint8).long()


class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class LM(torch.nn.Module):
    def __init__(self, d=768, layers=6, heads=12, ctx=256):
        super().__init__()
        self.emb, self.pos = torch.nn.Embedding(256, d), torch.nn.Embedding(ctx, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = torch.nn.LayerNorm(d), torch.nn.Linear(d, 256)

    def forward(self, idx):
        x = self.emb(idx) + self.pos.weight[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


@section("lm")
def lm():
    data = _corpus().to(DEV)
    steps, batch, ctx = int(os.environ.get("QUANT_LM_STEPS", 400)), 32, 256
    curves = {}
    for name in ("bf16", "float8 tensorwise", "float8 rowwise"):
        torch.manual_seed(0)
        model = LM(ctx=ctx).to(DEV)
        if name != "bf16":
            scaling = name.split()[1]
            for blk in model.blocks:
                for attr in ("qkv", "proj", "fc1", "fc2"):
                    setattr(blk, attr, Float8Linear.from_float(getattr(blk, attr), scaling))
        opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=True)
        gen = torch.Generator(device=DEV).manual_seed(1)
        losses = []
        t0 = time.time()
        for s in range(steps):
            lr = (
                6e-4
                * min(1.0, (s + 1) / 50)
                * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / steps)))
            )
            for group in opt.param_groups:
                group["lr"] = lr
            starts = torch.randint(0, data.numel() - ctx - 1, (batch,), device=DEV, generator=gen)
            idx = starts[:, None] + torch.arange(ctx + 1, device=DEV)
            seq = data[idx]
            with torch.autocast("cuda", torch.bfloat16):
                logits = model(seq[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, 256), seq[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.detach())
        losses = torch.stack(losses).tolist()
        curves[name] = losses
        final = sum(losses[-20:]) / 20
        row("A2", f"LM {name}: {steps} steps", f"final loss {final:.4f} ({time.time() - t0:.0f} s)")
    base = sum(curves["bf16"][-20:]) / 20
    for name in ("float8 tensorwise", "float8 rowwise"):
        final = sum(curves[name][-20:]) / 20
        row("A2", f"LM {name} vs bf16 loss", f"{100 * (final / base - 1):+.2f}%")
    RESULTS["lm_losses"] = curves
    if OUT is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        for name, c in curves.items():
            k = 10
            sm = [
                sum(c[max(0, i - k + 1) : i + 1]) / len(c[max(0, i - k + 1) : i + 1])
                for i in range(len(c))
            ]
            ax.plot(sm, label=name)
        ax.set_xlabel("step")
        ax.set_ylabel("train loss (10-step mean)")
        ax.set_title(f"byte-level LM, {RESULTS['device']}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(OUT / "quant_loss.png", dpi=110)


# ---- 3. Int8Linear ---------------------------------------------------------------------------


@section("int8")
def int8():
    torch.manual_seed(0)
    lin = torch.nn.Linear(8192, 8192, bias=False, device=DEV, dtype=torch.bfloat16)
    x = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    w8 = Int8Linear.from_float(lin, "w8a8")
    with torch.no_grad():
        ref = x.float() @ lin.weight.float().t()
        s = float(sqnr_db(ref, w8(x).float()))
        s_bf16 = float(sqnr_db(ref, lin(x).float()))
        tb = bench(lambda: lin(x))
        t8 = bench(lambda: w8(x))
    row(
        "A3",
        "W8A8 8192^3 incl. activation quant",
        f"{t8:.3f} ms vs bf16 {tb:.3f} ms: {tb / t8:.2f}x",
    )
    row("A3", "W8A8 output SQNR (Gaussian)", f"{s:.1f} dB (bf16 nn.Linear: {s_bf16:.1f} dB)")
    RESULTS["w8a8"] = {"ms": t8, "bf16_ms": tb, "sqnr_db": s}
    wo = Int8Linear.from_float(lin, "weight_only")
    out = {}
    for m in (1, 2, 4, 8, 16):
        xm = torch.randn(m, 8192, device=DEV, dtype=torch.bfloat16)
        with torch.no_grad():
            ref = xm.float() @ (wo.weight_int8.float() * wo.weight_scale).t()
            err = float(sqnr_db(ref, wo(xm).float()))
            tb = bench(lambda xm=xm: lin(xm), rep=200)
            tw = bench(lambda xm=xm: wo(xm), rep=200)
        out[m] = {"ms": tw, "bf16_ms": tb, "sqnr_db": err}
        row(
            "A3",
            f"weight-only int8 M={m} (8192x8192)",
            f"{tw * 1e3:.1f} us vs bf16 {tb * 1e3:.1f} us: {tb / tw:.2f}x (SQNR {err:.0f} dB)",
        )
    RESULTS["weight_only"] = out


@section("delayed_te")
def delayed_te():
    try:
        import transformer_engine  # noqa: F401
    except Exception:
        row(
            "A4",
            "TransformerEngine",
            "not importable: compared with its documented semantics in tests",
        )
        return
    row("A4", "TransformerEngine", "importable: compare DelayedScaling here (not written yet)")


@section("pytest")
def gpu_tests():
    """tests/test_quant.py on the GPU (QUANT_PYTEST=1; a few minutes of compiling)."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-m", "not slow", "tests/test_quant.py"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=420)
    RESULTS["pytest"] = res.stdout[-4000:]
    row("tests", "tests/test_quant.py on the GPU", res.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    for fn in (exact, bandwidth, int8, mlp, lm, delayed_te):
        fn()
    if os.environ.get("QUANT_PYTEST") == "1":
        gpu_tests()
    if OUT is not None:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "quant.json").write_text(json.dumps({**RESULTS, "rows": ROWS}, indent=1))
    print(f"\n{RESULTS['device']}, torch {torch.__version__}, tritonkit {tritonkit.__version__}")
    w = max(len(r[1]) for r in ROWS)
    for sec, what, fig in ROWS:
        print(f"{sec:6} {what:<{w}}  {fig}")
