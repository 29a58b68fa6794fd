"""The cost model against measurements: a set of patterns, each planned, every group timed
unfused and fused, the predicted saving compared with the measured one.

The acceptance it reports: the prediction within 30% of the measurement for each fused group
(``rel_error``), and no fusion accepted that measures slower (``wrong_accepts``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tritonkit.fusion.cost import CostParams
from tritonkit.fusion.planner import plan


class _BiasGelu(nn.Module):
    def forward(self, x, b):
        return F.gelu(x + b)


class _Swiglu(nn.Module):
    def forward(self, g, u):
        return F.silu(g) * u


class _GegluTanh(nn.Module):
    def forward(self, g, u):
        return F.gelu(g, approximate="tanh") * u


class _Chain4(nn.Module):
    def forward(self, x, y):
        return torch.relu(x * 2.0 + 1.0) * y


class _ScaleShiftTanh(nn.Module):
    def forward(self, x, w, b):
        return torch.tanh(x * w + b)


class _AddNorm(nn.Module):
    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, x, r):
        return self.norm(x + r)


class _LinearAct(nn.Module):
    def __init__(self, k: int, n: int, act: str) -> None:
        super().__init__()
        self.lin = nn.Linear(k, n)
        self.act = act

    def forward(self, x):
        y = self.lin(x)
        return F.gelu(y, approximate="tanh") if self.act == "gelu_tanh" else torch.relu(y)


class _LinearResidual(nn.Module):
    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.lin = nn.Linear(k, n, bias=False)

    def forward(self, x, r):
        return self.lin(x) + r


class _Single(nn.Module):
    def forward(self, x):
        return torch.relu(x)


class _Attention(nn.Module):
    def forward(self, q, kt, v):
        return torch.softmax(torch.matmul(q, kt) * 0.125, dim=-1) @ v


@dataclass(frozen=True)
class Pattern:
    name: str
    module: Callable[[int], nn.Module]  # of the scale
    inputs: Callable[[int, str, torch.dtype], tuple]  # (scale, device, dtype)


def _r(shape):
    return lambda s, dev, dt: torch.randn(*shape(s), device=dev, dtype=dt)


def _ins(*makers):
    def make(s, dev, dt):
        torch.manual_seed(0)
        return tuple(m(s, dev, dt) for m in makers)

    return make


def _rows(s):
    return (s, 4096)


def _vec(s):
    return (4096,)


def _small(s):
    return (4, 256)


def _k1024(s):
    return (s, 1024)


def _q(s):
    return (2, 8, s // 8, 64)


def _kt(s):
    return (2, 8, 64, s // 8)


ROWS2 = _ins(_r(_rows), _r(_rows))
PATTERNS: tuple[Pattern, ...] = (
    Pattern("bias+gelu", lambda s: _BiasGelu(), _ins(_r(_rows), _r(_vec))),
    Pattern("swiglu", lambda s: _Swiglu(), ROWS2),
    Pattern("geglu_tanh", lambda s: _GegluTanh(), ROWS2),
    Pattern("mul+add+relu+mul", lambda s: _Chain4(), ROWS2),
    Pattern("scale+shift+tanh", lambda s: _ScaleShiftTanh(), _ins(_r(_rows), _r(_vec), _r(_vec))),
    Pattern("residual+layernorm", lambda s: _AddNorm(nn.LayerNorm(4096)), ROWS2),
    Pattern("residual+rmsnorm", lambda s: _AddNorm(nn.RMSNorm(4096, eps=1e-6)), ROWS2),
    Pattern("linear+gelu_tanh", lambda s: _LinearAct(1024, 4096, "gelu_tanh"), _ins(_r(_k1024))),
    Pattern("linear+relu (K 4096)", lambda s: _LinearAct(4096, 4096, "relu"), _ins(_r(_rows))),
    Pattern("linear+residual", lambda s: _LinearResidual(4096, 4096), ROWS2),
    Pattern("small chain (launch-bound)", lambda s: _Chain4(), _ins(_r(_small), _r(_small))),
    Pattern("single relu", lambda s: _Single(), _ins(_r(_rows))),
    Pattern("attention (softmax(qk^T s) v)", lambda s: _Attention(), _ins(_r(_q), _r(_kt), _r(_q))),
)


def validate(device: str = "cuda", tiny: bool = False, params: CostParams | None = None) -> dict:
    """Plan and measure every pattern of ``PATTERNS``.

    Args:
        device: where to run ("cuda"; "cpu" only under the interpreter, timings meaningless).
        tiny: small sizes (8 rows instead of 8192) for a CPU smoke test.
        params: the cost model's rates; calibrated on the device when None on CUDA, the
            hardware profile's otherwise.

    Returns:
        ``{"params": ..., "rows": [...], "fused_within_30pct": k, "fused": n,
        "wrong_accepts": [...], "explain": [...]}``; each row names the pattern, the group,
        the decision, the predicted and measured savings (us) and their relative error.
    """
    if params is None:
        params = CostParams.calibrate(device) if device == "cuda" else CostParams.from_profile()
    scale = 8 if tiny else 8192
    dtype = torch.bfloat16
    rows, explains = [], []
    for p in PATTERNS:
        try:
            module = p.module(scale).to(device, dtype)
            inputs = p.inputs(scale, device, dtype)
            fp = plan(module, inputs, params).measure()
            explains.append(f"{p.name}\n{fp.explain()}")
            for e in fp.entries:
                meas, pred = e.measured_saving_us, e.estimate.saving_us
                rel = None if meas is None or meas == 0 else abs(pred - meas) / abs(meas)
                rows.append({
                    "pattern": p.name, "group": e.group.index, "kind": e.group.kind,
                    "maps_to": e.group.pattern, "fuse": e.fuse, "reason": e.reason,
                    "predicted_us": pred, "measured_us": meas, "rel_error": rel,
                    "unfused_us": e.unfused_us, "fused_us": e.fused_us,
                })  # fmt: skip
        except Exception as exc:  # one pattern failing must not hide the others
            rows.append({"pattern": p.name, "error": f"{type(exc).__name__}: {exc}"})
    fused = [r for r in rows if r.get("fuse")]
    ok = [r for r in fused if r["rel_error"] is not None and r["rel_error"] <= 0.3]
    wrong = [
        r["pattern"]
        for r in rows
        if r.get("fuse") and r.get("measured_us") is not None and r["measured_us"] < 0
    ]
    missed = [
        r["pattern"]
        for r in rows
        if r.get("fuse") is False and r.get("measured_us") is not None and r["measured_us"] > 0
    ]
    return {
        "params": params.__dict__,
        "rows": rows,
        "fused": len(fused),
        "fused_within_30pct": len(ok),
        "wrong_accepts": wrong,
        "declined_but_faster": missed,
        "explain": explains,
    }
