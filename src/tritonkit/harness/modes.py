"""The call a timing, a profile or a soak makes of one case, per mode: the forward ("fwd"), the
backward of a kept forward graph ("bwd"), or both ("fwd+bwd"), with fixed random output
gradients."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tritonkit.harness.compare import flatten


def _mode_callable(
    fn: Callable[..., Any], inputs: tuple, params: dict, mode: str, grad_idx: list[int], seed: int
) -> Callable[[], Any]:
    """A zero-argument call of ``fn`` on ``inputs`` in ``mode``.

    Args:
        fn: the operator (tritonkit's, a baseline's or a variant).
        inputs, params: its positional inputs and keyword arguments.
        mode: "fwd", "bwd" (the forward run once here, its graph kept) or "fwd+bwd".
        grad_idx: the inputs that get gradients.
        seed: for the output gradients.
    """
    if mode == "fwd":
        return lambda: fn(*inputs, **params)
    leaves = tuple(
        t.detach().requires_grad_() if i in grad_idx else t for i, t in enumerate(inputs)
    )
    wrt = [leaves[i] for i in grad_idx]
    outputs = flatten(fn(*leaves, **params))
    gen = torch.Generator(device=outputs[0].device).manual_seed(seed)
    grads = [torch.randn(o.shape, generator=gen, device=o.device, dtype=o.dtype) for o in outputs]
    if mode == "bwd":  # the forward graph is kept and its backward replayed
        return lambda: torch.autograd.grad(outputs, wrt, grads, retain_graph=True)
    return lambda: torch.autograd.grad(flatten(fn(*leaves, **params)), wrt, grads)
