"""Scaling recipes: quantizers that keep state across calls (training steps).

- ``DynamicScaling``: every scale from the tensor being cast (its current amax).
- ``DelayedScaling``: TransformerEngine's delayed scaling. The tensor is cast in one pass with
  the scale of the steps before it, and the pass returns its amax; then, as TransformerEngine's
  ``amax_and_scale_update`` does: the amax goes to ``amax_history[0]``, the amax for the next
  scale is the history's max ("max") or that newest entry ("most_recent"), the history rolls
  by one (``new[i] = old[i + 1]``, the oldest slot zeroed for the next step), and
  ``scale = (fp8_max * 2**-margin) / amax`` where that amax is finite and positive (else the
  scale is kept); ``scale_inv = 1 / scale``. ``scale`` is the multiplier (x * scale is cast),
  ``scale_inv`` the dequantization scale (QuantizedTensor.scale).
- ``EMAScaling`` (seed 001's DynamicScaler): the amax's exponential moving average,
  ``ema = smoothing * ema + (1 - smoothing) * amax``, sets the next scale
  ``qmax / (ema * safety_margin)``; the first call scales dynamically and starts the average.
  ``PerChannelScaler`` keeps one per channel (last dimension), ``GroupScaler`` one per group of
  channels.

Every recipe watches its amax (``AmaxMonitor``): an amax over ``factor`` (10) times the mean of
the previous ``window`` (5) is flagged as an anomaly, on the device (no synchronization until
read). ``state_dict`` / ``load_state_dict`` save and restore all state.
"""

from __future__ import annotations

from typing import Any

import torch

from tritonkit.ops.quant.config import EPS, get_format
from tritonkit.ops.quant.function import call_quantize_with_scale
from tritonkit.ops.quant.plan import plan
from tritonkit.quant.tensor import QuantizedTensor, granularity_block, quantize

RECIPE_GRANULARITIES = ("tensor", "column", "channel_group")


class AmaxMonitor:
    """Flags an amax above ``factor`` times the mean of the ``window`` amaxes before it."""

    def __init__(self, window: int = 5, factor: float = 10.0) -> None:
        self.window, self.factor = window, factor
        self.recent: torch.Tensor | None = None  # the last ``window`` amaxes, oldest first
        self.count: torch.Tensor | None = None  # amaxes seen
        self.anomalies: torch.Tensor | None = None  # anomalies flagged
        self.last: torch.Tensor | None = None  # whether the last amax was one

    def observe(self, amax: torch.Tensor) -> None:
        """Record one amax (0-d float32 tensor); flags it without synchronizing."""
        if self.recent is None:
            dev = amax.device
            self.recent = torch.zeros(self.window, dtype=torch.float32, device=dev)
            self.count = torch.zeros((), dtype=torch.int64, device=dev)
            self.anomalies = torch.zeros((), dtype=torch.int64, device=dev)
        mean = self.recent.mean()
        self.last = (self.count >= self.window) & (amax > self.factor * mean)
        self.anomalies = self.anomalies + self.last
        self.recent = torch.cat([self.recent[1:], amax.reshape(1).float()])
        self.count = self.count + 1

    @property
    def anomaly(self) -> bool:
        """Whether the last amax was flagged (synchronizes)."""
        return bool(self.last) if self.last is not None else False

    def state_dict(self) -> dict[str, Any]:
        return {"recent": self.recent, "count": self.count, "anomalies": self.anomalies}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.recent, self.count, self.anomalies = (
            state["recent"],
            state["count"],
            state["anomalies"],
        )


def _recipe_block(shape: tuple[int, ...], granularity: str, group_size: int | None):
    if granularity == "channel_group":
        if not shape or not group_size or shape[-1] % group_size:
            raise ValueError(
                f"channel_group: group_size {group_size} must divide the last dimension of "
                f"shape {shape}"
            )
        return (*shape[:-1], group_size)
    return granularity_block(shape, granularity)


