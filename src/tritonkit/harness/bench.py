"""The bench engine: time an operator against its baselines and variants, in one run.

The timing of one process is bench_cases.py's (its docstring says what a record holds); this
module routes a distributed spec to its ranks (distributed.py, whose ranks run bench_cases
too), so that neither imports the other's caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tritonkit._hardware import Profile
from tritonkit.harness.bench_cases import (  # noqa: F401  (the names callers import from here)
    OURS,
    _mode_callable,
    bench_local,
    compiled_candidate,
    default_modes,
)
from tritonkit.harness.distributed import bench_on_ranks
from tritonkit.harness.spec import OpSpec


def bench_spec(spec: OpSpec, *, profile: Profile, **kwargs: Any) -> list[dict[str, Any]]:
    """Benchmark one operator; returns one record per (shape, dtype, mode).

    Args:
        spec: the operator.
        profile: the hardware profile whose roofline the records are placed on.
        **kwargs: bench_cases.bench_local's (modes, dtypes, baselines, shapes, seed, on_step,
            small, sampling, variants, compile_modes, energy_s).

    A distributed spec is timed on its ranks (spawned processes, see distributed.py), rank 0's
    records kept."""
    if spec.distributed is None or torch.distributed.is_initialized():
        return bench_local(spec, profile=profile, **kwargs)
    modes: Sequence[str] = kwargs.get("modes", ("fwd", "bwd"))
    job = dict(profile=profile, modes=tuple(modes), dtypes=kwargs.get("dtypes"))
    job.update(seed=kwargs.get("seed", 0), baselines=kwargs.get("baselines"))
    return bench_on_ranks(spec, {**job, "shapes": kwargs.get("shapes")})
