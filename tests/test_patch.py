"""tritonkit.patch / unpatch: patched models give the unpatched outputs, a patch changes only
the model it is given, unpatching restores every attribute exactly, and what is not supported
is left alone and reported.

Tiny configurations (hidden 64, 2 layers, vocabulary 128, 16 tokens) so that the kernels run
under the interpreter in seconds; every model and tensor is built on the ``device`` fixture, so
the same assertions run on a GPU. float32 comparisons are tight (the kernels compute in
float32 as PyTorch does, in another order); bfloat16 ones are relative to bf16's rounding.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tritonkit
from tritonkit.models import LinearCrossEntropyConfig, linear_cross_entropy, patched

from _checks import compile_backend

transformers = pytest.importorskip("transformers")

VOCAB, SEQ, BATCH = 128, 16, 2
HF_FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gpt2"]


def _llama_like(family: str, device, dtype=torch.float32, layers: int = 2) -> nn.Module:
    common = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=layers,
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
    elif family == "qwen2":
        cfg = transformers.Qwen2Config(**common, use_sliding_window=False)
        cls = transformers.Qwen2ForCausalLM
    else:  # Qwen3: a head dim of its own and RMSNorms on q and k
        cfg = transformers.Qwen3Config(**common, head_dim=16, use_sliding_window=False)
        cls = transformers.Qwen3ForCausalLM
    return cls(cfg).to(device, dtype)


def _gpt2_config(layers: int = 2, dropout: float = 0.0):
    return transformers.GPT2Config(
        n_embd=64,
        n_layer=layers,
        n_head=4,
        vocab_size=VOCAB,
        n_positions=64,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
    )


def _build(family: str, device, layers: int = 2) -> nn.Module:
    torch.manual_seed(0)
    if family == "gpt2":
        return transformers.GPT2LMHeadModel(_gpt2_config(layers)).to(device)
    return _llama_like(family, device, layers=layers)


def _twin(model: nn.Module) -> nn.Module:
    """Another model of the same class built from the same config object (transformers keeps
    the object: a patch that changed the config would change both)."""
    torch.manual_seed(1)
    return type(model)(model.config).to(model.device)


def _ids(device, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g).to(device)


def _step(model: nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = model(ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _close_grads(a: dict, b: dict, atol: float, rtol: float) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], atol=atol, rtol=rtol, msg=name)


@contextlib.contextmanager
def _triton_launches():
    """Counts every Triton kernel launch while active (yields the list of launches): Triton's
    own launcher (``run`` of a JIT function, compiled or interpreted: first calls, the
    interpreter, kernels launched as ``fn[grid]``) and tritonkit's direct path
    (``launch._direct``, which bound and direct launches end in). Replay is suspended
    meanwhile, so that no call runs from C++ unseen."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    from tritonkit.ops._core import launch, replay

    launches: list[str] = []

    def counted_run(run):
        def wrapped(self, *args, **kwargs):
            if not kwargs.get("warmup", False):
                launches.append(getattr(self, "__name__", "?"))
            return run(self, *args, **kwargs)

        return wrapped

    def counted_direct(entry, *args):
        launches.append("direct")
        return real_direct(entry, *args)

    real_direct = launch._direct
    runs = [(cls, cls.__dict__["run"]) for cls in (JITFunction, InterpretedFunction)]
    try:
        for cls, run in runs:
            cls.run = counted_run(run)
        launch._direct = counted_direct
        with replay.suspended():
            yield launches
    finally:
        launch._direct = real_direct
        for cls, run in runs:
            cls.run = run


def _attributes(model: nn.Module) -> dict:
    """The objects a patch could change, by identity: every instance attribute of every module
    and of every config it holds, and every module-level name of the files its classes (and
    their bases) come from."""
    out = {}
    for path, m in model.named_modules():
        out[("module", path)] = dict(m.__dict__)
        cfg = m.__dict__.get("config")
        if cfg is not None:
            out[("config", path)] = dict(vars(cfg))
        for cls in type(m).__mro__:
            name = cls.__module__
            if name.startswith(("transformers.", "torch.nn.")):
                out[("file", name)] = dict(vars(sys.modules[name]))
    return out


