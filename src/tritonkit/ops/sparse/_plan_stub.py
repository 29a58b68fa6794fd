"""Stand-in for ``tritonkit.ops._core.plan`` (Env, current_env, tensor_meta, PLANS) until the
plan layer lands on this branch; deleted at the merge, when the imports point at the real one."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple, TypeVar

import torch

from tritonkit import _hardware

T = TypeVar("T")


class Env(NamedTuple):
    tf32: bool
    deterministic: bool
    autocast: tuple
    autotune: bool
    device: int
    profile: str | None


def current_env(device_type: str = "cuda") -> Env:
    autocast = ()
    if torch.is_autocast_enabled(device_type):
        autocast = (device_type, torch.get_autocast_dtype(device_type))
    interp = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
    profile = _hardware.active()
    return Env(
        torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest",
        torch.are_deterministic_algorithms_enabled(),
        autocast,
        os.environ.get("TRITONKIT_AUTOTUNE", "1") != "0" and not interp,
        torch.cuda.current_device() if torch.cuda.is_available() else -1,
        profile.name if profile is not None else None,
    )


def tensor_meta(t: torch.Tensor) -> tuple:
    return (t.shape, t.stride(), t.dtype, t.device, t.requires_grad, t.data_ptr() & 255)


class PlanCache:
    def __init__(self, limit: int = 8192) -> None:
        self.limit = limit
        self._plans: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, env: Env | None, build: Callable[[], T]) -> T:
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


PLANS = PlanCache()
