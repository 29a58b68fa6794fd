"""Whole models on the GPU (issue 39): training steps, cold starts, loss/gradient match, loss
curves, inference, attention routes and the fusion cost model, one run per comparison.

    PYTHONPATH=src python experiments/gpu_models.py --out $OUT                # every section
    PYTHONPATH=src python experiments/gpu_models.py --out $OUT --sections train --configs llama-2k
    PYTHONPATH=src python experiments/gpu_models.py --tiny --out /tmp/m       # CPU smoke test
    PYTHONPATH=src python experiments/gpu_models.py --sections optim --out $OUT  # issue 43's

Sections (``--sections``, comma-separated; default all):

- ``attn``: one attention call, forward + backward, at the Llama shape (B 4, H 16, Hkv 8,
  T 2048, D 128, bf16, causal): SDPA's default choice, SDPA with cuDNN first (what the patch
  runs), cuDNN on repeated K/V, tritonkit.attention.
- ``train``: a training step (forward, backward, optimizer step, zero_grad) per variant and
  config, each variant in a fresh subprocess: tokens/s (do_bench median and wall time of
  back-to-back steps) and peak memory (torch.cuda.max_memory_allocated, from before the first
  step: parameters, gradients, optimizer states and activations). Variants: ``eager``,
  ``compile`` (torch.compile), ``liger`` (Liger-Kernel's patch, when importable),
  ``tk`` (tritonkit.patch, torch's fused AdamW), ``tk_adamw`` (tritonkit.patch and
  tritonkit's AdamW at its defaults), ``tk_muonw`` (tritonkit MuonW at its defaults, Llama 2K
  only), ``tk_compile``
  (tritonkit.patch under torch.compile), ``tk_rkv`` (patch with K/V repeated for cuDNN,
  Llama only), ``tk_flash`` (patch with tritonkit.attention, Llama only). Configs:
  ``llama-2k`` (the issue's Llama: hidden 2048, intermediate 5632, 8 layers, 16 heads, 8 KV
  heads, vocabulary 32000, batch 4 x 2048),
  ``llama-8k`` (batch 1 x 8192), ``gpt2-2k`` / ``gpt2-8k`` (GPT-2 small: 768 x 12 layers,
  vocabulary 50257, dropout 0.1 as trained; batch 4 x 2048 and 1 x 8192).
- ``optim``: the optimizers at their defaults in training (issue 43, acceptance 3), each case
  in a fresh process, 10 timed steps after 3 warm-up ones (wall time of back-to-back steps,
  one sync after the last, so a host sync inside a step costs what it costs a user): the
  patched GPT-2 small and Llama (``gpt2-2k``, ``llama-2k``) with torch's fused AdamW
  (``tk``) and with ``tritonkit.optim.AdamW()`` at its defaults (``tk_adamw``), target >=
  1.0x in tokens/s; and a Muon step on 8 x 4096 x 4096 fp32 parameters (gradients given),
  ``torch.optim.Muon`` against ``tritonkit.optim.Muon`` at its defaults, target >= 1.4x.
  The table ends with the three ratios and whether each meets its target. About 3-4 minutes
  on an H200.
- ``cold``: the first three training steps from empty Triton, tritonkit and Inductor caches
  (fresh temporary directories, a fresh process each) for eager, liger, tk, tk_adamw.
- ``match``: loss and every gradient of the bf16 Llama (batch 1 x 2048) unpatched and patched,
  each against a float32 copy of the same weights: relative errors, and the patched model's
  error over the unpatched one's.
- ``curve``: 200 training steps of the Llama at 2K on a synthetic Markov-chain text (so the
  loss falls), unpatched and patched (torch's fused AdamW), and patched with tritonkit's
  AdamW: the largest per-step relative difference of the loss, and its mean over the last 50.
- ``infer``: prefill tokens/s (batch 4 x 2048, KV cache built, last logits only) and decode
  tokens/s (64 greedy tokens after it, through ``generate``) for eager, tk (SDPA route) and
  tk with attention="tritonkit" (tritonkit's split-KV decode).
- ``fusion``: ``tritonkit.fusion.validate``: the cost model's predicted saving against the
  measured one for each of its patterns, and whether every fusion it declines measures slower.

Writes ``models.json`` (every figure and error, an environment fingerprint) and ``models.md``
(the tables) under ``--out``, and ``models.png`` (tokens/s and memory) with matplotlib.
A failing case is recorded and the run goes on. Every section together takes longer than
one 10-minute call (the torch.compile variants compile for a minute or more per config):
split it with ``--sections``/``--configs``/``--variants`` and merge the runs' JSON with
``--merge A/models.json B/models.json ... --out DIR`` (tables and plot of all of them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = (
    "eager",
    "compile",
    "liger",
    "tk",
    "tk_adamw",
    "tk_muonw",
    "tk_compile",
    "tk_rkv",
    "tk_flash",
)
CONFIGS = ("llama-2k", "llama-8k", "gpt2-2k", "gpt2-8k")
SECTIONS = ("attn", "train", "optim", "cold", "match", "curve", "infer", "fusion")


def log(*args) -> None:
    print(*args, flush=True)


# -- models ----------------------------------------------------------------------------------


def config(name: str, tiny: bool) -> dict:
    """The model and batch of a config name."""
    family, seq = name.split("-")
    if tiny:
        return {"family": family, "batch": 2, "seq": 16, "tiny": True}
    batch, seq_len = (4, 2048) if seq == "2k" else (1, 8192)
    return {"family": family, "batch": batch, "seq": seq_len, "tiny": False}


def build(cfg: dict, device: str, dtype: torch.dtype = torch.bfloat16):
    import transformers

    tiny, fam = cfg["tiny"], cfg["family"]
    if fam == "llama":
        hf = transformers.LlamaConfig(
            hidden_size=64 if tiny else 2048,
            intermediate_size=96 if tiny else 5632,
            num_hidden_layers=2 if tiny else 8,
            num_attention_heads=4 if tiny else 16,
            num_key_value_heads=2 if tiny else 8,
            vocab_size=128 if tiny else 32000,
            max_position_embeddings=max(64, cfg["seq"]),
        )
        cls = transformers.LlamaForCausalLM
    else:
        hf = transformers.GPT2Config(
            n_embd=64 if tiny else 768,
            n_layer=2 if tiny else 12,
            n_head=4 if tiny else 12,
            vocab_size=128 if tiny else 50257,
            n_positions=max(64, cfg["seq"]),
        )
        cls = transformers.GPT2LMHeadModel
    hf._attn_implementation = "sdpa"
    with torch.device(device):
        model = cls(hf)
    return model.to(dtype)


def tokens(cfg: dict, vocab: int, device: str, seed: int = 0) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(0, vocab, (cfg["batch"], cfg["seq"]), generator=g).to(device)


def apply_variant(model, variant: str, fam: str) -> dict:
    """Patch (tk*, liger) or compile the model in place; what was done, for the record."""
    info: dict = {}
    if variant == "liger":
        import liger_kernel.transformers as lk

        fn = {"llama": "apply_liger_kernel_to_llama", "gpt2": None}[fam]
        if fn is None or not hasattr(lk, fn):
            raise RuntimeError(f"Liger-Kernel has no patch for {fam}")
        getattr(lk, fn)(model=model)
        info["liger"] = getattr(__import__("liger_kernel"), "__version__", "?")
    if variant.startswith("tk"):
        import tritonkit

        attention = {"tk_rkv": "sdpa_repeat_kv", "tk_flash": "tritonkit"}.get(variant, "sdpa")
        info["patch"] = str(tritonkit.patch(model, attention=attention))
    return info


def make_optimizer(model, variant: str):
    params = [p for p in model.parameters() if p.requires_grad]
    if variant == "tk_adamw":  # at its defaults (nonfinite="skip": checked, no host sync)
        from tritonkit.optim import AdamW

        return AdamW(params, lr=1e-4, weight_decay=0.01)
    if variant == "tk_muonw":
        from tritonkit.optim import MuonW, muon_param_groups

        return MuonW(muon_param_groups(model), lr=1e-4)
    fused = next(iter(params)).is_cuda
    return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, fused=fused)


def train_step_fn(model, opt, ids):
    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_ms(fn, device: str, n_wall: int) -> dict:
    """do_bench's median (GPU) and the wall time per call of n back-to-back calls."""
    out = {}
    if device == "cuda":
        import triton.testing

        out["bench_ms"] = triton.testing.do_bench(fn, warmup=200, rep=1000)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(n_wall):
        fn()
    sync(device)
    out["wall_ms"] = (time.perf_counter() - t0) * 1e3 / n_wall
    return out