def _assert_same_attributes(before: dict, after: dict) -> None:
    assert before.keys() == after.keys()
    for where, attrs in before.items():
        now = after[where]
        assert now.keys() == attrs.keys(), (where, set(now) ^ set(attrs))
        changed = [k for k, v in attrs.items() if now[k] is not v]
        assert not changed, (where, changed)


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "gpt2"])
def test_patch_matches_and_unpatch_restores(family, device):
    model = _build(family, device)
    ids = _ids(device, 1)
    keys = list(model.state_dict())
    model.eval()
    with torch.no_grad():
        logits_ref = model(ids).logits
    model.train()
    loss_ref, grads_ref = _step(model, ids)
    before = _attributes(model)

    report = tritonkit.patch(model)
    try:
        assert patched(model)
        kinds = {r.what for r in report.replaced}
        assert any("no logits in training" in w for w in kinds)
        assert any("fused" in w for w in kinds)
        assert any("attention" in w for w in kinds)
        assert any("tritonkit.rope" in w for w in kinds) == (family != "gpt2")
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
    finally:
        tritonkit.unpatch(model)
    model.train()
    assert not patched(model)
    _assert_same_attributes(before, _attributes(model))
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, logits_ref)


def _plain(device) -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(
        nn.LayerNorm(32),
        nn.Linear(32, 48),
        nn.GELU(approximate="tanh"),
        nn.Linear(48, 32),
        nn.SiLU(),
        nn.RMSNorm(32, eps=1e-6),
        nn.Softmax(dim=-1),
    ).to(device)


@pytest.mark.parametrize("family", [*HF_FAMILIES, "plain"])
def test_patch_changes_only_its_model(family, device):
    """Beside a patched model: a model never patched (built from the patched one's config
    object) and one patched then unpatched give their eager outputs bit for bit and launch no
    Triton kernel, forward and backward; nothing they share with the patched model (config,
    module-level functions, classes) changes; and a patched model that is garbage collected
    is freed (nothing global holds it)."""
    if family == "plain":
        a, b, c = _plain(device), _plain(device), _plain(device)
        x = torch.randn(3, 5, 32, device=device)

        def run(m, train=False):
            x_ = x.clone().requires_grad_(train)
            out = m(x_)
            if train:
                out.square().sum().backward()
                return out.detach(), x_.grad
            return out, None
    else:
        a = _build(family, device, layers=1)
        b, c = _twin(a), _twin(a)
        ids = _ids(device, 11)

        def run(m, train=False):
            m.train(train)
            with torch.set_grad_enabled(train):
                out = m(ids, labels=ids)
            if train:
                out.loss.backward()
                return out.loss.detach(), out.logits.detach()
            return out.logits, out.loss

    refs = {name: (run(m), run(m, train=True)) for name, m in (("b", b), ("c", c))}
    before = {"b": _attributes(b), "c": _attributes(c)}

    tritonkit.patch(a)
    try:
        tritonkit.patch(c)
        tritonkit.unpatch(c)
        for name, m in (("b", b), ("c", c)):
            with _triton_launches() as launches:
                got = (run(m), run(m, train=True))
            assert not launches, (name, launches)
            for want_t, got_t in zip(refs[name], got):
                for w, g in zip(want_t, got_t):
                    assert (w is None and g is None) or torch.equal(w, g), name
            _assert_same_attributes(before[name], _attributes(m))
        with _triton_launches() as launches:
            run(a)
        assert launches  # the counter sees the patched model's kernels
    finally:
        tritonkit.unpatch(a)
    with _triton_launches() as launches:
        run(a)
    assert not launches

    tritonkit.patch(a)
    freed = weakref.ref(a)
    del a
    gc.collect()
    assert freed() is None
    assert torch.equal(run(b)[0], refs["b"][0][0])


