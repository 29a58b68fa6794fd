"""torch.autocast: each function returns what its PyTorch counterpart returns under the same
autocast context (dtype and values), with gradients in the same dtypes; also compiled."""

import pytest
import torch
import torch.nn.functional as F

import tritonkit
from tritonkit import _autocast
from tritonkit.harness.check import fresh_seed

from _checks import DEVICE, compile_backend

# F.rms_norm's own note that float32 weights beside 16-bit rows take its unfused path
pytestmark = pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")


def _autocast_dtype(device):
    # bf16 on a GPU; fp16 on the CPU, where the interpreter's bf16 tl.dot is wrong
    return torch.bfloat16 if device.type == "cuda" else torch.float16


def _inputs(device, seed):
    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(*shape, dtype=torch.float32):
        return torch.randn(shape, generator=gen, device=device).to(dtype)

    return rand


CASES = {
    # name: (make inputs (rand, autocast dtype) -> list, ours, PyTorch's)
    "matmul": (
        lambda rand, lp: [rand(9, 40), rand(40, 24)],
        tritonkit.matmul,
        torch.matmul,
    ),
    "linear gelu_tanh": (
        lambda rand, lp: [rand(9, 40), rand(24, 40) / 8, rand(24)],
        lambda x, w, b: tritonkit.linear(x, w, b, "gelu_tanh"),
        lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh"),
    ),
    "linear + float32 residual": (
        lambda rand, lp: [rand(9, 40), rand(24, 40) / 8, rand(9, 24)],
        lambda x, w, r: tritonkit.linear(x, w, None, "relu", r),
        lambda x, w, r: F.relu(F.linear(x, w)) + r,
    ),
    "linear + 16-bit residual": (
        lambda rand, lp: [rand(9, 40), rand(24, 40) / 8, rand(9, 24, dtype=lp)],
        lambda x, w, r: tritonkit.linear(x, w, None, None, r),
        lambda x, w, r: F.linear(x, w) + r,
    ),
    "softmax": (
        lambda rand, lp: [rand(7, 33, dtype=lp)],
        lambda x: tritonkit.softmax(x, -1),
        lambda x: torch.softmax(x, -1),
    ),
    "log_softmax": (
        lambda rand, lp: [rand(7, 33)],
        lambda x: tritonkit.log_softmax(x, 0),
        lambda x: torch.log_softmax(x, 0),
    ),
    "layer_norm": (
        lambda rand, lp: [rand(7, 33, dtype=lp), rand(33), rand(33)],
        lambda x, w, b: tritonkit.layer_norm(x, (33,), w, b),
        lambda x, w, b: F.layer_norm(x, (33,), w, b),
    ),
    "rms_norm": (
        lambda rand, lp: [rand(7, 33, dtype=lp), rand(33)],
        lambda x, w: tritonkit.rms_norm(x, (33,), w),
        lambda x, w: F.rms_norm(x, (33,), w),
    ),
    "cross_entropy": (
        lambda rand, lp: [rand(7, 33, dtype=lp), rand(33).abs()],
        lambda x, w: tritonkit.cross_entropy(x, TARGET.to(x.device), w, label_smoothing=0.1),
        lambda x, w: F.cross_entropy(x, TARGET.to(x.device), w, label_smoothing=0.1),
    ),
    "cross_entropy none": (
        lambda rand, lp: [rand(7, 33)],
        lambda x: tritonkit.cross_entropy(x, TARGET.to(x.device), reduction="none"),
        lambda x: F.cross_entropy(x, TARGET.to(x.device), reduction="none"),
    ),
}
TARGET = torch.tensor([0, 5, 32, -100, 7, 7, 1], device=DEVICE)


def _run(fn, inputs, device, lp, n_diff):
    leaves = [t.clone().requires_grad_(i < n_diff) for i, t in enumerate(inputs)]
    with torch.autocast(device.type, dtype=lp):
        out = fn(*leaves)
    gen = torch.Generator(device=out.device).manual_seed(1)
    g = torch.randn(out.shape, generator=gen, device=out.device).to(out.dtype)
    return out, torch.autograd.grad(out, leaves[:n_diff], g)


@pytest.mark.slow
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", list(CASES))
def test_autocast_matches_pytorch(name, compiled, device):
    lp = _autocast_dtype(device)
    make, ours, theirs = CASES[name]
    if compiled:
        torch._dynamo.reset()
        ours = torch.compile(ours, fullgraph=True, backend=compile_backend(device))
    inputs = make(_inputs(device, fresh_seed()), lp)
    n_diff = 1 if name == "cross_entropy" else len(inputs)  # class weights take no gradient
    out, grads = _run(ours, inputs, device, lp, n_diff)
    ref, ref_grads = _run(theirs, inputs, device, lp, n_diff)
    assert out.dtype == ref.dtype
    assert [t.dtype for t in grads] == [t.dtype for t in ref_grads]
    for got, want in zip((out, *grads), (ref, *ref_grads)):
        # the same casts on both sides: within a few roundings to the autocast dtype
        tol = 4 * torch.finfo(lp).eps * max(1.0, want.abs().max().item())
        torch.testing.assert_close(got, want, rtol=0, atol=tol)


def test_autocast_policy_follows_pytorch_tables():
    """Off outside autocast; float64 and integer tensors are never cast. (The policy tables of
    CPU autocast, on CPU tensors: no kernel runs.)"""
    x = torch.randn(2, 2)  # host: CPU autocast's policy
    assert _autocast.autocast_dtype("linear", x) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _autocast.autocast_dtype("linear", x) == torch.bfloat16
        assert _autocast.autocast_dtype("cross_entropy", x) == torch.float32
        assert _autocast.autocast_dtype("softmax", x) is None  # CUDA's list only
        assert _autocast.autocast_dtype("gelu", x) is None
    d, i = torch.randn(2, dtype=torch.float64), torch.arange(2)  # host: as x
    assert _autocast.cast(torch.bfloat16, d, i, None, x)[:3] == (d, i, None)