# -- workers (one fresh process each) ------------------------------------------------------------


def worker_train(variant: str, names: list[str], tiny: bool) -> list[dict]:
    device = "cpu" if tiny else "cuda"
    rows = []
    for name in names:
        cfg = config(name, tiny)
        row = {"variant": variant, "config": name, "batch": cfg["batch"], "seq": cfg["seq"]}
        try:
            if variant in ("tk_muonw", "tk_rkv", "tk_flash") and not name.startswith("llama"):
                raise RuntimeError(f"{variant} is measured on the Llama configs only")
            if variant == "tk_muonw" and name != "llama-2k":
                raise RuntimeError("MuonW is measured on llama-2k only")
            torch.manual_seed(0)
            model = build(cfg, device)
            model.train()
            row.update(apply_variant(model, variant, cfg["family"]))
            if variant in ("compile", "tk_compile"):
                model = torch.compile(model)
            opt = make_optimizer(model, variant)
            ids = tokens(cfg, model.config.vocab_size, device)
            step = train_step_fn(model, opt, ids)
            if device == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            losses = [float(step()) for _ in range(3)]
            sync(device)
            row["first3_s"] = time.perf_counter() - t0
            row["loss"] = losses[-1]
            row.update(time_ms(step, device, 2 if tiny else 10))
            ms = row.get("bench_ms", row["wall_ms"])
            row["tokens_per_s"] = cfg["batch"] * cfg["seq"] / (ms / 1e3)
            if device == "cuda":
                row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
            del model, opt, step
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
            row["traceback"] = traceback.format_exc()[-3000:]
        if device == "cuda":
            torch.cuda.empty_cache()
        rows.append(row)
        log(json.dumps({k: v for k, v in row.items() if k not in ("traceback", "patch")}))
    return rows