def test_tritonkit_modules_are_reported_as_such(device):
    """tritonkit.nn modules already run tritonkit's kernels: reported as such, untouched; the
    report speaks of the device the model is on."""
    torch.manual_seed(4)
    model = nn.Sequential(
        tritonkit.nn.Linear(32, 48),
        tritonkit.nn.RMSNorm(48),
        nn.Linear(48, 32),
        tritonkit.nn.Linear(32, 32),
        tritonkit.nn.LayerNorm(32),
        nn.LayerNorm(32),
    ).to(device)
    x = torch.randn(3, 32, device=device)
    with torch.no_grad():
        ref = model(x)
    report = tritonkit.patch(model)
    try:
        already = {r.path: r.kind for r in report.already}
        assert already == {
            "0": "tritonkit.nn.Linear",
            "1": "tritonkit.nn.RMSNorm",
            "3": "tritonkit.nn.Linear",
            "4": "tritonkit.nn.LayerNorm",
        }
        assert {r.path for r in report.replaced} == {"5"}
        assert {r.path for r in report.left} == {"2"}
        assert all("forward" not in model[int(p)].__dict__ for p in already)
        text = str(report)
        assert "2 x tritonkit.nn.Linear: a tritonkit module" in text
        gemm = report.left[0].reason
        if device.type == "cuda" and not torch.version.hip:
            assert gemm == "GEMM left on PyTorch (cuBLAS)"
        elif device.type == "cpu":
            assert gemm == "GEMM left on PyTorch (its CPU GEMM)"
            assert "cuBLAS" not in text and "cuDNN" not in text
        with torch.no_grad():
            torch.testing.assert_close(model(x), ref, atol=1e-5, rtol=1e-5)
    finally:
        tritonkit.unpatch(model)


def test_report_speaks_of_the_device(device):
    report = str(tritonkit.patch(model := _build("llama", device, layers=1)))
    tritonkit.unpatch(model)
    if device.type == "cpu":
        assert "cuBLAS" not in report and "cuDNN" not in report
        assert "SDPA, PyTorch's kernel for the CPU" in report
    elif not torch.version.hip:
        assert "cuBLAS" in report and "SDPA, cuDNN then flash" in report


@pytest.mark.parametrize("mode", ["eval", "always", "never"])
def test_logits_option(mode, device):
    """patch(logits=...): "eval" makes none in training, "always" returns them (the same
    logits, loss and gradients as unpatched), "never" makes none in eval mode either."""
    model = _build("llama", device)
    ids = _ids(device, 9)
    model.train()
    ref = model(ids, labels=ids)
    ref.loss.backward()
    grads_ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    report = tritonkit.patch(model, logits=mode)
    try:
        assert any(f"logits='{mode}'" in r.what for r in report.replaced)
        out = model(ids, labels=ids)
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        torch.testing.assert_close(out.loss, ref.loss, atol=1e-5, rtol=1e-5)
        _close_grads(grads_ref, grads, atol=2e-5, rtol=1e-4)
        if mode == "always":
            assert out.logits.dtype == ref.logits.dtype
            torch.testing.assert_close(out.logits, ref.logits, atol=2e-5, rtol=1e-4)
        else:
            assert out.logits is None
        model.eval()
        with torch.no_grad():
            ev = model(ids, labels=ids)
        assert (ev.logits is None) == (mode == "never")
        torch.testing.assert_close(ev.loss, ref.loss, atol=1e-5, rtol=1e-5)
    finally:
        tritonkit.unpatch(model)


@pytest.mark.compile
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_patched_model_under_torch_compile(family, device):
    model = _build(family, device)
    ids = _ids(device, 5)
    loss_ref, grads_ref = _step(model, ids)
    tritonkit.patch(model)
    try:
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=compile_backend(device))
        loss, grads = _step(compiled, ids)
    finally:
        tritonkit.unpatch(model)
    torch.testing.assert_close(loss, loss_ref, atol=1e-5, rtol=1e-5)
    _close_grads({f"_orig_mod.{k}": v for k, v in grads_ref.items()}, grads, atol=2e-5, rtol=1e-4)


