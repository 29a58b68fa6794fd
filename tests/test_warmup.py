"""``tritonkit.warmup`` (_warmup.py): the calls run with nothing launched, every kernel they
would compile is recorded (and compiled, on a GPU), and nothing they can reach changes: a
training run after a warmup gives the same bits as one without.

The compile path needs a GPU or an explicit target: ``test_records_compile_for_sm90_*`` compiles
the records made here for sm_90 in a process without the interpreter (ptxas runs on the CPU),
and checks that the compile a real launch makes for the same call finds them in the cache."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import tritonkit
from tritonkit import _tuning, _warmup
from tritonkit.ops._core import internals
from tritonkit.ops._core import launch as L
from tritonkit.ops._core.plan import PLANS

from _checks import DEVICE

ROOT = Path(__file__).resolve().parents[1]


def _rms_step(x, w):
    def step():
        tritonkit.rms_norm(x, (x.shape[-1],), w).sum().backward()

    return step


@pytest.fixture
def nothing_compiled(monkeypatch):
    """The warmup as a fresh process sees it: no specialization this process compiled before
    counts as compiled (on a GPU, earlier tests on the same worker compiled these kernels)."""
    real = internals.triton_device_cache
    monkeypatch.setattr(
        internals, "triton_device_cache", lambda fn, device: ({}, *real(fn, device)[1:])
    )


def test_warmup_records_forward_and_backward_and_leaves_nothing_behind(device, nothing_compiled):
    x = torch.randn(6, 40, device=device, requires_grad=True)
    w = torch.randn(40, device=device, requires_grad=True)
    before = (x.detach().clone(), w.detach().clone())
    plans = len(PLANS)
    report = tritonkit.warmup(_rms_step(x, w))
    names = [r["qualname"] for r in report.records]
    assert "norm_fwd_tiles_kernel" in names[0] and len(names) == 3, names  # fwd, dx, dw
    assert names[1:] == ["norm_bwd_kernel", "colsum_kernel"]
    assert report.errors == [] and report.failed == []
    assert x.grad is None and w.grad is None  # no gradient left to accumulate into
    assert torch.equal(x.detach(), before[0]) and torch.equal(w.detach(), before[1])
    assert len(PLANS) == plans  # nothing decided meanwhile is kept
    assert L.WARMUP.session is None
    spec = json.loads(report.records[0]["spec"])
    assert spec["name"].endswith("norm_fwd_tiles_kernel") and spec["signature"]


def test_warmup_records_each_specialization_once(device, nothing_compiled):
    x = torch.randn(6, 40, device=device, requires_grad=True)
    w = torch.randn(40, device=device, requires_grad=True)
    step = _rms_step(x, w)

    def twice():
        step()
        step()

    assert tritonkit.warmup(twice).kernels == 3


def test_sandbox_writes_copies_of_what_existed_before(device):
    p = torch.randn(5, device=device)
    keep = p.clone()
    with _warmup.recording(_warmup.WarmupReport()):
        assert p.add_(1.0) is p  # an in-place op still returns its tensor
        torch.mul(p, 2.0, out=p)
        torch._foreach_add_([p], 3.0)
        p[1:3].zero_()  # through a view
        fresh = torch.zeros(4, device=device)
        fresh.add_(2.0)  # a tensor made meanwhile is written as usual
        assert torch.equal(fresh, torch.full((4,), 2.0, device=device))
    assert torch.equal(p, keep)


def test_warmup_restores_random_state(device):
    torch.manual_seed(3)
    expected = torch.rand(4, device=device)
    torch.manual_seed(3)
    tritonkit.warmup(lambda: torch.nn.functional.dropout(torch.ones(64, device=device), 0.5))
    assert torch.equal(torch.rand(4, device=device), expected)


def test_warmup_compiles_every_candidate_a_tuning_would_time(monkeypatch):
    monkeypatch.setattr(_tuning, "consulted", lambda: True)
    monkeypatch.setattr(_tuning, "enabled", lambda: True)
    monkeypatch.setattr(_tuning, "mode", lambda: "1")  # tune here
    monkeypatch.setattr(_tuning, "lookup", lambda *a, **k: None)
    stored = []
    monkeypatch.setattr(_tuning, "store", lambda *a, **k: stored.append(a))
    ran = []
    cands = [_tuning.Config({"a": a}) for a in (1, 2, 3)]
    with _warmup.recording(_warmup.WarmupReport()):
        best = _tuning.tune("k", {"n": 1}, cands, ran.append, prune=lambda c: c.params["a"] != 2)
    assert best == cands[0] and ran == [cands[0], cands[2]] and stored == []


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = tritonkit.nn.Linear(24, 40)
        self.norm = tritonkit.nn.RMSNorm(40)

    def forward(self, x, y):
        h = torch.nn.functional.dropout(self.norm(self.lin(x)), 0.1, self.training)
        return tritonkit.cross_entropy(h, y)


def _train(warm: bool, device) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = _Tiny().to(device)
    opt = tritonkit.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(12, 24, device=device), torch.randint(0, 40, (12,), device=device)
    if warm:
        report = tritonkit.warmup(model, (x, y), optimizer=opt, loss_fn=lambda loss: loss)
        assert report.kernels >= 5 and report.errors == [], report
        assert all(p.grad is None for p in model.parameters()) and opt.state_dict()["state"] == {}
    for _ in range(2):
        model(x, y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in model.parameters()] + [
        t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)
    ]


def test_training_after_a_warmup_gives_the_same_bits(device, nothing_compiled):
    plain, warmed = _train(False, device), _train(True, device)
    assert len(plain) == len(warmed)
    for a, b in zip(plain, warmed):
        assert torch.equal(a, b)


def test_warmup_refuses_what_it_cannot_run():
    with pytest.raises(TypeError, match="example_inputs"):
        tritonkit.warmup(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="function of no arguments"):
        tritonkit.warmup(3)
    with pytest.raises(TypeError, match="either target or ops="):
        tritonkit.warmup(lambda: None, ops=["relu"])
    with pytest.raises(ValueError, match="jobs must be an integer >= 1, got 0"):
        tritonkit.warmup(lambda: None, jobs=0)


def test_warmup_of_ops_calls_them_as_the_bench_does():
    report = tritonkit.warmup(ops=[("gelu", (33,), torch.float32)])
    assert [r["qualname"] for r in report.records] == ["bias_act_fwd_kernel", "bias_act_bwd_kernel"]


# A launch of the recorded call, as the real run makes it: this script captures each launch's
# arguments under the interpreter, then compiles them for sm_90 the way JITFunction.run does.
_CAPTURE = """
import json, os, sys
import torch
from tritonkit.ops._core import internals
from tritonkit.ops._core import launch as L
import tritonkit
seen, orig = [], L.Kernel._triton
def capture(self, grid, args, meta):
    seen.append({"module": self.fn.fn.__module__, "name": self.fn.fn.__name__, "meta": meta,
                 "args": [{"dtype": str(a.dtype)[6:], "off": a.data_ptr() % 16}
                          if isinstance(a, torch.Tensor) else a for a in args]})
    return orig(self, grid, args, meta)
