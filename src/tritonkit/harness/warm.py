"""``tritonkit bench`` on a GPU: every kernel the run will need, compiled first, in parallel.

A cold run spends most of its time compiling (Triton's front end, LLVM and ptxas for each
kernel specialization; inductor for each ``torch.compile`` baseline), one kernel at a time on
one CPU core, while the GPU idles. Here worker processes (``jobs``, default the CPU cores up to
8) each run a share of the run's calls once: the accuracy checks of one (operator, dtype) and
one call per mode of every candidate at each bench shape. What they compile lands in the
on-disk caches (Triton's, inductor's), so the run that follows loads each kernel instead of
compiling it. Nothing is measured or reported here: a call that fails (out of memory beside
the other workers, say) is left for the run itself, which reports it. The workers never time
launch configs (``TRITONKIT_AUTOTUNE=0``: shipped tables, else the heuristic; tuning timed on
a GPU shared by several processes would be wrong), and each takes a share of the GPU's memory.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

MAX_JOBS = 8


def default_jobs() -> int:
    return max(1, min(MAX_JOBS, os.cpu_count() or 1))


def tasks(
    items, modes: Sequence[str], baselines: Sequence[str] | None, seed: int, checks: bool = True
) -> list[tuple]:
    """The calls of a run, as picklable task tuples, the costliest kinds first (the checks'
    only with ``checks``)."""
    from tritonkit.harness.spec import dtype_name

    out: list[tuple] = []
    for it in items:
        if it.spec.distributed is not None:
            continue
        for shape in it.bench_shapes:
            for dtype in it.bench_dtypes:
                out.append(
                    (
                        "bench",
                        it.spec.name,
                        shape,
                        dtype_name(dtype),
                        tuple(modes),
                        baselines,
                        it.variants,
                        seed,
                    )
                )
    for it in items if checks else ():
        if it.spec.distributed is not None:
            continue
        for dtype in it.check_dtypes:
            out.append(
                ("check", it.spec.name, tuple(it.check_shapes), dtype_name(dtype), it.cases, seed)
            )
    return out


def _init_worker(memory_fraction: float, quiet: bool = True) -> None:
    os.environ["TRITONKIT_AUTOTUNE"] = "0"
    import torch

    if quiet:  # the workers' stderr is the command's: the same library noise kept off it
        from tritonkit.harness.quiet import silence_process

        silence_process()

    if torch.cuda.is_available():
        torch.cuda.set_per_process_memory_fraction(memory_fraction)


def run_task(task: tuple) -> str | None:
    """One task in a worker; returns None, or why it failed (not fatal)."""
    import torch

    from tritonkit.harness.spec import get_spec

    kind, name = task[0], task[1]
    spec = get_spec(name)
    try:
        if kind == "check":
            from tritonkit.harness.check import check_spec

            _, _, shapes, dtype, cases, seed = task
            check_spec(
                spec, dtypes=[getattr(torch, dtype)], shapes=list(shapes), cases=cases, seed=seed
            )
        else:
            _, _, shape, dtype, modes, baselines, variants, seed = task
            _call_candidates(spec, shape, getattr(torch, dtype), modes, baselines, variants, seed)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    except Exception as exc:  # the run itself reports what fails
        return f"{type(exc).__name__}: {exc}"[:200]
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return None


def _call_candidates(spec, shape, dtype, modes, baselines, variants, seed) -> None:
    """Each candidate the bench would time, called once per mode (compiling it)."""
    import torch

    from tritonkit.harness.bench import _mode_callable
    from tritonkit.harness.check import with_own_state
    from tritonkit.harness.spec import Unavailable

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    inputs = spec.make_inputs(shape, dtype, device, seed)
    params = dict(spec.params[0])
    fns: dict[str, tuple[Any, bool]] = {"tritonkit": (spec.impl, spec.backward)}
    for name, variant in spec.variants.items() if variants else ():
        fns[name] = (variant, False)
    for name, baseline in spec.baselines.items():
        if baselines is not None and name not in baselines:
            continue
        try:
            fns[name] = (baseline.build(), baseline.backward)
        except Unavailable:
            continue
    grad_idx = spec.grad_indices(inputs)
    for mode in modes:
        if spec.bench_note(shape, mode) is not None or (mode != "fwd" and not spec.backward):
            continue
        for fn, has_backward in fns.values():
            if mode != "fwd" and not has_backward:
                continue
            try:
                _mode_callable(fn, with_own_state(spec, inputs), params, mode, grad_idx, seed)()
            except Exception:  # one candidate's failure leaves the others to compile
                continue


def compile_ahead(
    items,
    modes,
    baselines,
    seed: int,
    jobs: int | None = None,
    checks: bool = True,
    quiet: bool = True,
) -> int:
    """Run the calls of a bench run once in ``jobs`` worker processes; returns how many
    failed there (they run again, and are reported, in the run). ``quiet``: library warnings
    and logs off the workers' stderr (harness/quiet.py), as off the command's."""
    from tritonkit.harness.progress import Progress

    work = tasks(items, modes, baselines, seed, checks)
    jobs = min(jobs or default_jobs(), len(work)) if work else 0
    if jobs <= 1:
        return 0
    print(
        f"bench: compiling the run's kernels first, in {jobs} processes ({len(work)} tasks)",
        file=sys.stderr,
    )
    progress = Progress(len(work), "compile")
    failed = 0
    context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
    fraction = min(0.9, 1.8 / jobs)
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=_init_worker,
                             initargs=(fraction, quiet)) as pool:  # fmt: skip
        futures = {pool.submit(run_task, t): t for t in work}
        for future in as_completed(futures):
            task = futures[future]
            try:
                why = future.result()
            except Exception as exc:  # a worker that died (out of memory, a device assert)
                why = f"{type(exc).__name__}: {exc}"
            failed += why is not None
            progress.step(f"{task[0]} {task[1]} {task[3]}")
    progress.close()
    return failed
