"""Shared test helper: run the check engine on one operator and fail with every failed case."""

from tritonkit.harness.check import check_spec, fresh_seed
from tritonkit.harness.spec import get_spec


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