OPTIM_STEPS = (3, 10)  # warm-up steps, timed steps
MUON_SHAPE = (8, 4096, 4096)  # matrices, rows, cols (fp32)


def timed_steps(step, device: str) -> dict:
    """OPTIM_STEPS's protocol: warm-up steps, a sync, the timed steps back to back and one
    sync after the last (wall ms per step); CUDA events around each timed step give its GPU
    time without a sync between steps."""
    warm, timed = OPTIM_STEPS
    for _ in range(warm):
        step()
    sync(device)
    events = []
    t0 = time.perf_counter()
    for _ in range(timed):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            events.append((start, end))
        else:
            step()
    sync(device)
    out = {"wall_ms": (time.perf_counter() - t0) * 1e3 / timed, "steps": timed, "warmup": warm}
    if events:
        gpu = sorted(s.elapsed_time(e) for s, e in events)
        out["gpu_ms_median"] = gpu[len(gpu) // 2]
    return out


def worker_optim(variant: str, name: str, tiny: bool) -> dict:
    """One case of the ``optim`` section, in this (fresh) process."""
    device = "cpu" if tiny else "cuda"
    row: dict = {"variant": variant, "config": name}
    try:
        torch.manual_seed(0)
        if variant.startswith("muon_"):
            n, rows, cols = MUON_SHAPE
            if tiny:
                rows, cols = rows // 128, cols // 128
            g = torch.Generator(device=device).manual_seed(0)
            params = []
            for _ in range(n):
                p = torch.nn.Parameter(torch.randn(rows, cols, generator=g, device=device) * 0.02)
                p.grad = torch.randn(rows, cols, generator=g, device=device) * 1e-3
                params.append(p)
            if variant == "muon_torch":
                opt = torch.optim.Muon(params, lr=1e-3)
            else:
                import tritonkit.optim as tko

                opt = tko.Muon(params)  # every argument at its default (lr 1e-3, as torch's)
                row["ns_configs"] = [str(c) for p in opt._group_plans(0, opt.param_groups[0])
                                     for c in p.ns_configs]  # fmt: skip
            row.update(config="muon 8x4096^2 fp32", shape=[n, rows, cols])
            row["optimizer"] = f"{type(opt).__module__}.{type(opt).__name__}"
            row.update(timed_steps(opt.step, device))
        else:
            cfg = config(name, tiny)
            row.update(batch=cfg["batch"], seq=cfg["seq"])
            model = build(cfg, device)
            model.train()
            apply_variant(model, "tk", cfg["family"])  # the same patched model for both
            opt = make_optimizer(model, variant)
            row["optimizer"] = f"{type(opt).__module__}.{type(opt).__name__}"
            ids = tokens(cfg, model.config.vocab_size, device)
            row.update(timed_steps(train_step_fn(model, opt, ids), device))
            row["tokens_per_s"] = cfg["batch"] * cfg["seq"] / (row["wall_ms"] / 1e3)
            if hasattr(opt, "nonfinite_steps"):
                row["nonfinite_steps"] = int(opt.nonfinite_steps)
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"
        row["traceback"] = traceback.format_exc()[-3000:]
    log(json.dumps({k: v for k, v in row.items() if k != "traceback"}))
    return row


def optim_summary(rows: list[dict]) -> list[dict]:
    """The acceptance's three ratios (tritonkit over torch), each with its target."""
    by = {(r.get("config"), r.get("variant")): r for r in rows if "error" not in r}
    out = []
    for name, target in (("gpt2-2k", 1.0), ("llama-2k", 1.0)):
        a, b = by.get((name, "tk_adamw"), {}), by.get((name, "tk"), {})
        ratio = a["tokens_per_s"] / b["tokens_per_s"] if a and b else None
        out.append({"case": f"{name} AdamW tokens/s", "ratio": ratio, "target": target})
    a = by.get(("muon 8x4096^2 fp32", "muon_tritonkit"), {})
    b = by.get(("muon 8x4096^2 fp32", "muon_torch"), {})
    ratio = b["wall_ms"] / a["wall_ms"] if a and b else None
    out.append({"case": "Muon 8x4096^2 fp32 step", "ratio": ratio, "target": 1.4})
    for r in out:
        r["met"] = r["ratio"] is not None and r["ratio"] >= r["target"]
    return out


def worker_cold(variant: str, tiny: bool) -> dict:
    """The first three steps of a fresh process with empty caches (set by the parent)."""
    device = "cpu" if tiny else "cuda"
    name = "llama-2k"
    cfg = config(name, tiny)
    row = {"variant": variant, "config": name}
    try:
        torch.manual_seed(0)
        model = build(cfg, device)
        model.train()
        t_patch = time.perf_counter()
        apply_variant(model, variant, "llama")
        row["patch_s"] = time.perf_counter() - t_patch
        opt = make_optimizer(model, variant)
        ids = tokens(cfg, model.config.vocab_size, device)
        step = train_step_fn(model, opt, ids)
        sync(device)
        t0 = time.perf_counter()
        for _ in range(3):
            step()
        sync(device)
        row["first3_s"] = time.perf_counter() - t0
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"
        row["traceback"] = traceback.format_exc()[-3000:]
    return row


def run_worker(args: list[str], env: dict | None = None, timeout: int = 540) -> list | dict:
    """This script in a fresh process; its JSON result (or the error)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker-out", str(out), *args]
        e = dict(os.environ)
        e["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), e.get("PYTHONPATH", "")])
        e.update(env or {})
        try:
            proc = subprocess.run(cmd, env=e, timeout=timeout, capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout} s: {' '.join(args)}"}
        sys.stdout.write(proc.stdout[-4000:])
        if out.exists():
            return json.loads(out.read_text())
        return {"error": f"worker exited {proc.returncode}", "stderr": proc.stderr[-3000:]}


# -- sections ------------------------------------------------------------------------------------


def section_attn(tiny: bool) -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import tritonkit

    device = "cpu" if tiny else "cuda"
    b, h, hkv, t, d = (1, 4, 2, 32, 16) if tiny else (4, 16, 8, 2048, 128)
    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(heads):
        x = torch.randn(b, t, heads, d, generator=g).to(device, torch.bfloat16)
        return x.transpose(1, 2).requires_grad_(True)  # (B, H, T, D) views, as HF makes them

    q, k, v = rnd(h), rnd(hkv), rnd(hkv)
    dy = torch.randn(b, h, t, d, generator=g).to(device, torch.bfloat16)
    F = torch.nn.functional
    cudnn_first = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                   SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]  # fmt: skip
    rep = h // hkv

    def sdpa_default():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def sdpa_cudnn_first():
        with sdpa_kernel(cudnn_first, set_priority=True):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def cudnn_repeat_kv():
        kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, kk, vv, is_causal=True)

    def tk():
        return tritonkit.attention(q, k, v, is_causal=True, enable_gqa=True)

    ref = sdpa_default().float()
    rows = []
    cases = {"sdpa_default": sdpa_default, "sdpa_cudnn_first": sdpa_cudnn_first,
             "cudnn_repeat_kv": cudnn_repeat_kv, "tritonkit": tk}  # fmt: skip
    for name, fn in cases.items():
        row = {"case": name}
        try:
            if tiny and name.startswith(("cudnn", "sdpa_cudnn")):
                raise RuntimeError("cuDNN: GPU only")
            err = (fn().float() - ref).abs().max().item()

            def fwd_bwd(fn=fn):
                q.grad = k.grad = v.grad = None
                fn().backward(dy)

            row.update(time_ms(fwd_bwd, device, 3 if tiny else 20))
            row["max_abs_vs_sdpa"] = err
            flops = 4 * b * h * t * t * d / 2 * 3.5  # causal: half; fwd + bwd = 3.5 x fwd
            row["tflops"] = flops / (row.get("bench_ms", row["wall_ms"]) * 1e-3) / 1e12
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
        log(json.dumps(row))
    return rows


def section_match(tiny: bool) -> dict:
    import tritonkit

    device = "cpu" if tiny else "cuda"
    cfg = config("llama-2k", tiny)
    if not tiny:
        cfg["batch"] = 1
    torch.manual_seed(0)
    model = build(cfg, device)
    model.train()
    ids = tokens(cfg, model.config.vocab_size, device, seed=1)

    def run(m):
        m.zero_grad(set_to_none=True)
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.detach().double(), {n: p.grad.double() for n, p in m.named_parameters()}

    ref_model = build(cfg, device, torch.float32)
    ref_model.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    ref_model.train()
    loss_ref, g_ref = run(ref_model)
    del ref_model
    loss_e, g_e = run(model)
    tritonkit.patch(model)
    loss_p, g_p = run(model)

    def rel(a, b):
        return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()

    ratios, errs_e, errs_p, direct = [], [], [], []
    for n in g_ref:
        e, p = rel(g_e[n], g_ref[n]), rel(g_p[n], g_ref[n])
        errs_e.append(e)
        errs_p.append(p)
        ratios.append(p / max(e, 1e-12))
        direct.append(rel(g_p[n], g_e[n]))
    ratios.sort()
    out = {
        "loss_fp32": loss_ref.item(),
        "loss_eager_bf16": loss_e.item(),
        "loss_patched_bf16": loss_p.item(),
        "loss_rel_patched_vs_eager": abs((loss_p - loss_e) / loss_e).item(),
        "loss_rel_eager_vs_fp32": abs((loss_e - loss_ref) / loss_ref).item(),
        "loss_rel_patched_vs_fp32": abs((loss_p - loss_ref) / loss_ref).item(),
        "grad_rel_err_eager_vs_fp32_max": max(errs_e),
        "grad_rel_err_patched_vs_fp32_max": max(errs_p),
        "grad_ratio_patched_over_eager_median": ratios[len(ratios) // 2],
        "grad_ratio_patched_over_eager_max": ratios[-1],
        "grad_rel_patched_vs_eager_max": max(direct),
        "n_params": len(ratios),
    }
    log(json.dumps(out))
    return out


def markov_batches(cfg: dict, vocab: int, n: int, device: str, seed: int = 0):
    """n batches from a fixed random Markov chain on the first min(vocab, 1024) tokens, 4
    successors per token: a text with a learnable structure (loss floor log 4)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    states = min(vocab, 1024)
    succ = torch.randint(0, states, (states, 4), generator=g)
    out = []
    for _ in range(n):
        x = torch.empty(cfg["batch"], cfg["seq"], dtype=torch.int64)
        x[:, 0] = torch.randint(0, states, (cfg["batch"],), generator=g)
        picks = torch.randint(0, 4, (cfg["batch"], cfg["seq"]), generator=g)
        for i in range(1, cfg["seq"]):
            x[:, i] = succ[x[:, i - 1], picks[:, i]]
        out.append(x.to(device))
    return out


def section_curve(tiny: bool, steps: int) -> dict:
    import tritonkit

    device = "cpu" if tiny else "cuda"
    cfg = config("llama-2k", tiny)
    torch.manual_seed(0)
    base = build(cfg, device)
    init = {k: v.clone() for k, v in base.state_dict().items()}
    vocab = base.config.vocab_size
    batches = markov_batches(cfg, vocab, steps, device)
    curves = {}
    for name in ("eager", "tk", "tk_adamw"):
        model = base
        model.load_state_dict(init)
        model.train()
        if name != "eager":
            tritonkit.patch(model)
        opt = make_optimizer(model, name)
        losses = []
        for ids in batches:
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.detach())
        curves[name] = [float(x) for x in losses]
        if name != "eager":
            tritonkit.unpatch(model)
        del opt
    out = {"steps": steps, "curves": curves}
    ref = curves["eager"]
    for name in ("tk", "tk_adamw"):
        rel = [abs(a - b) / abs(b) for a, b in zip(curves[name], ref)]
        tail = rel[-min(50, len(rel)) :]
        out[f"{name}_max_rel"] = max(rel)
        out[f"{name}_tail_mean_rel"] = sum(tail) / len(tail)
    log(json.dumps({k: v for k, v in out.items() if k != "curves"}))
    return out


