"""What machine is this: the environment fingerprint and the measured ceilings.

Percentages in reports are of ceilings measured on the device itself (a large device-to-device
copy; a large matrix product through cuBLAS), never of datasheet numbers.
"""

from __future__ import annotations

import datetime as _dt
import functools
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from tritonkit._utils import interpreter_enabled


def _git_commit() -> str:
    override = os.environ.get("TRITONKIT_GIT_COMMIT")
    if override:
        return override
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not commit:
        return "unknown"
    return commit + ("-dirty" if dirty else "")


def _driver_version() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return out.splitlines()[0] if out else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def fingerprint() -> dict[str, Any]:
    """Everything a reader needs to know which run a number came from."""
    import numpy
    import triton

    info: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "numpy": numpy.__version__,
        "cuda": torch.version.cuda,
        "git_commit": _git_commit(),
        "interpreter": interpreter_enabled(),
        "gpu": None,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info["gpu"] = props.name
        info["gpu_capability"] = f"{props.major}.{props.minor}"
        info["gpu_sms"] = props.multi_processor_count
        info["gpu_memory_GiB"] = round(props.total_memory / 2**30, 1)
        info["gpu_l2_MB"] = round(getattr(props, "L2_cache_size", 0) / 1e6, 1)
        info["driver"] = _driver_version()
    return info


def gpu_slug(info: dict[str, Any]) -> str:
    """A file-name-safe name of the GPU, e.g. ``nvidia-h200``."""
    name = (info.get("gpu") or "cpu").lower()
    return "-".join("".join(c if c.isalnum() else " " for c in name).split())


def _copy_case(n_bytes: int, device: torch.device):
    src = torch.randint(0, 255, (n_bytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def _matmul_case(n: int, dtype: torch.dtype, device: torch.device):
    a = torch.randn(n, n, device=device, dtype=torch.float32).to(dtype)
    b = torch.randn(n, n, device=device, dtype=torch.float32).to(dtype)
    return lambda: a @ b


def _median_ms(fn, device: torch.device) -> float:
    from tritonkit.harness.timing import summarize, time_interleaved

    return summarize(time_interleaved({"case": fn}, device=device)["case"]).median


@functools.cache
def measure_ceilings(device_index: int = 0) -> dict[str, Any]:
    """Measure copy bandwidth and bf16 matmul throughput on this GPU (cached per process).

    Copy: a 1 GiB device-to-device ``copy_``, counting bytes read plus written. Matmul:
    ``torch.matmul`` of random bf16 square matrices at n = 4096 and 8192, the better of the two.
    """
    device = torch.device("cuda", device_index)
    n_bytes = 1 << 30
    ceilings: dict[str, Any] = {"copy_bytes": 2 * n_bytes}
    ceilings["copy_ms"] = _median_ms(_copy_case(n_bytes, device), device)
    ceilings["copy_GBps"] = 2 * n_bytes / (ceilings["copy_ms"] * 1e-3) / 1e9
    best = 0.0
    for n in (4096, 8192):
        ms = _median_ms(_matmul_case(n, torch.bfloat16, device), device)
        tflops = 2 * n**3 / (ms * 1e-3) / 1e12
        ceilings[f"matmul_bf16_{n}_TFLOPs"] = tflops
        best = max(best, tflops)
    ceilings["matmul_bf16_TFLOPs"] = best
    torch.cuda.empty_cache()
    return ceilings
