"""Spec of rope: the rotary position embedding (rotate-half convention) on (B, H, T, D), what
it must move, and what it is timed against (PyTorch eager and torch.compile of the same
reference, as transformers' apply_rotary_pos_emb computes it)."""

import torch

import tritonkit
from tritonkit.harness.spec import OpSpec, Shapes, register
from tritonkit.specs._common import generator, nbytes, randn, torch_baselines

FAMILY = "rope"


def _inputs(shape, dtype, device, seed):
    """shape = (B, H, T, D): x, then cos and sin (B, T, D) of random angles (their two halves
    differ here, so that a kernel mixing them up fails)."""
    b, _, t, d = shape
    gen = generator(device, seed)
    x = randn(shape, dtype, device, gen)
    angles = randn((b, t, d), torch.float32, device, gen) * 3.0
    return x, angles.cos().to(dtype), angles.sin().to(dtype)


def _reference(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)


def _bytes(inputs, mode, **params):
    # fwd: read x and the two tables, write the output; bwd: the same with the gradient.
    x, cos, _ = inputs
    per = 2 * nbytes(x) + 2 * nbytes(cos)
    return {"fwd": per, "bwd": per, "fwd+bwd": 2 * per}[mode]


def _flops(inputs, mode, **params):
    # Two multiplies and an add per element, each way.
    return {"fwd": 3, "bwd": 3, "fwd+bwd": 6}[mode] * inputs[0].numel()


register(
    OpSpec(
        name="rope",
        family=FAMILY,
        impl=tritonkit.rope,
        reference=_reference,
        make_inputs=_inputs,
        shapes=Shapes(
            test=[(1, 1, 1, 2), (2, 3, 7, 16), (1, 2, 33, 64), (2, 1, 5, 96)],
            bench=[(4, 16, 2048, 128), (1, 32, 8192, 128)],
            empty=[(2, 3, 0, 16)],
        ),
        bytes=_bytes,
        flops=_flops,
        grad_inputs=(0,),
        baselines=torch_baselines(_reference),
        description="rotary position embedding x * cos + rotate_half(x) * sin",
    )
)
