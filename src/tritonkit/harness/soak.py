"""Checks over many calls: no memory leak, no performance decay over a long run.

Leak check (seed 000: memory stays flat over many calls): one case of an operator (its
smallest test shape unless given; forward, and forward + backward where it has one) is called
a few times to fill its caches (plans, compiled kernels, workspaces), then ``calls`` more
times, every output dropped. Memory is read before and after: on CUDA the caching allocator's
allocated bytes (``torch.cuda.memory_allocated``), everywhere the bytes of the storages of the
tensors made during the calls and still alive after them (``new_tensors``: what a Python cache
that keeps outputs alive holds, found on the CPU too, where there is no allocator count). The
check fails when either grew by more than ``LEAK_SLACK`` bytes. 1,000 calls on a GPU take a
second or two per operator; under the CPU interpreter every call runs each kernel program by
program, so CI runs the same check with fewer calls (the count is a parameter; ``tritonkit soak
--calls``).

Long-run check: calls back to back for ``seconds``, timed in windows (CUDA events around a
window's calls on a GPU; the host clock elsewhere, where it checks only the mechanism); the
median time per call of the last third of the windows against the first third's. It fails when
the later ones are slower by more than ``max(3 x noise, DECAY_FLOOR)``, the noise being the
windows' spread from one window to the next (1.4826 x the median of |successive differences| /
sqrt 2, over the median window), which a slow decay does not inflate.
"""

from __future__ import annotations

import contextlib
import gc
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from tritonkit.harness.check_cases import CheckResult, fresh_seed, with_own_state
from tritonkit.harness.modes import _mode_callable
from tritonkit.harness.spec import OpSpec, dtype_name

LEAK_SLACK = 4096  # bytes: an allocator rounding, a lazily made scalar
LEAK_WARMUP = 3
DECAY_FLOOR = 0.03


def _storages(objects: list) -> dict[int, int]:
    """Data pointer -> bytes of the storages of the tensors among ``objects``."""
    seen: dict[int, int] = {}
    with warnings.catch_warnings():  # isinstance on a deprecated module attribute warns
        warnings.simplefilter("ignore")
        tensors = [o for o in objects if isinstance(o, torch.Tensor)]
    for t in tensors:
        try:
            if not t.is_meta:
                storage = t.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
        except Exception:  # a tensor subclass without storage, a freed wrapper
            continue
    return seen


def live_tensor_bytes() -> int:
    """Bytes of the distinct storages of every tensor the garbage collector tracks."""
    gc.collect()
    return sum(_storages(gc.get_objects()).values())


@contextlib.contextmanager
def new_tensors() -> Iterator[dict[str, int]]:
    """Bytes of storages held by tensors made inside the block and alive at its end (and not
    shared with a tensor from before it), in ``got["bytes"]``.

    Objects from before are frozen (``gc.freeze``), so the scan at the end walks only what the
    block made: a whole-heap scan costs about half a second in a test process, this one
    almost nothing when nothing survived."""
    gc.collect()
    gc.freeze()
    got = {"bytes": 0}
    try:
        yield got
        gc.collect()
        made = {id(o) for o in gc.get_objects()}
    finally:
        gc.unfreeze()
    if made:
        everything = gc.get_objects()
        fresh = _storages([o for o in everything if id(o) in made])
        # Storages that tensors from before the block share (views) are not new memory.
        old = _storages([o for o in everything if id(o) not in made]) if fresh else {}
        got["bytes"] = sum(n for ptr, n in fresh.items() if ptr not in old)


