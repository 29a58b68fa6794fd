"""The plan layer: what a call depends on, and the one cache of what was decided for it.

A tritonkit call is decided by two things:

- ``meta``: what its arguments say (shapes, strides, dtypes, devices, 16-byte alignment, which
  tensors require gradients, the non-tensor arguments), and
- ``env``: everything outside the arguments that changes the kernel or the answer, read once
  per call into an :class:`Env` (TF32 and reduced-precision flags, deterministic mode, the
  autocast state, the tuning setting, the device and its hardware profile).

A family's ``plan(meta, env)`` is pure: it validates, picks configs, grids and allocations for
the forward and the backward, and returns a Plan. :data:`PLANS` is the one cache of Plans,
keyed by ``(what, meta, env)``; the Python path and replay (``replay.py``) both take their Plan
from it, so a fast path can never run a decision that the Python path would not make for the
same key. Whoever may still run a Plan (an autograd node waiting for its backward) holds a
reference to it: ``PLANS.reset()`` or an eviction forgets the entry, never frees what a pending
backward needs.

Private PyTorch interfaces are read through ``internals.py``, the one place that names them.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Any, NamedTuple, TypeVar

import torch

from tritonkit import _hardware
from tritonkit._tuning import AUTOTUNE_ENV, BUDGET_ENV, CACHE_ENV, FORCE_ENV
from tritonkit.ops._core import internals

T = TypeVar("T")


_tf32 = internals.cublas_allow_tf32
_fp16_reduced = internals.cublas_allow_fp16_reduced
_bf16_reduced = internals.cublas_allow_bf16_reduced
_cudnn_tf32 = internals.cudnn_allow_tf32
_any_autocast = internals.any_autocast
_precision = torch.get_float32_matmul_precision
_deterministic = torch.are_deterministic_algorithms_enabled
_autocast_on = torch.is_autocast_enabled
_autocast_dtype = torch.get_autocast_dtype


class Env(NamedTuple):
    """Everything outside a call's arguments that changes its kernel or its answer."""

    tf32: bool  # float32 matrix products may use TF32 (either PyTorch spelling of it)
    cudnn_tf32: bool
    fp16_reduced: bool  # cuBLAS's reduced-precision reductions for fp16 / bf16 products
    bf16_reduced: bool
    deterministic: bool
    autocast: tuple  # (device type, dtype) for each device type autocast is on for
    autotune: str  # "off", "auto", "here" or "force", with the search budget (see _autotune)
    tuning_cache: str | None  # TRITONKIT_CACHE_DIR: where tuned choices are looked up
    device: int  # the current CUDA device (-1 without CUDA)
    profile: str | None  # the hardware profile's name (tritonkit --profile simulates others)


_cuda_device = internals.cuda_device if torch.cuda.is_available() else (lambda: -1)


def _profile_name() -> str | None:
    profile = _hardware.active()
    return profile.name if profile is not None else None


# Triton reads TRITON_INTERPRET when a kernel is decorated, at import: fixed for the process.
_INTERPRETING = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
_environ = internals.environ_get
_new_env = tuple.__new__
_compiling = torch.compiler.is_compiling


def _autotune() -> str:
    """The tuning setting: "force" (tritonkit tune: decide again at every call), "off" (never
    time), "here" (tune on this machine even where a table ships), or "auto" (the machine's
    cache, then the shipped table, then a bounded search), with the search's time budget."""
    if _environ(FORCE_ENV) == "1":
        return "force"
    mode = _environ(AUTOTUNE_ENV)
    if _INTERPRETING or mode == "0":
        return "off"
    budget = _environ(BUDGET_ENV)
    return ("here" if mode == "1" else "auto") + ("" if budget is None else f":{budget}")


def current_env() -> Env:
    """The snapshot for a call: read once per call, part of every key."""
    autocast = ()
    if _any_autocast():  # one C call in the usual case, autocast off everywhere
        if _autocast_on("cuda"):
            autocast = ("cuda", _autocast_dtype("cuda"))
        if _autocast_on("cpu"):
            autocast += ("cpu", _autocast_dtype("cpu"))
    return _new_env(  # tuple.__new__: a third of the NamedTuple constructor's cost
        Env,
        (
            _tf32() or _precision() != "highest",
            _cudnn_tf32(),
            _fp16_reduced(),
            _bf16_reduced(),
            _deterministic(),
            autocast,
            _autotune(),
            _environ(CACHE_ENV),
            _cuda_device(),
            _profile_name(),
        ),
    )


