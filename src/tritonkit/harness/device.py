"""What machine is this: the environment fingerprint recorded with every result."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from tritonkit.ops._core.device import interpreter_enabled


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
