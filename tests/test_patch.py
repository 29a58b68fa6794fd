"""tritonkit.patch / unpatch: patched models give the unpatched outputs, unpatching restores
them exactly, and what is not supported is left alone and reported.

Tiny configurations (hidden 64, 2 layers, vocabulary 128, 16 tokens) so that the kernels run
under the interpreter in seconds. float32 comparisons are tight (the kernels compute in
float32 as PyTorch does, in another order); bfloat16 ones are relative to bf16's rounding.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tritonkit
from tritonkit.models import LinearCrossEntropyConfig, linear_cross_entropy, patched

transformers = pytest.importorskip("transformers")

VOCAB, SEQ, BATCH = 128, 16, 2


def _llama_like(family: str, dtype: torch.dtype = torch.float32) -> nn.Module:
    common = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=64,
    )
    if family == "llama":
        cfg = transformers.LlamaConfig(**common)
        cls = transformers.LlamaForCausalLM
    elif family == "mistral":
        cfg = transformers.MistralConfig(**common, sliding_window=None)
        cls = transformers.MistralForCausalLM
    else:
        cfg = transformers.Qwen2Config(**common, use_sliding_window=False)
        cls = transformers.Qwen2ForCausalLM
    return cls(cfg).to(dtype)


def _gpt2(dropout: float = 0.0) -> nn.Module:
    cfg = transformers.GPT2Config(
        n_embd=64,
        n_layer=2,
        n_head=4,
        vocab_size=VOCAB,
        n_positions=64,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
    )
    return transformers.GPT2LMHeadModel(cfg)


def _build(family: str) -> nn.Module:
    torch.manual_seed(0)
    return _gpt2() if family == "gpt2" else _llama_like(family)


def _step(model: nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = model(ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _close_grads(a: dict, b: dict, atol: float, rtol: float) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], atol=atol, rtol=rtol, msg=name)


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "gpt2"])
def test_patch_matches_and_unpatch_restores(family):
    model = _build(family)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    keys = list(model.state_dict())
    model.eval()
    with torch.no_grad():
        logits_ref = model(ids).logits
    model.train()
    loss_ref, grads_ref = _step(model, ids)

    report = tritonkit.patch(model)
    assert patched(model)
    kinds = {r.what for r in report.replaced}
    assert any("without logits" in w for w in kinds)
    assert any("fused" in w for w in kinds)
    assert any("attention" in w for w in kinds)
    assert list(model.state_dict()) == keys  # nothing renamed or replaced
    assert model(ids, labels=ids).logits is None  # training with labels: no logits made
    loss, grads = _step(model, ids)
    torch.testing.assert_close(loss, loss_ref, atol=1e-5, rtol=1e-5)
    _close_grads(grads_ref, grads, atol=2e-5, rtol=1e-4)
    model.eval()
    with torch.no_grad():
        out = model(ids)
        torch.testing.assert_close(out.logits, logits_ref, atol=2e-5, rtol=1e-4)
        # In eval mode the loss comes with its logits, as unpatched.
        assert model(ids, labels=ids).logits is not None

    tritonkit.unpatch(model)
    assert not patched(model)
    assert model.config._attn_implementation == "sdpa"
    assert all("forward" not in m.__dict__ for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(ids).logits, logits_ref)


@pytest.mark.compile
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_patched_model_under_torch_compile(family):
    model = _build(family)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(5))
    loss_ref, grads_ref = _step(model, ids)
    tritonkit.patch(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager")  # CPU: the same tracing as inductor's
    loss, grads = _step(compiled, ids)
    torch.testing.assert_close(loss, loss_ref, atol=1e-5, rtol=1e-5)
    _close_grads({f"_orig_mod.{k}": v for k, v in grads_ref.items()}, grads, atol=2e-5, rtol=1e-4)
    tritonkit.unpatch(model)


def test_llama_bf16_loss_and_grads_within_bf16_rounding():
    model = _llama_like("llama", torch.bfloat16)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(2))
    model.train()
    loss_ref, grads_ref = _step(model, ids)
    tritonkit.patch(model)
    loss, grads = _step(model, ids)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, loss_ref, atol=0, rtol=1e-2)
    for name, g in grads.items():
        ref = grads_ref[name].float()
        # Relative L2 error of each gradient: bf16 rounds at 2^-8 per operation.
        err = (g.float() - ref).norm() / ref.norm().clamp_min(1e-30)
        assert err < 3e-2, (name, err.item())
    tritonkit.unpatch(model)


def test_patch_options_and_errors():
    model = _build("llama")
    with pytest.raises(TypeError, match="unknown options"):
        tritonkit.patch(model, fused=True)
    with pytest.raises(ValueError, match="attention must be one of"):
        tritonkit.patch(model, attention="flash")
    with pytest.raises(ValueError, match="not patched"):
        tritonkit.unpatch(model)
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        tritonkit.patch("model")
    report = tritonkit.patch(model, attention="keep", loss=False, residual=False)
    with pytest.raises(ValueError, match="already patched"):
        tritonkit.patch(model)
    whats = {r.what for r in report.replaced}
    assert not any("attention" in w or "logits" in w or "fused" in w for w in whats)
    assert any("attention kept" in r.reason for r in report.left)
    assert model.config._attn_implementation == "sdpa"
    tritonkit.unpatch(model)


class _Unknown(nn.Module):
    """A module no rule knows: must be left alone and reported."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((32,), 1.5))

    def forward(self, x):
        return x * self.scale


