"""Gradient clipping by the global norm fused into tritonkit's optimizer step: the returned
norm, the clipped gradients and the update are those of ``torch.nn.utils.clip_grad_norm_``
followed by the torch optimizer's step; the norm's pass is also the step's non-finite check.
Tensors are built on the host (one generator, the same values everywhere) and moved to the
``device`` fixture's device: CUDA where there is one, the interpreter's CPU elsewhere."""

from __future__ import annotations

import pytest
import torch

from tritonkit.optim import AdamW, Muon


def _params(shapes, dtype, seed, device):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(device=device, dtype=dtype) for s in shapes]


def _with_grads(values, grads):
    ps = [torch.nn.Parameter(v.clone()) for v in values]
    for p, gr in zip(ps, grads):
        if gr is not None:
            p.grad = gr.clone()
    return ps


SHAPES = [(33, 17), (5,), (2049,), (3, 4, 5)]  # odd sizes; one spans several blocks


@pytest.mark.parametrize("max_norm", [0.5, 1e4])  # clipping, and a norm under the bound
def test_adamw_clip_matches_torch(device, max_norm):
    values = _params(SHAPES, torch.float32, 0, device)
    grads = _params(SHAPES, torch.float32, 1, device)
    grads[1] = None  # a parameter without a gradient takes no part
    ref = _with_grads(values, grads)
    ours = _with_grads(values, grads)
    with_grad = [p for p in ref if p.grad is not None]
    norm_ref = torch.nn.utils.clip_grad_norm_(with_grad, max_norm)
    torch.optim.AdamW(ref, lr=1e-2).step()
    opt = AdamW(ours, lr=1e-2)
    norm = opt.clip_grad_norm_(max_norm)
    assert norm.dtype == torch.float32 and norm.dim() == 0
    torch.testing.assert_close(norm, norm_ref, rtol=1e-6, atol=0)
    opt.step()
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)
        if b.grad is not None:  # the clipped gradients are left in .grad
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-7)


def test_clip_applies_to_one_step_only(device):
    values = _params(SHAPES[:2], torch.float32, 2, device)
    grads = _params(SHAPES[:2], torch.float32, 3, device)
    ours = _with_grads(values, grads)
    ref = _with_grads(values, grads)
    opt, opt_ref = AdamW(ours, lr=1e-2), torch.optim.AdamW(ref, lr=1e-2)
    opt.clip_grad_norm_(0.1)
    torch.nn.utils.clip_grad_norm_(ref, 0.1)
    opt.step()
    opt_ref.step()
    for p, q, g in zip(ours, ref, grads):  # a second step without a clip: unclipped
        p.grad, q.grad = g.clone(), g.clone()
    opt.step()
    opt_ref.step()
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)


def test_clip_over_two_dtypes_bf16(device):
    values = _params(SHAPES[:2], torch.float32, 4, device) + _params(
        SHAPES[2:], torch.bfloat16, 5, device
    )
    grads = _params(SHAPES[:2], torch.float32, 6, device) + _params(
        SHAPES[2:], torch.bfloat16, 7, device
    )
    ours = _with_grads(values, grads)
    opt = AdamW(ours, lr=1e-3)
    norm = opt.clip_grad_norm_(1.0)
    want = torch.cat([g.double().flatten() for g in grads]).norm()
    torch.testing.assert_close(norm.double(), want, rtol=1e-6, atol=0)
    opt.step()
    coef = min(1.0, 1.0 / (want.item() + 1e-6))
    for p, g in zip(ours, grads):
        # bf16 gradients are rounded once after the multiply: within half a unit of bf16.
        tol = 4e-3 if g.dtype == torch.bfloat16 else 1e-6
        torch.testing.assert_close(p.grad.double(), g.double() * coef, rtol=tol, atol=1e-7)


