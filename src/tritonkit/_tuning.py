"""Persistent autotuning: a kernel's best launch config, found once per machine and kept on disk.

``tune(kernel, key, candidates, run)`` returns the best of ``candidates`` for ``key`` (the
shape class and dtypes a config depends on). The first call on a machine times every
candidate the active hardware profile allows (``prune``) and stores the winner; every later
call, in this process or another, finds it in the cache and times nothing.

The cache is one JSON file per (GPU, Triton version) under ``~/.cache/tritonkit/`` (or
``$TRITONKIT_CACHE_DIR``). Writers take a file lock, merge with what is on disk and replace
the file atomically, so processes tuning at once lose nothing and readers never see half a
file. A corrupt or foreign file is ignored with a warning and rewritten, never a crash.
Under the CPU interpreter nothing is timed: the first candidate (the heuristic default) is used.

Shipped tables: configs tuned on the GPUs the project measures ship inside the package as data,
``tuned/<gpu>/<family>.json`` (written by ``tritonkit tune --ship``, with the Triton version they
were tuned with), so that on such a GPU a first call times nothing. Where a config comes from,
by ``TRITONKIT_AUTOTUNE``:

- unset (``auto``): this machine's cache, then the shipped table; on a GPU with shipped tables a
  key they lack takes the heuristic default, on any other GPU the candidates are timed;
- ``1``: this machine's cache, else timed here (shipped tables ignored);
- ``0``: the shipped table, else the heuristic default; never timed, no cache read.

A shipped config is used only if it is one of the candidates the launcher offers (and fits the
device), so a table from an older kernel whose tuning space changed is ignored, not launched.
A search stops timing new candidates once it has run ``TRITONKIT_AUTOTUNE_BUDGET`` seconds
(default 10) per kernel and key; ``tritonkit tune`` searches without a bound.

This module is a leaf: ops' launchers call it; the harness drives it (``tritonkit tune``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = 1
CACHE_ENV = "TRITONKIT_CACHE_DIR"
AUTOTUNE_ENV = "TRITONKIT_AUTOTUNE"  # "0": never time, use the heuristic default
FORCE_ENV = "TRITONKIT_AUTOTUNE_FORCE"  # "1": time again even on a cache hit (tritonkit tune)
BUDGET_ENV = "TRITONKIT_AUTOTUNE_BUDGET"  # seconds of timing per kernel and key ("inf": none)
DEFAULT_BUDGET_S = 10.0
SHIPPED_DIR = Path(__file__).parent / "tuned"


@dataclass(frozen=True)
class Config:
    """One launch config: constexpr kernel parameters plus warps and pipeline stages."""

    params: Mapping[str, int] = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 2

    def __hash__(self) -> int:
        return hash((tuple(sorted(self.params.items())), self.num_warps, self.num_stages))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and self.to_dict() == other.to_dict()

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": dict(self.params),
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Config:
        return Config(dict(d["params"]), int(d["num_warps"]), int(d["num_stages"]))

    def __str__(self) -> str:
        p = " ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{p} warps={self.num_warps} stages={self.num_stages}"


@dataclass
class Tuning:
    """One search: what was timed and what won."""

    kernel: str
    key: Mapping[str, Any]
    best: Config
    tried: list[tuple[Config, float | None]]
    seconds: float


@dataclass
class Stats:
    """What the cache did in this process (tests, reports and `tritonkit tune` read it)."""

    hits: int = 0
    shipped: int = 0  # configs taken from a shipped table
    tunings: int = 0
    timed_configs: int = 0
    log: list[Tuning] = field(default_factory=list)


STATS = Stats()


class _Warmup:
    """The ``tritonkit.warmup`` session that every launch of the process goes to while it
    runs (``_warmup.py``), or None. Not per thread: a warmed backward runs on autograd's
    threads. Here, below the launch path, because tuning reads it too."""

    session: Any = None


WARMUP = _Warmup()


def enabled() -> bool:
    if os.environ.get(AUTOTUNE_ENV, "1") == "0":
        return False
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return False
    import torch

    return torch.cuda.is_available()


def consulted() -> bool:
    """Whether launchers ask ``tune`` at all: on a GPU, not under the interpreter (where the
    heuristic default is used as is). Whether it may time is ``enabled``."""
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return False
    import torch

    return torch.cuda.is_available()


def mode() -> str:
    """``auto``, ``1`` (tune here) or ``0`` (never time), from TRITONKIT_AUTOTUNE."""
    value = os.environ.get(AUTOTUNE_ENV, "auto").strip().lower()
    return value if value in ("0", "1") else "auto"


def budget_seconds() -> float:
    """Seconds one search may spend timing (BUDGET_ENV; unbounded under a forced retune)."""
    text = os.environ.get(BUDGET_ENV)
    if text is None:
        return float("inf") if os.environ.get(FORCE_ENV) == "1" else DEFAULT_BUDGET_S
    try:
        return max(float(text), 0.0)
    except ValueError:
        warnings.warn(f"tritonkit: {BUDGET_ENV}={text!r} is not a number; using 10", stacklevel=2)
        return DEFAULT_BUDGET_S


def cache_dir() -> Path:
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tritonkit"


def _machine() -> tuple[str, str]:
    import torch
    import triton

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return gpu, triton.__version__


def _slug(text: str) -> str:
    return "-".join("".join(c if c.isalnum() or c == "." else " " for c in text.lower()).split())


def cache_path(machine: tuple[str, str] | None = None) -> Path:
    gpu, triton_version = machine or _machine()
    return cache_dir() / f"autotune-{_slug(gpu)}-triton{_slug(triton_version)}.json"


def _entry_key(kernel: str, key: Mapping[str, Any]) -> str:
    # The profile's name is part of the key: a simulated machine (--profile) prunes configs
    # differently, and its winners must not stand in for the real machine's.
    from tritonkit import _hardware

    profile = _hardware.active()
    full = {**dict(key), "profile": profile.name if profile else None}
    return kernel + "|" + json.dumps(full, sort_keys=True, default=str)


def _read(path: Path, machine: tuple[str, str]) -> dict[str, Any]:
    """Entries of a cache file; anything unreadable or from another machine counts as empty."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        warnings.warn(
            f"tritonkit: cannot read autotune cache {path} ({exc}); ignoring it", stacklevel=3
        )
        return {}
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        warnings.warn(f"tritonkit: autotune cache {path} is corrupt; ignoring it", stacklevel=3)
        return {}
    if (
        not isinstance(doc, dict)
        or doc.get("schema") != SCHEMA
        or [doc.get("gpu"), doc.get("triton")] != list(machine)
        or not isinstance(doc.get("entries"), dict)
    ):
        warnings.warn(
            f"tritonkit: autotune cache {path} is not for this machine ({machine[0]}, triton "
            f"{machine[1]}) or this version of tritonkit; ignoring it",
            stacklevel=3,
        )
        return {}
    return doc["entries"]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = path.with_suffix(path.suffix + ".lock")
    with open(lock_path, "a+") as lock:
        try:
            import fcntl

            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        except ImportError:  # no fcntl (Windows): the atomic replace still keeps files whole
            pass
        yield