L.Kernel._triton = capture
x = torch.randn(6, 40, requires_grad=True)
w = torch.randn(40, requires_grad=True)
tritonkit.rms_norm(x, (40,), w).sum().backward()
report = tritonkit.warmup(lambda: tritonkit.rms_norm(x, (40,), w).sum().backward())
json.dump({"launches": seen, "records": report.records}, open(sys.argv[1], "w"))
"""

_COMPILE = """
import importlib, json, sys
import torch, triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature
from tritonkit._warmup import compile_records
doc = json.load(open(sys.argv[1]))
target = GPUTarget("cuda", 90, 32)
report = compile_records(doc["records"], target=target, jobs=2)
assert report.compiled == len(doc["records"]) and not report.failed, report
hits = []
knobs.compilation.listener = lambda **kw: hits.append(kw["cache_hit"])
backend = make_backend(target)
for launch in doc["launches"]:  # JITFunction.run's path to its compile, on these arguments
    jit = getattr(importlib.import_module(launch["module"]), launch["name"]).fn
    args = []
    for a in launch["args"]:
        if isinstance(a, dict):
            t = torch.empty(64, dtype=getattr(torch, a["dtype"]))
            args.append(t[a["off"] // t.element_size():])
        else:
            args.append(a)
    kw = dict(launch["meta"])
    kw["debug"] = kw.get("debug", jit.debug) or knobs.runtime.debug
    kw["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    binder = create_function_from_signature(jit.signature, jit.params, backend)
    bound, spec, options = binder(*args, **kw)
    opts, signature, constexprs, attrs = jit._pack_args(backend, kw, bound, spec, options)
    triton.compile(ASTSource(jit, signature, constexprs, attrs), target=target,
                   options=opts.__dict__)
print(json.dumps(hits))
"""


@pytest.mark.interpreter
def test_records_compile_for_sm90_and_a_real_launch_finds_them(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TRITON_CACHE_DIR": str(tmp_path / "c")}
    env["TRITON_INTERPRET"] = "1"
    doc = tmp_path / "doc.json"
    for script, interpret in ((_CAPTURE, True), (_COMPILE, False)):
        if not interpret:
            env.pop("TRITON_INTERPRET")
        run = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(script), str(doc)],
            env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
    hits = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(hits) == len(json.loads(doc.read_text())["launches"]) == 3
    assert all(hits), hits  # every real launch's compile is a hit in the warmed cache


# ---- on a GPU: the real calls after a warmup compile nothing -----------------------------------


@pytest.mark.gpu
def test_after_a_warmup_the_first_real_calls_compile_nothing(monkeypatch, nothing_compiled):
    from triton import knobs

    x = torch.randn(300, 520, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(520, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    step = _rms_step(x, w)
    report = tritonkit.warmup(step)
    assert report.compiled == report.kernels >= 3 and not report.failed, report
    compiles = []
    monkeypatch.setattr(knobs.compilation, "listener", lambda **kw: compiles.append(kw))
    step()
    assert compiles == []  # each launch found its kernel compiled by the warmup
    grads = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    with torch.no_grad():
        ref = torch.nn.functional.rms_norm(x.double(), (520,), w.double())
    torch.testing.assert_close(tritonkit.rms_norm(x, (520,), w).double(), ref, atol=2e-2, rtol=2e-2)
    tritonkit.rms_norm(x, (520,), w).sum().backward()
    assert torch.equal(x.grad, grads[0]) and torch.equal(w.grad, grads[1])


@pytest.mark.gpu
def test_cli_warmup_compiles_an_operator(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TRITON_CACHE_DIR": str(tmp_path)}
    records = tmp_path / "records.json"
    run = subprocess.run(
        [sys.executable, "-m", "tritonkit", "warmup", "gelu", "--shapes", "(4096,)",
         "--dtypes", "fp32", "--records", str(records)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert "2 kernel specializations recorded" in run.stdout
    assert len(json.loads(records.read_text())) == 2
