"""The device a kernel runs on: CUDA properties, or the CPU interpreter's stand-ins."""

from __future__ import annotations

import functools
import os

import torch


def interpreter_enabled() -> bool:
    """True when Triton kernels run under the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


@functools.cache
def shared_memory_per_block(device: torch.device) -> int:
    """Bytes of shared memory one program may take on a CUDA device (the opt-in limit: 227 KiB
    on H100/H200, 163 KiB on A100, 99 KiB on Ada); unbounded under the interpreter."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return getattr(props, "shared_memory_per_block_optin", 49152)
    return 1 << 30


@functools.cache
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; a small stand-in under the interpreter."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4
