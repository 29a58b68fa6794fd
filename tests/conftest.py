"""Run every kernel under Triton's CPU interpreter when there is no GPU.

TRITON_INTERPRET is read when a kernel is decorated, so it must be set before tritonkit's
kernel modules are imported; this file runs before any test module is imported.

Every test builds its tensors on ``DEVICE`` (the ``device`` fixture; ``from _checks import
DEVICE`` at module level): CUDA where there is one, the CPU under the interpreter otherwise,
with the same assertions. A test that only makes sense on one kind of machine says so with a
marker, and is skipped cleanly elsewhere:

- ``@pytest.mark.gpu``: needs a CUDA device (timings, CUDA graphs, CUDA-only code paths);
- ``@pytest.mark.interpreter``: needs Triton's CPU interpreter (its own numerics, the README's
  CPU path).

tests/test_device_agnostic.py checks that test files build their tensors with a device.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
else:
    # float32 convolutions in IEEE float32, as PyTorch's own test suite runs them: its default
    # (cudnn.allow_tf32) rounds the operands to TF32, and tritonkit.conv2d follows that flag as
    # cuDNN does; the tests that mean TF32 turn it on themselves.
    torch.backends.cudnn.allow_tf32 = False

# tritonkit (and _checks, which imports it) only now that TRITON_INTERPRET is settled.
import pytest

from tritonkit.ops._core.device import interpreter_enabled

from _checks import DEVICE


@pytest.fixture
def device() -> torch.device:
    return DEVICE


def pytest_collection_modifyitems(config, items):
    skips = {
        "gpu": None if torch.cuda.is_available() else pytest.mark.skip(reason="needs a CUDA GPU"),
        "interpreter": None
        if interpreter_enabled()
        else pytest.mark.skip(reason="the CPU interpreter only (this machine has a GPU)"),
    }
    for item in items:
        for name, skip in skips.items():
            if skip is not None and item.get_closest_marker(name) is not None:
                item.add_marker(skip)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook; without xdist, never called
def pytest_xdist_auto_num_workers(config):
    """``pytest -n auto`` on a GPU machine: every worker holds a CUDA context on the current GPU
    and compiles its kernels on a CPU core of its own; two cores are left to the controller and
    the driver's threads, and at most 16 workers share the GPU (the fast tier ran with 14 on
    one H200 with 16 cores: 3m44s)."""
    if not torch.cuda.is_available():
        return None  # xdist's own default (the CPU count)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min((cores or 1) - 2, 16))
