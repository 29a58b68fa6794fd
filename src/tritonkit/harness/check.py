"""The check engine: is an operator right, on any valid input?

For every shape, dtype and parameter set of a spec it compares the operator with a float64
reference computed on upcast inputs, and reports the maximum absolute error, the relative L2
error and the ratio of that error to PyTorch's own error in the same dtype. Each case draws
fresh random inputs; outputs are poisoned (every allocation inside the operator is filled
with NaN) so that an element the kernel never writes cannot pass; inputs are also checked as
non-contiguous views, with NaN and +-inf injected, filled with constant edge values (zeros,
ones, 1e-7, 65000 where the dtype holds it), empty, and through the backward pass, of
contiguous and of transposed inputs (a backward may take another path than its forward).

Beyond pure floating-point operators: inputs a spec declares mutated are copied for every run
and compared after it (an input written but not declared fails); integer and bool outputs are
compared exactly, and a spec may judge any output by Exact or SQNR (with error percentiles)
instead of an elementwise tolerance; a distributed spec runs on its ranks.

The cases themselves run in check_cases.py (one process); this module routes a distributed
spec to its ranks (distributed.py, whose ranks run check_cases too), so neither imports the
other's caller. soak.py holds the checks over many calls: memory leaks and long-run decay.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from tritonkit.harness.check_cases import (  # noqa: F401  (the names callers import from here)
    CASES,
    CONSTANTS,
    CheckResult,
    check_local,
    fresh_seed,
    inject_constant,
    inject_specials,
    outputs_of,
    own_copy,
    planned_cases,
    poisoned_allocations,
    relayout,
    run_forward,
    with_own_state,
)
from tritonkit.harness.compare import (  # noqa: F401
    MIN_ELEMENTS_FOR_RATIO,
    RATIO_FLOOR,
    Outcome,
    _flatten,
    _ratio,
    _rel_l2,
    _upcast,
    compare,
    flatten,
    sqnr_db,
)
from tritonkit.harness.distributed import check_on_ranks
from tritonkit.harness.spec import OpSpec


def check_spec(
    spec: OpSpec,
    *,
    dtypes: Sequence[torch.dtype] | None = None,
    shapes: Sequence[Any] | None = None,
    device: torch.device | str | None = None,
    seed: int | None = None,
    cases: Sequence[str] = CASES,
    on_case: Callable[[CheckResult], None] | None = None,
) -> list[CheckResult]:
    """Run every check of one operator; returns one result per (params, shape, dtype, case).

    Args:
        spec: the operator.
        dtypes, shapes: a subset of the spec's (None: all of them).
        device: where inputs are made (None: CUDA if there is one, else the CPU).
        seed: the base seed (None: a fresh one, said in each result).
        cases: which of ``CASES`` to run.
        on_case: called with each result as it comes.

    A distributed spec is checked on its ranks (spawned processes, see distributed.py), each
    case passing when it passes on every rank."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    base_seed = fresh_seed() if seed is None else seed
    if spec.distributed is None or torch.distributed.is_initialized():
        return check_local(
            spec,
            dtypes=dtypes,
            shapes=shapes,
            device=device,
            seed=base_seed,
            cases=cases,
            on_case=on_case,
        )
    kwargs = dict(dtypes=dtypes, shapes=shapes, seed=base_seed, cases=tuple(cases))
    results = check_on_ranks(spec, device, kwargs)
    for res in results:
        if on_case:
            on_case(res)
    return results