_memory: dict[Path, dict[str, Any]] = {}
_shipped: dict[str, dict[str, Any]] = {}  # GPU slug -> entries of its shipped tables


def shipped_dir(gpu: str) -> Path:
    return SHIPPED_DIR / _slug(gpu)


def read_shipped(path: Path) -> dict[str, Any]:
    """One shipped table: its document, or ValueError saying what is wrong with it."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"shipped table {path}: {exc}") from None
    need = {"schema": int, "gpu": str, "triton": str, "family": str, "entries": dict}
    for name, kind in need.items():
        if not isinstance(doc.get(name), kind):
            raise ValueError(f"shipped table {path}: {name!r} missing or not a {kind.__name__}")
    if doc["schema"] != SCHEMA:
        raise ValueError(f"shipped table {path}: schema {doc['schema']}, expected {SCHEMA}")
    for entry_key, entry in doc["entries"].items():
        try:
            Config.from_dict(entry["config"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"shipped table {path}: bad config for {entry_key!r}") from None
    return doc


def shipped_entries(gpu: str) -> dict[str, Any]:
    """Every shipped entry for this GPU (all families), read once per process."""
    slug = _slug(gpu)
    if slug not in _shipped:
        entries: dict[str, Any] = {}
        for path in sorted(shipped_dir(gpu).glob("*.json")):
            try:
                doc = read_shipped(path)
            except ValueError as exc:
                warnings.warn(f"tritonkit: {exc}; ignoring it", stacklevel=3)
                continue
            if _slug(doc["gpu"]) == slug:
                entries.update(doc["entries"])
        _shipped[slug] = entries
    return _shipped[slug]


def has_shipped_table(machine: tuple[str, str] | None = None) -> bool:
    gpu = (machine or _machine())[0]
    return bool(shipped_entries(gpu))


def shipped_lookup(kernel: str, key: Mapping[str, Any], machine: tuple[str, str] | None = None):
    """The shipped config for (kernel, key) on this GPU, or None."""
    gpu = (machine or _machine())[0]
    entry = shipped_entries(gpu).get(_entry_key(kernel, key))
    return Config.from_dict(entry["config"]) if entry is not None else None


def write_shipped(
    family: str, tunings: Sequence[Tuning], machine: tuple[str, str] | None = None
) -> Path:
    """Merge tuned winners into this GPU's shipped table of ``family`` (``tritonkit tune
    --ship``); entries of other keys already there are kept."""
    machine = machine or _machine()
    path = shipped_dir(machine[0]) / f"{family}.json"
    entries: dict[str, Any] = {}
    if path.exists():
        with contextlib.suppress(ValueError):
            entries = read_shipped(path)["entries"]
    for t in tunings:
        entries[_entry_key(t.kernel, t.key)] = {"config": t.best.to_dict()}
    doc = {
        "schema": SCHEMA,
        "gpu": machine[0],
        "triton": machine[1],
        "family": family,
        "tuned": time.strftime("%Y-%m-%d"),
        "entries": dict(sorted(entries.items())),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    _shipped.pop(_slug(machine[0]), None)
    return path


def lookup(kernel: str, key: Mapping[str, Any], machine: tuple[str, str] | None = None):
    """The cached best config for (kernel, key), or None."""
    machine = machine or _machine()
    path = cache_path(machine)
    entries = _memory.get(path)
    entry_key = _entry_key(kernel, key)
    if entries is None or entry_key not in entries:
        entries = _read(path, machine)
        _memory[path] = entries
    entry = entries.get(entry_key)
    if entry is None:
        return None
    try:
        return Config.from_dict(entry["config"])
    except (KeyError, TypeError, ValueError):
        warnings.warn(f"tritonkit: bad autotune cache entry for {kernel}; retuning", stacklevel=2)
        return None


def store(
    kernel: str,
    key: Mapping[str, Any],
    best: Config,
    tried: Sequence[tuple[Config, float | None]],
    machine: tuple[str, str] | None = None,
) -> None:
    """Merge one result into the cache file under a lock; write atomically."""
    machine = machine or _machine()
    path = cache_path(machine)
    with _locked(path):
        entries = _read(path, machine)
        entries[_entry_key(kernel, key)] = {
            "config": best.to_dict(),
            "tried": [[c.to_dict(), ms] for c, ms in tried],
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        doc = {"schema": SCHEMA, "gpu": machine[0], "triton": machine[1], "entries": entries}
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _memory[path] = entries


def _time_config(run: Callable[[Config], Any], config: Config) -> float | None:
    """Median ms of ``run(config)``, or None if the config fails (out of resources, say)."""
    import triton.testing

    try:
        return float(
            triton.testing.do_bench(lambda: run(config), warmup=10, rep=40, return_mode="median")
        )
    except Exception:  # a config that cannot compile or launch is not a candidate
        return None


class _Searching(threading.local):
    on = False


_SEARCHING = _Searching()


def searching() -> bool:
    """Whether this thread is timing candidate configs now: a replay recording that sees
    launches or allocations while it is must not keep them (they are the tuner's, not the
    call's)."""
    return _SEARCHING.on


def search(
    candidates: Sequence[Config],
    run: Callable[[Config], Any],
    neighbours: Callable[[Config], Sequence[Config]] | None = None,
    prune: Callable[[Config], bool] | None = None,
    timer: Callable[[Callable[[Config], Any], Config], float | None] | None = None,
    budget: float = float("inf"),
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[Config, list[tuple[Config, float | None]]]:
    """Time the candidates; with ``neighbours``, then walk from the best to better neighbours.

    A coarse grid followed by hill climbing over neighbours (hierarchical search) times far
    fewer configs than the full grid in a large space. Once ``budget`` seconds have passed and
    one config ran, no new one is timed (candidates come best-guess first). Returns (best,
    every config tried).
    """
    was, _SEARCHING.on = _SEARCHING.on, True
    try:
        return _search(candidates, run, neighbours, prune, timer or _time_config, budget, clock)
    finally:
        _SEARCHING.on = was


def _search(candidates, run, neighbours, prune, timer, budget, clock):
    allowed = [c for c in candidates if prune is None or prune(c)]
    if not allowed:
        raise ValueError("autotune: every candidate config was pruned by the hardware profile")
    tried: dict[Config, float | None] = {}
    t0 = clock()

    def out_of_time() -> bool:
        return clock() - t0 > budget and any(ms is not None for ms in tried.values())

    for c in allowed:
        if out_of_time():
            break
        tried[c] = timer(run, c)
    if neighbours is not None and not out_of_time():
        while True:
            best = min((c for c in tried if tried[c] is not None), key=tried.get, default=None)
            if best is None:
                break
            fresh = [n for n in neighbours(best) if n not in tried and (prune is None or prune(n))]
            if not fresh:
                break
            for n in fresh:
                if out_of_time():
                    break
                tried[n] = timer(run, n)
            if out_of_time():
                break
            if (
                min((tried[n] for n in fresh if tried[n] is not None), default=float("inf"))
                >= tried[best]
            ):
                break
    timed = [(c, ms) for c, ms in tried.items() if ms is not None]
    if not timed:
        raise RuntimeError("autotune: no candidate config could run")
    best = min(timed, key=lambda p: p[1])[0]
    return best, list(tried.items())


def tune(
    kernel: str,
    key: Mapping[str, Any],
    candidates: Sequence[Config],
    run: Callable[[Config], Any],
    *,
    neighbours: Callable[[Config], Sequence[Config]] | None = None,
    prune: Callable[[Config], bool] | None = None,
) -> Config:
    """The best config for ``key``: from this machine's cache, a shipped table, or found now
    (and cached), as the module's docstring says.

    ``candidates[0]`` is the heuristic default, used without timing when nothing is timed.
    ``run(config)`` launches the kernel once with ``config`` on representative inputs.
    """
    if not candidates:
        raise ValueError("autotune: no candidate configs")
    if not consulted():
        return candidates[0]
    setting, forced = mode(), os.environ.get(FORCE_ENV) == "1"
    if setting != "0" and not forced:
        cached = lookup(kernel, key)
        if cached is not None:
            STATS.hits += 1
            return cached
    if setting != "1" and not forced:
        shipped = shipped_lookup(kernel, key)
        if shipped is not None and shipped in candidates and (prune is None or prune(shipped)):
            STATS.shipped += 1
            return shipped
        if setting == "0" or has_shipped_table():
            return candidates[0]
    if not enabled():
        return candidates[0]
    if WARMUP.session is not None:  # tritonkit.warmup: compile every candidate, time none
        for c in candidates:
            if prune is None or prune(c):
                with contextlib.suppress(Exception):
                    run(c)
        return candidates[0]
    t0 = time.perf_counter()
    best, tried = search(
        candidates, run, neighbours=neighbours, prune=prune, budget=budget_seconds()
    )
    STATS.tunings += 1
    STATS.timed_configs += len(tried)
    STATS.log.append(Tuning(kernel, dict(key), best, tried, time.perf_counter() - t0))
    store(kernel, key, best, tried)
    return best


def fits_shared_memory(bytes_needed: int) -> bool:
    """Whether a block using ``bytes_needed`` of shared memory fits the active profile."""
    from tritonkit import _hardware

    profile = _hardware.active()
    if profile is None:
        return True
    return bytes_needed <= profile.smem_per_block_kb * 1024


def replace(config: Config, **params: int) -> Config:
    """A copy of ``config`` with some params (or num_warps / num_stages) changed."""
    fields = {k: params.pop(k) for k in ("num_warps", "num_stages") if k in params}
    return dataclasses.replace(config, params={**config.params, **params}, **fields)