class Recipe:
    """A quantizer with state; ``recipe(x)`` quantizes x and updates the state."""

    def __init__(
        self,
        dtype: torch.dtype,
        granularity: str = "tensor",
        group_size: int | None = None,
        monitor: AmaxMonitor | None = None,
    ) -> None:
        self.dtype = dtype
        self.format = get_format(dtype)
        self.granularity = granularity
        self.group_size = group_size
        self.monitor = monitor if monitor is not None else AmaxMonitor()
        self.steps = 0

    def __call__(self, x: torch.Tensor) -> QuantizedTensor:
        return self.quantize(x)

    def quantize(self, x: torch.Tensor) -> QuantizedTensor:
        raise NotImplementedError

    def block(self, x: torch.Tensor) -> tuple[int, ...]:
        return _recipe_block(tuple(x.shape), self.granularity, self.group_size)

    def _observe(self, amax: torch.Tensor) -> None:
        self.steps += 1
        self.monitor.observe(amax.max() if amax.numel() else amax.new_zeros(()))

    @property
    def anomaly(self) -> bool:
        return self.monitor.anomaly

    def _state(self) -> dict[str, Any]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Every tensor of state, the step count and the monitor's state."""
        return {"steps": self.steps, "monitor": self.monitor.state_dict(), **self._state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state["steps"])
        self.monitor.load_state_dict(state["monitor"])
        for k, v in state.items():
            if k not in ("steps", "monitor"):
                setattr(self, k, v)

    def _cast_with(self, x: torch.Tensor, qscale: torch.Tensor, block) -> QuantizedTensor:
        """One pass: x cast with the multiplier ``qscale`` (the state), its amax returned."""
        fmt = self.format
        shape = tuple(x.shape)
        scale_shape = plan(shape, block).scale_shape
        data, _, scale, amax = call_quantize_with_scale(
            x, qscale.reshape(scale_shape), fmt.name, list(block), "qscale", True, "row"
        )
        return QuantizedTensor(data, scale, None, block, shape, x.dtype, fmt.name, amax)


class DynamicScaling(Recipe):
    """Scales from the tensor being cast (``quantize``'s dynamic path), amax watched.

    Args:
        dtype: torch.float8_e4m3fn, torch.float8_e5m2 or torch.int8.
        granularity: any of ``quantize``'s, or "channel_group" (``group_size`` channels share a
            scale over all rows).
        group_size: for "group" (along the last dimension) and "channel_group".
    """

    def __init__(self, dtype=torch.float8_e4m3fn, granularity="tensor", group_size=None, **kw):
        super().__init__(dtype, granularity, group_size, **kw)

    def block(self, x: torch.Tensor) -> tuple[int, ...]:
        if self.granularity == "group":
            return granularity_block(tuple(x.shape), "group", self.group_size, -1)
        return super().block(x)

    def quantize(self, x: torch.Tensor) -> QuantizedTensor:
        q = quantize(x, self.dtype, block=self.block(x), return_amax=True)
        self._observe(q.amax)
        return q


class DelayedScaling(Recipe):
    """TransformerEngine's DelayedScaling (see the module docstring).

    Args:
        dtype: the FP8 (or int8) format; its largest value is ``fp8_max``.
        amax_history_len: entries of amax history (TransformerEngine's default 1024).
        amax_compute_algo: "max" (of the history) or "most_recent".
        margin: the scale is divided by 2**margin.
        granularity: "tensor" (TransformerEngine's), "column" (one history per channel) or
            "channel_group".
    """

    def __init__(
        self,
        dtype: torch.dtype = torch.float8_e4m3fn,
        amax_history_len: int = 1024,
        amax_compute_algo: str = "max",
        margin: float = 0.0,
        granularity: str = "tensor",
        group_size: int | None = None,
        **kw,
    ) -> None:
        if amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(
                f"DelayedScaling: amax_compute_algo must be 'max' or 'most_recent', "
                f"got {amax_compute_algo!r}"
            )
        if amax_history_len < 1:
            raise ValueError(
                f"DelayedScaling: amax_history_len must be >= 1, got {amax_history_len}"
            )
        _check_recipe_granularity("DelayedScaling", granularity)
        super().__init__(dtype, granularity, group_size, **kw)
        self.amax_history_len = amax_history_len
        self.amax_compute_algo = amax_compute_algo
        self.margin = margin
        self.amax_history: torch.Tensor | None = None  # (amax_history_len, n_scales)
        self.scale: torch.Tensor | None = None  # (n_scales,) multiplier
        self.scale_inv: torch.Tensor | None = None

    def _init_state(self, n: int, device: torch.device) -> None:
        self.amax_history = torch.zeros(self.amax_history_len, n, device=device)
        self.scale = torch.ones(n, device=device)
        self.scale_inv = torch.ones(n, device=device)

    def quantize(self, x: torch.Tensor) -> QuantizedTensor:
        block = self.block(x)
        if self.scale is None:
            self._init_state(_n_scales(x, block), x.device)
        q = self._cast_with(x, self.scale, block)
        self.update(q.amax.reshape(-1))
        self._observe(q.amax)
        return q

    def update(self, amax: torch.Tensor) -> None:
        """TransformerEngine's amax_and_scale_update after a cast whose amax is ``amax``."""
        history = torch.cat([amax.reshape(1, -1).float(), self.amax_history[1:]])
        use = history.amax(dim=0) if self.amax_compute_algo == "max" else history[0]
        rolled = torch.roll(history, -1, 0)
        rolled[0] = 0.0
        self.amax_history = rolled
        scaled_max = torch.tensor(self.format.qmax, dtype=torch.float32) * (2.0**-self.margin)
        scale = scaled_max.to(use.device) / use
        self.scale = torch.where(torch.isfinite(use) & (use > 0), scale, self.scale)
        self.scale_inv = 1.0 / self.scale

    def _state(self) -> dict[str, Any]:
        return {"amax_history": self.amax_history, "scale": self.scale, "scale_inv": self.scale_inv}


