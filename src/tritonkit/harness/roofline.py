"""The roofline: how close a measured time is to what the hardware allows.

For an operator that must do F FLOPs and move B bytes on a machine with peak P FLOP/s and
bandwidth W bytes/s, no implementation beats max(F / P, B / W). That floor over the measured
time is the percentage of the roofline; whichever term is larger names the bottleneck.
Arithmetic intensity I = F / B; the attainable rate is min(P, I * W).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from tritonkit._hardware import Profile


@dataclass(frozen=True)
class RooflinePoint:
    intensity: float  # FLOP per byte
    achieved_GBps: float | None
    achieved_TFLOPs: float | None
    bound_TFLOPs: float | None  # min(peak, intensity * bandwidth)
    floor_ms: float  # max(flops / peak, bytes / bandwidth)
    pct_of_roofline: float  # 100 * floor_ms / measured ms
    bottleneck: str  # "memory" or "compute"
    peak_key: str  # which rate of the profile was the compute ceiling

    def as_dict(self) -> dict:
        return asdict(self)


def place(
    flops: float,
    nbytes: float,
    ms: float,
    bandwidth_GBps: float,
    peak_TFLOPs: float | None,
    peak_key: str = "",
) -> RooflinePoint:
    """Place one measurement on the roofline of a machine (bandwidth, peak)."""
    if ms <= 0:
        raise ValueError(f"roofline: time must be positive, got {ms}")
    if bandwidth_GBps <= 0:
        raise ValueError(f"roofline: bandwidth must be positive, got {bandwidth_GBps}")
    seconds = ms * 1e-3
    memory_s = nbytes / (bandwidth_GBps * 1e9)
    compute_s = flops / (peak_TFLOPs * 1e12) if (flops and peak_TFLOPs) else 0.0
    floor_s = max(memory_s, compute_s)
    intensity = flops / nbytes if nbytes else float("inf")
    bound = None
    if peak_TFLOPs:
        bound = min(peak_TFLOPs, intensity * bandwidth_GBps * 1e9 / 1e12)
    return RooflinePoint(
        intensity=intensity,
        achieved_GBps=nbytes / seconds / 1e9 if nbytes else None,
        achieved_TFLOPs=flops / seconds / 1e12 if flops else None,
        bound_TFLOPs=bound,
        floor_ms=floor_s * 1e3,
        pct_of_roofline=100.0 * floor_s / seconds,
        bottleneck="compute" if compute_s > memory_s else "memory",
        peak_key=peak_key,
    )


_TENSOR_KEYS = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.int8: "int8",
}


def peak_key(compute: str, dtype: torch.dtype) -> str:
    """Which rate bounds an operator: vector fp32 math, or the tensor cores for its dtype."""
    if compute != "tensor":
        return "fp32"
    if dtype == torch.float32:
        return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"
    if "float8" in str(dtype):
        return "fp8"
    return _TENSOR_KEYS.get(dtype, "fp32")


def place_on(profile: Profile, flops: float, nbytes: float, ms: float, key: str) -> RooflinePoint:
    return place(flops, nbytes, ms, profile.dram_GBps, profile.peak(key), key)
