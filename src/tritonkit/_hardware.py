"""Hardware profiles: what an accelerator offers, for tuning and the roofline to reason about.

A profile holds the limits a kernel's launch config must respect (shared memory, registers,
threads, warp width) and the peak rates the roofline measures against (DRAM bandwidth, matrix
and vector throughput per dtype). The table below is from vendor datasheets (dense rates, no
sparsity); ``tritonkit doctor --measure`` replaces the rates with measured ones. A profile can
be loaded from JSON (a chip not in the table) and scaled (``bandwidth x 0.7``) to see how
tuning and the roofline respond to a different machine.

This module is a leaf: the ops' launchers consult the active profile to prune configs.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROFILE_ENV = "TRITONKIT_PROFILE"  # path to a profile JSON that replaces the detected one


@dataclass(frozen=True)
class Profile:
    """One accelerator. Rates are dense peaks in TFLOP/s (TOP/s for int8); bandwidth in GB/s."""

    name: str
    vendor: str  # "nvidia" or "amd"
    compute_units: int  # SMs or CUs
    smem_per_block_kb: float  # largest shared memory (LDS) one block can use
    smem_per_unit_kb: float  # per SM/CU
    registers_per_unit: int  # 32-bit registers per SM/CU
    max_threads_per_block: int
    warp_size: int  # 32 (NVIDIA warp) or 64 (AMD wavefront)
    dram_GBps: float
    tflops: dict[str, float] = field(default_factory=dict)  # fp32, tf32, bf16, fp16, fp8, int8
    source: str = ""  # datasheet, "measured", or a file

    def peak(self, dtype: str) -> float | None:
        return self.tflops.get(dtype)

    def ridge_point(self, dtype: str) -> float | None:
        """Arithmetic intensity (FLOP/byte) where the roofline turns from memory to compute."""
        peak = self.peak(dtype)
        return peak * 1e12 / (self.dram_GBps * 1e9) if peak else None

    def scaled(self, bandwidth: float = 1.0, compute: float = 1.0) -> Profile:
        """The same chip with DRAM bandwidth and every rate scaled (a what-if machine)."""
        return dataclasses.replace(
            self,
            name=f"{self.name} (bandwidth x{bandwidth:g}, compute x{compute:g})",
            dram_GBps=self.dram_GBps * bandwidth,
            tflops={k: v * compute for k, v in self.tflops.items()},
            source=f"{self.source}, scaled",
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# Datasheet figures (dense, no sparsity). Sources:
# - H100 SXM5 / PCIe: NVIDIA H100 Tensor Core GPU datasheet (2023); Hopper tuning guide for
#   shared memory (228 KB per SM, 227 KB per block) and 64K registers per SM.
# - H200 SXM: NVIDIA H200 datasheet (2024): H100's compute, 141 GB of HBM3e (its bandwidth in
#   the table below).
# - A100 40/80 GB SXM: NVIDIA A100 datasheet (2021); 164 KB shared memory per SM, 163 per block.
# - L4: NVIDIA L4 datasheet (2023); L40S: NVIDIA L40S datasheet (2023); RTX 4090: Ada
#   Lovelace architecture whitepaper (GeForce RTX 4090, non-sparse tensor rates with fp32
#   accumulate as published there); Ada: 100 KB shared memory per SM, 99 KB per block.
# - MI300X: AMD Instinct MI300X data sheet (2023); 64 KB LDS per CU, 512 VGPRs x 64 lanes.
def _rates(fp32, tf32, bf16, fp8=None, int8=None) -> dict[str, float]:
    rates = {"fp32": fp32, "tf32": tf32, "bf16": bf16, "fp16": bf16, "fp8": fp8, "int8": int8}
    return {k: v for k, v in rates.items() if v is not None}


_HOPPER = _rates(67, 494.7, 989.4, 1978.9, 1978.9)
KNOWN: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("NVIDIA H100 SXM", "nvidia", 132, 227, 228, 65536, 1024, 32, 3350, _HOPPER,
                "NVIDIA H100 datasheet"),
        Profile("NVIDIA H100 PCIe", "nvidia", 114, 227, 228, 65536, 1024, 32, 2000,
                _rates(51, 378, 756, 1513, 1513), "NVIDIA H100 datasheet"),
        Profile("NVIDIA H200", "nvidia", 132, 227, 228, 65536, 1024, 32, 4800, _HOPPER,
                "NVIDIA H200 datasheet"),
        Profile("NVIDIA A100 40GB", "nvidia", 108, 163, 164, 65536, 1024, 32, 1555,
                _rates(19.5, 156, 312, None, 624), "NVIDIA A100 datasheet"),
        Profile("NVIDIA A100 80GB", "nvidia", 108, 163, 164, 65536, 1024, 32, 2039,
                _rates(19.5, 156, 312, None, 624), "NVIDIA A100 datasheet"),
        Profile("NVIDIA L4", "nvidia", 58, 99, 100, 65536, 1024, 32, 300,
                _rates(30.3, 60, 121, 242.5, 242.5), "NVIDIA L4 datasheet"),
        Profile("NVIDIA L40S", "nvidia", 142, 99, 100, 65536, 1024, 32, 864,
                _rates(91.6, 183, 362, 733, 733), "NVIDIA L40S datasheet"),
        Profile("NVIDIA GeForce RTX 4090", "nvidia", 128, 99, 100, 65536, 1024, 32, 1008,
                _rates(82.6, 82.6, 165.2, 330.3, 660.6),
                "NVIDIA Ada Lovelace architecture whitepaper"),
        Profile("AMD Instinct MI300X", "amd", 304, 64, 64, 131072, 1024, 64, 5300,
                _rates(163.4, 653.7, 1307.4, 2614.9, 2614.9), "AMD Instinct MI300X data sheet"),
    )
}  # fmt: skip

# Names a driver reports, mapped to the table (substring match, first hit wins).
_ALIASES = (
    ("H100 PCIe", "NVIDIA H100 PCIe"),
    ("H100", "NVIDIA H100 SXM"),
    ("H200", "NVIDIA H200"),
    ("A100-SXM4-40GB", "NVIDIA A100 40GB"),
    ("A100-PCIE-40GB", "NVIDIA A100 40GB"),
    ("A100", "NVIDIA A100 80GB"),
    ("L40S", "NVIDIA L40S"),
    ("L4", "NVIDIA L4"),
    ("RTX 4090", "NVIDIA GeForce RTX 4090"),
    ("MI300X", "AMD Instinct MI300X"),
)

_REQUIRED = {
    "name": str,
    "vendor": str,
    "compute_units": int,
    "smem_per_block_kb": (int, float),
    "smem_per_unit_kb": (int, float),
    "registers_per_unit": int,
    "max_threads_per_block": int,
    "warp_size": int,
    "dram_GBps": (int, float),
    "tflops": dict,
}


def match(device_name: str) -> Profile | None:
    for needle, name in _ALIASES:
        if needle.lower() in device_name.lower():
            return KNOWN[name]
    return None


def from_dict(data: Any, source: str = "") -> Profile:
    """Validate a profile document; errors name the field, the expected and the actual value."""
    if not isinstance(data, dict):
        raise ValueError(f"profile must be a JSON object, got {type(data).__name__}")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise ValueError(f"profile is missing field(s): {', '.join(missing)}")
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(Profile)})
    if unknown:
        raise ValueError(f"profile has unknown field(s): {', '.join(unknown)}")
    for key, types in _REQUIRED.items():
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, types):
            want = types.__name__ if isinstance(types, type) else "a number"
            raise ValueError(f"profile field {key!r} must be {want}, got {value!r}")
    for key in ("compute_units", "registers_per_unit", "max_threads_per_block", "warp_size"):
        if data[key] <= 0:
            raise ValueError(f"profile field {key!r} must be positive, got {data[key]!r}")
    for key in ("smem_per_block_kb", "smem_per_unit_kb", "dram_GBps"):
        if data[key] <= 0:
            raise ValueError(f"profile field {key!r} must be positive, got {data[key]!r}")
    if data["warp_size"] not in (32, 64):
        raise ValueError(f"profile field 'warp_size' must be 32 or 64, got {data['warp_size']!r}")
    if data["smem_per_block_kb"] > data["smem_per_unit_kb"]:
        raise ValueError(
            "profile field 'smem_per_block_kb' must not exceed 'smem_per_unit_kb', got "
            f"{data['smem_per_block_kb']} > {data['smem_per_unit_kb']}"
        )
    for dtype, rate in data["tflops"].items():
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate <= 0:
            raise ValueError(
                f"profile field 'tflops.{dtype}' must be a positive number, got {rate!r}"
            )
    fields = dict(data)
    fields.setdefault("source", source)
    return Profile(**fields)


def load(path: str | os.PathLike) -> Profile:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"profile file {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"profile file {path} is not valid JSON: {exc}") from None
    return from_dict(data, source=str(path))


def _detect() -> Profile | None:
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    known = match(props.name)
    if known is not None:
        return known
    # An unknown chip: limits from the driver, no rates (the roofline needs `doctor --measure`).
    smem = getattr(props, "shared_memory_per_block_optin", 49152) / 1024
    return Profile(
        name=props.name,
        vendor="amd" if getattr(torch.version, "hip", None) else "nvidia",
        compute_units=props.multi_processor_count,
        smem_per_block_kb=smem,
        smem_per_unit_kb=getattr(props, "shared_memory_per_multiprocessor", smem * 1024) / 1024,
        registers_per_unit=getattr(props, "regs_per_multiprocessor", 65536),
        max_threads_per_block=getattr(props, "max_threads_per_block", 1024),
        warp_size=getattr(props, "warp_size", 32),
        dram_GBps=1.0,  # unknown: measure it
        tflops={},
        source="driver (rates unknown: run `tritonkit doctor --measure`)",
    )


_active: Profile | None = None
_active_set = False


def active() -> Profile | None:
    """The profile in force: one set explicitly, else $TRITONKIT_PROFILE, else the detected chip."""
    global _active, _active_set
    if not _active_set:
        path = os.environ.get(PROFILE_ENV)
        _active = load(path) if path else _detect()
        _active_set = True
    return _active


def set_active(profile: Profile | None) -> None:
    """Use ``profile`` from now on (None: detect again on next use)."""
    global _active, _active_set
    _active, _active_set = profile, profile is not None
