"""Shared test helpers: the device, the check engine on one operator, saved tensors, the compile
backend."""

import torch

from tritonkit.harness.check import check_spec, fresh_seed
from tritonkit.harness.spec import get_spec

# Where the tests run: CUDA where there is one, else the CPU under Triton's interpreter (which
# conftest.py turns on before tritonkit is imported). The ``device`` fixture returns it.
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def assert_spec_passes(name: str, device, **kwargs) -> None:
    seed = fresh_seed()
    results = check_spec(get_spec(name), device=device, seed=seed, **kwargs)
    assert results, f"{name}: no checks ran"
    failed = [r for r in results if not r.passed and not r.skipped]
    report = "\n".join(
        f"{r.params} {r.shape} {r.dtype} {r.case} (seed {r.seed}): {r.detail}" for r in failed[:10]
    )
    assert not failed, (
        f"{name}: {len(failed)}/{len(results)} checks failed (base seed {seed})\n{report}"
    )


def saved_tensors(fn):
    """(fn's result, the tensors autograd saved for its backward while fn ran)."""
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, saved


def compile_backend(device) -> str:
    """torch.compile's backend for the compile tests: inductor on a GPU; on the CPU, where
    inductor would generate C++ around interpreter kernels, aot_eager (the same tracing)."""
    return "inductor" if device.type == "cuda" else "aot_eager"