class PlanCache:
    """The one cache of plans, keyed by ``(what, meta, env)``; least recently built first out.

    ``get`` builds a missing plan outside the lock (building compiles and may tune: a thread
    must not wait for another's compile of an unrelated key) and keeps the first plan stored
    for a key, so two threads racing on one key end with one plan. Entries are evicted when
    ``limit`` are held: a model calls a few shapes, a shape sweep must not grow it forever.
    """

    def __init__(self, limit: int = 8192) -> None:
        self.limit = limit
        self._plans: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, env: Env | None, build: Callable[[], T]) -> T:
        if _compiling():  # torch.compile traces the decision itself, once per graph
            return build()
        full = (key, env)
        plan = self._plans.get(full)
        if plan is not None:
            return plan
        plan = build()
        with self._lock:
            kept = self._plans.setdefault(full, plan)
            if len(self._plans) > self.limit:
                self._plans.popitem(last=False)
        return kept

    def peek(self, key: Hashable, env: Env | None) -> Any:
        return self._plans.get((key, env))

    def put(self, key: Hashable, env: Env | None, plan: Any) -> None:
        with self._lock:
            self._plans[(key, env)] = plan
            if len(self._plans) > self.limit:
                self._plans.popitem(last=False)

    def discard(self, key: Hashable, env: Env | None) -> None:
        """Forget one entry, if held: one dict operation, atomic under the GIL and taken
        without the lock, so that a weakref callback (which may run while this thread holds
        the lock) can call it."""
        self._plans.pop((key, env), None)

    def __len__(self) -> int:
        return len(self._plans)

    def items(self) -> list[tuple[Hashable, Any]]:
        with self._lock:
            return list(self._plans.items())

    def reset(self) -> None:
        """Forget every plan (tests; a changed setting). Plans in use stay alive with their
        users: an autograd node keeps its own reference."""
        with self._lock:
            self._plans.clear()

    @contextlib.contextmanager
    def isolated(self) -> Iterator[None]:
        """Within it the cache starts empty, and what is decided there is forgotten at the end
        (``tritonkit.warmup``: its calls launch nothing and tune nothing, so none of their
        plans may serve a real call); the plans from before are back afterwards."""
        with self._lock:
            saved, self._plans = self._plans, OrderedDict()
        try:
            yield
        finally:
            with self._lock:
                self._plans = saved


PLANS = PlanCache()


def arg_facts(*args: Any) -> tuple | None:
    """What argument validation reads of a call, as a key for the cache of calls validated
    before (a public function validates a call only when its key is new): each tensor's type,
    shape, dtype and device, each other value with its type (and a tuple's items' types, so
    that True and 1 differ). None where no such key holds: while torch.compile traces (a
    dict of tensors' facts is not something to trace) or for an unhashable value (a list).
    Validation depends on nothing else, so a call with a known key is a valid call."""
    if torch.compiler.is_compiling():
        return None
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append((type(a), a.shape, a.dtype, a.device))
        elif isinstance(a, tuple):
            out.append((tuple, a, tuple(map(type, a))))
        else:
            out.append((type(a), a))
    key = tuple(out)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def validated(op: str, facts: Hashable | None, validate: Callable[[], T]) -> T:
    """``validate()``'s verdict on a call whose argument facts are ``facts`` (what validation
    reads: ``arg_facts``), from the one cache; None facts (an unhashable argument, a
    trace) validate every time. Validation raises on a bad call, so only verdicts are kept."""
    if facts is None:
        return validate()
    return PLANS.get(("validated", op, facts), None, validate)


def cached(what: str, key: Hashable, build: Callable[[], T]) -> T:
    """``build()``'s plan for ``key`` under the current Env, from the one cache: the Python
    path's lookup (``what`` names the decision: "norm.forward", "matmul.config", ...). While a
    retune is forced (``tritonkit tune``), nothing is kept: every call decides again."""
    if _compiling():
        return build()
    env = current_env()
    if env.autotune == "force":
        return build()
    return PLANS.get((what, key), env, build)