def _allocated(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return int(torch.cuda.memory_allocated(device))


def _case(spec: OpSpec, shape: Any, dtype: torch.dtype | None) -> tuple[Any, torch.dtype]:
    dtype = dtype or (spec.bench_dtypes[0] if spec.bench_dtypes[0] in spec.dtypes else None)
    dtype = dtype or spec.dtypes[0]
    if shape is None:
        shape = spec.shapes.test[-1] if len(spec.shapes.test) > 1 else spec.shapes.test[0]
    return shape, dtype


def leak_check(
    spec: OpSpec,
    *,
    calls: int = 1000,
    device: torch.device | str | None = None,
    shape: Any = None,
    dtype: torch.dtype | None = None,
    mode: str | None = None,
    seed: int | None = None,
    warmup: int = LEAK_WARMUP,
) -> CheckResult:
    """Memory before and after ``calls`` calls of one case; a CheckResult of case "leak".

    Args:
        spec: the operator.
        calls: how many calls after the warm-up.
        device: where (None: CUDA if there is one, else the CPU).
        shape, dtype: the case (None: the spec's last test shape, its main dtype).
        mode: "fwd" or "fwd+bwd" (None: fwd+bwd where the spec has a backward).
        seed: for the inputs.
        warmup: calls before the first reading (caches filled).
    """
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    shape, dtype = _case(spec, shape, dtype)
    mode = mode or ("fwd+bwd" if spec.backward else "fwd")
    seed = fresh_seed() if seed is None else seed
    res = CheckResult(spec.name, "", str(shape), dtype_name(dtype), "leak", False, seed=seed)
    try:
        inputs = spec.make_inputs(shape, dtype, device, seed)
        params = dict(spec.params[0])
        args = with_own_state(spec, inputs)
        grad_idx = spec.grad_indices(inputs) if mode != "fwd" else []
        call = _mode_callable(spec.impl, args, params, mode, grad_idx, seed)
        for _ in range(warmup):
            call()
        before_alloc = _allocated(device)
        with new_tensors() as kept:
            for _ in range(calls):
                call()
        after_alloc = _allocated(device)
    except Exception as exc:  # a crash is a failed check, with its cause
        res.detail = f"{type(exc).__name__}: {exc}"[:500]
        return res
    grew_alloc = None if before_alloc is None else after_alloc - before_alloc
    worst = max(kept["bytes"], grew_alloc or 0)
    res.passed = worst <= LEAK_SLACK
    res.max_abs = float(worst)  # bytes grown: the report's error column
    alloc = f"allocated {before_alloc} -> {after_alloc} bytes, " if grew_alloc is not None else ""
    text = f"{mode}, {calls} calls: {alloc}{kept['bytes']} bytes of tensors made and kept"
    res.detail = "" if res.passed else f"memory grew: {text}"
    res.params = f"calls={calls}, mode={mode}"
    return res


def window_timer(fn: Callable[[], Any], device: torch.device) -> Callable[[int], float]:
    """Milliseconds per call of ``n`` back-to-back calls: CUDA events on a GPU, else the host
    clock."""
    if device.type == "cuda":

        def timed(n: int) -> float:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / n

        return timed

    def host(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) * 1e3 / n

    return host


def decay(windows_ms: list[float]) -> dict[str, float]:
    """First and last third's medians, the relative change, the noise and the bound."""
    w = np.asarray(windows_ms, dtype=np.float64)
    third = max(1, w.size // 3)
    first, last = float(np.median(w[:third])), float(np.median(w[-third:]))
    med = float(np.median(w))
    # From successive windows' differences (divided by sqrt 2): a slow drift, the decay looked
    # for, does not pass for noise the way it would in the spread around one median.
    steps = np.abs(np.diff(w)) if w.size > 1 else np.zeros(1)
    noise = float(1.4826 * np.median(steps) / np.sqrt(2) / med) if med > 0 else 0.0
    change = last / first - 1.0 if first > 0 else 0.0
    return {
        "first_ms": first,
        "last_ms": last,
        "change": change,
        "noise": noise,
        "bound": max(3 * noise, DECAY_FLOOR),
    }


def stability_check(
    spec: OpSpec,
    *,
    seconds: float = 120.0,
    windows: int = 30,
    device: torch.device | str | None = None,
    shape: Any = None,
    dtype: torch.dtype | None = None,
    mode: str = "fwd",
    seed: int | None = None,
    timer: Callable[[int], float] | None = None,
) -> CheckResult:
    """Calls back to back for ``seconds`` in ``windows`` windows; a CheckResult of case
    "long-run" that fails where the last third of the windows is slower than the first third
    beyond the noise.

    Args:
        spec: the operator.
        seconds: how long the loop lasts.
        windows: how many windows it is cut into.
        device: where (None: CUDA if there is one, else the CPU).
        shape, dtype: the case (None: the spec's first bench shape on a GPU, its last test
            shape elsewhere; its main dtype).
        mode: "fwd", "bwd" or "fwd+bwd".
        seed: for the inputs.
        timer: ms per call of n calls (None: ``window_timer``); tests pass their own.
    """
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if shape is None and device.type == "cuda":
        shape = spec.shapes.bench[0]
    shape, dtype = _case(spec, shape, dtype)
    seed = fresh_seed() if seed is None else seed
    res = CheckResult(spec.name, "", str(shape), dtype_name(dtype), "long-run", False, seed=seed)
    try:
        inputs = spec.make_inputs(shape, dtype, device, seed)
        args = with_own_state(spec, inputs)
        grad_idx = spec.grad_indices(inputs) if mode != "fwd" else []
        call = _mode_callable(spec.impl, args, dict(spec.params[0]), mode, grad_idx, seed)
        timer = timer or window_timer(call, device)
        per_call = max(timer(1), timer(1), 1e-4)  # warm, then one call's time
        n = max(1, int(seconds * 1e3 / windows / per_call))
        times = [timer(n) for _ in range(windows)]
    except Exception as exc:
        res.detail = f"{type(exc).__name__}: {exc}"[:500]
        return res
    d = decay(times)
    res.passed = d["change"] <= d["bound"]
    res.max_abs = d["change"]
    res.params = f"seconds={seconds:g}, windows={windows}, calls per window={n}, mode={mode}"
    if not res.passed:
        res.detail = (
            f"slower by {100 * d['change']:.1f}% ({d['first_ms']:.4g} -> {d['last_ms']:.4g} "
            f"ms per call), beyond {100 * d['bound']:.1f}% (3 x noise {100 * d['noise']:.1f}%)"
        )
    return res
