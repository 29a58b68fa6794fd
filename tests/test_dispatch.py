"""How calls reach the kernels: the custom op skipped in plain eager calls (eager_direct), the
autograd.Function skipped where no gradient can follow (apply), and everything that must
still see the op (dispatch modes, fake tensors, the profiler, gradients) seeing it."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import tritonkit
from tritonkit.nn import LayerNorm
from tritonkit.ops._core.registry import Op, eager_direct


def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


_probe_op = Op("tritonkit_test::double", _double)


@_probe_op.register_fake
def _(x):
    return torch.empty_like(x)


@pytest.fixture
def probe():
    """eager_direct over a test op whose dispatched calls are counted (eager_direct reads the
    op's launcher and overload; the overload given here counts, then dispatches)."""
    dispatched = []
    overload = _probe_op.overload

    def counted(*args):
        dispatched.append(args)
        return overload(*args)

    op = SimpleNamespace(launcher=_probe_op.launcher, overload=counted)
    return eager_direct(op), dispatched


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_plain_eager_calls_skip_the_op(probe, device):
    call, dispatched = probe
    x = torch.randn(5, device=device)
    torch.testing.assert_close(call(x), x * 2, rtol=0, atol=0)
    xg = x.clone().requires_grad_()
    with torch.no_grad():  # no gradient can follow: the launcher runs directly as well
        call(xg)
    assert dispatched == []


def test_the_op_is_kept_where_something_watches_it(probe, device):
    call, dispatched = probe
    x = torch.randn(5, device=device)
    xg = x.clone().requires_grad_()
    with pytest.raises(RuntimeError, match="tritonkit_test::double has no derivative of its own"):
        call(xg).sum().backward()
    with _Recorder() as mode:
        call(x)
    assert "tritonkit_test.double.default" in mode.ops
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        call(x)
    with FakeTensorMode() as fake_mode:
        out = call(fake_mode.from_tensor(x))
    assert out.shape == x.shape
    out = call(torch.empty(5, device="meta"))
    assert out.device.type == "meta"
    assert len(dispatched) == 5


def test_ops_refuse_inputs_needing_a_gradient(device):
    """Called through torch.ops with an input that needs a gradient, an op says that its
    derivative lives in the tritonkit function's autograd.Function, rather than returning an
    output through which autograd would pass no gradient; without grad mode it runs."""
    x = torch.randn(4, 12, device=device, requires_grad=True)
    with pytest.raises(RuntimeError, match="tritonkit::softmax has no derivative of its own"):
        torch.ops.tritonkit.softmax(x, 1, False)
    with torch.no_grad():
        out = torch.ops.tritonkit.softmax(x, 1, False)
    torch.testing.assert_close(out, torch.softmax(x.detach(), -1), rtol=1e-5, atol=1e-6)


OPS = {
    "rms_norm": (lambda x, w: tritonkit.rms_norm(x, (x.shape[-1],), w), "tritonkit.norm.default"),
    "layer_norm": (
        lambda x, w: tritonkit.layer_norm(x, (x.shape[-1],), w, w),
        "tritonkit.norm.default",
    ),
    "softmax": (lambda x, w: tritonkit.softmax(x, 0), "tritonkit.softmax.default"),
    "gelu": (lambda x, w: tritonkit.gelu(x), "tritonkit.bias_act.default"),
    "swiglu": (lambda x, w: tritonkit.swiglu(x, x), "tritonkit.glu.default"),
    "transpose": (lambda x, w: tritonkit.transpose(x), "tritonkit.transpose.default"),
    "matmul": (lambda x, w: tritonkit.matmul(x, x.t()), "tritonkit.matmul.default"),
    "cross_entropy": (
        lambda x, w: tritonkit.cross_entropy(x, torch.arange(x.shape[0], device=x.device)),
        "tritonkit.cross_entropy.default",
    ),
}


def _inputs(device, requires_grad=False):
    x = torch.randn(7, 12, device=device, requires_grad=requires_grad)
    w = torch.randn(12, device=device, requires_grad=requires_grad)
    return x, w


@pytest.mark.parametrize("name", list(OPS))
def test_dispatch_modes_see_each_op(name, device):
    """FlopCounterMode, FakeTensorMode and their kin see tritonkit's op, as before the eager
    shortcut; the result is the plain eager call's."""
    fn, op_name = OPS[name]
    x, w = _inputs(device)
    plain = fn(x, w)
    with _Recorder() as mode:
        watched = fn(x, w)
    assert op_name in mode.ops
    torch.testing.assert_close(watched, plain, rtol=0, atol=0)
    with FakeTensorMode() as fake_mode:
        fake = fn(fake_mode.from_tensor(x), fake_mode.from_tensor(w))
    assert fake.shape == plain.shape and fake.dtype == plain.dtype


@pytest.mark.parametrize("name", list(OPS))
def test_forward_without_autograd_equals_forward_with_it(name, device):
    fn, _ = OPS[name]
    x, w = _inputs(device)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    tracked = fn(xg, wg)
    (dx,) = torch.autograd.grad(tracked.sum(), xg, retain_graph=True)
    assert dx.shape == x.shape
    untracked = fn(x, w)
    with torch.no_grad():
        no_grad = fn(xg, wg)
    with torch.inference_mode():
        inference = fn(x, w)
    for out in (untracked, no_grad, inference):
        assert not out.requires_grad and out.grad_fn is None
        torch.testing.assert_close(out, tracked.detach(), rtol=0, atol=0)


def test_apply_runs_the_forward_only_where_no_gradient_follows(monkeypatch, device):
    applied = []
    real_apply = torch.autograd.Function.apply.__func__

    def counting_apply(cls, *args, **kwargs):
        applied.append(cls.__name__)
        return real_apply(cls, *args, **kwargs)

    monkeypatch.setattr(torch.autograd.Function, "apply", classmethod(counting_apply))
    x, w = _inputs(device)
    xg = x.clone().requires_grad_()
    tritonkit.rms_norm(x, (12,), w)
    with torch.no_grad():
        tritonkit.rms_norm(xg, (12,), w)
    assert applied == []
    tritonkit.rms_norm(xg, (12,), w)
    assert applied == ["NormFunction"]


def test_module_in_eval_without_grad_matches_torch(device):
    ours, ref = LayerNorm(12, device=device), torch.nn.LayerNorm(12, device=device)
    with torch.no_grad():
        ref.weight.normal_()
        ref.bias.normal_()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(3, 5, 12, device=device)
    with torch.no_grad():
        got = ours(x)
    want = F.layer_norm(x.double(), (12,), ref.weight.double(), ref.bias.double())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
