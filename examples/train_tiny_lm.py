"""Train a small Llama-style language model with tritonkit's patch and optimizer.

    python examples/train_tiny_lm.py                      # GPU: a few minutes
    python examples/train_tiny_lm.py --cpu --steps 20     # CPU, Triton interpreter: tiny, slow

The text is this repository's own Markdown (README and docs), read as bytes (a 256-token
vocabulary), so nothing is downloaded. The model is transformers' ``LlamaForCausalLM`` with
random initial weights; ``tritonkit.patch`` makes it run tritonkit's kernels (fused norms and
residual adds, SwiGLU, rotary embedding, SDPA attention, the loss without logits), and
``tritonkit.optim.AdamW`` steps it with the gradient clipped by its global norm inside the
step (``clip_grad_norm_``). The loss curve (train and held-out) goes to ``--out`` as a PNG.
Needs ``transformers`` (``pip install transformers``) and matplotlib for the plot.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def corpus() -> bytes:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return b"\n\n".join(f.read_bytes() for f in files if f.exists())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", action="store_true", help="tiny model on the CPU (interpreter)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--out", type=Path, default=Path("tiny_lm_loss.png"))
    args = ap.parse_args()
    if args.cpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before tritonkit defines a kernel
    sys.path.insert(0, str(ROOT / "src"))

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import tritonkit
    from tritonkit.optim import AdamW

    device = "cpu" if args.cpu or not torch.cuda.is_available() else "cuda"
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("no GPU: run with --cpu (the kernels then run under Triton's interpreter)")
    tiny = device == "cpu"
    steps = args.steps or (20 if tiny else 600)
    batch, seq = (4, 64) if tiny else (32, 512)
    torch.manual_seed(0)

    data = torch.frombuffer(bytearray(corpus()), dtype=torch.uint8).long()
    split = int(0.95 * len(data))
    train, held = data[:split], data[split:]

    def sample(src: torch.Tensor) -> torch.Tensor:
        starts = torch.randint(0, len(src) - seq - 1, (batch,))
        return torch.stack([src[s : s + seq] for s in starts]).to(device)

    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=64 if tiny else 512,
        intermediate_size=128 if tiny else 1408,
        num_hidden_layers=2 if tiny else 8,
        num_attention_heads=4 if tiny else 8,
        num_key_value_heads=2 if tiny else 4,
        max_position_embeddings=seq,
    )
    dtype = torch.float32 if tiny else torch.bfloat16
    model = LlamaForCausalLM(cfg).to(device, dtype)
    print(tritonkit.patch(model))
    opt = AdamW(model.parameters(), lr=1e-3 if tiny else 6e-4, weight_decay=0.1, nonfinite="skip")
    warmup = max(1, steps // 20)

    def lr_at(step: int) -> float:  # linear warm-up, cosine decay to 10%
        base = opt.defaults["lr"]
        if step < warmup:
            return base * (step + 1) / warmup
        t = (step - warmup) / max(1, steps - warmup)
        return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    curve, held_curve = [], []
    t0 = time.time()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        model.train()
        ids = sample(train)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        norm = opt.clip_grad_norm_(1.0)  # applied inside the step below
        opt.step()
        opt.zero_grad(set_to_none=True)
        curve.append(float(loss.detach()))
        if step % max(1, steps // 20) == 0 or step == steps - 1:
            model.eval()
            with torch.no_grad():
                ids = sample(held)
                held_loss = float(model(input_ids=ids, labels=ids).loss)
            held_curve.append((step, held_loss))
            print(
                f"step {step:5d}  loss {curve[-1]:.3f}  held-out {held_loss:.3f}  "
                f"grad norm {float(norm):.2f}  {time.time() - t0:.0f} s",
                flush=True,
            )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(curve, lw=0.8, label="train")
    ax.plot(*zip(*held_curve), "o-", label="held-out")
    ax.axhline(math.log(256), ls=":", c="gray", label="uniform over bytes")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per byte)")
    ax.set_title(f"tiny Llama on this repo's docs, tritonkit.patch + AdamW ({device})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