def test_plain_modules_patched_and_unknown_left():
    torch.manual_seed(3)
    model = nn.Sequential(
        nn.LayerNorm(32),
        nn.Linear(32, 48),
        nn.GELU(approximate="tanh"),
        nn.Linear(48, 32),
        nn.SiLU(),
        _Unknown(),
        nn.RMSNorm(32, eps=1e-6),
        nn.ReLU(inplace=True),
        nn.MultiheadAttention(32, 4, batch_first=True),
        nn.Softmax(dim=-1),
    )
    head = model[:8]  # MultiheadAttention takes three inputs; checked on its own below
    x = torch.randn(3, 5, 32, requires_grad=True)
    ref = head(x)
    (gx_ref,) = torch.autograd.grad(ref.square().sum(), x)
    report = tritonkit.patch(model)
    out = head(x)
    (gx,) = torch.autograd.grad(out.square().sum(), x)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gx, gx_ref, atol=1e-4, rtol=1e-4)
    replaced = {r.path: r.what for r in report.replaced}
    assert replaced == {
        "0": "tritonkit.layer_norm",
        "2": "tritonkit activation (gelu_tanh)",
        "4": "tritonkit activation (silu)",
        "6": "tritonkit.rms_norm",
        "9": "tritonkit.softmax",
    }
    left = {r.path: r.reason for r in report.left}
    assert left["5"] == "no tritonkit rule for this module"
    assert "7" in left  # in-place ReLU: tritonkit's returns a new tensor
    assert left["1"].startswith("GEMM")
    assert "8.out_proj" in left  # MultiheadAttention's projection, reported
    q = torch.randn(2, 4, 32)
    torch.testing.assert_close(model[8](q, q, q)[0], model[8](q, q, q)[0])
    assert "_Unknown" in str(report) and "no tritonkit rule" in str(report)
    tritonkit.unpatch(model)