def section_infer(tiny: bool, variants: list[str]) -> list[dict]:
    import tritonkit
    from tritonkit.models import patched

    device = "cpu" if tiny else "cuda"
    cfg = config("llama-2k", tiny)
    new = 4 if tiny else 64
    rows = []
    torch.manual_seed(0)
    model = build(cfg, device).eval()
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    ids = tokens(cfg, model.config.vocab_size, device)
    for variant in variants:
        row = {"variant": variant}
        try:
            if variant == "tk":
                tritonkit.patch(model)
            elif variant == "tk_flash":
                tritonkit.patch(model, attention="tritonkit")
            with torch.no_grad():

                def prefill():
                    return model(input_ids=ids, use_cache=True, logits_to_keep=1)

                def generate():
                    return model.generate(
                        ids, max_new_tokens=new, min_new_tokens=new, do_sample=False
                    )

                row.update({f"prefill_{k}": v for k, v in time_ms(prefill, device, 2).items()})
                sync(device)
                t0 = time.perf_counter()
                generate()
                sync(device)
                total = time.perf_counter() - t0
            pre_ms = row.get("prefill_bench_ms", row["prefill_wall_ms"])
            row["prefill_tokens_per_s"] = cfg["batch"] * cfg["seq"] / (pre_ms / 1e3)
            decode_s = max(1e-9, total - row["prefill_wall_ms"] / 1e3)
            row["decode_tokens_per_s"] = cfg["batch"] * new / decode_s
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
        if patched(model):
            tritonkit.unpatch(model)
        rows.append(row)
        log(json.dumps(row))
    return rows


