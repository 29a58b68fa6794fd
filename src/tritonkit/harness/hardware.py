"""Measured ceilings and the profile the reports use.

The datasheet table lives in ``tritonkit._hardware`` (a leaf, so the ops' launchers can prune
configs by it). Here the harness measures what the device really does — a large device copy,
and matrix products per dtype through PyTorch (cuBLAS, cuBLASLt for fp8 and int8) — caches the
result per GPU, and builds the effective profile: the datasheet limits with measured rates,
optionally scaled (``--profile bandwidth=0.7``) or replaced (``--profile my-chip.json``).
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tritonkit import _hardware, _tuning
from tritonkit._hardware import Profile

MEASURE_SCHEMA = 1
COPY_BYTES = 1 << 30


def _median_ms(fn: Callable[[], Any]) -> float:
    from tritonkit.harness.timing import summarize, time_interleaved

    return summarize(time_interleaved({"case": fn})["case"]).median


def _randn(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(shape, device="cuda", dtype=torch.float32).to(dtype)


def _measure_copy() -> float:
    src = torch.randint(0, 255, (COPY_BYTES,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = _median_ms(lambda: dst.copy_(src))
    return 2 * COPY_BYTES / (ms * 1e-3) / 1e9


def _measure_mm(n: int, dtype: torch.dtype, tf32: bool = False) -> float:
    a, b = _randn((n, n), dtype), _randn((n, n), dtype)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        ms = _median_ms(lambda: a @ b)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return 2 * n**3 / (ms * 1e-3) / 1e12


def _measure_fp8(n: int) -> float | None:
    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        return None
    a = _randn((n, n), torch.bfloat16).to(torch.float8_e4m3fn)
    b = _randn((n, n), torch.bfloat16).to(torch.float8_e4m3fn).t()  # column-major, as required
    one = torch.ones((), device="cuda")
    try:
        ms = _median_ms(lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16))
    except RuntimeError:  # no fp8 tensor cores (pre-Hopper/Ada)
        return None
    return 2 * n**3 / (ms * 1e-3) / 1e12


def _measure_int8(n: int) -> float | None:
    a = torch.randint(-128, 127, (n, n), dtype=torch.int8, device="cuda")
    # B column-major: cuBLASLt's fast INT8 layout (row-major B ran at 128 TOP/s on an H200, a
    # slow path, not the ceiling: 956 with B column-major in the same session).
    b = torch.randint(-128, 127, (n, n), dtype=torch.int8, device="cuda").t()
    try:
        ms = _median_ms(lambda: torch._int_mm(a, b))
    except RuntimeError:
        return None
    return 2 * n**3 / (ms * 1e-3) / 1e12


def measure() -> dict[str, Any]:
    """Measure the ceilings of the current GPU (about ten seconds)."""
    tflops: dict[str, float] = {}
    for dtype, key in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        tflops[key] = max(_measure_mm(n, dtype) for n in (4096, 8192))
    tflops["tf32"] = _measure_mm(8192, torch.float32, tf32=True)
    tflops["fp32"] = _measure_mm(4096, torch.float32, tf32=False)
    for key, value in (("fp8", _measure_fp8(8192)), ("int8", _measure_int8(8192))):
        if value is not None:
            tflops[key] = value
    result = {
        "schema": MEASURE_SCHEMA,
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "copy_GBps": _measure_copy(),
        "tflops": tflops,
        "method": (
            "copy: 1 GiB device-to-device copy_, bytes read + written / median time; matmul: "
            "torch.matmul of random square matrices (bf16/fp16 best of n=4096, 8192; tf32 "
            "n=8192; fp32 n=4096), torch._scaled_mm e4m3 and torch._int_mm (B column-major) at "
            "n=8192; "
            "2n^3 / median time"
        ),
    }
    torch.cuda.empty_cache()
    return result


def _measure_path() -> Path:
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return _tuning.cache_dir() / f"ceilings-{_tuning._slug(gpu)}.json"


def load_measurement() -> dict[str, Any] | None:
    """Cached ceilings of this GPU, or None (a file for another GPU is ignored)."""
    path = _measure_path()
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or data.get("schema") != MEASURE_SCHEMA:
        return None
    if data.get("gpu") != torch.cuda.get_device_name():
        return None
    return data


def measured_ceilings(remeasure: bool = False) -> dict[str, Any]:
    """This GPU's measured ceilings: from the cache, or measured now and cached."""
    data = None if remeasure else load_measurement()
    if data is None:
        data = measure()
        path = _measure_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)
    return data


def with_measurement(profile: Profile | None, measured: dict[str, Any]) -> Profile:
    """The profile with measured bandwidth and rates in place of the datasheet's."""
    base = profile or _hardware.active()
    if base is None:
        raise ValueError("no GPU and no profile: nothing to attach measurements to")
    return Profile(
        **{
            **base.to_dict(),
            "dram_GBps": measured["copy_GBps"],
            "tflops": {**base.tflops, **measured["tflops"]},
            "source": f"measured {measured['date']} (limits: {base.source})",
        }
    )


def resolve_profile(spec: str | None, measured: dict[str, Any] | None = None) -> Profile | None:
    """The profile for ``--profile SPEC``.

    SPEC is a path to a profile JSON, a name from the table ("NVIDIA A100 80GB"), or scale
    factors for the current machine, e.g. ``bandwidth=0.7`` or ``bandwidth=0.7,compute=1.2``.
    Measured rates replace the datasheet's when given (except for a JSON or named profile,
    which describe another machine).
    """
    if spec is None:
        base = _hardware.active()
        return with_measurement(base, measured) if measured and base else base
    if spec in _hardware.KNOWN:
        return _hardware.KNOWN[spec]
    if spec.endswith(".json") or Path(spec).exists():
        return _hardware.load(spec)
    factors = scale_factors(spec)
    base = _hardware.active()
    if base is None:
        raise ValueError("--profile scale factors need a GPU (or a JSON profile to scale)")
    if measured:
        base = with_measurement(base, measured)
    return base.scaled(**factors)


def scale_factors(spec: str) -> dict[str, float]:
    """``bandwidth=0.7,compute=1.2`` as factors; ValueError naming what is wrong."""
    factors = {"bandwidth": 1.0, "compute": 1.0}
    for part in spec.split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in factors:
            raise ValueError(
                f"--profile must be a profile JSON path, a known GPU name or scale factors like "
                f"'bandwidth=0.7,compute=1.2'; got {spec!r}"
            )
        try:
            factors[key] = float(value)
        except ValueError:
            raise ValueError(f"--profile: {key} must be a number, got {value!r}") from None
        if factors[key] <= 0:
            raise ValueError(f"--profile: {key} must be positive, got {factors[key]}")
    return factors