def test_cross_entropy_module():
    logits = torch.randn(6, 11, requires_grad=True)
    target = torch.tensor([0, 3, -100, 10, 5, 5])
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    ref = loss_fn(logits, target)
    tritonkit.patch(loss_fn)
    torch.testing.assert_close(loss_fn(logits, target), ref)
    probs = torch.softmax(torch.randn(6, 11), -1)  # class probabilities: PyTorch's path
    torch.testing.assert_close(
        loss_fn(logits, probs), F.cross_entropy(logits, probs, label_smoothing=0.1)
    )


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_linear_cross_entropy_chunks(reduction):
    g = torch.Generator().manual_seed(4)
    n, h, v = 37, 24, 53  # odd sizes; 7 rows per chunk below: 6 chunks, the last short
    x = torch.randn(n, h, generator=g, dtype=torch.float64).float().requires_grad_(True)
    w = (torch.randn(v, h, generator=g) * 0.2).requires_grad_(True)
    b = torch.randn(v, generator=g).requires_grad_(True)
    t = torch.randint(0, v, (n,), generator=g)
    t[::5] = -100
    cfg = LinearCrossEntropyConfig(chunk_bytes=7 * v * 4, min_rows=1)
    loss = linear_cross_entropy(x, w, t, b, reduction=reduction, label_smoothing=0.05, config=cfg)
    (loss * 2.5).backward()
    grads = [p.grad.clone() for p in (x, w, b)]
    xd, wd, bd = (p.detach().double().requires_grad_(True) for p in (x, w, b))
    ref = F.cross_entropy(F.linear(xd, wd, bd), t, reduction=reduction, label_smoothing=0.05)
    (ref * 2.5).backward()
    torch.testing.assert_close(loss.double(), ref.detach(), atol=1e-5, rtol=1e-5)
    for got, want in zip(grads, (xd.grad, wd.grad, bd.grad)):
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-4)


def test_linear_cross_entropy_edges():
    x = torch.randn(4, 8)
    w = torch.randn(10, 8)
    t = torch.full((4,), -100)
    assert torch.isnan(linear_cross_entropy(x, w, t))  # every target ignored: NaN, as PyTorch
    with pytest.raises(ValueError, match="reduction"):
        linear_cross_entropy(x, w, t, reduction="none")
    with pytest.raises(ValueError, match=r"weight\.shape"):
        linear_cross_entropy(x, w[:, :7], t)
    with pytest.raises(TypeError, match="int64"):
        linear_cross_entropy(x, w, t.int())
    with pytest.raises(ValueError, match="leading shape"):
        linear_cross_entropy(x, w, t[:3])


def test_rope_function_patched_while_any_model_is():
    from transformers.models.llama import modeling_llama

    original = modeling_llama.apply_rotary_pos_emb
    a, b = _build("llama"), _build("llama")
    report = tritonkit.patch(a)
    assert any("tritonkit.rope" in r.what for r in report.replaced)
    tritonkit.patch(b)
    assert modeling_llama.apply_rotary_pos_emb is not original
    tritonkit.unpatch(a)
    assert modeling_llama.apply_rotary_pos_emb is not original  # b still needs it
    tritonkit.unpatch(b)
    assert modeling_llama.apply_rotary_pos_emb is original
    tritonkit.patch(a, rope=False)
    assert modeling_llama.apply_rotary_pos_emb is original
    tritonkit.unpatch(a)


@pytest.mark.parametrize("route", ["sdpa_repeat_kv", "tritonkit"])
def test_attention_routes_give_the_same_logits(route):
    model = _build("llama").eval()  # 4 query heads over 2 KV heads: grouped-query attention
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        ref = model(ids).logits
        tritonkit.patch(model, attention=route)
        assert model.config._attn_implementation.startswith("tritonkit_")
        torch.testing.assert_close(model(ids).logits, ref, atol=2e-5, rtol=1e-4)
    tritonkit.unpatch(model)


def test_unsupported_family_left_alone_and_reported():
    """Gemma: RMSNorm scaled by 1 + weight, its own layer and head: none of the Llama rules
    apply; they are reported, and the model computes what it computed."""
    torch.manual_seed(7)
    cfg = transformers.GemmaConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=VOCAB, max_position_embeddings=64,
    )  # fmt: skip
    model = transformers.GemmaForCausalLM(cfg).eval()
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        ref = model(ids, labels=ids)
        report = tritonkit.patch(model)
        out = model(ids, labels=ids)
    reasons = {r.kind: r.reason for r in report.left}
    assert "norm variant not recognised" in reasons["GemmaRMSNorm"]
    assert "unsupported family" in reasons["GemmaDecoderLayer"]
    assert "unsupported family" in reasons["GemmaForCausalLM"]
    assert not any(r.kind in ("GemmaRMSNorm", "GemmaDecoderLayer") for r in report.replaced)
    torch.testing.assert_close(out.logits, ref.logits, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(out.loss, ref.loss, atol=1e-5, rtol=1e-5)
    tritonkit.unpatch(model)
