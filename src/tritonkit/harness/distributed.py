"""Run an engine on several ranks: spawned processes joined in one torch.distributed group.

A spec with ``distributed=Distributed(world_size=N)`` is checked and timed by N processes
(``torch.multiprocessing``'s spawn: a fresh interpreter each, as torchrun would start them),
joined through a file store in a temporary directory (no port to collide on), on the backend
the spec gives for the device type (gloo on the CPU, nccl with one GPU per rank). Each rank
imports the module the spec was built in to find it again, runs the engine's usual loop with
the same base seed (inputs drawn per rank), and writes its results as JSON; the parent merges
them: a check passes when it passes on every rank, and the bench keeps rank 0's records.
"""

from __future__ import annotations

import datetime
import importlib
import json
import math
import os
import tempfile
import traceback
from collections.abc import Sequence
from typing import Any

import torch

# The engines' one-process loops, under the names this module's ranks call them by: check.py
# and bench.py (which route a distributed spec here) sit above this module, not below it.
from tritonkit.harness.bench_cases import bench_local as bench_spec
from tritonkit.harness.check_cases import CheckResult
from tritonkit.harness.check_cases import check_local as check_spec
from tritonkit.harness.spec import _REGISTRY, OpSpec, load_specs


def find_spec(origin: str, name: str) -> OpSpec:
    """The spec ``name``, registered or a module attribute of ``origin``, in a spawned rank."""
    load_specs()
    module = importlib.import_module(origin) if origin else None
    if name in _REGISTRY:
        return _REGISTRY[name]
    for value in vars(module).values() if module is not None else ():
        if isinstance(value, OpSpec) and value.name == name:
            return value
    raise LookupError(f"spec {name!r} not found in module {origin!r} (nor registered)")


def _rank_device(device_type: str, rank: int) -> torch.device:
    if device_type == "cuda":
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    return torch.device(device_type)


def _rank_main(rank: int, job: dict[str, Any]) -> None:
    device = _rank_device(job["device_type"], rank)
    torch.distributed.init_process_group(
        job["backend"],
        init_method=f"file://{os.path.join(job['tmp'], 'store')}",
        rank=rank,
        world_size=job["world_size"],
        timeout=datetime.timedelta(seconds=job["timeout_s"]),
    )
    try:
        spec = find_spec(job["origin"], job["name"])
        if job["engine"] == "check":
            rows: list[Any] = [
                r.as_dict() for r in check_spec(spec, device=device, **job["kwargs"])
            ]
        else:
            rows = bench_spec(spec, **job["kwargs"])
        with open(os.path.join(job["tmp"], f"rank{rank}.json"), "w") as f:
            json.dump(rows, f)
    finally:
        torch.distributed.destroy_process_group()


def run_on_ranks(spec: OpSpec, engine: str, device_type: str, kwargs: dict) -> list[list[Any]]:
    """Each rank's results of ``engine`` ("check" or "bench") on ``spec``, rank by rank."""
    dist = spec.distributed
    assert dist is not None
    backend = dist.backends.get(device_type)
    if backend is None:
        raise ValueError(f"{spec.name}: no torch.distributed backend given for {device_type}")
    with tempfile.TemporaryDirectory(prefix="tritonkit-ranks-") as tmp:
        job = {
            "world_size": dist.world_size,
            "backend": backend,
            "timeout_s": dist.timeout_s,
            "tmp": tmp,
            "origin": spec.origin,
            "name": spec.name,
            "engine": engine,
            "device_type": device_type,
            "kwargs": kwargs,
        }
        torch.multiprocessing.start_processes(
            _rank_main, args=(job,), nprocs=dist.world_size, join=True, start_method="spawn"
        )
        out = []
        for rank in range(dist.world_size):
            with open(os.path.join(tmp, f"rank{rank}.json")) as f:
                out.append(json.load(f))
        return out


def _needs_gpus(spec: OpSpec, device: torch.device) -> str | None:
    world = spec.distributed.world_size if spec.distributed else 1
    if device.type == "cuda" and torch.cuda.device_count() < world:
        return f"needs {world} GPUs (one per rank), found {torch.cuda.device_count()}"
    return None


def check_on_ranks(spec: OpSpec, device: torch.device, kwargs: dict) -> list:
    """Run the check engine on every rank; one merged result per case."""
    why = _needs_gpus(spec, device)
    if why is not None:
        return [CheckResult(spec.name, "", "all", "all", "all", False, detail=why, skipped=why)]
    try:
        per_rank = run_on_ranks(spec, "check", device.type, kwargs)
    except Exception as exc:  # a rank that died: one failed result saying why
        detail = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=2)}"
        return [CheckResult(spec.name, "", "all", "all", "ranks", False, detail=detail)]
    return merge_checks(per_rank)


def _worst(values: Sequence[Any], pick) -> Any:
    present = [v for v in values if isinstance(v, (int, float)) and not math.isnan(v)]
    return pick(present) if present else None


def merge_checks(per_rank: list[list[dict]]) -> list:
    """Per case, one result: passed on every rank, the worst errors, each rank's detail."""
    lengths = {len(rows) for rows in per_rank}
    merged = []
    for rows in zip(*per_rank):
        res = CheckResult(**rows[0])
        res.passed = all(r["passed"] for r in rows)
        for key in ("max_abs", "rel_l2", "torch_rel_l2", "ratio", "err_p50", "err_p99"):
            setattr(res, key, _worst([r[key] for r in rows], max))
        res.sqnr_db = _worst([r["sqnr_db"] for r in rows], min)
        details = [f"rank {k}: {r['detail']}" for k, r in enumerate(rows) if r["detail"]]
        res.detail = "; ".join(details)
        merged.append(res)
    if len(lengths) > 1:
        detail = f"ranks ran different numbers of cases: {sorted(lengths)}"
        merged.append(CheckResult(merged[0].op, "", "all", "all", "ranks", False, detail=detail))
    return merged


# The bench on several ranks: every rank must call each collective the same number of times,
# so the warm-up is three calls and the number of samples fixed instead of chosen by time.
RANK_TIMING = {"warmup_ms": 0.0, "min_samples": 50, "max_samples": 50}


def bench_on_ranks(spec: OpSpec, kwargs: dict) -> list[dict[str, Any]]:
    """Run the bench engine on every rank (GPUs, nccl); rank 0's records, marked with the world
    size, or one record saying why it could not run."""
    why = _needs_gpus(spec, torch.device("cuda"))
    if why is not None:
        return [
            {
                "op": spec.name,
                "family": spec.family,
                "params": {},
                "shape": "all",
                "dtype": "all",
                "mode": "all",
                "bytes": 0,
                "flops": 0,
                "candidates": {},
                "speedup": {},
                "note": why,
            }
        ]
    per_rank = run_on_ranks(spec, "bench", "cuda", {**kwargs, "sampling": RANK_TIMING})
    for record in per_rank[0]:
        record["world_size"] = len(per_rank)
    return per_rank[0]