class EMAScaling(Recipe):
    """Scales from an exponential moving average of the amax (seed 001's DynamicScaler).

    Args:
        dtype: the format.
        granularity: "tensor", "column" (per channel) or "channel_group".
        group_size: channels per group ("channel_group").
        smoothing: weight of the average's past (0.99).
        safety_margin: the scale leaves this factor of headroom over the average (1.2).
    """

    def __init__(
        self,
        dtype: torch.dtype = torch.float8_e4m3fn,
        granularity: str = "tensor",
        group_size: int | None = None,
        smoothing: float = 0.99,
        safety_margin: float = 1.2,
        **kw,
    ) -> None:
        _check_recipe_granularity("EMAScaling", granularity)
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"EMAScaling: smoothing must be in [0, 1), got {smoothing}")
        if safety_margin <= 0:
            raise ValueError(f"EMAScaling: safety_margin must be > 0, got {safety_margin}")
        super().__init__(dtype, granularity, group_size, **kw)
        self.smoothing = smoothing
        self.safety_margin = safety_margin
        self.ema_amax: torch.Tensor | None = None
        self.qscale: torch.Tensor | None = None

    def quantize(self, x: torch.Tensor) -> QuantizedTensor:
        block = self.block(x)
        if self.ema_amax is None:
            q = quantize(x, self.dtype, block=block, return_amax=True)
            self.ema_amax = q.amax.reshape(-1).clone()
        else:
            q = self._cast_with(x, self.qscale, block)
            s = self.smoothing
            self.ema_amax = s * self.ema_amax + (1 - s) * q.amax.reshape(-1)
        self.qscale = self.format.qmax / (torch.clamp(self.ema_amax, min=EPS) * self.safety_margin)
        self._observe(q.amax)
        return q

    def _state(self) -> dict[str, Any]:
        return {"ema_amax": self.ema_amax, "qscale": self.qscale}


class PerChannelScaler(EMAScaling):
    """EMAScaling with one average per channel (the last dimension)."""

    def __init__(self, dtype: torch.dtype = torch.float8_e4m3fn, **kw) -> None:
        super().__init__(dtype, "column", **kw)


class GroupScaler(EMAScaling):
    """EMAScaling with one average per group of ``group_size`` channels."""

    def __init__(self, dtype: torch.dtype = torch.float8_e4m3fn, group_size: int = 16, **kw):
        super().__init__(dtype, "channel_group", group_size, **kw)


def _check_recipe_granularity(name: str, granularity: str) -> None:
    if granularity not in RECIPE_GRANULARITIES:
        raise ValueError(
            f"{name}: granularity must be one of {list(RECIPE_GRANULARITIES)} (scales shared "
            f"across rows, so that they carry over to the next step), got {granularity!r}"
        )


def _n_scales(x: torch.Tensor, block: tuple[int, ...]) -> int:
    n = 1
    for s, b in zip(x.shape, block):
        n *= s // b if b else 1
    return n


__all__ = [
    "AmaxMonitor",
    "DelayedScaling",
    "DynamicScaling",
    "EMAScaling",
    "GroupScaler",
    "PerChannelScaler",
    "Recipe",
]
