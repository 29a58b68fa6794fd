"""The fusion planner: groups found, patterns mapped, the cost model's accounting, generated
kernels against PyTorch, and an applied plan giving the module's outputs."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tritonkit.fusion import CostParams, FusionCostModel, generate, plan

PARAMS = CostParams(3000.0, 5.0, 4.0, 700.0, 400.0, source="test")


class _Mixed(nn.Module):
    """Every group kind: an epilogue, a GLU, a residual + norm, a generated chain, attention."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(24, 48)
        self.gate = nn.Linear(24, 48)
        self.down = nn.Linear(48, 24)
        self.norm = nn.LayerNorm(24)

    def forward(self, x, scale, q, kt, v):
        h = F.gelu(self.up(x), approximate="tanh")  # epilogue on up (h is returned too)
        g = F.silu(self.gate(x)) * h  # silu + mul
        d = self.down(g)  # read twice: not an epilogue, so the add is the norm's prologue
        y = self.norm(d + x)  # residual + LayerNorm
        z = torch.tanh(y * scale + 1.0) * 0.5  # a generated chain with a row vector
        att = torch.softmax(torch.matmul(q, kt) / 4.0, dim=-1) @ v
        return z, att, d, h


def _inputs(device, dtype=torch.float32):
    g = torch.Generator(device=device).manual_seed(0)
    kw = {"generator": g, "device": device, "dtype": dtype}
    x = torch.randn(3, 5, 24, **kw)
    scale = torch.randn(24, **kw)
    q = torch.randn(1, 2, 7, 16, **kw)
    kt = torch.randn(1, 2, 16, 7, **kw)
    v = torch.randn(1, 2, 7, 16, **kw)
    return (x, scale, q, kt, v)


def test_groups_patterns_and_explain(device):
    torch.manual_seed(0)
    fp = plan(_Mixed().to(device), _inputs(device), PARAMS)
    found = {(e.group.kind, e.group.pattern) for e in fp.entries}
    assert ("epilogue", "tritonkit.linear") in found
    assert ("prologue", "tritonkit.add_layer_norm") in found
    assert ("attention", "tritonkit.attention") in found
    assert ("elementwise", "generated") in found
    # The gate's silu follows a Linear: an epilogue the linear's epilogue cannot take with
    # the multiply, so it is recorded as not fusable (with the reason), not silently dropped.
    text = fp.explain()
    assert text.count("\n") == len(fp.entries)
    assert "predicted" in text and "measured -" in text
    for e in fp.entries:
        assert e.reason


def test_apply_gives_the_module_outputs(device):
    torch.manual_seed(1)
    module = _Mixed().to(device)
    inputs = _inputs(device)
    with torch.no_grad():
        ref = module(*inputs)
        fp = plan(module, inputs, CostParams(3000.0, 5.0, 4.0, 700.0, 400.0, min_saving_us=0.0))
        fused = fp.apply()
        got = fused(*inputs)
    assert sum(e.fuse for e in fp.entries) >= 4
    calls = [n for n in fused.graph.nodes if n.op == "call_function" and callable(n.target)]
    assert len(calls) < len(list(fp.gm.graph.nodes))
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


def test_cost_accounting_and_decline(device):
    class Chain(nn.Module):
        def forward(self, x, y):
            return torch.relu(x * 2.0 + 1.0) * y

    n = 64 * 1024
    x = torch.randn(64, 1024, device=device)
    fp = plan(Chain(), (x, x.clone()), PARAMS)
    (e,) = fp.entries
    est = e.estimate
    # Unfused: mul (x in, out), add, relu (in, out each), mul (two in, out): 9 tensors.
    assert est.unfused_bytes == 9 * n * 4
    assert est.fused_bytes == 3 * n * 4  # x, y in; the result out
    assert (est.unfused_launches, est.fused_launches) == (4, 1)
    model = FusionCostModel(PARAMS)
    unfused = 3 * model.kernel_us(2 * n * 4) + model.kernel_us(3 * n * 4)
    assert math.isclose(est.unfused_us, unfused)
    assert e.fuse
    picky = CostParams(3000.0, 5.0, 4.0, 700.0, 400.0, min_saving_us=1e6)
    (e2,) = plan(Chain(), (x, x.clone()), picky).entries
    assert not e2.fuse and "predicted saving" in e2.reason


def test_single_op_and_unsupported_broadcast_are_declined(device):
    class Single(nn.Module):
        def forward(self, x):
            return torch.relu(x)

    class Cols(nn.Module):  # a column vector broadcast: no generated form
        def forward(self, x, c):
            return torch.relu(x * c)

    (e,) = plan(Single(), (torch.randn(4, 8, device=device),), PARAMS).entries
    assert not e.fuse and "nothing to fuse" in e.reason
    x, c = torch.randn(4, 8, device=device), torch.randn(4, 1, device=device)
    (e,) = plan(Cols(), (x, c), PARAMS).entries
    assert not e.fuse and e.fused is None and "broadcasts" in e.reason


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_generated_kernel_matches_torch(dtype, device):
    g = torch.Generator(device=device).manual_seed(2)
    kw = {"generator": g, "device": device, "dtype": dtype}
    x = torch.randn(7, 33, **kw)
    y = torch.randn(33, 7, **kw).t()  # non-contiguous
    row = torch.randn(33, **kw)
    one = torch.randn(1, **kw)
    x[0, 0] = float("nan")
    steps = [
        ("mul", ["a0", "a2"]),
        ("add", ["v0", "a1"]),
        ("gelu_tanh", ["v1"]),
        ("sub", [1.5, "v2"]),
        ("relu", ["v3"]),
        ("mul", ["v4", "a3"]),
        ("sigmoid", ["v5"]),
    ]
    fn = generate(
        steps, [("full", dtype), ("full", dtype), ("row", dtype), ("scalar", dtype)], dtype
    )
    out = torch.full_like(x, 7.0)
    out = fn(x, y, row, one)
    xd, yd, rd, od = (t.double() for t in (x, y, row, one))
    ref = torch.sigmoid(torch.relu(1.5 - F.gelu(xd * rd + yd, approximate="tanh")) * od)
    tol = {torch.float32: 1e-6, torch.bfloat16: 8e-3}[dtype]
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol, equal_nan=True)
    assert torch.isnan(out[0, 0])
    assert fn(x[:0], y[:0], row, one).shape == (0, 33)
    with pytest.raises(ValueError, match="no generated form"):
        generate(["erfinv"], [("full", dtype)], dtype)


def test_plan_bad_arguments(device):
    x = torch.randn(2, device=device)
    with pytest.raises(TypeError, match=r"nn\.Module"):
        plan(lambda x: x, (x,))
    with pytest.raises(TypeError, match="tuple"):
        plan(nn.ReLU(), x)
