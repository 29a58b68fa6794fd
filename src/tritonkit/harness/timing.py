"""GPU timing: CUDA events, warm-up, L2 flush, interleaved candidates, robust statistics.

Every sample is one call between two CUDA events, preceded by a write of a buffer larger than
the L2 cache so that no call finds its inputs cached by the previous one. Candidates that are
compared are timed interleaved (each round times every candidate once, in rotating order), so
that clock and thermal drift land on all of them alike.

What is measured first is GPU time. Before each sample the GPU is kept busy
(``torch.cuda._sleep``) for longer than the host needs to enqueue the call, so a candidate with
more Python overhead (a custom op, an autograd Function) is not charged for the host's work
while the GPU idles.

Then what a user's loop sees (``time_loops``): calls made back to back with nothing else
queued, as a training step makes them. The host time per call is how long the calls take to
return (to enqueue their work); the wall time per call is how long until the GPU has finished
them. Where the host time exceeds the GPU time, the host sets the pace and the wall time shows
it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from tritonkit.harness.stats import remove_outliers


@dataclass(frozen=True)
class Stats:
    """Summary of timing samples, in milliseconds."""

    n: int
    median: float
    mean: float
    p10: float
    p90: float
    p99: float
    min: float
    spread: float  # (p90 - p10) / median: how much to trust a difference between two medians
    std: float = 0.0  # sample standard deviation (ddof=1)
    rsd: float = 0.0  # relative standard deviation, std / mean (0.05: 5%)

    def as_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def summarize(samples_ms: list[float] | np.ndarray) -> Stats:
    a = np.asarray(samples_ms, dtype=np.float64)
    if a.size == 0:
        raise ValueError("summarize: no samples")
    p10, p50, p90, p99 = np.percentile(a, [10, 50, 90, 99])
    return Stats(
        n=int(a.size),
        median=float(p50),
        mean=float(a.mean()),
        p10=float(p10),
        p90=float(p90),
        p99=float(p99),
        min=float(a.min()),
        spread=float((p90 - p10) / p50) if p50 > 0 else 0.0,
        std=float(a.std(ddof=1)) if a.size > 1 else 0.0,
        rsd=float(a.std(ddof=1) / a.mean()) if a.size > 1 and a.mean() > 0 else 0.0,
    )


# Repeats go on until every candidate's relative standard deviation (after Tukey's fences,
# stats.remove_outliers) is at most this, or until the time cap: seed 001's "RSD < 5%".
RSD_TARGET = 0.05
RSD_CAP_MS = 2000.0  # GPU time per candidate spent on further rounds, at most
RSD_WALL_S = 10.0  # and wall-clock time, at most
# A candidate slower than this per call (a naive version shown for contrast, hundreds of ms)
# gets SLOW_SAMPLES samples of its own, outside the interleaved rounds and their repeats: its
# median is not what the comparisons are about, and 20 rounds of it would take most of a run.
SLOW_MS = 50.0
SLOW_SAMPLES = 3


def rsd_of(samples_ms: list[float] | np.ndarray) -> float:
    """The RSD of the samples inside Tukey's fences (what the report's medians are taken over)."""
    return summarize(remove_outliers(samples_ms)).rsd


# How the L2 is flushed before each sample: "write" zeroes a buffer twice the L2's size (as
# triton.testing.do_bench does), which leaves the L2 full of dirty lines that the timed call
# then pays to write back, a few microseconds per call of a large copy (see
# docs/performance.md); "read" reads the buffer, which
# writes back the previous call's dirty lines before the sample and leaves only clean ones.
# Both evict the call's inputs.
FLUSH = "read"

# GPU clock cycles per microsecond for torch.cuda._sleep; Hopper boosts to about 1.98 GHz. A
# slower clock only makes the delay longer, which is harmless.
_CYCLES_PER_US = 2000


@functools.cache
def _flush_buffer(device: torch.device) -> torch.Tensor:
    # Twice the L2 (50-60 MB on Hopper), at least 256 MiB.
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
    size = max(256 << 20, 2 * l2)
    return torch.empty(size, dtype=torch.int8, device=device)


def _flush(buffer: torch.Tensor) -> None:
    if FLUSH == "read":
        buffer.view(torch.int32).sum()
    else:
        buffer.zero_()


def time_interleaved(
    fns: Mapping[str, Callable[[], object]],
    *,
    device: torch.device | None = None,
    warmup_ms: float = 25.0,
    rep_ms: float = 200.0,
    min_samples: int = 20,
    max_samples: int = 200,
    flush_l2: bool = True,
    host_times: dict[str, float] | None = None,
    setup: Mapping[str, Callable[[], object]] | None = None,
    rsd_target: float | None = RSD_TARGET,
    rsd_cap_ms: float = RSD_CAP_MS,
    repeats: dict[str, dict[str, float]] | None = None,
) -> dict[str, list[float]]:
    """Time each zero-argument callable; returns per-candidate samples in milliseconds.

    The first call of each candidate (compilation, autotuning, module load) is outside the
    warm-up budget; after it, each candidate runs for about ``warmup_ms``. The number of
    samples is chosen so that the slowest candidate takes about ``rep_ms`` in all, within
    ``[min_samples, max_samples]``. If ``host_times`` is given, it receives each candidate's
    median host (CPU) time per call, in microseconds. ``setup``, by candidate, runs before each
    of its calls, outside the timed region (an in-place operator's state put back).

    Then, while some candidate's RSD (std / mean of its samples inside Tukey's fences) is
    above ``rsd_target`` (None: one batch only), another batch of rounds is timed, until the
    extra rounds have taken ``rsd_cap_ms`` of GPU time or ``max_samples`` * 10 samples in all.
    ``repeats``, if given, receives per candidate the batches run, its RSD and whether it met
    the target.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("time_interleaved needs a CUDA device; timings on the CPU mean nothing")
    device = device or torch.device("cuda", torch.cuda.current_device())
    names = list(fns)
    flush = _flush_buffer(device) if flush_l2 else None

    setup = setup or {}
    estimates, host_us = {}, {}
    for name in names:
        prepare = setup.get(name, lambda: None)
        prepare()
        fns[name]()  # first call: compile, autotune, load
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        calls, elapsed, host = 0, 0.0, []
        t0 = time.perf_counter()
        while (calls < 3 and elapsed < SLOW_MS) or (elapsed < warmup_ms and calls < 1000):
            prepare()
            start.record()
            h0 = time.perf_counter()
            fns[name]()
            host.append(time.perf_counter() - h0)
            end.record()
            end.synchronize()
            elapsed += start.elapsed_time(end)
            calls += 1
            if time.perf_counter() - t0 > 10:  # a pathological candidate must not stall a run
                break
        estimates[name] = elapsed / calls
        host_us[name] = float(np.median(host)) * 1e6
    slow, names = split_slow(estimates)
    slowest = max(estimates[name] for name in names)
    n = int(min(max_samples, max(min_samples, rep_ms / max(slowest, 1e-3))))
    # Enough GPU-side delay for the host to enqueue the call before the start event fires.
    sleep_cycles = int(_CYCLES_PER_US * (20.0 + 1.5 * max(host_us.values())))

    def batch(names: list[str] = names, rounds: int = n) -> dict[str, list[float]]:
        events = {name: [] for name in names}
        for i in range(rounds):
            order = names[i % len(names) :] + names[: i % len(names)]
            for name in order:
                if name in setup:
                    setup[name]()
                if flush is not None:
                    _flush(flush)
                torch.cuda._sleep(sleep_cycles)
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fns[name]()
                end.record()
                events[name].append((start, end))
        torch.cuda.synchronize(device)
        return {name: [s.elapsed_time(e) for s, e in pairs] for name, pairs in events.items()}

    samples = (
        until_stable(batch, rsd_target, rsd_cap_ms, 10 * max_samples, repeats) if names else {}
    )
    for name in slow:  # a few samples each, no repeats
        samples[name] = batch([name], SLOW_SAMPLES)[name]
        if repeats is not None:
            repeats[name] = {"batches": 1, "rsd": rsd_of(samples[name]), "rsd_met": None}
            repeats[name]["slow"] = f"{SLOW_SAMPLES} samples (over {SLOW_MS:g} ms per call)"
    if host_times is not None:
        host_times.update(host_us)
    return samples