def test_llama_bf16_loss_and_grads_within_bf16_rounding(device):
    """bf16 end to end. The patched kernels here (norms, SwiGLU, rope, cross-entropy) have no
    dot products, so this runs under the interpreter too."""
    torch.manual_seed(0)
    model = _llama_like("llama", device, torch.bfloat16)
    ids = _ids(device, 2)
    model.train()
    loss_ref, grads_ref = _step(model, ids)
    tritonkit.patch(model)
    try:
        loss, grads = _step(model, ids)
    finally:
        tritonkit.unpatch(model)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, loss_ref.float(), atol=0, rtol=1e-2)
    for name, g in grads.items():
        ref = grads_ref[name].float()
        # Relative L2 error of each gradient: bf16 rounds at 2^-8 per operation.
        err = (g.float() - ref).norm() / ref.norm().clamp_min(1e-30)
        assert err < 3e-2, (name, err.item())


def test_patch_options_and_errors(device):
    model = _build("llama", device, layers=1)
    with pytest.raises(TypeError, match="unknown options"):
        tritonkit.patch(model, fused=True)
    with pytest.raises(TypeError, match="unknown options"):
        tritonkit.patch(model, skip_logits=True)
    with pytest.raises(ValueError, match="attention must be one of"):
        tritonkit.patch(model, attention="flash")
    with pytest.raises(ValueError, match=r"logits must be one of .* got True"):
        tritonkit.patch(model, logits=True)
    with pytest.raises(ValueError, match="not patched"):
        tritonkit.unpatch(model)
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        tritonkit.patch("model")
    report = tritonkit.patch(model, attention="keep", loss=False, residual=False, rope=False)
    try:
        with pytest.raises(ValueError, match="already patched"):
            tritonkit.patch(model)
        whats = {r.what for r in report.replaced}
        assert not any(w for w in whats if "attention" in w or "logits" in w or "fused" in w)
        assert not any("rope" in w for w in whats)
        assert any("attention kept" in r.reason for r in report.left)
        assert all("config" not in m.__dict__ or m.config is model.config for m in model.modules())
    finally:
        tritonkit.unpatch(model)


