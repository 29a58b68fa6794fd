"""Multi-objective tuning: latency, peak memory and energy; the Pareto set and a weighted choice.

A kernel's tuning space is what its launcher hands ``_tuning.tune`` (candidates, a ``run``
that launches one config on the call's inputs, a ``prune``, maybe ``neighbours``).
``capture`` calls an operator with ``_tuning.tune`` replaced by a recorder (and the plan
cache isolated, so the call plans afresh), which keeps those arguments and answers the
heuristic default. ``explore`` then measures configs of one captured space:

- the space: the launcher's candidates, or where there are more than ``large`` of them, a
  random sample of ``sample`` (``random_sample``, which also draws from a conditional space
  given as a function of the values drawn so far), and then hierarchical refinement: the
  neighbours of the best, while they improve (``_tuning.search``'s walk);
- earlier tunings of the same kernel (this machine's cache) prune it: a config slower than
  ``HISTORY_SLOWER`` x the best at every earlier key that timed it is not measured again
  (``history_pruned``);
- per config: the median latency (``_tuning``'s timer, ``triton.testing.do_bench``), the peak
  memory allocated during one call above what was allocated before it, and where asked the
  energy per call (energy.py);
- the Pareto set over the objectives measured (no other config at least as good in all and
  better in one), and the weighted choice: the config with the least sum of weight x (value -
  the best value of that objective) / the best value, by default ms 1.0, peak_bytes 0.02,
  joules 0.1 (1% more latency is worth 50% more peak memory, 0.02 x 0.5); for peak memory the
  denominator is at least what the process already holds (its operands among it), so a
  workspace is weighed against the memory the call lives in; it is applied by writing it to
  the machine's tuning cache when ``apply`` is set.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tritonkit import _tuning
from tritonkit._tuning import Config

HISTORY_SLOWER = 1.5
OBJECTIVES = ("ms", "peak_bytes", "joules")
WEIGHTS = {"ms": 1.0, "peak_bytes": 0.02, "joules": 0.1}


@dataclass
class Space:
    """One captured ``_tuning.tune`` call."""

    kernel: str
    key: Mapping[str, Any]
    candidates: list[Config]
    run: Callable[[Config], Any]
    prune: Callable[[Config], bool] | None = None
    neighbours: Callable[[Config], Sequence[Config]] | None = None


@dataclass
class Point:
    """One measured config."""

    config: Config
    values: dict[str, float] = field(default_factory=dict)
    how: str = "candidate"  # candidate, sampled, neighbour

    def as_dict(self) -> dict[str, Any]:
        return {"config": str(self.config), "how": self.how, **self.values}


@contextlib.contextmanager
def _recording(spaces: list[Space]) -> Iterator[None]:
    from tritonkit.ops._core.plan import PLANS

    real = _tuning.tune

    def record(kernel, key, candidates, run, *, neighbours=None, prune=None):
        spaces.append(Space(kernel, dict(key), list(candidates), run, prune, neighbours))
        return candidates[0]

    _tuning.tune = record
    try:
        with PLANS.isolated():
            yield
    finally:
        _tuning.tune = real


def capture(call: Callable[[], Any]) -> list[Space]:
    """The tuning spaces ``call`` consults, in order (the call runs with the defaults)."""
    spaces: list[Space] = []
    with _recording(spaces):
        call()
    return spaces


def merge(spaces: Sequence[Space]) -> Space:
    """One joint space over captured spaces of one kernel whose keys differ in a decision the
    launcher makes before tuning (matmul's split-K factor): every allowed candidate of each,
    run by its own space's ``run``; the key is what they share. Where configs of different
    spaces cost different memory (a split-K workspace), the joint space is where latency and
    memory trade."""
    if not spaces:
        raise ValueError("merge: no spaces")
    runs: dict[Config, Callable[[Config], Any]] = {}
    for sp in spaces:
        for c in sp.candidates:
            if (sp.prune is None or sp.prune(c)) and c not in runs:
                runs[c] = sp.run
    keys = [sp.key for sp in spaces]
    shared = {k: v for k, v in keys[0].items() if all(key.get(k) == v for key in keys)}
    differ = sorted({k for key in keys for k in key if k not in shared})
    shared["joint"] = ", ".join(f"{k}: {sorted({str(key.get(k)) for key in keys})}" for k in differ)
    return Space(spaces[0].kernel, shared, list(runs), lambda c: runs[c](c))


def random_sample(
    space: Mapping[str, Sequence[Any] | Callable[[dict[str, Any]], Sequence[Any]]],
    n: int,
    seed: int = 0,
    valid: Callable[[dict[str, Any]], bool] | None = None,
    tries: int = 20,
) -> list[dict[str, Any]]:
    """Up to ``n`` distinct points of a conditional space, drawn at random.

    Args:
        space: per parameter, in order, its values, or a function of the values drawn so far
            that returns them (a conditional space: BLOCK_K's choices may depend on BLOCK_M).
        n: how many points.
        seed: the generator's seed.
        valid: a point is kept only where this holds.
        tries: draws per point before giving up (a space with fewer valid points than ``n``).
    """
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    seen: set[tuple] = set()
    for _ in range(n * tries):
        if len(out) >= n:
            break
        point: dict[str, Any] = {}
        for name, values in space.items():
            choices = values(point) if callable(values) else values
            if not choices:
                break
            point[name] = rng.choice(list(choices))
        else:
            key = tuple(sorted(point.items()))
            if key not in seen and (valid is None or valid(point)):
                seen.add(key)
                out.append(point)
    return out


def history_pruned(
    kernel: str, candidates: Sequence[Config], entries: Mapping[str, Any] | None = None
) -> tuple[list[Config], list[Config]]:
    """(kept, dropped): a candidate is dropped where earlier tunings of ``kernel`` (the cache's
    entries, default this machine's) timed it at two keys or more and it was slower than
    ``HISTORY_SLOWER`` x the best at every one. The first candidate (the default) is kept."""
    if entries is None:
        entries = _tuning._read(_tuning.cache_path(), _tuning._machine())
    ratios: dict[Config, list[float]] = {}
    for name, entry in entries.items():
        if not name.startswith(kernel + "|") and name.split("|", 1)[0] != kernel:
            continue
        timed = [(Config.from_dict(c), ms) for c, ms in entry.get("tried", []) if ms]
        if not timed:
            continue
        best = min(ms for _, ms in timed)
        for c, ms in timed:
            ratios.setdefault(c, []).append(ms / best)
    kept, dropped = [], []
    for i, c in enumerate(candidates):
        r = ratios.get(c, [])
        slow = i > 0 and len(r) >= 2 and min(r) > HISTORY_SLOWER
        (dropped if slow else kept).append(c)
    return kept, dropped


def pareto_front(points: Sequence[Point], objectives: Sequence[str]) -> list[Point]:
    """The points no other point dominates (at least as good in every objective, better in
    one); lower is better in each."""

    def dominates(a: Point, b: Point) -> bool:
        av = [a.values[o] for o in objectives]
        bv = [b.values[o] for o in objectives]
        return all(x <= y for x, y in zip(av, bv)) and any(x < y for x, y in zip(av, bv))

    return [p for p in points if not any(dominates(q, p) for q in points if q is not p)]


def weighted_choice(
    points: Sequence[Point],
    weights: Mapping[str, float],
    floors: Mapping[str, float] | None = None,
) -> tuple[Point, dict[int, float]]:
    """The point with the least sum over objectives of weight x its excess over the best,
    (value - best) / max(best, floor), and every point's score by index.

    Args:
        points: the measured points.
        weights: per objective.
        floors: per objective, the least denominator of the excess (default none): for peak
            memory, what the process already holds (``explore`` passes it), so that a few MiB
            of workspace beside hundreds of operands' MiB count as the few percent they are,
            not as infinitely more than a config that allocates nothing.
    """
    best = {o: min(p.values[o] for p in points) for o in weights}
    floors = floors or {}

    def excess(o: str, v: float) -> float:
        scale = max(best[o], floors.get(o, 0.0))
        if scale > 0:
            return (v - best[o]) / scale
        return 0.0 if v == best[o] else 1.0  # the best uses none: any use is a full unit worse

    scores = {
        i: sum(w * excess(o, p.values[o]) for o, w in weights.items()) for i, p in enumerate(points)
    }
    return points[min(scores, key=scores.get)], scores


def measure(
    space: Space,
    config: Config,
    *,
    timer: Callable[[Callable[[Config], Any], Config], float | None] | None = None,
    peak: Callable[[Callable[[], Any]], int] | None = None,
    energy_s: float = 0.0,
) -> dict[str, float] | None:
    """ms, peak_bytes (and joules where ``energy_s``) of one config; None if it cannot run.

    The peak is taken over the config's first run, which also builds what the launcher keeps
    for it (a split-K workspace, TMA descriptors): memory a config costs, not only the call's.
    """
    timer = timer or _tuning._time_config
    if peak is None:
        import torch

        from tritonkit.harness.timing import peak_memory

        device = torch.device("cuda", torch.cuda.current_device())

        def peak(fn: Callable[[], Any]) -> int:
            return peak_memory(fn, device)

    try:
        first_peak = float(peak(lambda: space.run(config)))
    except Exception:  # a config that cannot compile or launch is not a candidate
        return None
    ms = timer(space.run, config)
    if ms is None:
        return None
    values = {"ms": float(ms), "peak_bytes": first_peak}
    if energy_s > 0:
        from tritonkit.harness import energy

        got = energy.measure(lambda: space.run(config), energy_s)
        values["joules"] = got["joules_per_call"]
    return values


def explore(
    space: Space,
    *,
    weights: Mapping[str, float] | None = None,
    large: int = 24,
    sample: int = 16,
    seed: int = 0,
    energy_s: float = 0.0,
    history: Mapping[str, Any] | None = None,
    timer: Callable[[Callable[[Config], Any], Config], float | None] | None = None,
    peak: Callable[[Callable[[], Any]], int] | None = None,
    apply: bool = False,
    resident: float | None = None,
    seconds: float | None = None,
) -> dict[str, Any]:
    """Measure a space's configs; the Pareto set, the weighted choice and the fastest.

    Args:
        space: a captured tuning space.
        weights: per objective (default: ms 1.0, peak_bytes 0.02, joules 0.1 where measured).
        large: above this many candidates, ``sample`` of them at random, then neighbours.
        sample: how many to sample.
        seed: the sampling's seed.
        energy_s: seconds of NVML measurement per config (0: no energy objective).
        history: earlier tunings' cache entries (None: this machine's cache).
        timer, peak: measurement functions (tests pass fakes).
        apply: store the weighted choice in the machine's tuning cache for this key.
        resident: bytes the process holds before a config runs (its operands among them), the
            least denominator of the peak memory's excess in the weighted choice (None: CUDA's
            memory_allocated where there is a GPU, else 0).
        seconds: wall-clock time for measuring (None: no limit); configs not reached by then
            are left out and counted in ``not_measured``.
    """
    if resident is None:
        import torch

        resident = float(torch.cuda.memory_allocated()) if torch.cuda.is_available() else 0.0
    _tuning._SEARCHING.on, was = True, _tuning._SEARCHING.on
    try:
        deadline = None if seconds is None else time.perf_counter() + seconds
        return _explore(
            space, weights, large, sample, seed, energy_s, history, timer, peak, apply, resident,
            deadline,
        )  # fmt: skip
    finally:
        _tuning._SEARCHING.on = was


def _explore(
    space, weights, large, sample, seed, energy_s, history, timer, peak, apply, resident, deadline
):
    cands = [c for c in space.candidates if space.prune is None or space.prune(c)]
    kept, dropped = history_pruned(space.kernel, cands, history)
    order: list[tuple[Config, str]] = [(c, "candidate") for c in kept]
    if len(kept) > large:
        rng = random.Random(seed)
        picked = [kept[0], *rng.sample(kept[1:], min(sample, len(kept) - 1))]
        order = [(c, "sampled") for c in picked]
    points: dict[Config, Point] = {}
    late: list[Config] = []

    def visit(c: Config, how: str) -> None:
        if c in points:
            return
        if deadline is not None and points and time.perf_counter() > deadline:
            late.append(c)  # past the time limit: one measured config at least, then none
            return
        values = measure(space, c, timer=timer, peak=peak, energy_s=energy_s)
        if values is not None:
            points[c] = Point(c, values, how)

    for c, how in order:
        visit(c, how)
    if not points:
        raise RuntimeError(f"{space.kernel}: no config could run")
    if len(kept) > large and space.neighbours is not None:  # hierarchical: refine the best
        while True:
            best = min(points.values(), key=lambda p: p.values["ms"])
            fresh = [
                n
                for n in space.neighbours(best.config)
                if n not in points and (space.prune is None or space.prune(n))
            ]
            for n in fresh:
                visit(n, "neighbour")
            if late or min(points.values(), key=lambda p: p.values["ms"]) is best:
                break
    pts = list(points.values())
    objectives = [o for o in OBJECTIVES if all(o in p.values for p in pts)]
    weights = dict(weights or WEIGHTS)
    weights = {o: w for o, w in weights.items() if o in objectives}
    front = pareto_front(pts, objectives)
    chosen, _ = weighted_choice(front, weights, {"peak_bytes": resident})
    fastest = min(pts, key=lambda p: p.values["ms"])
    if apply:
        _tuning.store(
            space.kernel, space.key, chosen.config, [(c, p.values["ms"]) for c, p in points.items()]
        )
    return {
        "kernel": space.kernel,
        "key": {k: str(v) for k, v in space.key.items()},
        "candidates": len(space.candidates),
        "measured": len(pts),
        "not_measured": len(late),  # past ``seconds``
        "pruned_by_history": [str(c) for c in dropped],
        "objectives": objectives,
        "weights": weights,
        "points": [p.as_dict() for p in pts],
        "pareto": [p.as_dict() for p in front],
        "chosen": chosen.as_dict(),
        "fastest": fastest.as_dict(),
        "chosen_vs_fastest_pct": 100.0 * (chosen.values["ms"] / fastest.values["ms"] - 1.0),
        "resident_bytes": resident,
        "trades_memory": any(p.values["peak_bytes"] < fastest.values["peak_bytes"] for p in front)
        if "peak_bytes" in objectives
        else False,
    }
