"""Specs of the optimizer family: the Adam step and Muon's Newton-Schulz orthogonalization.

The workbench checks and times functions, so the step is specified through its functional
form (``tritonkit.optim.functional.adam_step``: the optimizers' kernel on one tensor, in
place: a mutating spec); the optimizers themselves, with many tensors per launch, are
compared with ``torch.optim`` in tests/test_optim.py and experiments/gpu_optim.py.
"""

import math

import torch

from tritonkit.harness.spec import OpSpec, Shapes, Tolerance, register
from tritonkit.ops.optim.config import NS_COEFFICIENTS, NS_STEPS
from tritonkit.optim.functional import adam_step, newton_schulz
from tritonkit.specs._common import generator, nbytes, randn, read_write_bytes, torch_baselines

FAMILY = "optim"


def _adam_inputs(shape, dtype, device, seed):
    gen = generator(device, seed)
    p, g, m = (randn(shape, dtype, device, gen) for _ in range(3))
    v = (randn(shape, torch.float32, device, gen).square() + 1e-3).to(dtype)  # a 2nd moment
    return p, g, m, v


def _adam_ref(
    p,
    g,
    m,
    v,
    *,
    step=1,
    lr=1e-3,
    beta1=0.9,
    beta2=0.999,
    eps=1e-8,
    weight_decay=0.0,
    decoupled_weight_decay=True,
    maximize=False,
):
    """torch.optim.Adam's single-tensor update (torch/optim/adam.py), in place on p, m, v."""
    g = -g if maximize else g
    if weight_decay:
        if decoupled_weight_decay:
            p.mul_(1 - lr * weight_decay)
        else:
            g = g.add(p, alpha=weight_decay)
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    step_size = lr / (1 - beta1**step)
    denom = (v.sqrt() / math.sqrt(1 - beta2**step)).add_(eps)
    p.addcdiv_(m, denom, value=-step_size)


def _adam_bytes(inputs, mode, **params):
    # Read param, grad, exp_avg, exp_avg_sq; write param, exp_avg, exp_avg_sq: 28 B per
    # float32 parameter.
    return read_write_bytes(inputs, _ADAM_MUTATES)


_ADAM_MUTATES = (0, 2, 3)


register(
    OpSpec(
        name="adam_step",
        family=FAMILY,
        impl=adam_step,
        reference=_adam_ref,
        make_inputs=_adam_inputs,
        shapes=Shapes(
            test=[(1,), (7, 33), (1000,), (3, 5, 129)],
            bench=[(100_000_000,), (24 * 4096, 1024)],
            empty=[(0,), (3, 0)],
        ),
        bytes=_adam_bytes,
        mutates=_ADAM_MUTATES,
        params=(
            {"step": 1, "lr": 1e-2, "weight_decay": 0.1},
            {"step": 10, "lr": 1e-3, "maximize": True},
            {"step": 3, "lr": 1e-2, "weight_decay": 0.05, "decoupled_weight_decay": False},
        ),
        backward=False,
        bench_dtypes=(torch.float32, torch.bfloat16),
        baselines=torch_baselines(_adam_ref),
        description="AdamW's fused step on one tensor (the optimizers' kernel), in place",
    )
)


def _ns_inputs(shape, dtype, device, seed):
    return (randn(shape, dtype, device, generator(device, seed)),)


def _ns_ref(g, steps=NS_STEPS, coefficients=NS_COEFFICIENTS, eps=1e-7):
    """torch.optim.Muon's ``_zeropower_via_newtonschulz`` on a batch (bfloat16, or float64
    for the reference)."""
    x = g if g.dtype == torch.float64 else g.bfloat16()
    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = x.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    a, b, c = coefficients
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


def _ns_flops(inputs, mode, steps=NS_STEPS, **params):
    # Per iteration: X X^T and A A are symmetric (one triangle: s^2 l and s^3 multiply-adds
    # of their 2 s^2 l and 2 s^3), then B X: 2 s^2 l; s = min(rows, cols), l = max.
    n_batch, rows, cols = inputs[0].shape
    s, l = min(rows, cols), max(rows, cols)
    return n_batch * steps * (s * s * l + s**3 + 2 * s * s * l)


def _ns_bytes(inputs, mode, **params):
    return nbytes(inputs[0]) + inputs[0].numel() * 2  # read g, write the bfloat16 result


register(
    OpSpec(
        name="newton_schulz",
        check_cost=20.0,  # five iterations of three GEMMs per case (the run's estimate)
        family=FAMILY,
        impl=newton_schulz,
        reference=_ns_ref,
        make_inputs=_ns_inputs,
        shapes=Shapes(
            test=[(2, 24, 40), (1, 40, 24), (3, 33, 33), (1, 5, 100)],
            bench=[(8, 4096, 4096), (16, 1024, 4096)],
            # The main job's check: (1, 5, 100), the cheapest by the cost model, takes 4x its
            # time under the interpreter (48 s against 12 s for the five cases on 2 cores).
            check=(2, 24, 40),
            empty=[(0, 4, 4)],
        ),
        bytes=_ns_bytes,
        flops=_ns_flops,
        dtypes=(torch.bfloat16, torch.float32),
        bench_dtypes=(torch.bfloat16,),
        # bfloat16 products compound over the iterations: the bound is PyTorch's own error.
        tolerance={
            torch.bfloat16: Tolerance(atol=0.0, rtol=0.0, max_ratio=1.5, torch_factor=2.0),
            torch.float32: Tolerance(atol=0.0, rtol=0.0, max_ratio=1.5, torch_factor=2.0),
        },
        backward=False,
        compute="tensor",
        baselines=torch_baselines(_ns_ref),
        description="Muon's Newton-Schulz orthogonalization, batched, symmetric products halved",
    )
)