def split_slow(estimates: Mapping[str, float]) -> tuple[list[str], list[str]]:
    """(slow, the rest): the candidates whose warm-up time per call is over SLOW_MS, unless
    every one is (then they are all timed as usual)."""
    slow = [name for name, ms in estimates.items() if ms > SLOW_MS]
    rest = [name for name in estimates if name not in slow]
    return (slow, rest) if rest else ([], list(estimates))


def until_stable(
    batch: Callable[[], dict[str, list[float]]],
    rsd_target: float | None,
    cap_ms: float,
    max_total: int,
    repeats: dict[str, dict[str, float]] | None = None,
    wall_s: float = RSD_WALL_S,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Samples of ``batch()`` (per candidate, in ms), batch after batch while some candidate's
    RSD (inside Tukey's fences) is above ``rsd_target``, until the further batches' samples add
    up to ``cap_ms`` for the slowest candidate, a candidate holds ``max_total`` samples, or the
    further batches have taken ``wall_s`` seconds of wall-clock time (flushes and host work
    included, which ``cap_ms`` does not count).
    ``repeats`` receives per candidate the batches run, the RSD and whether it met the target
    (``rsd_met``; None as a target: one batch, always met)."""
    samples = batch()
    names = list(samples)
    batches, extra_ms, t0 = 1, 0.0, clock()
    while rsd_target is not None and extra_ms < cap_ms and clock() - t0 < wall_s:
        if all(rsd_of(samples[name]) <= rsd_target for name in names):
            break
        if max(len(samples[name]) for name in names) >= max_total:
            break
        more = batch()
        batches += 1
        extra_ms += max(sum(more[name]) for name in names)
        for name in names:
            samples[name] = list(samples[name]) + list(more[name])
    if repeats is not None:
        for name in names:
            rsd = rsd_of(samples[name])
            met = rsd_target is None or rsd <= rsd_target
            repeats[name] = {"batches": batches, "rsd": rsd, "rsd_met": bool(met)}
    return samples


def _loop(fn: Callable[[], object], calls: int, device: torch.device) -> tuple[float, float]:
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize(device)
    t2 = time.perf_counter()
    return (t1 - t0) / calls * 1e6, (t2 - t0) / calls * 1e6


def time_loops(
    fns: Mapping[str, Callable[[], object]],
    gpu_ms: Mapping[str, float],
    *,
    device: torch.device | None = None,
    rounds: int = 5,
    round_ms: float = 30.0,
    min_calls: int = 10,
    max_calls: int = 300,
) -> dict[str, dict[str, float]]:
    """Host and wall time per call (us) of back-to-back calls, per candidate: the median over
    ``rounds`` interleaved rounds, each about ``round_ms`` of calls (from ``gpu_ms``, the
    candidates' GPU medians, or their host time where that is larger)."""
    if not torch.cuda.is_available():
        raise RuntimeError("time_loops needs a CUDA device; timings on the CPU mean nothing")
    device = device or torch.device("cuda", torch.cuda.current_device())
    calls = {}
    for name, fn in fns.items():
        host_us, _ = _loop(fn, 3, device)  # warm, and a first estimate of the host's share
        per_call_ms = max(gpu_ms.get(name, 0.0), host_us / 1e3, 1e-3)
        calls[name] = loop_calls(per_call_ms, round_ms, min_calls, max_calls)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in fns}
    names = list(fns)
    for i in range(rounds):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            samples[name].append(_loop(fns[name], calls[name], device))
    return {
        name: {
            "host_us": float(np.median([h for h, _ in got])),
            "wall_us": float(np.median([w for _, w in got])),
            "calls": calls[name],
        }
        for name, got in samples.items()
    }


def loop_calls(per_call_ms: float, round_ms: float, min_calls: int, max_calls: int) -> int:
    """Calls per round of ``time_loops``: about ``round_ms`` of them, within [min_calls,
    max_calls], but never more than 10 x ``round_ms`` of a slow candidate (one call at least)."""
    calls = int(min(max_calls, max(min_calls, round_ms / per_call_ms)))
    return max(1, min(calls, int(10 * round_ms / per_call_ms)))


def peak_memory(fn: Callable[[], object], device: torch.device) -> int:
    """Bytes allocated at the peak of one call, above what was allocated before it."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    out = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del out
    return int(peak)
