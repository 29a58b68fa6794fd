"""Helpers shared by the spec modules: inputs, byte counts and the PyTorch baselines."""

from collections.abc import Callable, Sequence
from typing import Any

import torch

from tritonkit.harness.spec import Baseline


def generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def randn(
    shape: Any, dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> torch.Tensor:
    """Standard normal values drawn in float32 and rounded to ``dtype`` (never zeros)."""
    return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def read_write_bytes(inputs: Sequence[Any], written: Sequence[int]) -> int:
    """Fewest bytes of an in-place operator: every tensor input read once, and those at the
    indices ``written`` (the spec's ``mutates``) written back once."""
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    return nbytes(*tensors) + nbytes(*(inputs[i] for i in written))


def _compiled(reference: Callable[..., Any]) -> Callable[..., Any]:
    # Dynamo caches compiled code per Python code object, and every case of every spec would
    # share this wrapper's: past the recompile limit it silently runs eager. A reset per build
    # gives each benchmark case its own fresh, fully compiled function.
    torch._dynamo.reset()

    def run(*args: Any, **kwargs: Any) -> Any:
        return reference(*args, **kwargs)

    return torch.compile(run, dynamic=False)


def torch_baselines(reference: Callable[..., Any]) -> dict[str, Baseline]:
    """PyTorch eager (the reference itself, in the inputs' dtype) and torch.compile of it.

    A fresh compiled function per build, with ``dynamic=False``, so that each benchmark case
    gets kernels specialized to its shape, as a user compiling one model would.
    """
    return {
        "torch": Baseline("torch", lambda: reference, description="PyTorch eager"),
        "torch.compile": Baseline(
            "torch.compile",
            lambda: _compiled(reference),
            description="torch.compile (inductor, default mode) of the eager code",
        ),
    }
