"""rope: accuracy through its spec (every shape, dtype, layout, special value, empty input
and gradient, against a float64 reference), the transposed-projection layout read in place,
bad input, torch.compile, and the GPU benchmark against its baselines."""

import pytest
import torch

import tritonkit
from tritonkit.harness.spec import get_spec

from _checks import assert_spec_passes, compile_backend


def _reference(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)


def test_spec_passes(device):
    assert_spec_passes("rope", device)


@pytest.mark.parametrize("table_batch", [1, 2])
def test_transposed_projection_and_gradient(device, table_batch):
    g = torch.Generator(device=device).manual_seed(0)
    b, t, h, d = 2, 9, 3, 32
    proj = torch.randn(b, t, h * d, generator=g, device=device)
    x = proj.view(b, t, h, d).transpose(1, 2).requires_grad_(False)  # (B, H, T, D) view
    x = x.detach().requires_grad_(True)
    angles = torch.randn(table_batch, t, d, generator=g, device=device)
    cos, sin = angles.cos(), angles.sin()
    out = tritonkit.rope(x, cos, sin)
    assert out.stride() == x.stride()  # written in x's layout, no copy
    dy = torch.randn(b, h, t, d, generator=g, device=device)
    (dx,) = torch.autograd.grad(out, x, dy)
    xd = x.detach().double().requires_grad_(True)
    ref = _reference(xd, cos.double(), sin.double())
    (dx_ref,) = torch.autograd.grad(ref, xd, dy.double())
    torch.testing.assert_close(out.double(), ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(dx.double(), dx_ref, atol=1e-6, rtol=1e-6)
    two_d = tritonkit.rope(x, cos[0], sin[0])
    torch.testing.assert_close(two_d.double(), _reference(xd, cos[:1].double(), sin[:1].double()))


def test_bad_input_names_the_argument(device):
    x = torch.randn(1, 2, 3, 4, device=device)
    c = torch.randn(1, 3, 4, device=device)
    with pytest.raises(TypeError, match=r"x must be a torch\.Tensor"):
        tritonkit.rope([1.0], c, c)
    with pytest.raises(ValueError, match="4-D"):
        tritonkit.rope(x[0], c, c)
    with pytest.raises(ValueError, match="even"):
        tritonkit.rope(torch.randn(1, 2, 3, 5, device=device), c, c)
    with pytest.raises(ValueError, match="cos must have shape"):
        tritonkit.rope(x, c[:, :2], c)
    with pytest.raises(TypeError, match="sin must have dtype"):
        tritonkit.rope(x.half(), c.half(), c.double())
    with pytest.raises(TypeError, match="sin must have the same dtype as x"):
        tritonkit.rope(x.half(), c.half(), c.bfloat16())
    with pytest.raises(ValueError, match="must not require a gradient"):
        tritonkit.rope(x, c.clone().requires_grad_(True), c)


@pytest.mark.compile
def test_torch_compile_traces_it(device):
    x = torch.randn(1, 2, 5, 8, device=device)
    c, s = torch.randn(1, 5, 8, device=device), torch.randn(1, 5, 8, device=device)
    fn = torch.compile(tritonkit.rope, fullgraph=True, backend=compile_backend(device))
    torch.testing.assert_close(fn(x, c, s), _reference(x, c, s))


@pytest.mark.gpu
@pytest.mark.slow
def test_performance_against_baselines():
    """The bench engine times it against PyTorch and torch.compile (GPU only)."""
    from tritonkit.harness import hardware
    from tritonkit.harness.bench import bench_spec

    profile = hardware.resolve_profile(None, hardware.measured_ceilings())
    records = bench_spec(get_spec("rope"), profile=profile, modes=("fwd",))
    assert records and all(r["correct"]["passed"] for r in records)
    assert all("median" in r["candidates"]["tritonkit"] for r in records)