def section_fusion(tiny: bool) -> dict:
    from tritonkit.fusion import validate

    return validate(device="cpu" if tiny else "cuda", tiny=tiny)


# -- report --------------------------------------------------------------------------------------


def fingerprint() -> dict:
    import triton

    fp = {
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        fp["gpu"] = torch.cuda.get_device_name()
        fp["cuda"] = torch.version.cuda
        fp["cudnn"] = torch.backends.cudnn.version()
    else:
        fp["gpu"] = "none (CPU, Triton interpreter)"
    with contextlib.suppress(Exception):
        import transformers

        fp["transformers"] = transformers.__version__
    try:
        import liger_kernel

        fp["liger_kernel"] = getattr(liger_kernel, "__version__", "importable")
    except Exception as exc:
        fp["liger_kernel"] = f"not importable ({type(exc).__name__})"
    with contextlib.suppress(Exception):
        fp["commit"] = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    return fp


def markdown(results: dict) -> str:
    lines = [f"# gpu_models — {results['env'].get('gpu')}", ""]
    train = [r for r in results.get("train", []) if isinstance(r, dict)]
    if train:
        head = (
            "| config | variant | tokens/s | ms (bench) | ms (wall) | peak GiB | x eager | x liger"
        )
        lines += ["## Training step", "", head + " | first 3 steps s |", "|---" * 9 + "|"]
        by = {(r.get("config"), r.get("variant")): r for r in train}
        for r in train:
            if "error" in r:
                lines.append(
                    f"| {r.get('config')} | {r.get('variant')} | error: {r['error'][:80]} |"
                )
                continue
            e = by.get((r["config"], "eager"), {})
            li = by.get((r["config"], "liger"), {})

            def x(o, r=r):
                return (
                    f"{r['tokens_per_s'] / o['tokens_per_s']:.3f}" if "tokens_per_s" in o else "-"
                )

            lines.append(
                f"| {r['config']} | {r['variant']} | {r['tokens_per_s']:,.0f} | "
                f"{r.get('bench_ms', float('nan')):.2f} | {r['wall_ms']:.2f} | "
                f"{r.get('peak_gib', float('nan')):.2f} | {x(e)} | {x(li)} | {r['first3_s']:.2f} |"
            )
        lines.append("")
    optim_rows = [r for r in results.get("optim", []) if isinstance(r, dict)]
    if optim_rows:
        warm, timed = OPTIM_STEPS
        lines += [f"## Optimizers at their defaults ({timed} steps after {warm}, wall time)", ""]
        lines += ["| case | variant | optimizer | ms/step (wall) | GPU ms/step (median) | "
                  "tokens/s |", "|---" * 6 + "|"]  # fmt: skip
        for r in optim_rows:
            if "error" in r:
                lines.append(f"| {r.get('config')} | {r.get('variant')} | error: "
                             f"{r['error'][:100]} | | | |")  # fmt: skip
                continue
            tps = f"{r['tokens_per_s']:,.0f}" if "tokens_per_s" in r else "-"
            lines.append(
                f"| {r['config']} | {r['variant']} | {r.get('optimizer', '-')} | "
                f"{r['wall_ms']:.2f} | {r.get('gpu_ms_median', float('nan')):.2f} | {tps} |"
            )
        lines += ["", "| acceptance | tritonkit / torch | target | met |", "|---|---|---|---|"]
        for r in results.get("optim_summary", []):
            ratio = f"{r['ratio']:.3f}x" if r["ratio"] is not None else "n/a"
            lines.append(f"| {r['case']} | {ratio} | >= {r['target']}x | "
                         f"{'yes' if r['met'] else 'NO'} |")  # fmt: skip
        lines.append("")
    for key, title in (
        ("cold", "Cold start (first three steps, empty caches)"),
        ("attn", "Attention fwd+bwd"),
        ("infer", "Inference"),
    ):
        rows = results.get(key)
        if rows:
            lines += [f"## {title}", "", "```"] + [json.dumps(r) for r in rows] + ["```", ""]
    for key in ("match", "curve", "fusion"):
        val = results.get(key)
        if isinstance(val, dict):
            val = {k: v for k, v in val.items() if k != "curves"}
            lines += [f"## {key}", "", "```", json.dumps(val, indent=1), "```", ""]
    if results.get("errors"):
        lines += ["## Errors", "", "```", json.dumps(results["errors"], indent=1)[:6000], "```"]
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in results.get("train", []) if "tokens_per_s" in r]
    if not train:
        return
    configs = sorted(
        {r["config"] for r in train}, key=lambda c: CONFIGS.index(c) if c in CONFIGS else 9
    )
    variants = [v for v in VARIANTS if any(r["variant"] == v for r in train)]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / max(1, len(variants))
    for i, v in enumerate(variants):
        for ax, key, scale in ((axes[0], "tokens_per_s", 1e3), (axes[1], "peak_gib", 1)):
            xs, ys = [], []
            for j, c in enumerate(configs):
                r = next((r for r in train if r["config"] == c and r["variant"] == v), None)
                if r is not None and key in r:
                    xs.append(j + i * width)
                    ys.append(r[key] / scale)
            ax.bar(xs, ys, width, label=v)
    for ax, title in ((axes[0], "training tokens/s (thousands)"), (axes[1], "peak memory (GiB)")):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(configs))], configs)
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"tritonkit.patch vs eager, torch.compile, Liger — {results['env'].get('gpu')}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# -- main ----------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out_models")))
    ap.add_argument("--tiny", action="store_true", help="tiny sizes on the CPU (interpreter)")
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--steps", type=int, default=200, help="loss-curve steps")
    ap.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        help="models.json files of earlier runs (e.g. one per --sections split): merged into "
        "--out's models.json, models.md and models.png, nothing run",
    )
    ap.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tiny:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        if args.configs == ",".join(CONFIGS):  # the interpreter is slow: one config per family
            args.configs = "llama-2k,gpt2-2k"
    if args.worker:  # a child process: one variant's measurements
        kind, variant = args.worker.split(":")
        configs = args.configs.split(",")
        if kind == "train":
            res = worker_train(variant, configs, args.tiny)
        elif kind == "optim":
            res = worker_optim(variant, configs[0], args.tiny)
        else:
            res = worker_cold(variant, args.tiny)
        args.worker_out.write_text(json.dumps(res))
        return
    if args.merge:
        merged: dict = {"errors": {}}
        for path in args.merge:
            doc = json.loads(path.read_text())
            merged.setdefault("env", doc.get("env", {}))
            for key, val in doc.items():
                if key in ("env", "args", "seconds"):
                    continue
                if key == "errors":
                    merged["errors"].update(val)
                elif isinstance(val, list):
                    merged.setdefault(key, []).extend(val)
                else:
                    merged[key] = val
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "models.json").write_text(json.dumps(merged, indent=1, default=str))
        (args.out / "models.md").write_text(markdown(merged))
        plot(merged, args.out / "models.png")
        log(markdown(merged))
        return
    sections = [s for s in args.sections.split(",") if s]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}; known: {list(SECTIONS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    tiny_flag = ["--tiny"] if args.tiny else []
    results: dict = {
        "env": fingerprint(),
        "args": vars(args) | {"out": str(args.out)},
        "errors": {},
    }
    log(json.dumps(results["env"]))
    t_start = time.time()

    def run(name, fn):
        if name not in sections:
            return
        log(f"\n== {name}")
        t0 = time.time()
        try:
            results[name] = fn()
        except Exception:
            results["errors"][name] = traceback.format_exc()[-4000:]
            log(results["errors"][name])
        log(f"   ({time.time() - t0:.0f} s)")
        save()

    def save():
        (args.out / "models.json").write_text(json.dumps(results, indent=1, default=str))
        (args.out / "models.md").write_text(markdown(results))

    variants = [v for v in args.variants.split(",") if v]

    def train():
        rows = []
        for v in variants:
            if args.tiny and v in ("compile", "tk_compile", "liger"):
                rows.append({"variant": v, "config": "*", "error": "skipped under --tiny (CPU)"})
                continue
            res = run_worker(["--worker", f"train:{v}", "--configs", args.configs, *tiny_flag])
            rows += res if isinstance(res, list) else [{"variant": v, **res}]
        return rows

    def optim():
        rows = []
        cases = [(c, v) for c in ("gpt2-2k", "llama-2k") for v in ("tk", "tk_adamw")]
        cases += [("muon", "muon_torch"), ("muon", "muon_tritonkit")]
        for name, v in cases:
            res = run_worker(["--worker", f"optim:{v}", "--configs", name, *tiny_flag])
            rows.append(res if "variant" in res else {"variant": v, "config": name, **res})
        results["optim_summary"] = optim_summary(rows)
        return rows

    def cold():
        rows = []
        for v in ("eager", "liger", "tk", "tk_adamw"):
            if args.tiny and v == "liger":
                continue
            with tempfile.TemporaryDirectory() as tmp:
                caches = ("TRITON_CACHE_DIR", "TRITONKIT_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")
                env = {k: str(Path(tmp) / k.lower()) for k in caches}
                t0 = time.time()
                res = run_worker(["--worker", f"cold:{v}", *tiny_flag], env)
                if isinstance(res, dict):
                    res["process_s"] = time.time() - t0
                rows.append(res)
                log(json.dumps({k: v for k, v in res.items() if k != "traceback"}))
        return rows

    run("attn", lambda: section_attn(args.tiny))
    run("train", train)
    run("optim", optim)
    run("cold", cold)
    run("match", lambda: section_match(args.tiny))
    run("curve", lambda: section_curve(args.tiny, 5 if args.tiny else args.steps))
    run("infer", lambda: section_infer(args.tiny, ["eager", "tk", "tk_flash"]))
    run("fusion", lambda: section_fusion(args.tiny))
    results["seconds"] = time.time() - t_start
    save()
    try:
        plot(results, args.out / "models.png")
    except Exception:
        results["errors"]["plot"] = traceback.format_exc()[-2000:]
        save()
    log("\n" + markdown(results))


if __name__ == "__main__":
    main()