class _Unknown(nn.Module):
    """A module no rule knows: must be left alone and reported."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((32,), 1.5))

    def forward(self, x):
        return x * self.scale


def test_plain_modules_patched_and_unknown_left(device):
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
    ).to(device)
    head = model[:8]  # MultiheadAttention takes three inputs; checked on its own below
    x = torch.randn(3, 5, 32, device=device, requires_grad=True)
    ref = head(x)
    (gx_ref,) = torch.autograd.grad(ref.square().sum(), x)
    report = tritonkit.patch(model)
    try:
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
        q = torch.randn(2, 4, 32, device=device)
        torch.testing.assert_close(model[8](q, q, q)[0], model[8](q, q, q)[0])
        assert "_Unknown" in str(report) and "no tritonkit rule" in str(report)
    finally:
        tritonkit.unpatch(model)


def test_cross_entropy_module(device):
    logits = torch.randn(6, 11, device=device, requires_grad=True)
    target = torch.tensor([0, 3, -100, 10, 5, 5], device=device)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    ref = loss_fn(logits, target)
    tritonkit.patch(loss_fn)
    try:
        torch.testing.assert_close(loss_fn(logits, target), ref)
        probs = torch.softmax(torch.randn(6, 11, device=device), -1)  # PyTorch's path
        torch.testing.assert_close(
            loss_fn(logits, probs), F.cross_entropy(logits, probs, label_smoothing=0.1)
        )
    finally:
        tritonkit.unpatch(loss_fn)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_linear_cross_entropy_chunks(reduction, device):
    g = torch.Generator().manual_seed(4)
    n, h, v = 37, 24, 53  # odd sizes; 7 rows per chunk below: 6 chunks, the last short
    x = torch.randn(n, h, generator=g).to(device).requires_grad_(True)
    w = (torch.randn(v, h, generator=g) * 0.2).to(device).requires_grad_(True)
    b = torch.randn(v, generator=g).to(device).requires_grad_(True)
    t = torch.randint(0, v, (n,), generator=g).to(device)
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


def test_linear_cross_entropy_edges(device):
    x = torch.randn(4, 8, device=device)
    w = torch.randn(10, 8, device=device)
    t = torch.full((4,), -100, device=device)
    assert torch.isnan(linear_cross_entropy(x, w, t))  # every target ignored: NaN, as PyTorch
    with pytest.raises(ValueError, match="reduction"):
        linear_cross_entropy(x, w, t, reduction="none")
    with pytest.raises(ValueError, match=r"weight\.shape"):
        linear_cross_entropy(x, w[:, :7], t)
    with pytest.raises(TypeError, match="int64"):
        linear_cross_entropy(x, w, t.int())
    with pytest.raises(ValueError, match="leading shape"):
        linear_cross_entropy(x, w, t[:3])
    with pytest.raises(ValueError, match=r"label_smoothing must be in \[0, 1\], got 1.5"):
        linear_cross_entropy(x, w, t, label_smoothing=1.5)


@pytest.mark.parametrize("route", ["sdpa_repeat_kv", "tritonkit"])
def test_attention_routes_give_the_same_logits(route, device):
    model = _build("llama", device).eval()  # 4 query heads over 2 KV heads: grouped-query
    ids = _ids(device, 6)
    with torch.no_grad():
        ref = model(ids).logits
    tritonkit.patch(model, attention=route)
    try:
        attns = [m for m in model.modules() if type(m).__name__ == "LlamaAttention"]
        assert attns and all(m.config._attn_implementation.startswith("tritonkit_") for m in attns)
        assert model.config._attn_implementation == "sdpa"  # the model's own: not changed
        with torch.no_grad():
            torch.testing.assert_close(model(ids).logits, ref, atol=2e-5, rtol=1e-4)
    finally:
        tritonkit.unpatch(model)


def test_unsupported_family_left_alone_and_reported(device):
    """Gemma: RMSNorm scaled by 1 + weight, its own layer and head: none of the Llama rules
    apply; they are reported, and the model computes what it computed."""
    torch.manual_seed(7)
    cfg = transformers.GemmaConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=VOCAB, max_position_embeddings=64,
    )  # fmt: skip
    model = transformers.GemmaForCausalLM(cfg).to(device).eval()
    ids = _ids(device, 8)
    with torch.no_grad():
        ref = model(ids, labels=ids)
    report = tritonkit.patch(model)
    try:
        with torch.no_grad():
            out = model(ids, labels=ids)
    finally:
        tritonkit.unpatch(model)
    reasons = {r.kind: r.reason for r in report.left}
    assert "norm variant not recognised" in reasons["GemmaRMSNorm"]
    assert "unsupported family" in reasons["GemmaDecoderLayer"]
    assert "unsupported family" in reasons["GemmaForCausalLM"]
    assert not any(r.kind in ("GemmaRMSNorm", "GemmaDecoderLayer") for r in report.replaced)
    torch.testing.assert_close(out.logits, ref.logits, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(out.loss, ref.loss, atol=1e-5, rtol=1e-5)


def _twice(x):
    return 2 * x


def _uses_twice(x):
    return _twice(x) + 1


def test_with_globals_copies_through_decorators_and_changes_nothing_else():
    import functools

    from tritonkit.models.patcher import with_globals

    def logged(f):
        @functools.wraps(f)
        def wrapper(*args):
            return f(*args)

        return wrapper

    def by_global(f):  # a wrapper that reaches f another way than a closure cell
        @functools.wraps(f)
        def wrapper(*args):
            return globals()["_uses_twice"](*args)

        return wrapper

    wrapped = logged(logged(_uses_twice))
    thrice = with_globals(wrapped, {"_twice": lambda x: 3 * x})
    assert thrice(5) == 16 and wrapped(5) == 11 and _uses_twice(5) == 11
    assert thrice.__wrapped__.__wrapped__.__globals__["_twice"](1) == 3
    assert globals()["_twice"] is _twice  # the module is not changed
    assert with_globals(wrapped, {"_nothing": 0}) is None  # reads none of the names
    assert with_globals(by_global(_uses_twice), {"_twice": abs}) is None  # cannot reach it