@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon not in this torch")
def test_muon_clip_matches_torch(device):
    shapes = [(24, 40), (40, 24)]
    values = _params(shapes, torch.float32, 8, device)
    grads = _params(shapes, torch.float32, 9, device)
    ours, ref = _with_grads(values, grads), _with_grads(values, grads)
    norm = Muon(ours, lr=0.02).clip_grad_norm_(0.3)
    norm_ref = torch.nn.utils.clip_grad_norm_(ref, 0.3)
    torch.testing.assert_close(norm, norm_ref, rtol=1e-6, atol=0)
    opt = Muon(ours, lr=0.02)
    opt.clip_grad_norm_(0.3)
    opt.step()
    torch.optim.Muon(ref, lr=0.02).step()
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(a.detach(), b.detach(), rtol=2e-3, atol=2e-4)


def test_clip_with_grad_scale_and_errors(device):
    values = _params(SHAPES[:1], torch.float32, 10, device)
    grads = _params(SHAPES[:1], torch.float32, 11, device)
    ours = _with_grads(values, grads)
    opt = AdamW(ours, lr=1e-2)
    norm = opt.clip_grad_norm_(0.5)
    divisor = opt._grad_divisor(torch.tensor([4.0], device=device))
    want = torch.tensor([4.0 * (norm.item() + 1e-6) / 0.5], device=device)
    torch.testing.assert_close(divisor, want)
    assert opt._grad_divisor(None) is None  # consumed
    with pytest.raises(ValueError, match=r"norm_type must be 2\.0"):
        opt.clip_grad_norm_(1.0, norm_type=1.0)
    with pytest.raises(ValueError, match="max_norm must be a number >= 0"):
        opt.clip_grad_norm_(-1.0)
    ours[0].grad[0, 0] = float("nan")
    with pytest.raises(RuntimeError, match="non-finite"):
        opt.clip_grad_norm_(1.0, error_if_nonfinite=True)
    assert opt._clip is None
    assert torch.isnan(opt.clip_grad_norm_(1.0))  # without the check: NaN, as PyTorch


def test_clip_is_the_steps_nonfinite_check(device, monkeypatch):
    """After ``clip_grad_norm_`` the step launches no check of its own (the norm's read
    checked the gradients): a NaN found there skips the step, counted once, and with
    ``nonfinite="raise"`` names the parameter; a step without a clip checks for itself."""
    from tritonkit.optim import NonFiniteGradError, _base

    launches = []
    real = _base.launch_nonfinite_check

    def counted(*args, **kwargs):
        launches.append(args[0].n_tensors)
        return real(*args, **kwargs)

    monkeypatch.setattr(_base, "launch_nonfinite_check", counted)
    values = _params(SHAPES, torch.float32, 12, device)
    grads = _params(SHAPES, torch.float32, 13, device)
    ours = _with_grads(values, grads)
    opt = AdamW(ours, lr=1e-2)
    opt.clip_grad_norm_(0.5)
    opt.step()
    assert launches == [] and opt.nonfinite_steps.item() == 0
    before = [p.detach().clone() for p in ours]
    ours[2].grad[2048] = float("nan")  # the last block of a tensor of several
    norm = opt.clip_grad_norm_(0.5)
    assert torch.isnan(norm)
    opt.step()
    assert launches == [] and opt.nonfinite_steps.item() == 1
    assert all(torch.equal(p, b) for p, b in zip(ours, before))
    opt.step()  # no clip: the step's own check, which finds the NaN again
    assert launches == [len(SHAPES)] and opt.nonfinite_steps.item() == 2
    assert all(torch.equal(p, b) for p, b in zip(ours, before))

    strict = AdamW(ours, lr=1e-2, nonfinite="raise")
    strict.clip_grad_norm_(0.5)
    with pytest.raises(NonFiniteGradError, match=r"\['params'\]\[2\] \(shape \(2049,\)\)"):
        strict.step()
    assert launches == [len(SHAPES)]
    assert all(torch.equal(p, b) for p, b in zip(ours, before))
